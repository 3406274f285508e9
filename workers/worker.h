#pragma once
// Worker claims stages from the catalog and runs them in one TBB arena per pool. Threads:
// a claim loop, a LISTEN loop that wakes it, a heartbeat that renews every lease of this
// incarnation in one statement (stopping any stage whose lease was taken over), and a
// committer that writes outcomes in batches. Each thread has its own catalog connection and
// re-opens it with backoff when PostgreSQL goes away.
//
// Start() and Stop() are called from one owning thread. Stop() stops claiming, lets running
// stages finish for the grace period, then stops them and hands them back (ready again,
// attempt closed as cancelled, not counted against any budget).
//
// Jobs run in the sandbox of workers/sandbox.h unless the operator turned it off: Start()
// throws UserError when the sandbox is on and this process cannot switch users, or when
// TRNFLOW_HOME cannot be prepared or reached by a job's uid. The constructor throws
// std::invalid_argument when an executor is missing.
//
// The parts, each a file of workers/ (README.md): claimer.cpp, committer.cpp, heartbeat.cpp,
// attempt_runner.cpp, cache_runner.{h,cpp}, attempt_result.{h,cpp}; worker_impl.h holds
// their shared state.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "workers/executor.h"
#include "workers/sandbox.h"

namespace trnflow::workers {

struct PoolConfig {
  std::string name;  // trn1 | trn2 | inf1 | inf2 | gpu | cpu
  int capacity = 1;  // instances; a stage with count N takes N
};

struct WorkerOptions {
  std::string database_url;
  std::string home;  // TRNFLOW_HOME: logs, run dirs, checkpoints
  std::vector<PoolConfig> pools;
  double lease_s = 15;
  double heartbeat_s = 3;
  double poll_s = 1.0;  // claim even without a notification this often
  double shutdown_grace_s = 10;
  // The lock guard every daemon runs (schema/member_lock_guard.h): a member's session holding a
  // lock one of the daemons' sessions has waited on longer than this is ended. 0: off.
  double member_lock_limit_s = 5;
  double member_lock_every_s = 2;
  int commit_batch = 512;
  int64_t only_run = 0;  // claim only this run's stages (trnflow run); 0: any run
  // Claim only these projects' stages (`trnflow worker --project`: capacity reserved for
  // them); empty: every project's.
  std::vector<std::string> projects;
  // Run commands as their project's uid, in private directories (docs/security.md).
  // false: --no-sandbox / TRNFLOW_SANDBOX=off, jobs run as this process.
  bool sandbox = true;
  int64_t job_uid_base = 200000;  // uid and gid of a project without a job uid of its own
  JobLimits job_limits;           // rlimits and output cap of every command
  // Stages that say `network: host` share this host's network (and its loopback: the
  // catalog's port); otherwise they fail. Off: every job has loopback only.
  bool allow_network = false;
  // Where a stage's `secrets:` come from: <secrets_dir>/<project>.env (KEY=VALUE lines, a file
  // only this worker's user may read), else this process's TRNFLOW_SECRET_<NAME> (site-wide).
  std::string secrets_dir = "/etc/trnflow/secrets";
  // What runs the stages (workers/executor.h), required: Executors::Local() on this host,
  // Executors::AllOn(a SlurmExecutor) for `--executor slurm` (the worker still claims, leases,
  // heartbeats and commits), a NoopExecutor for benchmarks. Shared by copies of the options.
  Executors executors;
};

class Worker {
 public:
  explicit Worker(WorkerOptions options);
  ~Worker();  // Stop()
  void Start();
  void Stop();
  // This process's incarnation id (a fresh UUID per Worker).
  const std::string& id() const;
  // Stages running right now.
  int running() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace trnflow::workers
