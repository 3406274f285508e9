#include "workers/worker.h"

#include <sys/stat.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "common/retry_policy.h"
#include "common/sha256.h"
#include "nlohmann/json.hpp"
#include "schema/attempt_end.h"
#include "schema/catalog.h"
#include "sim/catalog.h"
#include "sim/feasibility.h"
#include "sim/perf_model.h"
#include "schema/member_lock_guard.h"
#include "workers/artifact_store.h"
#include "workers/executor.h"
#include "workers/job_cgroup.h"
#include "workers/pause.h"
#include "workers/stage_cache.h"

namespace trnflow::workers {
namespace {

using Steady = std::chrono::steady_clock;

std::string NewUuid() {
  std::random_device rd;
  std::mt19937_64 g((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                    static_cast<uint64_t>(Steady::now().time_since_epoch().count()));
  uint64_t a = g(), b = g();
  a = (a & ~0xF000ULL) | 0x4000ULL;                         // version 4
  b = (b & 0x3FFFFFFFFFFFFFFFULL) | 0x8000000000000000ULL;  // variant 1
  char buf[40];
  std::snprintf(
      buf, sizeof buf, "%08llx-%04llx-%04llx-%04llx-%012llx",
      static_cast<unsigned long long>(a >> 32), static_cast<unsigned long long>((a >> 16) & 0xFFFF),
      static_cast<unsigned long long>(a & 0xFFFF), static_cast<unsigned long long>(b >> 48),
      static_cast<unsigned long long>(b & 0xFFFFFFFFFFFFULL));
  return buf;
}

// FNV-1a: a stable hash, so the same run seed gives the same draws on every build.
uint64_t Fnv1a(const std::string& s, uint64_t h = 1469598103934665603ULL) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

// What this attempt's useful work would have cost on the GPU baseline (p4d.24xlarge, same
// market and count), plus its waste, which the market would have caused either way. Stages
// the baseline does not change (commands, compiles, no progress) cost the same there.
Money BaselineCost(const schema::ClaimedStage& c, const ExecResult& er, Money cost, Money wasted) {
  const sim::Catalog& hw = sim::Catalog::Builtin();
  const sim::InstanceType* gpu = hw.FindInstance("p4d.24xlarge");
  double useful = er.progress_to - c.progress;
  if (!gpu || c.spec.workload_json.empty() || useful <= 0 ||
      (c.spec.kind != StageKind::kTrain && c.spec.kind != StageKind::kDeploy &&
       c.spec.kind != StageKind::kBenchmark))
    return cost;
  try {
    sim::Workload w = sim::WorkloadFromJson(c.spec.workload_json);
    sim::Estimate e = sim::EstimateStage(w, *gpu, c.instance_count, c.attempt == 1);
    if (e.work_seconds <= 0) return cost;
    return Charge(gpu->price(c.market == Market::kSpot), c.instance_count,
                  useful * e.work_seconds) +
           wasted;
  } catch (const std::exception&) {
    return cost;
  }
}

// A stage's secrets, by name, from the project's file on this host or, for site-wide ones,
// this process's TRNFLOW_SECRET_<NAME>. Returns the names it could not find, or throws when
// the file is readable by others (a secret anyone on the host could read is no secret).
std::vector<std::string> ResolveSecrets(const std::string& dir, const std::string& project,
                                        const std::vector<std::string>& names,
                                        std::map<std::string, std::string>* values) {
  std::map<std::string, std::string> file;
  std::string path = dir + "/" + project + ".env";
  struct stat st {};
  if (!names.empty() && ::stat(path.c_str(), &st) == 0) {
    if (st.st_mode & 077)
      throw std::runtime_error("secrets file " + path + " is readable by others (mode " +
                               std::to_string(st.st_mode & 0777) + "); chmod 600 it");
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      if (line.empty() || line[0] == '#' || line.find('=') == std::string::npos) continue;
      file[line.substr(0, line.find('='))] = line.substr(line.find('=') + 1);
    }
  }
  std::vector<std::string> missing;
  for (const auto& n : names) {
    if (auto it = file.find(n); it != file.end()) {
      (*values)[n] = it->second;
    } else if (const char* v = std::getenv(("TRNFLOW_SECRET_" + n).c_str())) {
      (*values)[n] = v;
    } else {
      missing.push_back(n);
    }
  }
  return missing;
}

struct Running {
  schema::ClaimedStage claim;
  std::chrono::steady_clock::time_point claimed_at;  // the instance is held from here
  std::atomic<int> stop{0};
  std::mutex metrics_mu;  // guards metrics, metrics_dirty, live, live_known
  std::string metrics;
  bool metrics_dirty = false;
  LiveProgress live;  // the executor's latest word, sent with each heartbeat
  bool live_known = false;
};

struct Pool {
  PoolConfig config;
  std::atomic<int> used{0};  // instances held by running stages and by claims in flight
  std::unique_ptr<tbb::task_arena> arena;

  // Takes every free instance for a claim about to be made (the claim loop and the committer
  // both claim); the caller gives back what the claim did not use.
  int ReserveFree() {
    int now = used.load();
    while (now < config.capacity && !used.compare_exchange_weak(now, config.capacity)) {
    }
    return std::max(0, config.capacity - now);
  }
};

int Instances(const std::vector<schema::ClaimedStage>& claimed) {
  int n = 0;
  for (const auto& c : claimed) n += c.instance_count;
  return n;
}

}  // namespace

struct Worker::Impl {
  WorkerOptions opt;
  std::string id = NewUuid();
  std::string name;
  std::shared_ptr<spdlog::logger> log = Logger("workers");
  std::vector<std::unique_ptr<Pool>> pools;
  std::unique_ptr<tbb::global_control> parallelism;
  bool sandboxed = false;  // decided in Start(): jobs switch to their project's uid
  JobNamespaces namespaces;  // decided in Start(): with the sandbox, every command in bwrap
  std::unique_ptr<schema::MemberLockGuard> lock_guard;  // from Start() to the end of Stop()

  mutable std::mutex mu;  // guards running, results, wake_claim, rng
  std::map<int64_t, std::shared_ptr<Running>> running;
  std::deque<schema::AttemptResult> results;
  bool wake_claim = false;
  bool wake_heartbeat = false;
  std::mt19937_64 rng{std::random_device{}()};
  std::condition_variable claim_cv, commit_cv, idle_cv, heartbeat_cv;

  std::atomic<bool> claiming{false};
  std::atomic<bool> stopping{false};
  std::atomic<int> tasks{0};
  std::thread claim_thread, listen_thread, heartbeat_thread, commit_thread;

  SimExecutor sim_executor;
  ProcessExecutor process_executor;
  std::unique_ptr<SlurmExecutor> slurm_executor;  // opt.slurm: it runs every stage

  // Who runs a simulated stage here: this process, or a Slurm job.
  Executor& Simulated() {
    return slurm_executor ? static_cast<Executor&>(*slurm_executor) : sim_executor;
  }

  // Runs `body` with this thread's catalog, re-opening the connection with backoff until it
  // works or the worker stops. Returns false if it gave up because the worker is stopping.
  template <typename F>
  bool WithCatalog(std::unique_ptr<schema::Catalog>& c, const char* what, F&& body,
                   bool give_up_on_stop = true) {
    double backoff = 0.1;
    while (true) {
      try {
        if (!c) c = std::make_unique<schema::Catalog>(opt.database_url);
        body(*c);
        return true;
      } catch (const CatalogUnavailable& e) {
        c.reset();
        log->warn("{}: {}; retrying in {:.1f}s", what, e.what(), backoff);
      } catch (const std::exception& e) {
        c.reset();
        log->error("{}: {}; retrying in {:.1f}s", what, e.what(), backoff);
      }
      auto until = Steady::now() + std::chrono::duration_cast<Steady::duration>(
                                       std::chrono::duration<double>(backoff));
      while (Steady::now() < until) {
        if (give_up_on_stop && stopping) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      backoff = std::min(backoff * 2, 5.0);
    }
  }

  void WakeHeartbeat() {
    {
      std::scoped_lock lock(mu);
      wake_heartbeat = true;
    }
    heartbeat_cv.notify_one();
  }

  void WakeClaim() {
    {
      std::scoped_lock lock(mu);
      wake_claim = true;
    }
    claim_cv.notify_one();
  }

  // Claims in batches: an idle pool claims at once (pickup latency), a busy one waits until a
  // quarter of it is free or a few milliseconds have passed, so a stream of short stages is
  // not claimed one statement per finished stage. Each claim takes at most a quarter of the
  // pool's capacity in stages and the loop goes on while claims come back: a burst that woke
  // several idle workers is shared between them instead of taken whole by the first to ask.
  // (The committer's claim is not limited: a worker keeps the dependents it releases.)
  void ClaimLoop() {
    std::unique_ptr<schema::Catalog> cat;
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
        if (!WithCatalog(cat, "claim", [&](schema::Catalog& c) {
              claimed = c.ClaimReadyStages(pool->config.name, reserved, id, name, opt.lease_s,
                                           opt.only_run, std::max(1, pool->config.capacity / 4));
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
  void RunClaimed(std::unique_ptr<schema::Catalog>& cat, Pool& pool,
                  std::vector<schema::ClaimedStage>& claimed) {
    ReserveBudgets(cat, claimed);
    for (auto& c : claimed) {
      if (c.budget_wait || !claiming) {
        pool.used -= c.instance_count;
        HandBack(c, c.budget_wait
                        ? "waiting: other running attempts hold what is left of the budget"
                        : "handed back: the worker is stopping");
        continue;
      }
      Launch(pool, std::move(c));
    }
  }

  // What an attempt is expected to cost, when the engine can tell: a simulated stage's
  // remaining work at its price (the simulator is deterministic); a command's timeout bounds
  // it. Unknown otherwise: the attempt then reserves all it may spend.
  static std::optional<Money> ExpectedCost(const schema::ClaimedStage& c) {
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
  void ReserveBudgets(std::unique_ptr<schema::Catalog>& cat,
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
        [&](schema::Catalog& k) { caps = k.ReserveBudgets(budgeted, expected); },
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
  void HandBack(const schema::ClaimedStage& c, const std::string& why) {
    schema::AttemptEnding e;
    e.outcome = Outcome::kCancelled;
    e.ran_instance = false;
    e.next = StageState::kRetryWait;
    e.retry_in_s = 1;
    e.progress_to = c.progress;
    e.message = why;
    schema::AttemptResult r = schema::EndAttempt(FactsOf(c, false), e, 0);
    {
      std::scoped_lock lock(mu);
      results.push_back(std::move(r));
    }
    commit_cv.notify_one();
  }

  void ListenLoop() {
    std::unique_ptr<schema::Catalog> cat;
    while (claiming) {
      bool ok = WithCatalog(cat, "listen", [&](schema::Catalog& c) {
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

  void HeartbeatLoop() {
    std::unique_ptr<schema::Catalog> cat;
    while (!stopping) {
      // Only stages that were running before the query can be judged by its answer.
      std::vector<std::pair<int64_t, std::shared_ptr<Running>>> before;
      {
        std::scoped_lock lock(mu);
        for (auto& [sid, r] : running) before.push_back({sid, r});
      }
      std::vector<schema::LeaseKey> held;
      std::vector<schema::EventRow> metrics;
      std::vector<schema::LiveReport> reports;
      for (auto& [sid, r] : before) {
        std::scoped_lock lock(r->metrics_mu);
        reports.push_back({sid, r->live_known, r->live.progress, r->live.checkpointed,
                           r->live.sim_seconds, r->live.eta_s});
        if (!r->metrics_dirty) continue;
        metrics.push_back({r->claim.run_id, sid, "metrics", "neuron-monitor", r->metrics});
        r->metrics_dirty = false;
      }
      bool ok = WithCatalog(cat, "heartbeat", [&](schema::Catalog& c) {
        held = c.HeartbeatLeases(id, opt.lease_s, reports);
        c.InsertEvents(metrics);
      });
      if (ok) {
        std::set<std::pair<int64_t, int>> keys;
        for (const auto& k : held) {
          keys.insert({k.stage_id, k.attempt});
          if (!k.run_cancelled) continue;
          std::scoped_lock lock(mu);
          if (auto it = running.find(k.stage_id); it != running.end()) {
            int expected = static_cast<int>(StopReason::kNone);
            auto why = k.cancel_reason == "budget_exceeded" ? StopReason::kBudgetExceeded
                                                            : StopReason::kCancelled;
            if (it->second->stop.compare_exchange_strong(expected, static_cast<int>(why)))
              log->info("run cancelled ({}): stopping stage={}",
                        k.cancel_reason.empty() ? "cancelled" : k.cancel_reason, k.stage_id);
          }
        }
        for (auto& [sid, r] : before) {
          if (keys.count({sid, r->claim.attempt})) continue;
          {
            // Finished meanwhile (and perhaps committed): nothing left to stop.
            std::scoped_lock lock(mu);
            auto it = running.find(sid);
            if (it == running.end() || it->second != r) continue;
          }
          int expected = static_cast<int>(StopReason::kNone);
          if (r->stop.compare_exchange_strong(expected, static_cast<int>(StopReason::kLeaseLost)))
            log->warn("lease lost stage={} attempt={}: stopping it, its result will be discarded",
                      sid, r->claim.attempt);
        }
      }
      std::unique_lock lock(mu);
      heartbeat_cv.wait_for(lock, std::chrono::duration<double>(opt.heartbeat_s),
                            [&] { return wake_heartbeat || stopping.load(); });
      wake_heartbeat = false;
    }
  }

  void CommitLoop() {
    std::unique_ptr<schema::Catalog> cat;
    while (true) {
      std::vector<schema::AttemptResult> batch;
      {
        std::unique_lock lock(mu);
        commit_cv.wait(lock, [&] { return !results.empty() || (stopping && tasks == 0); });
        if (results.empty()) return;
        // Short stages launched together end together: while others still run, wait until
        // results stop coming (0.3 ms without a new one, 2 ms at most) so a burst goes in one
        // transaction rather than one each.
        auto deadline = Steady::now() + std::chrono::milliseconds(2);
        for (size_t seen = results.size();
             tasks > 0 && static_cast<int>(seen) < opt.commit_batch && Steady::now() < deadline;
             seen = results.size()) {
          auto until = std::min(deadline, Steady::now() + std::chrono::microseconds(300));
          if (!commit_cv.wait_until(lock, until, [&] { return results.size() != seen; })) break;
        }
        while (!results.empty() && static_cast<int>(batch.size()) < opt.commit_batch) {
          batch.push_back(std::move(results.front()));
          results.pop_front();
        }
      }
      // The same transaction claims what is ready for the pools' free instances, the stages
      // this batch releases among them: a chain's next link starts without another round trip.
      std::vector<schema::Catalog::ClaimRequest> requests;
      std::vector<std::pair<Pool*, int>> reserved;
      if (claiming)
        for (auto& p : pools)
          if (int n = p->ReserveFree(); n > 0) {
            requests.push_back({p->config.name, n});
            reserved.push_back({p.get(), n});
          }
      // A retry after a lost reply is harmless: writes are fenced on the lease (a claim whose
      // reply was lost expires and is rescued, as any claim's).
      schema::Catalog::Committed done;
      WithCatalog(
          cat, "commit",
          [&](schema::Catalog& c) {
            done = c.CompleteAndClaim(batch, requests, id, name, opt.lease_s, opt.only_run);
            if (done.applied.size() < batch.size())
              log->warn("{} of {} results were stale (lease taken over) and were dropped",
                        batch.size() - done.applied.size(), batch.size());
          },
          /*give_up_on_stop=*/false);
      for (size_t i = 0; i < reserved.size(); ++i) {
        auto& [pool, n] = reserved[i];
        std::vector<schema::ClaimedStage> claimed;
        if (i < done.claimed.size()) claimed = std::move(done.claimed[i]);
        pool->used -= n - Instances(claimed);
        if (!claimed.empty()) RunClaimed(cat, *pool, claimed);
      }
    }
  }

  void Launch(Pool& pool, schema::ClaimedStage claim) {
    auto run = std::make_shared<Running>();
    run->claim = std::move(claim);
    run->claimed_at = std::chrono::steady_clock::now();
    ++tasks;
    {
      std::scoped_lock lock(mu);
      running[run->claim.stage_id] = run;
    }
    log->debug("claimed stage={} attempt={} pool={}", run->claim.stage_id, run->claim.attempt,
               pool.config.name);
    pool.arena->enqueue([this, &pool, run] {
      SuspendableScope waits_suspend;  // a stage's waits free this thread (workers/pause.h)
      Execute(pool, run);
    });
  }

  // The task boundary: nothing escapes; every end becomes an outcome.
  void Execute(Pool& pool, const std::shared_ptr<Running>& run) {
    const schema::ClaimedStage& c = run->claim;
    ExecContext ctx;
    ctx.spec = c.spec;
    ctx.run_id = c.run_id;
    ctx.stage_id = c.stage_id;
    ctx.attempt = c.attempt;
    ctx.market = c.market;
    ctx.instance_count = c.instance_count;
    ctx.progress = c.progress;
    ctx.speed = c.speed;
    ctx.seed = Fnv1a(c.spec.name + "#" + std::to_string(c.attempt), Fnv1a(std::to_string(c.seed)));
    ctx.spot_rate_multiplier = c.spot_rate_multiplier;
    ctx.workdir = c.workdir;
    std::string run_tag = "run-" + std::to_string(c.run_id);
    ctx.run_dir = opt.home + "/runs/" + std::to_string(c.run_id);
    ctx.log_path = opt.home + "/logs/" + run_tag + "/" + SafeName(c.spec.name) + ".attempt-" +
                   std::to_string(c.attempt) + ".log";
    ctx.checkpoint_dir = opt.home + "/checkpoints/" + run_tag + "/" + SafeName(c.spec.name);
    int64_t uid = c.job_uid > 0 ? c.job_uid : opt.job_uid_base;
    ctx.identity.switch_user = sandboxed;
    ctx.identity.uid = static_cast<uid_t>(uid);
    ctx.identity.gid = static_cast<gid_t>(uid);
    ctx.limits = opt.job_limits;
    ctx.namespaces = namespaces;
    ctx.stop = &run->stop;
    ctx.claimed_at = run->claimed_at;
    ctx.spend_cap_s = c.spend_cap_s;
    ctx.report_metrics = [run](const std::string& json) {
      std::scoped_lock lock(run->metrics_mu);
      run->metrics = json;
      run->metrics_dirty = true;
    };
    ctx.record_executor_job = [this, &c](const std::string& job) {
      try {
        schema::Catalog cat(opt.database_url);
        if (!cat.RecordExecutorJob(c.stage_id, c.attempt, id, job))
          log->warn("stage={} attempt={}: job {} not recorded: the lease is gone", c.stage_id,
                    c.attempt, job);
      } catch (const std::exception& e) {
        // The job is found by its name (SlurmJobName) if its id never reaches the catalog.
        log->warn("stage={} attempt={}: job {} not recorded: {}", c.stage_id, c.attempt, job,
                  e.what());
      }
    };
    ctx.report_progress = [run](const LiveProgress& p) {
      std::scoped_lock lock(run->metrics_mu);
      run->live = p;
      run->live_known = true;
    };
    ExecResult er;
    try {
      std::vector<std::string> missing;
      if (c.spec_error.empty())
        missing = ResolveSecrets(opt.secrets_dir, c.project, c.spec.command.secrets, &ctx.secrets);
      if (!c.spec_error.empty()) {
        // A stored spec that cannot be read fails its own stage, never retried.
        er.outcome = Outcome::kUserError;
        er.ran_instance = false;
        er.message = "the stage's stored spec cannot be run (" + c.spec_error +
                     "); resubmit the pipeline with `trnflow submit`";
      } else if (!missing.empty()) {
        er.outcome = Outcome::kUserError;
        er.ran_instance = false;
        er.message = "secret " + missing.front() + " is not set for project " + c.project +
                     " on this worker (" + name + "): add it to " + opt.secrets_dir + "/" +
                     c.project + ".env";
      } else if (c.spend_cap_s < 60) {
        er.outcome = Outcome::kBudgetExceeded;
        er.ran_instance = false;
        er.progress_to = c.progress;
        er.message = "the budget is spent: nothing left to start this attempt with";
      } else if (opt.noop_executor && opt.noop_executor(c.stage_id))
        er = ExecResult{};
      else if (c.spec.kind == StageKind::kCompile && !c.spec.cache_key.empty())
        er = RunCachedCompile(ctx, c);
      else if (c.spec.cache)
        er = RunCachedStage(ctx, c);
      else
        er = RunStage(ctx);
    } catch (const std::exception& e) {
      er.outcome = Outcome::kInfraError;
      er.message = std::string("executor failed: ") + e.what();
    } catch (...) {
      er.outcome = Outcome::kInfraError;
      er.message = "executor failed";
    }
    auto why = static_cast<StopReason>(run->stop.load());
    std::optional<schema::AttemptResult> result;
    if (why == StopReason::kLeaseLost) {
      log->warn("stage={} attempt={} discarded: its lease was taken over", c.stage_id, c.attempt);
    } else {
      result = ToResult(c, er, why);
      std::scoped_lock lock(run->metrics_mu);
      if (run->metrics_dirty) result->metrics_json = run->metrics;
    }
    // The instance is free before the result is seen: the committer claims for it.
    pool.used -= c.instance_count;
    {
      std::scoped_lock lock(mu);
      running.erase(c.stage_id);
      if (result) results.push_back(std::move(*result));
      --tasks;
    }
    commit_cv.notify_one();
    idle_cv.notify_all();
    // A result's commit claims for the freed instance; without one, the claim loop does.
    if (!result) WakeClaim();
  }

  // Runs a stage outside the cache. A run: stage that declared its outputs gets their digest,
  // or fails when one is missing.
  ExecResult RunStage(const ExecContext& ctx) {
    if (ctx.spec.kind != StageKind::kRun) return Simulated().Run(ctx);
    ExecResult er = slurm_executor ? slurm_executor->Run(ctx) : process_executor.Run(ctx);
    if (er.outcome == Outcome::kSucceeded && ctx.spec.command.outputs) {
      try {
        er.output_digest = OutputsDigest(ctx.run_dir, *ctx.spec.command.outputs);
      } catch (const std::exception& e) {
        er.outcome = Outcome::kUserError;
        er.message = e.what();
      }
    }
    return er;
  }

  // What a cache hit, a build or a wait comes to. `build` runs the stage and stores what it
  // produced; `serve` hands a verified entry to this attempt.
  struct CacheWork {
    std::string key, inputs;
    std::string project;           // the entry's owner; "" for a compiled graph (everyone's)
    std::string what;              // "compiled graph", "outputs"
    bool poison_failures = false;  // remember a user error for the key (compiles)
    // (project, key) of the same inputs in each project this one trusts: served when the
    // project has no ready entry of its own.
    std::vector<std::pair<std::string, std::string>> trusted;
    std::function<std::pair<ExecResult, StoredArtifact>()> build;
    std::function<void(const schema::ArtifactRow&, ExecResult&)> serve;
  };

  // Single flight over one key: the first attempt to claim it builds and stores the artifact;
  // attempts that find it being built wait (no instance, no bill) and are served when it is
  // ready; a builder that died is taken over; an entry that fails verification is never
  // served but rebuilt; with poison_failures, a user error is remembered for the key and
  // returned at once, unless the run retries failed compilations.
  ExecResult RunSingleFlight(schema::Catalog& cat, const ExecContext& ctx,
                             const schema::ClaimedStage& c, const CacheWork& w) {
    if (!w.trusted.empty()) {
      auto own = cat.GetArtifact(w.key);
      if (!own || own->state != "ready")
        for (const auto& [project, key] : w.trusted) {
          auto a = cat.GetArtifact(key);
          // The row must be the trusted project's own: trust is in who built it.
          if (a && a->state == "ready" && a->project == project && Servable(*a))
            if (auto r = Serve(cat, key, *a, w, " (built by trusted project " + project + ")"))
              return *r;
        }
    }
    std::string corrupt;
    bool announced_wait = false;
    while (true) {
      if (ctx.stop_reason() != StopReason::kNone) {
        ExecResult r;
        r.outcome = Outcome::kCancelled;
        r.ran_instance = false;
        r.progress_to = c.progress;
        r.message = "stopped while waiting for the cache";
        return r;
      }
      if (cat.AcquireArtifact(w.key, c.stage_id, c.attempt, w.inputs, c.retry_failed_compilation,
                              corrupt, w.project)) {
        ExecResult er;
        StoredArtifact a;
        try {
          std::tie(er, a) = w.build();
        } catch (...) {
          cat.ReleaseArtifact(w.key, c.stage_id, c.attempt);
          throw;
        }
        if (er.outcome == Outcome::kSucceeded) {
          cat.FinishArtifact(w.key, c.stage_id, c.attempt, "ready", a.digest, a.bytes, a.path, "");
          er.output_digest = a.digest;
          er.message += std::string(er.message.empty() ? "" : "; ") + w.what + " cached as " +
                        a.digest.substr(0, 12);
        } else if (er.outcome == Outcome::kUserError && w.poison_failures) {
          cat.FinishArtifact(w.key, c.stage_id, c.attempt, "failed", "", 0, "", er.message);
        } else {
          cat.ReleaseArtifact(w.key, c.stage_id, c.attempt);
        }
        return er;
      }
      auto a = cat.GetArtifact(w.key);
      if (!a) continue;  // removed meanwhile: try to build it
      if (a->state == "ready") {
        if (Servable(*a))
          if (auto r = Serve(cat, w.key, *a, w, "")) return *r;
        log->warn("cache entry key={} digest={} is corrupt or incomplete: rebuilding it",
                  w.key.substr(0, 12), a->digest.substr(0, 12));
        corrupt = a->digest;
        continue;
      }
      if (a->state == "failed") {
        ExecResult r;
        r.outcome = Outcome::kUserError;
        r.ran_instance = false;
        r.message = "this graph failed to compile before (" + a->failure +
                    "); rerun with --retry-failed-compilation to try again";
        return r;
      }
      if (!announced_wait) {
        log->info("stage={} waits for key={} being built by stage={}", c.stage_id,
                  w.key.substr(0, 12), a->builder_stage);
        announced_wait = true;
      }
      PauseFor(0.05);
    }
  }

  // An entry is served only from inside the store (a row naming another path was not written
  // by a worker) and only when its contents still hash to its digest.
  bool Servable(const schema::ArtifactRow& a) {
    if (!IsStorePath(opt.home, a.path)) {
      log->warn("cache entry key={} names a path outside the store ({}): not served",
                a.key.substr(0, 12), a.path);
      return false;
    }
    return VerifyArtifact(a.path, a.digest);
  }

  // The hit, or nullopt when the entry could not be handed over (restore refused it).
  std::optional<ExecResult> Serve(schema::Catalog& cat, const std::string& key,
                                  const schema::ArtifactRow& a, const CacheWork& w,
                                  const std::string& note) {
    ExecResult r;
    r.outcome = Outcome::kCached;
    r.ran_instance = false;
    r.progress_to = 1;
    r.output_digest = a.digest;
    r.saved = a.producer_cost;
    r.message = w.what + " " + a.digest.substr(0, 12) + " from the cache" + note;
    if (w.serve) {
      try {
        w.serve(a, r);
      } catch (const std::exception& e) {
        log->warn("cache entry key={} not served: {}", key.substr(0, 12), e.what());
        return std::nullopt;
      }
    }
    cat.RecordArtifactHit(key);
    return r;
  }

  // A compile stage: its key is known from the file (the graph's shape, not the weights).
  ExecResult RunCachedCompile(const ExecContext& ctx, const schema::ClaimedStage& c) {
    CacheWork w;
    w.key = c.spec.cache_key;
    w.inputs = c.spec.cache_inputs;
    w.what = "compiled graph";
    // A failure is remembered for the key only when the graph itself fails (an operator, a
    // shape): the key does not hold the host, so a compile run out of memory on a small host
    // would otherwise fail that graph for everyone (another project could poison it on
    // purpose).
    w.poison_failures = true;
    if (const auto* host = sim::Catalog::Builtin().FindInstance(c.spec.instance)) {
      try {
        sim::CompileOutcome o = sim::PredictCompile(
            sim::Catalog::Builtin(), sim::WorkloadFromJson(c.spec.workload_json), *host);
        if (!o.ok && o.code == "HOST_OOM") w.poison_failures = false;
      } catch (const std::exception&) {
        w.poison_failures = false;  // a workload it cannot read says nothing of the graph
      }
    }
    w.build = [&] {
      ExecResult er = Simulated().Run(ctx);
      StoredArtifact a;
      if (er.outcome == Outcome::kSucceeded) {
        sim::Workload wl = sim::WorkloadFromJson(c.spec.workload_json);
        a = WriteArtifact(opt.home, w.key, w.inputs, wl.model.parameters);
      }
      return std::make_pair(er, a);
    };
    schema::Catalog cat(opt.database_url);
    return RunSingleFlight(cat, ctx, c, w);
  }

  // Any other stage with cache: true: keyed when it runs, over its kind, parameters and the
  // digests of what it consumes. A run: stage stores the outputs it declared and a hit
  // restores them into this run's directory; a simulated stage stores its result.
  ExecResult RunCachedStage(const ExecContext& ctx, const schema::ClaimedStage& c) {
    CacheWork w;
    schema::Catalog cat(opt.database_url);  // one session for the key and the single flight
    auto consumed = cat.StageInputDigests(c.stage_id);
    w.inputs = StageCacheInputs(c.spec, consumed, ctx.workdir, c.run_id, c.project);
    w.key = Sha256Hex(w.inputs);
    w.project = c.project;
    for (const auto& q : cat.TrustedProjects(c.project))
      w.trusted.emplace_back(
          q, Sha256Hex(StageCacheInputs(c.spec, consumed, ctx.workdir, c.run_id, q)));
    cat.RecordStageCacheInputs(c.stage_id, c.attempt, w.inputs);
    w.what = "outputs";
    std::vector<std::string> outputs = c.spec.command.outputs.value_or(std::vector<std::string>{});
    w.build = [&] {
      ExecResult er = RunStage(ctx);
      StoredArtifact a;
      if (er.outcome != Outcome::kSucceeded) return std::make_pair(er, a);
      if (c.spec.kind == StageKind::kRun) {
        try {
          a = StoreOutputs(opt.home, w.inputs, ctx.run_dir, outputs);
        } catch (const OutputRefused& e) {  // what the job wrote, not the worker's fault
          er.outcome = Outcome::kUserError;
          er.message = std::string("stage ") + c.spec.name + ": " + e.what();
        }
      } else {
        // A simulated stage's product is its result; stored so later runs are served it.
        std::string dir = opt.home + "/tmp/result-" + std::to_string(c.stage_id) + "-" +
                          std::to_string(c.attempt);
        std::filesystem::create_directories(dir);
        std::ofstream(dir + "/result.json")
            << nlohmann::json{{"key", w.key}, {"message", er.message}}.dump() << "\n";
        a = StoreOutputs(opt.home, w.inputs, dir, {"result.json"});
        std::filesystem::remove_all(dir);
      }
      return std::make_pair(er, a);
    };
    if (c.spec.kind == StageKind::kRun)
      w.serve = [&](const schema::ArtifactRow& a, ExecResult& r) {
        RestoreOutputs(a.path, ctx.run_dir);
        r.message += " (restored into the run's directory)";
      };
    return RunSingleFlight(cat, ctx, c, w);
  }

  // What the claim knew, for EndAttempt.
  schema::AttemptFacts FactsOf(const schema::ClaimedStage& c, bool run_cancelled) const {
    return {c.stage_id,       c.attempt,      id,     &c.spec,      c.market,      c.errors,
            c.preemptions,    c.speed,        c.price_per_hour,     c.instance_count,
            run_cancelled};
  }

  // The attempt's end as its executor returned it, and why it was stopped (if it was).
  schema::AttemptResult ToResult(const schema::ClaimedStage& c, const ExecResult& er,
                                 StopReason why) {
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
    double jitter;
    {
      std::scoped_lock lock(mu);
      jitter = std::uniform_real_distribution<double>(0, 1)(rng);
    }
    bool cancelled = why == StopReason::kCancelled || why == StopReason::kBudgetExceeded;
    schema::AttemptResult r = schema::EndAttempt(FactsOf(c, cancelled), e, jitter);
    r.output_digest = er.output_digest;
    if (r.outcome == Outcome::kCached) {
      // Served from the cache: no instance, and the work it spared is saved. A compile is
      // priced on this stage's own instance; other stages at what their builder paid.
      r.saved = er.saved;
      const auto* t = sim::Catalog::Builtin().FindInstance(c.spec.instance);
      if (c.spec.kind == StageKind::kCompile && t)
        r.saved =
            Charge(c.price_per_hour, c.instance_count,
                   sim::EstimateCompile(sim::WorkloadFromJson(c.spec.workload_json), *t).seconds);
    }
    r.baseline = BaselineCost(c, er, r.cost, r.wasted);
    return r;
  }
};

Worker::Worker(WorkerOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  impl_->name = std::string(host) + ":" + std::to_string(getpid());
  // Stages mostly wait, and their waits suspend their tasks (workers/pause.h): an arena as wide
  // as the cores runs a pool of any capacity (the capacity bounds what is claimed, not
  // threads). Two at least: a stage blocked briefly in a call (the catalog, sbatch, a copy
  // into the cache) leaves the other slot free. None reserved for the calling thread.
  int cores = static_cast<int>(std::max(2u, std::thread::hardware_concurrency()));
  int total = 0;
  for (const auto& p : impl_->opt.pools) {
    auto pool = std::make_unique<Pool>();
    pool->config = p;
    int width = std::min(std::max(1, p.capacity), cores);
    pool->arena = std::make_unique<tbb::task_arena>(width, 0);
    total += width;
    impl_->pools.push_back(std::move(pool));
  }
  // The most restrictive global_control in the process wins, so every Worker asks for at
  // least the same ceiling; the arenas' own limits bound the threads really used.
  impl_->parallelism = std::make_unique<tbb::global_control>(
      tbb::global_control::max_allowed_parallelism, static_cast<size_t>(std::max(total + 2, 64)));
}

Worker::~Worker() { Stop(); }

const std::string& Worker::id() const { return impl_->id; }

int Worker::running() const {
  std::scoped_lock lock(impl_->mu);
  return static_cast<int>(impl_->running.size());
}

void Worker::Start() {
  Impl& w = *impl_;
  SandboxDecision sandbox = DecideSandbox(w.opt.sandbox, CanSwitchUser());
  if (!sandbox.error.empty()) throw UserError(sandbox.error);
  if (!sandbox.warning.empty()) w.log->warn("{}", sandbox.warning);
  if (sandbox.enabled && (w.opt.job_uid_base <= 0 || w.opt.job_uid_base >= (1LL << 31)))
    throw UserError("job uid base " + std::to_string(w.opt.job_uid_base) +
                    " is not a valid unprivileged uid");
  if (std::string e = PrepareHome(w.opt.home, sandbox.enabled); !e.empty()) throw UserError(e);
  w.sandboxed = sandbox.enabled;
  if (sandbox.enabled) {
    w.namespaces.enabled = true;
    w.namespaces.bwrap = FindBwrap();
    if (w.namespaces.bwrap.empty())
      throw UserError(
          "the job sandbox runs every command in namespaces of its own with bubblewrap, which "
          "is not installed: `apt-get install bubblewrap` (ops/setup.sh does), or pass "
          "--no-sandbox where every job is trusted");
    w.namespaces.allow_network = w.opt.allow_network;
    w.namespaces.hidden = {ConfigDir(), w.opt.secrets_dir};
  }
  // Found (and on cgroup v2, the worker moved into its leaf) before any job starts.
  w.log->info("{}", CgroupHost::ForThisProcess().Describe());
  if (w.opt.slurm) w.slurm_executor = std::make_unique<SlurmExecutor>(*w.opt.slurm);
  nlohmann::json pools = nlohmann::json::object();
  for (const auto& p : w.opt.pools) pools[p.name] = p.capacity;
  std::unique_ptr<schema::Catalog> cat;
  w.WithCatalog(cat, "register", [&](schema::Catalog& c) {
    c.RegisterWorker(w.id, w.name.substr(0, w.name.find(':')), getpid(), pools.dump(),
                     w.opt.only_run, std::filesystem::absolute(w.opt.home).string(),
                     w.opt.lease_s);
  });
  w.log->info("worker id={} name={} pools={}", w.id, w.name, pools.dump());
  w.lock_guard = std::make_unique<schema::MemberLockGuard>(
      w.opt.database_url, w.opt.member_lock_limit_s, w.opt.member_lock_every_s);
  w.lock_guard->Start();
  w.claiming = true;
  w.stopping = false;
  w.commit_thread = std::thread([&w] { w.CommitLoop(); });
  w.heartbeat_thread = std::thread([&w] { w.HeartbeatLoop(); });
  w.listen_thread = std::thread([&w] { w.ListenLoop(); });
  w.claim_thread = std::thread([&w] { w.ClaimLoop(); });
}

void Worker::Stop() {
  Impl& w = *impl_;
  if (!w.claim_thread.joinable()) return;
  w.claiming = false;
  w.claim_cv.notify_all();
  w.claim_thread.join();
  w.listen_thread.join();
  {
    // Let running stages finish within the grace period, then hand them back.
    std::unique_lock lock(w.mu);
    if (!w.idle_cv.wait_for(lock, std::chrono::duration<double>(w.opt.shutdown_grace_s),
                            [&] { return w.tasks == 0; })) {
      w.log->info("grace period over: stopping {} running stages", w.running.size());
      for (auto& [sid, r] : w.running) {
        int expected = static_cast<int>(StopReason::kNone);
        r->stop.compare_exchange_strong(expected, static_cast<int>(StopReason::kShutdown));
      }
      w.idle_cv.wait(lock, [&] { return w.tasks == 0; });
    }
  }
  w.stopping = true;
  w.commit_cv.notify_all();
  w.heartbeat_cv.notify_all();
  w.commit_thread.join();
  w.heartbeat_thread.join();
  w.lock_guard.reset();
  for (auto& p : w.pools) p->arena->terminate();
  std::unique_ptr<schema::Catalog> cat;
  try {
    cat = std::make_unique<schema::Catalog>(w.opt.database_url);
    cat->StopWorker(w.id);
  } catch (const std::exception& e) {
    w.log->warn("could not record the stop: {}", e.what());
  }
  w.log->info("worker id={} stopped", w.id);
}

}  // namespace trnflow::workers
