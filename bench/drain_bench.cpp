// drain_bench: STAGES independent no-op stages already submitted (ready); WORKERS worker
// processes start, and the time runs until the catalog records the last one done, with the
// full bookkeeping of every stage: claim under a lease, an attempt row opened and closed in
// the ledger with its bill, the stage's state, the dependents check and the run's finish.
// Usage: drain_bench [--stages 200000] [--workers 1] [--capacity 128] [--batch 512]
// Prints one JSON line on stdout; needs TRNFLOW_TEST_ADMIN_URL or the local PostgreSQL.
#include <cstdio>
#include <cstring>
#include <string>

#include "bench/bench_util.h"
#include "bench/worker_procs.h"
#include "sim/catalog.h"

using namespace trnflow;
using namespace trnflow::bench;

int main(int argc, char** argv) {
  int64_t stages = 200000;
  int workers = 1, capacity = 128, batch = 512;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    long v = std::atol(argv[i + 1]);
    if (k == "--stages")
      stages = v;
    else if (k == "--workers")
      workers = static_cast<int>(v);
    else if (k == "--capacity")
      capacity = static_cast<int>(v);
    else if (k == "--batch")
      batch = static_cast<int>(v);
  }
  std::string name = "trnflow_bench_drain_" + std::to_string(getpid());
  std::string url = schema::CreateDatabase(AdminUrl(), name);
  double seconds = 0;
  {
    int64_t run;
    double start;
    {
      schema::Catalog c(url);
      c.Migrate(sim::Catalog::Builtin());
      c.QueryValue("INSERT INTO trnflow.projects (name) VALUES ('bench') RETURNING 1");
      run = InsertStages(c, stages, "ready", false);
      c.RunOutsideTransaction("VACUUM ANALYZE trnflow.stages");
      // The clock starts before the worker processes do (their start-up counts).
      start = std::stod(c.QueryValue("SELECT extract(epoch FROM clock_timestamp())"));
    }
    std::fprintf(stderr, "drain_bench: %lld ready stages, %d worker process(es) x %d slots\n",
                 static_cast<long long>(stages), workers, capacity);
    WorkerProcesses procs(url, workers, capacity, batch);  // forked before this connection
    schema::Catalog c(url);
    std::string end;
    auto deadline = Clock::now() + std::chrono::minutes(15);
    while ((end = c.QueryValue("SELECT coalesce(extract(epoch FROM finished_at)::text, '') "
                               "FROM trnflow.runs WHERE id = " +
                               std::to_string(run)))
               .empty()) {
      if (Clock::now() > deadline) {
        std::fprintf(stderr, "%s: the run did not finish in 15 minutes\n", argv[0]);
        return 1;
      }
      usleep(5000);
    }
    seconds = std::stod(end) - start;
    procs.Stop();
    std::string done = c.QueryValue(
        "SELECT count(*) FROM trnflow.attempts WHERE outcome = 'succeeded' AND run_id = " +
        std::to_string(run));
    if (std::stoll(done) != stages) {
      std::fprintf(stderr, "drain_bench: %s of %lld attempts succeeded\n", done.c_str(),
                   static_cast<long long>(stages));
      return 1;
    }
  }
  schema::DropDatabase(AdminUrl(), name);
  std::printf(
      "{\"system\":\"trnflow\",\"workload\":\"drain\",\"jobs\":%lld,\"processes\":%d,"
      "\"capacity\":%d,\"seconds\":%.3f,\"per_s\":%.0f}\n",
      static_cast<long long>(stages), workers, capacity, seconds, stages / seconds);
  return 0;
}
