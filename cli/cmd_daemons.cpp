// trnflow db migrate / worker / scheduler.
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "cli/commands.h"
#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "scheduler/scheduler.h"
#include "sim/catalog.h"
#include "workers/worker.h"

namespace trnflow::cli {
namespace {
void WaitForSignal() {
  InstallSignalHandlers();
  while (!g_interrupted) std::this_thread::sleep_for(std::chrono::milliseconds(50));
}
}  // namespace

int CmdDbMigrate() {
  schema::Catalog catalog(AdminDatabaseUrl());
  auto report = catalog.Migrate(sim::Catalog::Builtin());
  std::cout << "catalog " << RedactUrl(catalog.url()) << ": schema version " << report.from_version
            << " -> " << report.to_version;
  if (report.applied.empty()) std::cout << " (up to date)";
  for (const auto& m : report.applied) std::cout << "\n  applied " << m;
  std::cout << "\n";
  return kExitOk;
}

void ApplySandboxArgs(const SandboxArgs& args, workers::WorkerOptions& o) {
  o.sandbox = !args.no_sandbox && workers::SandboxRequestedByEnvironment();
  if (const char* dir = std::getenv("TRNFLOW_SECRETS_DIR"); dir && *dir) o.secrets_dir = dir;
  if (const char* env = std::getenv("TRNFLOW_JOB_LIMITS"))
    if (std::string e = workers::ParseJobLimits(env, o.job_limits); !e.empty())
      throw UserError("TRNFLOW_JOB_LIMITS: " + e);
  if (std::string e = workers::ParseJobLimits(args.job_limits, o.job_limits); !e.empty())
    throw UserError("--job-limits: " + e);
}

int CmdWorker(const std::vector<std::string>& pool_args, double lease_s,
              const SandboxArgs& sandbox) {
  workers::WorkerOptions o;
  ApplySandboxArgs(sandbox, o);
  o.database_url = DatabaseUrl();
  o.home = HomeDir();
  o.lease_s = lease_s;
  o.heartbeat_s = std::max(0.2, lease_s / 5);
  for (const auto& p : pool_args) {
    auto eq = p.find('=');
    int n = 0;
    if (eq != std::string::npos) try {
        n = std::stoi(p.substr(eq + 1));
      } catch (const std::exception&) {
      }
    if (eq == std::string::npos || eq == 0 || n <= 0 || n > 100000)
      throw UserError("--pool " + p +
                      ": expected NAME=N with 1 to 100000 instances, e.g. --pool trn1=4");
    CheckPoolName(p.substr(0, eq), "--pool " + p);
    o.pools.push_back({p.substr(0, eq), n});
  }
  if (o.pools.empty()) throw UserError("give at least one --pool NAME=N, e.g. --pool cpu=4");
  // Fail fast: exit 3 when the catalog is unusable, 4 when this login is not the daemons'.
  OpenCatalog()->RequireStageRunner("`trnflow worker`");
  workers::Worker worker(o);
  worker.Start();
  WaitForSignal();
  Logger("workers")->info("signal received: stopping (grace {:.0f}s)", o.shutdown_grace_s);
  worker.Stop();
  return kExitOk;
}

int CmdScheduler() {
  OpenCatalog()->RequireStageRunner("`trnflow scheduler`");
  scheduler::SchedulerOptions o;
  o.database_url = DatabaseUrl();
  scheduler::Scheduler s(o);
  s.Start();
  WaitForSignal();
  s.Stop();
  return kExitOk;
}

}  // namespace trnflow::cli
