// Money under faults, with real processes on a real PostgreSQL: workers, schedulers and
// `trnflow run` killed with SIGKILL at random points of budgeted runs — during claims,
// mid-attempt, during completion, around cancels and budget stops. After each scenario:
//   - no attempt of a cancelled run starts after the cancel;
//   - no budget stop that the final ledger does not justify;
//   - the live figure ("spent so far") never ran ahead of the final bill;
//   - ledger = views = CLI (= the dashboard's /api, the same JSON) = /metrics to the cent.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "common/money.h"
#include "pipelines/pipeline.h"
#include "scheduler/scheduler.h"
#include "schema/catalog.h"
#include "schema/catalog_testing.h"
#include "tests/daemon.h"
#include "tests/run_cli.h"
#include "tests/test_db.h"
#include "tests/test_engine.h"

namespace trnflow {
namespace {

using testing::Daemon;
using testing::TestDatabase;
using testing::WaitFor;

std::string Q(schema::Catalog& c, const std::string& sql) {
  return schema::testing::QueryValue(c, sql);
}

Money Usd(const std::string& text) {
  Money m;
  if (text.empty()) return m;
  EXPECT_TRUE(Money::Parse(text.substr(0, text.find('.') + 7), &m)) << text;
  return m;
}

Money RunSpent(schema::Catalog& c, int64_t run) {
  return Usd(Q(c, "SELECT round(trnflow.run_spent_usd(" + std::to_string(run) + "), 6)"));
}

int64_t Submit(schema::Catalog& c, const std::string& yaml, double speed, int64_t seed = 1,
               bool hold = false) {
  auto r = pipelines::ParsePipeline(yaml, "faults.yaml", {});
  EXPECT_TRUE(r.pipeline) << r.diagnostics.Format();
  schema::SubmitOptions o = testing::FastSubmit(speed);
  o.seed = seed;
  o.hold = hold;
  return c.SubmitRun(*r.pipeline, o);
}

std::unique_ptr<Daemon> Worker(const std::string& name, const std::string& lease) {
  return std::make_unique<Daemon>(
      name, std::vector<std::string>{"worker", "--pool", "trn1=8", "--pool", "cpu=4", "--lease",
                                     lease},
      std::vector<std::string>{"TRNFLOW_HOME=" + testing::CliHome()});
}

// A week of trn1.32xlarge spot training, checkpointing hourly: at 3600x, ~$6.45 a wall second.
std::string Training(const std::string& project, const std::string& budget_usd = "") {
  return "pipeline: pricey\nproject: " + project + "\n" +
         (budget_usd.empty() ? "" : "budget_usd: " + budget_usd + "\n") +
         "stages:\n"
         "  train: {kind: train, instance: trn1.32xlarge, model: llama-2-7b, tokens: 2e10, "
         "market: spot, checkpoint: {every: 1h}}\n"
         "  after:\n    run: [\"true\"]\n    needs: [train]\n";
}

// The invariants of the money, whatever was killed.
void ExpectMoneyExact(schema::Catalog& c, const std::string& project,
                      const std::map<int64_t, Money>& max_live) {
  std::string p = "'" + project + "'";
  ASSERT_EQ(Q(c, "SELECT count(*) FROM trnflow.open_attempts o JOIN trnflow.runs r "
                 "ON r.id = o.run_id WHERE r.project = " + p),
            "0");
  // No attempt of a cancelled run started after its cancel.
  EXPECT_EQ(Q(c, "SELECT count(*) FROM trnflow.attempts a JOIN trnflow.runs r ON r.id = a.run_id"
                 " WHERE r.project = " + p +
                 " AND r.state = 'cancelled' AND a.started_at > r.finished_at"),
            "0")
      << "an attempt of a cancelled run started after the cancel";
  EXPECT_EQ(Q(c, "SELECT count(*) FROM trnflow.stages s JOIN trnflow.runs r ON r.id = s.run_id"
                 " WHERE r.project = " + p +
                 " AND r.state = 'cancelled' AND s.state IN ('ready', 'retry_wait', 'running')"),
            "0")
      << "a stage of a cancelled run is still queued";
  // A run stopped over its own budget had spent it, by the final ledger.
  EXPECT_EQ(Q(c, "SELECT count(*) FROM trnflow.runs r WHERE r.project = " + p +
                 " AND r.cancel_reason = 'budget_exceeded' AND r.budget_usd IS NOT NULL"
                 " AND NOT EXISTS (SELECT 1 FROM trnflow.budgets b WHERE b.project = r.project)"
                 " AND (SELECT coalesce(sum(cost_usd), 0) FROM trnflow.attempts a"
                 "      WHERE a.run_id = r.id) < r.budget_usd"),
            "0")
      << "a budget stop the ledger does not justify";
  // A project stopped over its budget had spent it too.
  EXPECT_EQ(Q(c, "SELECT count(*) FROM trnflow.budgets b WHERE b.project = " + p +
                 " AND EXISTS (SELECT 1 FROM trnflow.runs r WHERE r.project = b.project"
                 "             AND r.cancel_reason = 'budget_exceeded' AND r.budget_usd IS NULL)"
                 " AND trnflow.project_spent_usd(b.project, '-infinity') < b.amount_usd"),
            "0")
      << "a project budget stop the ledger does not justify";
  // The live figure never ran ahead of the bill.
  for (const auto& [run, live] : max_live) {
    Money final = RunSpent(c, run);
    EXPECT_LE(live, final) << "run " << run << " showed " << live.ToDecimal()
                           << " live, billed " << final.ToDecimal();
  }
  // Ledger = views = CLI (and the dashboard's /api/runs, the same JSON) = /metrics.
  Money ledger = Usd(Q(c, "SELECT coalesce(sum(a.cost_usd), 0) FROM trnflow.attempts a JOIN "
                          "trnflow.runs r ON r.id = a.run_id WHERE r.project = " + p));
  EXPECT_EQ(Usd(Q(c, "SELECT coalesce(sum(cost_usd), 0) FROM trnflow.spend_by_run WHERE project = " +
                      p)),
            ledger);
  EXPECT_EQ(Usd(Q(c, "SELECT coalesce(sum(cost_usd), 0) FROM trnflow.spend_daily WHERE project = " +
                      p)),
            ledger);
  auto cli = testing::RunTrnflow("runs --project " + project + " --limit 1000 --format json");
  ASSERT_EQ(cli.exit_code, 0) << cli.err;
  int64_t cli_micros = 0;
  for (const auto& r : nlohmann::json::parse(cli.out))
    cli_micros += std::llround(r["cost_usd"].get<double>() * 1e6);
  EXPECT_EQ(cli_micros, ledger.micros()) << "`trnflow runs` against the ledger";
  double metric = 0;
  for (const auto& m : c.Metrics())
    if (m.name == "trnflow_spend_usd_total" &&
        nlohmann::json::parse(m.labels_json).value("project", "") == project)
      metric += m.value;
  EXPECT_EQ(std::llround(metric * 100), (ledger.micros() + 5000) / 10000) << "/metrics, to the cent";
}

}  // namespace

// The bill has one rule: SQL's charge_usd (live figures, admission) is C++'s Charge (the
// ledger), to the micro-dollar.
TEST(MoneyFaults, SqlAndCppChargeTheSame) {
  schema::Catalog c(TestDatabase::url());
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200; ++i) {
    Money price = Money::FromMicros(static_cast<int64_t>(rng() % 120'000'000));
    int count = 1 + static_cast<int>(rng() % 64);
    double seconds = static_cast<double>(rng() % 10'000'000) / 997.0;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", seconds);
    std::string sql = "SELECT trnflow.charge_usd(" + price.ToDecimal() + ", " + std::to_string(count) +
          ", " + buf + "::float8)";
    ASSERT_EQ(Usd(Q(c, sql)), Charge(price, count, std::strtod(buf, nullptr)))
        << price.ToDecimal() << " x" << count << " for " << buf << " s";
  }
}

// The scenario of the report: a worker killed two seconds into a budgeted run, the run then
// cancelled. While nobody has rescued the attempt, its spend stays at its last heartbeat (no
// budget event, no stop); the rescue bills exactly that and ends the stage cancelled; nothing
// of the run is claimed again; `resume` works at once.
TEST(MoneyFaults, ADeadWorkersAttemptStopsSpendingAndItsCancelledRunStaysCancelled) {
  schema::Catalog c(TestDatabase::url());
  c.SetBudget("deadworker", Money::FromUsd(150), "month");
  int64_t run = Submit(c, Training("deadworker"), 3600);
  std::string r = std::to_string(run);
  auto worker = Worker("dead-worker", "10");  // heartbeats every 2 s; lease lapses after 10 s
  worker->Start();
  ASSERT_TRUE(WaitFor(
      [&] {
        return Q(c, "SELECT count(*) FROM trnflow.stages WHERE run_id = " + r +
                        " AND state = 'running' AND heartbeat_at > attempt_started_at"
                        " + interval '1.5 seconds'") == "1";
      },
      30));
  worker->Kill(SIGKILL);
  Money at_death = RunSpent(c, run);
  EXPECT_GT(at_death, Money());
  // The scheduler's guard and rescuer run; the lease has not lapsed yet.
  scheduler::Scheduler sched(testing::TestSchedulerOptions());
  sched.Start();
  for (int i = 0; i < 10; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (Q(c, "SELECT count(*) FROM trnflow.open_attempts WHERE run_id = " + r) == "0") break;
    EXPECT_EQ(RunSpent(c, run), at_death) << "a dead worker's attempt kept spending";
  }
  EXPECT_EQ(Q(c, "SELECT state FROM trnflow.runs WHERE id = " + r), "running")
      << "the run was stopped over a budget it had not spent";
  EXPECT_EQ(Q(c, "SELECT count(*) FROM trnflow.events WHERE kind = 'budget' AND project = "
                 "'deadworker'"),
            "0");
  c.CancelRun(run);
  ASSERT_TRUE(WaitFor(
      [&] { return Q(c, "SELECT count(*) FROM trnflow.attempts WHERE run_id = " + r) == "1"; },
      30))
      << "the rescuer never closed the lost attempt";
  EXPECT_EQ(Q(c, "SELECT outcome FROM trnflow.attempts WHERE run_id = " + r), "lost");
  EXPECT_EQ(Usd(Q(c, "SELECT cost_usd FROM trnflow.attempts WHERE run_id = " + r)), at_death)
      << "the bill is what the live figure showed";
  EXPECT_EQ(Q(c, "SELECT string_agg(state, ',' ORDER BY id) FROM trnflow.stages WHERE run_id = " +
                     r),
            "cancelled,cancelled");
  // A fresh worker takes nothing of the cancelled run.
  auto fresh = Worker("fresh-worker", "10");
  fresh->Start();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_EQ(Q(c, "SELECT count(*) FROM trnflow.attempts WHERE run_id = " + r), "1");
  EXPECT_EQ(Q(c, "SELECT count(*) FROM trnflow.stages WHERE run_id = " + r +
                     " AND state = 'running'"),
            "0");
  fresh->Kill(SIGKILL);
  sched.Stop();
  ExpectMoneyExact(c, "deadworker", {{run, at_death}});
  EXPECT_GT(c.ResumeRun(run), 0) << "resume works at once";
}

// A `trnflow run` killed mid-run: `show` and `explain` say within a lease that the process
// running it is gone and name the command that continues it; daemon workers did not take its
// stages while it lived.
TEST(MoneyFaults, AKilledTrnflowRunExplainsItselfAndItsRunWasItsOwn) {
  schema::Catalog c(TestDatabase::url());
  std::string file = testing::WriteTempFile(
      "held.yaml",
      "pipeline: held\nproject: held\nstages:\n"
      "  train: {kind: train, instance: trn1.32xlarge, model: llama-2-7b, tokens: 2e10, "
      "market: spot, checkpoint: {every: 1h}}\n");
  auto daemon_worker = Worker("held-daemon-worker", "5");
  daemon_worker->Start();
  Daemon run_proc("trnflow-run", {"run", file, "--pool", "trn1=1"},
                  {"TRNFLOW_HOME=" + testing::CliHome()});
  run_proc.Start();
  std::string run;
  ASSERT_TRUE(WaitFor(
      [&] {
        run = Q(c, "SELECT coalesce(max(r.id)::text, '') FROM trnflow.runs r JOIN "
                   "trnflow.stages s ON s.run_id = r.id WHERE r.project = 'held' AND "
                   "s.state = 'running'");
        return !run.empty();
      },
      30));
  EXPECT_EQ(Q(c, "SELECT w.only_run::text FROM trnflow.stages s JOIN trnflow.workers w ON "
                 "w.id = s.lease_owner WHERE s.run_id = " + run),
            run)
      << "a daemon worker took a stage of a run that `trnflow run` executes";
  run_proc.Kill(SIGKILL);
  std::string said;
  EXPECT_TRUE(WaitFor(
      [&] {
        said = testing::RunTrnflow("show " + run).out;
        return said.find("is gone") != std::string::npos;
      },
      25))
      << said;
  EXPECT_NE(said.find("trnflow watch " + run + " --execute"), std::string::npos) << said;
  auto explain = testing::RunTrnflow("explain " + run + " train");
  EXPECT_NE(explain.out.find("is gone"), std::string::npos) << explain.out;
  // The daemon worker never took it, though it was idle all along.
  EXPECT_EQ(Q(c, "SELECT count(*) FROM trnflow.attempts a JOIN trnflow.workers w ON "
                 "w.id = a.worker_id WHERE a.run_id = " + run + " AND w.only_run IS NULL"),
            "0");
  // The worker list shows the dead process as dead, and forgets it on request.
  auto workers = nlohmann::json::parse(testing::RunTrnflow("workers --format json").out);
  bool dead = false;
  for (const auto& w : workers)
    dead = dead || (w["only_run_id"] == run && w["state"] == "dead");
  EXPECT_TRUE(dead) << workers.dump();
  EXPECT_EQ(testing::RunTrnflow("workers forget").exit_code, 0);
  EXPECT_EQ(Q(c, "SELECT count(*) FROM trnflow.workers WHERE only_run = " + run), "0");
  daemon_worker->Kill(SIGKILL);
  c.CancelRun(std::stoll(run));
}

// Random SIGKILLs of workers and the leading scheduler over budgeted runs, with cancels and
// budget stops among them; then the money must be exact.
TEST(MoneyFaults, RandomKillsAroundCancelsAndBudgetStopsKeepTheMoneyExact) {
  schema::Catalog c(TestDatabase::url());
  const std::string project = "faults";
  c.SetBudget(project, Money::FromUsd(400), "month");
  std::mt19937 rng(20261127);
  std::vector<int64_t> runs;
  // Runs with budgets of their own (stopped over them), and plain ones (cancelled by hand or
  // stopped when the project's budget is spent). At 14400x (~$25.80 a wall second) the $400
  // is spent around the 30 s of kills, not a minute after them.
  for (int i = 0; i < 6; ++i)
    runs.push_back(Submit(c, Training(project, i % 2 == 0 ? std::to_string(30 + 10 * i) : ""),
                          14400, 100 + i));
  std::vector<std::unique_ptr<Daemon>> workers, schedulers;
  for (int i = 0; i < 2; ++i) {
    workers.push_back(Worker("faults-worker" + std::to_string(i), "2"));
    workers.back()->Start();
  }
  for (int i = 0; i < 2; ++i) {
    schedulers.push_back(std::make_unique<Daemon>("faults-scheduler" + std::to_string(i),
                                                  std::vector<std::string>{"scheduler"}));
    schedulers.back()->Start();
  }
  // A foreground `trnflow run` of the same pipeline, killed and started again (a new run each
  // time; --force: its plan exceeds the budget, which then stops it).
  std::string file = testing::WriteTempFile("faults.yaml", Training(project));
  Daemon foreground("faults-trnflow-run",
                    {"run", file, "--force", "--pool", "trn1=2", "--speed", "14400"},
                    {"TRNFLOW_HOME=" + testing::CliHome()});
  foreground.Start();
  std::map<int64_t, Money> max_live;
  int kills = 0, cancels = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline &&
         Q(c, "SELECT count(*) FROM trnflow.runs WHERE project = '" + project +
                  "' AND state = 'running'") != "0") {
    std::this_thread::sleep_for(std::chrono::milliseconds(200 + rng() % 600));
    for (const auto& id : c.ListRuns({.project = project, .limit = 1000})) {
      Money live = RunSpent(c, id.id);
      if (schema::ToSql(id.state) == "running") max_live[id.id] = std::max(max_live[id.id], live);
    }
    switch (rng() % 7) {
      case 0:
      case 1:
      case 2: {
        auto& w = workers[rng() % workers.size()];
        w->Kill(SIGKILL);
        ++kills;
        w->Start();
        break;
      }
      case 3: {
        auto& s = schedulers[rng() % schedulers.size()];
        s->Kill(SIGKILL);
        ++kills;
        s->Start();
        break;
      }
      case 5:
        foreground.Kill(SIGKILL);
        ++kills;
        foreground.Start();
        break;
      case 4:
        if (cancels < 2) {
          c.CancelRun(runs[rng() % runs.size()]);
          ++cancels;
        }
        break;
      default:
        break;
    }
  }
  // Let the rescuers close what the kills left open.
  ASSERT_TRUE(WaitFor(
      [&] {
        return Q(c, "SELECT count(*) FROM trnflow.runs WHERE project = '" + project +
                        "' AND state = 'running'") == "0";
      },
      90))
      << "runs still running; logs in " << testing::DaemonLogDir();
  for (auto& w : workers) w->Kill(SIGKILL);
  for (auto& s : schedulers) s->Kill(SIGKILL);
  foreground.Kill(SIGKILL);
  // A daemon killed mid-attempt leaves it open until its lease lapses and a rescuer closes it.
  scheduler::Scheduler sched(testing::TestSchedulerOptions());
  sched.Start();
  ASSERT_TRUE(WaitFor(
      [&] {
        return Q(c, "SELECT count(*) FROM trnflow.open_attempts o JOIN trnflow.runs r ON "
                    "r.id = o.run_id WHERE r.project = '" + project + "'") == "0";
      },
      30));
  sched.Stop();
  std::cout << "killed " << kills << " daemons, cancelled " << cancels << " runs; "
            << Q(c, "SELECT string_agg(outcome || '=' || n, ' ') FROM (SELECT outcome, count(*) "
                    "AS n FROM trnflow.attempts a JOIN trnflow.runs r ON r.id = a.run_id WHERE "
                    "r.project = 'faults' GROUP BY outcome ORDER BY outcome) x")
            << "\n";
  ExpectMoneyExact(c, project, max_live);
  EXPECT_EQ(Q(c, testing::kQueueMismatchesSql), "0");
}

}  // namespace trnflow

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(
      new trnflow::testing::TestDatabase("trnflow_money_faults_test"));
  return RUN_ALL_TESTS();
}
