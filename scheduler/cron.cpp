#include "scheduler/cron.h"

#include <date/tz.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <vector>

namespace trnflow::scheduler {
namespace {

struct Field {
  const char* name;
  int lo, hi;
  std::map<std::string, int> names;
};

bool ParseValue(const std::string& s, const Field& f, int* out) {
  std::string upper = s;
  std::transform(upper.begin(), upper.end(), upper.begin(), ::toupper);
  if (auto it = f.names.find(upper); it != f.names.end()) {
    *out = it->second;
    return true;
  }
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 2)
    return false;
  *out = std::stoi(s);
  return true;
}

// One field into a bitset over [lo, hi]; false with *error on anything malformed.
template <size_t N>
bool ParseField(const std::string& text, Field f, std::bitset<N>* bits, bool* any,
                std::string* error) {
  *any = text == "*";
  std::stringstream in(text);
  std::string part;
  bool seen = false;
  while (std::getline(in, part, ',')) {
    seen = true;
    int step = 1;
    if (auto slash = part.find('/'); slash != std::string::npos) {
      std::string s = part.substr(slash + 1);
      if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 2 ||
          std::stoi(s) == 0) {
        *error = std::string(f.name) + ": bad step in '" + part + "'";
        return false;
      }
      step = std::stoi(s);
      part = part.substr(0, slash);
    }
    int a = f.lo, b = f.hi;
    if (part != "*") {
      auto dash = part.find('-');
      if (!ParseValue(part.substr(0, dash), f, &a) ||
          (dash != std::string::npos && !ParseValue(part.substr(dash + 1), f, &b))) {
        *error = std::string(f.name) + ": '" + part + "' is not a value or range";
        return false;
      }
      if (dash == std::string::npos) b = step > 1 ? f.hi : a;
    }
    if (a < f.lo || b > f.hi || a > b) {
      *error = std::string(f.name) + ": '" + part + "' is outside " + std::to_string(f.lo) + "-" +
               std::to_string(f.hi);
      return false;
    }
    for (int v = a; v <= b; v += step) bits->set(static_cast<size_t>(v));
  }
  if (!seen) {
    *error = std::string(f.name) + " is empty";
    return false;
  }
  return true;
}

}  // namespace

std::optional<CronExpr> ParseCron(const std::string& text, std::string* error) {
  std::stringstream in(text);
  std::vector<std::string> parts;
  std::string p;
  while (in >> p) parts.push_back(p);
  if (parts.size() != 5) {
    *error = "a cron expression has 5 fields (minute hour day month weekday), e.g. \"0 2 * * *\"";
    return std::nullopt;
  }
  CronExpr c;
  bool any = false;
  const Field minute{"minute", 0, 59, {}}, hour{"hour", 0, 23, {}}, day{"day", 1, 31, {}};
  const Field month{"month",
                    1,
                    12,
                    {{"JAN", 1},
                     {"FEB", 2},
                     {"MAR", 3},
                     {"APR", 4},
                     {"MAY", 5},
                     {"JUN", 6},
                     {"JUL", 7},
                     {"AUG", 8},
                     {"SEP", 9},
                     {"OCT", 10},
                     {"NOV", 11},
                     {"DEC", 12}}};
  const Field weekday{
      "weekday",
      0,
      7,
      {{"SUN", 0}, {"MON", 1}, {"TUE", 2}, {"WED", 3}, {"THU", 4}, {"FRI", 5}, {"SAT", 6}}};
  std::bitset<8> wd_bits;  // 0..7: Sunday may be written 7, folded onto 0 below
  if (!ParseField(parts[0], minute, &c.minute, &any, error) ||
      !ParseField(parts[1], hour, &c.hour, &any, error) ||
      !ParseField(parts[2], day, &c.day, &c.day_any, error) ||
      !ParseField(parts[3], month, &c.month, &any, error))
    return std::nullopt;
  if (!ParseField(parts[4], weekday, &wd_bits, &c.weekday_any, error)) return std::nullopt;
  for (size_t i = 0; i < 7; ++i) c.weekday[i] = wd_bits[i];
  if (wd_bits[7]) c.weekday.set(0);
  return c;
}

bool IsTimeZone(const std::string& tz) {
  try {
    date::locate_zone(tz);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

std::optional<SysTime> NextSlot(const CronExpr& c, const std::string& tz_name, SysTime after) {
  using namespace std::chrono;
  const date::time_zone* tz = date::locate_zone(tz_name);
  auto local = tz->to_local(floor<minutes>(after)) + minutes(1);
  auto limit = local + date::days(5 * 366);
  while (local < limit) {
    auto day = date::floor<date::days>(local);
    date::year_month_day ymd(day);
    date::weekday wd(day);
    bool dom = c.day[static_cast<unsigned>(ymd.day())];
    bool dow = c.weekday[wd.c_encoding()];
    bool day_ok = c.day_any && c.weekday_any ? true
                  : c.day_any                ? dow
                  : c.weekday_any            ? dom
                                             : (dom || dow);
    if (!c.month[static_cast<unsigned>(ymd.month())] || !day_ok) {
      local = day + date::days(1);
      continue;
    }
    date::hh_mm_ss<minutes> t(floor<minutes>(local - day));
    if (!c.hour[static_cast<size_t>(t.hours().count())]) {
      local = day + t.hours() + hours(1);
      continue;
    }
    if (!c.minute[static_cast<size_t>(t.minutes().count())]) {
      local += minutes(1);
      continue;
    }
    auto info = tz->get_info(local);
    SysTime slot;
    if (info.result == date::local_info::nonexistent)
      slot = info.second.begin;  // the gap's end: the first instant after it
    else
      slot = tz->to_sys(local, date::choose::earliest);
    if (slot > after) return slot;
    local += minutes(1);
  }
  return std::nullopt;
}

}  // namespace trnflow::scheduler
