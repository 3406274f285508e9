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

}  // namespace trnflow::testing
