#pragma once
// An executor runs one attempt of one stage and reports how it ended. It knows nothing of the
// DAG, the catalog or threads beyond its own: the worker hands it a context and turns the
// result into a ledger row. Run() never throws; failures are outcomes.
#include <atomic>
#include <chrono>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/money.h"
#include "common/stage_spec.h"
#include "workers/sandbox.h"
#include "workers/slurm.h"

namespace trnflow::workers {

enum class StopReason : int {
  kNone = 0,
  kLeaseLost = 1,
  kShutdown = 2,
  kCancelled = 3,
  kBudgetExceeded = 4
};

// How far a running attempt is, as the worker's heartbeat carries it to the catalog: live
// progress for `show` and `watch`, and a checkpoint that outlives the worker (the next attempt
// resumes from it even when this one is lost).
struct LiveProgress {
  double progress = 0;      // how far the stage is, 0..1
  double checkpointed = 0;  // how far its last checkpoint got, 0..1
  double sim_seconds = 0;   // simulated seconds this attempt has run
  double eta_s = -1;        // simulated seconds it expects still to run; < 0: unknown
};

// An earlier attempt of the stage as the ledger has it (ExecContext::earlier_attempts).
struct EarlierAttempt {
  int attempt = 0;
  Outcome outcome = Outcome::kLost;
  std::string executor_job;  // "": none recorded
  double sim_seconds = 0;    // what it was billed for
};

struct ExecContext {
  StageSpec spec;
  std::string project;  // the run's project (the Slurm account it goes in under)
  int64_t run_id = 0;
  int64_t stage_id = 0;
  int attempt = 1;
  Market market = Market::kOnDemand;
  int instance_count = 1;
  double progress = 0;  // where the last checkpoint left the stage, 0..1
  double speed = 1;     // simulated seconds per wall second
  uint64_t seed = 0;    // for this attempt's random draws
  double spot_rate_multiplier = 1;
  std::string workdir;         // where commands start
  std::string run_dir;         // ${{ run.dir }}
  std::string log_path;        // captured output of this attempt
  std::string checkpoint_dir;  // TRNFLOW_CHECKPOINT_DIR
  // Name -> value, resolved by the worker before the run: put in the job's environment and
  // masked (***) in its captured log.
  std::map<std::string, std::string> secrets;
  JobIdentity identity;  // whom a command runs as (the project's uid when sandboxed)
  JobLimits limits;      // rlimits and the captured-output cap of a command
  JobNamespaces namespaces;  // the namespaces a command runs in (sandbox on)
  const std::atomic<int>* stop = nullptr;  // a StopReason; checked often
  // The attempt's spend cap in simulated seconds (its budget reservation over its price): at
  // this point the executor ends it with outcome budget_exceeded. Infinite: no budget.
  double spend_cap_s = std::numeric_limits<double>::infinity();
  // A budgeted attempt's cap can grow while it runs (migration 0033): called with the
  // attempt's simulated seconds so far, it tops the reservation up by a slice, atomically
  // against what the budget has left, and returns the cap now in force in simulated seconds
  // (never less than before). Unset: spend_cap_s is final. Executors go through SpendCap.
  std::function<double(double sim_now)> top_up_cap;
  // When the stage was claimed: its simulated time (and bill) runs from here, as the ledger's
  // started_at does, including any wait for a free slot in the pool's arena.
  std::chrono::steady_clock::time_point claimed_at = std::chrono::steady_clock::now();
  // neuron-monitor-like metrics as JSON, latest wins; may be called from the executor's thread.
  std::function<void(const std::string&)> report_metrics;
  // The attempt's latest LiveProgress; may be called often, from the executor's thread.
  std::function<void(const LiveProgress&)> report_progress;
  // An executor that hands the attempt to another system (a Slurm job id) records its id here
  // as soon as it has one, fenced on the lease, so a worker taking the stage over finds it.
  // False: not recorded (the lease is gone, or the catalog did not answer).
  std::function<bool(const std::string&)> record_executor_job;
  // The stage's attempts before this one, from the ledger (throws when the catalog does not
  // answer): which earlier job's result an attempt has already taken. Unset: unknown.
  std::function<std::vector<EarlierAttempt>()> earlier_attempts;
  StopReason stop_reason() const { return static_cast<StopReason>(stop ? stop->load() : 0); }
};

// The spend cap of one running attempt: asks for a top-up when the attempt is within a second
// of wall time (on the run's clock) of its cap, and once more at the cap itself; an attempt
// whose top-up finds nothing left is stopped at its cap, as an attempt without top-ups is.
class SpendCap {
 public:
  explicit SpendCap(const ExecContext& ctx) : ctx_(ctx), cap_(ctx.spend_cap_s) {}
  // The cap in force at simulated time `sim_now`, asking for more when it is near.
  double At(double sim_now) {
    if (!ctx_.top_up_cap || !(cap_ < std::numeric_limits<double>::infinity())) return cap_;
    bool at = sim_now >= cap_;
    if (sim_now < cap_ - std::max(1.0, ctx_.speed * kAheadWallSeconds)) return cap_;
    if (refused_at_ == cap_ && (!at || refused_at_cap_)) return cap_;
    double got = ctx_.top_up_cap(sim_now);
    if (got > cap_) {
      cap_ = got;
      refused_at_ = -1;
      refused_at_cap_ = false;
    } else {
      refused_at_ = cap_;
      refused_at_cap_ = at;
    }
    return cap_;
  }
  double cap() const { return cap_; }

 private:
  static constexpr double kAheadWallSeconds = 1;
  const ExecContext& ctx_;
  double cap_;
  double refused_at_ = -1;  // the cap at which the last top-up found nothing more
  bool refused_at_cap_ = false;
};

// How long a command has, in simulated seconds, between SIGTERM (timeout, cancel, shutdown) and
// SIGKILL: a budgeted command with a timeout reserves its timeout plus this.
inline constexpr double kTermGraceSimSeconds = 120;

struct ExecResult {
  Outcome outcome = Outcome::kSucceeded;
  double sim_seconds = 0;    // what the attempt ran, in simulated seconds (billing)
  double progress_to = 0;    // durable progress at the end (checkpointed), 0..1
  double lost_fraction = 0;  // share of this attempt's time whose work was lost
  std::string message;
  bool ran_instance = true;   // false: nothing was launched (capacity, cache), nothing billed
  std::string output_digest;  // succeeded: the digest of what the stage produced, if known
  Money saved;                // served from the cache: what building it cost
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual ExecResult Run(const ExecContext& ctx) = 0;
};

class SimExecutor final : public Executor {
 public:
  ExecResult Run(const ExecContext& ctx) override;
};

class ProcessExecutor final : public Executor {
 public:
  ExecResult Run(const ExecContext& ctx) override;
};

// Where and how the Slurm executor submits (trnflow worker --executor slurm).
struct SlurmOptions {
  std::string partition;       // "": the cluster's default partition
  std::string account;         // "": the user's default account (see `accounts`)
  std::string shared_dir;      // attempts' wrappers and files; every node must see it
  std::string trnflow_binary;  // what a job runs for a simulated stage (exec-stage)
  bool spot_partition = false;  // a node failure there is the market reclaiming it
  double poll_s = 1;            // one squeue per this, for all of the worker's jobs
  int submit_tries = 6;         // sbatch when the controller does not answer, with backoff
  // The operator's partition map (--slurm-config): a stage goes to the partition mapped to its
  // instance type and market, with --gres for its devices; unmapped ones to `partition`.
  std::vector<slurm::Partition> partitions;
  // Matrix expansions submitted within `arrays.window_s` of each other with the same options
  // go out as one job array (--slurm-config's max_array_size, max_submit_jobs, array_window).
  slurm::ArrayLimits arrays;
  // Each project's Slurm account and QOS (--slurm-config's `accounts:`); projects it does not
  // name go in under its fallback (`default_account:`, else `account`).
  slurm::AccountMap accounts;
};

// Runs every kind of stage as one Slurm batch job per attempt (docs/executors.md).
class SlurmExecutor final : public Executor {
 public:
  explicit SlurmExecutor(SlurmOptions options);
  ~SlurmExecutor() override;
  ExecResult Run(const ExecContext& ctx) override;

 private:
  struct Monitor;
  struct Arrays;
  struct Accounting;
  struct Taken;  // an earlier attempt's job this attempt took over
  ExecResult RunJob(const ExecContext& ctx, Taken* took);
  SlurmOptions opt_;
  std::unique_ptr<Monitor> monitor_;
  std::unique_ptr<Arrays> arrays_;
  std::unique_ptr<Accounting> accounting_;
};

// Runs nothing and succeeds at once (nothing billed but the claim's own instant): the no-op
// handler of job-queue benchmarks, and of tests that time the engine rather than its stages.
// Everything around it (claim, lease, ledger row, release of dependents) is as always.
class NoopExecutor final : public Executor {
 public:
  ExecResult Run(const ExecContext&) override { return ExecResult{}; }
};

// The executors a worker runs its stages with (WorkerOptions::executors), handed in as
// LevelDB's Options::env is: the worker never picks one itself. `simulated` runs train,
// compile, deploy and benchmark stages, `commands` the `run:` stages; one executor may hold
// both slots (Slurm runs every stage; a benchmark's no-op). cli/ wires the real ones, tests
// and benchmarks hand in their own.
struct Executors {
  std::shared_ptr<Executor> simulated;
  std::shared_ptr<Executor> commands;

  // This host runs every stage: SimExecutor and ProcessExecutor.
  static Executors Local() {
    return {std::make_shared<SimExecutor>(), std::make_shared<ProcessExecutor>()};
  }
  // One executor for every kind of stage.
  static Executors AllOn(std::shared_ptr<Executor> e) { return {e, e}; }
};

// trnflow-r<run>-s<stage>-a<attempt>: one squeue --name finds every job of a stage.
std::string SlurmJobName(int64_t run_id, int64_t stage_id, int attempt);

}  // namespace trnflow::workers
