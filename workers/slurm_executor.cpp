// Runs an attempt as one Slurm batch job (docs/executors.md). The worker still claims, leases,
// heartbeats and commits; the job only runs the stage: a `run:` command directly, a simulated
// stage through `trnflow exec-stage DIR`, which speaks the same ::progress/::checkpoint lines.
//
// Each attempt has a directory under the shared directory, seen by the worker and the compute
// nodes: job.sh (the wrapper), env (the job's environment, NUL-separated, 0600), context.json
// (simulated stages), output.log (what the workload prints; the worker copies it into the
// attempt's log with secrets masked), and the wrapper's begin/notice/exit files. The job is
// `sbatch --parsable --no-requeue`, named trnflow-r<run>-s<stage>-a<attempt>; its id is stored
// on the attempt right after submit. Slurm is asked about all of this worker's jobs in one
// squeue per tick, by a shared monitor thread.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "common/duration.h"
#include "common/file_names.h"
#include "common/log.h"
#include "workers/artifact_store.h"
#include "workers/executor.h"
#include "workers/pause.h"
#include "workers/slurm.h"
#include "sim/workload.h"

extern char** environ;

namespace trnflow::workers {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct ToolResult {
  int code = -1;  // exit code; -1: could not run it (or it timed out)
  std::string out, err;
};

// Runs a Slurm client tool with the worker's environment (SLURM_CONF), capturing its output,
// killed after `timeout_s`.
ToolResult RunTool(const std::vector<std::string>& argv, double timeout_s = 30) {
  ToolResult r;
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) return r;
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return r;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err_pipe[1], 2);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (rc != 0) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    r.err = argv[0] + ": " + std::strerror(rc);
    return r;
  }
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  int open = 2;
  bool timed_out = false;
  char buf[8192];
  while (open > 0) {
    int ms = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (ms <= 0) {
      timed_out = true;
      break;
    }
    int n = ::poll(fds, 2, ms);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t got = ::read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    r.err = argv[0] + " did not answer in " + FormatDuration(timeout_s);
    return r;
  }
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// Sleeps up to `seconds`, waking early when the worker asks the attempt to stop.
void SleepUnlessStopped(const ExecContext& ctx, double seconds) {
  auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(seconds));
  while (Clock::now() < until && ctx.stop_reason() == StopReason::kNone) PauseFor(0.05);
}

std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'')
      q += "'\\''";
    else
      q += c;
  }
  return q + "'";
}

// Writes `text` to `path` atomically (a temporary file renamed over it), with `mode`.
void WriteFileAtomically(const fs::path& path, const std::string& text, mode_t mode) {
  fs::path tmp = path;
  tmp += ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) throw std::runtime_error("cannot write " + tmp.string() + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      throw std::runtime_error("cannot write " + tmp.string() + ": " + std::strerror(errno));
    }
    done += static_cast<size_t>(n);
  }
  ::fchmod(fd, mode);
  ::close(fd);
  fs::rename(tmp, path);
}

std::optional<std::string> ReadSmallFile(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return std::nullopt;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A file the job wrote in its own directory `dir`, read by root: opened beneath `dir` by the
// kernel (no link, no `..`, no other mount on the way), only a regular file, at most 1 MiB.
std::optional<std::string> ReadJobFile(const fs::path& dir, const std::string& name) {
  int d = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (d < 0) return std::nullopt;
  int fd = OpenBeneath(d, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK, /*no_symlinks=*/true);
  ::close(d);
  if (fd < 0) return std::nullopt;
  struct stat st;
  std::string text;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= (1 << 20)) {
    text.resize(static_cast<size_t>(st.st_size));
    ssize_t n = ::read(fd, text.data(), text.size());
    text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  }
  ::close(fd);
  return text;
}

slurm::WrapperFiles ReadWrapperFiles(const fs::path& dir) {
  return slurm::ParseWrapperFiles(ReadSmallFile(dir / "begin"), fs::exists(dir / "notice"),
                                  ReadSmallFile(dir / "exit"));
}

// The wrapper Slurm runs as the job's batch script. It records begin, notice and exit
// atomically, runs the workload in a session (process group) of its own, as the job's uid,
// with exactly the environment in `env` plus Slurm's own variables for the allocation
// (SLURM_*, SLURMD_NODENAME) and the rendezvous a distributed job reads (MASTER_ADDR,
// MASTER_PORT, WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK), and forwards
// Slurm's notice (USR1) and stop (TERM) to the workload as TERM: the same signal the process
// executor sends at a notice. The wrapper runs as root on the node; the directory it writes in
// is root's (the job cannot plant a link there), and the job's output goes to a file the
// wrapper opens there. With `namespaced` the command is `argv` already wrapped in bwrap
// (NamespaceArgv), which writes its namespace's pid 1 to .ns-RANK: a notice or a stop is
// forwarded as TERM to every process of that namespace but its pid 1, as the process executor
// does (TERM to bwrap itself would take the job down before it could save anything).
//
// With `tasks` > 1 (a multi-node `run:` stage) the batch script launches itself across the
// allocation, `srun --ntasks-per-node=1 job.sh task`, and each task (root on its node, as the
// batch script is) drops to the job's uid and enters the same namespaces as a single-node job:
// the only difference is Slurm's per-task variables (SLURM_PROCID, SLURM_NODEID, ...). The
// batch script forwards a notice or a stop to srun as USR1, which srun hands to every task
// without ending the step; each task forwards it into its own namespace as TERM.
std::string WrapperScript(const fs::path& dir, const std::string& workdir,
                          const JobIdentity& id, const JobLimits& limits,
                          const std::vector<std::string>& argv, bool namespaced, int tasks) {
  std::ostringstream s;
  s << "#!/bin/bash\n"
       "# Written by the trnflow worker for one attempt. Do not edit: the worker reads the\n"
       "# files it writes (begin, notice, exit) to judge the attempt.\n"
       "umask 077\n"
       "dir="
    << ShellQuote(dir.string())
    << "\n"
       "put() { printf '%s\\n' \"$2\" > \"$dir/.$1.tmp\" && mv -f \"$dir/.$1.tmp\" \"$dir/$1\"; }\n"
       "rank=${SLURM_PROCID:-0}\n"
       "child=\n";
  if (namespaced)
    s << "forward() {\n"
         "  local init ns p\n"
         "  init=$(sed -n 's/.*\"child-pid\": *\\([0-9]*\\).*/\\1/p' \"$dir/.ns-$rank\" 2>/dev/null)\n"
         "  [ -n \"$init\" ] && ns=$(readlink \"/proc/$init/ns/pid\") || return\n"
         "  for p in /proc/[0-9]*; do\n"
         "    [ \"${p#/proc/}\" != \"$init\" ] && [ \"$(readlink \"$p/ns/pid\" 2>/dev/null)\" = \"$ns\" ] &&\n"
         "      kill -TERM \"${p#/proc/}\" 2>/dev/null\n"
         "  done\n"
         "}\n";
  else
    s << "forward() { [ -n \"$child\" ] && kill -TERM -- \"-$child\" 2>/dev/null; }\n";
  // The workload of this node's task: the job's environment, then Slurm's variables for the
  // allocation (Slurm's word wins over a stage's env: of the same name), then the rendezvous.
  s << "launch() {\n"
       "  local n jobenv slurmenv=()\n"
       "  mapfile -d '' -t jobenv < \"$dir/env\"\n"
       "  for n in $(compgen -e); do\n"
       "    case $n in SLURM_*|SLURMD_NODENAME) slurmenv+=(\"$n=${!n}\") ;; esac\n"
       "  done\n"
       "  slurmenv+=(\"MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}\" \"MASTER_PORT=${MASTER_PORT:-29500}\"\n"
       "    \"WORLD_SIZE=${SLURM_NTASKS:-1}\" \"RANK=$rank\" \"LOCAL_RANK=${SLURM_LOCALID:-0}\"\n"
       "    \"LOCAL_WORLD_SIZE=1\" \"NODE_RANK=${SLURM_NODEID:-0}\")\n";
  // Without namespaces the wrapper enters the workdir; with them bwrap does, as the job.
  if (!namespaced)
    s << "  cd " << ShellQuote(workdir) << " || return 126\n";
  s << "  ulimit -v "
    << limits.address_space / 1024 << " -u " << limits.processes << " -f "
    << limits.file_size / 512 << " -n " << limits.open_files
    << " 2>/dev/null\n"
       "  setsid setpriv --pdeathsig=KILL ";  // dies with the wrapper, whatever Slurm tracks
  if (id.switch_user)
    s << "--reuid=" << id.uid << " --regid=" << id.gid << " --clear-groups ";
  s << "env -i \"${jobenv[@]}\" \"${slurmenv[@]}\"";
  for (const auto& a : argv) s << ' ' << ShellQuote(a);
  s << " < /dev/null >> \"$dir/output.log\" 2>&1"
    << (namespaced ? " 5> \"$dir/.ns-$rank\"" : "")
    << " &\n"
       "  child=$!\n"
       "}\n"
       // Waits for $child to end (a trapped signal interrupts wait), then its code.
       "await() {\n"
       "  code=0\n"
       "  while kill -0 \"$child\" 2>/dev/null; do wait \"$child\"; code=$?; done\n"
       "  wait \"$child\" 2>/dev/null; last=$?; [ \"$last\" -ne 127 ] && code=$last\n"
       "}\n"
       "if [ \"${1:-}\" = task ]; then\n"
       "  trap forward USR1 TERM\n"
       "  launch || exit $?\n"
       "  await\n"
       "  exit \"$code\"\n"
       "fi\n";
  if (tasks > 1)
    s << "forward_batch() { [ -n \"$child\" ] && kill -USR1 \"$child\" 2>/dev/null; }\n";
  else
    s << "forward_batch() { forward; }\n";
  s << "trap 'put notice \"$(date +%s)\"; forward_batch' USR1\n"
       "trap forward_batch TERM\n"
       "put begin \"$(date +%s.%N) ${SLURM_JOB_ID:-} ${SLURMD_NODENAME:-}\"\n"
       // Rank 0's node: its address as Slurm knows it (NodeAddr), a port from the job id.
       "first=$(scontrol show hostnames \"${SLURM_JOB_NODELIST:-}\" 2>/dev/null | head -n 1)\n"
       "MASTER_ADDR=$(scontrol show node -o \"$first\" 2>/dev/null | sed -n 's/.* NodeAddr=\\([^ ]*\\).*/\\1/p')\n"
       "export MASTER_ADDR=${MASTER_ADDR:-${first:-127.0.0.1}}\n"
       "export MASTER_PORT=$((29500 + ${SLURM_JOB_ID:-0} % 10000))\n";
  if (tasks > 1)
    s << "srun --export=ALL --nodes=" << tasks << " --ntasks=" << tasks
      << " --ntasks-per-node=1 --kill-on-bad-exit=0 /bin/bash \"$dir/job.sh\" task"
         " < /dev/null >> \"$dir/output.log\" 2>&1 &\n"
         "child=$!\n";
  else
    s << "launch || { put exit \"$? $(date +%s.%N)\"; exit 126; }\n";
  s << "await\n"
       "put exit \"$code $(date +%s.%N)\"\n"
       "exit \"$code\"\n";
  return s.str();
}

// How an sbatch ended: the job id (an array's id for an array), or why not.
struct Submitted {
  std::string job_id;
  std::string error;
  bool refused = false;  // Slurm refused it (the stage's user_error), not unreachable
};

// sbatch `argv` (the job named `name`), the controller not answering retried with backoff;
// anything else at once. A lost reply may hide a job Slurm did take: before each retry the
// name is looked up, so an attempt never has two jobs.
Submitted SubmitJob(const std::vector<std::string>& argv, const std::string& name,
                    const ExecContext& ctx, int submit_tries) {
  auto log = Logger("workers.slurm");
  Submitted out;
  double backoff = 1;
  for (int tries = 1;; ++tries) {
    ToolResult s = RunTool(argv, 60);
    if (s.code == 0) {
      out.job_id = s.out.substr(0, s.out.find_first_of(";\n"));
      return out;
    }
    std::string err = s.err;
    while (!err.empty() && err.back() == '\n') err.pop_back();
    if (slurm::TransientSubmitError(err) || s.code < 0) {
      ToolResult q = RunTool({"squeue", "-h", "-t", "all", "--name=" + name, "-o", "%i"});
      if (q.code == 0 && !q.out.empty()) {
        out.job_id = q.out.substr(0, q.out.find_first_of("_\n"));  // an array's task: its array
        log->warn("sbatch failed ({}) but Slurm has job {} for this attempt: taking it", err,
                  out.job_id);
        return out;
      }
    }
    if (slurm::TransientSubmitError(err) && tries < submit_tries &&
        ctx.stop_reason() == StopReason::kNone) {
      log->warn("sbatch failed ({}), try {} of {}: again in {}", err, tries, submit_tries,
                FormatDuration(backoff));
      SleepUnlessStopped(ctx, backoff);
      backoff = std::min(backoff * 2, 30.0);
      continue;
    }
    if (slurm::TransientSubmitError(err) || s.code < 0) {
      out.error = "Slurm did not take the job after " + std::to_string(tries) + " tries: " + err;
      return out;
    }
    out.refused = true;
    out.error = "Slurm refused the job: " + err;
    return out;
  }
}

}  // namespace

// Matrix expansions go out as job arrays: the first attempt to ask opens a batch for its
// sbatch options, the ones that ask within the window join it, and the first submits them all
// as one `sbatch --array=0-N` whose task i runs the i-th attempt's own wrapper (job.sh). Each
// attempt is then one array task, `ARRAY_i`: watched, cancelled (`scancel ARRAY_i`), billed
// (its own job id, from its wrapper's begin) and adopted like a job of its own. The batch's
// files live in SHARED/arrays/NAME/, root's and 0700: no job reaches them. The waits poll with
// PauseFor, so a waiting attempt's task is suspended, not holding an arena thread.
struct SlurmExecutor::Arrays {
  struct Request {
    fs::path dir;  // the attempt's directory
    Submitted result;
    bool done = false;
  };
  struct Batch {
    std::vector<std::shared_ptr<Request>> requests;
    Clock::time_point opened = Clock::now();
    bool sealed = false;
  };
  std::mutex mu;
  std::map<std::string, std::shared_ptr<Batch>> open;  // by run and sbatch options
  int in_flight = 0;  // this worker's jobs in Slurm (each array task one), for max_submit_jobs
  uint64_t seq = 0;

  // Waits (suspended) until `n` more jobs stay within `max` (0: no limit), then counts them.
  void Acquire(int n, int max, const ExecContext& ctx) {
    while (true) {
      {
        std::scoped_lock lock(mu);
        if (max <= 0 || in_flight + n <= max || in_flight == 0 ||
            ctx.stop_reason() != StopReason::kNone) {
          in_flight += n;
          return;
        }
      }
      PauseFor(0.2);
    }
  }
  void Release(int n) {
    std::scoped_lock lock(mu);
    in_flight -= n;
  }

  // The attempt in `dir` (its job.sh written) as a task of an array with the same `options`.
  Submitted Submit(const ExecContext& ctx, const std::vector<std::string>& options,
                   const fs::path& dir, int limit, const SlurmOptions& opt) {
    auto log = Logger("workers.slurm");
    auto req = std::make_shared<Request>();
    req->dir = dir;
    std::string key = std::to_string(ctx.run_id);
    for (const auto& o : options) key += '\x1f' + o;
    std::shared_ptr<Batch> batch;
    bool leader = false;
    {
      std::scoped_lock lock(mu);
      auto& b = open[key];
      if (!b || b->sealed || static_cast<int>(b->requests.size()) >= limit) {
        b = std::make_shared<Batch>();
        leader = true;
      }
      b->requests.push_back(req);
      batch = b;
    }
    if (!leader) {  // the batch's first attempt submits it
      while (true) {
        {
          std::scoped_lock lock(mu);
          if (req->done) return req->result;
        }
        PauseFor(0.05);
      }
    }
    // Gather the attempts that ask within the window, up to the limit.
    while (true) {
      {
        std::scoped_lock lock(mu);
        if (static_cast<int>(batch->requests.size()) >= limit ||
            Clock::now() - batch->opened >= std::chrono::duration<double>(opt.arrays.window_s) ||
            ctx.stop_reason() != StopReason::kNone) {
          batch->sealed = true;
          if (auto it = open.find(key); it != open.end() && it->second == batch) open.erase(it);
          break;
        }
      }
      PauseFor(0.05);
    }
    const int n = static_cast<int>(batch->requests.size());
    Acquire(n, opt.arrays.max_submit_jobs, ctx);
    Submitted result;
    std::string name;
    {
      std::scoped_lock lock(mu);
      name = "trnflow-r" + std::to_string(ctx.run_id) + "-array-" + std::to_string(::getpid()) +
             "-" + std::to_string(++seq);
    }
    fs::path arrays_dir = fs::path(opt.shared_dir) / "arrays";
    fs::path adir = arrays_dir / name;
    try {
      fs::create_directories(adir);
      ::chmod(arrays_dir.c_str(), 0700);
      ::chmod(adir.c_str(), 0700);
      std::string tasks;
      for (int i = 0; i < n; ++i) {
        tasks += (batch->requests[i]->dir / "job.sh").string() + "\n";
        // Before sbatch: a worker that dies between sbatch and storing the id leaves the next
        // attempt this to find the task by (adoption).
        WriteFileAtomically(batch->requests[i]->dir / "array", name + " " + std::to_string(i),
                            0600);
      }
      WriteFileAtomically(adir / "tasks", tasks, 0600);
      WriteFileAtomically(adir / "array.sh",
                          "#!/bin/bash\n"
                          "# Written by the trnflow worker: task i of this array runs the i-th\n"
                          "# attempt's wrapper (the i-th line of tasks).\n"
                          "w=$(sed -n \"$((${SLURM_ARRAY_TASK_ID:--1} + 1))p\" " +
                              ShellQuote((adir / "tasks").string()) +
                              ")\n"
                              "[ -n \"$w\" ] || exit 126\n"
                              "exec /bin/bash \"$w\"\n",
                          0700);
      std::vector<std::string> sbatch = options;
      sbatch.insert(sbatch.end(), {"--array=0-" + std::to_string(n - 1), "--job-name=" + name,
                                   "--output=" + (adir / "%a.out").string(),
                                   "--chdir=" + adir.string(), (adir / "array.sh").string()});
      result = SubmitJob(sbatch, name, ctx, opt.submit_tries);
    } catch (const std::exception& e) {
      result.error = std::string("cannot write the array's files: ") + e.what();
    }
    if (result.job_id.empty()) {
      Release(n);
    } else {
      log->info("Slurm job array {} ({}): {} attempts", result.job_id, name, n);
    }
    std::scoped_lock lock(mu);
    for (int i = 0; i < n; ++i) {
      auto& r = batch->requests[i];
      r->result = result;
      if (!result.job_id.empty()) r->result.job_id = result.job_id + "_" + std::to_string(i);
      r->done = true;
    }
    return req->result;
  }
};

// One squeue per tick for every job this worker watches; Run() calls wait for the next answer.
struct SlurmExecutor::Monitor {
  std::mutex mu;
  std::condition_variable cv;
  std::multiset<std::string> watched;
  std::map<std::string, slurm::JobState> last;
  bool reachable = true;
  uint64_t tick = 0;
  bool stopping = false;
  double poll_s;
  std::thread thread;

  explicit Monitor(double poll) : poll_s(poll) {
    thread = std::thread([this] { Loop(); });
  }
  ~Monitor() {
    {
      std::scoped_lock lock(mu);
      stopping = true;
    }
    cv.notify_all();
    thread.join();
  }
  void Loop() {
    auto log = Logger("workers.slurm");
    std::unique_lock lock(mu);
    while (!stopping) {
      if (watched.empty()) {
        cv.wait_for(lock, std::chrono::duration<double>(poll_s));
        continue;
      }
      std::string ids;
      for (const auto& id : std::set<std::string>(watched.begin(), watched.end()))
        ids += (ids.empty() ? "" : ",") + id;
      lock.unlock();
      // -r: an array's pending tasks one line each (ARRAY_i), not folded into ARRAY_[i-j].
      ToolResult r = RunTool({"squeue", "-h", "-r", "-t", "all", "-j", ids, "-o", "%i|%T|%r"});
      lock.lock();
      // One id that Slurm no longer knows makes squeue fail ("Invalid job id"): gone, not an
      // error. Anything else is Slurm unreachable: nothing is concluded.
      if (r.code == 0 || r.err.find("Invalid job id") != std::string::npos) {
        last = slurm::ParseSqueue(r.out);
        reachable = true;
      } else {
        if (reachable) log->warn("squeue failed ({}): keeping leases, concluding nothing", r.err);
        reachable = false;
      }
      ++tick;
      cv.notify_all();
      cv.wait_for(lock, std::chrono::duration<double>(poll_s), [this] { return stopping; });
    }
  }
  // Waits for the next answer after now; the job's state (nullopt: gone) and whether Slurm
  // answered.
  // Polls rather than waits on `cv`: the caller's task is suspended between looks.
  std::pair<std::optional<slurm::JobState>, bool> Next(const std::string& id) {
    std::unique_lock lock(mu);
    uint64_t seen = tick;
    auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(poll_s * 4 + 30));
    while (tick == seen && !stopping && Clock::now() < until) {
      lock.unlock();
      PauseFor(0.05);
      lock.lock();
    }
    std::optional<slurm::JobState> j;
    if (auto it = last.find(id); it != last.end()) j = it->second;
    return {j, reachable && tick > seen};
  }
  void Watch(const std::string& id) {
    std::scoped_lock lock(mu);
    watched.insert(id);
    cv.notify_all();
  }
  void Unwatch(const std::string& id) {
    std::scoped_lock lock(mu);
    if (auto it = watched.find(id); it != watched.end()) watched.erase(it);
  }
};

// Where this cluster keeps finished jobs' records (`scontrol show config`), asked once: the
// sacct calls billing makes, in order. Until scontrol answers, every source is tried.
struct SlurmExecutor::Accounting {
  std::mutex mu;
  std::optional<slurm::AccountingConfig> config;

  std::vector<std::vector<std::string>> Sources() {
    std::scoped_lock lock(mu);
    if (!config) {
      ToolResult r = RunTool({"scontrol", "show", "config"});
      slurm::AccountingConfig c = slurm::ParseAccountingConfig(r.out);
      if (r.code == 0 && c.known) {
        config = c;
        auto sources = slurm::AccountingSources(c);
        std::string said;
        for (const auto& s : sources) {
          std::string cmd;
          for (const auto& a : s) cmd += (cmd.empty() ? "" : " ") + a;
          said += (said.empty() ? "`" : ", then `") + cmd + "`";
        }
        Logger("workers.slurm")
            ->info("Slurm accounting: AccountingStorageType={}, JobCompType={}: billing from {}",
                   c.storage_type, c.jobcomp_type,
                   said.empty() ? "the wrapper's span (accounting is off)"
                                : said + ", else the wrapper's span");
      } else {
        return slurm::AccountingSources({});
      }
    }
    return slurm::AccountingSources(*config);
  }
};

SlurmExecutor::SlurmExecutor(SlurmOptions o)
    : opt_(std::move(o)),
      monitor_(std::make_unique<Monitor>(opt_.poll_s)),
      arrays_(std::make_unique<Arrays>()),
      accounting_(std::make_unique<Accounting>()) {}
SlurmExecutor::~SlurmExecutor() = default;

std::string SlurmJobName(int64_t run_id, int64_t stage_id, int attempt) {
  return "trnflow-r" + std::to_string(run_id) + "-s" + std::to_string(stage_id) + "-a" +
         std::to_string(attempt);
}

// The job of an earlier attempt this attempt took over (adopted or harvested).
struct SlurmExecutor::Taken {
  int from_attempt = 0;  // 0: none, a job of its own
  bool harvested = false;
  double billed_before = 0;  // simulated seconds the ledger billed earlier attempts for it
};

ExecResult SlurmExecutor::Run(const ExecContext& ctx) {
  Taken took;
  ExecResult r = RunJob(ctx, &took);
  if (took.from_attempt > 0) {
    // The attempts that watched the job before were billed for it up to their last heartbeat:
    // this one bills the rest of what Slurm accounted, never the same seconds twice.
    r.sim_seconds = std::max(0.0, r.sim_seconds - took.billed_before);
    if (r.sim_seconds <= 0) r.ran_instance = false;
    if (took.harvested)
      r.message += (r.message.empty() ? "" : "; ") + std::string("harvested from attempt ") +
                   std::to_string(took.from_attempt) +
                   ": its job finished while no worker watched it";
  }
  return r;
}

ExecResult SlurmExecutor::RunJob(const ExecContext& ctx, Taken* took) {
  auto log = Logger("workers.slurm");
  ExecResult r;
  r.progress_to = ctx.progress;
  auto infra = [&](std::string message) {
    r.outcome = Outcome::kInfraError;
    r.ran_instance = false;
    r.message = std::move(message);
    return r;
  };
  // The shared directory holds a directory per project uid (root's, group the project's, 0710:
  // no other project's job gets through), a run's attempts below it, root's. Only `work/` of
  // an attempt is the job's.
  fs::path project_dir = fs::path(opt_.shared_dir) /
                         (ctx.identity.switch_user ? "uid-" + std::to_string(ctx.identity.uid)
                                                   : std::string("jobs"));
  fs::path base = project_dir / RunDirName(ctx.run_id);
  auto attempt_dir = [&](int attempt) { return base / AttemptName(ctx.spec.name, attempt); };

  // Where it goes: the partition the operator mapped to its instance type and market, else
  // --partition (or the cluster's default).
  const slurm::Partition* mapped =
      slurm::PartitionFor(opt_.partitions, ctx.spec.instance, ctx.market == Market::kSpot);
  const std::string partition = mapped ? mapped->name : opt_.partition;
  const bool spot_partition = mapped ? mapped->spot : opt_.spot_partition;

  // The job of an earlier attempt of this stage whose result no attempt has taken is taken
  // over, never run twice: still in Slurm (its worker died, perhaps between sbatch and storing
  // the id), it is adopted and watched; finished while no worker watched it, its exit, output
  // and accounting are harvested as this attempt's result. Those attempts are the ones the
  // ledger closed as lost (worker dead, lease expired) or cancelled (handed back at a worker's
  // shutdown); a job an attempt with any other outcome recorded was taken, once, by that
  // attempt. An array task is found by its array's name and its index (the attempt's `array`
  // file, root's, written before the array's sbatch). Never two jobs of a stage at once: a job
  // is submitted only when no earlier one is alive.
  std::string job_id;
  bool adopted = false;
  fs::path dir = attempt_dir(ctx.attempt);
  if (ctx.attempt > 1) {
    auto stopped = [&](const std::string& what) {
      r.outcome = Outcome::kCancelled;
      r.ran_instance = false;
      r.message = "stopped while " + what;
      return r;
    };
    // The ledger's word on the earlier attempts; unknown without it (then only a live job is
    // adopted, as before harvesting existed).
    std::optional<std::vector<EarlierAttempt>> earlier;
    for (double backoff = 1; ctx.earlier_attempts; backoff = std::min(backoff * 2, 30.0)) {
      try {
        earlier = ctx.earlier_attempts();
        break;
      } catch (const std::exception& e) {
        if (ctx.stop_reason() != StopReason::kNone)
          return stopped("the catalog did not say what earlier attempts took");
        log->warn("stage={} attempt={}: earlier attempts unknown ({}); again in {}", ctx.spec.name,
                  ctx.attempt, e.what(), FormatDuration(backoff));
        SleepUnlessStopped(ctx, backoff);
      }
    }
    auto open_outcome = [](Outcome o) { return o == Outcome::kLost || o == Outcome::kCancelled; };
    std::set<std::string> taken;  // jobs whose result an attempt has taken
    std::map<int, EarlierAttempt> ledger;
    if (earlier)
      for (const auto& e : *earlier) {
        ledger[e.attempt] = e;
        if (!e.executor_job.empty() && !open_outcome(e.outcome)) taken.insert(e.executor_job);
      }
    auto open_attempt = [&](int a) {
      auto it = ledger.find(a);
      return !earlier || it == ledger.end() || open_outcome(it->second.outcome);
    };
    std::string names;
    std::map<std::string, std::pair<int, std::string>> arrays;  // name -> attempt, task id suffix
    for (int a = 1; a < ctx.attempt; ++a) {
      if (!open_attempt(a)) continue;
      names += (names.empty() ? "" : ",") + SlurmJobName(ctx.run_id, ctx.stage_id, a);
      if (auto text = ReadSmallFile(attempt_dir(a) / "array")) {
        std::istringstream in(*text);
        std::string array, index;
        if (in >> array >> index) {
          arrays[array] = {a, "_" + index};
          names += "," + array;
        }
      }
    }
    // What Slurm has of them, ended ones too (for MinJobAge after their end). Slurm not
    // answering is "unknown": wait (the lease is kept) rather than submit blind.
    std::map<int, slurm::JobState> in_slurm;  // by attempt
    if (!names.empty()) {
      ToolResult q;
      for (double backoff = 1;; backoff = std::min(backoff * 2, 30.0)) {
        q = RunTool({"squeue", "-h", "-r", "-t",
                     earlier ? "all" : "PENDING,RUNNING,CONFIGURING,COMPLETING,SUSPENDED",
                     "--name=" + names, "-o", "%i|%T|%r|%j"});
        if (q.code == 0) break;
        if (ctx.stop_reason() != StopReason::kNone) return stopped("Slurm was unreachable");
        log->warn("stage={} attempt={}: Slurm unreachable (squeue: {}); again in {}", ctx.spec.name,
                  ctx.attempt, q.err, FormatDuration(backoff));
        SleepUnlessStopped(ctx, backoff);
      }
      std::istringstream in(q.out);
      for (std::string line; std::getline(in, line);) {
        auto bar = line.rfind('|');
        if (bar == std::string::npos) continue;
        std::string name = line.substr(bar + 1);
        auto jobs = slurm::ParseSqueue(line.substr(0, bar));
        if (jobs.size() != 1) continue;
        const slurm::JobState& job = jobs.begin()->second;
        int a = 0;
        if (auto it = arrays.find(name); it != arrays.end()) {
          const std::string& suffix = it->second.second;
          if (job.id.size() <= suffix.size() ||
              job.id.compare(job.id.size() - suffix.size(), suffix.size(), suffix) != 0)
            continue;  // another attempt's task of the same array
          a = it->second.first;
        } else {
          a = std::atoi(name.substr(name.rfind("-a") + 2).c_str());
        }
        if (a >= 1 && a < ctx.attempt) in_slurm[a] = job;
      }
    }
    // The newest attempt that left a job decides.
    for (int a = ctx.attempt - 1; a >= 1; --a) {
      if (!open_attempt(a)) continue;
      fs::path adir = attempt_dir(a);
      std::optional<slurm::JobState> job;
      if (auto it = in_slurm.find(a); it != in_slurm.end()) job = it->second;
      slurm::WrapperFiles files = ReadWrapperFiles(adir);
      // Its id as the attempt recorded it (the `job` file, written right after sbatch), else
      // as Slurm lists it, else as its wrapper saw it.
      std::string id;
      if (auto text = ReadSmallFile(adir / "job")) id = text->substr(0, text->find('\n'));
      if (id.empty() && job) id = job->id;
      if (id.empty()) id = files.job;
      if (id.empty() || taken.count(id)) continue;
      std::string why;
      slurm::TakeOver t = slurm::DecideTakeOver(job, files, spot_partition, &why);
      if (t == slurm::TakeOver::kNone) continue;
      if (t == slurm::TakeOver::kHarvest && !earlier) t = slurm::TakeOver::kRunAgain;
      if (t == slurm::TakeOver::kRunAgain) {
        log->info(
            "stage={} attempt={}: Slurm job {} of attempt {} ended without finishing its "
            "work ({}): running the stage again",
            ctx.spec.name, ctx.attempt, id, a,
            why.empty() ? "gone from Slurm without an exit record" : why);
        break;
      }
      job_id = id;
      adopted = true;
      dir = adir;
      took->from_attempt = a;
      // Ended in Slurm, its exit record on its way: harvested too, once the record lands.
      took->harvested = t == slurm::TakeOver::kHarvest || (job && !slurm::ActiveState(job->state));
      for (const auto& [n, e] : ledger)
        if (open_outcome(e.outcome) && (e.executor_job == id || (e.executor_job.empty() && n == a)))
          took->billed_before += e.sim_seconds;
      if (took->harvested)
        log->info(
            "stage={} attempt={}: harvesting Slurm job {} of attempt {}: it finished ({}) "
            "while no worker watched it",
            ctx.spec.name, ctx.attempt, job_id, a, job ? job->state : "gone from squeue");
      else
        log->info("stage={} attempt={}: adopting Slurm job {} of attempt {}", ctx.spec.name,
                  ctx.attempt, job_id, a);
      break;
    }
  }

  std::string job_home;
  if (std::string e = PrepareAttemptDirs(ctx, &job_home); !e.empty()) return infra("sandbox: " + e);
  bool simulated = ctx.spec.kind != StageKind::kRun;
  if (job_id.empty()) {
    std::error_code ec;
    fs::remove_all(dir, ec);  // a previous life of this attempt that never reached sbatch
    fs::create_directories(dir / "work", ec);
    if (ec) return infra("cannot create " + dir.string() + ": " + ec.message());
    if (ctx.identity.switch_user) {
      // Root's all the way down to work/, which alone is the job's: the wrapper (root) never
      // writes where the job could have planted a link.
      gid_t g = ctx.identity.gid;
      for (auto [path, mode] : {std::pair{project_dir, 0710}, {base, 0710}, {dir, 0750}})
        if (::chown(path.c_str(), 0, g) != 0 || ::chmod(path.c_str(), mode) != 0)
          return infra("cannot give " + path.string() + " to the project's group");
      if (::chown((dir / "work").c_str(), ctx.identity.uid, g) != 0 ||
          ::chmod((dir / "work").c_str(), 0700) != 0)
        return infra("cannot hand " + (dir / "work").string() + " to uid " +
                     std::to_string(ctx.identity.uid));
    }
    std::vector<std::string> argv;
    if (simulated) {
      nlohmann::json c = {{"spec", nlohmann::json::parse(ToJson(ctx.spec))},
                          {"run_id", ctx.run_id},
                          {"attempt", ctx.attempt},
                          {"market", std::string(ToString(ctx.market))},
                          {"instance_count", ctx.instance_count},
                          {"progress", ctx.progress},
                          {"speed", ctx.speed},
                          {"seed", ctx.seed},
                          {"spot_rate_multiplier", ctx.spot_rate_multiplier},
                          {"spend_cap_s", std::isfinite(ctx.spend_cap_s) ? ctx.spend_cap_s : -1}};
      WriteFileAtomically(dir / "context.json", c.dump(), 0640);
      if (ctx.identity.switch_user && ::chown((dir / "context.json").c_str(), 0, ctx.identity.gid))
        return infra("cannot give " + (dir / "context.json").string() + " to the project's group");
      argv = {opt_.trnflow_binary, "exec-stage", dir.string()};
    } else {
      for (const auto& a : ctx.spec.command.argv)
        argv.push_back(SubstituteRunExpressions(a, std::to_string(ctx.run_id), ctx.run_dir));
      if (argv.empty()) {
        r.outcome = Outcome::kUserError;
        r.message = "empty command";
        return r;
      }
      if (ctx.spec.command.shell) argv = {"/bin/sh", "-c", argv[0]};
      if (std::string refused = NetworkRefused(ctx); !refused.empty()) {
        r.outcome = Outcome::kUserError;
        r.message = refused;
        return r;
      }
      // The same namespaces as on the worker's own host (bwrap must be installed on the nodes).
      if (ctx.namespaces.enabled) argv = NamespaceArgv(ctx, argv, 5);
    }
    std::string env;
    for (const auto& [k, v] : JobEnvironment(ctx, job_home)) env += k + "=" + v + '\0';
    WriteFileAtomically(dir / "env", env, 0600);
    bool namespaced = ctx.namespaces.enabled && !simulated;
    // A multi-node `run:` stage runs its command once per node; a simulated stage simulates
    // all of its instances in one process.
    int tasks = simulated ? 1 : std::max(1, ctx.instance_count);
    WriteFileAtomically(dir / "job.sh",
                        WrapperScript(dir, simulated ? dir.string() : ctx.workdir, ctx.identity,
                                      ctx.limits, argv, namespaced, tasks),
                        0700);
    // Unmasked output (secrets): root's only; the worker masks it into the attempt's log.
    WriteFileAtomically(dir / "output.log", "", 0600);

    const std::string name = SlurmJobName(ctx.run_id, ctx.stage_id, ctx.attempt);
    std::vector<std::string> options = {
        "sbatch", "--parsable", "--no-requeue",
        "--nodes=" + std::to_string(ctx.instance_count), "--ntasks-per-node=1",
        "--export=NONE", "--signal=B:USR1@120"};
    if (!partition.empty()) options.push_back("--partition=" + partition);
    if (mapped) {
      int tp = 0;
      if (simulated) try {
          sim::Workload w = sim::WorkloadFromJson(ctx.spec.workload_json);
          tp = w.kind == StageKind::kTrain ? w.tp : w.tp_degree;
        } catch (const std::exception&) {
        }
      if (std::string g = slurm::GresRequest(*mapped, ctx.instance_count, tp); !g.empty())
        options.push_back("--gres=" + g);
    }
    // The project's own account and QOS (--slurm-config's `accounts:`), else the default:
    // the site's fairshare, QOS limits and sshare see each project as its own.
    slurm::SlurmAccount account = slurm::AccountFor(opt_.accounts, ctx.project);
    if (account.account.empty()) account.account = opt_.account;
    if (!account.account.empty()) options.push_back("--account=" + account.account);
    if (!account.qos.empty()) options.push_back("--qos=" + account.qos);
    if (ctx.spec.timeout_s > 0) {
      // Slurm's limit is in whole minutes of wall time, with room for the grace: trnflow's own
      // clock ends the attempt at its timeout; Slurm's limit is the backstop.
      // --signal=B:USR1@120 is Slurm's notice two minutes before that limit: the limit leaves
      // those two minutes after the grace, or a short timeout's job would get its "notice" at
      // once (judged a spot interruption, its workload stopped as it starts).
      double wall_min = std::ceil(ctx.spec.timeout_s / ctx.speed / 60) + 3;
      options.push_back("--time=" + std::to_string(static_cast<long>(wall_min)));
    }
    Submitted sub;
    int array_limit = opt_.arrays.max_array_size;
    if (opt_.arrays.max_submit_jobs > 0)
      array_limit = std::min(array_limit, opt_.arrays.max_submit_jobs);
    if (array_limit > 1 && slurm::IsMatrixExpansion(ctx.spec.name)) {
      sub = arrays_->Submit(ctx, options, dir, array_limit, opt_);
    } else {
      arrays_->Acquire(1, opt_.arrays.max_submit_jobs, ctx);
      std::vector<std::string> sbatch = options;
      sbatch.insert(sbatch.end(), {"--job-name=" + name, "--output=" + (dir / "slurm.out").string(),
                                   "--chdir=" + dir.string(), (dir / "job.sh").string()});
      sub = SubmitJob(sbatch, name, ctx, opt_.submit_tries);
      if (sub.job_id.empty()) arrays_->Release(1);
    }
    if (sub.job_id.empty()) {
      if (!sub.refused) return infra(sub.error);
      r.outcome = Outcome::kUserError;
      r.ran_instance = false;
      r.message = sub.error;
      return r;
    }
    job_id = sub.job_id;
    // Beside the attempt's files, the id as the attempt records it: an attempt taking the
    // stage over knows the job by it even when Slurm lists it no more.
    try {
      WriteFileAtomically(dir / "job", job_id + "\n", 0600);
    } catch (const std::exception& e) {
      log->warn("stage={} attempt={}: {}", ctx.spec.name, ctx.attempt, e.what());
    }
    log->info("stage={} attempt={}: Slurm job {}", ctx.spec.name, ctx.attempt, job_id);
  }
  if (adopted) arrays_->Acquire(1, 0, ctx);  // counted, never waited for
  struct InFlight {
    Arrays* a;
    ~InFlight() { a->Release(1); }
  } in_flight{arrays_.get()};
  if (ctx.record_executor_job) {
    bool recorded = ctx.record_executor_job(job_id);
    // A job taken over is this attempt's only once the ledger says so: an attempt that took
    // its result without the record would leave it to be taken again. Not recorded (the lease
    // is gone, or the catalog did not answer): nothing is taken; the next attempt decides.
    for (int tries = 1; !recorded && adopted && tries < 4 && ctx.stop_reason() == StopReason::kNone;
         ++tries) {
      SleepUnlessStopped(ctx, tries);
      recorded = ctx.record_executor_job(job_id);
    }
    if (!recorded && adopted) {
      took->from_attempt = 0;
      return infra("Slurm job " + job_id +
                   " of an earlier attempt not taken: its id did not "
                   "reach the catalog");
    }
  }

  // Watch it: the wrapper's files, the job's output (into the attempt's log), Slurm's state.
  monitor_->Watch(job_id);
  struct Unwatch {
    Monitor* m;
    std::string id;
    ~Unwatch() { m->Unwatch(id); }
  } unwatch{monitor_.get(), job_id};
  double progress = ctx.progress, checkpointed = ctx.progress;
  std::string last_line;
  OutputCapture capture(ctx.log_path, ctx.limits.output, ctx.secrets, [&](const std::string& l) {
    if (l.rfind("::progress ", 0) == 0) {
      char* end = nullptr;
      double p = std::strtod(l.c_str() + 11, &end);
      if (end != l.c_str() + 11 && std::isfinite(p)) progress = std::clamp(p, 0.0, 1.0);
    } else if (l.rfind("::checkpoint ", 0) == 0) {
      checkpointed = progress;
    } else if (l.find_first_not_of(" \t\r") != std::string::npos) {
      last_line = l;
    }
  });
  int out_fd = -1;
  auto pump_output = [&] {
    if (out_fd < 0) out_fd = ::open((dir / "output.log").c_str(), O_RDONLY | O_CLOEXEC);
    if (out_fd < 0) return;
    char buf[64 * 1024];
    for (ssize_t n; (n = ::read(out_fd, buf, sizeof buf)) > 0;)
      capture.Write(buf, static_cast<size_t>(n));
  };
  auto started = Clock::now();
  auto wall = [&] { return std::chrono::duration<double>(Clock::now() - started).count(); };
  bool we_cancelled = false, stopped_here = false, timed_out = false, capped = false;
  double gone_since = -1, pending_since = -1, began_at = -1;
  slurm::Verdict verdict;
  std::optional<slurm::JobState> job;
  auto scancel = [&] {
    ToolResult c = RunTool({"scancel", job_id});
    if (c.code != 0) log->warn("scancel {} failed: {}", job_id, c.err);
  };
  SpendCap spend(ctx);  // topped up in slices while the job runs (budgets, migration 0033)
  while (true) {
    auto [state, reachable] = monitor_->Next(job_id);
    if (state) job = state;
    pump_output();
    slurm::Observation o;
    o.job = state;
    o.files = ReadWrapperFiles(dir);
    o.slurm_reachable = reachable;
    o.spot_partition = spot_partition;
    o.we_cancelled = we_cancelled;
    double now = wall();
    if (o.files.began && began_at < 0) began_at = now;
    bool ended_in_slurm =
        reachable && (!state || (state->state != "PENDING" && state->state != "RUNNING" &&
                                 state->state != "CONFIGURING" && state->state != "COMPLETING" &&
                                 state->state != "SUSPENDED"));
    if (ended_in_slurm && gone_since < 0) gone_since = now;
    o.gone_for_s = gone_since < 0 ? 0 : now - gone_since;
    if (state && state->state == "PENDING" && pending_since < 0) pending_since = now;
    o.pending_for_s = pending_since < 0 ? 0 : now - pending_since;
    verdict = slurm::Judge(o);
    if (verdict.finished) break;

    // trnflow's own reasons to end it: a stop, its timeout, its spend cap (simulated time runs
    // from the workload's start at the run's speed).
    double sim_now = began_at < 0 ? 0 : (now - began_at) * ctx.speed;
    StopReason why = ctx.stop_reason();
    if (why == StopReason::kLeaseLost || why == StopReason::kShutdown) {
      // Not ours to end: whoever takes the stage over adopts the job.
      stopped_here = true;
      break;
    }
    if (!we_cancelled) {
      if (why == StopReason::kCancelled || why == StopReason::kBudgetExceeded) {
        we_cancelled = true;
      } else if (ctx.spec.timeout_s > 0 && sim_now > ctx.spec.timeout_s) {
        we_cancelled = timed_out = true;
      } else if (sim_now >= spend.At(sim_now)) {
        we_cancelled = capped = true;
      }
      if (we_cancelled) scancel();
    }
    if (verdict.cancel_job) scancel();
    if (ctx.report_progress && began_at >= 0) {
      LiveProgress p;
      p.progress = progress;
      p.checkpointed = checkpointed;
      p.sim_seconds = sim_now;
      if (progress > ctx.progress && sim_now > 0)
        p.eta_s = (1 - progress) * sim_now / (progress - ctx.progress);
      ctx.report_progress(p);
    }
  }
  if (verdict.cancel_job) scancel();
  pump_output();
  capture.Finish();
  if (out_fd >= 0) ::close(out_fd);

  // What it ran: Slurm's accounting, from the sources the cluster's config says it keeps
  // (`sacct` with slurmdbd, else `sacct -c` with jobcomp/filetxt or mysql): its elapsed time
  // and nodes, refined within its one-second resolution by the wrapper's span (at a run's
  // speed of 7200 a second is two simulated hours); the wrapper's span alone when accounting
  // is off or has no record; else the span this worker saw.
  double watched = began_at < 0 ? 0 : wall() - began_at;
  slurm::WrapperFiles last_files = ReadWrapperFiles(dir);
  double span = last_files.began_at > 0 && last_files.exited_at >= last_files.began_at
                    ? last_files.exited_at - last_files.began_at
                    : -1;
  std::optional<slurm::JobState> acct;
  // Accounting knows an array task by its own job id (the wrapper's begin records it; a task
  // that never began ran nothing to account).
  std::string raw_id = !last_files.job.empty()                 ? last_files.job
                       : job_id.find('_') == std::string::npos ? job_id
                                                               : "";
  if (raw_id.empty() && !stopped_here) {  // a task that ended before its wrapper began
    ToolResult q = RunTool({"squeue", "-h", "-r", "-t", "all", "-j", job_id, "-o", "%A"});
    if (q.code == 0) raw_id = q.out.substr(0, q.out.find('\n'));
  }
  std::string acct_source;
  if (!stopped_here && !raw_id.empty()) {
    const auto sources = accounting_->Sources();
    // The record lands when the job is written off; give it a few seconds. slurmctld writes
    // its completion log at once and sends slurmdbd the record a moment later: while the
    // preferred source answers without the record, the next one waits its turn for a second.
    for (int look = 0; look < 10 && !acct && !sources.empty(); ++look) {
      for (const auto& source : sources) {
        std::vector<std::string> q = source;
        q.insert(q.end(), {"-n", "-P", "-j", raw_id, "-o", "jobidraw,state,elapsed,nnodes,exitcode"});
        ToolResult a = RunTool(q);
        auto rows = slurm::ParseSacct(a.out);
        if (auto it = rows.find(raw_id);
            a.code == 0 && it != rows.end() && it->second.elapsed_s >= 0 &&
            it->second.state != "RUNNING" && it->second.state != "PENDING") {
          acct = it->second;
          acct_source = source.size() > 1 ? "sacct -c" : "sacct";
          break;
        }
        if (a.code == 0 && look < 3) break;  // it answered: its record may be on its way
      }
      if (!acct && look + 1 < 10) PauseFor(0.3);
    }
  }
  slurm::Billed billed = slurm::BillFrom(acct, span, watched);
  double elapsed = billed.seconds;
  // The ledger bills instances × seconds; accounting's nodes, when they differ from the
  // instances asked for, scale the seconds.
  if (billed.nodes > 0 && ctx.instance_count > 0 && billed.nodes != ctx.instance_count)
    elapsed = elapsed * billed.nodes / ctx.instance_count;
  if (acct)
    log->info("stage={} attempt={}: Slurm job {} accounted {} on {} node(s) ({})", ctx.spec.name,
              ctx.attempt, job_id, FormatDuration(acct->elapsed_s), acct->nodes, acct_source);
  else if (!stopped_here)
    log->info("stage={} attempt={}: Slurm job {}: no accounting record; billed {} ({})",
              ctx.spec.name, ctx.attempt, job_id, FormatDuration(billed.seconds),
              span >= 0 ? "the wrapper's span" : "the span the worker watched");
  r.sim_seconds = std::min(elapsed * ctx.speed, spend.cap());
  r.ran_instance = began_at >= 0 || elapsed > 0;
  auto partial = [&] {
    r.progress_to = checkpointed;
    double worked = progress - ctx.progress;
    r.lost_fraction = worked > 0 ? std::clamp((progress - checkpointed) / worked, 0.0, 1.0) : 1.0;
  };
  std::string where = " (Slurm job " + job_id + ")";
  if (stopped_here) {
    r.outcome = Outcome::kCancelled;
    r.message = "handed back; Slurm job " + job_id + " keeps running for whoever takes the stage";
    partial();
    return r;
  }
  if (capped) {
    r.outcome = Outcome::kBudgetExceeded;
    r.message = "cancelled at its spend cap: the budget is spent" + where;
    partial();
    return r;
  }
  if (timed_out) {
    r.outcome = Outcome::kTimeout;
    r.message = "timed out after " + FormatDuration(ctx.spec.timeout_s) + " (simulated)" + where;
    partial();
    return r;
  }
  r.outcome = verdict.outcome;
  r.message = verdict.message;
  // A simulated stage says itself how it ended, unless Slurm or the market cut it short.
  if (simulated && verdict.outcome != Outcome::kSpotInterruption &&
      verdict.outcome != Outcome::kCancelled) {
    if (auto text = ReadJobFile(dir / "work", "result.json")) {
      try {
        auto j = nlohmann::json::parse(*text);
        if (auto o = ParseOutcome(j.at("outcome").get<std::string>())) r.outcome = *o;
        r.sim_seconds = j.at("sim_seconds").get<double>();
        // The job wrote this file: it never bills more than Slurm accounted for the job.
        if (acct) r.sim_seconds = std::min(r.sim_seconds, (acct->elapsed_s + 1) * ctx.speed);
        r.progress_to = j.at("progress_to").get<double>();
        r.lost_fraction = j.at("lost_fraction").get<double>();
        r.message = j.at("message").get<std::string>();
        r.ran_instance = j.value("ran_instance", true);
        r.message += (r.message.empty() ? "" : "; ") + std::string("Slurm job ") + job_id;
        return r;
      } catch (const std::exception& e) {
        log->warn("{}: unreadable result ({}): judging by Slurm",
                  (dir / "work" / "result.json").string(),
                  e.what());
      }
    }
  }
  if (r.outcome == Outcome::kSucceeded) {
    r.progress_to = 1;
    r.message = "Slurm job " + job_id;
    return r;
  }
  if (simulated && r.outcome == Outcome::kSpotInterruption) {
    if (auto text = ReadJobFile(dir / "work", "result.json")) {
      try {
        auto j = nlohmann::json::parse(*text);
        progress = std::max(progress, j.at("progress_to").get<double>());
        checkpointed = std::max(checkpointed, j.at("progress_to").get<double>());
      } catch (...) {
      }
    }
  }
  partial();
  if (!last_line.empty() && (r.outcome == Outcome::kFailed || r.outcome == Outcome::kInfraError)) {
    for (const auto& [name, value] : ctx.secrets)
      for (size_t at; !value.empty() && (at = last_line.find(value)) != std::string::npos;)
        last_line.replace(at, value.size(), "***");
    if (last_line.size() > 200) last_line = last_line.substr(0, 200) + "...";
    r.message += "; last output: \"" + last_line + "\"";
  }
  r.message += where;
  if (r.outcome == Outcome::kFailed)
    r.message += "; output in `trnflow logs " + std::to_string(ctx.run_id) + " " + ctx.spec.name + "`";
  return r;
}

}  // namespace trnflow::workers
