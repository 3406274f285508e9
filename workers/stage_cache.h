#pragma once
// The cache key of a stage that is not a compile: what it is (its kind), what it was asked to
// do (its resolved parameters: the simulated workload, or the command with its environment,
// declared outputs and the contents of the files it names) and what it consumes (the digests
// of everything upstream). Placement — instance, count, market, retries — changes the bill,
// not the result, and is left out. Whose stage it is — its project — is in: projects share the
// catalog and the fleet, not their results, unless one trusts another (cache_trust).
#include <string>
#include <utility>
#include <vector>

#include "common/stage_spec.h"

namespace trnflow::workers {

// Canonical JSON (keys sorted) of the key's inputs; the key is its sha256. `consumed` lists
// (stage name, digest) of the stages upstream; `workdir` is where the command's relative paths
// start: files the command names inside it are hashed into the key when anyone may read them
// (never as root's privilege: not in a workdir only root or another project can read). A command that mentions ${{ run.id }} depends on its run: `run_id` joins its key.
// `project` is the run's: the same stage in another project has another key.
std::string StageCacheInputs(const StageSpec& spec,
                             const std::vector<std::pair<std::string, std::string>>& consumed,
                             const std::string& workdir, int64_t run_id,
                             const std::string& project);

}  // namespace trnflow::workers
