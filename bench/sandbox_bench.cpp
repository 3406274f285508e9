// What the job sandbox costs per attempt: the same `run:` command (`/bin/true`, so the figure is
// the sandbox and process start-up, nothing of the job), three ways side by side: unconfined
// (--no-sandbox), the uid switch alone (the sandbox before namespaces), and the uid switch
// inside bubblewrap's namespaces (the sandbox today). Two figures each, median and p90 wall
// time per attempt: the process alone (spawned and reaped, with the exact bwrap command line
// NamespaceArgv builds, started through setpriv as the worker's child is), and the whole
// ProcessExecutor attempt (directories, log, output reader; its wait loop polls every 10 ms,
// which all three share; each attempt includes the attempt's cgroup where the host gives one).
// A last line times the attempt's cgroup alone: made with its limits, emptied, removed.
// Needs root.
//
//   build/bench/sandbox_bench [attempts per way, default 200]
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "workers/executor.h"
#include "workers/job_cgroup.h"

extern char** environ;

using namespace trnflow;
using namespace trnflow::workers;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (::geteuid() != 0) {
    std::fprintf(stderr, "sandbox_bench switches uids: run it as root\n");
    return 2;
  }
  int n = argc > 1 ? std::atoi(argv[1]) : 200;
  std::string home = (fs::temp_directory_path() / ("trnflow-sandbox-bench-" +
                                                   std::to_string(getpid())))
                         .string();
  if (std::string e = PrepareHome(home, true); !e.empty()) {
    std::fprintf(stderr, "%s\n", e.c_str());
    return 1;
  }
  struct Way {
    const char* name;
    bool switch_user, namespaces;
    std::vector<double> ms, spawn_ms;
  };
  std::vector<Way> ways = {{"unconfined (--no-sandbox)", false, false, {}, {}},
                           {"uid switch only", true, false, {}, {}},
                           {"uid switch + namespaces (bwrap)", true, true, {}, {}}};
  std::string bwrap = FindBwrap();
  if (bwrap.empty()) {
    std::fprintf(stderr, "bwrap is not installed (apt-get install bubblewrap)\n");
    return 1;
  }
  for (int i = 0; i < n; ++i)
    for (auto& w : ways) {  // interleaved, so the machine's drift falls on all three alike
      ExecContext ctx;
      ctx.spec.name = "noop";
      ctx.spec.command.argv = {"/bin/true"};
      ctx.run_id = i + 1;
      ctx.attempt = 1;
      ctx.workdir = "/";
      ctx.run_dir = home + "/runs/" + std::to_string(i + 1);
      ctx.log_path = home + "/logs/noop-" + std::to_string(i) + ".log";
      ctx.checkpoint_dir = home + "/checkpoints/run-" + std::to_string(i + 1) + "/noop";
      ctx.identity = {w.switch_user, 200001, 200001};
      ctx.namespaces.enabled = w.namespaces;
      ctx.namespaces.bwrap = bwrap;
      auto t0 = std::chrono::steady_clock::now();
      ExecResult r = ProcessExecutor().Run(ctx);
      double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (r.outcome != Outcome::kSucceeded) {
        std::fprintf(stderr, "%s: attempt failed: %s\n", w.name, r.message.c_str());
        return 1;
      }
      w.ms.push_back(ms);

      // The process alone: setpriv (the uid switch) and bwrap as ProcessExecutor starts them.
      std::vector<std::string> cmd = {"/bin/true"};
      if (w.namespaces) cmd = NamespaceArgv(ctx, cmd, -1);
      if (w.switch_user)
        cmd.insert(cmd.begin(), {"/usr/bin/setpriv", "--reuid=200001", "--regid=200001",
                                 "--clear-groups"});
      std::vector<char*> args;
      for (auto& a : cmd) args.push_back(a.data());
      args.push_back(nullptr);
      t0 = std::chrono::steady_clock::now();
      pid_t pid;
      int status = 0;
      if (posix_spawn(&pid, args[0], nullptr, nullptr, args.data(), environ) != 0 ||
          waitpid(pid, &status, 0) != pid || status != 0) {
        std::fprintf(stderr, "%s: %s failed\n", w.name, cmd[0].c_str());
        return 1;
      }
      w.spawn_ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
              .count());
    }
  std::printf("%-34s %12s %12s %14s %14s   (%d attempts of /bin/true each)\n", "sandbox",
              "process p50", "process p90", "attempt p50", "attempt p90", n);
  for (auto& w : ways) {
    std::sort(w.ms.begin(), w.ms.end());
    std::sort(w.spawn_ms.begin(), w.spawn_ms.end());
    std::printf("%-34s %9.2f ms %9.2f ms %11.2f ms %11.2f ms\n", w.name,
                w.spawn_ms[w.spawn_ms.size() / 2], w.spawn_ms[w.spawn_ms.size() * 9 / 10],
                w.ms[w.ms.size() / 2], w.ms[w.ms.size() * 9 / 10]);
  }
  const CgroupHost& host = CgroupHost::ForThisProcess();
  std::printf("%s\n", host.Describe().c_str());
  if (host.version != CgroupHost::Version::kNone) {
    std::vector<double> cg;
    for (int i = 0; i < n; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      std::string error;
      auto g = AttemptCgroup::Make(host, "bench-" + std::to_string(i), {16ULL << 30, 4096}, &error);
      if (!g) {
        std::fprintf(stderr, "attempt cgroup: %s\n", error.c_str());
        return 1;
      }
      g.reset();
      cg.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(cg.begin(), cg.end());
    std::printf("%-34s %12s %12s %11.2f ms %11.2f ms\n", "of which the attempt's cgroup", "", "",
                cg[cg.size() / 2], cg[cg.size() * 9 / 10]);
  }
  fs::remove_all(home);
  return 0;
}
