// Spend, budgets and access against a real PostgreSQL: the ledger, the views and the report
// agree to the micro-dollar; a project member's own login sees only that project and cannot
// write; the reader sees all spend and nothing else; a budget crossed mid-run stops it.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <sstream>

#include "common/error.h"
#include "pipelines/pipeline.h"
#include "scheduler/scheduler.h"
#include "schema/catalog.h"
#include "schema/catalog_testing.h"
#include "tests/test_db.h"
#include "tests/test_engine.h"
#include "workers/worker.h"

namespace trnflow {
namespace {

using testing::TestDatabase;
using testing::WaitFor;

using testing::MustParse;
using testing::RunToEnd;

const char* const kSmall = testing::kSmallPipeline;

schema::SubmitOptions Fast(double speed = 1e6) { return testing::FastSubmit(speed); }

workers::WorkerOptions WorkerOpts() {
  return testing::TestWorkerOptions({{"trn1", 4}, {"cpu", 2}});
}

scheduler::SchedulerOptions SchedOpts() { return testing::TestSchedulerOptions(); }

std::string DatabaseName() { return TestDatabase::database_name(); }

}  // namespace

TEST(Spend, LedgerViewsAndReportAgreeToTheMicroDollar) {
  schema::Catalog c(TestDatabase::url());
  int64_t run = RunToEnd(c, MustParse(kSmall, "agree"));
  ASSERT_EQ(schema::ToSql(c.GetRun(run)->state), "succeeded");
  std::string r = std::to_string(run);
  std::string ledger = schema::testing::QueryValue(
      c, "SELECT sum(cost_usd) FROM trnflow.attempt_ledger WHERE run_id = " + r);
  EXPECT_EQ(schema::testing::QueryValue(
                c, "SELECT cost_usd FROM trnflow.spend_by_run WHERE run_id = " + r),
            ledger);
  EXPECT_EQ(schema::testing::QueryValue(
                c, "SELECT sum(cost_usd) FROM trnflow.spend_daily WHERE project = 'agree'"),
            ledger);
  EXPECT_EQ(schema::testing::QueryValue(
                c, "SELECT sum(cost_usd) FROM trnflow.spend_by_stage WHERE project = 'agree'"),
            ledger);
  Money ledger_money;
  ASSERT_TRUE(Money::Parse(ledger, &ledger_money));
  // The report, by stage, from the rollup, and by run, from the ledger itself.
  Money by_stage, by_run;
  for (const auto& row : c.Spend({"agree", "", "", "", {"stage"}})) {
    by_stage += row.cost;
    EXPECT_EQ(schema::testing::QueryValue(
                  c,
                  "SELECT cost_usd FROM trnflow.spend_by_stage WHERE project = 'agree' "
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
  EXPECT_EQ(schema::testing::QueryValue(
                c,
                "SELECT count(*) FROM trnflow.attempts WHERE baseline_usd IS NULL "
                "OR on_demand_price_usd_hour IS NULL"),
            "0");
  EXPECT_GT(std::stod(schema::testing::QueryValue(
                c,
                "SELECT savings_usd FROM trnflow.spot_savings WHERE project = "
                "'agree' AND stage = 'train'")),
            0);
  EXPECT_THROW(c.Spend({"agree", "", "", "", {"colour"}}), UserError);
}

// The rollups each report reads (migration 0030: by month, by month and stage, by day, by
// stage and day, interruptions) give the ledger's figures to the cent, for every grouping and
// for dates of whole months, of parts of months and none; they hold what a rebuild from the
// ledger holds; and the daily views equal their ledger definitions (0026). The ledger: two
// real runs, then copies of their attempts as later attempts of the same stages (triggers on,
// a statement per copy), spread over three months, a past year and the same days (retries on
// one day), some of them interrupted or served by the cache.
TEST(Spend, EveryRollupEqualsTheLedgerToTheCent) {
  schema::Catalog c(TestDatabase::url());
  schema::Catalog owner(TestDatabase::owner_url());
  RunToEnd(c, MustParse(kSmall, "flat-a"));
  RunToEnd(c, MustParse(kSmall, "flat-b"));
  const char* shifts[] = {"0", "-1 day", "0", "-35 days", "-35 days", "-70 days", "-400 days",
                          "-3 hours", "-40 days"};
  const char* outcomes[] = {"a.outcome", "'spot_interruption'", "'cached'", "a.outcome", "'lost'",
                            "'capacity_unavailable'", "a.outcome", "'cached'", "'failed'"};
  // Every column of the ledger but the id, as written, but for these.
  std::vector<std::string> columns;
  {
    std::string list = schema::testing::QueryValue(
        owner,
        "SELECT string_agg(column_name, ',' ORDER BY ordinal_position) FROM "
        "information_schema.columns WHERE table_schema = 'trnflow' AND table_name = 'attempts' "
        "AND is_generated = 'NEVER' AND column_name <> 'id'");
    std::stringstream in(list);
    for (std::string col; std::getline(in, col, ',');) columns.push_back(col);
  }
  for (int j = 1; j <= 9; ++j) {
    const std::map<std::string, std::string> changed = {
        {"attempt", "a.attempt + " + std::to_string(10 * j)},
        {"started_at", std::string("a.started_at + interval '") + shifts[j - 1] + "'"},
        {"finished_at", std::string("a.finished_at + interval '") + shifts[j - 1] + "'"},
        {"outcome", outcomes[j - 1]},
        {"cost_usd", "a.cost_usd + " + std::to_string(j) + " * 0.013"}};
    std::string cols, exprs;
    for (const auto& col : columns) {
      cols += (cols.empty() ? "" : ", ") + col;
      auto it = changed.find(col);
      exprs += (exprs.empty() ? "" : ", ") + (it == changed.end() ? "a." + col : it->second);
    }
    schema::testing::QueryValue(owner,
                                "INSERT INTO trnflow.attempts (" + cols + ") SELECT " + exprs +
                                    " FROM trnflow.attempts a WHERE a.attempt < 10 RETURNING 1");
  }
  ASSERT_GT(std::stoi(schema::testing::QueryValue(
                owner,
                "SELECT count(DISTINCT date_trunc('month', started_at AT "
                "TIME ZONE 'UTC')) FROM trnflow.attempts")),
            3);

  // Each report against the same report from the ledger (grouped by run as well, which only
  // the ledger answers, then summed here).
  auto key = [](const schema::SpendRow& r, size_t n) {
    std::string k;
    for (size_t i = 0; i < n; ++i) k += r.keys[i] + "|";
    return k;
  };
  const std::vector<std::vector<std::string>> groupings = {
      {},          {"project"}, {"pipeline"},       {"stage"},         {"kind"},
      {"instance"}, {"market"}, {"day"},            {"month"},         {"project", "month"},
      {"stage", "market"},      {"day", "pipeline"}, {"kind", "instance", "market", "month"}};
  std::string first = schema::testing::QueryValue(
      owner,
      "SELECT to_char(min(started_at AT TIME ZONE 'UTC'), 'YYYY-MM-01') FROM trnflow.attempts");
  std::string last = schema::testing::QueryValue(
      owner,
      "SELECT (date_trunc('month', max(started_at AT TIME ZONE 'UTC')) + interval '1 month' - "
      "interval '1 day')::date FROM trnflow.attempts");
  std::string month_ago = schema::testing::QueryValue(
      owner,
      "SELECT to_char(date_trunc('month', now() AT TIME ZONE 'UTC') - interval '1 month', "
      "'YYYY-MM-DD')");
  std::string mid = schema::testing::QueryValue(
      owner, "SELECT ((now() AT TIME ZONE 'UTC') - interval '36 days')::date");
  const std::vector<std::pair<std::string, std::string>> ranges = {
      {"", ""}, {first, last}, {month_ago, ""}, {"", month_ago}, {mid, ""}, {"", mid},
      {first, mid}};
  int compared = 0;
  for (const auto& project : {std::string(), std::string("flat-b")}) {
    for (const auto& [since, until] : ranges) {
      for (const auto& by : groupings) {
        std::vector<std::string> with_run = by;
        with_run.push_back("run");
        std::map<std::string, schema::SpendRow> want;
        for (const auto& r : owner.Spend({project, "", since, until, with_run})) {
          auto& w = want[key(r, by.size())];
          w.attempts += r.attempts;
          w.billed_hours += r.billed_hours;
          w.cost += r.cost, w.wasted += r.wasted, w.saved += r.saved;
        }
        auto got = owner.Spend({project, "", since, until, by});
        std::string what = "project '" + project + "' since '" + since + "' until '" + until +
                           "' by " + std::to_string(by.size()) + " fields" +
                           (by.empty() ? "" : " from " + by[0]);
        ASSERT_EQ(got.size(), want.size()) << what;
        for (const auto& r : got) {
          auto it = want.find(key(r, by.size()));
          ASSERT_NE(it, want.end()) << what << ": " << key(r, by.size());
          EXPECT_EQ(r.attempts, it->second.attempts) << what;
          EXPECT_NEAR(r.billed_hours, it->second.billed_hours, 1e-6) << what;
          EXPECT_EQ(r.cost, it->second.cost) << what << ": " << key(r, by.size());
          EXPECT_EQ(r.wasted, it->second.wasted) << what;
          EXPECT_EQ(r.saved, it->second.saved) << what;
          ++compared;
        }
      }
      // Savings over whole months (spend_month) and over days (the day rollup and the ledger).
      if (since.empty() && until.empty()) {
        auto by_month = owner.Savings({project, "", "", ""});
        auto by_day = owner.Savings({project, "", "1990-01-02", ""});
        ASSERT_EQ(by_month.size(), by_day.size());
        ASSERT_FALSE(by_month.empty());
        for (size_t i = 0; i < by_month.size(); ++i) {
          EXPECT_EQ(by_month[i].project, by_day[i].project);
          EXPECT_EQ(by_month[i].spot_cost, by_day[i].spot_cost);
          EXPECT_EQ(by_month[i].spot_on_demand, by_day[i].spot_on_demand);
          EXPECT_EQ(by_month[i].cache_hits, by_day[i].cache_hits);
          EXPECT_GT(by_month[i].cache_hits, 0);
          EXPECT_EQ(by_month[i].cache_saved, by_day[i].cache_saved);
          EXPECT_EQ(by_month[i].cost, by_day[i].cost);
          EXPECT_EQ(by_month[i].gpu_baseline, by_day[i].gpu_baseline);
        }
      }
    }
  }
  EXPECT_GT(compared, 200);

  // The daily views against their ledger definitions (0026), both ways.
  const std::string stage_daily =
      "SELECT r.project, (a.started_at AT TIME ZONE 'UTC')::date AS day, "
      "date_trunc('month', a.started_at AT TIME ZONE 'UTC')::date AS month, p.name AS pipeline, "
      "s.name AS stage, s.kind, count(DISTINCT a.run_id) AS runs, count(*) AS attempts, "
      "sum(coalesce(a.cost_usd, 0)) AS cost_usd, sum(coalesce(a.wasted_usd, 0)) AS wasted_usd, "
      "sum(coalesce(a.saved_usd, 0)) AS saved_usd FROM trnflow.attempts a "
      "JOIN trnflow.stages s ON s.id = a.stage_id JOIN trnflow.runs r ON r.id = a.run_id "
      "JOIN trnflow.pipelines p ON p.id = r.pipeline_id GROUP BY 1, 2, 3, 4, 5, 6";
  const std::string waste_daily =
      "SELECT r.project, (a.started_at AT TIME ZONE 'UTC')::date AS day, "
      "date_trunc('month', a.started_at AT TIME ZONE 'UTC')::date AS month, p.name AS pipeline, "
      "s.name AS stage, a.outcome, count(*) AS attempts, sum(coalesce(a.cost_usd, 0)) AS "
      "cost_usd, sum(coalesce(a.wasted_usd, 0)) AS wasted_usd FROM trnflow.attempts a "
      "JOIN trnflow.stages s ON s.id = a.stage_id JOIN trnflow.runs r ON r.id = a.run_id "
      "JOIN trnflow.pipelines p ON p.id = r.pipeline_id WHERE a.outcome IN "
      "('spot_interruption', 'capacity_unavailable', 'lost') GROUP BY 1, 2, 3, 4, 5, 6";
  for (const auto& [view, ledger] : {std::pair<std::string, std::string>{"spend_by_stage_daily",
                                                                          stage_daily},
                                     {"interruption_waste_daily", waste_daily}}) {
    EXPECT_EQ(schema::testing::QueryValue(
                  owner, "SELECT count(*) FROM ((SELECT * FROM trnflow." + view + " EXCEPT ALL " +
                             ledger + ") UNION ALL (" + ledger +
                             " EXCEPT ALL SELECT * FROM trnflow." + view + ")) x"),
              "0")
        << view;
    EXPECT_EQ(schema::testing::QueryValue(owner, "SELECT count(*) FROM trnflow." + view),
              schema::testing::QueryValue(owner, "SELECT count(*) FROM (" + ledger + ") x"))
        << view;
  }
  // Retries on one day count their run once: the case a sum of attempts would get wrong.
  EXPECT_NE(schema::testing::QueryValue(owner,
                                        "SELECT count(*) FROM trnflow.spend_by_stage_daily "
                                        "WHERE runs < attempts"),
            "0");
  EXPECT_NE(
      schema::testing::QueryValue(owner, "SELECT count(*) FROM trnflow.interruption_waste_daily"),
      "0");

  // A month budget's closed spend (spend_day) and a total one's (/metrics' counters).
  EXPECT_EQ(schema::testing::QueryValue(
                owner,
                "SELECT trnflow.closed_spend('flat-a', date_trunc('month', now() AT "
                "TIME ZONE 'UTC') AT TIME ZONE 'UTC') = (SELECT sum(a.cost_usd) FROM "
                "trnflow.attempts a JOIN trnflow.runs r ON r.id = a.run_id WHERE "
                "r.project = 'flat-a' AND a.started_at >= date_trunc('month', now() "
                "AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')"),
            "t");
  EXPECT_EQ(
      schema::testing::QueryValue(owner,
                                  "SELECT trnflow.closed_spend('flat-a', '-infinity') = (SELECT "
                                  "sum(a.cost_usd) FROM trnflow.attempts a JOIN trnflow.runs r ON "
                                  "r.id = a.run_id WHERE r.project = 'flat-a')"),
      "t");

  // What the triggers kept equals a rebuild from the ledger, row for row (over the shards of
  // the sharded two: the trigger writes the closing backend's, a rebuild shard 0).
  const std::map<std::string, std::string> contents = {
      {"spend_rollup", "SELECT * FROM trnflow.spend_rollup"},
      {"spend_month_stage", "SELECT * FROM trnflow.spend_month_stage"},
      {"interruption_rollup", "SELECT * FROM trnflow.interruption_rollup"},
      {"spend_month",
       "SELECT project, month, pipeline, kind, instance_type, market, sum(attempts), "
       "sum(cached), sum(billed_seconds), sum(cost_usd), sum(wasted_usd), sum(saved_usd), "
       "sum(on_demand_usd), sum(baseline_usd) FROM trnflow.spend_month GROUP BY 1, 2, 3, 4, 5, 6"},
      {"spend_day",
       "SELECT project, day, pipeline, sum(attempts), sum(billed_seconds), sum(cost_usd), "
       "sum(wasted_usd), sum(saved_usd) FROM trnflow.spend_day GROUP BY 1, 2, 3"}};
  std::map<std::string, std::string> kept;
  for (const auto& [t, q] : contents)
    kept[t] = schema::testing::QueryValue(
        owner, "SELECT md5(string_agg(x::text, ';' ORDER BY x::text)) FROM (" + q + ") x");
  schema::testing::RebuildSpendRollup(owner);
  for (const auto& [t, q] : contents)
    EXPECT_EQ(
        schema::testing::QueryValue(
            owner, "SELECT md5(string_agg(x::text, ';' ORDER BY x::text)) FROM (" + q + ") x"),
        kept[t])
        << t;
}

TEST(Spend, WholeMonthsAreTheFirstToTheLastDay) {
  EXPECT_TRUE(schema::WholeMonths("", ""));
  EXPECT_TRUE(schema::WholeMonths("2026-11-01", ""));
  EXPECT_TRUE(schema::WholeMonths("", "2026-11-30"));
  EXPECT_TRUE(schema::WholeMonths("2024-01-01", "2024-02-29"));
  EXPECT_FALSE(schema::WholeMonths("2023-01-01", "2023-02-29"));
  EXPECT_TRUE(schema::WholeMonths("2023-01-01", "2023-02-28"));
  EXPECT_FALSE(schema::WholeMonths("2026-11-02", ""));
  EXPECT_FALSE(schema::WholeMonths("", "2026-11-29"));
  EXPECT_FALSE(schema::WholeMonths("2026-13-01", ""));
  EXPECT_FALSE(schema::WholeMonths("2026-1-01", ""));
}

TEST(Spend, ProjectMembersSeeOnlyTheirProjectAndCannotWrite) {
  schema::Catalog c(TestDatabase::url());
  schema::Catalog admin(TestDatabase::owner_url());
  RunToEnd(c, MustParse(kSmall, "rls-alpha"));
  RunToEnd(c, MustParse(kSmall, "rls-beta"));
  // And one run of each still waiting, so the queue holds rows of both projects.
  c.SubmitRun(MustParse(kSmall, "rls-alpha"), Fast(1e6));
  c.SubmitRun(MustParse(kSmall, "rls-beta"), Fast(1e6));
  ASSERT_NE(schema::testing::QueryValue(
                admin, "SELECT count(*) FROM trnflow.ready_stages WHERE project = 'rls-beta'"),
            "0");
  std::string alice_url = TestDatabase::NewLogin("alice");
  std::string rita_url = TestDatabase::NewLogin("rita");
  // Roles are scoped to the catalog: the default one keeps trnflow_project_NAME.
  EXPECT_EQ(admin.AddProject("rls-alpha", {"trnflow_test_" + DatabaseName() + "_alice"}),
            DatabaseName() + "_project_rls_alpha");
  admin.AddProject("rls-beta", {});
  schema::testing::QueryValue(admin, "GRANT " + DatabaseName() + "_reader TO trnflow_test_" +
                                         DatabaseName() + "_rita; SELECT 1");
  EXPECT_THROW(admin.AddProject("rls-gamma", {"trnflow_test_nobody"}), UserError);
  EXPECT_THROW(admin.AddProject("Bad_Name", {}), UserError);
  EXPECT_THROW(c.AddProject("rls-delta", {}), PermissionDenied) << "the daemon makes no roles";

  schema::Catalog alice(alice_url);
  const std::vector<std::string> by_project = {
      "runs",         "spend_rollup",       "budgets",        "attempt_ledger", "stage_status",
      "run_status",   "spend_daily",        "spend_by_stage", "spend_by_run",   "spend_by_instance",
      "spot_savings", "interruption_waste", "cache_savings",  "gpu_baseline",   "ready_stages",
      "running_stages", "spend_month", "spend_month_stage", "spend_day", "interruption_rollup",
      "spend_by_stage_daily", "interruption_waste_daily"};
  for (const auto& t : by_project) {
    EXPECT_EQ(schema::testing::QueryValue(
                  alice, "SELECT count(*) FROM trnflow." + t + " WHERE project = 'rls-beta'"),
              "0")
        << t;
  }
  EXPECT_NE(schema::testing::QueryValue(
                alice, "SELECT count(*) FROM trnflow.runs WHERE project = 'rls-alpha'"),
            "0");
  EXPECT_NE(schema::testing::QueryValue(alice, "SELECT count(*) FROM trnflow.ready_stages"),
            "0");  // alpha's
  // Rows that hang off runs: only alpha's.
  for (const auto& t : {"stages", "attempts", "open_attempts", "events"})
    EXPECT_EQ(schema::testing::QueryValue(
                  alice, std::string("SELECT count(*) FROM trnflow.") + t +
                             " x WHERE x.run_id NOT IN (SELECT id FROM trnflow.runs)"),
              "0")
        << t;
  EXPECT_EQ(schema::testing::QueryValue(alice, "SELECT count(*) FROM trnflow.pipelines"), "1");
  EXPECT_EQ(schema::testing::QueryValue(alice, "SELECT count(*) FROM trnflow.projects"), "1");
  EXPECT_ANY_THROW(schema::testing::QueryValue(
      alice, "INSERT INTO trnflow.projects (name) VALUES ('x') RETURNING 1"));
  EXPECT_ANY_THROW(
      schema::testing::QueryValue(alice, "UPDATE trnflow.runs SET state = 'failed' RETURNING 1"));
  EXPECT_ANY_THROW(schema::testing::QueryValue(alice, "DELETE FROM trnflow.attempts RETURNING 1"));

  schema::Catalog rita(rita_url);
  EXPECT_EQ(
      schema::testing::QueryValue(rita,
                                  "SELECT count(DISTINCT project) FROM trnflow.spend_by_stage "
                                  "WHERE project IN ('rls-alpha', 'rls-beta')"),
      "2");
  EXPECT_EQ(schema::testing::QueryValue(rita, "SELECT sum(cost_usd) FROM trnflow.attempt_ledger"),
            schema::testing::QueryValue(c, "SELECT sum(cost_usd) FROM trnflow.attempt_ledger"));
  // `trnflow spend` adds what running attempts have cost so far: the reader may read that.
  EXPECT_NO_THROW(rita.RunningSpend("", ""));
  EXPECT_EQ(schema::testing::QueryValue(rita, "SELECT count(*) FROM trnflow.open_attempts"),
            schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.open_attempts"));
  EXPECT_ANY_THROW(schema::testing::QueryValue(rita, "SELECT spec FROM trnflow.stages LIMIT 1"));
  EXPECT_ANY_THROW(
      schema::testing::QueryValue(rita, "SELECT source FROM trnflow.pipelines LIMIT 1"));
  EXPECT_ANY_THROW(schema::testing::QueryValue(rita, "SELECT count(*) FROM trnflow.events"));
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
  ASSERT_TRUE(WaitFor([&] { return schema::ToSql(c.GetRun(run)->state) != "running"; }, 30));
  ASSERT_TRUE(WaitFor([&] { return c.CountRunningStages(run) == 0; }, 10));
  // The guard announces 100% on its next tick, after the attempt stopped itself at its cap.
  WaitFor(
      [&] {
        return schema::testing::QueryValue(
                   c,
                   "SELECT count(*) FROM trnflow.events WHERE kind = 'budget' AND "
                   "data->>'project' = 'thrifty' AND data->>'percent' = '100'") == "1";
      },
      10);
  auto r = c.GetRun(run);
  EXPECT_EQ(schema::ToSql(r->state), "cancelled");
  EXPECT_EQ(schema::ToSql(r->cancel_reason), "budget_exceeded");
  auto attempts = c.GetAttempts(run);
  ASSERT_EQ(attempts.size(), 1u);
  EXPECT_EQ(schema::ToSql(attempts[0].outcome), "budget_exceeded");
  for (const auto& s : c.GetStages(run)) EXPECT_EQ(schema::ToSql(s.state), "cancelled") << s.name;
  EXPECT_EQ(schema::testing::QueryValue(c, "SELECT string_agg(data->>'percent', ',' ORDER BY id) FROM trnflow.events "
                         "WHERE kind = 'budget' AND data->>'project' = 'thrifty'"),
            "50,80,100")
      << "each threshold is announced once";
  auto budgets = c.ProjectBudgets("thrifty");
  ASSERT_EQ(budgets.size(), 1u);
  EXPECT_GE(budgets[0].spent, Money::FromUsd(5));
  // The attempt was capped: at most one billing minute over, whatever the speed.
  Money minute = Charge(Money::FromMicros(std::stoll(schema::testing::QueryValue(
                            c,
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
