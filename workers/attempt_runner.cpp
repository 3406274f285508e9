// The attempt runner: runs one claimed stage as a task on its pool's arena (Launch), on the
// executors WorkerOptions::executors hands in: `simulated` for train, compile, deploy and
// benchmark stages, `commands` for `run:` stages; a compile with a cache key or a `cache: true`
// stage goes through the cache runner (cache_runner.h). Execute builds the attempt's context
// (paths, seed, the project's uid, sandbox namespaces, secrets, spend cap, progress and
// metrics callbacks the heartbeat reads) and is the task boundary: nothing escapes, every end
// (a spec that cannot be read, a missing secret, a spent budget, an executor's exception)
// becomes an outcome, mapped to its ledger row by attempt_result.h and queued for the
// committer, unless the lease was lost (the result is discarded). The pool's instance is
// freed before the result is committed.
#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <stdexcept>

#include "common/file_names.h"
#include "workers/artifact_store.h"
#include "workers/attempt_result.h"
#include "workers/pause.h"
#include "workers/worker_impl.h"

namespace trnflow::workers {
namespace {

// FNV-1a: a stable hash, so the same run seed gives the same draws on every build.
uint64_t Fnv1a(const std::string& s, uint64_t h = 1469598103934665603ULL) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
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

}  // namespace

double Worker::Impl::Jitter() {
  std::scoped_lock lock(mu);
  return std::uniform_real_distribution<double>(0, 1)(rng);
}

void Worker::Impl::Launch(Pool& pool, schema::ClaimedStage claim) {
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
void Worker::Impl::Execute(Pool& pool, const std::shared_ptr<Running>& run) {
  const schema::ClaimedStage& c = run->claim;
  ExecContext ctx;
  ctx.spec = c.spec;
  ctx.project = c.project;
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
  ctx.run_dir = RunDir(opt.home, c.run_id);
  ctx.log_path = AttemptLogPath(opt.home, c.run_id, c.spec.name, c.attempt);
  ctx.checkpoint_dir = CheckpointDir(opt.home, c.run_id, c.spec.name);
  int64_t uid = c.job_uid > 0 ? c.job_uid : opt.job_uid_base;
  ctx.identity.switch_user = sandboxed;
  ctx.identity.uid = static_cast<uid_t>(uid);
  ctx.identity.gid = static_cast<gid_t>(uid);
  ctx.limits = opt.job_limits;
  ctx.namespaces = namespaces;
  ctx.stop = &run->stop;
  ctx.claimed_at = run->claimed_at;
  ctx.spend_cap_s = c.spend_cap_s;
  if (c.budgeted && std::isfinite(c.spend_cap_s)) {
    // Topped up in slices as it runs; a command with a timeout never past its timeout and
    // grace (what the attempts beside it were reserved against).
    double bound = c.spec.kind == StageKind::kRun && c.spec.timeout_s > 0
                       ? c.spec.timeout_s + kTermGraceSimSeconds
                       : std::numeric_limits<double>::infinity();
    auto cap_s = std::make_shared<double>(c.spend_cap_s);
    ctx.top_up_cap = [this, &c, cap_s, bound](double) {
      *cap_s = TopUp(c, *cap_s, bound);
      return *cap_s;
    };
  }
  ctx.report_metrics = [run](const std::string& json) {
    std::scoped_lock lock(run->metrics_mu);
    run->metrics = json;
    run->metrics_dirty = true;
  };
  ctx.record_executor_job = [this, &c](const std::string& job) {
    try {
      auto cat = schema::OpenWorkerCatalog(opt.database_url);
      if (cat->RecordExecutorJob(c.stage_id, c.attempt, id, job)) return true;
      log->warn("stage={} attempt={}: job {} not recorded: the lease is gone", c.stage_id,
                c.attempt, job);
    } catch (const std::exception& e) {
      // The job is found by its name (SlurmJobName) if its id never reaches the catalog.
      log->warn("stage={} attempt={}: job {} not recorded: {}", c.stage_id, c.attempt, job,
                e.what());
    }
    return false;
  };
  ctx.earlier_attempts = [this, &c] {
    auto cat = schema::OpenWorkerCatalog(opt.database_url);
    std::vector<EarlierAttempt> out;
    for (const auto& a : cat->EarlierAttempts(c.stage_id, c.attempt))
      out.push_back({a.attempt, a.outcome, a.executor_job, a.sim_seconds});
    return out;
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
    } else if (c.spec.kind == StageKind::kCompile && !c.spec.cache_key.empty())
      er = cache->RunCachedCompile(ctx, c, *opt.executors.simulated);
    else if (c.spec.cache)
      er = cache->RunCachedStage(ctx, c, [this](const ExecContext& x) { return RunStage(x); });
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
    result = AttemptResultOf(c, er, why, id, Jitter());
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
ExecResult Worker::Impl::RunStage(const ExecContext& ctx) {
  if (ctx.spec.kind != StageKind::kRun) return opt.executors.simulated->Run(ctx);
  ExecResult er = opt.executors.commands->Run(ctx);
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

}  // namespace trnflow::workers
