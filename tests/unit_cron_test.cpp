#include <date/date.h>
#include <gtest/gtest.h>

#include "scheduler/cron.h"

namespace trnflow::scheduler {
namespace {

SysTime Utc(int y, unsigned m, unsigned d, int h, int min) {
  using namespace date;
  return sys_days(year(y) / month(m) / day(d)) + std::chrono::hours(h) + std::chrono::minutes(min);
}

std::string Fmt(SysTime t) {
  return date::format("%F %R", std::chrono::floor<std::chrono::minutes>(t));
}

CronExpr Cron(const std::string& text) {
  std::string error;
  auto c = ParseCron(text, &error);
  EXPECT_TRUE(c) << text << ": " << error;
  return c.value_or(CronExpr{});
}

}  // namespace

TEST(Cron, ParsesRangesListsStepsAndNames) {
  auto c = Cron("*/15 8-18/2 1,15 JAN-mar MON-FRI");
  EXPECT_TRUE(c.minute[0] && c.minute[15] && c.minute[45] && !c.minute[10]);
  EXPECT_TRUE(c.hour[8] && c.hour[10] && c.hour[18] && !c.hour[9] && !c.hour[20]);
  EXPECT_TRUE(c.day[1] && c.day[15] && !c.day[2]);
  EXPECT_TRUE(c.month[1] && c.month[3] && !c.month[4]);
  EXPECT_TRUE(c.weekday[1] && c.weekday[5] && !c.weekday[0] && !c.weekday[6]);
  EXPECT_TRUE(Cron("0 0 * * 7").weekday[0]) << "7 is Sunday";
  std::string error;
  for (const char* bad : {"", "* * * *", "60 * * * *", "* 24 * * *", "* * 0 * *", "* * * 13 *",
                          "*/0 * * * *", "5-1 * * * *", "a * * * *", "* * * FOO *", "1,,2 * * * *"})
    EXPECT_FALSE(ParseCron(bad, &error)) << bad;
  EXPECT_FALSE(IsTimeZone("Mars/Olympus"));
  EXPECT_TRUE(IsTimeZone("Europe/Berlin"));
}

TEST(Cron, NextSlotInUtcAndInAZone) {
  auto nightly = Cron("0 2 * * *");
  EXPECT_EQ(Fmt(*NextSlot(nightly, "UTC", Utc(2026, 11, 21, 10, 0))), "2026-11-22 02:00");
  EXPECT_EQ(Fmt(*NextSlot(nightly, "UTC", Utc(2026, 11, 22, 2, 0))), "2026-11-23 02:00")
      << "strictly after";
  // 02:00 in Berlin in winter (UTC+1) is 01:00 UTC; in summer (UTC+2) 00:00 UTC.
  EXPECT_EQ(Fmt(*NextSlot(nightly, "Europe/Berlin", Utc(2026, 11, 21, 10, 0))), "2026-11-22 01:00");
  EXPECT_EQ(Fmt(*NextSlot(nightly, "Europe/Berlin", Utc(2026, 7, 1, 10, 0))), "2026-07-02 00:00");
  // Either day field may match when both are restricted: the 1st, or any Monday.
  auto either = Cron("0 0 1 * MON");
  EXPECT_EQ(Fmt(*NextSlot(either, "UTC", Utc(2026, 11, 21, 0, 0))), "2026-11-23 00:00");
  EXPECT_EQ(Fmt(*NextSlot(either, "UTC", Utc(2026, 11, 30, 1, 0))), "2026-12-01 00:00");
  EXPECT_FALSE(NextSlot(Cron("0 0 30 2 *"), "UTC", Utc(2026, 1, 1, 0, 0))) << "February 30";
}

TEST(Cron, DaylightSavingGapsAndRepeatsFireOnce) {
  // Berlin springs forward on 2026-03-29: 02:00-03:00 local does not exist. A 02:30 slot
  // fires once, at the end of the gap (03:00 CEST = 01:00 UTC).
  auto half_past_two = Cron("30 2 * * *");
  EXPECT_EQ(Fmt(*NextSlot(half_past_two, "Europe/Berlin", Utc(2026, 3, 28, 12, 0))),
            "2026-03-29 01:00");
  EXPECT_EQ(Fmt(*NextSlot(half_past_two, "Europe/Berlin", Utc(2026, 3, 29, 1, 0))),
            "2026-03-30 00:30");
  // Berlin falls back on 2026-10-25: 02:00-03:00 local happens twice. 02:30 fires once, at
  // its first occurrence (CEST, 00:30 UTC), not again an hour later.
  auto first = NextSlot(half_past_two, "Europe/Berlin", Utc(2026, 10, 24, 12, 0));
  EXPECT_EQ(Fmt(*first), "2026-10-25 00:30");
  EXPECT_EQ(Fmt(*NextSlot(half_past_two, "Europe/Berlin", *first)), "2026-10-26 01:30");
  // Every 15 minutes across the repeated hour: each local time once. From 01:59 CEST to
  // 03:00 CET (two UTC hours): 02:00, 02:15, 02:30, 02:45 at their first occurrence only.
  auto quarter = Cron("*/15 * * * *");
  SysTime t = Utc(2026, 10, 24, 23, 59);  // 01:59 CEST
  std::vector<std::string> fired;
  while ((t = *NextSlot(quarter, "Europe/Berlin", t)) < Utc(2026, 10, 25, 2, 0))
    fired.push_back(Fmt(t));
  EXPECT_EQ(fired, (std::vector<std::string>{"2026-10-25 00:00", "2026-10-25 00:15",
                                             "2026-10-25 00:30", "2026-10-25 00:45"}));
}

}  // namespace trnflow::scheduler
