#pragma once
// What happens to a stage after an attempt ends: the one place the retry rules live, used by
// workers (outcomes they observe) and the scheduler's rescuer (leases that expired).
//
// - succeeded/cached end the stage; user_error and failed are never retried.
// - Preemptions (spot_interruption, capacity_unavailable, lost) draw on their own budget,
//   retry.max_interruptions; the interruption that spends it moves the stage to on-demand
//   (then: on-demand) or fails it (then: fail). Preemptions never consume the error budget, except
//   on on-demand after the fallback, where a lost instance is an error like any other.
// - Errors (timeout, infra_error) are retried while attempts for errors remain
//   (retry.max_attempts counts them) and the outcome is listed in retry.on.
// - Backoff: initial * factor^(n-1), capped at max, times a jitter factor in [0.8, 1.2).
#include "common/stage_spec.h"

namespace trnflow {

struct RetryDecision {
  StageState next = StageState::kFailed;
  Market market = Market::kOnDemand;  // market of the next attempt
  double retry_in_s = 0;              // for retry_wait
  std::string reason;                 // why, for people: "preemption 2 of 6", "errors exhausted"
};

// `errors_before` and `preemptions_before` count earlier attempts of the stage; `jitter` is a
// number in [0, 1) from the caller's seeded generator.
RetryDecision DecideAfterAttempt(const StageSpec& spec, Market current, Outcome outcome,
                                 int errors_before, int preemptions_before, double jitter);

// The backoff before error retry number `n` (1-based), jitter in [0, 1).
double BackoffSeconds(const Backoff& b, int n, double jitter);

}  // namespace trnflow
