#pragma once
// The compiled-artifact store: a content-addressed directory under TRNFLOW_HOME,
// artifacts/<aa>/<digest>/ holding model.neff, manifest.json (the cache key's inputs) and a
// `done` marker written last. An entry without its marker, or whose model.neff does not hash
// to its digest, is never served. Safe from any thread; entries are written to a temporary
// directory and renamed into place.
#include <cstdint>
#include <string>

namespace trnflow::workers {

struct StoredArtifact {
  std::string digest;  // sha256 of model.neff
  int64_t bytes = 0;
  std::string path;  // the entry's directory
};

// Writes the (simulated) NEFF of a compiled graph: deterministic bytes from the key, sized
// after the model. Throws std::runtime_error when the directory cannot be written.
StoredArtifact WriteArtifact(const std::string& home, const std::string& cache_key,
                             const std::string& cache_inputs, double parameters);

// True when `path` holds a complete entry whose model.neff hashes to `digest`.
bool VerifyArtifact(const std::string& path, const std::string& digest);

// Removes an entry's directory (no error when it is already gone).
void RemoveArtifact(const std::string& path);

}  // namespace trnflow::workers
