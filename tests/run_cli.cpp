#include "tests/run_cli.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tests/test_db.h"

namespace trnflow::testing {

std::string CliHome() {
  // Named by the pid alone: a test writes it into a pipeline.
  static const std::string home = ProcessDir("trnflow-cli-home", false);
  return home;
}

CliResult RunShell(const std::string& command) {
  CliResult r;
  FILE* p = popen(command.c_str(), "r");
  std::array<char, 4096> buf;
  size_t got;
  while ((got = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), got);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

CliResult Sh(const std::string& command) {
  return RunShell(command.find("2>") == std::string::npos ? command + " 2>&1" : command);
}

std::string ShOutput(const std::string& command, int* status) {
  CliResult r = Sh(command);
  if (status) *status = r.exit_code;
  while (!r.out.empty() && r.out.back() == '\n') r.out.pop_back();
  return r.out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

CliResult RunTrnflow(const std::string& args, const std::string& env) {
  static int n = 0;
  auto tmp = std::filesystem::temp_directory_path();
  std::string err_file =
      tmp / ("trnflow-cli-" + std::to_string(getpid()) + "-" + std::to_string(++n));
  std::string home = CliHome();
  std::string cmd = "cd '" TRNFLOW_SOURCE_DIR "' && TRNFLOW_HOME='" + home + "' " + env + " '" +
                    TRNFLOW_BINARY "' " + args + " 2>'" + err_file + "'";
  CliResult r = RunShell(cmd);
  std::ifstream in(err_file);
  r.err.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  std::filesystem::remove(err_file);
  return r;
}

std::string WriteTempFile(const std::string& name, const std::string& text) {
  auto path = std::filesystem::temp_directory_path() / (std::to_string(getpid()) + "-" + name);
  std::ofstream(path) << text;
  return path.string();
}

std::string JobVisibleDir(const std::string& name) {
  namespace fs = std::filesystem;
  fs::path build = fs::path(TRNFLOW_BINARY).parent_path();
  fs::path source = TRNFLOW_SOURCE_DIR;
  if (build.string().rfind(source.string() + "/", 0) != 0) {
    std::fprintf(stderr, "the build tree %s is not inside the source tree %s: jobs cannot see "
                 "test scripts there\n", build.c_str(), source.c_str());
    std::abort();
  }
  static const fs::path root = build / "test-jobs" / std::to_string(getpid());
  static struct Cleanup {
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(root, ec);
    }
  } cleanup;
  fs::path dir = root / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (fs::path p = dir; p != build; p = p.parent_path()) fs::permissions(p, fs::perms(0755));
  return dir.string();
}

}  // namespace trnflow::testing
