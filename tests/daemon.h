#pragma once
// A `trnflow` daemon (worker, scheduler) as a real child process, as an operator runs it: its
// output goes to <DaemonLogDir()>/<name>.log, and it is SIGKILLed when the object goes away.
#include <sys/types.h>

#include <string>
#include <vector>

namespace trnflow::testing {

// Where daemons' logs go for this test process (created on first use).
std::string DaemonLogDir();

class Daemon {
 public:
  // `env`: extra VAR=value entries for this daemon's environment (e.g. its TRNFLOW_HOME).
  Daemon(std::string name, std::vector<std::string> args, std::vector<std::string> env = {})
      : name_(std::move(name)), args_(std::move(args)), env_(std::move(env)) {}
  ~Daemon() { Kill(9); }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  void Start();  // fails the test if it cannot spawn
  // Sends `sig`; for SIGKILL and SIGTERM also waits for the process to end.
  void Kill(int sig);
  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  std::string log_path() const { return DaemonLogDir() + "/" + name_ + ".log"; }

 private:
  std::string name_;
  std::vector<std::string> args_;
  std::vector<std::string> env_;
  pid_t pid_ = -1;
};

}  // namespace trnflow::testing
