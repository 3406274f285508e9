#include <gtest/gtest.h>

#include "common/retry_policy.h"

namespace trnflow {
namespace {
StageSpec SpotStage() {
  StageSpec s;
  s.market = Market::kSpot;
  s.retry.max_attempts = 3;
  s.retry.max_interruptions = 2;
  s.retry.then_market = "on-demand";
  s.retry.backoff = {30, 2, 600};
  return s;
}
}  // namespace

TEST(RetryPolicy, SuccessAndUserErrorsEndTheStage) {
  StageSpec s = SpotStage();
  EXPECT_EQ(DecideAfterAttempt(s, Market::kSpot, Outcome::kSucceeded, 0, 0, 0.5).next,
            StageState::kSucceeded);
  EXPECT_EQ(DecideAfterAttempt(s, Market::kSpot, Outcome::kUserError, 0, 0, 0.5).next,
            StageState::kFailed);
  EXPECT_EQ(DecideAfterAttempt(s, Market::kSpot, Outcome::kFailed, 0, 0, 0.5).next,
            StageState::kFailed);
}

TEST(RetryPolicy, PreemptionsHaveTheirOwnBudgetThenFallBackToOnDemand) {
  StageSpec s = SpotStage();
  // Errors already spent do not stop a preemption retry.
  auto d = DecideAfterAttempt(s, Market::kSpot, Outcome::kSpotInterruption, 2, 0, 0.5);
  EXPECT_EQ(d.next, StageState::kRetryWait);
  EXPECT_EQ(d.market, Market::kSpot);
  // max_interruptions 2: the second interruption spends the budget.
  d = DecideAfterAttempt(s, Market::kSpot, Outcome::kSpotInterruption, 0, 1, 0.5);
  EXPECT_EQ(d.next, StageState::kRetryWait);
  EXPECT_EQ(d.market, Market::kOnDemand);
  s.retry.then_market = "fail";
  d = DecideAfterAttempt(s, Market::kSpot, Outcome::kSpotInterruption, 0, 2, 0.5);
  EXPECT_EQ(d.next, StageState::kFailed);
}

TEST(RetryPolicy, ErrorsRetryUntilMaxAttempts) {
  StageSpec s = SpotStage();
  EXPECT_EQ(DecideAfterAttempt(s, Market::kSpot, Outcome::kInfraError, 0, 0, 0.5).next,
            StageState::kRetryWait);
  EXPECT_EQ(DecideAfterAttempt(s, Market::kSpot, Outcome::kInfraError, 1, 0, 0.5).next,
            StageState::kRetryWait);
  EXPECT_EQ(DecideAfterAttempt(s, Market::kSpot, Outcome::kInfraError, 2, 0, 0.5).next,
            StageState::kFailed);
  s.retry.on = {Outcome::kSpotInterruption};
  EXPECT_EQ(DecideAfterAttempt(s, Market::kSpot, Outcome::kTimeout, 0, 0, 0.5).next,
            StageState::kFailed);
}

TEST(RetryPolicy, BackoffGrowsIsCappedAndJitterStaysInBounds) {
  Backoff b{30, 2, 600};
  EXPECT_DOUBLE_EQ(BackoffSeconds(b, 1, 0.5), 30);
  EXPECT_DOUBLE_EQ(BackoffSeconds(b, 2, 0.5), 60);
  EXPECT_DOUBLE_EQ(BackoffSeconds(b, 10, 0.5), 600);
  for (double j : {0.0, 0.25, 0.999999}) {
    double v = BackoffSeconds(b, 3, j);
    EXPECT_GE(v, 120 * 0.8);
    EXPECT_LT(v, 120 * 1.2);
  }
}

}  // namespace trnflow
