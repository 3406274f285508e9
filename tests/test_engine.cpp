#include "tests/test_engine.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "schema/catalog.h"
#include "tests/test_db.h"

namespace trnflow::testing {

pipelines::Pipeline MustParse(const std::string& yaml, const std::string& project) {
  auto r = pipelines::ParsePipeline(yaml, "test.yaml", {{}, project});
  EXPECT_TRUE(r.pipeline) << r.diagnostics.Format();
  return r.pipeline ? *r.pipeline : pipelines::Pipeline{};
}

std::string TestHome() {
  static const std::string home = ProcessDir("trnflow-test");
  return home;
}

workers::WorkerOptions TestWorkerOptions(std::vector<workers::PoolConfig> pools) {
  workers::WorkerOptions o;
  o.database_url = TestDatabase::url();
  o.home = TestHome();
  o.pools = std::move(pools);
  o.poll_s = 0.2;
  o.lease_s = 5;
  o.heartbeat_s = 0.3;
  o.shutdown_grace_s = 5;
  o.executors = workers::Executors::Local();
  return o;
}

scheduler::SchedulerOptions TestSchedulerOptions() {
  scheduler::SchedulerOptions o;
  o.database_url = TestDatabase::url();
  o.tick_s = 0.05;
  o.promote_every_s = 0.1;
  o.rescue_every_s = 0.2;
  o.finish_every_s = 0.5;
  o.budget_every_s = 0.1;
  o.seed = 1;
  return o;
}

schema::SubmitOptions FastSubmit(double speed) {
  schema::SubmitOptions o;
  o.speed = speed;
  o.seed = 1;
  o.workdir = TRNFLOW_SOURCE_DIR;
  return o;
}

const char* const kSmallPipeline =
    "pipeline: small\nproject: lab\nstages:\n"
    "  prep:\n    run: [\"true\"]\n"
    "  train: {kind: train, needs: [prep], instance: trn1.2xlarge, model: gpt2, tokens: 1e9, "
    "market: spot, checkpoint: {every: 30m}}\n"
    "  compile: {kind: compile, needs: [train], target: inf2, instance: trn1.2xlarge, "
    "seq_len: 512, matrix: {batch: [1, 8]}, batch: \"${{ matrix.batch }}\"}\n";

int64_t RunToEnd(schema::Catalog& c, const pipelines::Pipeline& p, double speed) {
  int64_t run = c.SubmitRun(p, FastSubmit(speed));
  scheduler::Scheduler sched(TestSchedulerOptions());
  workers::Worker worker(TestWorkerOptions({{"trn1", 4}, {"cpu", 2}}));
  sched.Start();
  worker.Start();
  EXPECT_TRUE(WaitFor([&] { return c.GetRun(run)->state != schema::RunState::kRunning; }, 60));
  return run;
}

}  // namespace trnflow::testing
