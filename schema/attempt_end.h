#pragma once
// How an attempt ends, whoever sees it end: the one place that turns an ending into the
// attempt's bill and its stage's next state (River's JobSetState* plays this part). The
// worker calls it for what its executor returned (succeeded, failed, interrupted, timed out,
// cancelled, over budget, shut down), for a claim it hands back unstarted, and the scheduler's
// rescuer for an attempt whose worker stopped heartbeating (lost). CompleteAttempts then
// writes the result fenced on the lease, and applies the one rule SQL must see at the moment
// of writing: a stage of a cancelled run never goes back to the queue (closing_state,
// migration 0024), which this function applies too when it already knows.
//
// The bill: an attempt on which an instance ran is billed `sim_seconds` like EC2 (Charge: per
// second, one minute at least); the part of it whose work is redone is its waste. Nothing is
// billed when no instance ran (capacity unavailable, a cache hit, a hand-back, a budget spent
// before the start).
#include <optional>
#include <string>

#include "common/money.h"
#include "common/stage_spec.h"
#include "schema/catalog_rows.h"

namespace trnflow::schema {

// What the claim knew about the attempt.
struct AttemptFacts {
  int64_t stage_id = 0;
  int attempt = 0;
  std::string lease_owner;
  const StageSpec* spec = nullptr;
  Market market = Market::kOnDemand;
  int errors = 0;       // earlier attempts' errors and preemptions (the retry budgets)
  int preemptions = 0;
  double speed = 1;     // the run's simulated seconds per wall second (backoffs are simulated)
  Money price_per_hour;
  int instance_count = 1;
  bool run_cancelled = false;  // its run was cancelled or stopped over budget
};

// How it ended.
struct AttemptEnding {
  Outcome outcome = Outcome::kSucceeded;
  bool ran_instance = true;     // false: nothing to bill
  double sim_seconds = 0;       // simulated seconds the instance ran (billed)
  double progress_to = 0;       // the stage's resume point afterwards, 0..1
  double lost_fraction = 0;     // of the bill, the part whose work will be redone
  std::string message;
  std::optional<StageState> next;  // set: this next state (a hand-back); else the retry rules
  double retry_in_s = 1;           // with `next` = retry_wait: wall seconds to wait
};

// The ledger row's figures and the stage's next state. `jitter` in [0, 1) spreads backoffs.
AttemptResult EndAttempt(const AttemptFacts& facts, const AttemptEnding& ending, double jitter);

// Of a lost attempt's bill, the part redone: the work after its last checkpoint. `reported`:
// how far its last heartbeat said it was (< 0: it never said: all of it is lost).
double LostFraction(double progress_from, double checkpointed, double reported);

}  // namespace trnflow::schema
