#pragma once
// Runs the built `trnflow` binary as a user would: from the source tree, as a real child
// process, with its own TRNFLOW_HOME.
#include <string>

namespace trnflow::testing {

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// The TRNFLOW_HOME RunTrnflow gives the commands (daemons that should share it take it too).
std::string CliHome();

// `env` is prepended to the command line: "VAR=value VAR2=value" or a wrapper like "timeout 60".
CliResult RunTrnflow(const std::string& args, const std::string& env = "");

// Runs `command` under /bin/sh and returns its stdout (add 2>&1 to keep stderr) and exit code.
CliResult RunShell(const std::string& command);

// `command` under /bin/sh with its stderr in its output, unless the command sends its stderr
// elsewhere itself ("2>" in it).
CliResult Sh(const std::string& command);
// Sh's output without its trailing newlines; its exit code in `*status` when given.
std::string ShOutput(const std::string& command, int* status = nullptr);

// A whole file's bytes; "" when it cannot be read.
std::string ReadFile(const std::string& path);

// Writes `text` to a fresh file in the temp directory and returns its path.
std::string WriteTempFile(const std::string& name, const std::string& text);

// A fresh, empty directory (0755) that jobs can read: under the build tree, inside the source
// tree that RunTrnflow runs commands from (their workdir, the only part of the host's files
// besides the system that a job's namespaces show, read-only). For scripts a test's pipeline
// runs by path. Removed at the end of the test process.
std::string JobVisibleDir(const std::string& name);

}  // namespace trnflow::testing
