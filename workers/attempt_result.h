#pragma once
// Result mapping (internal to workers/): turns what an executor returned for one attempt into
// the ledger row the committer writes. The ending rule itself is schema::EndAttempt (attempt
// ends, retries, bills); these functions only say what the worker knows: the claim's facts
// (FactsOf) and how the attempt ended given why it was stopped (EndingOf: a shutdown hands the
// stage back, a spent budget overrides the executor's word); AttemptResultOf runs EndAttempt
// over them and adds what a cache hit saved and what the attempt would have cost on the GPU
// baseline (attempt_result.cpp's CacheHitSaved and BaselineCost). Pure functions of their
// arguments: no catalog, no locks (the caller draws the jitter).
#include <string>

#include "common/money.h"
#include "schema/attempt_end.h"
#include "schema/catalog_rows.h"
#include "workers/executor.h"

namespace trnflow::workers {

// What the claim knew, for EndAttempt; `worker_id` is this incarnation's.
schema::AttemptFacts FactsOf(const schema::ClaimedStage& c, const std::string& worker_id,
                             bool run_cancelled);

// The attempt's end as its executor returned it, and why it was stopped (if it was).
schema::AttemptEnding EndingOf(const ExecResult& er, StopReason why);

// The ledger row of one attempt: EndAttempt over FactsOf and EndingOf (with `jitter`, a
// uniform draw in [0, 1) for the retry backoff), then the output digest, what a cache hit
// saved and the baseline cost.
schema::AttemptResult AttemptResultOf(const schema::ClaimedStage& c, const ExecResult& er,
                                      StopReason why, const std::string& worker_id,
                                      double jitter);

}  // namespace trnflow::workers
