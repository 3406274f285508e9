// The first week, on-call: a worker killed with kill -9 in the middle of training, a real job
// killed with its worker, a stage nothing can run, a failure whose reason should be on the
// line that reports it, and output followed while it is written. Real daemons (tests/daemon.h)
// and the real binary against a real catalog.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "schema/catalog.h"
#include "tests/daemon.h"
#include "tests/run_cli.h"
#include "tests/test_db.h"

namespace trnflow {
namespace {

using testing::CliHome;
using testing::Daemon;
using testing::RunTrnflow;
using testing::TestDatabase;
using testing::Query;
using testing::QueryNumber;
using testing::WaitFor;
using testing::WriteTempFile;

[[maybe_unused]] auto* const kDatabase =
    ::testing::AddGlobalTestEnvironment(new TestDatabase("trnflow_fw_recovery"));

int64_t SubmitFile(const std::string& path, double speed) {
  auto r = RunTrnflow("submit " + path + " --speed " + std::to_string(speed) + " --format json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return std::stoll(nlohmann::json::parse(r.out)["run_id"].get<std::string>());
}

std::vector<std::string> DaemonEnv() { return {"TRNFLOW_HOME=" + CliHome()}; }

std::string Stage(int64_t run, const std::string& name) {
  return "(SELECT id FROM trnflow.stages WHERE run_id = " + std::to_string(run) +
         " AND name = '" + name + "')";
}

// Training on on-demand instances (no market interruptions: only the kill), checkpointing every
// 30 simulated minutes; about 11 wall seconds of training at speed 3600.
constexpr char kTraining[] = R"(pipeline: recovery
project: recovery-lab
stages:
  train:
    kind: train
    instance: trn1.32xlarge
    count: 2
    market: on-demand
    model: climate-emulator-1b
    tokens: 1.0e10
    seq_len: 2048
    parallelism: {tp: 8, pp: 1}
    checkpoint: {every: 30m}
    retry: {max_attempts: 3, on: [lost], backoff: {initial: 1s}}
)";

TEST(Recovery, AWorkerKilledMidTrainingLosesOnlyWhatFollowedItsLastCheckpoint) {
  const double speed = 3600;
  const int lease_s = 4;
  int64_t run = SubmitFile(WriteTempFile("recovery.yaml", kTraining), speed);
  std::string r = std::to_string(run);
  Daemon scheduler("recovery-scheduler", {"scheduler"}, DaemonEnv());
  const std::string lease = std::to_string(lease_s);
  Daemon worker("recovery-worker-1", {"worker", "--pool", "trn1=2", "--lease", lease},
                DaemonEnv());
  scheduler.Start();
  worker.Start();

  // While it trains, `show` says how far it is, what it has cost so far and when it ends.
  ASSERT_TRUE(WaitFor(
      [&] { return QueryNumber("SELECT progress FROM trnflow.stages WHERE id = " +
                               Stage(run, "train")) >= 0.25; },
      60))
      << "no checkpoint reached the catalog while the attempt ran";
  auto shown = RunTrnflow("show " + r + " --format json");
  ASSERT_EQ(shown.exit_code, 0) << shown.err;
  auto train = nlohmann::json::parse(shown.out)["stages"][0];
  EXPECT_EQ(train["state"], "running");
  ASSERT_TRUE(train["progress"].is_number()) << shown.out;
  EXPECT_GT(train["progress"].get<double>(), 0.25);
  EXPECT_GT(train["running_cost_usd"].get<double>(), 0);
  EXPECT_TRUE(train["eta_sim_seconds"].is_number());
  auto table = RunTrnflow("show " + r);
  EXPECT_NE(table.out.find("%, "), std::string::npos) << table.out;  // "37%, 6.9 sim h left"
  EXPECT_NE(table.out.find("sim h left"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("*"), std::string::npos) << "running spend is marked:\n" << table.out;

  // kill -9 mid-training, a second later than the last checkpoint reached the catalog.
  double ran_wall = QueryNumber(
      "SELECT extract(epoch FROM now() - started_at) FROM trnflow.open_attempts WHERE stage_id = " +
      Stage(run, "train") + " AND attempt = 1");
  worker.Kill(SIGKILL);
  double checkpointed =
      QueryNumber("SELECT progress FROM trnflow.stages WHERE id = " + Stage(run, "train"));
  ASSERT_GT(checkpointed, 0.25);

  Daemon worker2("recovery-worker-2", {"worker", "--pool", "trn1=2", "--lease", lease},
                 DaemonEnv());
  worker2.Start();
  ASSERT_TRUE(WaitFor([&] { return Query("SELECT state FROM trnflow.runs WHERE id = " + r) ==
                                   "succeeded"; },
                      120))
      << "the run did not finish after the worker was replaced";

  std::string a1 = "FROM trnflow.attempts WHERE stage_id = " + Stage(run, "train") + " AND attempt = ";
  EXPECT_EQ(Query("SELECT outcome " + a1 + "1"), "lost");
  EXPECT_EQ(Query("SELECT outcome " + a1 + "2"), "succeeded");
  // Billed up to its last heartbeat, not to the lease's expiry: never more simulated time than
  // it had run when it was killed (the expiry would add lease_s * speed = 4 simulated hours).
  double billed = QueryNumber("SELECT sim_seconds " + a1 + "1");
  EXPECT_LE(billed, ran_wall * speed + 1) << "billed past the kill";
  EXPECT_GT(billed, 0) << "billed nothing";
  // The second attempt resumed from the checkpoint the first one recorded while it ran.
  double resumed_from = QueryNumber("SELECT progress_from " + a1 + "2");
  EXPECT_NEAR(resumed_from, checkpointed, 1e-9);
  EXPECT_NEAR(QueryNumber("SELECT progress_to " + a1 + "1"), checkpointed, 1e-9);
  // Wasted: only the work after that checkpoint (under 30 simulated minutes of 2 instances),
  // not the whole attempt.
  double cost = QueryNumber("SELECT cost_usd " + a1 + "1");
  double wasted = QueryNumber("SELECT wasted_usd " + a1 + "1");
  EXPECT_GT(cost, 0);
  EXPECT_LT(wasted, 0.5 * cost) << "most of the lost attempt's work was checkpointed";
  double per_hour = QueryNumber("SELECT price_usd_hour * instance_count " + a1 + "1");
  // At most the 30-minute interval plus a heartbeat's worth of simulated time (3 s x 3600).
  EXPECT_LE(wasted, per_hour * (0.5 + 3.0 * speed / 3600 + 0.05));
  auto why = RunTrnflow("show " + r + " --stage train");
  EXPECT_NE(why.out.find("billed to the last heartbeat"), std::string::npos) << why.out;
  EXPECT_NE(why.out.find("resumes from"), std::string::npos) << why.out;
}

TEST(Recovery, ARealJobKilledWithItsWorkerResumesFromItsCheckpoint) {
  std::string yaml = R"(pipeline: recovery-job
project: recovery-lab
stages:
  steps:
    run: ["bash", "tests/jobs/checkpointing_job.sh"]
    env: {STEPS: "80", EVERY: "5", HOLD_AT: "22"}
    instance: c6i.xlarge
    market: on-demand
    retry: {max_attempts: 3, on: [lost], backoff: {initial: 1s}}
)";
  int64_t run = SubmitFile(WriteTempFile("recovery-job.yaml", yaml), 1);
  std::string r = std::to_string(run);
  Daemon scheduler("job-scheduler", {"scheduler"}, DaemonEnv());
  Daemon worker("job-worker-1", {"worker", "--pool", "cpu=1", "--lease", "3"}, DaemonEnv());
  scheduler.Start();
  worker.Start();
  // The job checkpoints every 5 steps; the catalog learns of a checkpoint at the worker's next
  // heartbeat, so a job killed at any moment may have saved one the catalog never heard of.
  // HOLD_AT: the first attempt stops after step 22 (its last checkpoint at 20) and waits there;
  // the kill lands once the catalog has that checkpoint and the job has worked past it.
  const std::string steps_log = CliHome() + "/runs/" + r + "/steps.log";
  ASSERT_TRUE(WaitFor(
      [&] {
        return testing::ReadFile(steps_log).find("step 22\n") != std::string::npos &&
               QueryNumber("SELECT progress FROM trnflow.stages WHERE id = " +
                           Stage(run, "steps")) >= 0.25;
      },
      60));
  worker.Kill(SIGKILL);  // the job dies with it (PDEATHSIG, its own process group)
  double checkpointed =
      QueryNumber("SELECT progress FROM trnflow.stages WHERE id = " + Stage(run, "steps"));
  EXPECT_DOUBLE_EQ(checkpointed, 0.25) << "the catalog has the job's last checkpoint, step 20";
  Daemon worker2("job-worker-2", {"worker", "--pool", "cpu=1", "--lease", "3"}, DaemonEnv());
  worker2.Start();
  ASSERT_TRUE(WaitFor([&] { return Query("SELECT state FROM trnflow.runs WHERE id = " + r) ==
                                   "succeeded"; },
                      90));
  std::string a = "FROM trnflow.attempts WHERE stage_id = " + Stage(run, "steps") + " AND attempt = ";
  EXPECT_EQ(Query("SELECT outcome " + a + "1"), "lost");
  EXPECT_NEAR(QueryNumber("SELECT progress_from " + a + "2"), checkpointed, 1e-9);
  // The job itself found its checkpoint: the second attempt started where the first saved.
  std::ifstream steps(CliHome() + "/runs/" + r + "/steps.log");
  std::stringstream text;
  text << steps.rdbuf();
  int resumed_at = static_cast<int>(std::lround(checkpointed * 80));
  EXPECT_NE(text.str().find("attempt 2 starts at step " + std::to_string(resumed_at)),
            std::string::npos)
      << text.str();
  EXPECT_LT(QueryNumber("SELECT wasted_usd " + a + "1"), QueryNumber("SELECT cost_usd " + a + "1"))
      << "a checkpointed job's lost attempt is not all waste";
}

TEST(Recovery, AStageNothingCanRunSaysWhy) {
  std::string yaml = R"(pipeline: nobody-runs-it
project: recovery-lab
stages:
  big:
    kind: train
    instance: trn1.32xlarge
    count: 4
    market: on-demand
    model: climate-emulator-1b
    tokens: 1.0e8
    seq_len: 2048
    parallelism: {tp: 8, pp: 1}
  after:
    run: ["true"]
    needs: [big]
    instance: c6i.xlarge
)";
  int64_t run = SubmitFile(WriteTempFile("nobody.yaml", yaml), 3600);
  std::string r = std::to_string(run);
  // No worker at all.
  auto none = RunTrnflow("explain " + r + " big");
  EXPECT_EQ(none.exit_code, 0) << none.err;
  EXPECT_NE(none.out.find("no live worker has a trn1 pool with >= 4 instances"), std::string::npos)
      << none.out;
  EXPECT_NE(none.out.find("trnflow worker --pool trn1=4"), std::string::npos) << none.out;
  // A worker too small for it.
  Daemon small("small-worker", {"worker", "--pool", "trn1=2"}, DaemonEnv());
  small.Start();
  ASSERT_TRUE(WaitFor([&] { return RunTrnflow("explain " + r + " big").out.find("the largest has 2") !=
                                   std::string::npos; },
                      20));
  auto shown = RunTrnflow("show " + r);
  EXPECT_NE(shown.out.find("big cannot start: no live worker has a trn1 pool with >= 4"),
            std::string::npos)
      << shown.out;
  auto blocked = RunTrnflow("explain " + r + " after --format json");
  ASSERT_EQ(blocked.exit_code, 0) << blocked.err;
  auto j = nlohmann::json::parse(blocked.out);
  EXPECT_EQ(j["state"], "blocked");
  EXPECT_EQ(j["reasons"][0]["kind"], "needs");
  EXPECT_NE(j["reasons"][0]["message"].get<std::string>().find("big (ready)"), std::string::npos);
  // `watch` does not wait in silence either.
  auto watched = RunTrnflow("watch " + r, "timeout 4");
  EXPECT_EQ(watched.exit_code, 124);
  EXPECT_NE(watched.out.find("waiting: big cannot start"), std::string::npos) << watched.out;
  auto typo = RunTrnflow("explain " + r + " bgi");
  EXPECT_EQ(typo.exit_code, 2);
  EXPECT_NE(typo.err.find("did you mean 'big'"), std::string::npos) << typo.err;
  RunTrnflow("cancel " + r);
}

TEST(Recovery, RetryAndFailureLinesSayWhyAndLogsFollow) {
  std::string yaml = R"(pipeline: says-why
project: recovery-lab
stages:
  flaky:
    run: ["bash", "-c", "for i in 1 2 3; do echo line $i; sleep 0.3; done; echo 'boom: disk full' >&2; exit 75"]
    instance: c6i.xlarge
    retry: {max_attempts: 2, on: [infra_error], backoff: {initial: 1h}}
)";
  std::string file = WriteTempFile("says-why.yaml", yaml);
  int64_t run = SubmitFile(file, 1);
  std::string r = std::to_string(run);
  // `logs -f` follows the output as it is written, and returns when the stage is waiting.
  Daemon worker("why-worker", {"worker", "--pool", "cpu=1"}, DaemonEnv());
  Daemon scheduler("why-scheduler", {"scheduler"}, DaemonEnv());
  worker.Start();
  scheduler.Start();
  ASSERT_TRUE(WaitFor([&] { return Query("SELECT state FROM trnflow.stages WHERE id = " +
                                         Stage(run, "flaky")) == "running"; },
                      30));
  auto followed = RunTrnflow("logs -f " + r + " flaky", "timeout 5");
  EXPECT_NE(followed.out.find("line 3"), std::string::npos) << followed.out;
  EXPECT_NE(followed.out.find("boom: disk full"), std::string::npos) << followed.out;
  // After the failure it backs off for an hour of the run's clock: explain says so, with why.
  ASSERT_TRUE(WaitFor([&] { return Query("SELECT state FROM trnflow.stages WHERE id = " +
                                         Stage(run, "flaky")) == "retry_wait"; },
                      30));
  auto why = RunTrnflow("explain " + r + " flaky");
  EXPECT_NE(why.out.find("backing off before attempt 2"), std::string::npos) << why.out;
  EXPECT_NE(why.out.find("exited with code 75; last output: \"boom: disk full\""),
            std::string::npos)
      << why.out;
  auto watched = RunTrnflow("watch " + r, "timeout 2");
  EXPECT_NE(watched.out.find("flaky: retry_wait ("), std::string::npos) << watched.out;
  EXPECT_NE(watched.out.find("attempt 1 infra_error: exited with code 75"), std::string::npos)
      << watched.out;
  RunTrnflow("cancel " + r);
}

}  // namespace
}  // namespace trnflow
