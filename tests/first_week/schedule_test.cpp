// Issue 16, item 8: a schedule fires a snapshot of its pipeline, taken at `schedule add`, not
// the file (the scheduler may run on a host without it). Editing the file changes nothing, and
// now the CLI says so: `schedule ls` marks a changed file, `schedule show` shows the snapshot
// and where the file differs, `schedule update` validates the file and takes a new snapshot
// (or writes nothing). The real binary against a real catalog; slots are fired by the same
// function the leading scheduler calls.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "scheduler/scheduler.h"
#include "schema/catalog.h"
#include "schema/catalog_testing.h"
#include "tests/run_cli.h"
#include "tests/test_db.h"

namespace trnflow {
namespace {

using testing::CliResult;
using testing::RunTrnflow;
using testing::TestDatabase;
using testing::WriteTempFile;

::testing::Environment* const kDatabase =
    ::testing::AddGlobalTestEnvironment(new TestDatabase("schedule"));

const std::string kV1 = R"(pipeline: nightly-demo
project: sched-lab
params:
  greeting: hello
stages:
  greet:
    run: ["echo", "${{ params.greeting }}"]
    instance: c6i.xlarge
)";

// The same pipeline, edited: another command on line 7 and a second stage.
const std::string kV2 = R"(pipeline: nightly-demo
project: sched-lab
params:
  greeting: hello
stages:
  greet:
    run: ["printf", "%s\n", "${{ params.greeting }}"]
    instance: c6i.xlarge
  again:
    needs: [greet]
    run: ["true"]
)";

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

nlohmann::json Show(const std::string& name) {
  CliResult r = RunTrnflow("schedule show " + name + " --format json");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  return nlohmann::json::parse(r.out);
}

std::string LsLine(const std::string& name) {
  CliResult r = RunTrnflow("schedule ls");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  size_t at = r.out.find("\n" + name + " ");
  if (at == std::string::npos) return "";
  return r.out.substr(at + 1, r.out.find('\n', at + 1) - at - 1);
}

TEST(ScheduleSnapshots, TheSnapshotFiresEditsAreShownAndUpdateTakesThem) {
  std::string file = WriteTempFile("nightly.yaml", kV1);
  CliResult add = RunTrnflow("schedule add nightly " + file +
                             " --cron \"0 2 * * *\" --param greeting=hi --project sched-lab");
  ASSERT_EQ(add.exit_code, 0) << add.out << add.err;
  EXPECT_NE(add.out.find("edits to the file change nothing until `trnflow schedule update "
                         "nightly`"),
            std::string::npos)
      << add.out;

  nlohmann::json s = Show("nightly");
  EXPECT_EQ(s["pipeline"], "nightly-demo");
  EXPECT_EQ(s["project"], "sched-lab");
  EXPECT_EQ(s["file"], file);
  EXPECT_EQ(s["file_state"], "unchanged");
  EXPECT_EQ(s["snapshot"], kV1);
  EXPECT_EQ(s["snapshot_valid"], true);
  EXPECT_EQ(s["params"], nlohmann::json({{"greeting", "hi"}}));
  EXPECT_EQ(s["cron"], "0 2 * * *");
  EXPECT_EQ(s["state"], "active");
  ASSERT_EQ(s["next_slots"].size(), 3u);
  for (const auto& slot : s["next_slots"])
    EXPECT_NE(slot.get<std::string>().find("T02:00:00Z"), std::string::npos) << slot;
  EXPECT_TRUE(s["last_fire"].is_null());
  EXPECT_EQ(s["fires"], 0);
  std::string taken = s["snapshot_taken_at"];
  EXPECT_NE(LsLine("nightly").find("= file"), std::string::npos) << LsLine("nightly");

  // The file is edited: nothing changes in what fires, and both ls and show say so.
  Write(file, kV2);
  EXPECT_NE(LsLine("nightly").find("file changed"), std::string::npos) << LsLine("nightly");
  EXPECT_NE(RunTrnflow("schedule ls").out.find("file changed since the snapshot: nightly"),
            std::string::npos);
  s = Show("nightly");
  EXPECT_EQ(s["file_state"], "changed");
  EXPECT_EQ(s["snapshot"], kV1);
  EXPECT_EQ(s["first_difference"]["line"], 7);
  EXPECT_EQ(s["first_difference"]["snapshot"], "    run: [\"echo\", \"${{ params.greeting }}\"]");
  CliResult table = RunTrnflow("schedule show nightly");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("CHANGED since the snapshot"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("--- snapshot (what fires) ---\n" + kV1), std::string::npos)
      << table.out;

  // A slot fires (as the leading scheduler fires it): the run is the snapshot's, not the file's.
  schema::Catalog c(TestDatabase::url());
  schema::testing::QueryValue(
      c,
      "UPDATE trnflow.schedules SET last_slot = now() - interval '2 days' WHERE name = 'nightly' "
      "RETURNING 1");
  ASSERT_EQ(scheduler::FireDueSchedules(c, std::chrono::system_clock::now()), 1);
  std::string run = schema::testing::QueryValue(c,
                                                "SELECT run_id FROM trnflow.schedule_fires WHERE "
                                                "schedule = 'nightly' AND run_id IS NOT NULL");
  ASSERT_FALSE(run.empty());
  EXPECT_EQ(
      schema::testing::QueryValue(c,
                                  "SELECT p.source FROM trnflow.runs r JOIN trnflow.pipelines p ON "
                                  "p.id = r.pipeline_id WHERE r.id = " +
                                      run),
      kV1);
  EXPECT_EQ(schema::testing::QueryValue(
                c, "SELECT params->>'greeting' FROM trnflow.runs WHERE id = " + run),
            "hi");
  s = Show("nightly");
  ASSERT_FALSE(s["last_fire"].is_null());
  EXPECT_EQ(s["last_fire"]["run_id"], run);
  EXPECT_EQ(s["last_fire"]["run_state"], "running");
  EXPECT_NE(s["last_fire"]["slot"].get<std::string>().find("T02:00:00Z"), std::string::npos);
  EXPECT_EQ(s["fires"], 1);
  EXPECT_EQ(RunTrnflow("cancel " + run).exit_code, 0);

  // A broken file: the error names its place, exit 2, and the snapshot stays as it was.
  Write(file, kV2 + "    retries: 3\n");
  CliResult broken = RunTrnflow("schedule update nightly");
  EXPECT_EQ(broken.exit_code, 2) << broken.out;
  EXPECT_NE(broken.err.find(file + ":12:5: error: unknown field 'retries' in stage 'again'"),
            std::string::npos)
      << broken.err;
  EXPECT_NE(broken.err.find("hint: allowed here:"), std::string::npos) << broken.err;
  s = Show("nightly");
  EXPECT_EQ(s["snapshot"], kV1);
  EXPECT_EQ(s["snapshot_taken_at"], taken);
  // So are a bad cron and a parameter the pipeline does not have; nothing is written.
  Write(file, kV2);
  EXPECT_EQ(RunTrnflow("schedule update nightly --cron \"61 * * * *\"").exit_code, 2);
  CliResult param = RunTrnflow("schedule update nightly --param greting=hey");
  EXPECT_EQ(param.exit_code, 2);
  EXPECT_NE(param.err.find("--param greting: the pipeline has no parameter 'greting'"),
            std::string::npos)
      << param.err;
  EXPECT_EQ(Show("nightly")["snapshot"], kV1);
  EXPECT_EQ(RunTrnflow("schedule update nosuch").exit_code, 2);

  // The update takes the file as it is now, with new params and cron.
  CliResult update =
      RunTrnflow("schedule update nightly --param greeting=hey --cron \"30 3 * * *\"");
  ASSERT_EQ(update.exit_code, 0) << update.out << update.err;
  EXPECT_NE(update.out.find("new snapshot of " + file), std::string::npos) << update.out;
  s = Show("nightly");
  EXPECT_EQ(s["file_state"], "unchanged");
  EXPECT_EQ(s["snapshot"], kV2);
  EXPECT_EQ(s["params"], nlohmann::json({{"greeting", "hey"}}));
  EXPECT_EQ(s["cron"], "30 3 * * *");
  for (const auto& slot : s["next_slots"])
    EXPECT_NE(slot.get<std::string>().find("T03:30:00Z"), std::string::npos) << slot;
  EXPECT_EQ(LsLine("nightly").find("file changed"), std::string::npos) << LsLine("nightly");

  // --file takes another file; --reset-params drops the stored ones.
  std::string other = WriteTempFile("nightly-other.yaml", kV1);
  ASSERT_EQ(RunTrnflow("schedule update nightly --file " + other + " --reset-params").exit_code,
            0);
  s = Show("nightly");
  EXPECT_EQ(s["file"], other);
  EXPECT_EQ(s["snapshot"], kV1);
  EXPECT_EQ(s["params"], nlohmann::json::object());

  // The file gone (as on a scheduler host without it): the snapshot still fires, and says so.
  std::filesystem::remove(other);
  s = Show("nightly");
  EXPECT_EQ(s["file_state"], "unreadable");
  EXPECT_EQ(s["snapshot"], kV1);
  EXPECT_NE(LsLine("nightly").find("file not here"), std::string::npos) << LsLine("nightly");
  EXPECT_NE(RunTrnflow("schedule show nightly").out.find("not readable here"), std::string::npos);
  CliResult gone = RunTrnflow("schedule update nightly");
  EXPECT_EQ(gone.exit_code, 2) << "nothing to take a snapshot of";
  EXPECT_EQ(Show("nightly")["snapshot"], kV1);
  EXPECT_EQ(RunTrnflow("schedule show nosuch").exit_code, 2);
  std::filesystem::remove(file);
}

}  // namespace
}  // namespace trnflow
