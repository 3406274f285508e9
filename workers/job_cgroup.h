#pragma once
// A control group of each attempt's own (docs/security.md, "Memory and process limits").
// rlimits count per process (RLIMIT_AS) or per uid (RLIMIT_NPROC, shared by every attempt of a
// project on the host); a cgroup counts the attempt: the memory of all its processes together,
// its process count, an OOM kill that stays inside it, and a kill that reaches every process
// it ever started, with or without namespaces.
//
// Where the cgroups are made (CgroupHost::Detect):
//   - cgroup v2 (the unified hierarchy at /sys/fs/cgroup): below the worker's own cgroup when
//     it is delegated to it (systemd's Delegate=yes marks it with the `trusted.delegate`
//     xattr; ops/systemd's worker unit sets it), or below a directory the operator names with
//     TRNFLOW_CGROUP. The worker moves itself into a leaf `worker/` there (a v2 cgroup with
//     controllers for its children may hold no process itself) and makes `attempt-*` beside it
//     with memory.max, memory.swap.max 0, memory.oom.group 1 and pids.max.
//   - cgroup v1 (these test machines): in the memory and pids hierarchies, below the worker's
//     own groups, in `trnflow/attempt-*`, with memory.limit_in_bytes and pids.max.
//   - neither, or TRNFLOW_CGROUP=off: no cgroup; the rlimits are all a job gets, and the
//     worker says so when it starts.
// A limit whose controller the host does not give the worker is not enforced; Describe() says
// which are.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace trnflow::workers {

// An attempt's cgroup limits; 0: none.
struct CgroupLimits {
  uint64_t memory = 0;  // bytes of memory of all its processes (page cache included)
  uint64_t tasks = 0;   // processes and threads at once
};

struct CgroupHost {
  enum class Version { kNone, kV1, kV2 };
  Version version = Version::kNone;
  bool memory = false;  // memory limits are enforced
  bool tasks = false;   // process limits are enforced
  std::string why_none;  // kNone: why (for the worker's startup line)
  // Where attempt cgroups go: v2 one directory, v1 the memory and/or the pids one.
  std::vector<std::string> parents;

  // What this host offers, looked up under `root` (where cgroupfs is mounted). `base`: a
  // delegated v2 directory to use instead of the worker's own cgroup ("" to find it; "off"
  // for none). May move this process into `base/worker` (v2, see above).
  static CgroupHost Detect(const std::string& root = "/sys/fs/cgroup",
                           const std::string& base = "");
  // This process's, detected once from TRNFLOW_CGROUP; thread-safe.
  static const CgroupHost& ForThisProcess();
  // One line for the worker's startup log: what an attempt's cgroup enforces, or why none.
  std::string Describe() const;
};

class AttemptCgroup {
 public:
  // Makes the attempt's cgroup `name` under each of host.parents, with `limits`. nullptr with
  // *error set when a step fails (the attempt must not run unlimited: it is an infra error).
  static std::unique_ptr<AttemptCgroup> Make(const CgroupHost& host, const std::string& name,
                                             const CgroupLimits& limits, std::string* error);
  ~AttemptCgroup();  // Kill(), then removes its directories
  AttemptCgroup(const AttemptCgroup&) = delete;
  AttemptCgroup& operator=(const AttemptCgroup&) = delete;

  // Open (close-on-exec) descriptors of its cgroup.procs files: the child writes "0" to each
  // between fork and exec (ChildSetup), so it and all it starts belong to the attempt.
  const std::vector<int>& join_fds() const { return procs_fds_; }
  // SIGKILL to every process in it (v2: cgroup.kill), until it is empty (at most ~1 s).
  void Kill();
  bool Empty() const;
  // The kernel's OOM killer ended a process of it (memory.events / memory.oom_control).
  bool OutOfMemory() const;
  // The most memory it used at once, in bytes (memory.peak / memory.max_usage_in_bytes); 0
  // when the host does not say.
  uint64_t MemoryPeak() const;
  const std::vector<std::string>& dirs() const { return dirs_; }

 private:
  AttemptCgroup() = default;
  CgroupHost::Version version_ = CgroupHost::Version::kNone;
  std::vector<std::string> dirs_;
  std::string memory_dir_;  // "" when memory is not limited
  std::vector<int> procs_fds_;
};

}  // namespace trnflow::workers
