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
#include "scheduler/admission.h"
#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "pipelines/plan.h"
#include "scheduler/scheduler.h"
#include "sim/catalog.h"
#include "workers/worker.h"

namespace trnflow::cli {
namespace {

using Steady = std::chrono::steady_clock;
using schema::ToSql;

std::string StageLine(const schema::StageRow& s, size_t name_width, double speed) {
  std::string inst =
      s.instance_type + (s.instance_count > 1 ? " x" + std::to_string(s.instance_count) : "");
  std::string attempt = s.attempts ? "attempt " + std::to_string(s.attempts) : "";
  char buf[512];
  std::snprintf(buf, sizeof buf, "  %-*s  %-10s  %-20s  %-9s  %-10s  %9s  %s",
                static_cast<int>(name_width), s.name.c_str(), ToSql(s.state).c_str(), inst.c_str(),
                ToSql(s.market).c_str(), attempt.c_str(), SpentCell(s).c_str(),
                ProgressCell(s, speed).c_str());
  return buf;
}

// Why a stage is where it is, for the lines that follow a run without a terminal.
std::string StateDetail(const schema::StageRow& s, double speed) {
  using enum StageState;
  if (s.state == kRunning) {
    std::string p = ProgressCell(s, speed);
    return " (attempt " + std::to_string(s.attempts) + " on " + s.instance_type +
           (s.instance_count > 1 ? " x" + std::to_string(s.instance_count) : "") + ", " +
           ToSql(s.market) + (p.empty() ? "" : ", " + p) + ")";
  }
  // Only a budget's wait puts a stage that never had an attempt in retry_wait (migration 0033).
  if (s.state == kRetryWait && s.attempts == 0)
    return " (waiting for its budget: `trnflow explain` says for how much)";
  std::string spent = " (" + SpentCell(s) + " so far";
  if ((s.state == kRetryWait || s.state == kFailed || s.state == kCancelled) && s.last_outcome)
    return spent + "; attempt " + std::to_string(s.attempts) + " " + ToSql(*s.last_outcome) +
           (s.last_message.empty() ? "" : ": " + s.last_message) + ")";
  if (s.state == kSucceeded || s.state == kCached) return spent + ")";
  return "";
}

// Follows a run until it ends (or the user interrupts). On a terminal: one line per stage,
// redrawn in place. Otherwise: one log line per state change, and one as a running stage
// passes each quarter of its work. Either way it says when no live worker can run a ready
// stage, instead of waiting in silence.
void FollowRun(schema::Catalog& catalog, int64_t run_id, const std::atomic<bool>& interrupted) {
  bool tty = isatty(STDOUT_FILENO);
  auto start = Steady::now();
  std::map<int64_t, std::optional<StageState>> last_state;  // nullopt: not seen yet
  std::map<int64_t, int> last_quarter;
  std::map<int64_t, int> reported_end;  // per stage: attempts up to this one said how they ended
  std::map<int64_t, int> last_attempts;
  std::set<std::string> warned;
  std::vector<std::string> warnings;
  auto next_worker_check = start;
  size_t drawn = 0;
  double backoff = 0.1;
  while (true) {
    std::optional<schema::RunRow> run;
    std::vector<schema::StageRow> stages;
    try {
      run = catalog.GetRun(run_id);
      stages = catalog.GetStages(run_id);
      if (Steady::now() >= next_worker_check) {
        warnings = UnrunnableStages(catalog, run_id, stages);
        next_worker_check = Steady::now() + std::chrono::seconds(2);
      }
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
    double speed = run ? run->speed : 1;
    size_t width = 5;
    for (const auto& s : stages) width = std::max(width, s.name.size());
    double t = std::chrono::duration<double>(Steady::now() - start).count();
    if (tty) {
      std::string frame;
      if (drawn) frame += "\x1b[" + std::to_string(drawn) + "A";
      for (const auto& s : stages) frame += "\x1b[2K" + StageLine(s, width, speed) + "\n";
      char buf[200];
      std::snprintf(buf, sizeof buf,
                    "\x1b[2K  run %lld %s  %.1fs  %s spent (running attempts included)\n",
                    static_cast<long long>(run_id), run ? ToSql(run->state).c_str() : "?", t,
                    run ? run->cost.ToDollars().c_str() : "?");
      frame += buf;
      for (const auto& w : warnings) frame += "\x1b[2K  ! " + w + "\n";
      // Lines of warnings that went away are cleared, not left behind.
      size_t lines = stages.size() + 1 + warnings.size();
      for (size_t i = lines; i < drawn; ++i) frame += "\x1b[2K\n";
      std::cout << frame << std::flush;
      drawn = std::max(drawn, lines);
    } else {
      std::optional<std::vector<schema::AttemptRow>> ledger;  // read only when needed
      for (const auto& s : stages) {
        auto& prev = last_state[s.id];
        bool running = s.state == StageState::kRunning;
        int quarter = running && s.live_progress >= 0 ? static_cast<int>(s.live_progress * 4) : -1;
        bool progressed = quarter > 0 && quarter < 4 && quarter > last_quarter[s.id];
        // A state held for less than a poll (a spot interruption and its retry within 100 ms:
        // running, retry_wait, running) is not seen here; the ledger has every closed attempt,
        // so each one's end is said once, from there, unless this poll's line says it.
        int closed = s.attempts - (running ? 1 : 0);
        bool line_says_last = s.state == StageState::kRetryWait || s.state == StageState::kFailed ||
                              s.state == StageState::kCancelled ||
                              s.state == StageState::kSucceeded || s.state == StageState::kCached;
        int& ended = reported_end[s.id];
        for (int k = ended + 1; k <= closed - (line_says_last && prev != s.state ? 1 : 0); ++k) {
          if (!ledger) {
            try {
              ledger = catalog.GetAttempts(run_id);
            } catch (const CatalogUnavailable&) {
              break;  // said at the next poll
            }
          }
          for (const auto& a : *ledger) {
            if (a.stage_id != s.id || a.attempt != k || !a.outcome) continue;
            char buf[1024];
            std::snprintf(buf, sizeof buf, "[%6.1fs] %s: attempt %d %s%s\n", t, s.name.c_str(), k,
                          ToSql(*a.outcome).c_str(),
                          a.message.empty() ? "" : (": " + a.message).c_str());
            std::cout << buf;
            ended = k;
          }
          if (ended < k) break;  // not in the ledger yet: said at the next poll
        }
        if (line_says_last && prev != s.state) ended = std::max(ended, closed);
        int& seen_attempts = last_attempts[s.id];
        bool new_attempt = seen_attempts != s.attempts;
        seen_attempts = s.attempts;
        if (prev == s.state && !progressed && !(new_attempt && running)) continue;
        if (prev != s.state) last_quarter[s.id] = 0;
        if (progressed) last_quarter[s.id] = quarter;
        prev = s.state;
        char buf[1024];
        std::snprintf(buf, sizeof buf, "[%6.1fs] %s: %s%s\n", t, s.name.c_str(),
                      ToSql(s.state).c_str(), StateDetail(s, speed).c_str());
        std::cout << buf;
      }
      for (const auto& w : warnings)
        if (warned.insert(w).second) {
          char buf[32];
          std::snprintf(buf, sizeof buf, "[%6.1fs] ", t);
          std::cout << buf << "waiting: " << w << "\n";
        }
      std::cout << std::flush;
    }
    if (!run || run->state != schema::RunState::kRunning || interrupted) return;
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
  std::cout << "\n" << schema::RunSummaryTable(catalog.GetStages(run_id));
  if (run)
    std::cout << "\nrun " << run->id << " " << ToSql(run->state) << " (pipeline " << run->pipeline
              << ", project " << run->project << ") in "
              << static_cast<int>(run->wall_seconds + 0.5) << "s wall; see `trnflow show "
              << run->id << "`\n";
}

std::optional<pipelines::Pipeline> LoadForSubmit(const RunArgs& a) {
  auto pipeline = LoadOrReport(a.file, {ParseParams(a.params), a.project, CatalogStageBound()});
  if (pipeline) ApplySpotRateMultiplier(*pipeline);
  return pipeline;
}

// The run, admitted by its budget (in SQL, trnflow.admit_run) in one transaction. Throws
// Refused (exit 4, nothing written) when the budget refuses it. `hold`: this process runs its
// stages (`trnflow run`), daemon workers skip them.
int64_t AdmitAndSubmit(schema::Catalog& catalog, const pipelines::Pipeline& p, const RunArgs& a,
                       bool hold) {
  auto opts = SubmitOptionsFor(a);
  opts.force = a.force;
  opts.hold = hold;
  auto plan = scheduler::PlanForAdmission(catalog, p, &opts);
  int64_t run_id = catalog.SubmitRun(p, opts);
  if (plan && !plan->unknown_stages.empty()) {
    std::string names;
    for (const auto& n : plan->unknown_stages) names += (names.empty() ? "" : ", ") + n;
    std::cerr << "trnflow: note: the budget check counted " << names
              << " at the 60 s billing minimum: their length is unknown (give them an "
                 "`estimate:`; see `trnflow plan`)\n";
  }
  return run_id;
}

// Runs the run's stages in this process (a scheduler and a worker that takes this run only)
// while following it; returns the exit code. On Ctrl-C the stages are handed back.
int ExecuteHere(schema::Catalog& catalog, int64_t run_id, std::vector<workers::PoolConfig> pools,
                uint64_t seed, const SandboxArgs& sandbox) {
  InstallSignalHandlers();
  scheduler::SchedulerOptions so;
  so.database_url = DatabaseUrl();
  so.tick_s = 0.1;
  so.promote_every_s = 0.2;
  so.seed = seed;
  scheduler::Scheduler sched(so);
  workers::WorkerOptions wo;
  wo.database_url = DatabaseUrl();
  wo.home = HomeDir();
  wo.pools = std::move(pools);
  wo.poll_s = 0.5;
  wo.shutdown_grace_s = 2;  // Ctrl-C should not keep a person waiting
  wo.only_run = run_id;     // this process runs its own pipeline, not the whole queue
  ApplySandboxArgs(sandbox, wo);
  workers::Worker worker(wo);
  sched.Start();
  worker.Start();
  FollowRun(catalog, run_id, g_interrupted);
  worker.Stop();
  sched.Stop();
  if (g_interrupted) {
    std::cout << "\ninterrupted: run " << run_id
              << " is still running in the catalog; its stages were handed back. Continue it "
                 "here with `trnflow watch "
              << run_id
              << " --execute`, or with daemons (`trnflow worker --pool ...` and "
                 "`trnflow scheduler`), which take it over once the scheduler sees this process "
                 "has stopped.\n";
    return kExitInterrupted;
  }
  PrintRunSummary(catalog, run_id);
  auto run = catalog.GetRun(run_id);
  return run && run->state == schema::RunState::kSucceeded ? kExitOk : kExitRunFailed;
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
  int64_t run_id = AdmitAndSubmit(*catalog, *pipeline, a, /*hold=*/!a.share);
  int code;
  {
    // --format json: stdout holds only the finished run's JSON; the progress goes to stderr.
    StdoutToStderr progress_to_stderr(a.format == "json");
    std::cout << "run " << run_id << ": " << pipeline->name << " (" << pipeline->stages.size()
              << " stages, project " << (a.project.empty() ? pipeline->project : a.project)
              << ", speed " << Number(a.speed) << "x, seed " << a.seed << ")\n"
              << std::flush;
    code = ExecuteHere(*catalog, run_id, pools, static_cast<uint64_t>(a.seed), a.sandbox);
  }
  if (a.format == "json" && code != kExitInterrupted) PrintRunJson(*catalog, run_id);
  return code;
}

int CmdSubmit(const RunArgs& a) {
  auto pipeline = LoadForSubmit(a);
  if (!pipeline) return kExitBadInput;
  auto catalog = OpenCatalog();
  int64_t run_id = AdmitAndSubmit(*catalog, *pipeline, a, /*hold=*/false);
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
    throw UserError("run " + run_text + " already ended (" + ToSql(run->state) + "); nothing to cancel");
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

// Says who will run a run's stages now: the live workers that can, or how to start some.
void SayWhoRuns(schema::Catalog& catalog, int64_t run_id) {
  auto blocked = UnrunnableStages(catalog, run_id, catalog.GetStages(run_id));
  if (blocked.empty()) {
    std::cout << "live workers will pick it up; follow it with `trnflow watch " << run_id
              << "`\n";
    return;
  }
  for (const auto& b : blocked) std::cout << "! " << b << "\n";
  std::cout << "or run it in this shell: `trnflow watch " << run_id << " --execute`\n";
}

int CmdResume(const std::string& run_text) {
  int64_t run_id = ParseRunId(run_text);
  auto catalog = OpenCatalog();
  int n = catalog->ResumeRun(run_id);
  std::cout << "run " << run_id << " resumed: " << n
            << " stage(s) start again from their last checkpoint\n";
  SayWhoRuns(*catalog, run_id);
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
  SayWhoRuns(*catalog, run_id);
  return kExitOk;
}

int CmdWatch(const std::string& run_text, bool execute, const SandboxArgs& sandbox,
             const std::string& format) {
  int64_t run_id = ParseRunId(run_text);
  auto catalog = OpenCatalog();
  auto run = catalog->GetRun(run_id);
  if (!run) throw UserError("no run " + run_text + "; `trnflow runs` lists them");
  int code;
  {
    // --format json: stdout holds only the finished run's JSON; the progress goes to stderr.
    StdoutToStderr progress_to_stderr(format == "json");
    if (execute) {
      if (run->state != schema::RunState::kRunning)
        throw UserError("run " + run_text + " has ended (" + ToSql(run->state) +
                        "); `trnflow resume " + run_text + "` first to run what failed again");
      catalog->RequireStageRunner("`trnflow watch --execute`");
      // Pools wide enough for every stage of the run, as `run` gives a fresh pipeline.
      std::map<std::string, int> cap;
      for (const auto& s : catalog->GetStages(run_id))
        if (const auto* t = sim::Catalog::Builtin().FindInstance(s.instance_type))
          cap[t->pool] = std::max({cap[t->pool], 16, s.instance_count});
      std::vector<workers::PoolConfig> pools;
      for (const auto& [name, n] : cap) pools.push_back({name, n});
      code = ExecuteHere(*catalog, run_id, pools, static_cast<uint64_t>(run->seed), sandbox);
    } else {
      InstallSignalHandlers();
      FollowRun(*catalog, run_id, g_interrupted);
      if (g_interrupted) return kExitInterrupted;  // the run goes on; only watching stopped
      PrintRunSummary(*catalog, run_id);
      run = catalog->GetRun(run_id);
      code = run && run->state == schema::RunState::kSucceeded ? kExitOk : kExitRunFailed;
    }
  }
  if (format == "json" && code != kExitInterrupted) PrintRunJson(*catalog, run_id);
  return code;
}

}  // namespace trnflow::cli
