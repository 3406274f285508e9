#include "workers/job_cgroup.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>


namespace trnflow::workers {
namespace {

constexpr long kCgroup2Magic = 0x63677270;  // CGROUP2_SUPER_MAGIC

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Writes `text` with one write(2), as cgroupfs expects. Returns 0 or the errno.
int WriteText(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  int err = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) ? 0 : errno;
  ::close(fd);
  return err;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool IsCgroup2(const std::string& dir) {
  struct statfs fs;
  return ::statfs(dir.c_str(), &fs) == 0 && static_cast<long>(fs.f_type) == kCgroup2Magic;
}

bool HasWord(const std::string& list, const std::string& word) {
  std::stringstream in(list);
  std::string w;
  while (in >> w)
    if (w == word) return true;
  return false;
}

// The value after `key` in a flat-keyed cgroup file ("oom_kill 3\n..."), or 0.
uint64_t KeyedValue(const std::string& text, const std::string& key) {
  std::stringstream in(text);
  std::string k;
  uint64_t v;
  while (in >> k >> v)
    if (k == key) return v;
  return 0;
}

// This process's cgroup path in the hierarchy whose /proc/self/cgroup line matches: "" for v2's
// "0::" line, else a v1 controller name.
std::string OwnPath(const std::string& controller) {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string ctrls = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controller.empty() ? line.rfind("0::", 0) == 0 : ("," + ctrls + ",").find("," + controller + ",") != std::string::npos)
      return path;
  }
  return "";
}

// Where the v1 hierarchy of `controller` shows this process's own group: its mount point plus
// the part of the own path below the mount's root.
std::string V1OwnDir(const std::string& controller) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  std::string own = OwnPath(controller);
  if (own.empty()) return "";
  while (std::getline(in, line)) {
    auto dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::stringstream after(line.substr(dash + 3));
    std::string fstype, source, options;
    after >> fstype >> source >> options;
    if (fstype != "cgroup" || ("," + options + ",").find("," + controller + ",") == std::string::npos)
      continue;
    std::stringstream before(line.substr(0, dash));
    std::string id, parent, dev, root, mount;
    before >> id >> parent >> dev >> root >> mount;
    if (root != "/" && own.rfind(root, 0) == 0) own = own.substr(root.size());
    return mount + (own == "/" ? "" : own);
  }
  return "";
}

bool MakeDir(const std::string& dir) { return ::mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST; }

// Removes attempt cgroups a killed worker left behind under `parent` (named attempt-pPID-…, with
// PID no longer alive); one that still holds a process stays.
void RemoveStale(const std::string& parent) {
  DIR* d = ::opendir(parent.c_str());
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind("attempt-p", 0) != 0) continue;
    long pid = std::strtol(name.c_str() + 9, nullptr, 10);
    if (pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH)) continue;
    ::rmdir((parent + "/" + name).c_str());
  }
  ::closedir(d);
}

CgroupHost None(std::string why) {
  CgroupHost h;
  h.why_none = std::move(why);
  return h;
}

CgroupHost DetectV2(const std::string& root, std::string base, bool named) {
  if (base.empty()) {
    std::string own = OwnPath("");
    base = root + (own == "/" ? "" : own);
  }
  if (!IsCgroup2(base))
    return None(base + " is not a cgroup v2 directory");
  bool is_root = !Exists(base + "/cgroup.type");  // the hierarchy's root has none
  if (!named && !is_root) {
    char flag[8] = {0};
    bool delegated = ::getxattr(base.c_str(), "trusted.delegate", flag, sizeof flag - 1) > 0 ||
                     ::getxattr(base.c_str(), "user.delegate", flag, sizeof flag - 1) > 0;
    if (!delegated || flag[0] != '1')
      return None("the worker's cgroup " + base +
                  " is not delegated to it: run it under systemd with Delegate=yes (ops/systemd's "
                  "unit does) or name a delegated directory with TRNFLOW_CGROUP");
  }
  CgroupHost h;
  h.version = CgroupHost::Version::kV2;
  std::string parent = base;
  if (is_root) {
    // The root may hold processes and still give its children controllers; the attempts get a
    // directory of their own so they are easy to find.
    parent = base + "/trnflow";
    if (!MakeDir(parent)) return None("mkdir " + parent + ": " + std::strerror(errno));
  } else if (!ReadText(base + "/cgroup.procs").empty()) {
    // A cgroup that gives its children controllers may hold no process: the worker moves into a
    // leaf of its own (the whole process: every thread).
    std::string leaf = base + "/worker";
    if (!MakeDir(leaf)) return None("mkdir " + leaf + ": " + std::strerror(errno));
    if (int err = WriteText(leaf + "/cgroup.procs", std::to_string(::getpid())))
      return None("moving the worker into " + leaf + ": " + std::strerror(err));
    if (!ReadText(base + "/cgroup.procs").empty())
      return None(base + " holds processes other than the worker's; give the worker a cgroup of "
                         "its own (TRNFLOW_CGROUP)");
  }
  for (const char* c : {"memory", "pids"}) {
    if (is_root) WriteText(base + "/cgroup.subtree_control", std::string("+") + c);
    WriteText(parent + "/cgroup.subtree_control", std::string("+") + c);
  }
  std::string enabled = ReadText(parent + "/cgroup.subtree_control");
  h.memory = HasWord(enabled, "memory");
  h.tasks = HasWord(enabled, "pids");
  h.parents = {parent};
  RemoveStale(parent);
  return h;
}

CgroupHost DetectV1() {
  CgroupHost h;
  h.version = CgroupHost::Version::kV1;
  for (const char* c : {"memory", "pids"}) {
    std::string own = V1OwnDir(c);
    if (own.empty() || ::access((own + "/cgroup.procs").c_str(), W_OK) != 0) continue;
    std::string parent = own + "/trnflow";
    if (!MakeDir(parent)) continue;
    (std::strcmp(c, "memory") == 0 ? h.memory : h.tasks) = true;
    h.parents.push_back(parent);
    RemoveStale(parent);
  }
  if (h.parents.empty())
    return None("neither a cgroup v2 hierarchy nor writable v1 memory or pids hierarchies");
  return h;
}

}  // namespace

CgroupHost CgroupHost::Detect(const std::string& root, const std::string& base) {
  if (base == "off") return None("TRNFLOW_CGROUP=off");
  if (!base.empty()) return DetectV2(root, base, true);
  if (IsCgroup2(root)) return DetectV2(root, "", false);
  return DetectV1();
}

const CgroupHost& CgroupHost::ForThisProcess() {
  static std::once_flag once;
  static CgroupHost host;
  std::call_once(once, [] { const char* base = std::getenv("TRNFLOW_CGROUP");
    host = Detect("/sys/fs/cgroup", base ? base : ""); });
  return host;
}

std::string CgroupHost::Describe() const {
  if (version == Version::kNone)
    return "job cgroups: none (" + why_none + "); jobs get rlimits only (docs/security.md)";
  std::string s = version == Version::kV2 ? "job cgroups: v2 under " : "job cgroups: v1 under ";
  for (size_t i = 0; i < parents.size(); ++i) s += (i ? ", " : "") + parents[i];
  s += "; per attempt: ";
  s += memory ? "memory" : "no memory limit";
  s += tasks ? ", processes" : ", no process limit";
  s += ", kill of every process";
  return s;
}

std::unique_ptr<AttemptCgroup> AttemptCgroup::Make(const CgroupHost& host, const std::string& name,
                                                   const CgroupLimits& limits,
                                                   std::string* error) {
  std::unique_ptr<AttemptCgroup> g(new AttemptCgroup);
  g->version_ = host.version;
  auto fail = [&](const std::string& what, int err) {
    *error = what + ": " + std::strerror(err);
    return nullptr;
  };
  std::string leaf = "attempt-p" + std::to_string(::getpid()) + "-" + name;
  for (const auto& parent : host.parents) {
    std::string dir = parent + "/" + leaf;
    if (::mkdir(dir.c_str(), 0755) != 0 && (errno != EEXIST || ::rmdir(dir.c_str()) != 0 ||
                                            ::mkdir(dir.c_str(), 0755) != 0))
      return fail("mkdir " + dir, errno);
    g->dirs_.push_back(dir);
    bool v2 = host.version == CgroupHost::Version::kV2;
    bool memory_here = v2 ? host.memory : Exists(dir + "/memory.limit_in_bytes");
    bool pids_here = Exists(dir + "/pids.max") && (v2 ? host.tasks : true);
    if (memory_here) g->memory_dir_ = dir;
    if (memory_here && limits.memory) {
      std::string bytes = std::to_string(limits.memory);
      if (v2) {
        if (int err = WriteText(dir + "/memory.max", bytes)) return fail(dir + "/memory.max", err);
        WriteText(dir + "/memory.swap.max", "0");  // absent without swap accounting
        WriteText(dir + "/memory.oom.group", "1");  // an OOM kill ends the whole attempt
      } else {
        if (int err = WriteText(dir + "/memory.limit_in_bytes", bytes))
          return fail(dir + "/memory.limit_in_bytes", err);
        WriteText(dir + "/memory.memsw.limit_in_bytes", bytes);  // absent without swap accounting
      }
    }
    if (pids_here && limits.tasks)
      if (int err = WriteText(dir + "/pids.max", std::to_string(limits.tasks)))
        return fail(dir + "/pids.max", err);
    int fd = ::open((dir + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return fail("open " + dir + "/cgroup.procs", errno);
    g->procs_fds_.push_back(fd);
  }
  return g;
}

AttemptCgroup::~AttemptCgroup() {
  for (int fd : procs_fds_) ::close(fd);
  Kill();
  for (const auto& dir : dirs_)
    for (int tries = 0; tries < 50 && ::rmdir(dir.c_str()) != 0 && errno == EBUSY; ++tries)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

bool AttemptCgroup::Empty() const {
  for (const auto& dir : dirs_)
    if (!ReadText(dir + "/cgroup.procs").empty()) return false;
  return true;
}

void AttemptCgroup::Kill() {
  if (version_ == CgroupHost::Version::kV2)
    for (const auto& dir : dirs_) WriteText(dir + "/cgroup.kill", "1");  // kernel >= 5.14
  // Without cgroup.kill (v1, older kernels), and for what a fork let slip in between reads.
  for (int round = 0; round < 100 && !Empty(); ++round) {
    for (const auto& dir : dirs_) {
      std::stringstream in(ReadText(dir + "/cgroup.procs"));
      long pid;
      while (in >> pid) ::kill(static_cast<pid_t>(pid), SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

bool AttemptCgroup::OutOfMemory() const {
  if (memory_dir_.empty()) return false;
  std::string file = version_ == CgroupHost::Version::kV2 ? "/memory.events" : "/memory.oom_control";
  return KeyedValue(ReadText(memory_dir_ + file), "oom_kill") > 0;
}

uint64_t AttemptCgroup::MemoryPeak() const {
  if (memory_dir_.empty()) return 0;
  std::string file =
      version_ == CgroupHost::Version::kV2 ? "/memory.peak" : "/memory.max_usage_in_bytes";
  return std::strtoull(ReadText(memory_dir_ + file).c_str(), nullptr, 10);
}

}  // namespace trnflow::workers
