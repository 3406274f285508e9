// Runs a `run:` stage as a real child process. The only file that includes Boost.Process.
//
// The job's stdout and stderr go to the attempt's log file through a pipe this executor
// reads, so a job can report with lines of its own:
//   ::progress 0.42        how far it is (0..1)
//   ::checkpoint PATH      its state up to the last ::progress is saved at PATH
// On spot, the simulated market interrupts the job like EC2 does: SIGTERM at the two-minute
// notice (a job should checkpoint and exit), SIGKILL when the instance goes away. The next
// attempt runs with TRNFLOW_RESUME=1 and the same TRNFLOW_CHECKPOINT_DIR.
//
// A run has one clock: a command's wall time counts `speed` times over in simulated time
// (billing, timeout, the spot market). At speed 1 — real jobs — the two are the same.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/process.hpp>
#include <boost/process/extend.hpp>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <thread>

#include "common/duration.h"
#include "common/log.h"
#include "sim/catalog.h"
#include "sim/perf_model.h"
#include "sim/spot_market.h"
#include "workers/executor.h"
#include "workers/job_cgroup.h"
#include "workers/pause.h"

namespace bp = boost::process;

namespace trnflow::workers {
namespace {

constexpr int kExitTempFail = 75;  // EX_TEMPFAIL: the job asks to be retried
constexpr double kGraceSeconds = 10;  // wall seconds after SIGTERM, at most kTermGraceSimSeconds

// In the child, before exec: the sandbox (workers/sandbox.h) puts the job in a session and
// process group of its own, so signals reach everything the job starts (torchrun's workers, a
// shell's pipeline) and nothing it leaves behind keeps the output pipe open; makes it die with
// the worker; and switches it to its project's uid with its limits. Listed after the output
// redirection, so a failure message lands in the captured log.
struct JobSandbox : boost::process::extend::handler {
  const ChildSetup* setup;
  explicit JobSandbox(const ChildSetup* s) : setup(s) {}
  template <typename Executor>
  void on_exec_setup(Executor&) const {
    setup->Apply();
  }
};

// Everything written to a short-lived pipe until its last writer closes it (at most 10 s
// between writes).
std::string ReadPipe(int fd) {
  std::string text;
  char buf[512];
  pollfd p{fd, POLLIN, 0};
  while (::poll(&p, 1, 10000) > 0) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

// The processes of one attempt. Without namespaces: the job's process group. With them: bwrap
// (the child the worker started) and the attempt's PID namespace, whose pid 1 bwrap reports
// on its info pipe. Its namespace dies whole when that pid 1 does, so nothing the job started
// (setsid, a double fork) outlives the attempt.
class JobProcesses {
 public:
  explicit JobProcesses(pid_t child) : child_(child) {}
  ~JobProcesses() {
    if (init_fd_ >= 0) ::close(init_fd_);
  }
  JobProcesses(const JobProcesses&) = delete;
  JobProcesses& operator=(const JobProcesses&) = delete;

  // Reads bwrap's info pipe ({"child-pid": N, ...}) until bwrap closes it. False: bwrap did
  // not get as far as making the namespace.
  bool ReadNamespace(int info_fd) {
    std::string text = ReadPipe(info_fd);
    auto at = text.find("\"child-pid\":");
    if (at == std::string::npos) return false;
    pid_t pid = static_cast<pid_t>(std::strtol(text.c_str() + at + 12, nullptr, 10));
    if (pid <= 0) return false;
    init_ = pid;
    // A descriptor of the namespace's pid 1: it becomes readable when that process is gone,
    // which the kernel allows only after every other process of the namespace has exited.
    init_fd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    struct stat st;
    std::string link = "/proc/" + std::to_string(pid) + "/ns/pid";
    if (::stat(link.c_str(), &st) == 0) ns_ = st.st_ino;
    return true;
  }

  // SIGTERM: to every process in the attempt's namespace but its pid 1 (bwrap's reaper, which
  // would take the job down with it before the job could save anything), or to the group.
  void Terminate() {
    if (ns_ == 0) return SignalGroup(SIGTERM);
    DIR* proc = ::opendir("/proc");
    if (!proc) return;
    while (dirent* e = ::readdir(proc)) {
      char* end = nullptr;
      long pid = std::strtol(e->d_name, &end, 10);
      if (pid <= 0 || *end || pid == init_ || pid == child_) continue;
      struct stat st;
      std::string link = std::string("/proc/") + e->d_name + "/ns/pid";
      if (::stat(link.c_str(), &st) == 0 && st.st_ino == ns_) ::kill(static_cast<pid_t>(pid), SIGTERM);
    }
    ::closedir(proc);
  }

  // SIGKILL to all of it: the namespace's pid 1 takes the namespace with it.
  void Kill() {
    if (init_fd_ >= 0) ::syscall(SYS_pidfd_send_signal, init_fd_, SIGKILL, nullptr, 0);
    SignalGroup(SIGKILL);
  }

  // After bwrap itself has exited: waits until the namespace is gone (bwrap's pid 1 dies with
  // its parent), killing it if it lingers. Afterwards no process of the attempt runs, and
  // whatever it left in its directories stays as it is.
  void WaitGone() {
    // The group only: bwrap's own pid is reaped and may belong to someone else by now.
    if (child_ > 0) ::kill(-child_, SIGKILL);
    if (init_fd_ < 0) return;
    pollfd p{init_fd_, POLLIN, 0};
    for (int tries = 0; tries < 100 && ::poll(&p, 1, 100) == 0; ++tries)
      ::syscall(SYS_pidfd_send_signal, init_fd_, SIGKILL, nullptr, 0);
  }

 private:
  void SignalGroup(int sig) {
    if (child_ > 0 && ::kill(-child_, sig) != 0) ::kill(child_, sig);
  }
  pid_t child_;
  pid_t init_ = -1;
  int init_fd_ = -1;
  ino_t ns_ = 0;
};

// "16 GiB", "512 MiB": a limit as the operator wrote it with --job-limits.
std::string LimitText(uint64_t bytes) {
  char buf[32];
  if (bytes >= (1ULL << 30) && bytes % (1ULL << 30) == 0)
    std::snprintf(buf, sizeof buf, "%llu GiB", static_cast<unsigned long long>(bytes >> 30));
  else
    std::snprintf(buf, sizeof buf, "%.0f MiB", bytes / 1048576.0);
  return buf;
}

std::string Substitute(const std::string& s, const ExecContext& ctx) {
  return SubstituteRunExpressions(s, std::to_string(ctx.run_id), ctx.run_dir);
}

// What the job said about itself, from its output.
struct Report {
  std::mutex mu;  // guards the fields below; the reader thread writes, the waiter reads
  double progress = 0;
  double checkpointed = 0;
  std::string checkpoint_path;
  std::string last_line;  // the last line of output that was not a protocol line
};

// Protocol lines: how far the job is and what it has saved.
void ParseProtocolLine(const std::string& line, Report& report) {
  if (line.rfind("::progress ", 0) == 0) {
    char* end = nullptr;
    double p = std::strtod(line.c_str() + 11, &end);
    if (end != line.c_str() + 11 && std::isfinite(p)) {
      std::scoped_lock lock(report.mu);
      report.progress = std::clamp(p, 0.0, 1.0);
    }
  } else if (line.rfind("::checkpoint ", 0) == 0) {
    std::scoped_lock lock(report.mu);
    report.checkpointed = report.progress;
    report.checkpoint_path = line.substr(13);
  } else if (line.find_first_not_of(" \t\r") != std::string::npos) {
    std::scoped_lock lock(report.mu);
    report.last_line = line;
  }
}

// The job's last line of output for a failure's message (which members of the project read in
// `show` and `watch`): secrets masked as in the log, shortened, quoted.
std::string LastLine(Report& report, const ExecContext& ctx) {
  std::string line;
  {
    std::scoped_lock lock(report.mu);
    line = report.last_line;
  }
  for (const auto& [name, value] : ctx.secrets) {
    if (value.empty()) continue;
    for (size_t at = line.find(value); at != std::string::npos; at = line.find(value, at + 3))
      line.replace(at, value.size(), "***");
  }
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  if (line.empty()) return "";
  if (line.size() > 200) line = line.substr(0, 200) + "...";
  for (char& c : line)
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  return "; last output: \"" + line + "\"";
}

// Reads the pipe in fixed chunks until every writer has closed it; OutputCapture bounds the
// log and the memory whatever the job prints.
void ReadOutput(int fd, OutputCapture& capture) {
  std::vector<char> buf(64 * 1024);
  while (true) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    capture.Write(buf.data(), static_cast<size_t>(n));
  }
  capture.Finish();
}

// What the child wrote to the status pipe before failing to become the job (empty: it
// exec'd). Every copy of the write end closes at an exec or an exit, so this ends quickly.
std::string ReadStatus(int fd) {
  std::string msg = ReadPipe(fd);
  while (!msg.empty() && msg.back() == '\n') msg.pop_back();
  return msg;
}

}  // namespace

ExecResult ProcessExecutor::Run(const ExecContext& ctx) {
  ExecResult r;
  auto log = Logger("workers.process");
  std::vector<std::string> argv;
  for (const auto& a : ctx.spec.command.argv) argv.push_back(Substitute(a, ctx));
  if (argv.empty()) {
    r.outcome = Outcome::kUserError;
    r.message = "empty command";
    return r;
  }
  if (ctx.spec.command.shell) argv = {"/bin/sh", "-c", argv[0]};

  if (ctx.identity.switch_user && !CanSwitchUser()) {
    r.outcome = Outcome::kInfraError;
    r.message = "this worker cannot switch to the job's uid " + std::to_string(ctx.identity.uid) +
                ": run it as root or with CAP_SETUID and CAP_SETGID (docs/security.md)";
    return r;
  }

  // A relative command stays relative: it starts from the workdir, which bwrap enters as the
  // job (in its namespaces; the worker never looks there as root), or, with the sandbox off,
  // which the child enters before exec. A bare name is looked up in the job's PATH (system
  // directories), not the worker's.
  const bool namespaced = ctx.namespaces.enabled;
  boost::filesystem::path exe;
  if (argv[0].find('/') != std::string::npos && namespaced) {
    exe = argv[0];  // found (or not) inside the namespaces, as the job, by bwrap
  } else if (argv[0].find('/') != std::string::npos) {
    std::filesystem::path p(argv[0]);
    std::filesystem::path seen = p.is_relative() ? std::filesystem::path(ctx.workdir) / p : p;
    if (boost::filesystem::exists(seen.string())) exe = argv[0];
  } else {
    std::vector<boost::filesystem::path> dirs;
    std::string path = kJobPath;
    for (size_t at = 0, colon; at <= path.size(); at = colon + 1) {
      colon = path.find(':', at);
      if (colon == std::string::npos) colon = path.size();
      dirs.emplace_back(path.substr(at, colon - at));
    }
    exe = bp::search_path(argv[0], dirs);
  }
  if (exe.empty()) {
    r.outcome = Outcome::kUserError;
    r.message =
        "command not found: " + argv[0] + " (looked in " + kJobPath + " and " + ctx.workdir + ")";
    return r;
  }

  if (std::string refused = NetworkRefused(ctx); !refused.empty()) {
    r.outcome = Outcome::kUserError;
    r.message = refused;
    return r;
  }
  // The simulated spot market, on the run's clock (the draw every executor makes from the
  // attempt's seed, sim/spot_market.h): no capacity at launch, or when the instance is
  // reclaimed, with SIGTERM at the notice before it (at launch when that is sooner). A command
  // on-demand meets no simulated market at all.
  double interrupt_at = std::numeric_limits<double>::infinity();  // simulated seconds
  const sim::InstanceType* type = ctx.market == Market::kSpot
                                      ? sim::Catalog::Builtin().FindInstance(ctx.spec.instance)
                                      : nullptr;
  if (type) {
    sim::MarketDraw market = sim::DrawMarket(*type, ctx.market, ctx.instance_count,
                                             ctx.spot_rate_multiplier, ctx.seed);
    if (market.short_of_capacity) {
      r.outcome = Outcome::kCapacityUnavailable;
      r.progress_to = ctx.progress;
      r.message = sim::ShortageMessage(*type, ctx.market, ctx.instance_count);
      return r;
    }
    interrupt_at = market.interrupt_at_s;
  }
  std::string job_home;
  if (std::string e = PrepareAttemptDirs(ctx, &job_home); !e.empty()) {
    r.outcome = Outcome::kInfraError;
    r.message = "sandbox: " + e;
    return r;
  }
  bp::environment env;
  for (const auto& [k, v] : JobEnvironment(ctx, job_home)) env[k] = v;

  double notice_at = interrupt_at - sim::kSpotNoticeSeconds;

  Report report;
  report.progress = report.checkpointed = ctx.progress;
  std::error_code ec;
  auto start = std::chrono::steady_clock::now();
  auto wall = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  int status_pipe[2], info_pipe[2] = {-1, -1};
  if (::pipe2(status_pipe, O_CLOEXEC) != 0 || (namespaced && ::pipe2(info_pipe, O_CLOEXEC) != 0)) {
    r.outcome = Outcome::kInfraError;
    r.message = std::string("could not start ") + argv[0] + ": pipe2: " + std::strerror(errno);
    return r;
  }
  std::vector<std::string> args(argv.begin() + 1, argv.end());
  if (namespaced) {
    args = NamespaceArgv(ctx, argv, info_pipe[1]);
    exe = args.front();
    args.erase(args.begin());
  }
  // The attempt's cgroup, where the host gives one: its limits over all its processes, and a
  // kill that reaches every one of them, namespaced or not.
  std::unique_ptr<AttemptCgroup> cgroup;
  if (const CgroupHost& host = CgroupHost::ForThisProcess();
      host.version != CgroupHost::Version::kNone) {
    std::string error;
    cgroup = AttemptCgroup::Make(host,
                                 "r" + std::to_string(ctx.run_id) + "-s" +
                                     std::to_string(ctx.stage_id) + "-a" +
                                     std::to_string(ctx.attempt),
                                 {ctx.limits.memory, ctx.limits.tasks}, &error);
    if (!cgroup) {
      ::close(status_pipe[0]);
      ::close(status_pipe[1]);
      if (info_pipe[0] >= 0) ::close(info_pipe[0]);
      if (info_pipe[1] >= 0) ::close(info_pipe[1]);
      r.outcome = Outcome::kInfraError;
      r.message = "sandbox: could not make the attempt's cgroup: " + error;
      return r;
    }
  }
  ChildSetup setup;
  if (cgroup) setup.cgroup_fds = cgroup->join_fds();
  setup.workdir = namespaced ? "/" : ctx.workdir;  // bwrap enters it, as the job
  setup.identity = ctx.identity;
  setup.limits = ctx.limits;
  setup.status_fd = status_pipe[1];
  setup.inherit_fd = info_pipe[1];
  setup.private_umask = ctx.identity.switch_user;
  bp::pipe out;
  std::error_code launch_ec;
  bp::child child(bp::exe = exe.string(), bp::args = args, bp::env = env,
                  bp::std_in<bp::null, (bp::std_out & bp::std_err)> out, JobSandbox(&setup),
                  launch_ec);
  ::close(status_pipe[1]);
  if (info_pipe[1] >= 0) ::close(info_pipe[1]);
  std::string setup_error = launch_ec ? "" : ReadStatus(status_pipe[0]);
  ::close(status_pipe[0]);
  JobProcesses procs(launch_ec ? -1 : child.id());
  bool in_namespace = namespaced && !launch_ec && setup_error.empty() &&
                      procs.ReadNamespace(info_pipe[0]);
  if (info_pipe[0] >= 0) ::close(info_pipe[0]);
  if (launch_ec) {
    r.outcome = Outcome::kInfraError;
    r.message = namespaced ? "sandbox: could not start bubblewrap (" + exe.string() +
                                 "): " + launch_ec.message()
                           : "could not start " + argv[0] + ": " + launch_ec.message();
    return r;
  }
  OutputCapture capture(ctx.log_path, ctx.limits.output, ctx.secrets,
                        [&report](const std::string& line) { ParseProtocolLine(line, report); });
  std::thread reader([&] { ReadOutput(out.native_source(), capture); });

  // Wait, while watching for a stop request, the timeout and the spot market: SIGTERM first,
  // SIGKILL after the grace period (or when the instance is gone). The grace is on the run's
  // clock too: 10 s of wall time, but never more than kTermGraceSimSeconds simulated (at speed
  // 7200, 10 s of wall time would be 20 billed hours).
  // At its spend cap the job is killed at once: its budget is gone, so there is no grace.
  bool timed_out = false, noticed = false, reclaimed = false, capped = false;
  double term_sent_at = -1, term_sent_sim = -1;
  SpendCap spend(ctx);  // topped up in slices while the job runs (budgets, migration 0033)
  while (child.running(ec)) {
    double now = wall(), sim_now = now * ctx.speed;
    double cap = spend.At(sim_now);
    // The timeout is noted before the cap: a late poll that finds the clock past both ends a
    // timeout, when the timeout came first on the run's clock (a cap short of the timeout is
    // the budget running out).
    timed_out = timed_out || (ctx.spec.timeout_s > 0 && sim_now > ctx.spec.timeout_s &&
                              ctx.spec.timeout_s < cap);
    if (sim_now >= cap) {
      capped = true;
      procs.Kill();
      break;
    }
    bool stop = ctx.stop_reason() != StopReason::kNone;
    noticed = noticed || sim_now >= notice_at;
    if ((stop || timed_out || noticed) && term_sent_at < 0) {
      procs.Terminate();
      term_sent_at = now;
      term_sent_sim = sim_now;
    } else if (sim_now >= interrupt_at ||
               (term_sent_at >= 0 && (now - term_sent_at > kGraceSeconds ||
                                      sim_now - term_sent_sim > kTermGraceSimSeconds))) {
      reclaimed = sim_now >= interrupt_at;
      procs.Kill();
      break;
    }
    if (ctx.report_progress) {
      LiveProgress p;
      {
        std::scoped_lock lock(report.mu);
        p.progress = std::max(report.progress, ctx.progress);
        p.checkpointed = std::max(report.checkpointed, ctx.progress);
      }
      p.sim_seconds = sim_now;
      // At the pace so far; unknown until the job has said how far it is.
      if (p.progress > ctx.progress && sim_now > 0)
        p.eta_s = (1 - p.progress) * sim_now / (p.progress - ctx.progress);
      ctx.report_progress(p);
    }
    // Wake at the cap itself, however fast the run's clock goes.
    PauseFor(std::clamp((cap - sim_now) / ctx.speed, 0.0, 0.01));
  }
  child.wait(ec);
  // Whatever the job left running goes with it; then the output pipe closes for the reader.
  procs.WaitGone();
  if (cgroup) cgroup->Kill();  // without namespaces, what left the job's process group too
  reader.join();
  bool out_of_memory = cgroup && cgroup->OutOfMemory();
  // The run's clock stops at the cap: the instance is gone then, whatever the poll's delay.
  r.sim_seconds = std::min(wall() * ctx.speed, spend.cap());
  int status = child.native_exit_code();
  if (!setup_error.empty()) {
    r.outcome = Outcome::kInfraError;
    r.message = "sandbox: could not start " + argv[0] + ": " + setup_error;
    return r;
  }
  if (namespaced && !in_namespace) {
    r.outcome = Outcome::kInfraError;
    r.message = "sandbox: bubblewrap could not make the job's namespaces" + LastLine(report, ctx) +
                " (docs/security.md, \"The job's namespaces\")";
    return r;
  }
  // bwrap exits with 128 + N when the command died of signal N, as a shell does.
  if (namespaced && WIFEXITED(status) && WEXITSTATUS(status) > 128 &&
      WEXITSTATUS(status) < 128 + NSIG)
    status = WEXITSTATUS(status) - 128;  // a wait status for "killed by signal N"

  double progress, checkpointed;
  {
    std::scoped_lock lock(report.mu);
    progress = std::max(report.progress, ctx.progress);
    checkpointed = std::max(report.checkpointed, ctx.progress);
  }
  auto partial = [&] {
    r.progress_to = checkpointed;
    double worked = progress - ctx.progress;
    // Without progress lines nothing tells what was kept: the whole attempt is lost.
    r.lost_fraction = worked > 0 ? std::clamp((progress - checkpointed) / worked, 0.0, 1.0) : 1.0;
  };

  if (capped && timed_out) {
    // Its reservation was its timeout and the grace: the cap ended a job that ignored SIGTERM.
    r.outcome = Outcome::kTimeout;
    r.message = "timed out after " + FormatDuration(ctx.spec.timeout_s) +
                " (simulated) and killed at the end of its grace after SIGTERM";
    partial();
    return r;
  }
  if (capped) {
    r.outcome = Outcome::kBudgetExceeded;
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "killed at its spend cap after %.2f simulated hours: the budget is spent",
                  r.sim_seconds / 3600);
    r.message = buf;
    partial();
    return r;
  }
  if (ctx.stop_reason() != StopReason::kNone) {
    r.outcome = Outcome::kCancelled;
    r.message = "stopped";
    partial();
    return r;
  }
  if (noticed || reclaimed) {
    r.outcome = Outcome::kSpotInterruption;
    partial();
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "spot interruption (SIGTERM at the notice%s); progress %.0f%%, %.0f%% "
                  "checkpointed",
                  reclaimed ? ", SIGKILL at reclaim" : "", 100 * progress, 100 * checkpointed);
    r.message = buf;
    return r;
  }
  if (timed_out) {
    r.outcome = Outcome::kTimeout;
    r.message = "timed out after " + FormatDuration(ctx.spec.timeout_s) + " (simulated)";
    partial();
    return r;
  }
  if (out_of_memory && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    // The kernel's OOM killer, inside the attempt's cgroup: the job's to fix (or the limit).
    r.outcome = Outcome::kFailed;
    r.message = "out of memory: the kernel killed the job at its memory limit (" +
                LimitText(ctx.limits.memory) + ", mem= of the worker's --job-limits)" +
                LastLine(report, ctx);
    partial();
    return r;
  }
  if (WIFSIGNALED(status)) {
    r.outcome = Outcome::kInfraError;
    r.message = "killed by signal " + std::to_string(WTERMSIG(status)) + LastLine(report, ctx);
    partial();
    return r;
  }
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (namespaced && code == 1) {
    // bwrap's own last word: a workdir the job cannot read or a command not found in the
    // namespaces is the user's to fix; anything else (a uid it cannot map) is the worker's.
    std::scoped_lock lock(report.mu);
    const std::string& said = report.last_line;
    if (said.rfind("bwrap: ", 0) == 0) {
      bool workdir = said.find("Can't chdir") != std::string::npos ||
                     said.find("Can't find source path " + ctx.workdir) != std::string::npos;
      bool command = said.find("execvp") != std::string::npos;
      r.outcome = workdir || command ? Outcome::kUserError : Outcome::kInfraError;
      r.message = "could not start " + argv[0] + " in the job's namespaces: " + said.substr(7);
      if (workdir)
        r.message += " (it runs as the project's uid " + std::to_string(ctx.identity.uid) +
                     ", which must be able to read " + ctx.workdir + ")";
      return r;
    }
  }
  if (code == 0) {
    r.outcome = Outcome::kSucceeded;
    r.progress_to = 1;
    return r;
  }
  r.outcome = code == kExitTempFail ? Outcome::kInfraError : Outcome::kFailed;
  r.message = "exited with code " + std::to_string(code) + LastLine(report, ctx) +
              "; output in `trnflow logs " + std::to_string(ctx.run_id) + " " + ctx.spec.name +
              "`";
  partial();
  log->debug("stage={} exit={}", ctx.spec.name, code);
  return r;
}

}  // namespace trnflow::workers
