#include "schema/attempt_end.h"

#include <algorithm>
#include <cmath>

#include "common/retry_policy.h"

namespace trnflow::schema {

AttemptResult EndAttempt(const AttemptFacts& f, const AttemptEnding& e, double jitter) {
  AttemptResult r;
  r.stage_id = f.stage_id;
  r.attempt = f.attempt;
  r.lease_owner = f.lease_owner;
  r.outcome = e.outcome;
  r.sim_seconds = e.sim_seconds;
  r.progress_to = e.progress_to;
  r.message = e.message;
  if (e.next) {
    r.next_state = *e.next;
    r.next_market = f.market;
    r.retry_in_s = e.retry_in_s;
  } else {
    RetryDecision d = DecideAfterAttempt(*f.spec, f.market, e.outcome, f.errors, f.preemptions,
                                         jitter);
    r.next_state = d.next;
    r.next_market = d.market;
    r.retry_in_s = d.retry_in_s / std::max(1e-9, f.speed);  // the run's clock
    if (!d.reason.empty() && e.outcome != Outcome::kSucceeded)
      r.message += (r.message.empty() ? "" : "; ") + d.reason;
  }
  if (f.run_cancelled &&
      (r.next_state == StageState::kReady || r.next_state == StageState::kRetryWait)) {
    r.next_state = StageState::kCancelled;
    r.message += (r.message.empty() ? "" : "; ") +
                 std::string("its run was cancelled, so it is not tried again");
  }
  bool billed = e.ran_instance && e.outcome != Outcome::kCapacityUnavailable &&
                e.outcome != Outcome::kCached;
  if (billed) {
    r.billed_seconds = BilledSeconds(e.sim_seconds);
    r.cost = Charge(f.price_per_hour, f.instance_count, e.sim_seconds);
    r.wasted = Money::FromMicros(std::llround(static_cast<double>(r.cost.micros()) *
                                              std::clamp(e.lost_fraction, 0.0, 1.0)));
  }
  r.baseline = r.cost;
  return r;
}

double LostFraction(double progress_from, double checkpointed, double reported) {
  double worked = reported - progress_from;
  double kept = std::max(0.0, checkpointed - progress_from);
  return worked > 0 ? std::clamp((worked - kept) / worked, 0.0, 1.0) : 1.0;
}

}  // namespace trnflow::schema
