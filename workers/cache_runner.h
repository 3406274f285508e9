#pragma once
// The cache runner (internal to workers/): runs one attempt of a stage through a cache instead
// of straight on its executor. A compile with a cache key goes through the compiled-artifact
// cache (artifact_store.h; its key comes from the pipeline file); any other `cache: true` stage
// is keyed here, when it runs, over its inputs and its project (stage_cache.h), and served its
// own project's entry or a trusted project's. Over one key there is a single flight through the
// catalog's `artifacts` table: the first attempt builds and stores the entry; the others wait
// (no instance, no bill) and are served it once it is ready; a builder that died is taken over,
// an entry that fails verification or lies outside the store is rebuilt, never served; a
// compile's user error is remembered for its key (not a host's out-of-memory). A hit is an
// ExecResult with outcome `cached`, nothing run. Called from a pool's task; it opens its own
// catalog session per attempt and waits with PauseFor; an executor's exception goes through
// (the worker makes it an outcome).
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/log.h"
#include "schema/worker_catalog.h"
#include "workers/artifact_store.h"
#include "workers/executor.h"

namespace trnflow::workers {

class CacheRunner {
 public:
  // `home`: TRNFLOW_HOME, where the store is (<home>/artifacts/).
  CacheRunner(std::string home, std::string database_url, std::shared_ptr<spdlog::logger> log);

  // A compile stage: its key is known from the file (the graph's shape, not the weights);
  // `simulated` builds it.
  ExecResult RunCachedCompile(const ExecContext& ctx, const schema::ClaimedStage& c,
                              Executor& simulated);

  // Any other stage with cache: true: keyed when it runs, over its kind, parameters and the
  // digests of what it consumes. A run: stage stores the outputs it declared and a hit
  // restores them into this run's directory; a simulated stage stores its result. `run_stage`
  // runs the stage as it would run outside the cache.
  ExecResult RunCachedStage(const ExecContext& ctx, const schema::ClaimedStage& c,
                            const std::function<ExecResult(const ExecContext&)>& run_stage);

 private:
  struct CacheWork;
  ExecResult RunSingleFlight(schema::WorkerCatalog& cat, const ExecContext& ctx,
                             const schema::ClaimedStage& c, const CacheWork& w);
  bool Servable(const schema::ArtifactRow& a);
  std::optional<ExecResult> Serve(schema::WorkerCatalog& cat, const std::string& key,
                                  const schema::ArtifactRow& a, const CacheWork& w,
                                  const std::string& note);

  std::string home_;
  std::string database_url_;
  std::shared_ptr<spdlog::logger> log;
};

}  // namespace trnflow::workers
