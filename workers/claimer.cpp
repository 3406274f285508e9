// The claimer: takes ready stages from the catalog for this worker's pools and launches them.
// A claim loop (its own thread and catalog connection) claims in batches per pool, never more
// than the pool's free instances (reserved with Pool::ReserveFree, so the claim loop and the
// committer together never exceed the capacity), woken by the LISTEN loop (its own thread) on
// a ready or cancel notification and polling every poll_s as the safety net. Every claim, the
// claim loop's or the committer's, goes through RunClaimed: budgeted stages get their spend
// caps (ReserveBudgets); one that must wait for its budget, or any claim made while the worker
// stops, is handed back unstarted (HandBack: ready again after a short wait, the attempt closed
// as cancelled, nothing billed); the rest are launched (attempt_runner.cpp).
#include <algorithm>
#include <limits>
#include <map>

#include "schema/attempt_end.h"
#include "sim/catalog.h"
#include "sim/perf_model.h"
#include "workers/attempt_result.h"
#include "workers/worker_impl.h"

namespace trnflow::workers {

// Claims in batches: an idle pool claims at once (pickup latency), a busy one waits until a
// quarter of it is free or a few milliseconds have passed, so a stream of short stages is
// not claimed one statement per finished stage. Each claim takes at most a quarter of the
// pool's capacity in stages and the loop goes on while claims come back: a burst that woke
// several idle workers is shared between them instead of taken whole by the first to ask.
// (The committer's claim is not limited: a worker keeps the dependents it releases.)
void Worker::Impl::ClaimLoop() {
  std::unique_ptr<schema::WorkerCatalog> cat;
  const auto gather = std::chrono::milliseconds(3);
  std::vector<Steady::time_point> last_claim(pools.size(), Steady::now());
  while (claiming) {
    bool more = false, gathering = false;
    for (size_t i = 0; i < pools.size(); ++i) {
      Pool* pool = pools[i].get();
      int used = pool->used.load(), free = pool->config.capacity - used;
      if (free <= 0 || !claiming) continue;
      if (used > 0 && free < std::max(1, pool->config.capacity / 4) &&
          Steady::now() - last_claim[i] < gather) {
        gathering = true;
        continue;
      }
      last_claim[i] = Steady::now();
      int reserved = pool->ReserveFree();
      if (reserved <= 0) continue;
      std::vector<schema::ClaimedStage> claimed;
      if (!WithCatalog(cat, "claim", [&](schema::WorkerCatalog& c) {
            claimed =
                c.ClaimReadyStages(pool->config.name, reserved, id, name, opt.lease_s, opt.only_run,
                                   std::max(1, pool->config.capacity / 4), opt.projects);
          })) {
        pool->used -= reserved;
        return;
      }
      pool->used -= reserved - Instances(claimed);
      RunClaimed(cat, *pool, claimed);
      if (!claimed.empty() && pool->used.load() < pool->config.capacity) more = true;
    }
    if (more) continue;
    std::unique_lock lock(mu);
    if (gathering) {
      claim_cv.wait_for(lock, gather, [&] { return !claiming; });
    } else {
      claim_cv.wait_for(lock, std::chrono::duration<double>(opt.poll_s),
                        [&] { return wake_claim || !claiming; });
    }
    wake_claim = false;
  }
}

// Runs what a claim took (its instances already counted in the pool's `used`): budgeted
// stages get their spend caps first; one that must wait for its budget is handed back.
void Worker::Impl::RunClaimed(std::unique_ptr<schema::WorkerCatalog>& cat, Pool& pool,
                              std::vector<schema::ClaimedStage>& claimed) {
  ReserveBudgets(cat, claimed);
  for (auto& c : claimed) {
    if (c.budget_wait || !claiming) {
      pool.used -= c.instance_count;
      HandBack(c, c.budget_wait ? "waiting: other running attempts hold what is left of the budget"
                                : "handed back: the worker is stopping");
      continue;
    }
    Launch(pool, std::move(c));
  }
}

// What an attempt is expected to cost, when the engine can tell: a simulated stage's
// remaining work at its price (the simulator is deterministic); a command's timeout bounds
// it. Unknown otherwise: the attempt then reserves all it may spend.
std::optional<Money> Worker::Impl::ExpectedCost(const schema::ClaimedStage& c) {
  double seconds = -1;
  if (c.spec.kind != StageKind::kRun && !c.spec.workload_json.empty()) {
    if (const auto* t = sim::Catalog::Builtin().FindInstance(c.spec.instance)) {
      try {
        sim::Estimate e = sim::EstimateStage(sim::WorkloadFromJson(c.spec.workload_json), *t,
                                             c.instance_count, c.attempt == 1);
        seconds = e.setup_seconds + (1 - c.progress) * std::max(1.0, e.work_seconds);
      } catch (const std::exception&) {
      }
    }
  }
  if (seconds < 0 && c.spec.timeout_s > 0) seconds = c.spec.timeout_s + kTermGraceSimSeconds;
  if (seconds < 0) return std::nullopt;
  return Charge(c.price_per_hour, c.instance_count, seconds);
}

// Caps the spend of budgeted claims: each gets what is left of its run's and project's
// budgets after other open attempts' reservations. An attempt whose cap does not cover one
// billing minute waits (handed back) while others hold the rest; when nobody does, the budget
// is spent and it ends at once as budget_exceeded, with nothing billed.
void Worker::Impl::ReserveBudgets(std::unique_ptr<schema::WorkerCatalog>& cat,
                                  std::vector<schema::ClaimedStage>& claimed) {
  std::vector<schema::ClaimedStage> budgeted;
  std::vector<std::optional<Money>> expected;
  for (const auto& c : claimed)
    if (c.budgeted) {
      budgeted.push_back(c);
      expected.push_back(ExpectedCost(c));
    }
  if (budgeted.empty()) return;
  std::vector<schema::BudgetReservation> caps;
  WithCatalog(
      cat, "reserve budgets",
      [&](schema::WorkerCatalog& k) { caps = k.ReserveBudgets(budgeted, expected); },
      /*give_up_on_stop=*/false);
  std::map<int64_t, std::optional<Money>> expected_of;
  for (size_t i = 0; i < budgeted.size(); ++i) expected_of[budgeted[i].stage_id] = expected[i];
  for (const auto& r : caps)
    for (auto& c : claimed) {
      if (c.stage_id != r.stage_id) continue;
      Money per_hour = Money::FromMicros(c.price_per_hour.micros() * c.instance_count);
      // A command is held to what it reserved (its timeout and grace): the caps of the
      // attempts beside it were computed on that. Four parallel commands that each ran to
      // the whole cap spent $197 of a $50 budget. (A simulated stage's estimate is exact.)
      Money cap = r.cap;
      if (const auto& e = expected_of[c.stage_id]; e && c.spec.kind == StageKind::kRun)
        cap = std::min(cap, *e);
      double cap_s = per_hour.micros() > 0 ? 3600.0 * static_cast<double>(cap.micros()) /
                                                 static_cast<double>(per_hour.micros())
                                           : std::numeric_limits<double>::infinity();
      c.spend_cap_s = cap_s;
      c.budget_wait = cap_s < 60 && r.held.micros() > 0;
    }
}

// Gives a claimed stage back without running it: ready again after a short wait, the attempt
// closed as cancelled (no bill, not counted against any budget).
void Worker::Impl::HandBack(const schema::ClaimedStage& c, const std::string& why) {
  schema::AttemptEnding e;
  e.outcome = Outcome::kCancelled;
  e.ran_instance = false;
  e.next = StageState::kRetryWait;
  e.retry_in_s = 1;
  e.progress_to = c.progress;
  e.message = why;
  schema::AttemptResult r = schema::EndAttempt(FactsOf(c, id, false), e, 0);
  {
    std::scoped_lock lock(mu);
    results.push_back(std::move(r));
  }
  commit_cv.notify_one();
}

void Worker::Impl::ListenLoop() {
  std::unique_ptr<schema::WorkerCatalog> cat;
  while (claiming) {
    bool ok = WithCatalog(cat, "listen", [&](schema::WorkerCatalog& c) {
      if (!c.IsListening()) {
        c.ListenForReadyStages();
        WakeClaim();  // anything announced while we were not listening
      }
      auto n = c.AwaitNotifications(250);
      if (n.ready > 0) WakeClaim();
      if (n.cancel > 0) WakeHeartbeat();  // it stops the stages of cancelled runs
    });
    if (!ok) return;
  }
}

}  // namespace trnflow::workers
