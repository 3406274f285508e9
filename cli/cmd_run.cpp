// trnflow run / submit / watch, and the live progress view they share.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "pipelines/plan.h"
#include "scheduler/scheduler.h"
#include "workers/worker.h"

namespace trnflow::cli {
namespace {

using Steady = std::chrono::steady_clock;

std::string StageLine(const schema::StageRow& s, size_t name_width) {
  std::string inst =
      s.instance_type + (s.instance_count > 1 ? " x" + std::to_string(s.instance_count) : "");
  double cost = s.cost.usd() + s.running_cost_usd;
  std::string attempt = s.attempts ? "attempt " + std::to_string(s.attempts) : "";
  char buf[512];
  std::snprintf(buf, sizeof buf, "  %-*s  %-10s  %-20s  %-9s  %-10s  $%.2f",
                static_cast<int>(name_width), s.name.c_str(), s.state.c_str(), inst.c_str(),
                s.market.c_str(), attempt.c_str(), cost);
  return buf;
}

// Follows a run until it ends (or the user interrupts). On a terminal: one line per stage,
// redrawn in place. Otherwise: one log line per state change.
void FollowRun(schema::Catalog& catalog, int64_t run_id, const std::atomic<bool>& interrupted) {
  bool tty = isatty(STDOUT_FILENO);
  auto start = Steady::now();
  std::map<int64_t, std::string> last_state;
  size_t drawn = 0;
  double backoff = 0.1;
  while (true) {
    std::optional<schema::RunRow> run;
    std::vector<schema::StageRow> stages;
    try {
      run = catalog.GetRun(run_id);
      stages = catalog.GetStages(run_id);
      backoff = 0.1;
    } catch (const CatalogUnavailable& e) {
      // The workers and scheduler ride out a PostgreSQL restart; so does the view.
      if (interrupted) return;
      Logger("cli")->warn("{}; retrying in {:.1f}s", e.what(), backoff);
      std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
      backoff = std::min(backoff * 2, 5.0);
      try {
        catalog.Reconnect();
      } catch (const CatalogUnavailable&) {
      }
      continue;
    }
    size_t width = 5;
    for (const auto& s : stages) width = std::max(width, s.name.size());
    double t = std::chrono::duration<double>(Steady::now() - start).count();
    if (tty) {
      std::string frame;
      if (drawn) frame += "\x1b[" + std::to_string(drawn) + "A";
      for (const auto& s : stages) frame += "\x1b[2K" + StageLine(s, width) + "\n";
      Money total;
      double running = 0;
      for (const auto& s : stages) total += s.cost, running += s.running_cost_usd;
      char buf[160];
      std::snprintf(buf, sizeof buf, "\x1b[2K  run %lld %s  %.1fs  $%.2f so far\n",
                    static_cast<long long>(run_id), run ? run->state.c_str() : "?", t,
                    total.usd() + running);
      frame += buf;
      std::cout << frame << std::flush;
      drawn = stages.size() + 1;
    } else {
      for (const auto& s : stages) {
        auto& prev = last_state[s.id];
        if (prev == s.state) continue;
        prev = s.state;
        char buf[512];
        std::string detail;
        if (s.state == "running")
          detail = " (attempt " + std::to_string(s.attempts) + " on " + s.instance_type +
                   (s.instance_count > 1 ? " x" + std::to_string(s.instance_count) : "") + ", " +
                   s.market + ")";
        else if (s.state == "succeeded" || s.state == "failed" || s.state == "retry_wait")
          detail = " (" + s.cost.ToDollars() + " so far)";
        std::snprintf(buf, sizeof buf, "[%6.1fs] %s: %s%s\n", t, s.name.c_str(), s.state.c_str(),
                      detail.c_str());
        std::cout << buf;
      }
      std::cout << std::flush;
    }
    if (!run || run->state != "running" || interrupted) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(tty ? 200 : 100));
  }
}

std::vector<workers::PoolConfig> PoolsFor(const pipelines::Pipeline& p,
                                          const std::vector<std::string>& overrides) {
  // Enough capacity in each pool used by the pipeline to run its widest fan-out at once.
  std::map<std::string, int> cap;
  for (const auto& s : p.stages) cap[s.pool] = std::max({cap[s.pool], 16, s.spec.count});
  for (const auto& o : overrides) {
    auto eq = o.find('=');
    if (eq == std::string::npos) throw UserError("--pool " + o + ": expected NAME=N, e.g. trn1=4");
    int n = 0;
    try {
      n = std::stoi(o.substr(eq + 1));
    } catch (const std::exception&) {
    }
    if (n <= 0 || n > 100000)
      throw UserError("--pool " + o + ": N must be a number of instances from 1 to 100000");
    CheckPoolName(o.substr(0, eq), "--pool " + o);
    cap[o.substr(0, eq)] = n;
  }
  std::vector<workers::PoolConfig> pools;
  for (const auto& [name, n] : cap) pools.push_back({name, n});
  return pools;
}

// TRNFLOW_SPOT_RATE_MULTIPLIER scales the pipeline's own simulation.spot_rate_multiplier, so
// demos and tests can see interruptions without editing files.
void ApplySpotRateMultiplier(pipelines::Pipeline& p) {
  const char* env = std::getenv("TRNFLOW_SPOT_RATE_MULTIPLIER");
  if (!env || !*env) return;
  char* end = nullptr;
  double m = std::strtod(env, &end);
  if (*end != '\0' || !(m >= 0) || m > 1e6)
    throw UserError(std::string("TRNFLOW_SPOT_RATE_MULTIPLIER=") + env +
                    ": expected a number from 0 to 1000000");
  p.spot_rate_multiplier *= m;
}

schema::SubmitOptions SubmitOptionsFor(const RunArgs& a) {
  if (!(a.speed > 0)) throw UserError("--speed must be a positive number");
  schema::SubmitOptions o;
  o.project = a.project;
  o.speed = a.speed;
  o.seed = a.seed;
  o.workdir = std::filesystem::current_path().string();
  o.retry_failed_compilation = a.retry_failed_compilation;
  return o;
}

}  // namespace

void PrintRunSummary(schema::Catalog& catalog, int64_t run_id) {
  auto run = catalog.GetRun(run_id);
  auto stages = catalog.GetStages(run_id);
  std::vector<std::vector<std::string>> rows;
  Money total;
  int64_t billed = 0;
  for (const auto& s : stages) {
    rows.push_back({s.name, s.state, std::to_string(s.attempts),
                    s.instance_type + " x" + std::to_string(s.instance_count), s.market,
                    Hours(static_cast<double>(s.billed_seconds)), s.cost.ToDollars()});
    total += s.cost;
    billed += s.billed_seconds;
  }
  rows.push_back({"total", "", "", "", "", "", total.ToDollars()});
  std::cout << "\n"
            << Table({"STAGE", "STATE", ">ATTEMPTS", "INSTANCE", "MARKET", ">SIM HOURS", ">COST"},
                     rows);
  if (run)
    std::cout << "\nrun " << run->id << " " << run->state << " (pipeline " << run->pipeline
              << ", project " << run->project << ") in "
              << static_cast<int>(run->wall_seconds + 0.5) << "s wall; see `trnflow show "
              << run->id << "`\n";
}

// The file, validated (diagnostics printed), with the environment's spot rate applied;
// nullopt when it has errors.
std::optional<pipelines::Pipeline> LoadForSubmit(const RunArgs& a) {
  auto pipeline = LoadOrReport(a.file, {ParseParams(a.params), a.project});
  if (pipeline) ApplySpotRateMultiplier(*pipeline);
  return pipeline;
}

// Budget admission, then the run in one transaction. Throws Refused (nothing written) when
// the budget refuses it.
int64_t AdmitAndSubmit(schema::Catalog& catalog, const pipelines::Pipeline& p, const RunArgs& a) {
  auto opts = SubmitOptionsFor(a);
  AdmitOrRefuse(catalog, p, pipelines::MakePlan(p).total_cost,
                a.project.empty() ? p.project : a.project, a.force);
  return catalog.SubmitRun(p, opts);
}

int CmdRun(const RunArgs& a) {
  auto pipeline = LoadForSubmit(a);
  if (!pipeline) return kExitBadInput;
  auto pools = PoolsFor(*pipeline, a.pools);
  {
    workers::WorkerOptions flags_only;  // a malformed --job-limits submits nothing
    ApplySandboxArgs(a.sandbox, flags_only);
  }
  auto catalog = OpenCatalog();
  catalog->RequireStageRunner("`trnflow run`");  // before anything is submitted
  int64_t run_id = AdmitAndSubmit(*catalog, *pipeline, a);
  // --format json: stdout holds only the finished run's JSON; the progress goes to stderr.
  std::optional<StdoutToStderr> progress_to_stderr;
  progress_to_stderr.emplace(a.format == "json");
  std::cout << "run " << run_id << ": " << pipeline->name << " (" << pipeline->stages.size()
            << " stages, project " << (a.project.empty() ? pipeline->project : a.project)
            << ", speed " << Number(a.speed) << "x, seed " << a.seed << ")\n"
            << std::flush;

  InstallSignalHandlers();
  scheduler::SchedulerOptions so;
  so.database_url = DatabaseUrl();
  so.tick_s = 0.1;
  so.promote_every_s = 0.2;
  so.seed = static_cast<uint64_t>(a.seed);
  scheduler::Scheduler sched(so);
  workers::WorkerOptions wo;
  wo.database_url = DatabaseUrl();
  wo.home = HomeDir();
  wo.pools = pools;
  wo.poll_s = 0.5;
  wo.shutdown_grace_s = 2;  // Ctrl-C should not keep a person waiting
  wo.only_run = run_id;     // this process runs its own pipeline, not the whole queue
  ApplySandboxArgs(a.sandbox, wo);
  workers::Worker worker(wo);
  sched.Start();
  worker.Start();
  FollowRun(*catalog, run_id, g_interrupted);
  worker.Stop();
  sched.Stop();
  if (g_interrupted) {
    std::cout << "\ninterrupted: run " << run_id
              << " is still running in the catalog; its stages were handed back. Continue it "
                 "with `trnflow worker` and `trnflow scheduler`, or `trnflow watch "
              << run_id << "`.\n";
    return kExitInterrupted;
  }
  PrintRunSummary(*catalog, run_id);
  progress_to_stderr.reset();
  if (a.format == "json") PrintRunJson(*catalog, run_id);
  auto run = catalog->GetRun(run_id);
  return run && run->state == "succeeded" ? kExitOk : kExitRunFailed;
}

int CmdSubmit(const RunArgs& a) {
  auto pipeline = LoadForSubmit(a);
  if (!pipeline) return kExitBadInput;
  auto catalog = OpenCatalog();
  int64_t run_id = AdmitAndSubmit(*catalog, *pipeline, a);
  if (a.format == "json")
    std::cout << nlohmann::json{{"run_id", std::to_string(run_id)}}.dump() << "\n";
  else
    std::cout << run_id << "\n";
  return kExitOk;
}

int CmdCancel(const std::string& run_text) {
  int64_t run_id = ParseRunId(run_text);
  auto catalog = OpenCatalog();
  auto run = catalog->GetRun(run_id);
  if (!run) throw UserError("no run " + run_text + "; `trnflow runs` lists them");
  auto report = catalog->CancelRun(run_id);
  if (!report.cancelled)
    throw UserError("run " + run_text + " already ended (" + run->state + "); nothing to cancel");
  std::cout << "run " << run_id << " cancelled: " << report.stages_cancelled
            << " pending stages cancelled";
  if (report.stages_running == 0) {
    std::cout << "\n";
    return kExitOk;
  }
  std::cout << ", stopping " << report.stages_running << " running\n" << std::flush;
  // Workers stop them within a heartbeat (at once, when they hear the notify).
  auto deadline = Steady::now() + std::chrono::seconds(30);
  while (Steady::now() < deadline && catalog->CountRunningStages(run_id) > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  int left = catalog->CountRunningStages(run_id);
  if (left == 0)
    std::cout << "all stages stopped\n";
  else
    std::cout << left
              << " stage(s) still running: their workers are unreachable; the "
                 "scheduler ends them when their leases expire\n";
  return kExitOk;
}

int CmdResume(const std::string& run_text) {
  int64_t run_id = ParseRunId(run_text);
  auto catalog = OpenCatalog();
  int n = catalog->ResumeRun(run_id);
  std::cout << "run " << run_id << " resumed: " << n
            << " stage(s) start again from their last checkpoint; daemons or `trnflow watch "
            << run_id << "` take it from here\n";
  return kExitOk;
}

int CmdRetry(const std::string& run_text, const std::string& stage) {
  int64_t run_id = ParseRunId(run_text);
  auto catalog = OpenCatalog();
  if (catalog->GetRun(run_id)) {  // a typo gets the closest stage (the catalog says the rest)
    std::vector<std::string> names;
    bool known = false;
    for (const auto& s : catalog->GetStages(run_id)) {
      std::string base = s.name.substr(0, s.name.find('['));
      known = known || s.name == stage || base == stage;
      names.push_back(base);
    }
    if (!known && !pipelines::ClosestMatch(stage, names).empty())
      throw UserError("run " + run_text + " has no stage '" + stage + "'" +
                      NameHint(stage, names, ""));
  }
  int n = catalog->RetryStage(run_id, stage);
  std::cout << "run " << run_id << ": " << stage << " and what depends on it (" << n
            << " stage(s)) will run again\n";
  return kExitOk;
}

int CmdWatch(const std::string& run_text, const std::string& format) {
  int64_t run_id = ParseRunId(run_text);
  auto catalog = OpenCatalog();
  if (!catalog->GetRun(run_id))
    throw UserError("no run " + run_text + "; `trnflow runs` lists them");
  InstallSignalHandlers();
  {
    StdoutToStderr progress_to_stderr(format == "json");
    FollowRun(*catalog, run_id, g_interrupted);
    if (g_interrupted) return kExitInterrupted;  // the run goes on; only watching stopped
    PrintRunSummary(*catalog, run_id);
  }
  if (format == "json") PrintRunJson(*catalog, run_id);
  auto run = catalog->GetRun(run_id);
  return run && run->state == "succeeded" ? kExitOk : kExitRunFailed;
}

}  // namespace trnflow::cli
