#pragma once
// The sandbox every executor that runs user code puts a job in (docs/security.md).
// Workers are shared by tenants who must not see or disturb each other, so a job gets:
//   - a clean environment: a fixed PATH, a private HOME/TMPDIR, its declared env:, its
//     secrets and the documented TRNFLOW_* variables; nothing of the worker's own;
//   - a uid and gid of its own project (never the worker's), in a session of its own;
//   - its run dir and checkpoint dir owned by that uid, mode 0700; the worker's logs and
//     cache stay root-only;
//   - rlimits on memory, processes, file size, open files and core dumps;
//   - captured output written to the log up to a cap, secrets masked, never held in memory;
//   - with the sandbox on, namespaces of its own (bubblewrap): a read-only system, its run,
//     checkpoint and work directories and nothing else of the host's files; a private /tmp and
//     /dev/shm; a PID namespace that dies whole with the attempt; no network unless the stage
//     asks for it and the worker allows it.
//
// Parent side (PrepareHome, PrepareAttemptDirs, JobEnvironment, OutputCapture) runs in the
// worker and may allocate and throw only where it says. ChildSetup::Apply runs in the child
// between fork and exec of a multi-threaded process: async-signal-safe code only.
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/file_names.h"

namespace trnflow::workers {

struct ExecContext;

// Whom the job runs as. The worker fills it per project; switch_user false (sandbox off)
// runs the job as the worker.
struct JobIdentity {
  bool switch_user = false;
  uid_t uid = 0;
  gid_t gid = 0;
};

// Per-attempt limits; each default is documented in docs/security.md.
struct JobLimits {
  uint64_t address_space = 16ULL << 30;  // RLIMIT_AS, bytes
  uint64_t processes = 1024;             // RLIMIT_NPROC: counts every process of the uid
  uint64_t file_size = 64ULL << 30;      // RLIMIT_FSIZE, bytes
  uint64_t open_files = 4096;            // RLIMIT_NOFILE
  uint64_t output = 64ULL << 20;         // bytes of captured output kept in the log
  // The attempt's cgroup (workers/job_cgroup.h), where the host gives one: all its processes
  // together.
  uint64_t memory = 16ULL << 30;  // memory.max, bytes
  uint64_t tasks = 4096;          // pids.max: processes and threads at once
};

// Reads "as=16G,nproc=1024,fsize=64G,nofile=4096,output=64M,mem=16G,tasks=4096" (any subset; suffixes K, M,
// G, T are powers of 1024) over `limits`. Returns an error naming the bad item, or "".
std::string ParseJobLimits(const std::string& text, JobLimits& limits);

// The attempt's namespaces (docs/security.md, "The job's namespaces"). Made by bubblewrap,
// started as the job's uid (after ChildSetup dropped root), so every mount it makes is checked
// by the kernel with the job's rights, never root's.
struct JobNamespaces {
  bool enabled = false;        // the sandbox is on: every command runs inside bwrap
  bool allow_network = false;  // a stage's `network: host` may share the host's network
  std::string bwrap;           // the bwrap binary
  std::vector<std::string> hidden;  // directories the job sees empty (config, secrets)
};
// bwrap's path ("/usr/bin/bwrap" or found on the worker's PATH); "" when not installed.
std::string FindBwrap();
// The whole bwrap command line (bwrap first) that runs `command` in the attempt's namespaces:
// /usr, /etc (without the hidden dirs) and the root's lib/bin links read-only; fresh /proc, /dev,
// /tmp and /dev/shm; the workdir read-only and the run and checkpoint dirs read-write at their
// own paths; the command started in the workdir; bwrap writes the namespace's pid to info_fd.
std::vector<std::string> NamespaceArgv(const ExecContext& ctx,
                                       const std::vector<std::string>& command, int info_fd);

// Why the attempt may not run with the network it asks for (`network: host` on a worker
// without --allow-network), or "".
std::string NetworkRefused(const ExecContext& ctx);

// Whether the worker may run jobs, and as whom.
struct SandboxDecision {
  bool enabled = true;  // jobs switch to their project's uid
  std::string error;    // non-empty: the worker must refuse to start, with this message
  std::string warning;  // non-empty: log it loudly at startup
};
// `requested`: the operator's choice (false: --no-sandbox or TRNFLOW_SANDBOX=off);
// `can_switch_user`: CanSwitchUser().
SandboxDecision DecideSandbox(bool requested, bool can_switch_user);
// True when the process may change uid and gid: euid 0, or CAP_SETUID and CAP_SETGID.
bool CanSwitchUser();
// False when TRNFLOW_SANDBOX is off, 0, false or no (the environment's way of --no-sandbox).
bool SandboxRequestedByEnvironment();

// Makes TRNFLOW_HOME and its top directories with the modes the sandbox relies on: home,
// runs/ and checkpoints/ 0711 (a job can reach its own dir but list nobody's), logs/,
// artifacts/, cache/ and tmp/ 0700. With `sandbox`, also checks that a job uid can reach
// home (every directory above it has o+x). Returns an error that names the directory and
// the fix, or "".
std::string PrepareHome(const std::string& home, bool sandbox);

// Creates this attempt's run dir, checkpoint dir and private home (returned in *job_home),
// and with ctx.identity.switch_user hands the run dir and checkpoint dir, recursively and
// without following symlinks, to the job's uid and gid, mode 0700. Returns an error or "".
std::string PrepareAttemptDirs(const ExecContext& ctx, std::string* job_home);

// The job's whole environment as NAME=VALUE strings (see the contract above): nothing is
// taken from the worker's environment.
std::map<std::string, std::string> JobEnvironment(const ExecContext& ctx,
                                                  const std::string& job_home);

// PATH of every job; also where a bare command name is looked up.
inline constexpr const char* kJobPath = "/usr/local/bin:/usr/bin:/bin";

// Everything the child does between fork and exec, computed in the parent. Apply(): its own
// session (setsid), the attempt's cgroup, chdir into the workdir while still privileged (a
// workdir under a 0700 parent works for a relative command), rlimits, then
// setgroups/setgid/setuid, then PR_SET_PDEATHSIG (which a credential change clears), and marks every inherited descriptor
// above 2 close-on-exec. A failing step writes one line to stdout (the captured log) and to
// status_fd and exits 126; the parent reads status_fd to tell a sandbox failure from the job.
struct ChildSetup {
  std::string workdir;  // "": stay where the worker is (the namespaces enter the workdir)
  JobIdentity identity;
  JobLimits limits;
  int status_fd = -1;  // write end of a close-on-exec pipe, or -1
  int inherit_fd = -1;  // a descriptor the command keeps across exec (bwrap's info pipe)
  bool private_umask = false;  // umask 077: what the job writes is its own
  // The attempt's cgroup.procs files (AttemptCgroup::join_fds): joined first, so the job and
  // everything it starts belong to the attempt's cgroup.
  std::vector<int> cgroup_fds;
  void Apply() const noexcept;
};

// The job's output on its way to the log. Write() takes chunks as they come from the pipe:
// bytes go to the log (secret values of 4 bytes or more replaced by ***) until `cap`, then
// one marker line and nothing more; complete lines of at most kMaxProtocolLine bytes go to
// `on_line` (without the newline), longer ones are not protocol lines. Memory stays bounded
// by the chunk, the longest secret and kMaxProtocolLine. One thread only.
class OutputCapture {
 public:
  static constexpr size_t kMaxProtocolLine = 64 * 1024;
  OutputCapture(const std::string& log_path, uint64_t cap,
                const std::map<std::string, std::string>& secrets,
                std::function<void(const std::string&)> on_line);
  ~OutputCapture();  // Finish()
  OutputCapture(const OutputCapture&) = delete;
  OutputCapture& operator=(const OutputCapture&) = delete;
  void Write(const char* data, size_t n);
  // Flushes what is held back for masking and the last line without a newline; idempotent.
  void Finish();
  uint64_t logged() const { return logged_; }    // bytes written to the log, marker excluded
  uint64_t dropped() const { return dropped_; }  // bytes beyond the cap

 private:
  void Log(const char* data, size_t n);  // masks, then LogRaw
  void LogRaw(const char* data, size_t n);
  void Line(const char* data, size_t n);
  int fd_ = -1;
  uint64_t cap_;
  uint64_t logged_ = 0, dropped_ = 0;
  bool marked_ = false, finished_ = false;
  char last_ = '\n';  // the last byte logged, so the marker starts a line of its own
  std::vector<std::string> secrets_;  // values to mask, longest first
  size_t longest_ = 0;
  std::string held_;  // tail that may be the start of a secret
  std::string line_;
  bool line_too_long_ = false;
  std::function<void(const std::string&)> on_line_;
};

}  // namespace trnflow::workers
