#pragma once
// Cron expressions (five fields: minute hour day-of-month month day-of-week; `*`, lists
// `1,15`, ranges `1-5`, steps `*/10` and `8-18/2`; months JAN-DEC and days SUN-SAT by name;
// day 7 is Sunday too) evaluated in an IANA time zone. As in Vixie cron, when both
// day-of-month and day-of-week are restricted a day matching either counts.
//
// Daylight saving: a slot whose local time does not exist (the hour skipped in spring) fires
// once, at the first instant after the gap; a slot whose local time happens twice (the hour
// repeated in autumn) fires once, at its first occurrence. Pure functions; thread-safe.
#include <bitset>
#include <chrono>
#include <optional>
#include <string>

namespace trnflow::scheduler {

struct CronExpr {
  std::bitset<60> minute;
  std::bitset<24> hour;
  std::bitset<32> day;     // 1..31
  std::bitset<13> month;   // 1..12
  std::bitset<7> weekday;  // 0 = Sunday
  bool day_any = true;
  bool weekday_any = true;
};

// nullopt with *error saying which field is wrong and why.
std::optional<CronExpr> ParseCron(const std::string& text, std::string* error);
bool IsTimeZone(const std::string& tz);

using SysTime = std::chrono::system_clock::time_point;
// The first slot strictly after `after`, or nullopt if none within 5 years (e.g. Feb 30).
std::optional<SysTime> NextSlot(const CronExpr& cron, const std::string& tz, SysTime after);

}  // namespace trnflow::scheduler
