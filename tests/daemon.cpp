#include "tests/daemon.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "tests/test_db.h"

extern char** environ;

namespace trnflow::testing {

std::string DaemonLogDir() {
  static const std::string dir = ProcessDir("trnflow-daemons");
  return dir;
}

void Daemon::Start() {
  std::vector<std::string> argv = {TRNFLOW_BINARY};
  argv.insert(argv.end(), args_.begin(), args_.end());
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  std::vector<std::string> env_text = env_;
  for (char** e = environ; *e; ++e) env_text.push_back(*e);  // ours first: they win
  std::vector<char*> cenv;
  for (auto& e : env_text) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  std::string log = log_path();
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  ASSERT_EQ(posix_spawn(&pid_, TRNFLOW_BINARY, &fa, nullptr, cargv.data(), cenv.data()), 0);
  posix_spawn_file_actions_destroy(&fa);
}

void Daemon::Kill(int sig) {
  if (pid_ <= 0) return;
  ::kill(pid_, sig);
  if (sig == SIGKILL || sig == SIGTERM) {
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
}

}  // namespace trnflow::testing
