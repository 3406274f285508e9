// Spend, budgets and access against a real PostgreSQL: the ledger, the views and the report
// agree to the micro-dollar; a project member's own login sees only that project and cannot
// write; the reader sees all spend and nothing else; a budget crossed mid-run stops it.
#include <gtest/gtest.h>

#include <filesystem>

#include "common/error.h"
#include "pipelines/pipeline.h"
#include "scheduler/scheduler.h"
#include "schema/catalog.h"
#include "tests/test_db.h"
#include "tests/test_engine.h"
#include "workers/worker.h"

namespace trnflow {
namespace {

using testing::TestDatabase;
using testing::WaitFor;

using testing::MustParse;

const char* kSmall =
    "pipeline: small\nproject: lab\nstages:\n"
    "  prep:\n    run: [\"true\"]\n"
    "  train: {kind: train, needs: [prep], instance: trn1.2xlarge, model: gpt2, tokens: 1e9, "
    "market: spot, checkpoint: {every: 30m}}\n"
    "  compile: {kind: compile, needs: [train], target: inf2, instance: trn1.2xlarge, "
    "seq_len: 512, matrix: {batch: [1, 8]}, batch: \"${{ matrix.batch }}\"}\n";

schema::SubmitOptions Fast(double speed = 1e6) { return testing::FastSubmit(speed); }

workers::WorkerOptions WorkerOpts() {
  return testing::TestWorkerOptions({{"trn1", 4}, {"cpu", 2}});
}

scheduler::SchedulerOptions SchedOpts() { return testing::TestSchedulerOptions(); }

int64_t RunToEnd(schema::Catalog& c, const pipelines::Pipeline& p, double speed = 1e6) {
  int64_t run = c.SubmitRun(p, Fast(speed));
  scheduler::Scheduler sched(SchedOpts());
  workers::Worker worker(WorkerOpts());
  sched.Start();
  worker.Start();
  EXPECT_TRUE(WaitFor([&] { return c.GetRun(run)->state != "running"; }, 60));
  return run;
}

std::string DatabaseName() { return TestDatabase::database_name(); }

}  // namespace

TEST(Spend, LedgerViewsAndReportAgreeToTheMicroDollar) {
  schema::Catalog c(TestDatabase::url());
  int64_t run = RunToEnd(c, MustParse(kSmall, "agree"));
  ASSERT_EQ(c.GetRun(run)->state, "succeeded");
  std::string r = std::to_string(run);
  std::string ledger =
      c.QueryValue("SELECT sum(cost_usd) FROM trnflow.attempt_ledger WHERE run_id = " + r);
  EXPECT_EQ(c.QueryValue("SELECT cost_usd FROM trnflow.spend_by_run WHERE run_id = " + r), ledger);
  EXPECT_EQ(c.QueryValue("SELECT sum(cost_usd) FROM trnflow.spend_daily WHERE project = 'agree'"),
            ledger);
  EXPECT_EQ(
      c.QueryValue("SELECT sum(cost_usd) FROM trnflow.spend_by_stage WHERE project = 'agree'"),
      ledger);
  Money ledger_money;
  ASSERT_TRUE(Money::Parse(ledger, &ledger_money));
  // The report, by stage, from the rollup, and by run, from the ledger itself.
  Money by_stage, by_run;
  for (const auto& row : c.Spend({"agree", "", "", "", {"stage"}})) {
    by_stage += row.cost;
    EXPECT_EQ(c.QueryValue("SELECT cost_usd FROM trnflow.spend_by_stage WHERE project = 'agree' "
                           "AND stage = '" +
                           row.keys[0] + "'"),
              row.cost.ToDecimal())
        << row.keys[0];
  }
  for (const auto& row : c.Spend({"agree", "", "", "", {"run", "market"}})) by_run += row.cost;
  EXPECT_EQ(by_stage, ledger_money);
  EXPECT_EQ(by_run, ledger_money);
  auto total = c.Spend({"agree", "", "", "", {}});
  ASSERT_EQ(total.size(), 1u);
  EXPECT_EQ(total[0].cost, ledger_money);
  // Spot savings and the GPU baseline are there for every closed attempt.
  EXPECT_EQ(c.QueryValue("SELECT count(*) FROM trnflow.attempts WHERE baseline_usd IS NULL "
                         "OR on_demand_price_usd_hour IS NULL"),
            "0");
  EXPECT_GT(std::stod(c.QueryValue("SELECT savings_usd FROM trnflow.spot_savings WHERE project = "
                                   "'agree' AND stage = 'train'")),
            0);
  EXPECT_THROW(c.Spend({"agree", "", "", "", {"colour"}}), UserError);
}

TEST(Spend, ProjectMembersSeeOnlyTheirProjectAndCannotWrite) {
  schema::Catalog c(TestDatabase::url());
  schema::Catalog admin(TestDatabase::owner_url());
  RunToEnd(c, MustParse(kSmall, "rls-alpha"));
  RunToEnd(c, MustParse(kSmall, "rls-beta"));
  // And one run of each still waiting, so the queue holds rows of both projects.
  c.SubmitRun(MustParse(kSmall, "rls-alpha"), Fast(1e6));
  c.SubmitRun(MustParse(kSmall, "rls-beta"), Fast(1e6));
  ASSERT_NE(admin.QueryValue("SELECT count(*) FROM trnflow.ready_stages WHERE project = 'rls-beta'"),
            "0");
  std::string alice_url = TestDatabase::NewLogin("alice");
  std::string rita_url = TestDatabase::NewLogin("rita");
  // Roles are scoped to the catalog: the default one keeps trnflow_project_NAME.
  EXPECT_EQ(admin.AddProject("rls-alpha", {"trnflow_test_" + DatabaseName() + "_alice"}),
            DatabaseName() + "_project_rls_alpha");
  admin.AddProject("rls-beta", {});
  admin.QueryValue("GRANT " + DatabaseName() + "_reader TO trnflow_test_" + DatabaseName() +
                   "_rita; SELECT 1");
  EXPECT_THROW(admin.AddProject("rls-gamma", {"trnflow_test_nobody"}), UserError);
  EXPECT_THROW(admin.AddProject("Bad_Name", {}), UserError);
  EXPECT_THROW(c.AddProject("rls-delta", {}), PermissionDenied) << "the daemon makes no roles";

  schema::Catalog alice(alice_url);
  const std::vector<std::string> by_project = {
      "runs",         "spend_rollup",       "budgets",        "attempt_ledger", "stage_status",
      "run_status",   "spend_daily",        "spend_by_stage", "spend_by_run",   "spend_by_instance",
      "spot_savings", "interruption_waste", "cache_savings",  "gpu_baseline",   "ready_stages",
      "running_stages"};
  for (const auto& t : by_project) {
    EXPECT_EQ(alice.QueryValue("SELECT count(*) FROM trnflow." + t + " WHERE project = 'rls-beta'"),
              "0")
        << t;
  }
  EXPECT_NE(alice.QueryValue("SELECT count(*) FROM trnflow.runs WHERE project = 'rls-alpha'"), "0");
  EXPECT_NE(alice.QueryValue("SELECT count(*) FROM trnflow.ready_stages"), "0");  // alpha's
  // Rows that hang off runs: only alpha's.
  for (const auto& t : {"stages", "attempts", "open_attempts", "events"})
    EXPECT_EQ(alice.QueryValue(std::string("SELECT count(*) FROM trnflow.") + t +
                               " x WHERE x.run_id NOT IN (SELECT id FROM trnflow.runs)"),
              "0")
        << t;
  EXPECT_EQ(alice.QueryValue("SELECT count(*) FROM trnflow.pipelines"), "1");
  EXPECT_EQ(alice.QueryValue("SELECT count(*) FROM trnflow.projects"), "1");
  EXPECT_ANY_THROW(
      alice.QueryValue("INSERT INTO trnflow.projects (name) VALUES ('x') RETURNING 1"));
  EXPECT_ANY_THROW(alice.QueryValue("UPDATE trnflow.runs SET state = 'failed' RETURNING 1"));
  EXPECT_ANY_THROW(alice.QueryValue("DELETE FROM trnflow.attempts RETURNING 1"));

  schema::Catalog rita(rita_url);
  EXPECT_EQ(rita.QueryValue("SELECT count(DISTINCT project) FROM trnflow.spend_by_stage "
                            "WHERE project IN ('rls-alpha', 'rls-beta')"),
            "2");
  EXPECT_EQ(rita.QueryValue("SELECT sum(cost_usd) FROM trnflow.attempt_ledger"),
            c.QueryValue("SELECT sum(cost_usd) FROM trnflow.attempt_ledger"));
  // `trnflow spend` adds what running attempts have cost so far: the reader may read that.
  EXPECT_NO_THROW(rita.RunningSpend("", ""));
  EXPECT_EQ(rita.QueryValue("SELECT count(*) FROM trnflow.open_attempts"),
            c.QueryValue("SELECT count(*) FROM trnflow.open_attempts"));
  EXPECT_ANY_THROW(rita.QueryValue("SELECT spec FROM trnflow.stages LIMIT 1"));
  EXPECT_ANY_THROW(rita.QueryValue("SELECT source FROM trnflow.pipelines LIMIT 1"));
  EXPECT_ANY_THROW(rita.QueryValue("SELECT count(*) FROM trnflow.events"));
}

TEST(Spend, CrossingTheBudgetStopsTheRunningStage) {
  schema::Catalog c(TestDatabase::url());
  c.SetBudget("thrifty", Money::FromUsd(5), "month");
  // A week of trn1.32xlarge spot at ~$6.45/h: the $5 budget is gone within the first hour.
  auto p = MustParse(
      "pipeline: pricey\nproject: thrifty\nstages:\n"
      "  train: {kind: train, instance: trn1.32xlarge, model: llama-2-7b, tokens: 2e10, "
      "market: spot, checkpoint: {every: 1h}}\n"
      "  after:\n    run: [\"true\"]\n    needs: [train]\n");
  int64_t run = c.SubmitRun(p, Fast(3600));  // the test bypasses admission, as --force does
  scheduler::Scheduler sched(SchedOpts());
  workers::Worker worker(WorkerOpts());
  sched.Start();
  worker.Start();
  ASSERT_TRUE(WaitFor([&] { return c.GetRun(run)->state != "running"; }, 30));
  ASSERT_TRUE(WaitFor([&] { return c.CountRunningStages(run) == 0; }, 10));
  // The guard announces 100% on its next tick, after the attempt stopped itself at its cap.
  WaitFor(
      [&] {
        return c.QueryValue(
                   "SELECT count(*) FROM trnflow.events WHERE kind = 'budget' AND "
                   "data->>'project' = 'thrifty' AND data->>'percent' = '100'") == "1";
      },
      10);
  auto r = c.GetRun(run);
  EXPECT_EQ(r->state, "cancelled");
  EXPECT_EQ(r->cancel_reason, "budget_exceeded");
  auto attempts = c.GetAttempts(run);
  ASSERT_EQ(attempts.size(), 1u);
  EXPECT_EQ(attempts[0].outcome, "budget_exceeded");
  for (const auto& s : c.GetStages(run)) EXPECT_EQ(s.state, "cancelled") << s.name;
  EXPECT_EQ(c.QueryValue("SELECT string_agg(data->>'percent', ',' ORDER BY id) FROM trnflow.events "
                         "WHERE kind = 'budget' AND data->>'project' = 'thrifty'"),
            "50,80,100")
      << "each threshold is announced once";
  auto budgets = c.ProjectBudgets("thrifty");
  ASSERT_EQ(budgets.size(), 1u);
  EXPECT_GE(budgets[0].spent, Money::FromUsd(5));
  // The attempt was capped: at most one billing minute over, whatever the speed.
  Money minute = Charge(Money::FromMicros(std::stoll(c.QueryValue(
                            "SELECT (price_usd_hour * 1000000)::bigint FROM trnflow.attempts "
                            "WHERE run_id = " +
                            std::to_string(run)))),
                        1, 60);
  EXPECT_LE(budgets[0].spent, Money::FromUsd(5) + minute);
}

}  // namespace trnflow

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new trnflow::testing::TestDatabase("trnflow_spend_test"));
  return RUN_ALL_TESTS();
}
