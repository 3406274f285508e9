#include "workers/artifact_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <utility>

#include "common/sha256.h"

namespace fs = std::filesystem;

namespace trnflow::workers {

namespace {

// Moves a filled temporary directory into the store as the entry of `a.digest`.
void PlaceEntry(const fs::path& tmp, StoredArtifact& a, const std::string& home,
                const std::string& cache_inputs) {
  fs::path dir = fs::path(home) / "artifacts" / a.digest.substr(0, 2) / a.digest;
  a.path = dir.string();
  {
    std::ofstream manifest(tmp / "manifest.json");
    manifest << cache_inputs << "\n";
    if (!manifest) throw std::runtime_error("cannot write " + tmp.string());
  }
  std::ofstream(tmp / "done") << a.digest << "\n";
  std::error_code ec;
  if (VerifyArtifact(a.path, a.digest)) {  // the same contents are already there
    fs::remove_all(tmp, ec);
    return;
  }
  fs::create_directories(dir.parent_path());
  fs::remove_all(dir, ec);  // a corrupt or half-written entry of the same digest
  fs::rename(tmp, dir, ec);
  if (ec && !VerifyArtifact(a.path, a.digest))
    throw std::runtime_error("cannot place " + dir.string() + ": " + ec.message());
  fs::remove_all(tmp, ec);
}

fs::path NewTemp(const std::string& home, const void* salt) {
  fs::path tmp = fs::path(home) / "artifacts" /
                 (".tmp-" + std::to_string(getpid()) + "-" +
                  std::to_string(reinterpret_cast<uintptr_t>(salt)) + "-" +
                  std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  return tmp;
}

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_;
};

std::string Errno() { return std::strerror(errno); }

// `p` lies inside `root` (both absolute and normal): strictly, or also equal with allow_equal.
bool Inside(const fs::path& root, const fs::path& p, bool allow_equal) {
  fs::path r = p.lexically_relative(root);
  if (r.empty() || *r.begin() == "..") return false;
  return allow_equal || r != ".";
}

// A link target that can be recreated anywhere and still resolve where it did: relative, its
// ".." only leading (they climb real directories, so they mean what they say; a ".." after a
// link would climb from wherever the link points).
bool SafeForm(const fs::path& target) {
  if (target.empty() || target.is_absolute()) return false;
  if (target == ".") return true;
  bool climbing = true;
  for (const auto& part : target) {
    if (part == "..") {
      if (!climbing) return false;
    } else {
      climbing = false;
      if (part == "." || part.empty()) return false;
    }
  }
  return true;
}

// Reads or copies a tree without following a symlink anywhere: each directory is opened
// relative to its parent's descriptor with O_NOFOLLOW, links are read (never opened), and
// only regular files are opened. Collects the digest lines of OutputsDigest.
struct TreeWalk {
  fs::path root;                 // canonical; every link must resolve inside it
  std::string shown;             // how messages name `root`: "${{ run.dir }}"
  bool hash = true;              // compute digest lines (restore does not need them)
  bool links_as_stored = false;  // a link must already be in SafeForm (an entry being restored)
  std::map<std::string, std::string> lines;  // relative path -> what the digest covers
  int64_t bytes = 0;

  std::string Name(const std::string& rel) const { return shown + "/" + rel; }

  // The target to store for a link at `dir` (canonical) pointing at `target`, or nullopt when
  // it resolves outside `root`.
  std::optional<std::string> LinkTarget(const fs::path& dir, const std::string& target) const {
    fs::path t(target);
    std::error_code ec;
    fs::path resolved = fs::weakly_canonical(t.is_absolute() ? t : dir / t, ec);
    if (ec || !Inside(root, resolved, true)) return std::nullopt;
    if (SafeForm(t) && Inside(root, (dir / t).lexically_normal(), true)) return target;
    if (links_as_stored) return std::nullopt;
    return resolved.lexically_relative(dir).generic_string();
  }

  // Visits entry `name` of the directory open as `src` (canonical path `dir`), known as `rel`;
  // copies it into the directory open as `dst` when dst >= 0.
  void Visit(int src, const fs::path& dir, const std::string& name, const std::string& rel,
             int dst) {
    struct stat st {};
    if (fstatat(src, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
      throw OutputRefused("declared output " + Name(rel) + " was not written");
    if (S_ISLNK(st.st_mode)) {
      std::string target(static_cast<size_t>(st.st_size) + 1, '\0');
      ssize_t n = readlinkat(src, name.c_str(), target.data(), target.size());
      if (n < 0) throw std::runtime_error("cannot read link " + Name(rel) + ": " + Errno());
      target.resize(static_cast<size_t>(n));
      auto stored = LinkTarget(dir, target);
      if (!stored)
        throw OutputRefused("output " + Name(rel) + " is a symlink to " + target +
                            (links_as_stored ? ", which is not a relative path inside the entry"
                                             : " outside the run directory") +
                            "; write the file itself, or link only within " + shown);
      if (hash) lines[rel] = std::string("link") + '\0' + *stored;
      if (dst >= 0)
        Replace(dst, name, [&] { return symlinkat(stored->c_str(), dst, name.c_str()); });
    } else if (S_ISDIR(st.st_mode)) {
      Fd from(openat(src, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!from) throw std::runtime_error("cannot open " + Name(rel) + ": " + Errno());
      Fd to;
      if (dst >= 0) to = OpenOrMakeDir(dst, name, rel);
      VisitChildren(from.get(), dir / name, rel + "/", to.get());
    } else if (S_ISREG(st.st_mode)) {
      Fd from(openat(src, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
      if (!from || fstat(from.get(), &st) != 0 || !S_ISREG(st.st_mode))
        throw std::runtime_error("cannot open " + Name(rel) + ": " + Errno());
      bool exec = (st.st_mode & S_IXUSR) != 0;
      int fd = from.get();
      Fd to;
      if (dst >= 0) {
        to = Fd(Replace(dst, name, [&] {
          return openat(dst, name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                        exec ? 0755 : 0644);
        }));
        Copy(fd, to.get(), rel);
        fd = to.get();  // the digest is of the copy: what is stored is what was hashed
        if (lseek(fd, 0, SEEK_SET) != 0) throw std::runtime_error("cannot rewind " + Name(rel));
      }
      if (hash) lines[rel] = Sha256FdHex(fd, Name(rel)) + (exec ? std::string("\0x", 2) : "");
      bytes += st.st_size;
    } else {
      throw OutputRefused("output " + Name(rel) +
                          " is not a regular file, directory or symlink; a cached stage can "
                          "only store those");
    }
  }

  void VisitChildren(int src, const fs::path& dir, const std::string& prefix, int dst) {
    std::vector<std::string> names;
    {
      DIR* d = fdopendir(dup(src));
      if (!d) throw std::runtime_error("cannot list " + dir.string() + ": " + Errno());
      rewinddir(d);  // the duplicate shares its offset with `src`, which may have been listed
      while (dirent* e = readdir(d)) {
        std::string n = e->d_name;
        if (n != "." && n != "..") names.push_back(n);
      }
      closedir(d);
    }
    for (const auto& n : names) Visit(src, dir, n, prefix + n, dst);
  }

  // Creates `name` in `dst` with `make`; what is already there (a file, a link: never followed)
  // is unlinked first. Returns make()'s result.
  template <typename F>
  int Replace(int dst, const std::string& name, F make) {
    int r = make();
    if (r < 0 && errno == EEXIST) {
      struct stat st {};
      if (fstatat(dst, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
        throw std::runtime_error("cannot replace directory " + name + " with a file or link");
      unlinkat(dst, name.c_str(), 0);
      r = make();
    }
    if (r < 0) throw std::runtime_error("cannot create " + name + ": " + Errno());
    return r;
  }

  static Fd OpenOrMakeDir(int dst, const std::string& name, const std::string& rel) {
    if (mkdirat(dst, name.c_str(), 0755) != 0 && errno != EEXIST)
      throw std::runtime_error("cannot create directory " + rel + ": " + Errno());
    Fd to(openat(dst, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!to) throw std::runtime_error("cannot open directory " + rel + ": " + Errno());
    return to;
  }

  void Copy(int from, int to, const std::string& rel) {
    char buf[1 << 16];
    while (true) {
      ssize_t n = read(from, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw std::runtime_error("cannot read " + Name(rel) + ": " + Errno());
      if (n == 0) return;
      for (ssize_t done = 0; done < n;) {
        ssize_t w = write(to, buf + done, static_cast<size_t>(n - done));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) throw std::runtime_error("cannot write a copy of " + Name(rel) + ": " + Errno());
        done += w;
      }
    }
  }

  // Walks each of `rels` under `root_path`, copying into `dst_root` when it is not empty. A
  // declared path must stay inside the root, through its directories too.
  void Run(const std::string& root_path, const std::vector<std::string>& rels,
           const fs::path& dst_root) {
    std::error_code ec;
    root = fs::canonical(root_path, ec);
    if (ec) {
      if (rels.empty()) return;
      throw OutputRefused("declared output " + Name(rels.front()) + " was not written");
    }
    Fd root_fd(open(root.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!root_fd) throw std::runtime_error("cannot open " + root.string() + ": " + Errno());
    for (const auto& rel : rels) {
      fs::path r = fs::path(rel).lexically_normal();
      if (r.is_absolute() || r.empty() || *r.begin() == "..")
        throw OutputRefused("output " + rel + " is not a path inside " + shown);
      fs::path parent = fs::canonical(root / r.parent_path(), ec);
      if (ec) throw OutputRefused("declared output " + Name(rel) + " was not written");
      if (!Inside(root, parent, true))
        throw OutputRefused("output " + Name(rel) + " lies under a symlink to " + parent.string() +
                            " outside the run directory");
      // Opened from the root's descriptor by the kernel, which refuses any step (a link, a
      // `..`, a mount) that would leave it: what was checked above is what is opened, even if
      // the tree changed in between.
      Fd src(OpenBeneath(root_fd.get(), r.parent_path().empty() ? "." : r.parent_path().string(),
                         O_RDONLY | O_DIRECTORY));
      if (!src && (errno == EXDEV || errno == ELOOP))
        throw OutputRefused("output " + Name(rel) + " lies under a symlink leading out of " +
                            shown);
      if (!src) throw std::runtime_error("cannot open " + parent.string() + ": " + Errno());
      Fd dst;
      if (!dst_root.empty()) {
        fs::create_directories(dst_root / r.parent_path());
        dst = Fd(open((dst_root / r.parent_path()).c_str(),
                      O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!dst) throw std::runtime_error("cannot open " + dst_root.string() + ": " + Errno());
      }
      if (r == ".")
        VisitChildren(src.get(), parent, "", dst.get());
      else
        Visit(src.get(), parent, r.filename().string(), r.generic_string(), dst.get());
    }
  }

  std::string Digest() const {
    std::string text;
    for (const auto& [path, what] : lines) text += path + '\0' + what + '\n';
    return Sha256Hex(text);
  }
};

}  // namespace

int OpenBeneath(int dir, const std::string& rel, int flags, bool no_symlinks) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_XDEV | RESOLVE_NO_MAGICLINKS |
                (no_symlinks ? RESOLVE_NO_SYMLINKS : 0);
  return static_cast<int>(syscall(SYS_openat2, dir, rel.c_str(), &how, sizeof how));
}

std::string OutputsDigest(const std::string& root, const std::vector<std::string>& rels) {
  TreeWalk w;
  w.shown = "${{ run.dir }}";
  w.Run(root, rels, {});
  return w.Digest();
}

StoredArtifact StoreOutputs(const std::string& home, const std::string& cache_inputs,
                            const std::string& root, const std::vector<std::string>& rels) {
  StoredArtifact a;
  fs::path tmp = NewTemp(home, &a);
  try {
    fs::create_directories(tmp / "outputs");
    TreeWalk w;
    w.shown = "${{ run.dir }}";
    w.Run(root, rels, tmp / "outputs");
    a.digest = w.Digest();
    a.bytes = w.bytes;
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  PlaceEntry(tmp, a, home, cache_inputs);
  return a;
}

void RestoreOutputs(const std::string& path, const std::string& root) {
  fs::path from = fs::path(path) / "outputs";
  TreeWalk check;  // the whole entry first: a refused entry writes nothing
  check.shown = from.string();
  check.hash = false;
  check.links_as_stored = true;
  try {
    check.Run(from.string(), {"."}, {});
  } catch (const std::exception& e) {
    throw std::runtime_error("cache entry " + path + " refused: " + e.what());
  }
  fs::create_directories(root);
  Fd dst(open(root.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dst) throw std::runtime_error("cannot restore into " + root + ": " + Errno());
  Fd src(open(from.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!src) throw std::runtime_error("cannot open " + from.string() + ": " + Errno());
  TreeWalk copy = check;
  for (const auto& e : fs::directory_iterator(from)) {
    std::string name = e.path().filename().string();
    // remove_all removes a link itself, never what it points at.
    fs::remove_all(fs::path(root) / name);
    copy.Visit(src.get(), check.root, name, name, dst.get());
  }
}

StoredArtifact WriteArtifact(const std::string& home, const std::string& cache_key,
                             const std::string& cache_inputs, double parameters) {
  // A real NEFF holds instructions and weights layout for its shapes; ours is a header, the
  // key's inputs, and filler sized at ~1 byte per 10,000 parameters (4 KiB to 4 MiB).
  std::string neff = "NEFF\x01 simulated\n" + cache_key + "\n" + cache_inputs + "\n";
  size_t size = static_cast<size_t>(std::clamp(parameters / 1e4, 4096.0, 4.0 * (1 << 20)));
  while (neff.size() < size) neff += cache_key;
  neff.resize(size);
  StoredArtifact a;
  a.digest = Sha256Hex(neff);
  a.bytes = static_cast<int64_t>(neff.size());
  fs::path tmp = NewTemp(home, &a);
  {
    std::ofstream out(tmp / "model.neff", std::ios::binary);
    out.write(neff.data(), static_cast<std::streamsize>(neff.size()));
    if (!out) throw std::runtime_error("cannot write " + tmp.string());
  }
  PlaceEntry(tmp, a, home, cache_inputs);
  return a;
}

bool VerifyArtifact(const std::string& path, const std::string& digest) {
  if (path.empty() || digest.empty()) return false;
  fs::path dir(path);
  std::error_code ec;
  if (!fs::exists(dir / "done", ec)) return false;
  try {
    if (fs::is_regular_file(fs::symlink_status(dir / "model.neff", ec))) {
      Fd neff(open((dir / "model.neff").c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
      return neff && Sha256FdHex(neff.get(), path) == digest;
    }
    if (fs::is_directory(dir / "outputs", ec))
      return OutputsDigest((dir / "outputs").string(), {"."}) == digest;
  } catch (const std::exception&) {
  }
  return false;
}

bool IsStorePath(const std::string& home, const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (!p.is_absolute() || p.filename().empty() || p.filename() == "." || p.filename() == "..")
    return false;
  std::error_code ec;
  fs::path store = fs::weakly_canonical(fs::absolute(fs::path(home) / "artifacts"), ec);
  if (ec) return false;
  fs::path parent = fs::weakly_canonical(p.parent_path(), ec);
  if (ec) return false;
  return Inside(store, parent / p.filename(), false);
}

bool RemoveArtifact(const std::string& home, const std::string& path) {
  if (!IsStorePath(home, path)) return false;
  std::error_code ec;
  fs::remove_all(path, ec);
  return true;
}

}  // namespace trnflow::workers
