// report_bench: a project's monthly spend report by stage with ATTEMPTS attempt rows in the
// ledger (default 1,000,000), through `Catalog::Spend` (what `trnflow spend` runs, from the
// rollup the ledger keeps) and, for comparison, straight from the ledger view.
// Usage: report_bench [ATTEMPTS=1000000] [REPEAT=20] [--json]
// With --json, the human-readable report goes to stderr and one JSON line to stdout.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "schema/catalog.h"
#include "schema/catalog_testing.h"
#include "sim/catalog.h"

using namespace trnflow;
using namespace trnflow::bench;

int main(int argc, char** argv) {
  int64_t attempts = argc > 1 ? std::atoll(argv[1]) : 1'000'000;
  int repeat = argc > 2 ? std::atoi(argv[2]) : 20;
  bool json = argc > 3 && std::string(argv[3]) == "--json";
  FILE* out = json ? stderr : stdout;
  const int64_t stages_per_run = 100;
  int64_t runs = std::max<int64_t>(1, attempts / stages_per_run);
  std::string name = "trnflow_bench_report_" + std::to_string(getpid());
  std::string url = schema::CreateDatabase(AdminUrl(), name);
  double report_p50 = 0, view_p50 = 0, load_s = 0;
  {
    schema::Catalog c(url);
    c.Migrate(sim::Catalog::Builtin());
    auto t0 = Clock::now();
    // Two projects, so the report has to pick one; every run in this month.
    schema::testing::QueryValue(
        c, "INSERT INTO trnflow.projects (name) VALUES ('lab'), ('other') RETURNING 1");
    schema::testing::QueryValue(
        c,
        "INSERT INTO trnflow.pipelines (name, spec_hash, source) VALUES ('bench', 'x', '') "
        "RETURNING 1");
    schema::testing::QueryValue(
        c,
        "INSERT INTO trnflow.runs (pipeline_id, project, speed, seed, workdir, state) "
        "SELECT 1, CASE WHEN g % 4 = 0 THEN 'other' ELSE 'lab' END, 1, 1, '/', 'succeeded' "
        "FROM generate_series(1, " +
            std::to_string(runs) + ") g RETURNING 1");
    schema::testing::QueryValue(
        c,
        "INSERT INTO trnflow.stages (run_id, project, name, kind, pool, instance_type, "
        "instance_count, market, state, spec, attempts) "
        "SELECT r.id, r.project, 's' || k, CASE WHEN k % 10 = 0 THEN 'train' ELSE 'compile' END, "
        "'trn1', 'trn1.2xlarge', 1, CASE WHEN k % 2 = 0 THEN 'spot' ELSE 'on-demand' END, "
        "'succeeded', '{}'::jsonb, 1 FROM trnflow.runs r, generate_series(1, " +
            std::to_string(stages_per_run) + ") k RETURNING 1");
    // Closed attempts in one statement; the rollup is then rebuilt from the ledger (the trigger
    // that folds each statement's inserted attempts is off for the load: one statement of 10M
    // rows would hold them all in its transition table; the report reads the same rollup).
    schema::testing::RunOutsideTransaction(
        c, "ALTER TABLE trnflow.attempts DISABLE TRIGGER attempts_roll_up");
    schema::testing::QueryValue(
        c,
        "INSERT INTO trnflow.attempts (stage_id, run_id, attempt, worker_id, worker_name, "
        "instance_type, instance_count, market, price_usd_hour, on_demand_price_usd_hour, "
        "started_at, finished_at, outcome, sim_seconds, billed_seconds, cost_usd, wasted_usd, "
        "saved_usd, baseline_usd) SELECT s.id, s.run_id, 1, gen_random_uuid(), 'bench', "
        "s.instance_type, 1, s.market, 0.4, 1.34375, "
        "date_trunc('month', now()) + (s.id % 20) * interval '1 day', "
        "date_trunc('month', now()) + (s.id % 20) * interval '1 day', 'succeeded', 3600, 3600, "
        "0.4, 0, 0, 0.9 FROM trnflow.stages s RETURNING 1");
    schema::testing::RunOutsideTransaction(
        c, "ALTER TABLE trnflow.attempts ENABLE TRIGGER attempts_roll_up");
    schema::testing::RebuildSpendRollup(c);
    schema::testing::RunOutsideTransaction(c, "VACUUM ANALYZE");
    load_s = Ms(Clock::now() - t0) / 1000;
    std::fprintf(out,
                 "report_bench: %s attempt rows (%lld runs x %lld stages, 3/4 in project lab) "
                 "loaded in %.1f s\n",
                 schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.attempts").c_str(),
                 static_cast<long long>(runs), static_cast<long long>(stages_per_run),
                 Ms(Clock::now() - t0) / 1000);
    std::string month =
        schema::testing::QueryValue(c, "SELECT to_char(date_trunc('month', now()), 'YYYY-MM-DD')");
    std::vector<double> report, view;
    std::string check;
    for (int i = 0; i < repeat; ++i) {
      auto t = Clock::now();
      auto rows = c.Spend({"lab", "", month, "", {"stage"}});
      report.push_back(Ms(Clock::now() - t));
      Money total;
      for (const auto& r : rows) total += r.cost;
      check = total.ToDollars();
      t = Clock::now();
      schema::testing::QueryValue(
          c,
          "SELECT sum(cost_usd) FROM (SELECT stage, sum(cost_usd) AS cost_usd FROM "
          "trnflow.attempt_ledger WHERE project = 'lab' AND started_at >= '" +
              month + "' GROUP BY stage) x");
      view.push_back(Ms(Clock::now() - t));
    }
    report_p50 = Percentile(report, 0.5);
    view_p50 = Percentile(view, 0.5);
    std::fprintf(out, "\nmonthly report by stage for one project (%d repetitions)\n", repeat);
    std::fprintf(out, "%-40s %10s %10s %10s\n", "", "min ms", "p50 ms", "max ms");
    std::fprintf(out, "%-40s %10.1f %10.1f %10.1f\n", "trnflow spend (rollup)",
                 *std::min_element(report.begin(), report.end()), Percentile(report, 0.5),
                 *std::max_element(report.begin(), report.end()));
    std::fprintf(out, "%-40s %10.1f %10.1f %10.1f\n", "same report from the ledger view",
                 *std::min_element(view.begin(), view.end()), Percentile(view, 0.5),
                 *std::max_element(view.begin(), view.end()));
    std::fprintf(
        out, "total reported for lab: %s (rollup and ledger agree: %s)\n", check.c_str(),
        schema::testing::QueryValue(
            c,
            "SELECT (SELECT sum(cost_usd) FROM trnflow.spend_rollup WHERE project = 'lab') = "
            "(SELECT sum(cost_usd) FROM trnflow.attempt_ledger WHERE project = 'lab')")
            .c_str());
  }
  DropBenchDatabase(name);
  if (json)
    std::printf(
        "{\"system\":\"trnflow\",\"workload\":\"report\",\"attempts\":%lld,"
        "\"rollup_p50_ms\":%.2f,\"ledger_p50_ms\":%.2f,\"load_s\":%.1f}\n",
        static_cast<long long>(attempts), report_p50, view_p50, load_s);
  return 0;
}
