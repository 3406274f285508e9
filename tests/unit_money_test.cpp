#include <gtest/gtest.h>

#include "common/bytes.h"
#include "common/duration.h"
#include "common/env.h"
#include "common/money.h"

namespace trnflow {

TEST(Money, ParsesAndPrintsExactly) {
  Money m;
  ASSERT_TRUE(Money::Parse("21.50", &m));
  EXPECT_EQ(m.micros(), 21'500'000);
  EXPECT_EQ(m.ToDecimal(), "21.500000");
  EXPECT_EQ(m.ToDollars(), "$21.50");
  ASSERT_TRUE(Money::Parse("0.000001", &m));
  EXPECT_EQ(m.micros(), 1);
  EXPECT_FALSE(Money::Parse("-1", &m));
  EXPECT_FALSE(Money::Parse("1e3", &m));
  EXPECT_FALSE(Money::Parse("0.0000001", &m));
  EXPECT_FALSE(Money::Parse("", &m));
  EXPECT_FALSE(Money::Parse(".", &m));
}

TEST(Money, DollarsRoundHalfUpToCents) {
  EXPECT_EQ(Money::FromMicros(12'345'000).ToDollars(), "$12.35");
  EXPECT_EQ(Money::FromMicros(12'344'999).ToDollars(), "$12.34");
  EXPECT_EQ(Money::FromMicros(0).ToDollars(), "$0.00");
}

TEST(Billing, PerSecondWithSixtySecondMinimum) {
  EXPECT_EQ(BilledSeconds(0), 60);
  EXPECT_EQ(BilledSeconds(1.5), 60);
  EXPECT_EQ(BilledSeconds(60), 60);
  EXPECT_EQ(BilledSeconds(60.2), 61);
  EXPECT_EQ(BilledSeconds(3600), 3600);
}

TEST(Billing, ChargeIsPriceTimesCountTimesBilledSeconds) {
  Money price = Money::FromMicros(21'500'000);  // $21.50/h
  // Two instances for one hour.
  EXPECT_EQ(Charge(price, 2, 3600).micros(), 43'000'000);
  // Ten seconds bill the one-minute minimum: 21.5 / 60 = 0.358333... -> 358333 micros.
  EXPECT_EQ(Charge(price, 1, 10).micros(), 358'333);
  // Half-micro rounds up: $0.000018/h for 100 s = 0.0005 micros... tiny prices stay exact.
  EXPECT_EQ(Charge(Money::FromMicros(36), 1, 100).micros(), 1);
  // No overflow for large fleets and long runs: $100/h x 512 instances x 1 year.
  EXPECT_EQ(Charge(Money::FromMicros(100'000'000), 512, 365.0 * 86400).micros(),
            100'000'000LL * 512 * 365 * 24);
}

TEST(Duration, ParsesUnitsAndRejectsGarbage) {
  EXPECT_EQ(ParseDuration("30s"), 30);
  EXPECT_EQ(ParseDuration("10m"), 600);
  EXPECT_EQ(ParseDuration("2h"), 7200);
  EXPECT_EQ(ParseDuration("1h30m"), 5400);
  EXPECT_EQ(ParseDuration("1d2h"), 93600);
  EXPECT_EQ(ParseDuration("90"), 90);
  EXPECT_FALSE(ParseDuration("30m1h"));  // units must descend
  EXPECT_FALSE(ParseDuration("h"));
  EXPECT_FALSE(ParseDuration("-5m"));
  EXPECT_FALSE(ParseDuration("0s"));
  EXPECT_FALSE(ParseDuration("5 minutes"));
  EXPECT_FALSE(ParseDuration("nan"));
  EXPECT_FALSE(ParseDuration(""));
}

TEST(Env, RedactsPasswords) {
  EXPECT_EQ(RedactUrl("postgresql://trnflow:s3cret@db.example:5432/trnflow"),
            "postgresql://trnflow:***@db.example:5432/trnflow");
  EXPECT_EQ(RedactUrl("host=db user=x password=s3cret dbname=y"),
            "host=db user=x password=*** dbname=y");
  EXPECT_EQ(RedactUrl("postgresql://localhost/trnflow"), "postgresql://localhost/trnflow");
}

}  // namespace trnflow

namespace trnflow {
// `cache gc --max-bytes 1GB` once read "1" and emptied the cache: a size is read whole or not.
TEST(Bytes, SizesAreReadWholeOrRefused) {
  EXPECT_EQ(ParseBytes("1024"), 1024u);
  EXPECT_EQ(ParseBytes("1GB"), 1000000000u);
  EXPECT_EQ(ParseBytes("1G"), 1ULL << 30);
  EXPECT_EQ(ParseBytes("2GiB"), 2ULL << 30);
  EXPECT_EQ(ParseBytes("500MB"), 500000000u);
  EXPECT_EQ(ParseBytes("64K"), 65536u);
  for (const char* bad :
       {"", "GB", "-1", "1.5GB", "1 GB", "1gb", "1XB", "99999999999T", "18446744073709551616"})
    EXPECT_FALSE(ParseBytes(bad).has_value()) << bad;
}
}  // namespace trnflow
