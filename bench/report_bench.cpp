// report_bench: a project's monthly spend report by stage with ATTEMPTS attempt rows in the
// ledger (default 1,000,000), through `Catalog::Spend` (what `trnflow spend` runs, from the
// rollup the ledger keeps) and, for comparison, straight from the ledger view. Attempts are
// opened and then closed with UPDATE, as workers do, so the rollup trigger sees them.
// Usage: report_bench [ATTEMPTS=1000000] [REPEAT=20]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "schema/catalog.h"
#include "sim/catalog.h"

using namespace trnflow;
using namespace trnflow::bench;

int main(int argc, char** argv) {
  int64_t attempts = argc > 1 ? std::atoll(argv[1]) : 1'000'000;
  int repeat = argc > 2 ? std::atoi(argv[2]) : 20;
  const int64_t stages_per_run = 100;
  int64_t runs = std::max<int64_t>(1, attempts / stages_per_run);
  std::string name = "trnflow_bench_report_" + std::to_string(getpid());
  std::string url = schema::CreateDatabase(AdminUrl(), name);
  {
    schema::Catalog c(url);
    c.Migrate(sim::Catalog::Builtin());
    auto t0 = Clock::now();
    // Two projects, so the report has to pick one; every run in this month.
    c.QueryValue("INSERT INTO trnflow.projects (name) VALUES ('lab'), ('other') RETURNING 1");
    c.QueryValue(
        "INSERT INTO trnflow.pipelines (name, spec_hash, source) VALUES ('bench', 'x', '') "
        "RETURNING 1");
    c.QueryValue(
        "INSERT INTO trnflow.runs (pipeline_id, project, speed, seed, workdir, state) "
        "SELECT 1, CASE WHEN g % 4 = 0 THEN 'other' ELSE 'lab' END, 1, 1, '/', 'succeeded' "
        "FROM generate_series(1, " +
        std::to_string(runs) + ") g RETURNING 1");
    c.QueryValue(
        "INSERT INTO trnflow.stages (run_id, name, kind, pool, instance_type, "
        "instance_count, market, state, spec, attempts) "
        "SELECT r.id, 's' || k, CASE WHEN k % 10 = 0 THEN 'train' ELSE 'compile' END, "
        "'trn1', 'trn1.2xlarge', 1, CASE WHEN k % 2 = 0 THEN 'spot' ELSE 'on-demand' END, "
        "'succeeded', '{}'::jsonb, 1 FROM trnflow.runs r, generate_series(1, " +
        std::to_string(stages_per_run) + ") k RETURNING 1");
    c.QueryValue(
        "INSERT INTO trnflow.attempts (stage_id, run_id, attempt, worker_id, worker_name, "
        "instance_type, instance_count, market, price_usd_hour, on_demand_price_usd_hour, "
        "started_at) SELECT s.id, s.run_id, 1, gen_random_uuid(), 'bench', s.instance_type, 1, "
        "s.market, 0.4, 1.34375, date_trunc('month', now()) + (s.id % 20) * interval '1 day' "
        "FROM trnflow.stages s RETURNING 1");
    // Close them as workers do (the rollup trigger folds each statement in), in batches.
    std::string max_id = c.QueryValue("SELECT max(id) FROM trnflow.attempts");
    for (int64_t lo = 0; lo < std::stoll(max_id); lo += 100'000)
      c.QueryValue(
          "UPDATE trnflow.attempts SET outcome = 'succeeded', finished_at = started_at, "
          "sim_seconds = 3600, billed_seconds = 3600, cost_usd = 0.4, wasted_usd = 0, "
          "saved_usd = 0, baseline_usd = 0.9 WHERE id > " +
          std::to_string(lo) + " AND id <= " + std::to_string(lo + 100'000) + " RETURNING 1");
    c.RunOutsideTransaction("VACUUM ANALYZE");
    std::printf(
        "report_bench: %s attempt rows (%lld runs x %lld stages, 3/4 in project lab) "
        "loaded in %.1f s\n",
        c.QueryValue("SELECT count(*) FROM trnflow.attempts").c_str(), static_cast<long long>(runs),
        static_cast<long long>(stages_per_run), Ms(Clock::now() - t0) / 1000);
    std::string month = c.QueryValue("SELECT to_char(date_trunc('month', now()), 'YYYY-MM-DD')");
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
      c.QueryValue(
          "SELECT sum(cost_usd) FROM (SELECT stage, sum(cost_usd) AS cost_usd FROM "
          "trnflow.attempt_ledger WHERE project = 'lab' AND started_at >= '" +
          month + "' GROUP BY stage) x");
      view.push_back(Ms(Clock::now() - t));
    }
    std::printf("\nmonthly report by stage for one project (%d repetitions)\n", repeat);
    std::printf("%-40s %10s %10s %10s\n", "", "min ms", "p50 ms", "max ms");
    std::printf("%-40s %10.1f %10.1f %10.1f\n", "trnflow spend (rollup)",
                *std::min_element(report.begin(), report.end()), Percentile(report, 0.5),
                *std::max_element(report.begin(), report.end()));
    std::printf("%-40s %10.1f %10.1f %10.1f\n", "same report from the ledger view",
                *std::min_element(view.begin(), view.end()), Percentile(view, 0.5),
                *std::max_element(view.begin(), view.end()));
    std::printf(
        "total reported for lab: %s (rollup and ledger agree: %s)\n", check.c_str(),
        c.QueryValue(
             "SELECT (SELECT sum(cost_usd) FROM trnflow.spend_rollup WHERE project = 'lab') = "
             "(SELECT sum(cost_usd) FROM trnflow.attempt_ledger WHERE project = 'lab')")
            .c_str());
  }
  schema::DropDatabase(AdminUrl(), name);
  return 0;
}
