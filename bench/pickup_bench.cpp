// pickup_bench: how long an idle worker takes to start a stage once it is ready. Stages are
// made ready one at a time at RATE per second, each by its own transaction (the update and
// notification ReleaseDependents makes); the latency runs from the moment that transaction's
// COMMIT returns to the moment the worker calls the stage's executor, on one clock (the
// worker runs in this process, its catalog connections its own). The first WARMUP are not
// counted.
// Usage: pickup_bench [--stages 1000] [--rate 100] [--warmup 50]
// Prints one JSON line on stdout; needs TRNFLOW_TEST_ADMIN_URL or the local PostgreSQL.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "sim/catalog.h"
#include "workers/worker.h"

using namespace trnflow;
using namespace trnflow::bench;

int main(int argc, char** argv) {
  Flags flags(argc, argv);
  int stages = static_cast<int>(flags.Int("stages", 1000));
  int rate = static_cast<int>(flags.Int("rate", 100));
  int warmup = static_cast<int>(flags.Int("warmup", 50));
  std::string name = "trnflow_bench_pickup_" + std::to_string(getpid());
  std::string url = schema::CreateDatabase(AdminUrl(), name);
  std::vector<double> latencies;
  {
    schema::Catalog c(url);
    PrepareBenchCatalog(c);
    int64_t run = InsertStages(c, stages, "blocked", false);
    int64_t first = std::stoll(schema::testing::QueryValue(
        c, "SELECT min(id) FROM trnflow.stages WHERE run_id = " + std::to_string(run)));
    schema::testing::RunOutsideTransaction(c, "VACUUM ANALYZE trnflow.stages");
    // Executor start times, by stage (steady clock, nanoseconds; 0 = not yet).
    std::vector<std::atomic<int64_t>> started(stages);
    auto now_ns = [] { return Clock::now().time_since_epoch().count(); };
    workers::WorkerOptions o;
    o.database_url = url;
    o.home = "/tmp/trnflow-bench-home";
    o.pools = {{"cpu", 8}};
    // A no-op stage that notes when its executor started.
    struct NotingNoop final : workers::Executor {
      std::function<void(int64_t)> note;
      workers::ExecResult Run(const workers::ExecContext& ctx) override {
        note(ctx.stage_id);
        return workers::ExecResult{};
      }
    };
    auto noop = std::make_shared<NotingNoop>();
    noop->note = [&](int64_t stage_id) {
      int64_t i = stage_id - first;
      if (i >= 0 && i < stages) started[i] = now_ns();
    };
    o.executors = workers::Executors::AllOn(noop);
    workers::Worker worker(o);
    worker.Start();
    std::this_thread::sleep_for(std::chrono::seconds(1));  // listening, idle
    std::vector<int64_t> committed(stages);
    auto t = Clock::now();
    for (int i = 0; i < stages; ++i) {
      t += std::chrono::microseconds(1000000 / rate);
      std::this_thread::sleep_until(t);
      schema::testing::QueryValue(
          c,
          "WITH r AS (UPDATE trnflow.stages SET state = 'ready', ready_at = now(), "
          "pending_needs = 0 WHERE id = " +
              std::to_string(first + i) +
              " RETURNING run_id, id, project, pool, priority, ready_at, instance_count), "
              "q AS (INSERT INTO trnflow.ready_stages (run_id, stage_id, project, pool, priority, "
              "ready_at, instance_count) SELECT * FROM r) "
              "SELECT pg_notify('trnflow_ready', pool) FROM r");
      committed[i] = now_ns();
    }
    auto deadline = Clock::now() + std::chrono::seconds(10);
    while (started[stages - 1] == 0 && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    worker.Stop();
    for (int i = warmup; i < stages; ++i) {
      if (started[i] == 0) {
        std::fprintf(stderr, "pickup_bench: stage %d never started\n", i);
        return 1;
      }
      latencies.push_back((started[i] - committed[i]) / 1e6);
    }
  }
  DropBenchDatabase(name);
  std::printf(
      "{\"system\":\"trnflow\",\"workload\":\"pickup\",\"jobs\":%zu,\"p50_ms\":%.3f,"
      "\"p99_ms\":%.3f,\"max_ms\":%.3f}\n",
      latencies.size(), Percentile(latencies, 0.5), Percentile(latencies, 0.99),
      *std::max_element(latencies.begin(), latencies.end()));
  return 0;
}
