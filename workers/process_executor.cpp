// Runs a `run:` stage as a real child process. The only file that includes Boost.Process.
#include <signal.h>
#include <sys/wait.h>

#include <boost/process.hpp>
#include <chrono>
#include <filesystem>
#include <thread>

#include "common/log.h"
#include "workers/executor.h"

namespace bp = boost::process;

namespace trnflow::workers {
namespace {

constexpr int kExitTempFail = 75;  // EX_TEMPFAIL: the job asks to be retried
constexpr double kGraceSeconds = 10;

std::string Substitute(std::string s, const ExecContext& ctx) {
  for (auto [expr, value] :
       {std::pair<std::string, std::string>{"${{ run.id }}", std::to_string(ctx.run_id)},
        {"${{ run.dir }}", ctx.run_dir}})
    for (size_t pos = s.find(expr); pos != std::string::npos; pos = s.find(expr, pos + value.size()))
      s.replace(pos, expr.size(), value);
  return s;
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

  boost::filesystem::path exe;
  if (argv[0].find('/') != std::string::npos) {
    std::filesystem::path p(argv[0]);
    if (p.is_relative()) p = std::filesystem::path(ctx.workdir) / p;
    exe = p.string();
  } else {
    exe = bp::search_path(argv[0]);
  }
  if (exe.empty() || !boost::filesystem::exists(exe)) {
    r.outcome = Outcome::kUserError;
    r.message = "command not found: " + argv[0] + " (looked in PATH and " + ctx.workdir + ")";
    return r;
  }

  bp::environment env = boost::this_process::environment();
  for (const auto& [k, v] : ctx.spec.command.env) env[k] = Substitute(v, ctx);
  env["TRNFLOW_RUN_ID"] = std::to_string(ctx.run_id);
  env["TRNFLOW_RUN_DIR"] = ctx.run_dir;
  env["TRNFLOW_STAGE"] = ctx.spec.name;
  env["TRNFLOW_ATTEMPT"] = std::to_string(ctx.attempt);
  env["TRNFLOW_CHECKPOINT_DIR"] = ctx.checkpoint_dir;
  env["TRNFLOW_RESUME"] = ctx.attempt > 1 ? "1" : "0";

  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(ctx.log_path).parent_path(), ec);
  std::filesystem::create_directories(ctx.checkpoint_dir, ec);
  std::filesystem::create_directories(ctx.run_dir, ec);

  auto start = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::vector<std::string> args(argv.begin() + 1, argv.end());
  std::error_code launch_ec;
  bp::child child(bp::exe = exe.string(), bp::args = args, bp::env = env,
                  bp::start_dir = ctx.workdir, bp::std_in < bp::null,
                  (bp::std_out & bp::std_err) > ctx.log_path, launch_ec);
  if (launch_ec) {
    r.outcome = Outcome::kInfraError;
    r.message = "could not start " + argv[0] + ": " + launch_ec.message();
    return r;
  }

  // Wait, while watching for a stop request or the timeout: SIGTERM, then SIGKILL after the
  // grace period.
  bool timed_out = false;
  double term_sent_at = -1;
  while (child.running(ec)) {
    bool stop = ctx.stop_reason() != StopReason::kNone;
    timed_out = timed_out || (ctx.spec.timeout_s > 0 && seconds() > ctx.spec.timeout_s);
    if ((stop || timed_out) && term_sent_at < 0) {
      ::kill(child.id(), SIGTERM);
      term_sent_at = seconds();
    } else if (term_sent_at >= 0 && seconds() - term_sent_at > kGraceSeconds) {
      child.terminate(ec);  // SIGKILL
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  child.wait(ec);
  r.sim_seconds = seconds();
  int status = child.native_exit_code();

  if (ctx.stop_reason() != StopReason::kNone) {
    r.outcome = Outcome::kCancelled;
    r.message = "stopped";
    r.lost_fraction = 1;
    return r;
  }
  if (timed_out) {
    r.outcome = Outcome::kTimeout;
    r.message = "timed out after " + std::to_string(static_cast<int>(ctx.spec.timeout_s)) + "s";
    r.lost_fraction = 1;
    return r;
  }
  if (WIFSIGNALED(status)) {
    r.outcome = Outcome::kInfraError;
    r.message = "killed by signal " + std::to_string(WTERMSIG(status));
    r.lost_fraction = 1;
    return r;
  }
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 0) {
    r.outcome = Outcome::kSucceeded;
    r.progress_to = 1;
    return r;
  }
  r.outcome = code == kExitTempFail ? Outcome::kInfraError : Outcome::kFailed;
  r.message = "exited with code " + std::to_string(code) + "; output in " + ctx.log_path;
  r.lost_fraction = 1;
  log->debug("stage={} exit={}", ctx.spec.name, code);
  return r;
}

}  // namespace trnflow::workers
