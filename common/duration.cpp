#include "common/duration.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace trnflow {

std::optional<double> ParseDuration(std::string_view text) {
  if (text.empty() || text.size() > 64) return std::nullopt;
  std::string s(text);
  char* end = nullptr;
  // A bare number means seconds.
  double bare = std::strtod(s.c_str(), &end);
  if (end == s.c_str() + s.size()) {
    if (!std::isfinite(bare) || bare <= 0) return std::nullopt;
    return bare;
  }
  double total = 0;
  size_t i = 0;
  int last_rank = 5;  // units must descend: d > h > m > s
  while (i < s.size()) {
    size_t start = i;
    while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
    if (i == start || i == s.size()) return std::nullopt;
    std::string digits = s.substr(start, i - start);
    double value = std::strtod(digits.c_str(), &end);
    if (*end != '\0' || !std::isfinite(value)) return std::nullopt;
    int rank;
    double unit;
    switch (s[i]) {
      case 'd':
        rank = 4, unit = 86400;
        break;
      case 'h':
        rank = 3, unit = 3600;
        break;
      case 'm':
        rank = 2, unit = 60;
        break;
      case 's':
        rank = 1, unit = 1;
        break;
      default:
        return std::nullopt;
    }
    if (rank >= last_rank) return std::nullopt;
    last_rank = rank;
    total += value * unit;
    ++i;
  }
  if (!(total > 0) || !std::isfinite(total)) return std::nullopt;
  return total;
}

std::string FormatDuration(double seconds) {
  if (!(seconds > 0)) return "0s";
  char buf[64];
  if (seconds < 60) {
    std::snprintf(buf, sizeof buf, "%gs", std::round(seconds * 1000) / 1000);
    return buf;
  }
  if (!std::isfinite(seconds) || seconds > 1e12) return "forever";
  auto s = static_cast<long long>(std::llround(seconds));
  std::string out;
  for (auto [unit, size] : {std::pair{'d', 86400LL}, {'h', 3600LL}, {'m', 60LL}, {'s', 1LL}})
    if (s >= size) {
      out += std::to_string(s / size) + unit;
      s %= size;
    }
  return out;
}

}  // namespace trnflow
