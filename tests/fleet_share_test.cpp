// One fleet shared by several projects (issue 45): who gets the next free slot. The claim rule
// (migration 0032) gives it to the project furthest below its weighted running share of the
// pool, then priority, then age, with caps checked in the same statement. Tried the way a
// shared lab lives: slots freeing one at a time, a sweep of hundreds beside groups of a few,
// weights, caps raced by two workers, workers reserved for a project, and the real daemons.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <thread>

#include "schema/catalog.h"
#include "schema/catalog_testing.h"
#include "tests/daemon.h"
#include "tests/run_cli.h"
#include "tests/test_db.h"
#include "tests/test_engine.h"

namespace trnflow {
namespace {

using testing::Daemon;
using testing::RunTrnflow;
using testing::TestDatabase;
using testing::WriteTempFile;

const std::string kWorker = "00000000-0000-4000-8000-00000000f001";
const std::string kOtherWorker = "00000000-0000-4000-8000-00000000f002";

// A pipeline of `n` one-instance `true` commands on c6i.large (pool cpu) in `project`.
std::string Sweep(const std::string& project, int n, const std::string& extra = "") {
  std::string y = "pipeline: sweep-" + project + "\nproject: " + project + "\n" + extra +
                  "stages:\n  s:\n    run: [\"true\"]\n    instance: c6i.large\n    matrix: {i: [";
  for (int i = 0; i < n; ++i) y += (i ? "," : "") + std::to_string(i);
  return y + "]}\n";
}

int64_t SubmitSweep(schema::Catalog& c, const std::string& project, int n,
                    const std::string& extra = "") {
  return c.SubmitRun(testing::MustParse(Sweep(project, n, extra)), testing::FastSubmit());
}

std::map<std::string, int> RunningByProject(schema::Catalog& owner) {
  std::map<std::string, int> out;
  std::string rows = schema::testing::QueryValue(
      owner,
      "SELECT coalesce(string_agg(project || '=' || n, ',' ORDER BY project), '') FROM "
      "(SELECT project, count(*) AS n FROM trnflow.running_stages GROUP BY project) x");
  std::regex item(R"(([a-z0-9-]+)=(\d+))");
  for (std::sregex_iterator it(rows.begin(), rows.end(), item), end; it != end; ++it)
    out[(*it)[1]] = std::stoi((*it)[2]);
  return out;
}

class FleetShare : public ::testing::Test {
 protected:
  void TearDown() override {
    // Every test leaves the queue as it found it: nothing ready, nothing running.
    schema::Catalog owner(TestDatabase::owner_url());
    schema::testing::QueryValue(
        owner, "UPDATE trnflow.runs SET state = 'cancelled' WHERE state = 'running' RETURNING 1");
    schema::testing::QueryValue(owner, "DELETE FROM trnflow.ready_stages RETURNING 1");
    schema::testing::QueryValue(owner, "DELETE FROM trnflow.running_stages RETURNING 1");
    schema::testing::QueryValue(
        owner,
        "UPDATE trnflow.stages SET state = 'cancelled' WHERE state IN ('ready', 'running') "
        "RETURNING 1");
  }
};

// The issue's scenario, one slot at a time: a sweep of 300 fills the pool and keeps it full;
// two small groups arrive later. Every freed slot (one per claim, as a busy fleet frees them)
// goes to the project furthest below its share, so the small groups start within a few
// frees, not after the sweep. The old rule gave every one of those slots to the sweep (its
// first candidate had the oldest ready_at).
TEST_F(FleetShare, OneSlotFreeingAtATimeKeepsEveryGroupMoving) {
  schema::Catalog c(TestDatabase::url());
  SubmitSweep(c, "fs-vision", 300);
  std::vector<schema::ClaimedStage> running;
  for (int i = 0; i < 16; ++i) {  // the sweep fills the 16 slots, one claim each
    auto got = c.ClaimReadyStages("cpu", 1, kWorker, "fs:1", 60);
    ASSERT_EQ(got.size(), 1u);
    running.push_back(got[0]);
  }
  SubmitSweep(c, "fs-nlp", 10);
  SubmitSweep(c, "fs-climate", 10);
  // /metrics shows each project's queue and share: a starved group is visible.
  std::map<std::string, double> samples;
  for (const auto& m : c.Metrics())
    if (m.name.rfind("trnflow_project_", 0) == 0) {
      auto labels = nlohmann::json::parse(m.labels_json);
      samples[m.name + "/" + labels["project"].get<std::string>() + "/" +
              labels["pool"].get<std::string>()] = m.value;
    }
  EXPECT_EQ(samples["trnflow_project_ready_stages/fs-vision/cpu"], 284);
  EXPECT_EQ(samples["trnflow_project_running_stages/fs-vision/cpu"], 16);
  EXPECT_EQ(samples["trnflow_project_running_instances/fs-vision/cpu"], 16);
  EXPECT_EQ(samples["trnflow_project_ready_stages/fs-climate/cpu"], 10);
  EXPECT_EQ(samples["trnflow_project_running_stages/fs-climate/cpu"], 0);
  EXPECT_GE(samples["trnflow_project_oldest_ready_age_seconds/fs-vision/cpu"],
            samples["trnflow_project_oldest_ready_age_seconds/fs-climate/cpu"]);
  EXPECT_EQ(samples.count("trnflow_project_oldest_ready_age_seconds/fs-nlp/cpu"), 1u);
  // Slots free one at a time, oldest first; each free is one claim of one slot.
  std::map<std::string, int> started;
  std::map<std::string, int> first_free;  // the free at which a project first got a slot
  for (int free = 1; free <= 40; ++free) {
    ASSERT_EQ(
        schema::testing::CompleteAttempts(c, {schema::testing::Succeeded(running.front(), kWorker)})
            .size(),
        1u);
    running.erase(running.begin());
    auto got = c.ClaimReadyStages("cpu", 1, kWorker, "fs:1", 60);
    ASSERT_EQ(got.size(), 1u) << "free " << free;
    ++started[got[0].project];
    first_free.emplace(got[0].project, free);
    running.push_back(got[0]);
  }
  // The first two frees go to the two groups with nothing running.
  EXPECT_EQ(first_free["fs-nlp"] + first_free["fs-climate"], 3)
      << "nlp first at free " << first_free["fs-nlp"] << ", climate at "
      << first_free["fs-climate"];
  // Each group's 10 stages run within the next frees: 40 frees start all 20 of them, and the
  // sweep keeps a share (it is never starved either).
  EXPECT_EQ(started["fs-nlp"], 10);
  EXPECT_EQ(started["fs-climate"], 10);
  EXPECT_EQ(started["fs-vision"], 20);
}

// A claim of one slot and a claim of many give the same order: four free slots at once with
// three projects idle in the pool go one to each, and the fourth to the tie's oldest.
TEST_F(FleetShare, AClaimOfManySlotsSharesAsOneSlotClaimsDo) {
  schema::Catalog c(TestDatabase::url());
  SubmitSweep(c, "fs-many-a", 50);
  SubmitSweep(c, "fs-many-b", 50);
  SubmitSweep(c, "fs-many-c", 50);
  auto got = c.ClaimReadyStages("cpu", 6, kWorker, "fs:1", 60);
  std::map<std::string, int> by;
  for (const auto& s : got) ++by[s.project];
  EXPECT_EQ(by, (std::map<std::string, int>{{"fs-many-a", 2}, {"fs-many-b", 2}, {"fs-many-c", 2}}));
}

// Weights 2:1: with both projects always waiting, running shares settle at 2:1 and stay there
// while slots free one at a time.
TEST_F(FleetShare, WeightsTwoToOneGiveTwoToOneRunningShares) {
  schema::Catalog owner(TestDatabase::owner_url());
  schema::Catalog c(TestDatabase::url());
  SubmitSweep(c, "fs-heavy", 200);
  SubmitSweep(c, "fs-light", 200);
  owner.SetProjectShare("fs-heavy", {.weight = 2.0});
  std::vector<schema::ClaimedStage> running;
  for (int i = 0; i < 12; ++i) {
    auto got = c.ClaimReadyStages("cpu", 1, kWorker, "fs:1", 60);
    ASSERT_EQ(got.size(), 1u);
    running.push_back(got[0]);
  }
  EXPECT_EQ(RunningByProject(owner),
            (std::map<std::string, int>{{"fs-heavy", 8}, {"fs-light", 4}}));
  // A window of 60 one-slot frees, oldest first: the pool's 12 slots stay split 8:4 after
  // every claim (±1 while a free is being refilled), and the window's starts are 2:1.
  std::map<std::string, int> started;
  for (int free = 0; free < 60; ++free) {
    ASSERT_EQ(
        schema::testing::CompleteAttempts(c, {schema::testing::Succeeded(running.front(), kWorker)})
            .size(),
        1u);
    running.erase(running.begin());
    auto got = c.ClaimReadyStages("cpu", 1, kWorker, "fs:1", 60);
    ASSERT_EQ(got.size(), 1u);
    ++started[got[0].project];
    running.push_back(got[0]);
    auto now = RunningByProject(owner);
    EXPECT_NEAR(now["fs-heavy"], 8, 1) << "after free " << free;
  }
  EXPECT_EQ(started["fs-heavy"], 40);
  EXPECT_EQ(started["fs-light"], 20);
}

// Priority orders a project's own stages, and breaks a tie of shares; it never takes a slot
// from a project further below its share.
TEST_F(FleetShare, PriorityOrdersWithinAProjectNeverPastAnotherProjectsShare) {
  schema::Catalog c(TestDatabase::url());
  SubmitSweep(c, "fs-prio", 5);                                     // priority 0, older
  int64_t urgent = SubmitSweep(c, "fs-prio", 2, "priority: 50\n");  // newer, higher
  auto got = c.ClaimReadyStages("cpu", 1, kWorker, "fs:1", 60);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].run_id, urgent) << "the project's higher-priority stage goes first";
  // fs-prio holds 1 slot; fs-plain, priority 0, holds none: it goes first despite priority.
  SubmitSweep(c, "fs-plain", 3);
  got = c.ClaimReadyStages("cpu", 1, kWorker, "fs:1", 60);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].project, "fs-plain");
  // Now 1:1, a tie: priority breaks it (fs-prio's remaining urgent stage).
  got = c.ClaimReadyStages("cpu", 1, kWorker, "fs:1", 60);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].run_id, urgent);
  // A stage's own priority beats its pipeline's.
  auto p = testing::MustParse(
      "pipeline: own\nproject: fs-prio\npriority: 5\nstages:\n"
      "  low: {run: [\"true\"], instance: c6i.large, priority: -3}\n"
      "  high: {run: [\"true\"], instance: c6i.large}\n");
  ASSERT_EQ(p.stages.size(), 2u);
  EXPECT_EQ(p.stages[0].spec.priority, -3);
  EXPECT_EQ(p.stages[1].spec.priority, 5);
}

// Caps hold when two workers race for the last places: each claims one slot at a time as fast
// as it can, and the project never runs more than its cap, in all pools or in one.
TEST_F(FleetShare, CapsHoldWhenTwoWorkersRaceForTheLastPlace) {
  schema::Catalog owner(TestDatabase::owner_url());
  {
    schema::Catalog c(TestDatabase::url());
    SubmitSweep(c, "fs-capped", 100);
    SubmitSweep(c, "fs-free", 100);
  }
  owner.SetProjectShare("fs-capped", {.max_running = 3});
  std::atomic<int> capped_claims{0}, claims{0};
  auto race = [&](const std::string& worker) {
    schema::Catalog c(TestDatabase::url());
    for (int i = 0; i < 20; ++i)
      for (const auto& s : c.ClaimReadyStages("cpu", 1, worker, "race", 60)) {
        ++claims;
        if (s.project == "fs-capped") ++capped_claims;
      }
  };
  std::thread a(race, kWorker), b(race, kOtherWorker);
  a.join();
  b.join();
  EXPECT_EQ(claims.load(), 40);
  EXPECT_EQ(capped_claims.load(), 3);
  EXPECT_EQ(RunningByProject(owner)["fs-capped"], 3);
  // A pool cap below the project's cap is the tighter one; removing both lets it grow again.
  owner.SetProjectShare("fs-capped", {.max_running = -1, .pool_max_running = {{"cpu", 4}}});
  schema::Catalog c(TestDatabase::url());
  for (int i = 0; i < 5; ++i) c.ClaimReadyStages("cpu", 1, kWorker, "fs:1", 60);
  EXPECT_EQ(RunningByProject(owner)["fs-capped"], 4);
  owner.SetProjectShare("fs-capped", {.pool_max_running = {{"cpu", -1}}});
  for (int i = 0; i < 40; ++i) c.ClaimReadyStages("cpu", 1, kWorker, "fs:1", 60);
  EXPECT_GT(RunningByProject(owner)["fs-capped"], 4);
}

// A worker reserved for projects (`--project`) takes only theirs, however old the others'
// stages; a shared worker takes anyone's.
TEST_F(FleetShare, AReservedWorkerServesOnlyItsProjects) {
  schema::Catalog c(TestDatabase::url());
  SubmitSweep(c, "fs-res-old", 10);
  SubmitSweep(c, "fs-res-mine", 10);
  auto got = c.ClaimReadyStages("cpu", 4, kWorker, "fs:1", 60, 0, 0, {"fs-res-mine"});
  ASSERT_EQ(got.size(), 4u);
  for (const auto& s : got) EXPECT_EQ(s.project, "fs-res-mine");
  got = c.ClaimReadyStages("cpu", 4, kWorker, "fs:1", 60, 0, 0, {"fs-res-nobody"});
  EXPECT_TRUE(got.empty());
  got = c.ClaimReadyStages("cpu", 2, kWorker, "fs:1", 60);
  ASSERT_EQ(got.size(), 2u);
  for (const auto& s : got) EXPECT_EQ(s.project, "fs-res-old") << "the project below its share";
}

// From the command line: weights and caps set and shown, bad values refused with exit 2 and
// nothing written, `explain` naming the share and the cap, and a worker for a project that
// does not exist refused.
TEST_F(FleetShare, TheLeversWorkFromTheCommandLine) {
  ASSERT_EQ(RunTrnflow("project add fs-cli-a --weight 2 --max-running 6").exit_code, 0);
  auto up = RunTrnflow("project update fs-cli-a --max-running cpu=2 --weight 3");
  ASSERT_EQ(up.exit_code, 0) << up.err;
  EXPECT_NE(up.out.find("weight 3, at most 6 running (cpu: 2)"), std::string::npos) << up.out;
  auto ls = RunTrnflow("project ls --format json");
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  bool seen = false;
  for (const auto& p : nlohmann::json::parse(ls.out))
    if (p["project"] == "fs-cli-a") {
      seen = true;
      EXPECT_EQ(p["weight"], 3.0);
      EXPECT_EQ(p["max_running"], 6);
      EXPECT_EQ(p["pool_max_running"]["cpu"], 2);
    }
  EXPECT_TRUE(seen) << ls.out;
  for (const char* bad : {"--weight 0", "--weight 2000", "--max-running -1", "--max-running lots",
                          "--max-running trn9=2"}) {
    auto r = RunTrnflow(std::string("project update fs-cli-a ") + bad);
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.out << r.err;
  }
  EXPECT_EQ(RunTrnflow("project update fs-cli-nope --weight 2").exit_code, 2);
  EXPECT_EQ(RunTrnflow("project update fs-cli-a").exit_code, 2);  // nothing to change
  auto unchanged = RunTrnflow("project ls");
  EXPECT_NE(unchanged.out.find("weight 3, at most 6 running (cpu: 2)"), std::string::npos)
      << unchanged.out;

  // The cap shows in explain once the project is at it.
  schema::Catalog c(TestDatabase::url());
  int64_t run = SubmitSweep(c, "fs-cli-a", 4);
  EXPECT_EQ(c.ClaimReadyStages("cpu", 4, kWorker, "fs:1", 60).size(), 2u);
  auto why = RunTrnflow("explain " + std::to_string(run) + " \"s[i=3]\"");
  EXPECT_NE(why.out.find("project fs-cli-a is at its cpu cap: 2 of at most 2 cpu stages run"),
            std::string::npos)
      << why.out << why.err;
  EXPECT_NE(why.out.find("holds 2 of the 2 cpu instances in use (weight 3)"), std::string::npos)
      << why.out;
  auto w = RunTrnflow("worker --pool cpu=1 --project fs-cli-nope");
  EXPECT_EQ(w.exit_code, 2) << w.err;
  EXPECT_NE(w.err.find("no such project"), std::string::npos) << w.err;

  // A real worker reserved for another project: listed with its project, it takes none of
  // fs-cli-a's stages, and explain says why none of the live cpu workers serves them.
  ASSERT_EQ(RunTrnflow("project add fs-cli-other").exit_code, 0);
  Daemon reserved("fs-reserved", {"worker", "--pool", "cpu=2", "--project", "fs-cli-other"},
                  {"TRNFLOW_HOME=" + testing::CliHome()});
  reserved.Start();
  ASSERT_TRUE(testing::WaitFor(
      [] {
        auto ls = RunTrnflow("workers --format json");
        for (const auto& x : nlohmann::json::parse(ls.out.empty() ? "[]" : ls.out))
          if (x["projects"] == nlohmann::json{"fs-cli-other"}) return true;
        return false;
      },
      20));
  why = RunTrnflow("explain " + std::to_string(run) + " \"s[i=3]\"");
  EXPECT_NE(why.out.find("1 live worker(s) with a cpu pool serve only other projects"),
            std::string::npos)
      << why.out << why.err;
  EXPECT_EQ(testing::Query("SELECT count(*) FROM trnflow.stages WHERE run_id = " +
                           std::to_string(run) + " AND state = 'ready'"),
            "2")
      << "the reserved worker took another project's stages";
  reserved.Kill(9);
}

// The scenario with the real daemons: a worker process with four cpu slots and a scheduler; a
// sweep of 40 commands of 1.2 to 2.8 s (slots free one at a time) fills it; 2 s later two
// groups submit 4 commands each. Their queue waits, from the ledger's queued_at and
// started_at, stay within a few stage lengths, while the sweep alone would hold the pool for
// ~20 s more.
TEST_F(FleetShare, ThreeGroupsOnRealDaemonsEachKeepMoving) {
  std::string home = testing::CliHome();
  Daemon worker("fs-worker", {"worker", "--pool", "cpu=4", "--lease", "5"},
                {"TRNFLOW_HOME=" + home});
  Daemon scheduler("fs-scheduler", {"scheduler"}, {"TRNFLOW_HOME=" + home});
  auto file = [](const std::string& project, int n) {
    std::string y = "pipeline: p-" + project + "\nproject: " + project +
                    "\nstages:\n  s:\n    run: [sleep, \"${{ matrix.d }}\"]\n"
                    "    instance: c6i.large\n    matrix: {d: [";
    for (int i = 0; i < n; ++i) {
      char d[16];
      std::snprintf(d, sizeof d, "%.2f", 1.2 + 1.6 * ((i * 7) % n) / n);
      y += (i ? "," : "") + std::string(d);
    }
    return WriteTempFile("fs-" + project + ".yaml", y + "]}\n");
  };
  std::string sweep = file("fs-d-vision", 40), nlp = file("fs-d-nlp", 4),
              climate = file("fs-d-climate", 4);
  ASSERT_EQ(RunTrnflow("submit " + sweep + " --speed 1").exit_code, 0);
  worker.Start();
  scheduler.Start();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  ASSERT_EQ(RunTrnflow("submit " + nlp + " --speed 1").exit_code, 0);
  ASSERT_EQ(RunTrnflow("submit " + climate + " --speed 1").exit_code, 0);
  // Until both groups have finished.
  ASSERT_TRUE(testing::WaitFor(
      [] {
        return testing::Query(
                   "SELECT count(*) FROM trnflow.runs WHERE project IN "
                   "('fs-d-nlp', 'fs-d-climate') AND state = 'succeeded'") == "2";
      },
      60))
      << "the small groups did not finish within a minute";
  auto wait = [](const std::string& project, const std::string& what) {
    return std::stod(
        testing::Query("SELECT " + what +
                       " FROM (SELECT extract(epoch FROM a.started_at - a.queued_at) AS w "
                       "FROM trnflow.attempts a JOIN trnflow.runs r ON r.id = a.run_id "
                       "WHERE r.project = '" +
                       project + "') x"));
  };
  const std::string p50 = "percentile_cont(0.5) WITHIN GROUP (ORDER BY w)", max = "max(w)";
  // A stage is ~2 s: the median wait within ~2 stages, the longest within ~4; the sweep still
  // had stages waiting when the groups were done (they did not wait for it to end).
  for (const std::string project : {"fs-d-nlp", "fs-d-climate"}) {
    EXPECT_LT(wait(project, p50), 4.5) << project;
    EXPECT_LT(wait(project, max), 8.5) << project;
  }
  EXPECT_NE(testing::Query("SELECT state FROM trnflow.runs WHERE project = 'fs-d-vision'"),
            "succeeded")
      << "the sweep ended first: the test proved nothing about sharing";
  worker.Kill(9);
  scheduler.Kill(9);
}

}  // namespace
}  // namespace trnflow

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new trnflow::testing::TestDatabase("trnflow_fleet_test"));
  return RUN_ALL_TESTS();
}
