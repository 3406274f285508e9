#pragma once
// Money is an exact amount in integer micro-dollars. Floating point never holds a balance:
// prices, charges and totals are all Money so the CLI, the ledger and SQL agree to the cent.
#include <cstdint>
#include <string>

namespace trnflow {

class Money {
 public:
  constexpr Money() = default;
  static constexpr Money FromMicros(int64_t micros) { return Money(micros); }
  // Rounds to the nearest micro-dollar.
  static Money FromUsd(double usd);
  // Parses "12", "12.5", "0.000001"; returns false on anything else (sign, exponent, >6 decimals).
  static bool Parse(const std::string& text, Money* out);

  constexpr int64_t micros() const { return micros_; }
  double usd() const { return static_cast<double>(micros_) / 1e6; }
  // Exact decimal text with six places, for SQL numeric parameters: "12.345600".
  std::string ToDecimal() const;
  // Rounded to cents for people: "$12.35".
  std::string ToDollars() const;

  constexpr Money operator+(Money o) const { return Money(micros_ + o.micros_); }
  constexpr Money operator-(Money o) const { return Money(micros_ - o.micros_); }
  Money& operator+=(Money o) {
    micros_ += o.micros_;
    return *this;
  }
  constexpr auto operator<=>(const Money&) const = default;

 private:
  constexpr explicit Money(int64_t micros) : micros_(micros) {}
  int64_t micros_ = 0;
};

// Seconds EC2 bills for a run of `seconds`: whole seconds rounded up, at least 60.
int64_t BilledSeconds(double seconds);

// What `count` instances at `price_per_hour` cost for `seconds`, billed like EC2 (per second,
// 60-second minimum per instance start), rounded half up to the micro-dollar.
Money Charge(Money price_per_hour, int count, double seconds);

}  // namespace trnflow
