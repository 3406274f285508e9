// The cache runner: see cache_runner.h.
#include "workers/cache_runner.h"

#include <filesystem>
#include <fstream>

#include "common/sha256.h"
#include "nlohmann/json.hpp"
#include "sim/catalog.h"
#include "sim/feasibility.h"
#include "sim/perf_model.h"
#include "workers/pause.h"
#include "workers/stage_cache.h"

namespace trnflow::workers {

CacheRunner::CacheRunner(std::string home, std::string database_url,
                         std::shared_ptr<spdlog::logger> log)
    : home_(std::move(home)), database_url_(std::move(database_url)), log(std::move(log)) {}

// What a cache hit, a build or a wait comes to. `build` runs the stage and stores what it
// produced; `serve` hands a verified entry to this attempt.
struct CacheRunner::CacheWork {
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
ExecResult CacheRunner::RunSingleFlight(schema::WorkerCatalog& cat, const ExecContext& ctx,
                                        const schema::ClaimedStage& c, const CacheWork& w) {
  if (!w.trusted.empty()) {
    auto own = cat.GetArtifact(w.key);
    if (!own || own->state != schema::ArtifactState::kReady)
      for (const auto& [project, key] : w.trusted) {
        auto a = cat.GetArtifact(key);
        // The row must be the trusted project's own: trust is in who built it.
        if (a && a->state == schema::ArtifactState::kReady && a->project == project && Servable(*a))
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
        cat.FinishArtifact(w.key, c.stage_id, c.attempt, schema::ArtifactState::kReady, a.digest,
                           a.bytes, a.path, "");
        er.output_digest = a.digest;
        er.message += std::string(er.message.empty() ? "" : "; ") + w.what + " cached as " +
                      a.digest.substr(0, 12);
      } else if (er.outcome == Outcome::kUserError && w.poison_failures) {
        cat.FinishArtifact(w.key, c.stage_id, c.attempt, schema::ArtifactState::kFailed, "", 0, "",
                           er.message);
      } else {
        cat.ReleaseArtifact(w.key, c.stage_id, c.attempt);
      }
      return er;
    }
    auto a = cat.GetArtifact(w.key);
    if (!a) continue;  // removed meanwhile: try to build it
    if (a->state == schema::ArtifactState::kReady) {
      if (Servable(*a))
        if (auto r = Serve(cat, w.key, *a, w, "")) return *r;
      log->warn("cache entry key={} digest={} is corrupt or incomplete: rebuilding it",
                w.key.substr(0, 12), a->digest.substr(0, 12));
      corrupt = a->digest;
      continue;
    }
    if (a->state == schema::ArtifactState::kFailed) {
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
bool CacheRunner::Servable(const schema::ArtifactRow& a) {
  if (!IsStorePath(home_, a.path)) {
    log->warn("cache entry key={} names a path outside the store ({}): not served",
              a.key.substr(0, 12), a.path);
    return false;
  }
  return VerifyArtifact(a.path, a.digest);
}

// The hit, or nullopt when the entry could not be handed over (restore refused it).
std::optional<ExecResult> CacheRunner::Serve(schema::WorkerCatalog& cat, const std::string& key,
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
ExecResult CacheRunner::RunCachedCompile(const ExecContext& ctx, const schema::ClaimedStage& c,
                                         Executor& simulated) {
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
    ExecResult er = simulated.Run(ctx);
    StoredArtifact a;
    if (er.outcome == Outcome::kSucceeded) {
      sim::Workload wl = sim::WorkloadFromJson(c.spec.workload_json);
      a = WriteArtifact(home_, w.key, w.inputs, wl.model.parameters);
    }
    return std::make_pair(er, a);
  };
  auto cat = schema::OpenWorkerCatalog(database_url_);
  return RunSingleFlight(*cat, ctx, c, w);
}

// Any other stage with cache: true: keyed when it runs, over its kind, parameters and the
// digests of what it consumes. A run: stage stores the outputs it declared and a hit
// restores them into this run's directory; a simulated stage stores its result.
ExecResult CacheRunner::RunCachedStage(
    const ExecContext& ctx, const schema::ClaimedStage& c,
    const std::function<ExecResult(const ExecContext&)>& run_stage) {
  CacheWork w;
  auto cat = schema::OpenWorkerCatalog(database_url_);  // one session: the key, the flight
  auto consumed = cat->StageInputDigests(c.stage_id);
  w.inputs = StageCacheInputs(c.spec, consumed, ctx.workdir, c.run_id, c.project);
  w.key = Sha256Hex(w.inputs);
  w.project = c.project;
  for (const auto& q : cat->TrustedProjects(c.project))
    w.trusted.emplace_back(
        q, Sha256Hex(StageCacheInputs(c.spec, consumed, ctx.workdir, c.run_id, q)));
  cat->RecordStageCacheInputs(c.stage_id, c.attempt, w.inputs);
  w.what = "outputs";
  std::vector<std::string> outputs = c.spec.command.outputs.value_or(std::vector<std::string>{});
  w.build = [&] {
    ExecResult er = run_stage(ctx);
    StoredArtifact a;
    if (er.outcome != Outcome::kSucceeded) return std::make_pair(er, a);
    if (c.spec.kind == StageKind::kRun) {
      try {
        a = StoreOutputs(home_, w.inputs, ctx.run_dir, outputs);
      } catch (const OutputRefused& e) {  // what the job wrote, not the worker's fault
        er.outcome = Outcome::kUserError;
        er.message = std::string("stage ") + c.spec.name + ": " + e.what();
      }
    } else {
      // A simulated stage's product is its result; stored so later runs are served it.
      std::string dir = home_ + "/tmp/result-" + std::to_string(c.stage_id) + "-" +
                        std::to_string(c.attempt);
      std::filesystem::create_directories(dir);
      std::ofstream(dir + "/result.json")
          << nlohmann::json{{"key", w.key}, {"message", er.message}}.dump() << "\n";
      a = StoreOutputs(home_, w.inputs, dir, {"result.json"});
      std::filesystem::remove_all(dir);
    }
    return std::make_pair(er, a);
  };
  if (c.spec.kind == StageKind::kRun)
    w.serve = [&](const schema::ArtifactRow& a, ExecResult& r) {
      RestoreOutputs(a.path, ctx.run_dir);
      r.message += " (restored into the run's directory)";
    };
  return RunSingleFlight(*cat, ctx, c, w);
}

}  // namespace trnflow::workers
