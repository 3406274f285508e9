#include "workers/sandbox.h"

#include "common/bytes.h"
#include "common/file_names.h"

#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/close_range.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "workers/executor.h"

namespace trnflow::workers {
namespace {

namespace fs = std::filesystem;

std::string Errno(const std::string& what, int err = errno) {
  return what + ": " + std::strerror(err);
}

// Closes a descriptor when it goes out of scope.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

// Hands the tree under the open directory `dir` to uid:gid. Never follows a symlink: every
// step is relative to a descriptor opened with O_NOFOLLOW, so a job that swaps a directory
// for a link while this runs gets an error, not root's help. A file with other hard links
// that the job does not own already is left alone: it may be a link to someone else's file.
std::string ChownTree(int dir, uid_t uid, gid_t gid, int depth) {
  if (depth > 256) return "directory tree too deep";
  int copy = ::dup(dir);
  if (copy < 0) return Errno("dup");
  DIR* d = ::fdopendir(copy);
  if (!d) {
    ::close(copy);
    return Errno("fdopendir");
  }
  std::string error;
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    struct stat st;
    if (::fstatat(dir, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone meanwhile
    if (S_ISDIR(st.st_mode)) {
      Fd sub(::openat(dir, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (sub.fd < 0) {
        error = Errno(std::string("open ") + e->d_name);
        break;
      }
      if (::fchown(sub.fd, uid, gid) != 0) {
        error = Errno(std::string("chown ") + e->d_name);
        break;
      }
      error = ChownTree(sub.fd, uid, gid, depth + 1);
      if (!error.empty()) break;
    } else if (st.st_uid != uid || st.st_gid != gid) {
      if (st.st_nlink > 1) continue;
      if (::fchownat(dir, e->d_name, uid, gid, AT_SYMLINK_NOFOLLOW) != 0 && errno != ENOENT) {
        error = Errno(std::string("chown ") + e->d_name);
        break;
      }
    }
  }
  ::closedir(d);
  return error;
}

// Opens (creating if missing) directory `name` under the open directory `parent`, without
// following a symlink there.
int OpenSubdir(int parent, const std::string& name, mode_t mode) {
  if (::mkdirat(parent, name.c_str(), mode) != 0 && errno != EEXIST) return -1;
  return ::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

// Makes `path` (and its parents, root's) and gives it `mode`, owned by the worker.
std::string MakeWorkerDir(const fs::path& path, mode_t mode) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) return "cannot create " + path.string() + ": " + ec.message();
  Fd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.fd < 0) return Errno("cannot open " + path.string());
  if (::fchmod(fd.fd, mode) != 0) return Errno("cannot chmod " + path.string());
  return "";
}

// Makes `path` a directory the job owns: created by the worker, then (sandbox on) handed to
// the job's uid, recursively, mode 0700.
std::string MakeJobDir(const std::string& path, const JobIdentity& id) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) return "cannot create " + path + ": " + ec.message();
  Fd fd(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (fd.fd < 0) return Errno("cannot open " + path);
  if (!id.switch_user) return "";
  if (::fchown(fd.fd, id.uid, id.gid) != 0) return Errno("cannot chown " + path);
  if (::fchmod(fd.fd, 0700) != 0) return Errno("cannot chmod " + path);
  std::string error = ChownTree(fd.fd, id.uid, id.gid, 0);
  return error.empty() ? "" : "cannot hand " + path + " to the job: " + error;
}

uint64_t ParseSize(const std::string& v, bool* ok) {
  auto n = ParseBytes(v);
  *ok = n.has_value();
  return n.value_or(0);
}

// ---- Child side: async-signal-safe only (no allocation, no locks, no stdio). ----

struct Message {
  char buf[256];
  size_t n = 0;
  Message& operator<<(const char* s) {
    while (*s && n < sizeof buf - 1) buf[n++] = *s++;
    return *this;
  }
  Message& operator<<(uint64_t v) {
    char digits[24];
    int k = 0;
    do digits[k++] = static_cast<char>('0' + v % 10);
    while ((v /= 10) && k < 24);
    while (k && n < sizeof buf - 1) buf[n++] = digits[--k];
    return *this;
  }
};

const char* ErrName(int err) {
  switch (err) {
    case EPERM:
      return "operation not permitted (EPERM)";
    case EACCES:
      return "permission denied (EACCES)";
    case ENOENT:
      return "no such file or directory (ENOENT)";
    case ENOTDIR:
      return "not a directory (ENOTDIR)";
    case EINVAL:
      return "invalid argument (EINVAL)";
    case EAGAIN:
      return "resource temporarily unavailable (EAGAIN)";
    default:
      return "error";
  }
}

[[noreturn]] void Fail(int status_fd, Message& m) {
  int err = errno;
  m << ": " << ErrName(err) << " errno " << static_cast<uint64_t>(err) << "\n";
  const char prefix[] = "trnflow sandbox: ";
  (void)!::write(STDOUT_FILENO, prefix, sizeof prefix - 1);
  (void)!::write(STDOUT_FILENO, m.buf, m.n);
  if (status_fd >= 0) (void)!::write(status_fd, m.buf, m.n);
  ::_exit(126);
}

void SetLimit(int resource, uint64_t value, const char* name, int status_fd, bool privileged) {
  rlimit want{static_cast<rlim_t>(value), static_cast<rlim_t>(value)};
  if (::setrlimit(resource, &want) == 0) return;
  // Unprivileged (sandbox off, not root): as close as the worker's own hard limit allows.
  rlimit have;
  if (!privileged && ::getrlimit(resource, &have) == 0 && have.rlim_max < want.rlim_max) {
    want.rlim_cur = want.rlim_max = have.rlim_max;
    if (::setrlimit(resource, &want) == 0) return;
  }
  Message m;
  m << "setrlimit(" << name << ", " << value << ") failed";
  Fail(status_fd, m);
}

}  // namespace

std::string ParseJobLimits(const std::string& text, JobLimits& limits) {
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    auto eq = item.find('=');
    std::string key = item.substr(0, eq);
    bool ok = false;
    uint64_t v = eq == std::string::npos ? 0 : ParseSize(item.substr(eq + 1), &ok);
    uint64_t* field = key == "as"       ? &limits.address_space
                      : key == "nproc"  ? &limits.processes
                      : key == "fsize"  ? &limits.file_size
                      : key == "nofile" ? &limits.open_files
                      : key == "output" ? &limits.output
                      : key == "mem"    ? &limits.memory
                      : key == "tasks"  ? &limits.tasks
                                        : nullptr;
    if (!field)
      return "job limit '" + item +
             "': unknown name; use as, nproc, fsize, nofile, output, mem or tasks";
    if (!ok || v == 0)
      return "job limit '" + item + "': expected " + key +
             "=N with an optional K, M, G or T suffix, e.g. as=16G";
    *field = v;
  }
  return "";
}

SandboxDecision DecideSandbox(bool requested, bool can_switch_user) {
  SandboxDecision d;
  if (!requested) {
    d.enabled = false;
    d.warning =
        "SANDBOX OFF (--no-sandbox or TRNFLOW_SANDBOX=off): jobs run as this worker's user, "
        "can read each other's files and this worker's files, and can signal other jobs. "
        "Use only when every job on this worker is trusted.";
    return d;
  }
  if (!can_switch_user) {
    d.enabled = false;
    d.error =
        "the job sandbox needs a worker that can switch users: run `trnflow worker` as root "
        "(or with CAP_SETUID, CAP_SETGID, CAP_CHOWN, CAP_KILL and CAP_DAC_OVERRIDE); to run "
        "jobs unsandboxed as your own user on a machine only you use, pass --no-sandbox or "
        "set TRNFLOW_SANDBOX=off (see docs/security.md)";
  }
  return d;
}

bool CanSwitchUser() {
  if (::geteuid() == 0) return true;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    uint64_t caps = std::stoull(line.substr(7), nullptr, 16);
    constexpr uint64_t kSetgid = 1ULL << 6, kSetuid = 1ULL << 7;
    return (caps & kSetgid) && (caps & kSetuid);
  }
  return false;
}

bool SandboxRequestedByEnvironment() {
  const char* v = std::getenv("TRNFLOW_SANDBOX");
  if (!v) return true;
  std::string s(v);
  return !(s == "off" || s == "0" || s == "false" || s == "no");
}

std::string PrepareHome(const std::string& home, bool sandbox) {
  fs::path root(home);
  if (std::string e = MakeWorkerDir(root, sandbox ? 0711 : 0755); !e.empty()) return e;
  for (const char* d : {"runs", "checkpoints"})
    if (std::string e = MakeWorkerDir(root / d, sandbox ? 0711 : 0755); !e.empty()) return e;
  for (const char* d : {"logs", "cache", "artifacts", "tmp"})
    if (std::string e = MakeWorkerDir(root / d, 0700); !e.empty()) return e;
  if (!sandbox) return "";
  // A job runs as a uid that owns none of the directories above home: each must let others
  // through (o+x) or no job can reach its run dir.
  fs::path abs = fs::absolute(root).lexically_normal(), walk = "/";
  for (const auto& part : abs) {
    if (part != "/") walk /= part;
    struct stat st;
    if (::stat(walk.c_str(), &st) != 0) return Errno("cannot stat " + walk.string());
    if (!(st.st_mode & S_IXOTH))
      return "TRNFLOW_HOME " + home + " cannot be reached by jobs: " + walk.string() +
             " is not searchable by other users (mode " +
             [&] {
               char b[8];
               std::snprintf(b, sizeof b, "%04o", st.st_mode & 07777);
               return std::string(b);
             }() +
             "). Set TRNFLOW_HOME to a directory whose parents all have o+x, e.g. "
             "/var/lib/trnflow, or `chmod o+x " +
             walk.string() + "`";
  }
  return "";
}

std::string PrepareAttemptDirs(const ExecContext& ctx, std::string* job_home) {
  if (std::string e = MakeJobDir(ctx.run_dir, ctx.identity); !e.empty()) return e;
  if (!ctx.checkpoint_dir.empty()) {
    // The run's checkpoint parent stays the worker's, 0711: a job reaches its stage's dir
    // and lists nothing.
    fs::path parent = fs::path(ctx.checkpoint_dir).parent_path();
    if (ctx.identity.switch_user)
      if (std::string e = MakeWorkerDir(parent, 0711); !e.empty()) return e;
    if (std::string e = MakeJobDir(ctx.checkpoint_dir, ctx.identity); !e.empty()) return e;
  }
  // The private home lives in the job's own run dir, which the job owns: every step is made
  // relative to a descriptor opened without following links, so a link planted there by an
  // earlier stage cannot point the worker elsewhere.
  Fd run(::open(ctx.run_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (run.fd < 0) return Errno("cannot open " + ctx.run_dir);
  Fd homes(OpenSubdir(run.fd, ".home", 0700));
  if (homes.fd < 0) return Errno("cannot make " + ctx.run_dir + "/.home");
  std::string name = AttemptName(ctx.spec.name, ctx.attempt);
  Fd mine(OpenSubdir(homes.fd, name, 0700));
  if (mine.fd < 0) return Errno("cannot make " + ctx.run_dir + "/.home/" + name);
  Fd tmp(OpenSubdir(mine.fd, "tmp", 0700));
  if (tmp.fd < 0) return Errno("cannot make " + ctx.run_dir + "/.home/" + name + "/tmp");
  if (ctx.identity.switch_user) {
    for (int fd : {homes.fd, mine.fd, tmp.fd}) {
      if (::fchown(fd, ctx.identity.uid, ctx.identity.gid) != 0 || ::fchmod(fd, 0700) != 0)
        return Errno("cannot hand " + ctx.run_dir + "/.home to the job");
    }
  }
  *job_home = ctx.run_dir + "/.home/" + name;
  return "";
}

std::string FindBwrap() {
  if (::access("/usr/bin/bwrap", X_OK) == 0) return "/usr/bin/bwrap";
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':'))
    if (!dir.empty() && dir[0] == '/' && ::access((dir + "/bwrap").c_str(), X_OK) == 0)
      return dir + "/bwrap";
  return "";
}

std::string NetworkRefused(const ExecContext& ctx) {
  if (!ctx.namespaces.enabled || !ctx.spec.command.network || ctx.namespaces.allow_network)
    return "";
  return "the stage asks for `network: host` and this worker keeps jobs off the network; an "
         "operator allows it with `trnflow worker --allow-network` (docs/security.md)";
}

std::vector<std::string> NamespaceArgv(const ExecContext& ctx,
                                       const std::vector<std::string>& command, int info_fd) {
  const JobNamespaces& ns = ctx.namespaces;
  std::vector<std::string> a = {ns.bwrap, "--unshare-all"};
  if (ctx.spec.command.network && ns.allow_network) a.push_back("--share-net");
  // bwrap's own pid 1 reaps; when the command ends, or the worker, the namespace goes whole.
  a.insert(a.end(), {"--die-with-parent", "--new-session", "--hostname", "trnflow-job"});
  // The system, read-only. Debian's /bin, /lib... are links into /usr: recreate them as links.
  a.insert(a.end(), {"--ro-bind", "/usr", "/usr"});
  for (const char* top : {"/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt"}) {
    struct stat st;
    if (::lstat(top, &st) != 0) continue;
    if (S_ISLNK(st.st_mode)) {
      std::error_code ec;
      auto target = fs::read_symlink(top, ec);
      if (!ec) a.insert(a.end(), {"--symlink", target.string(), top});
    } else if (S_ISDIR(st.st_mode)) {
      a.insert(a.end(), {"--ro-bind", top, top});
    }
  }
  a.insert(a.end(), {"--ro-bind", "/etc", "/etc"});
  for (const auto& dir : ns.hidden)
    if (fs::is_directory(dir)) a.insert(a.end(), {"--tmpfs", dir});
  a.insert(a.end(), {"--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm", "--tmpfs", "/tmp",
                     "--tmpfs", "/var/tmp"});
  // The job's own directories at the paths it is told about; the workdir (its scripts) read-only.
  if (!ctx.workdir.empty()) a.insert(a.end(), {"--ro-bind", ctx.workdir, ctx.workdir});
  a.insert(a.end(), {"--bind", ctx.run_dir, ctx.run_dir});
  if (!ctx.checkpoint_dir.empty())
    a.insert(a.end(), {"--bind", ctx.checkpoint_dir, ctx.checkpoint_dir});
  if (!ctx.workdir.empty()) a.insert(a.end(), {"--chdir", ctx.workdir});
  if (info_fd >= 0) a.insert(a.end(), {"--info-fd", std::to_string(info_fd)});
  a.push_back("--");
  a.insert(a.end(), command.begin(), command.end());
  return a;
}

std::map<std::string, std::string> JobEnvironment(const ExecContext& ctx,
                                                  const std::string& job_home) {
  std::map<std::string, std::string> env;
  env["PATH"] = kJobPath;
  env["LANG"] = "C.UTF-8";
  env["HOME"] = job_home;
  env["TMPDIR"] = job_home + "/tmp";
  // Secrets first: the stage's own env: and trnflow's variables win over a secret that
  // happens to share a name.
  for (const auto& [k, v] : ctx.secrets) env[k] = v;
  for (const auto& [k, v] : ctx.spec.command.env)
    env[k] = SubstituteRunExpressions(v, std::to_string(ctx.run_id), ctx.run_dir);
  env["TRNFLOW_RUN_ID"] = std::to_string(ctx.run_id);
  env["TRNFLOW_RUN_DIR"] = ctx.run_dir;
  env["TRNFLOW_STAGE"] = ctx.spec.name;
  env["TRNFLOW_ATTEMPT"] = std::to_string(ctx.attempt);
  env["TRNFLOW_CHECKPOINT_DIR"] = ctx.checkpoint_dir;
  env["TRNFLOW_RESUME"] = ctx.attempt > 1 ? "1" : "0";
  return env;
}

void ChildSetup::Apply() const noexcept {
  // A session of its own: the job's process group is its own (signals reach all of it, the
  // worker signals -pid) and it has no controlling terminal of the worker's.
  if (::setsid() < 0) {
    Message m;
    Fail(status_fd, m << "setsid() failed");
  }
  // Descriptors the worker holds without close-on-exec (other jobs' pipes, opened by other
  // threads between their pipe() and fork()) must not reach this job.
  if (::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
    for (int fd = 3; fd < 65536; ++fd) {
      int flags = ::fcntl(fd, F_GETFD);
      if (flags >= 0 && !(flags & FD_CLOEXEC)) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
    }
  }
  // Into the attempt's cgroup before anything else is started: "0" is the writer itself.
  for (int fd : cgroup_fds) {
    if (::write(fd, "0", 1) != 1) {
      Message m;
      Fail(status_fd, m << "joining the attempt's cgroup failed");
    }
  }
  if (inherit_fd >= 0 && ::fcntl(inherit_fd, F_SETFD, 0) != 0) {
    Message m;
    Fail(status_fd, m << "fcntl(F_SETFD) failed");
  }
  if (private_umask) ::umask(077);
  // Without namespaces, while still privileged: a workdir below a directory the job cannot
  // search (/root) works, and a relative command stays relative to it.
  if (!workdir.empty() && ::chdir(workdir.c_str()) != 0) {
    Message m;
    Fail(status_fd, m << "chdir(" << workdir.c_str() << ") failed");
  }
  // Limits before dropping privileges: root may set them above the worker's own hard limits;
  // the job cannot raise them afterwards.
  bool privileged = identity.switch_user;
  SetLimit(RLIMIT_AS, limits.address_space, "RLIMIT_AS", status_fd, privileged);
  SetLimit(RLIMIT_NPROC, limits.processes, "RLIMIT_NPROC", status_fd, privileged);
  SetLimit(RLIMIT_FSIZE, limits.file_size, "RLIMIT_FSIZE", status_fd, privileged);
  SetLimit(RLIMIT_NOFILE, limits.open_files, "RLIMIT_NOFILE", status_fd, privileged);
  SetLimit(RLIMIT_CORE, 0, "RLIMIT_CORE", status_fd, privileged);
  if (identity.switch_user) {
    if (::setgroups(0, nullptr) != 0) {
      Message m;
      Fail(status_fd, m << "setgroups(0) failed");
    }
    if (::setgid(identity.gid) != 0) {
      Message m;
      Fail(status_fd, m << "setgid(" << static_cast<uint64_t>(identity.gid) << ") failed");
    }
    if (::setuid(identity.uid) != 0) {
      Message m;
      Fail(status_fd, m << "setuid(" << static_cast<uint64_t>(identity.uid) << ") failed");
    }
    // Make sure there is no way back (a kernel or libc that half-applied setuid).
    if (::setuid(0) == 0 || ::geteuid() != identity.uid || ::getegid() != identity.gid) {
      errno = EPERM;
      Message m;
      Fail(status_fd, m << "dropping privileges to uid " << static_cast<uint64_t>(identity.uid)
                        << " did not hold");
    }
  }
  // Die with the worker, so a job never runs on while its stage is retried elsewhere. Set
  // after the uid change, which clears it.
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
    Message m;
    Fail(status_fd, m << "prctl(PR_SET_PDEATHSIG) failed");
  }
  if (::getppid() == 1) ::_exit(137);  // the worker died before prctl took effect
}

OutputCapture::OutputCapture(const std::string& log_path, uint64_t cap,
                             const std::map<std::string, std::string>& secrets,
                             std::function<void(const std::string&)> on_line)
    : cap_(cap), on_line_(std::move(on_line)) {
  std::error_code ec;
  fs::create_directories(fs::path(log_path).parent_path(), ec);
  fd_ = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0600);
  for (const auto& [name, value] : secrets)
    if (value.size() >= 4) secrets_.push_back(value);
  std::sort(secrets_.begin(), secrets_.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  if (!secrets_.empty()) longest_ = secrets_.front().size();
}

OutputCapture::~OutputCapture() {
  Finish();
  if (fd_ >= 0) ::close(fd_);
}

void OutputCapture::Write(const char* data, size_t n) {
  // Protocol lines, from a bounded buffer.
  const char* p = data;
  const char* end = data + n;
  while (p < end) {
    const char* nl = static_cast<const char*>(std::memchr(p, '\n', end - p));
    const char* stop = nl ? nl : end;
    if (!line_too_long_) {
      size_t take = static_cast<size_t>(stop - p);
      if (line_.size() + take > kMaxProtocolLine) {
        line_too_long_ = true;
        line_.clear();
        line_.shrink_to_fit();
      } else {
        line_.append(p, take);
      }
    }
    if (!nl) break;
    if (!line_too_long_) Line(line_.data(), line_.size());
    line_.clear();
    line_too_long_ = false;
    p = nl + 1;
  }
  Log(data, n);
}

void OutputCapture::Line(const char* data, size_t n) {
  if (on_line_) on_line_(std::string(data, n));
}

void OutputCapture::Log(const char* data, size_t n) {
  if (logged_ >= cap_) {  // past the cap: nothing is written, nothing needs masking
    dropped_ += n + held_.size();
    held_.clear();
    LogRaw(nullptr, 0);
    return;
  }
  if (secrets_.empty()) return LogRaw(data, n);
  std::string buf = std::move(held_);
  buf.append(data, n);
  held_.clear();
  std::string out;
  out.reserve(buf.size());
  size_t pos = 0;
  while (pos < buf.size()) {
    size_t best = std::string::npos, best_len = 0;
    for (const auto& s : secrets_) {  // longest first: ties go to the longest
      size_t at = buf.find(s, pos);
      if (at < best) best = at, best_len = s.size();
    }
    if (best == std::string::npos) break;
    out.append(buf, pos, best - pos);
    out += "***";
    pos = best + best_len;
  }
  // Hold back what could be the start of a secret that the next chunk completes.
  size_t keep = std::min(buf.size() - pos, longest_ - 1);
  out.append(buf, pos, buf.size() - pos - keep);
  held_.assign(buf, buf.size() - keep, keep);
  LogRaw(out.data(), out.size());
}

void OutputCapture::LogRaw(const char* data, size_t n) {
  size_t room = logged_ < cap_ ? static_cast<size_t>(std::min<uint64_t>(cap_ - logged_, n)) : 0;
  size_t done = 0;
  while (done < room && fd_ >= 0) {
    ssize_t w = ::write(fd_, data + done, room - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;  // a full disk: the job goes on, its log stops
    done += static_cast<size_t>(w);
  }
  if (room > 0) last_ = data[room - 1];
  logged_ += room;
  dropped_ += n - room;
  if (dropped_ > 0 && !marked_) {
    marked_ = true;
    std::string marker = (logged_ > 0 && last_ != '\n' ? "\n" : "") +
                         std::string("[trnflow: output beyond ") + std::to_string(cap_) +
                         " bytes dropped]\n";
    if (fd_ >= 0) (void)!::write(fd_, marker.data(), marker.size());
  }
}

void OutputCapture::Finish() {
  if (finished_) return;
  finished_ = true;
  if (!held_.empty()) {
    std::string rest = std::move(held_);
    held_.clear();
    LogRaw(rest.data(), rest.size());
  }
  if (!line_too_long_ && !line_.empty()) Line(line_.data(), line_.size());
  line_.clear();
}

}  // namespace trnflow::workers
