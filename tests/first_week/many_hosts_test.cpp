// The first week, platform engineer: two worker hosts, each with a TRNFLOW_HOME of its own, one
// catalog. Logs are found where their worker wrote them (shared storage) and named when that
// place is gone; a compiled graph whose files lived on a host that is gone is rebuilt by the
// next host, not served as a broken path. Real daemons and the real binary.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "schema/catalog.h"
#include "tests/daemon.h"
#include "tests/run_cli.h"
#include "tests/test_db.h"

namespace trnflow {
namespace {

using testing::Daemon;
using testing::RunTrnflow;
using testing::TestDatabase;
using testing::Query;
using testing::WaitFor;
using testing::WriteTempFile;

[[maybe_unused]] auto* const kDatabase =
    ::testing::AddGlobalTestEnvironment(new TestDatabase("trnflow_fw_hosts"));

std::string Home(const std::string& host) {
  auto p = std::filesystem::temp_directory_path() /
           ("trnflow-fw-" + host + "-" + std::to_string(getpid()));
  std::filesystem::create_directories(p);
  return p.string();
}

constexpr char kPipeline[] = R"(pipeline: two-hosts
project: platform
stages:
  compile:
    kind: compile
    model: climate-emulator-1b
    target: inf2
    instance: trn1.2xlarge
    market: on-demand
    tp_degree: 2
    batch: 1
    seq_len: 512
    dtype: bf16
  report:
    run: ["bash", "-c", "echo compiled on this host"]
    needs: [compile]
    instance: c6i.xlarge
)";

int64_t Submit() {
  auto r = RunTrnflow("submit " + WriteTempFile("two-hosts.yaml", kPipeline) +
                      " --speed 100000 --format json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return std::stoll(nlohmann::json::parse(r.out)["run_id"].get<std::string>());
}

bool Succeeded(int64_t run) {
  return Query("SELECT state FROM trnflow.runs WHERE id = " + std::to_string(run)) == "succeeded";
}

TEST(ManyHosts, TwoWorkersWithHomesOfTheirOwnShareOneCatalog) {
  std::string home_a = Home("host-a"), home_b = Home("host-b");
  Daemon scheduler("hosts-scheduler", {"scheduler"});
  scheduler.Start();

  // Host A runs the first run; `logs` from another home finds the log where A wrote it.
  auto a = std::make_unique<Daemon>(
      "host-a", std::vector<std::string>{"worker", "--pool", "trn1=1", "--pool", "cpu=1"},
      std::vector<std::string>{"TRNFLOW_HOME=" + home_a});
  a->Start();
  int64_t first = Submit();
  ASSERT_TRUE(WaitFor([&] { return Succeeded(first); }, 60));
  std::string r1 = std::to_string(first);
  auto logs = RunTrnflow("logs " + r1 + " report");
  EXPECT_EQ(logs.exit_code, 0) << logs.err;
  EXPECT_NE(logs.out.find("compiled on this host"), std::string::npos) << logs.out;
  EXPECT_NE(logs.out.find(home_a), std::string::npos) << "read from host A's home:\n" << logs.out;

  // Host A goes away with its disk.
  a->Kill(SIGTERM);
  a.reset();
  std::filesystem::remove_all(home_a);
  logs = RunTrnflow("logs " + r1 + " report");
  EXPECT_EQ(logs.exit_code, 0) << logs.err;
  EXPECT_NE(logs.out.find("which this host cannot read"), std::string::npos) << logs.out;
  EXPECT_NE(logs.out.find(home_a + "/logs/run-" + r1 + "/report.attempt-1.log"),
            std::string::npos)
      << logs.out;

  // Host B, with a home of its own, runs the same pipeline again: the compiled graph's entry
  // points at files that went with host A, so B rebuilds it rather than serving them.
  Daemon b("host-b", {"worker", "--pool", "trn1=1", "--pool", "cpu=1"},
           {"TRNFLOW_HOME=" + home_b});
  b.Start();
  int64_t second = Submit();
  ASSERT_TRUE(WaitFor([&] { return Succeeded(second); }, 60))
      << Query("SELECT string_agg(name || ':' || state, ', ') FROM trnflow.stages WHERE run_id = " +
               std::to_string(second));
  std::string compile2 = "SELECT %s FROM trnflow.attempts a JOIN trnflow.stages s ON s.id = "
                         "a.stage_id WHERE s.run_id = " +
                         std::to_string(second) + " AND s.name = 'compile'";
  EXPECT_EQ(Query(compile2.replace(compile2.find("%s"), 2, "string_agg(a.outcome, ',')")),
            "succeeded")
      << "a graph whose files are gone is rebuilt, not served";
  EXPECT_EQ(Query("SELECT bool_and(path LIKE '" + home_b + "%') FROM trnflow.artifacts "
                  "WHERE state = 'ready'"),
            "t")
      << "the rebuilt entry lives in host B's store";
  // And a third run, on B, is served from B's rebuilt entry.
  int64_t third = Submit();
  ASSERT_TRUE(WaitFor([&] { return Succeeded(third); }, 60));
  EXPECT_EQ(Query("SELECT a.outcome FROM trnflow.attempts a JOIN trnflow.stages s ON s.id = "
                  "a.stage_id WHERE s.run_id = " +
                  std::to_string(third) + " AND s.name = 'compile'"),
            "cached");
  std::filesystem::remove_all(home_b);
}

}  // namespace
}  // namespace trnflow
