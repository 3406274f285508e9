#include "common/money.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace trnflow {

Money Money::FromUsd(double usd) { return Money(static_cast<int64_t>(std::llround(usd * 1e6))); }

bool Money::Parse(const std::string& text, Money* out) {
  int64_t whole = 0, frac = 0;
  int frac_digits = 0;
  bool seen_dot = false, seen_digit = false;
  for (char c : text) {
    if (c == '.' && !seen_dot) {
      seen_dot = true;
    } else if (c >= '0' && c <= '9') {
      seen_digit = true;
      if (seen_dot) {
        if (++frac_digits > 6) return false;
        frac = frac * 10 + (c - '0');
      } else {
        if (whole > 1'000'000'000'000) return false;  // a trillion dollars is a typo
        whole = whole * 10 + (c - '0');
      }
    } else {
      return false;
    }
  }
  if (!seen_digit) return false;
  while (frac_digits++ < 6) frac *= 10;
  *out = Money(whole * 1'000'000 + frac);
  return true;
}

std::string Money::ToDecimal() const {
  char buf[48];
  int64_t a = std::llabs(micros_);
  std::snprintf(buf, sizeof buf, "%s%lld.%06lld", micros_ < 0 ? "-" : "",
                static_cast<long long>(a / 1'000'000), static_cast<long long>(a % 1'000'000));
  return buf;
}

std::string Money::ToDollars() const {
  int64_t a = std::llabs(micros_);
  int64_t cents = (a + 5'000) / 10'000;
  char buf[48];
  // No "-$0.00": a negative amount that rounds to zero cents is shown as zero.
  std::snprintf(buf, sizeof buf, "%s$%lld.%02lld", micros_ < 0 && cents > 0 ? "-" : "",
                static_cast<long long>(cents / 100), static_cast<long long>(cents % 100));
  return buf;
}

int64_t BilledSeconds(double seconds) {
  if (!(seconds > 0)) return 60;
  auto whole = static_cast<int64_t>(std::ceil(seconds - 1e-9));
  return whole < 60 ? 60 : whole;
}

Money Charge(Money price_per_hour, int count, double seconds) {
  __int128 total = static_cast<__int128>(price_per_hour.micros()) * count * BilledSeconds(seconds);
  return Money::FromMicros(static_cast<int64_t>((total + 1800) / 3600));
}

}  // namespace trnflow
