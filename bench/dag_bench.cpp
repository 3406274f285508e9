// dag_bench: a 10,000-stage pipeline of no-op stages from file to finished, on WORKERS idle
// worker processes: "fan" (one root, 9,998 stages after it, one sink after them all) or
// "chains" (100 chains of 100). Timed from reading the file (parse, validate, submit) to
// the catalog recording the run finished; every stage gets its attempt, bill and release.
// Usage: dag_bench [--shape fan|chains] [--stages 10000] [--workers 2] [--capacity 128]
// Prints one JSON line on stdout; needs TRNFLOW_TEST_ADMIN_URL or the local PostgreSQL.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "bench/bench_util.h"
#include "bench/dag_gen.h"
#include "bench/worker_procs.h"
#include "pipelines/pipeline.h"
#include "sim/catalog.h"

using namespace trnflow;
using namespace trnflow::bench;

int main(int argc, char** argv) {
  Flags flags(argc, argv);
  std::string shape = flags.Text("shape", "fan");
  int stages = static_cast<int>(flags.Int("stages", 10000));
  int workers = static_cast<int>(flags.Int("workers", 2));
  int capacity = static_cast<int>(flags.Int("capacity", 128));
  std::string name = "trnflow_bench_dag_" + std::to_string(getpid());
  std::string url = schema::CreateDatabase(AdminUrl(), name);
  std::string file = "/tmp/trnflow-dag-" + std::to_string(getpid()) + ".yaml";
  std::ofstream(file) << DagYaml(shape, stages);
  {
    schema::Catalog c(url);
    PrepareBenchCatalog(c);
  }
  double seconds = 0, submit_s = 0;
  int64_t run = 0;
  CostSnapshot before = SnapshotCost(name);
  {
    WorkerProcesses procs(url, workers, capacity);  // idle and listening, as deployed
    schema::Catalog c(url);
    sleep(1);
    double start =
        std::stod(schema::testing::QueryValue(c, "SELECT extract(epoch FROM clock_timestamp())"));
    auto loaded = pipelines::LoadPipelineFile(file, {});
    if (!loaded.pipeline) {
      std::fprintf(stderr, "dag_bench: the generated pipeline does not validate\n");
      return 1;
    }
    schema::SubmitOptions opts;
    opts.speed = 1e9;
    opts.workdir = "/tmp";
    run = c.SubmitRun(*loaded.pipeline, opts);
    submit_s =
        std::stod(schema::testing::QueryValue(c, "SELECT extract(epoch FROM clock_timestamp())")) -
        start;
    auto end = WaitForRunFinish(c, run);
    if (!end) {
      std::fprintf(stderr, "dag_bench: the run did not finish in 15 minutes\n");
      return 1;
    }
    seconds = *end - start;
    std::string state = schema::testing::QueryValue(
        c, "SELECT state FROM trnflow.runs WHERE id = " + std::to_string(run));
    std::string done = schema::testing::QueryValue(
        c, "SELECT count(*) FROM trnflow.attempts WHERE outcome = 'succeeded' AND run_id = " +
               std::to_string(run));
    if (state != "succeeded" || std::stoi(done) != stages) {
      std::fprintf(stderr, "dag_bench: run %s with %s of %d stages\n", state.c_str(), done.c_str(),
                   stages);
      return 1;
    }
  }  // the worker processes are stopped and waited for here
  CostSnapshot after = SnapshotCost(name);
  std::remove(file.c_str());
  DropBenchDatabase(name);
  std::printf(
      "{\"system\":\"trnflow\",\"workload\":\"dag\",\"shape\":\"%s\",\"stages\":%d,"
      "\"edges\":%d,\"processes\":%d,\"submit_seconds\":%.3f,\"seconds\":%.3f,\"per_s\":%.0f,"
      "%s}\n",
      shape.c_str(), stages, DagEdges(shape, stages), workers, submit_s, seconds, stages / seconds,
      PerStageJson(before, after, stages).c_str());
  return 0;
}
