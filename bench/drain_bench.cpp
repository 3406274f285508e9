// drain_bench: STAGES independent no-op stages already submitted (ready); WORKERS worker
// processes start, and the time runs until the catalog records the last one done, with the
// full bookkeeping of every stage: claim under a lease, an attempt opened and its ledger row
// written with its bill, the stage's state, the dependents check and the run's finish.
// Usage: drain_bench [--stages 200000] [--workers 1] [--capacity 128] [--batch 512]
//                    [--feed off] [--sql 'STATEMENTS' | --sql @FILE] [--keep yes]
// --feed off: without the dashboard's change feed (the triggers that record every state
// change in trnflow.changes), to measure what it costs. --sql: run on the new catalog before
// the drain, as its owner, one statement at a time (`;` separates them), to measure what a
// schema change would save: --sql 'ALTER TABLE trnflow.attempts DISABLE TRIGGER attempts_roll_up'.
// --sql @FILE runs FILE as one multi-statement string instead (function bodies may hold `;`).
// --keep yes: leave the benchmark's database in place afterwards (its name goes to stderr).
// Prints one JSON line on stdout; needs TRNFLOW_TEST_ADMIN_URL or the local PostgreSQL.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "bench/bench_util.h"
#include "bench/worker_procs.h"
#include "sim/catalog.h"

using namespace trnflow;
using namespace trnflow::bench;

int main(int argc, char** argv) {
  Flags flags(argc, argv);
  int64_t stages = flags.Int("stages", 200000);
  int workers = static_cast<int>(flags.Int("workers", 1));
  int capacity = static_cast<int>(flags.Int("capacity", 128));
  int batch = static_cast<int>(flags.Int("batch", 512));
  bool feed = flags.Text("feed", "on") != "off";
  std::string sql = flags.Text("sql", "");
  bool keep = flags.Text("keep", "no") == "yes";
  std::string name = "trnflow_bench_drain_" + std::to_string(getpid());
  std::string url = schema::CreateDatabase(AdminUrl(), name);
  double seconds = 0;
  CostSnapshot before, after;
  {
    int64_t run;
    double start;
    {
      schema::Catalog c(url);
      PrepareBenchCatalog(c);
      run = InsertStages(c, stages, "ready", false);
      if (!feed)
        schema::testing::RunOutsideTransaction(
            c, "ALTER TABLE trnflow.stages DISABLE TRIGGER stages_changes");
      if (sql.starts_with("@")) {
        std::ifstream file(sql.substr(1));
        std::stringstream text;
        text << file.rdbuf();
        if (!file) throw std::runtime_error("drain_bench: cannot read " + sql.substr(1));
        schema::testing::RunOutsideTransaction(c, text.str());
      } else {
        for (size_t at = 0, end; at < sql.size(); at = end + 1) {  // one statement at a time
          end = std::min(sql.find(';', at), sql.size());
          if (sql.find_first_not_of(" \n", at) < end)
            schema::testing::RunOutsideTransaction(c, sql.substr(at, end - at));
        }
      }
      schema::testing::RunOutsideTransaction(c, "VACUUM ANALYZE trnflow.stages");
      // The clock starts before the worker processes do (their start-up counts).
      start =
          std::stod(schema::testing::QueryValue(c, "SELECT extract(epoch FROM clock_timestamp())"));
    }
    std::fprintf(stderr, "drain_bench: %lld ready stages, %d worker process(es) x %d slots\n",
                 static_cast<long long>(stages), workers, capacity);
    before = SnapshotCost(name);
    WorkerProcesses procs(url, workers, capacity, batch);  // forked before this connection
    schema::Catalog c(url);
    auto end = WaitForRunFinish(c, run);
    if (!end) {
      std::fprintf(stderr, "drain_bench: the run did not finish in 15 minutes\n");
      return 1;
    }
    seconds = *end - start;
    procs.Stop();  // waits for them: their CPU is in RUSAGE_CHILDREN now
    after = SnapshotCost(name);
    std::string done = schema::testing::QueryValue(
        c, "SELECT count(*) FROM trnflow.attempts WHERE outcome = 'succeeded' AND run_id = " +
               std::to_string(run));
    if (std::stoll(done) != stages) {
      std::fprintf(stderr, "drain_bench: %s of %lld attempts succeeded\n", done.c_str(),
                   static_cast<long long>(stages));
      return 1;
    }
  }
  if (keep) std::fprintf(stderr, "drain_bench: kept database %s\n", name.c_str());
  else DropBenchDatabase(name);
  std::printf(
      "{\"system\":\"trnflow\",\"workload\":\"drain\",\"jobs\":%lld,\"processes\":%d,"
      "\"capacity\":%d,\"feed\":%s,\"seconds\":%.3f,\"per_s\":%.0f,%s}\n",
      static_cast<long long>(stages), workers, capacity, feed ? "true" : "false", seconds,
      stages / seconds,
      PerStageJson(before, after, stages).c_str());
  return 0;
}
