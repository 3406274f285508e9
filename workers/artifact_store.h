#pragma once
// The artifact store: a content-addressed directory under TRNFLOW_HOME,
// artifacts/<aa>/<digest>/ holding the artifact (model.neff for a compiled graph, or an
// outputs/ tree for any other cached stage), manifest.json (the cache key's inputs) and a
// `done` marker written last. An entry without its marker, or whose contents do not hash to
// its digest, is never served. Safe from any thread; entries are written to a temporary
// directory and renamed into place.
//
// The worker runs as a more privileged user than the jobs it serves, and one store serves
// every project, so nothing here follows a symlink out of the tree it reads or writes: a link
// among the outputs is stored as a link (its target, never the target's contents) and only
// when it resolves inside the run's directory; restore recreates links without following
// them and refuses an entry whose links lead out; removal touches only paths inside the store.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace trnflow::workers {

// The declared outputs cannot be stored as they are: one is missing, is a symlink leading out
// of the run's directory, or is not a file, directory or symlink. The stage's fault, not the
// worker's: what() names the output and says what is wrong.
class OutputRefused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct StoredArtifact {
  std::string digest;  // sha256 of model.neff
  int64_t bytes = 0;
  std::string path;  // the entry's directory
};

// Writes the (simulated) NEFF of a compiled graph: deterministic bytes from the key, sized
// after the model. Throws std::runtime_error when the directory cannot be written.
StoredArtifact WriteArtifact(const std::string& home, const std::string& cache_key,
                             const std::string& cache_inputs, double parameters);

// The digest of the paths `rels` (relative to `root`; a directory stands for everything
// beneath it), as "path NUL what LF" lines in path order, where `what` is the sha256 of a
// regular file's contents (followed by NUL "x" when it is executable) or "link" NUL target
// for a symlink, whose target is what is hashed (never what it points at). Throws
// OutputRefused naming the first path that does not exist, or a symlink resolving outside
// `root`; never opens a path through a symlink.
std::string OutputsDigest(const std::string& root, const std::vector<std::string>& rels);

// Stores copies of `rels` (relative to `root`) as an entry's outputs/ tree; the entry's
// digest is the OutputsDigest of the copies. A symlink is stored as a symlink, relative to its
// directory. Throws OutputRefused as OutputsDigest does; std::runtime_error when the store
// cannot be written.
StoredArtifact StoreOutputs(const std::string& home, const std::string& cache_inputs,
                            const std::string& root, const std::vector<std::string>& rels);

// Copies a verified entry's outputs/ tree into `root`, replacing what is there (an existing
// path is removed, never written through). Throws std::runtime_error, having written nothing,
// when the entry holds an absolute symlink or one that leads out of the tree, or when `root`
// is itself a symlink.
void RestoreOutputs(const std::string& path, const std::string& root);

// Opens `rel` beneath the open directory `dir` with openat2: the kernel refuses any step that
// leaves `dir` (a link or `..` out: EXDEV), crosses a mount or follows a magic link, and with
// `no_symlinks` any link at all (ELOOP). `flags` are open(2)'s (O_CLOEXEC is added). Returns
// the descriptor, or -1 with errno. For root reading what a job could have changed.
int OpenBeneath(int dir, const std::string& rel, int flags, bool no_symlinks = false);

// True when `path` holds a complete entry whose contents hash to `digest`.
bool VerifyArtifact(const std::string& path, const std::string& digest);

// True when `path` names a directory strictly inside the store of `home` (<home>/artifacts/),
// judged with its parent resolved and its final component not followed. A catalog row whose
// path is not is never trusted: not served, not deleted.
bool IsStorePath(const std::string& home, const std::string& path);

// Removes an entry's directory (no error when it is already gone) when IsStorePath; returns
// false, deleting nothing, otherwise.
bool RemoveArtifact(const std::string& home, const std::string& path);

}  // namespace trnflow::workers
