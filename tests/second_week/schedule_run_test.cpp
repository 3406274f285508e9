// Issue 35: `trnflow schedule run NAME` fires a schedule now, as its cron would — the same
// snapshot and params, submitted through the same function — recorded as a manual fire that
// takes no slot of the cron's, so the catch-up of missed slots is unchanged. The README's
// "Scheduling the precompilation" commands run here as written and print what it shows.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

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
    ::testing::AddGlobalTestEnvironment(new TestDatabase("schedrun"));

const std::string kPipeline = R"(pipeline: try-now
project: sched-lab
params:
  greeting: hello
stages:
  greet:
    run: ["echo", "${{ params.greeting }}"]
    instance: c6i.xlarge
)";

std::string Q(schema::Catalog& c, const std::string& sql) {
  return schema::testing::QueryValue(c, sql);
}

TEST(ScheduleRun, FiresTheSnapshotNowAndLeavesTheCronAlone) {
  schema::Catalog c(TestDatabase::url());
  std::string file = WriteTempFile("try-now.yaml", kPipeline);
  CliResult add = RunTrnflow("schedule add trynow " + file +
                             " --cron \"0 2 * * *\" --param greeting=hi --catchup all");
  ASSERT_EQ(add.exit_code, 0) << add.out << add.err;
  // The file changes after the snapshot: the manual fire still fires the snapshot.
  std::ofstream(file, std::ios::trunc) << "not: a pipeline\n";
  std::string last_slot = Q(c, "SELECT last_slot FROM trnflow.schedules WHERE name = 'trynow'");

  CliResult run = RunTrnflow("schedule run trynow --format json");
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  auto j = nlohmann::json::parse(run.out);
  int64_t id = std::stoll(j.at("run_id").get<std::string>());
  ASSERT_GT(id, 0);
  EXPECT_TRUE(j.at("manual").get<bool>());
  std::string r = std::to_string(id);
  EXPECT_EQ(Q(c, "SELECT p.name FROM trnflow.runs r JOIN trnflow.pipelines p ON p.id = "
                 "r.pipeline_id WHERE r.id = " + r),
            "try-now");
  EXPECT_EQ(Q(c, "SELECT project FROM trnflow.runs WHERE id = " + r), "sched-lab");
  EXPECT_EQ(Q(c, "SELECT params->>'greeting' FROM trnflow.runs WHERE id = " + r), "hi")
      << "the schedule's params";
  EXPECT_EQ(Q(c, "SELECT count(*) FROM trnflow.schedule_fires WHERE schedule = 'trynow' AND "
                 "manual AND run_id = " + r),
            "1");
  EXPECT_EQ(Q(c, "SELECT last_slot FROM trnflow.schedules WHERE name = 'trynow'"), last_slot)
      << "a manual fire takes no slot of the cron's";

  // Twice is two runs (each fire is recorded at its own moment).
  CliResult again = RunTrnflow("schedule run trynow");
  ASSERT_EQ(again.exit_code, 0) << again.out << again.err;
  EXPECT_NE(again.out.find("fired now (manual)"), std::string::npos) << again.out;
  EXPECT_EQ(Q(c, "SELECT count(*) FROM trnflow.schedule_fires WHERE schedule = 'trynow' AND manual"),
            "2");

  // The cron's missed slots are caught up as if no one had fired it by hand.
  schema::testing::QueryValue(
      c,
      "UPDATE trnflow.schedules SET last_slot = now() - interval '3 days' WHERE name = "
      "'trynow' RETURNING 1");
  EXPECT_EQ(scheduler::FireDueSchedules(c, std::chrono::system_clock::now()), 3);
  EXPECT_EQ(Q(c, "SELECT count(*) FROM trnflow.schedule_fires WHERE schedule = 'trynow' AND NOT "
                 "manual AND run_id IS NOT NULL"),
            "3");
  // `schedule ls` counts every fire.
  EXPECT_EQ(Q(c, "SELECT count(*) FROM trnflow.schedule_fires WHERE schedule = 'trynow'"), "5");
}

TEST(ScheduleRun, RefusesAPausedOrUnknownScheduleWithTheFix) {
  std::string file = WriteTempFile("paused.yaml", kPipeline);
  ASSERT_EQ(RunTrnflow("schedule add resting " + file + " --cron \"0 3 * * *\"").exit_code, 0);
  ASSERT_EQ(RunTrnflow("schedule pause resting").exit_code, 0);
  CliResult paused = RunTrnflow("schedule run resting");
  EXPECT_EQ(paused.exit_code, 2) << paused.out << paused.err;
  EXPECT_NE(paused.err.find("`trnflow schedule resume resting` first"), std::string::npos)
      << paused.err;
  CliResult unknown = RunTrnflow("schedule run restin");
  EXPECT_EQ(unknown.exit_code, 2) << unknown.out << unknown.err;
  EXPECT_NE(unknown.err.find("resting"), std::string::npos) << "names the near miss: "
                                                            << unknown.err;
  schema::Catalog c(TestDatabase::url());
  EXPECT_EQ(Q(c, "SELECT count(*) FROM trnflow.schedule_fires WHERE schedule = 'resting'"), "0");
  // A member of the schedule's project: told who may, as `budget set` is.
  std::string erin = TestDatabase::NewLogin("erin");
  ASSERT_EQ(RunTrnflow("schedule add erins " + file + " --cron \"0 4 * * *\" --project sched-lab").exit_code, 0);
  ASSERT_EQ(RunTrnflow("project add sched-lab --member trnflow_test_" +
                       TestDatabase::database_name() + "_erin")
                .exit_code,
            0);
  CliResult member = RunTrnflow("schedule run erins", "TRNFLOW_DATABASE_URL='" + erin + "'");
  EXPECT_EQ(member.exit_code, 4) << member.out << member.err;
  EXPECT_NE(member.err.find("firing schedule erins needs the daemons' login"), std::string::npos)
      << member.err;
  EXPECT_EQ(Q(c, "SELECT count(*) FROM trnflow.schedule_fires WHERE schedule = 'erins'"), "0");
}

// Digits to N and runs of spaces to one: the README's dates, ids and column widths are its own.
std::string Shape(std::string s) {
  s = std::regex_replace(s, std::regex(R"(\d+)"), "N");
  s = std::regex_replace(s, std::regex(R"( +)"), " ");
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n')) s.pop_back();
  return s;
}

TEST(ScheduleRun, TheReadmesScheduleCommandsRunAsShown) {
  // The README starts from a catalog without schedules.
  schema::Catalog c(TestDatabase::url());
  for (const auto& s : c.ListSchedules()) c.RemoveSchedule(s.name);
  std::ifstream in(std::string(TRNFLOW_SOURCE_DIR) + "/README.md");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string readme = ss.str();
  size_t start = readme.find("\n### Scheduling the precompilation\n");
  ASSERT_NE(start, std::string::npos);
  size_t end = readme.find("\n#", start + 5);
  std::istringstream section(readme.substr(start, end - start));
  // Each "$ build/trnflow ..." line of its blocks and the lines it shows under it.
  std::vector<std::pair<std::string, std::vector<std::string>>> commands;
  bool fenced = false;
  std::string line;
  while (std::getline(section, line)) {
    if (line.rfind("```", 0) == 0) {
      fenced = !fenced;
      continue;
    }
    if (!fenced) continue;
    if (line.rfind("$ build/trnflow ", 0) == 0)
      commands.push_back({line.substr(16), {}});
    else if (!commands.empty())
      commands.back().second.push_back(line);
  }
  ASSERT_GE(commands.size(), 3u);
  int ran = 0;
  for (const auto& [args, shown] : commands) {
    if (args.rfind("watch ", 0) == 0) continue;  // follows the run until workers end it
    CliResult r = RunTrnflow(args);
    ASSERT_EQ(r.exit_code, 0) << args << "\n" << r.out << r.err;
    std::istringstream out(r.out);
    std::vector<std::string> lines;
    while (std::getline(out, line)) lines.push_back(line);
    ASSERT_EQ(lines.size(), shown.size()) << "README: $ build/trnflow " << args << "\n" << r.out;
    for (size_t i = 0; i < shown.size(); ++i)
      EXPECT_EQ(Shape(lines[i]), Shape(shown[i])) << "README: $ build/trnflow " << args;
    ++ran;
  }
  EXPECT_EQ(ran, 3);
}

}  // namespace
}  // namespace trnflow
