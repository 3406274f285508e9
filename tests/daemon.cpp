#include "tests/daemon.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <random>

extern char** environ;

namespace trnflow::testing {

namespace {
const std::string* g_log_dir = nullptr;  // never destroyed: the exit handler reads it
}

std::string DaemonLogDir() {
  // Fresh for every process (pid and a random suffix), removed at exit unless
  // TRNFLOW_TEST_KEEP_HOME is set: pids are reused, and a log left by an earlier process with
  // the same pid once gave a test its "listening on" line, with that process's port.
  static const bool made = [] {
    std::random_device random;
    auto p = std::filesystem::temp_directory_path() /
             ("trnflow-daemons-" + std::to_string(getpid()) + "-" + std::to_string(random()));
    std::filesystem::create_directories(p);
    g_log_dir = new std::string(p.string());
    if (!std::getenv("TRNFLOW_TEST_KEEP_HOME"))
      std::atexit([] {
        std::error_code ec;
        std::filesystem::remove_all(*g_log_dir, ec);
      });
    return true;
  }();
  (void)made;
  return *g_log_dir;
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
