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

namespace {
const std::string* g_home = nullptr;  // never destroyed: the exit handler reads it
}

std::string TestHome() {
  // Fresh for every process: pids are reused, and a home left by an earlier process (its
  // run directories numbered from 1 like this one's) once made a test pass what it must fail.
  // Removed at exit unless TRNFLOW_TEST_KEEP_HOME is set.
  static const bool made = [] {
    auto p = std::filesystem::temp_directory_path() /
             ("trnflow-test-" + std::to_string(getpid()) + "-" +
              schema::RandomSecret().substr(0, 8));
    std::filesystem::create_directories(p);
    g_home = new std::string(p.string());
    if (!std::getenv("TRNFLOW_TEST_KEEP_HOME"))
      std::atexit([] {
        std::error_code ec;
        std::filesystem::remove_all(*g_home, ec);
      });
    return true;
  }();
  (void)made;
  return *g_home;
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
