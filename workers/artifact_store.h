#pragma once
// The artifact store: a content-addressed directory under TRNFLOW_HOME,
// artifacts/<aa>/<digest>/ holding the artifact (model.neff for a compiled graph, or an
// outputs/ tree for any other cached stage), manifest.json (the cache key's inputs) and a
// `done` marker written last. An entry without its marker, or whose contents do not hash to
// its digest, is never served. Safe from any thread; entries are written to a temporary
// directory and renamed into place.
#include <cstdint>
#include <string>
#include <vector>

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

// The digest of files: sha256 over each regular file under the paths `rels` (relative to
// `root`; a directory stands for every file beneath it), as "path NUL sha256 LF" lines in path
// order. Throws std::runtime_error naming the first path that does not exist.
std::string OutputsDigest(const std::string& root, const std::vector<std::string>& rels);

// Stores copies of the files under `rels` (relative to `root`) as an entry's outputs/ tree;
// the entry's digest is their OutputsDigest.
StoredArtifact StoreOutputs(const std::string& home, const std::string& cache_inputs,
                            const std::string& root, const std::vector<std::string>& rels);

// Copies a verified entry's outputs/ tree into `root`, replacing what is there.
void RestoreOutputs(const std::string& path, const std::string& root);

// True when `path` holds a complete entry whose contents hash to `digest`.
bool VerifyArtifact(const std::string& path, const std::string& digest);

// Removes an entry's directory (no error when it is already gone).
void RemoveArtifact(const std::string& path);

}  // namespace trnflow::workers
