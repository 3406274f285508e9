#pragma once
// Worker's inside (internal to workers/): the state its parts share and the parts themselves,
// one file each. worker.cpp starts and stops the threads; claimer.cpp claims (the claim loop,
// the LISTEN loop that wakes it, budget caps, hand-backs); attempt_runner.cpp launches a claimed
// stage on its pool's arena and runs it on the executor WorkerOptions::executors hands in (or
// through cache_runner.h); heartbeat.cpp renews leases and stops what must stop; committer.cpp
// writes results in batches and claims again in the same transaction; attempt_result.h maps an
// executor's result to its ledger row. `mu` guards `running`, `results`, the wake flags and
// `rng`; a pool's `used` counts its instances held by running stages and claims in flight.
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "schema/member_lock_guard.h"
#include "schema/worker_catalog.h"
#include "workers/cache_runner.h"
#include "workers/executor.h"
#include "workers/worker.h"

namespace trnflow::workers {

using Steady = std::chrono::steady_clock;

// A budgeted command without a timeout reserves its `estimate:` and this much more.
inline constexpr double kEstimateMargin = 1.25;
// A running budgeted attempt tops its reservation up by a minute of simulated time, or by what
// this much wall time is at the run's speed when that is more (a fast run asks less often).
inline constexpr double kTopUpSliceSimSeconds = 60;
inline constexpr double kTopUpSliceWallSeconds = 3;

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

inline int Instances(const std::vector<schema::ClaimedStage>& claimed) {
  int n = 0;
  for (const auto& c : claimed) n += c.instance_count;
  return n;
}

struct Worker::Impl {
  WorkerOptions opt;
  std::string id;
  std::string name;
  std::shared_ptr<spdlog::logger> log = Logger("workers");
  std::vector<std::unique_ptr<Pool>> pools;
  std::unique_ptr<tbb::global_control> parallelism;
  bool sandboxed = false;  // decided in Start(): jobs switch to their project's uid
  JobNamespaces namespaces;  // decided in Start(): with the sandbox, every command in bwrap
  std::unique_ptr<schema::MemberLockGuard> lock_guard;  // from Start() to the end of Stop()
  std::unique_ptr<CacheRunner> cache;  // made in the constructor, from opt

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
  // Budget top-ups (TopUp), from the executors' threads one at a time on their own connection.
  std::mutex top_up_mu;
  std::unique_ptr<schema::WorkerCatalog> top_up_cat;

  // Runs `body` with this thread's catalog, re-opening the connection with backoff until it
  // works or the worker stops. Returns false if it gave up because the worker is stopping.
  template <typename F>
  bool WithCatalog(std::unique_ptr<schema::WorkerCatalog>& c, const char* what, F&& body,
                   bool give_up_on_stop = true) {
    double backoff = 0.1;
    while (true) {
      try {
        if (!c) c = schema::OpenWorkerCatalog(opt.database_url);
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

  // claimer.cpp
  void ClaimLoop();
  void ListenLoop();
  void RunClaimed(std::unique_ptr<schema::WorkerCatalog>& cat, Pool& pool,
                  std::vector<schema::ClaimedStage>& claimed);
  static std::optional<Money> ExpectedCost(const schema::ClaimedStage& c);
  void ReserveBudgets(std::unique_ptr<schema::WorkerCatalog>& cat,
                      std::vector<schema::ClaimedStage>& claimed);
  static double CapSeconds(const schema::ClaimedStage& c, Money cap);
  double TopUp(const schema::ClaimedStage& c, double cap_s, double bound_s);
  void HandBack(const schema::ClaimedStage& c, const std::string& why);

  // heartbeat.cpp
  void HeartbeatLoop();

  // committer.cpp
  void CommitLoop();

  // attempt_runner.cpp
  void Launch(Pool& pool, schema::ClaimedStage claim);
  void Execute(Pool& pool, const std::shared_ptr<Running>& run);
  ExecResult RunStage(const ExecContext& ctx);
  double Jitter();
};

}  // namespace trnflow::workers
