// Result mapping: see attempt_result.h.
#include "workers/attempt_result.h"

#include "sim/baseline.h"
#include "sim/catalog.h"
#include "sim/perf_model.h"

namespace trnflow::workers {
namespace {

// What this attempt's useful work would have cost on the GPU baseline (sim/baseline.h: same
// market and count), plus its waste, which the market would have caused either way. Stages
// the baseline does not change (commands, compiles, no progress) cost the same there.
Money BaselineCost(const schema::ClaimedStage& c, const ExecResult& er, Money cost, Money wasted) {
  if (c.spec.workload_json.empty()) return cost;
  try {
    auto gpu = sim::GpuBaselineCost(sim::WorkloadFromJson(c.spec.workload_json),
                                    c.instance_count, c.market, c.attempt == 1,
                                    er.progress_to - c.progress);
    return gpu ? *gpu + wasted : cost;
  } catch (const std::exception&) {
    return cost;
  }
}

// Served from the cache: no instance, and the work it spared is saved. A compile is priced on
// this stage's own instance; other stages at what their builder paid.
Money CacheHitSaved(const schema::ClaimedStage& c, const ExecResult& er) {
  Money saved = er.saved;
  const auto* t = sim::Catalog::Builtin().FindInstance(c.spec.instance);
  if (c.spec.kind == StageKind::kCompile && t)
    saved =
        Charge(c.price_per_hour, c.instance_count,
               sim::EstimateCompile(sim::WorkloadFromJson(c.spec.workload_json), *t).seconds);
  return saved;
}

}  // namespace

schema::AttemptFacts FactsOf(const schema::ClaimedStage& c, const std::string& worker_id,
                             bool run_cancelled) {
  return {c.stage_id,       c.attempt,      worker_id, &c.spec,   c.market,      c.errors,
          c.preemptions,    c.speed,        c.price_per_hour,     c.instance_count,
          run_cancelled};
}

schema::AttemptEnding EndingOf(const ExecResult& er, StopReason why) {
  schema::AttemptEnding e;
  e.outcome = why == StopReason::kBudgetExceeded ? Outcome::kBudgetExceeded : er.outcome;
  e.ran_instance = er.ran_instance;
  e.sim_seconds = er.sim_seconds;
  e.progress_to = er.progress_to;
  e.lost_fraction = er.lost_fraction;
  e.message = er.message;
  if (why == StopReason::kShutdown) {  // handed back: ready again at once, on its market
    e.outcome = Outcome::kCancelled;
    e.next = StageState::kReady;
    e.message = "worker shut down; stage handed back";
  }
  return e;
}

schema::AttemptResult AttemptResultOf(const schema::ClaimedStage& c, const ExecResult& er,
                                      StopReason why, const std::string& worker_id,
                                      double jitter) {
  bool cancelled = why == StopReason::kCancelled || why == StopReason::kBudgetExceeded;
  schema::AttemptResult r =
      schema::EndAttempt(FactsOf(c, worker_id, cancelled), EndingOf(er, why), jitter);
  r.output_digest = er.output_digest;
  if (r.outcome == Outcome::kCached) r.saved = CacheHitSaved(c, er);
  r.baseline = BaselineCost(c, er, r.cost, r.wasted);
  return r;
}

}  // namespace trnflow::workers
