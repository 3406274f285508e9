#pragma once
// Worker processes for the benchmarks: forked children, each a workers::Worker (the code of
// `trnflow worker`) whose stages are no-ops, as job-queue benchmarks use no-op handlers.
// Claims, ledger rows, completions and releases are the real ones. Fork before the parent
// opens anything the children must not share.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include "workers/worker.h"

namespace trnflow::bench {

class WorkerProcesses {
 public:
  // `count` processes with a cpu pool of `capacity` stages each.
  WorkerProcesses(const std::string& url, int count, int capacity, int commit_batch = 512) {
    for (int i = 0; i < count; ++i) {
      int fds[2];
      if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
      pid_t pid = fork();
      if (pid < 0) throw std::runtime_error("fork failed");
      if (pid == 0) {
        close(fds[1]);
        for (int fd : stops_) close(fd);
        workers::WorkerOptions o;
        o.database_url = url;
        o.home = "/tmp/trnflow-bench-home";
        o.pools = {{"cpu", capacity}};
        o.commit_batch = commit_batch;
        o.executors = workers::Executors::AllOn(std::make_shared<workers::NoopExecutor>());
        {
          workers::Worker w(o);
          w.Start();
          char c;
          while (read(fds[0], &c, 1) < 0) {
          }  // the parent closes the pipe: stop
          w.Stop();
        }
        _exit(0);
      }
      close(fds[0]);
      pids_.push_back(pid);
      stops_.push_back(fds[1]);
    }
  }
  ~WorkerProcesses() { Stop(); }
  void Stop() {
    for (int fd : stops_) close(fd);
    stops_.clear();
    for (pid_t pid : pids_) {
      int status;
      waitpid(pid, &status, 0);
    }
    pids_.clear();
  }

 private:
  std::vector<pid_t> pids_;
  std::vector<int> stops_;
};

}  // namespace trnflow::bench
