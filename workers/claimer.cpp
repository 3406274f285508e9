// The claimer: takes ready stages from the catalog for this worker's pools and launches them.
// A claim loop (its own thread and catalog connection) claims in batches per pool, never more
// than the pool's free instances (reserved with Pool::ReserveFree, so the claim loop and the
// committer together never exceed the capacity), woken by the LISTEN loop (its own thread) on
// a ready or cancel notification and polling every poll_s as the safety net. Every claim, the
// claim loop's or the committer's, goes through RunClaimed: budgeted stages get their spend
// reservations (ReserveBudgets); one that waits for its budget was un-claimed by its
// reservation (no ledger row); any claim made while the worker stops is handed back unstarted
// (HandBack: ready again after a short wait, the attempt closed as cancelled, nothing billed);
// the rest are launched (attempt_runner.cpp).
#include <algorithm>
#include <cmath>
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
// stages get their reservations first; one that waits for its budget was un-claimed by the
// reservation itself (no ledger row) and is let go.
void Worker::Impl::RunClaimed(std::unique_ptr<schema::WorkerCatalog>& cat, Pool& pool,
                              std::vector<schema::ClaimedStage>& claimed) {
  ReserveBudgets(cat, claimed);
  for (auto& c : claimed) {
    if (c.budget_wait) {
      pool.used -= c.instance_count;
      continue;
    }
    if (!claiming) {
      pool.used -= c.instance_count;
      HandBack(c, "handed back: the worker is stopping");
      continue;
    }
    Launch(pool, std::move(c));
  }
}

// What an attempt reserves when it starts, its estimate: a simulated stage's remaining work at
// its price (the simulator is deterministic); a command's timeout and grace; else its
// `estimate:` and a quarter more; else nullopt: the catalog reserves one billing minute. A
// budgeted attempt tops its reservation up in slices while it runs (TopUp).
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
  if (seconds < 0 && c.spec.estimate_s > 0) seconds = c.spec.estimate_s * kEstimateMargin;
  if (seconds < 0) return std::nullopt;
  return Charge(c.price_per_hour, c.instance_count, std::min(seconds, 1e9));
}

// Reserves each budgeted claim's estimate (trnflow.reserve_budgets, migration 0033): granted,
// its cap is its reservation; not covered while other attempts hold reservations, it waits in
// the catalog (un-claimed there, one `budget` event, no ledger row) and is not run here; when
// nobody else holds anything it gets what is left (under one billing minute it ends at once
// as budget_exceeded, nothing billed). A claim the answer leaves out is no longer this
// worker's: it is not run either.
void Worker::Impl::ReserveBudgets(std::unique_ptr<schema::WorkerCatalog>& cat,
                                  std::vector<schema::ClaimedStage>& claimed) {
  std::vector<schema::ClaimedStage> budgeted;
  std::vector<std::optional<Money>> want;
  for (const auto& c : claimed)
    if (c.budgeted) {
      budgeted.push_back(c);
      want.push_back(ExpectedCost(c));
    }
  if (budgeted.empty()) return;
  std::vector<schema::BudgetReservation> got;
  WithCatalog(
      cat, "reserve budgets",
      [&](schema::WorkerCatalog& k) { got = k.ReserveBudgets(budgeted, want, id); },
      /*give_up_on_stop=*/false);
  std::map<int64_t, const schema::BudgetReservation*> of;
  for (const auto& r : got) of[r.stage_id] = &r;
  for (auto& c : claimed) {
    if (!c.budgeted) continue;
    auto it = of.find(c.stage_id);
    if (it == of.end() || it->second->waits) {
      if (it == of.end())
        log->warn("stage={} attempt={}: no longer ours when its budget was reserved; not run",
                  c.stage_id, c.attempt);
      else
        log->info("stage={} waits for its budget ({} not covered)", c.stage_id,
                  it->second->waits->ToDollars());
      c.budget_wait = true;
      continue;
    }
    if (!it->second->cap) continue;  // no budget limits it any more
    c.spend_cap_s = CapSeconds(c, *it->second->cap);
  }
}

// A cap in money as simulated seconds of the attempt at its price. Amounts are rounded to the
// micro-dollar: a cap within a twentieth of a second of a whole second is that second (one
// billing minute, $0.358333 on trn1.32xlarge, is 60 s, not 59.99994).
double Worker::Impl::CapSeconds(const schema::ClaimedStage& c, Money cap) {
  int64_t per_hour = c.price_per_hour.micros() * c.instance_count;
  if (per_hour <= 0) return std::numeric_limits<double>::infinity();
  double s = 3600.0 * static_cast<double>(cap.micros()) / static_cast<double>(per_hour);
  double whole = std::round(s);
  return std::abs(s - whole) < 0.05 ? whole : s;
}

// A running budgeted attempt near its cap asks for a slice more: a minute of simulated time,
// or what a few seconds of wall time are at the run's speed if more, never past `bound_s` (a
// command with a timeout: its timeout and grace). Returns its cap in simulated seconds; the
// old one when nothing is left or the catalog cannot be reached (it then stops at its cap).
double Worker::Impl::TopUp(const schema::ClaimedStage& c, double cap_s, double bound_s) {
  double slice_s = std::max(kTopUpSliceSimSeconds, c.speed * kTopUpSliceWallSeconds);
  slice_s = std::min(slice_s, bound_s - cap_s);
  int64_t per_hour = c.price_per_hour.micros() * c.instance_count;
  if (slice_s <= 0 || per_hour <= 0) return cap_s;
  Money more = Money::FromMicros(static_cast<int64_t>(
      std::ceil(static_cast<double>(per_hour) * std::min(slice_s, 1e9) / 3600)));
  std::optional<Money> cap;
  std::scoped_lock lock(top_up_mu);
  for (int tries = 0; tries < 2; ++tries) {
    try {
      if (!top_up_cat) top_up_cat = schema::OpenWorkerCatalog(opt.database_url);
      cap = top_up_cat->TopUpBudget(c.stage_id, c.attempt, id, more);
      break;
    } catch (const std::exception& e) {
      top_up_cat.reset();
      log->warn("stage={} attempt={}: topping up its budget: {}", c.stage_id, c.attempt, e.what());
    }
  }
  if (!cap) return cap_s;
  return std::min(bound_s, std::max(cap_s, CapSeconds(c, *cap)));
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
