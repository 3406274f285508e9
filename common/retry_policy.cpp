#include "common/retry_policy.h"

#include <algorithm>
#include <cmath>

namespace trnflow {

double BackoffSeconds(const Backoff& b, int n, double jitter) {
  double base = b.initial_s * std::pow(b.factor, std::max(0, n - 1));
  return std::min(base, b.max_s) * (0.8 + 0.4 * jitter);
}

RetryDecision DecideAfterAttempt(const StageSpec& spec, Market current, Outcome outcome,
                                 int errors_before, int preemptions_before, double jitter) {
  RetryDecision d;
  d.market = current;
  const RetryPolicy& r = spec.retry;
  bool listed = std::find(r.on.begin(), r.on.end(), outcome) != r.on.end();
  switch (outcome) {
    case Outcome::kSucceeded:
      d.next = StageState::kSucceeded;
      return d;
    case Outcome::kCached:
      d.next = StageState::kCached;
      return d;
    case Outcome::kCancelled:
    case Outcome::kBudgetExceeded:
      d.next = StageState::kCancelled;
      d.reason = std::string(ToString(outcome));
      return d;
    case Outcome::kFailed:
    case Outcome::kUserError:
      d.next = StageState::kFailed;
      d.reason = "not retryable";
      return d;
    default:
      break;
  }
  bool preemption = IsPreemption(outcome) &&
                    !(current == Market::kOnDemand && preemptions_before >= r.max_interruptions &&
                      outcome == Outcome::kLost);
  if (!listed) {
    d.next = StageState::kFailed;
    d.reason = std::string(ToString(outcome)) + " is not in retry.on";
    return d;
  }
  if (preemption) {
    int n = preemptions_before + 1;
    // The budget is spent by its last interruption: the attempt after it is not on spot.
    if (n < r.max_interruptions) {
      d.next = StageState::kRetryWait;
      d.retry_in_s = BackoffSeconds(r.backoff, 1, jitter);
      d.reason = "preemption " + std::to_string(n) + " of " + std::to_string(r.max_interruptions);
      return d;
    }
    if (r.then_market == "on-demand" && current == Market::kSpot) {
      d.next = StageState::kRetryWait;
      d.market = Market::kOnDemand;
      d.retry_in_s = BackoffSeconds(r.backoff, 1, jitter);
      d.reason = "preemption budget spent; continuing on on-demand";
      return d;
    }
    d.next = StageState::kFailed;
    d.reason = "preemption budget spent (" + std::to_string(r.max_interruptions) + ")";
    return d;
  }
  int n = errors_before + 1;
  if (n < r.max_attempts) {
    d.next = StageState::kRetryWait;
    d.retry_in_s = BackoffSeconds(r.backoff, n, jitter);
    d.reason = "error " + std::to_string(n) + " of " + std::to_string(r.max_attempts);
    return d;
  }
  d.next = StageState::kFailed;
  d.reason = "attempts for errors spent (" + std::to_string(r.max_attempts) + ")";
  return d;
}

}  // namespace trnflow
