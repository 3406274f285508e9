// The catalog and the engine against a real PostgreSQL: submission, claims, fencing, the
// rescuer, and whole runs executed by in-process workers and a scheduler.
#include "schema/catalog.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "common/error.h"
#include "common/sha256.h"
#include "pipelines/pipeline.h"
#include "scheduler/scheduler.h"
#include "schema/catalog_testing.h"
#include "sim/catalog.h"
#include "sim/perf_model.h"
#include "tests/run_cli.h"
#include "tests/test_db.h"
#include "tests/test_engine.h"
#include "workers/artifact_store.h"
#include "workers/stage_cache.h"
#include "workers/worker.h"

namespace trnflow {
namespace {

using testing::RunStateText;
using testing::TestDatabase;
using testing::WaitFor;

using testing::MustParse;

std::string Home() { return testing::TestHome(); }

workers::WorkerOptions WorkerOpts(std::vector<workers::PoolConfig> pools) {
  return testing::TestWorkerOptions(std::move(pools));
}

scheduler::SchedulerOptions SchedOpts() { return testing::TestSchedulerOptions(); }

schema::SubmitOptions Fast() { return testing::FastSubmit(); }

// Stages out of step with the queue tables (tests/test_db.h); "0" when all is well.
std::string QueueMismatches() { return testing::Query(testing::kQueueMismatchesSql); }

// A second, empty catalog database beside this binary's (its name: the binary's + suffix),
// dropped with the roles its catalog made when the test ends.
struct ScratchDatabase {
  explicit ScratchDatabase(const std::string& suffix)
      : name(TestDatabase::database_name() + suffix),
        owner_url(schema::CreateDatabase(testing::AdminUrl(), name)) {}
  ~ScratchDatabase() {
    schema::DropDatabase(testing::AdminUrl(), name);
    schema::DropCatalogRoles(testing::AdminUrl(), name);
  }
  std::string name;
  std::string owner_url;
};

bool RunEnded(schema::Catalog& c, int64_t run) { return RunStateText(c, run) != "running"; }

// A wide DAG: one root, `width` parallel sim stages, one fan-in.
std::string FanOut(int width) {
  std::string y =
      "pipeline: fan\nproject: lab\nstages:\n  root:\n    run: [\"true\"]\n"
      "  work:\n    kind: compile\n    needs: [root]\n    target: inf2\n"
      "    instance: trn1.2xlarge\n    model: bert-large\n    cache: false\n    matrix: {i: [";
  for (int i = 0; i < width; ++i) y += (i ? "," : "") + std::to_string(i);
  y += "]}\n  join:\n    run: [\"true\"]\n    needs: [work]\n";
  return y;
}

}  // namespace

TEST(Catalog, MigrateIsIdempotentAndLoadsPrices) {
  // Only the schema owner migrates; the daemons' login may not.
  EXPECT_THROW(schema::Catalog(TestDatabase::url()).Migrate(sim::Catalog::Builtin()),
               PermissionDenied);
  schema::Catalog c(TestDatabase::owner_url());
  auto again = c.Migrate(sim::Catalog::Builtin());
  EXPECT_TRUE(again.applied.empty());
  EXPECT_EQ(again.to_version, schema::testing::BinarySchemaVersion());
  c.RequireCurrentSchema();
  EXPECT_EQ(schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.instance_types"),
            std::to_string(sim::Catalog::Builtin().instances().size()));
  // A second migrate must not add price rows when nothing changed.
  EXPECT_EQ(schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.prices"),
            std::to_string(sim::Catalog::Builtin().instances().size()));
  EXPECT_EQ(schema::testing::QueryValue(
                c,
                "SELECT on_demand_usd_hour::text FROM trnflow.prices WHERE instance_type "
                "= 'trn1.32xlarge'"),
            sim::Catalog::Builtin().FindInstance("trn1.32xlarge")->on_demand_per_hour.ToDecimal());
}

// The preemption rule has one statement per language: IsPreemption (C++) and
// trnflow.is_preemption (SQL, migration 0029), which the ledger's views and CompleteAttempts
// ask. They agree on every outcome, and every outcome C++ knows is one the ledger accepts.
TEST(Catalog, PreemptionIsTheSameRuleInCppAndSql) {
  int preemptions = 0;
  for (int i = 0; i <= static_cast<int>(Outcome::kBudgetExceeded); ++i) {
    Outcome o = static_cast<Outcome>(i);
    std::string name(ToString(o));
    EXPECT_EQ(testing::Query("SELECT trnflow.is_preemption('" + name + "')"),
              IsPreemption(o) ? "t" : "f")
        << name;
    EXPECT_EQ(testing::Query("SELECT pg_get_constraintdef(oid) LIKE '%''" + name +
                             "''::text%' FROM pg_constraint WHERE conname = "
                             "'attempts_outcome_check'"),
              "t")
        << name << " is not an outcome the ledger accepts";
    preemptions += IsPreemption(o);
  }
  EXPECT_EQ(preemptions, 3);
  EXPECT_EQ(testing::Query("SELECT trnflow.is_preemption('no_such_outcome')"), "f");
}

TEST(Catalog, UnreachableServerIsCatalogUnavailableWithoutThePassword) {
  try {
    schema::Catalog c("postgresql://trnflow:hunter2@127.0.0.1:1/trnflow?connect_timeout=2");
    FAIL() << "connected to port 1?";
  } catch (const CatalogUnavailable& e) {
    std::string what = e.what();
    EXPECT_EQ(what.find("hunter2"), std::string::npos) << what;
    EXPECT_NE(what.find("postgresql://trnflow:***@127.0.0.1:1/trnflow"), std::string::npos) << what;
  }
}

TEST(Catalog, SubmitWritesRunStagesAndDependenciesAtomically) {
  schema::Catalog c(TestDatabase::url());
  auto p = MustParse(FanOut(5));
  int64_t run = c.SubmitRun(p, Fast());
  auto stages = c.GetStages(run);
  ASSERT_EQ(stages.size(), 7u);
  std::map<std::string, schema::StageRow> by;
  for (const auto& s : stages) by[s.name] = s;
  EXPECT_EQ(schema::ToSql(by["root"].state), "ready");
  EXPECT_EQ(schema::ToSql(by["work[i=3]"].state), "blocked");
  EXPECT_EQ(by["join"].needs.size(), 5u);
  EXPECT_EQ(by["join"].needs[0], "work[i=0]");
  EXPECT_EQ(schema::testing::QueryValue(
                c,
                "SELECT count(*) FROM trnflow.stage_deps d JOIN trnflow.stages s ON "
                "s.id = d.stage_id WHERE s.run_id = " +
                    std::to_string(run)),
            "10");
  // The same text submitted twice is stored once.
  int64_t again = c.SubmitRun(p, Fast());
  EXPECT_NE(again, run);
  EXPECT_EQ(
      schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.pipelines WHERE name = 'fan'"),
      "1");
}

TEST(Catalog, SubmitRefusesAnInstanceTypeTheCatalogDoesNotHaveAndWritesNothing) {
  // The parser knows the catalog's instance types, but submit_run is callable by any member
  // with whatever arrays they like: the check is in SQL (it was the stages' foreign key).
  schema::Catalog c(TestDatabase::url());
  auto p = MustParse(FanOut(3));
  p.stages[2].spec.instance = "x9.imaginary";
  std::string runs = schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.runs");
  std::string stages = schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.stages");
  try {
    c.SubmitRun(p, Fast());
    FAIL() << "a stage on an unknown instance type was submitted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("unknown instance type \"x9.imaginary\""),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.runs"), runs);
  EXPECT_EQ(schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.stages"), stages);
}

TEST(Catalog, ClaimTakesOnlyWhatFitsAndFencesCompletion) {
  schema::Catalog c(TestDatabase::url());
  auto p = MustParse(
      "pipeline: cap\nproject: lab\nstages:\n"
      "  a: {kind: compile, target: inf2, instance: trn1.32xlarge, count: 2, model: bert-large, "
      "cache: false}\n"
      "  b: {kind: compile, target: inf2, instance: trn1.32xlarge, count: 2, model: bert-large, "
      "cache: false}\n"
      "  c: {kind: compile, target: inf2, instance: trn1.32xlarge, count: 2, model: bert-large, "
      "cache: false}\n");
  int64_t run = c.SubmitRun(p, Fast());
  const std::string me = "00000000-0000-4000-8000-000000000001";
  const std::string other = "00000000-0000-4000-8000-000000000002";
  auto claimed = c.ClaimReadyStages("trn1", 5, me, "test:1", 30);
  ASSERT_EQ(claimed.size(), 2u);  // 2 + 2 instances fit in 5; a third would need 6
  EXPECT_EQ(claimed[0].attempt, 1);
  EXPECT_EQ(claimed[0].price_per_hour,
            sim::Catalog::Builtin().FindInstance("trn1.32xlarge")->on_demand_per_hour);
  EXPECT_TRUE(c.ClaimReadyStages("trn1", 1, other, "test:2", 30).empty());  // count 2 > 1

  schema::AttemptResult r;
  r.stage_id = claimed[0].stage_id;
  r.attempt = 1;
  r.lease_owner = other;  // not the holder: must change nothing
  r.outcome = Outcome::kSucceeded;
  r.next_state = StageState::kSucceeded;
  r.cost = Money::FromMicros(1'000'000);
  EXPECT_TRUE(schema::testing::CompleteAttempts(c, {r}).empty());
  r.lease_owner = me;
  r.attempt = 2;  // wrong attempt
  EXPECT_TRUE(schema::testing::CompleteAttempts(c, {r}).empty());
  r.attempt = 1;
  EXPECT_EQ(schema::testing::CompleteAttempts(c, {r}).size(), 1u);
  EXPECT_TRUE(schema::testing::CompleteAttempts(c, {r}).empty());  // closed once
  EXPECT_EQ(schema::testing::QueryValue(
                c, "SELECT sum(cost_usd)::text FROM trnflow.attempt_ledger WHERE run_id = " +
                       std::to_string(run)),
            "1.000000");
  // The ledger refuses edits of a closed attempt.
  EXPECT_ANY_THROW(schema::testing::QueryValue(
      c, "UPDATE trnflow.attempts SET cost_usd = 0 WHERE run_id = " + std::to_string(run) +
             " AND outcome IS NOT NULL RETURNING 1"));
}

TEST(Catalog, ClaimCanBeLimitedToOneRun) {
  schema::Catalog c(TestDatabase::url());
  // Tests before this one in the same database may have left ready cpu stages: take them
  // first, so the unlimited claim below can only find this test's own.
  while (!c.ClaimReadyStages("cpu", 1000, "00000000-0000-4000-8000-000000000004", "test:4", 30)
              .empty()) {
  }
  auto p = MustParse("pipeline: one\nproject: lab\nstages:\n  a:\n    run: [\"true\"]\n");
  int64_t first = c.SubmitRun(p, Fast());
  int64_t second = c.SubmitRun(p, Fast());
  const std::string me = "00000000-0000-4000-8000-000000000003";
  auto claimed = c.ClaimReadyStages("cpu", 10, me, "test:3", 30, second);
  ASSERT_EQ(claimed.size(), 1u);
  EXPECT_EQ(claimed[0].run_id, second);
  claimed = c.ClaimReadyStages("cpu", 10, me, "test:3", 30);
  ASSERT_EQ(claimed.size(), 1u);
  EXPECT_EQ(claimed[0].run_id, first);
}

// A worker woken by an announcement takes a bite, not the whole burst (workers/worker.cpp):
// the claim stops at max_stages however much room there is, and leaves the rest unlocked.
TEST(Catalog, AClaimTakesAtMostTheStagesItIsAskedFor) {
  schema::Catalog c(TestDatabase::url());
  int64_t run = c.SubmitRun(MustParse("pipeline: bite\nproject: lab\nstages:\n"
                                      "  s: {run: [\"true\"], matrix: {i: [1, 2, 3, 4, 5]}}\n"),
                            Fast());
  const std::string me = "00000000-0000-4000-8000-000000000006";
  auto first = c.ClaimReadyStages("cpu", 100, me, "test:6", 30, run, 2);
  EXPECT_EQ(first.size(), 2u);
  auto rest = c.ClaimReadyStages("cpu", 100, me, "test:6", 30, run);
  EXPECT_EQ(rest.size(), 3u);
}

// A claim locks a queue row and then its stage; a cancel or a resume locks stages and then
// their queue rows. Claims racing both neither deadlock nor leave a ready stage out of the
// queue (or a queue row behind a stage that is not ready).
TEST(Catalog, ClaimsRacingACancelAndAResumeNeitherDeadlockNorStrandAStage) {
  schema::Catalog c(TestDatabase::url());
  std::string matrix;
  for (int i = 0; i < 600; ++i) matrix += (i ? "," : "") + std::to_string(i);
  for (int round = 0; round < 3; ++round) {
    int64_t run = c.SubmitRun(MustParse("pipeline: race\nproject: lab\nstages:\n"
                                        "  s: {run: [\"true\"], matrix: {i: [" + matrix + "]}}\n"),
                              Fast());
    std::atomic<bool> stop{false};
    std::atomic<int> errors{0}, claimed{0};
    std::vector<std::thread> claimers;
    for (int t = 0; t < 3; ++t)
      claimers.emplace_back([&, t] {
        schema::Catalog mine(TestDatabase::url());
        const std::string me = "00000000-0000-4000-8000-00000000010" + std::to_string(t);
        while (!stop) {
          try {
            claimed += static_cast<int>(
                mine.ClaimReadyStages("cpu", 3, me, "race:" + std::to_string(t), 30, run).size());
          } catch (const std::exception& e) {
            ++errors;
            ADD_FAILURE() << e.what();
          }
        }
      });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_TRUE(c.CancelRun(run).cancelled);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    c.ResumeRun(run);  // the cancelled stages are ready again, under the same claims
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(QueueMismatches(), "0");  // mid-race, in one snapshot
    stop = true;
    for (auto& t : claimers) t.join();
    EXPECT_EQ(errors, 0);
    EXPECT_EQ(QueueMismatches(), "0");
    // Every stage is running (claimed once), still ready in the queue, or cancelled.
    const std::string r = std::to_string(run);
    EXPECT_EQ(
        schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.stages WHERE run_id = " + r +
                                           " AND state NOT IN ('running', 'ready', 'cancelled')"),
        "0");
    EXPECT_EQ(schema::testing::QueryValue(
                  c, "SELECT count(*) FROM trnflow.running_stages WHERE run_id = " + r),
              std::to_string(claimed.load()));
  }
}

// A worker that closes a batch claims, in the same transaction, the stages the batch released.
// Announcing those woke every listening worker (the releasing one too) for a claim that found
// nothing; only what the transaction leaves ready is announced.
TEST(Catalog, ACompletionAnnouncesOnlyTheReleasedStagesItDidNotClaimItself) {
  schema::Catalog c(TestDatabase::url());
  schema::Catalog listener(TestDatabase::url());
  listener.ListenForReadyStages();
  int64_t run = c.SubmitRun(MustParse("pipeline: wake\nproject: lab\nstages:\n"
                                      "  a: {run: [\"true\"]}\n"
                                      "  b: {run: [\"true\"], needs: [a]}\n"
                                      "  c: {run: [\"true\"], needs: [a]}\n"
                                      "  d: {run: [\"true\"], needs: [b]}\n"),
                            Fast());
  auto drained = [&] {  // what earlier statements announced, the submit's own included
    while (listener.AwaitNotifications(200).ready > 0) {
    }
    return true;
  };
  const std::string me = "00000000-0000-4000-8000-000000000005";
  auto done = [&](const schema::ClaimedStage& s) {
    schema::AttemptResult r;
    r.stage_id = s.stage_id;
    r.attempt = s.attempt;
    r.lease_owner = me;
    return r;
  };
  auto a = c.ClaimReadyStages("cpu", 10, me, "test:5", 30, run);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_TRUE(drained());

  // a releases b and c; this transaction claims both: nobody is woken.
  auto first = c.CompleteAndClaim({done(a[0])}, {{"cpu", 10}}, me, "test:5", 30, run);
  ASSERT_EQ(first.applied.size(), 1u);
  ASSERT_EQ(first.claimed.size(), 1u);
  ASSERT_EQ(first.claimed[0].size(), 2u);
  EXPECT_EQ(listener.AwaitNotifications(500).ready, 0);

  // b releases d, and this transaction has no room for it: the pool is announced.
  const auto& b = first.claimed[0][0].spec.name == "b" ? first.claimed[0][0] : first.claimed[0][1];
  auto second = c.CompleteAndClaim({done(b)}, {{"cpu", 0}}, me, "test:5", 30, run);
  ASSERT_EQ(second.applied.size(), 1u);
  EXPECT_GT(listener.AwaitNotifications(2000).ready, 0);
  EXPECT_EQ(schema::testing::QueryValue(
                c, "SELECT state FROM trnflow.stages WHERE name = 'd' AND run_id = " +
                       std::to_string(run)),
            "ready");
}

TEST(Catalog, RescuerEndsExpiredLeasesAsLostAndTheStageRunsAgain) {
  schema::Catalog c(TestDatabase::url());
  auto p = MustParse(
      "pipeline: lost\nproject: lab\nstages:\n"
      "  a:\n    kind: compile\n    target: inf2\n    instance: trn1.2xlarge\n"
      "    model: bert-large\n    cache: false\n    retry: {backoff: {initial: 1s}}\n");
  int64_t run = c.SubmitRun(p, Fast());
  // A worker that claims and then dies: its lease runs out.
  auto claimed =
      c.ClaimReadyStages("trn1", 1, "00000000-0000-4000-8000-0000000000de", "dead:1", 0.2);
  ASSERT_EQ(claimed.size(), 1u);
  scheduler::Scheduler sched(SchedOpts());
  EXPECT_EQ(QueueMismatches(), "0");  // claimed: out of the queue, into running_stages
  workers::Worker worker(WorkerOpts({{"trn1", 2}}));
  sched.Start();
  ASSERT_TRUE(WaitFor(
      [&] {
        return c.GetAttempts(run).size() >= 1 &&
               schema::ToSql(c.GetAttempts(run)[0].outcome) == "lost";
      },
      10));
  worker.Start();
  ASSERT_TRUE(WaitFor([&] { return RunEnded(c, run); }, 20));
  EXPECT_EQ(RunStateText(c, run), "succeeded");
  auto attempts = c.GetAttempts(run);
  ASSERT_EQ(attempts.size(), 2u);
  EXPECT_EQ(schema::ToSql(attempts[0].outcome), "lost");
  EXPECT_EQ(attempts[0].worker, "dead:1");
  EXPECT_GT(attempts[0].cost.micros(), 0);
  EXPECT_EQ(attempts[0].wasted, attempts[0].cost);
  EXPECT_EQ(schema::ToSql(attempts[1].outcome), "succeeded");
  EXPECT_EQ(QueueMismatches(), "0");
}

TEST(Engine, FailingRunStageFailsTheRunAndSkipsDependents) {
  schema::Catalog c(TestDatabase::url());
  auto p = MustParse(
      "pipeline: broken\nproject: lab\nstages:\n"
      "  ok:\n    run: [\"true\"]\n"
      "  bad:\n    run: [\"bash\", \"-c\", \"echo going down; exit 3\"]\n    needs: [ok]\n"
      "  after:\n    run: [\"true\"]\n    needs: [bad]\n"
      "  later:\n    run: [\"true\"]\n    needs: [after]\n"
      "  side:\n    run: [\"true\"]\n    needs: [ok]\n");
  int64_t run = c.SubmitRun(p, Fast());
  scheduler::Scheduler sched(SchedOpts());
  workers::Worker worker(WorkerOpts({{"cpu", 4}}));
  sched.Start();
  worker.Start();
  ASSERT_TRUE(WaitFor([&] { return RunEnded(c, run); }, 30));
  EXPECT_EQ(RunStateText(c, run), "failed");
  std::map<std::string, std::string> state;
  for (const auto& s : c.GetStages(run)) state[s.name] = schema::ToSql(s.state);
  EXPECT_EQ(state["ok"], "succeeded");
  EXPECT_EQ(state["bad"], "failed");
  EXPECT_EQ(state["after"], "skipped");
  EXPECT_EQ(state["later"], "skipped");
  EXPECT_EQ(state["side"], "succeeded");
  EXPECT_EQ(QueueMismatches(), "0");  // the skipped stages wait for nothing
  auto attempts = c.GetAttempts(run);
  bool found = false;
  for (const auto& a : attempts)
    if (schema::ToSql(a.outcome) == "failed") {
      found = true;
      EXPECT_NE(a.message.find("exited with code 3"), std::string::npos) << a.message;
    }
  EXPECT_TRUE(found);
  // The failing command's output was captured.
  std::string log = Home() + "/logs/run-" + std::to_string(run) + "/bad.attempt-1.log";
  std::ifstream in(log);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("going down"), std::string::npos) << log;
}

TEST(Engine, InfraErrorsAreRetriedWithBackoff) {
  schema::Catalog c(TestDatabase::url());
  // Exit 75 (EX_TEMPFAIL) on the first attempt, success on the second.
  auto p = MustParse(
      "pipeline: flaky\nproject: lab\nstages:\n"
      "  f:\n    run: [\"bash\", \"-c\", \"[ \\\"$TRNFLOW_ATTEMPT\\\" = 2 ] || exit 75\"]\n"
      "    retry: {max_attempts: 3, backoff: {initial: 1s}}\n");
  int64_t run = c.SubmitRun(p, Fast());
  scheduler::Scheduler sched(SchedOpts());
  workers::Worker worker(WorkerOpts({{"cpu", 1}}));
  // The worker alone first: only the scheduler's promoter ends a backoff (at this speed a
  // backoff of 1 s is over at its next tick), so without it retry_wait holds until the test has
  // looked. What the test waits for persists: the first attempt's ledger row, closed.
  worker.Start();
  ASSERT_TRUE(WaitFor([&] {  // closed: open attempts are listed too, without an outcome
    auto a = c.GetAttempts(run);
    return !a.empty() && a[0].outcome.has_value();
  }, 10));
  EXPECT_EQ(schema::ToSql(c.GetAttempts(run)[0].outcome), "infra_error");
  EXPECT_EQ(schema::ToSql(c.GetStages(run)[0].state), "retry_wait");
  EXPECT_EQ(QueueMismatches(), "0");  // waiting out its backoff, not in the queue
  sched.Start();
  ASSERT_TRUE(WaitFor([&] { return RunEnded(c, run); }, 30));
  EXPECT_EQ(RunStateText(c, run), "succeeded");
  auto attempts = c.GetAttempts(run);
  ASSERT_EQ(attempts.size(), 2u);
  EXPECT_EQ(schema::ToSql(attempts[0].outcome), "infra_error");
  EXPECT_EQ(schema::ToSql(attempts[1].outcome), "succeeded");
  EXPECT_EQ(QueueMismatches(), "0");
}

// Spot interruptions come from the run's seed: the same seed replays the same market.
TEST(Engine, SameSeedSameInterruptionsAndCheckpointsBoundTheLoss) {
  schema::Catalog c(TestDatabase::url());
  auto p = MustParse(
      "pipeline: spotty\nproject: lab\nsimulation: {spot_rate_multiplier: 3000}\nstages:\n"
      "  train:\n    kind: train\n    instance: trn1.32xlarge\n    count: 2\n"
      "    model: climate-emulator-1b\n    tokens: 2e10\n    market: spot\n"
      "    checkpoint: {every: 30m}\n"
      "    retry: {spot: {max_interruptions: 20}, backoff: {initial: 1s}}\n");
  auto run_with_seed = [&](int64_t seed) {
    auto opts = Fast();
    opts.speed = 2e6;
    opts.seed = seed;
    int64_t run = c.SubmitRun(p, opts);
    scheduler::Scheduler sched(SchedOpts());
    workers::Worker worker(WorkerOpts({{"trn1", 2}}));
    sched.Start();
    worker.Start();
    EXPECT_TRUE(WaitFor([&] { return RunEnded(c, run); }, 60));
    EXPECT_EQ(RunStateText(c, run), "succeeded");
    return c.GetAttempts(run);
  };
  auto first = run_with_seed(11);
  auto again = run_with_seed(11);
  ASSERT_GE(first.size(), 2u) << "the multiplier should cause interruptions";
  ASSERT_EQ(first.size(), again.size());
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(schema::ToSql(first[i].outcome), schema::ToSql(again[i].outcome)) << i;
    EXPECT_NEAR(first[i].progress_to, again[i].progress_to, 0.02) << i;
  }
  Money wasted;
  for (const auto& a : first) {
    EXPECT_GE(a.progress_to, a.progress_from) << "attempt " << a.attempt << " went backwards";
    if (schema::ToSql(a.outcome) == "spot_interruption") {
      // At most one checkpoint interval (30 simulated minutes) of work is lost.
      EXPECT_LE(a.wasted, Charge(a.price_per_hour, a.instance_count, 1800)) << a.attempt;
      EXPECT_LE(a.wasted, a.cost) << a.attempt;
      wasted += a.wasted;  // an interruption during warm-up loses no work; others do
    }
    if (schema::ToSql(a.outcome) == "succeeded") {
      EXPECT_EQ(a.wasted.micros(), 0);
      EXPECT_DOUBLE_EQ(a.progress_to, 1.0);
    }
  }
  EXPECT_GT(wasted.micros(), 0);
}

// resume continues only what failed (and what it blocked); retry redoes one stage and
// everything downstream.
TEST(Engine, ResumeAndRetryRunOnlyWhatTheyMust) {
  schema::Catalog c(TestDatabase::url());
  auto p = MustParse(
      "pipeline: fixable\nproject: lab\nstages:\n"
      "  a:\n    run: [\"true\"]\n"
      "  b:\n    run: [\"bash\", \"-c\", \"test -f \\\"$TRNFLOW_RUN_DIR/fixed\\\"\"]\n"
      "    needs: [a]\n"
      "  c:\n    run: [\"true\"]\n    needs: [b]\n"
      "  d:\n    run: [\"true\"]\n    needs: [a]\n");
  int64_t run = c.SubmitRun(p, Fast());
  scheduler::Scheduler sched(SchedOpts());
  workers::Worker worker(WorkerOpts({{"cpu", 2}}));
  sched.Start();
  worker.Start();
  ASSERT_TRUE(WaitFor([&] { return RunEnded(c, run); }, 30));
  ASSERT_EQ(RunStateText(c, run), "failed");
  auto attempts_of = [&](const std::string& name) {
    for (const auto& s : c.GetStages(run))
      if (s.name == name) return s.attempts;
    return -1;
  };
  EXPECT_THROW(c.RetryStage(run, "nope"), UserError);
  // Fix the cause, resume: b runs again, then c; a and d stay done.
  std::filesystem::create_directories(Home() + "/runs/" + std::to_string(run));
  std::ofstream(Home() + "/runs/" + std::to_string(run) + "/fixed") << "1";
  EXPECT_EQ(c.ResumeRun(run), 2);  // b (failed) and c (skipped)
  EXPECT_EQ(QueueMismatches(), "0");  // b ready again, c blocked on it
  ASSERT_TRUE(WaitFor([&] { return RunEnded(c, run); }, 30));
  EXPECT_EQ(RunStateText(c, run), "succeeded");
  EXPECT_EQ(attempts_of("a"), 1);
  EXPECT_EQ(attempts_of("b"), 2);
  EXPECT_EQ(attempts_of("c"), 1);
  EXPECT_EQ(attempts_of("d"), 1);
  EXPECT_THROW(c.ResumeRun(run), UserError);  // nothing failed
  // Retry b: b and c again, nothing else.
  EXPECT_EQ(c.RetryStage(run, "b"), 2);
  EXPECT_EQ(QueueMismatches(), "0");
  ASSERT_TRUE(WaitFor([&] { return RunEnded(c, run); }, 30));
  EXPECT_EQ(RunStateText(c, run), "succeeded");
  EXPECT_EQ(attempts_of("a"), 1);
  EXPECT_EQ(attempts_of("b"), 3);
  EXPECT_EQ(attempts_of("c"), 2);
  EXPECT_EQ(attempts_of("d"), 1);
  EXPECT_EQ(QueueMismatches(), "0");
}

TEST(Engine, CancelStopsRunningStagesPromptly) {
  schema::Catalog c(TestDatabase::url());
  auto p = MustParse(
      "pipeline: long\nproject: lab\nstages:\n"
      "  s:\n    run: [\"sleep\", \"60\"]\n"
      "  t: {kind: train, instance: trn1.32xlarge, model: llama-2-7b, tokens: 1e12, "
      "market: spot, checkpoint: {every: 1h}}\n"
      "  after:\n    run: [\"true\"]\n    needs: [s, t]\n");
  auto opts = Fast();
  opts.speed = 100;  // the train stage would take weeks of wall time
  int64_t run = c.SubmitRun(p, opts);
  workers::Worker worker(WorkerOpts({{"cpu", 1}, {"trn1", 1}}));
  worker.Start();
  ASSERT_TRUE(WaitFor([&] { return c.CountRunningStages(run) == 2; }, 10));
  auto report = c.CancelRun(run);
  EXPECT_TRUE(report.cancelled);
  EXPECT_EQ(report.stages_cancelled, 1);  // after
  EXPECT_EQ(report.stages_running, 2);
  EXPECT_EQ(QueueMismatches(), "0");  // `after` cancelled: it waits for nothing now
  // The notify wakes the worker's heartbeat at once; allow a generous bound.
  ASSERT_TRUE(WaitFor([&] { return c.CountRunningStages(run) == 0; }, 5));
  EXPECT_EQ(RunStateText(c, run), "cancelled");
  for (const auto& a : c.GetAttempts(run)) EXPECT_EQ(schema::ToSql(a.outcome), "cancelled");
  for (const auto& s : c.GetStages(run)) EXPECT_EQ(schema::ToSql(s.state), "cancelled") << s.name;
  EXPECT_FALSE(c.CancelRun(run).cancelled);
  EXPECT_EQ(QueueMismatches(), "0");
}

// A real job that checkpoints to TRNFLOW_CHECKPOINT_DIR is interrupted (SIGTERM at the spot
// notice) and the next attempt resumes from its file.
TEST(Engine, RunStageResumesFromItsCheckpointAfterASpotInterruption) {
  schema::Catalog c(TestDatabase::url());
  auto p = MustParse(
      "pipeline: ckpt\nproject: lab\nsimulation: {spot_rate_multiplier: 20000}\nstages:\n"
      "  job:\n    run: [\"tests/jobs/checkpointing_job.sh\"]\n    instance: c6i.large\n"
      "    market: spot\n    retry: {spot: {max_interruptions: 30}, backoff: {initial: 1s}}\n");
  auto opts = Fast();
  opts.speed = 3600;  // the ~2 s job spans ~2 simulated hours of spot market
  opts.seed = 3;
  int64_t run = c.SubmitRun(p, opts);
  scheduler::Scheduler sched(SchedOpts());
  workers::Worker worker(WorkerOpts({{"cpu", 1}}));
  sched.Start();
  worker.Start();
  ASSERT_TRUE(WaitFor([&] { return RunEnded(c, run); }, 120));
  EXPECT_EQ(RunStateText(c, run), "succeeded");
  auto attempts = c.GetAttempts(run);
  int interruptions = 0;
  for (const auto& a : attempts) {
    if (schema::ToSql(a.outcome) == "spot_interruption") {
      ++interruptions;
      EXPECT_GE(a.progress_to, a.progress_from) << a.message;
    }
  }
  ASSERT_GT(interruptions, 0) << "seed 3 should interrupt the job at least once";
  // Every attempt after the first started where the previous one checkpointed.
  std::ifstream in(Home() + "/runs/" + std::to_string(run) + "/steps.log");
  std::string line;
  std::vector<int> starts;
  std::map<int, int> done;
  while (std::getline(in, line)) {
    int n;
    if (std::sscanf(line.c_str(), "attempt %*d starts at step %d", &n) == 1)
      starts.push_back(n);
    else if (std::sscanf(line.c_str(), "step %d", &n) == 1)
      done[n]++;
  }
  ASSERT_GE(starts.size(), 2u);
  for (size_t i = 1; i < starts.size(); ++i) EXPECT_GE(starts[i], starts[i - 1]);
  EXPECT_GT(starts.back(), 0) << "the last attempt resumed from scratch";
  for (int step = 1; step <= 40; ++step)
    EXPECT_GE(done[step], 1) << "step " << step << " never ran";
}

// A 48-simulated-hour spot training survives several interruptions, then spends its
// preemption budget and finishes on on-demand; the ledger's waste is exactly the work lost.
TEST(Engine, LongSpotTrainingFallsBackToOnDemandAndWasteIsTheLostWork) {
  schema::Catalog c(TestDatabase::url());
  // llama-2-7b on trn1.32xlarge: ~26,300 tokens/s, so 4.5e9 tokens ≈ 48 simulated hours.
  auto p = MustParse(
      "pipeline: long-train\nproject: lab\nsimulation: {spot_rate_multiplier: 3000}\nstages:\n"
      "  train:\n    kind: train\n    instance: trn1.32xlarge\n    model: llama-2-7b\n"
      "    tokens: 4.5e9\n    market: spot\n    checkpoint: {every: 1h}\n"
      "    retry: {spot: {max_interruptions: 3, then: on-demand}, backoff: {initial: 1s}}\n");
  auto opts = Fast();
  opts.speed = 2e6;
  opts.seed = 5;
  int64_t run = c.SubmitRun(p, opts);
  scheduler::Scheduler sched(SchedOpts());
  workers::Worker worker(WorkerOpts({{"trn1", 1}}));
  sched.Start();
  worker.Start();
  ASSERT_TRUE(WaitFor([&] { return RunEnded(c, run); }, 60));
  EXPECT_EQ(RunStateText(c, run), "succeeded");
  auto attempts = c.GetAttempts(run);
  ASSERT_GE(attempts.size(), 4u) << "three preemptions, then on-demand";
  EXPECT_EQ(schema::ToSql(attempts.back().outcome), "succeeded");
  const sim::Catalog& hw = sim::Catalog::Builtin();
  const sim::InstanceType& t = *hw.FindInstance("trn1.32xlarge");
  sim::Workload w = sim::WorkloadFromJson(p.Find("train")->spec.workload_json);
  double work = sim::EstimateTrain(w, t, 1).work_seconds;
  double previous = 0;
  for (const auto& a : attempts) {
    EXPECT_GE(a.progress_from, previous - 1e-9) << "progress went back past a checkpoint";
    previous = a.progress_to;
    if (a.attempt <= 3) {
      EXPECT_TRUE(schema::ToSql(a.outcome) == "spot_interruption" ||
                  schema::ToSql(a.outcome) == "capacity_unavailable")
          << schema::ToSql(a.outcome);
      EXPECT_EQ(schema::ToSql(a.market), "spot");
      if (schema::ToSql(a.outcome) != "spot_interruption") continue;
      // Waste = the attempt's work beyond what its last checkpoint kept, at its price.
      double setup = sim::EstimateTrain(w, t, 1, a.attempt == 1).setup_seconds;
      double worked = std::max(0.0, a.sim_seconds - setup);
      double kept = (a.progress_to - a.progress_from) * work;
      EXPECT_LE(worked - kept, 3600 + 1) << "more than one checkpoint interval lost";
      double expected = a.cost.usd() * (worked - kept) / a.sim_seconds;
      EXPECT_NEAR(a.wasted.usd(), expected, 0.01) << "attempt " << a.attempt;
    } else {
      EXPECT_EQ(schema::ToSql(a.market), "on-demand");
      EXPECT_EQ(a.price_per_hour, t.on_demand_per_hour);
    }
  }
  std::string r = std::to_string(run);
  EXPECT_EQ(schema::testing::QueryValue(
                c, "SELECT sum(wasted_usd) FROM trnflow.attempt_ledger WHERE run_id = " + r),
            schema::testing::QueryValue(
                c,
                "SELECT sum(wasted_usd) FROM trnflow.attempts WHERE outcome <> 'succeeded' "
                "AND run_id = " +
                    r));
}

// The compile cache under two workers: identical compiles compile once (the other attempt
// waits unbilled and is served), a corrupt entry is rebuilt rather than served, and a
// deterministic compiler failure is remembered until a run asks to retry it.
// Declared outputs round-trip through the store: the digest is over contents and paths, a
// corrupted copy is refused, and a hit restores the files into another run's directory.
TEST(StageCache, OutputsAreStoredVerifiedAndRestored) {
  namespace fs = std::filesystem;
  fs::path base = fs::path(testing::WriteTempFile("outputs", "")).string() + ".d";
  fs::create_directories(base / "run-1/data/shards");
  std::ofstream(base / "run-1/data/tokens.txt") << "hello";
  std::ofstream(base / "run-1/data/shards/0.bin") << "abc";
  std::ofstream(base / "run-1/stats.json") << "{}";
  std::ofstream(base / "run-1/scratch.tmp") << "not declared";
  const std::vector<std::string> rels = {"data", "stats.json"};
  std::string digest = workers::OutputsDigest((base / "run-1").string(), rels);
  EXPECT_EQ(digest, workers::OutputsDigest((base / "run-1").string(), {"stats.json", "data"}));
  std::ofstream(base / "run-1/data/tokens.txt") << "hellO";
  EXPECT_NE(digest, workers::OutputsDigest((base / "run-1").string(), rels)) << "contents count";
  std::ofstream(base / "run-1/data/tokens.txt") << "hello";
  EXPECT_THROW(workers::OutputsDigest((base / "run-1").string(), {"missing"}), std::runtime_error);

  workers::StoredArtifact a =
      workers::StoreOutputs((base / "home").string(), "{}", (base / "run-1").string(), rels);
  EXPECT_EQ(a.digest, digest);
  EXPECT_EQ(a.bytes, 5 + 3 + 2);
  EXPECT_TRUE(workers::VerifyArtifact(a.path, a.digest));
  EXPECT_FALSE(fs::exists(fs::path(a.path) / "outputs/scratch.tmp"));
  workers::RestoreOutputs(a.path, (base / "run-2").string());
  EXPECT_EQ(workers::OutputsDigest((base / "run-2").string(), rels), digest);

  std::ofstream(fs::path(a.path) / "outputs/data/shards/0.bin") << "abX";  // bit rot
  EXPECT_FALSE(workers::VerifyArtifact(a.path, a.digest));
  fs::remove(fs::path(a.path) / "done");
  EXPECT_FALSE(workers::VerifyArtifact(a.path, a.digest)) << "no marker: half-written";
  fs::remove_all(base);
}

// The key of a cached stage covers its kind, its parameters (the command, its environment,
// the files it names) and what it consumes; where it runs is not part of it.
TEST(StageCache, KeyCoversKindParametersAndConsumedDigests) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(testing::WriteTempFile("stage-key", "")).string() + ".d";
  fs::create_directories(dir);
  std::ofstream(dir / "prep.sh") << "echo one\n";
  StageSpec s;
  s.kind = StageKind::kRun;
  s.command.argv = {"bash", "prep.sh", "--out=${{ run.dir }}/data"};
  s.command.outputs = std::vector<std::string>{"data"};
  s.instance = "c6i.large";
  std::vector<std::pair<std::string, std::string>> up = {{"fetch", "d1"}};
  const std::string base = workers::StageCacheInputs(s, up, dir.string(), 7, "lab");
  auto key = [&](const StageSpec& x, decltype(up) u) {
    return workers::StageCacheInputs(x, u, dir.string(), 7, "lab");
  };
  EXPECT_EQ(base, key(s, up)) << "stable";
  StageSpec moved = s;
  moved.instance = "c6i.4xlarge";
  moved.market = Market::kSpot;
  moved.retry.max_attempts = 5;
  EXPECT_EQ(base, key(moved, up)) << "placement is not part of the key";
  EXPECT_NE(base, key(s, {{"fetch", "d2"}})) << "a consumed digest";
  StageSpec env = s;
  env.command.env["SEED"] = "2";
  EXPECT_NE(base, key(env, up));
  StageSpec flag = s;
  flag.command.argv.push_back("--fast");
  EXPECT_NE(base, key(flag, up));
  StageSpec per_run = s;
  per_run.command.env["TAG"] = "run-${{ run.id }}";
  EXPECT_NE(workers::StageCacheInputs(per_run, up, dir.string(), 7, "lab"),
            workers::StageCacheInputs(per_run, up, dir.string(), 8, "lab"))
      << "a command that names its run is keyed on it";
  EXPECT_EQ(base, workers::StageCacheInputs(s, up, dir.string(), 8, "lab"))
      << "one that does not is not";
  std::ofstream(dir / "prep.sh") << "echo two\n";
  EXPECT_NE(base, key(s, up)) << "an edited script";
  auto j = nlohmann::json::parse(base);
  EXPECT_EQ(j["kind"], "run");
  EXPECT_TRUE(j["parameters"]["files"].contains("prep.sh")) << base;
  EXPECT_EQ(j["inputs"]["fetch"], "d1");

  // The worker is root and the workdir the submitter's: it hashes nothing the job's uid could
  // not read, nothing outside the workdir, and a FIFO named there does not stall it.
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0644), 0);
  StageSpec probe = s;
  probe.command.argv = {"cat", "/etc/shadow", "fifo", "../" + dir.filename().string() + "/prep.sh",
                        (dir / "prep.sh").string()};
  auto files = nlohmann::json::parse(workers::StageCacheInputs(probe, up, dir.string(), 7,
                                                               "lab"))["parameters"]["files"];
  EXPECT_EQ(files.size(), 1u) << files.dump();
  EXPECT_TRUE(files.contains((dir / "prep.sh").string())) << files.dump();
  fs::permissions(dir, fs::perms(0700));  // a workdir only root can read
  files = nlohmann::json::parse(workers::StageCacheInputs(s, up, dir.string(), 7,
                                                          "lab"))["parameters"]["files"];
  EXPECT_TRUE(files.empty()) << files.dump();
  fs::remove_all(dir);
}

TEST(Cache, IdenticalCompilesCompileOnceAndCorruptEntriesAreRebuilt) {
  schema::Catalog c(TestDatabase::url());
  auto p = MustParse(
      "pipeline: graphs\nproject: lab\nstages:\n"
      "  compile: {kind: compile, target: inf2, instance: trn1.2xlarge, model: llama-2-7b, "
      "tp_degree: 2, batch: 1, seq_len: 512}\n");
  const std::string key = p.Find("compile")->spec.cache_key;
  ASSERT_EQ(key.size(), 64u);
  auto opts = Fast();
  opts.speed = 900;  // the 15-minute compile takes about a second
  int64_t r1 = c.SubmitRun(p, opts), r2 = c.SubmitRun(p, opts);
  scheduler::Scheduler sched(SchedOpts());
  workers::Worker w1(WorkerOpts({{"trn1", 1}})), w2(WorkerOpts({{"trn1", 1}}));
  sched.Start();
  w1.Start();
  w2.Start();
  ASSERT_TRUE(WaitFor([&] { return RunEnded(c, r1) && RunEnded(c, r2); }, 60));
  EXPECT_EQ(RunStateText(c, r1), "succeeded");
  EXPECT_EQ(RunStateText(c, r2), "succeeded");
  std::vector<schema::AttemptRow> all = c.GetAttempts(r1);
  for (const auto& a : c.GetAttempts(r2)) all.push_back(a);
  ASSERT_EQ(all.size(), 2u);
  int compiled = 0, served = 0;
  for (const auto& a : all) {
    if (schema::ToSql(a.outcome) == "succeeded") ++compiled;
    if (schema::ToSql(a.outcome) == "cached") {
      ++served;
      EXPECT_EQ(a.cost.micros(), 0);
      EXPECT_GT(a.saved.micros(), 0);
      EXPECT_NE(a.worker, "") << "served by a worker";
    }
  }
  EXPECT_EQ(compiled, 1);
  EXPECT_EQ(served, 1);
  auto entry = c.GetArtifact(key);
  ASSERT_TRUE(entry);
  EXPECT_EQ(schema::ToSql(entry->state), "ready");
  EXPECT_EQ(entry->hits, 1);
  // Corrupt the stored graph: the next run must compile again, not be served garbage.
  std::ofstream(entry->path + "/model.neff", std::ios::trunc) << "garbage";
  int64_t r3 = c.SubmitRun(p, opts);
  ASSERT_TRUE(WaitFor([&] { return RunEnded(c, r3); }, 60));
  ASSERT_EQ(c.GetAttempts(r3).size(), 1u);
  EXPECT_EQ(schema::ToSql(c.GetAttempts(r3)[0].outcome), "succeeded");
  EXPECT_TRUE(workers::VerifyArtifact(c.GetArtifact(key)->path, c.GetArtifact(key)->digest));
}

TEST(Cache, DeterministicCompileFailuresArePoisonedUntilRetried) {
  schema::Catalog c(TestDatabase::url());
  auto p = MustParse(
      "pipeline: poison\nproject: lab\nstages:\n"
      "  compile: {kind: compile, target: inf2, instance: trn1.2xlarge, model: bert-large, "
      "seq_len: 128}\n");
  // A model with an operator no Neuron target supports; the validator would refuse it, so
  // the test writes it into the spec the way a stale catalog entry would carry it.
  auto& spec = p.stages[0].spec;
  sim::Workload w = sim::WorkloadFromJson(spec.workload_json);
  w.model.features.push_back("custom_op");
  spec.workload_json = sim::ToJson(w);
  spec.cache_inputs = pipelines::CompileCacheInputs(w);
  spec.cache_key = Sha256Hex(spec.cache_inputs);
  auto opts = Fast();
  opts.speed = 3000;
  scheduler::Scheduler sched(SchedOpts());
  workers::Worker worker(WorkerOpts({{"trn1", 1}}));
  sched.Start();
  worker.Start();
  auto run_once = [&](bool retry) {
    opts.retry_failed_compilation = retry;
    int64_t run = c.SubmitRun(p, opts);
    EXPECT_TRUE(WaitFor([&] { return RunEnded(c, run); }, 30));
    EXPECT_EQ(RunStateText(c, run), "failed");
    return c.GetAttempts(run).at(0);
  };
  auto first = run_once(false);
  EXPECT_EQ(schema::ToSql(first.outcome), "user_error");
  EXPECT_NE(first.message.find("NCC_EXTP003"), std::string::npos) << first.message;
  EXPECT_GT(first.sim_seconds, 0);
  EXPECT_EQ(schema::ToSql(c.GetArtifact(spec.cache_key)->state), "failed");
  auto second = run_once(false);
  EXPECT_NE(second.message.find("failed to compile before"), std::string::npos) << second.message;
  EXPECT_EQ(second.sim_seconds, 0);
  EXPECT_EQ(second.cost.micros(), 0) << "a remembered failure launches nothing";
  auto third = run_once(true);
  EXPECT_NE(third.message.find("NCC_EXTP003"), std::string::npos) << "retried: compiled again";
  EXPECT_GT(third.sim_seconds, 0);
}

// Two schedulers tick at the same instant, then one restarts and ticks again: every due
// slot fires exactly once, under each catch-up policy. Fixed instants, not the wall clock.
TEST(Schedules, EachSlotFiresExactlyOnceUnderEveryCatchUpPolicy) {
  schema::Catalog c(TestDatabase::url());
  const std::string yaml = "pipeline: hourly\nproject: lab\nstages:\n  a:\n    run: [\"true\"]\n";
  for (const char* policy : {"all", "latest", "none"}) {
    schema::ScheduleRow r;
    r.name = std::string("hourly-") + policy;
    r.file = "hourly.yaml";
    r.source = yaml;
    r.params_json = "{}";
    r.cron = "0 * * * *";
    r.tz = "UTC";
    r.catchup = policy;
    r.speed = 1e7;
    r.workdir = TRNFLOW_SOURCE_DIR;
    ASSERT_TRUE(c.AddSchedule(r));
    EXPECT_FALSE(c.AddSchedule(r)) << "names are unique";
    schema::testing::QueryValue(
        c, "UPDATE trnflow.schedules SET last_slot = '2026-01-01 00:00+00' WHERE name = '" +
               r.name + "' RETURNING 1");
  }
  auto at = [](int h, int m) {
    return std::chrono::system_clock::time_point(std::chrono::seconds(1767225600)) +  // 2026-01-01
           std::chrono::hours(h) + std::chrono::minutes(m);
  };
  auto fires = [&](const std::string& name) {
    return schema::testing::QueryValue(
        c,
        "SELECT count(*) FROM trnflow.schedule_fires WHERE run_id IS NOT NULL "
        "AND schedule = '" +
            name + "'");
  };
  // 03:30, three slots missed (01:00, 02:00, 03:00), two schedulers at once.
  schema::Catalog a(TestDatabase::url()), b(TestDatabase::url());
  std::thread t1([&] { scheduler::FireDueSchedules(a, at(3, 30)); });
  std::thread t2([&] { scheduler::FireDueSchedules(b, at(3, 30)); });
  t1.join();
  t2.join();
  scheduler::FireDueSchedules(c, at(3, 30));  // after a restart
  EXPECT_EQ(fires("hourly-all"), "3");
  EXPECT_EQ(fires("hourly-latest"), "1");
  EXPECT_EQ(fires("hourly-none"), "0") << "missed slots are not caught up";
  EXPECT_EQ(schema::testing::QueryValue(c,
                                        "SELECT extract(hour FROM slot AT TIME ZONE 'UTC') FROM "
                                        "trnflow.schedule_fires WHERE schedule = 'hourly-latest'"),
            "3");
  // 04:01: one slot, on time: every policy fires it, once.
  scheduler::FireDueSchedules(a, at(4, 1));
  scheduler::FireDueSchedules(b, at(4, 1));
  EXPECT_EQ(fires("hourly-all"), "4");
  EXPECT_EQ(fires("hourly-latest"), "2");
  EXPECT_EQ(fires("hourly-none"), "1");
  // Paused schedules do not fire; the runs were really submitted.
  ASSERT_TRUE(c.SetSchedulePaused("hourly-all", true));
  EXPECT_EQ(scheduler::FireDueSchedules(c, at(5, 0)), 2);
  EXPECT_EQ(fires("hourly-all"), "4");
  EXPECT_EQ(
      schema::testing::QueryValue(c,
                                  "SELECT count(*) FROM trnflow.runs r JOIN trnflow.pipelines p ON "
                                  "p.id = r.pipeline_id WHERE p.name = 'hourly'"),
      "9");
}

// Two workers closing a run's last two stages at the same moment each see the other's still
// running; the run must finish anyway, with no scheduler to sweep it up afterwards.
TEST(Engine, ARunClosedByTwoWorkersAtOnceFinishesWithoutTheScheduler) {
  schema::Catalog c(TestDatabase::url());
  std::vector<int64_t> runs;
  for (int i = 0; i < 100; ++i)
    runs.push_back(c.SubmitRun(MustParse("pipeline: pair\nproject: lab\nstages:\n"
                                         "  a:\n    run: [\"true\"]\n"
                                         "  b:\n    run: [\"true\"]\n"),
                               Fast()));
  // Each worker runs one stage at a time, and the two meet at a barrier so they finish
  // together: the two stages of a run, claimed in order, commit at the same moment.
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0, generation = 0;
  // A no-op executor that waits (half a second at most) for the other worker's stage.
  struct Together final : workers::Executor {
    std::function<void()> meet;
    workers::ExecResult Run(const workers::ExecContext&) override {
      meet();
      return workers::ExecResult{};
    }
  };
  auto together = std::make_shared<Together>();
  together->meet = [&] {
    std::unique_lock lock(mu);
    int mine = generation;
    if (++arrived == 2) {
      arrived = 0;
      ++generation;
      cv.notify_all();
    } else {
      cv.wait_for(lock, std::chrono::milliseconds(500), [&] { return generation != mine; });
      if (generation == mine) arrived = 0;  // the last stage has no partner
    }
  };
  std::vector<std::unique_ptr<workers::Worker>> fleet;
  for (int i = 0; i < 2; ++i) {
    auto o = WorkerOpts({{"cpu", 1}});
    o.executors = workers::Executors::AllOn(together);
    o.commit_batch = 1;
    fleet.push_back(std::make_unique<workers::Worker>(o));
  }
  for (auto& w : fleet) w->Start();
  bool all = WaitFor(
      [&] {
        return std::all_of(runs.begin(), runs.end(), [&](int64_t r) { return RunEnded(c, r); });
      },
      30);
  for (auto& w : fleet) w->Stop();
  ASSERT_TRUE(all) << schema::testing::QueryValue(
      c,
      "SELECT count(*) FROM trnflow.runs WHERE state = 'running' AND NOT EXISTS (SELECT 1 FROM "
      "trnflow.stages s WHERE s.run_id = runs.id AND s.state <> 'succeeded')");
  for (int64_t r : runs) EXPECT_EQ(RunStateText(c, r), "succeeded");
}

// The same DAG at 1, 2, 4 and 8 worker incarnations: every stage runs exactly once.
class EngineConcurrency : public ::testing::TestWithParam<int> {};

TEST_P(EngineConcurrency, EveryStageSucceedsExactlyOnce) {
  schema::Catalog c(TestDatabase::url());
  // ~8 ms of wall time per stage, so several workers really share the fan-out.
  auto opts = Fast();
  opts.speed = 1e5;
  int64_t run = c.SubmitRun(MustParse(FanOut(120)), opts);
  scheduler::Scheduler sched(SchedOpts());
  std::vector<std::unique_ptr<workers::Worker>> fleet;
  for (int i = 0; i < GetParam(); ++i)
    fleet.push_back(std::make_unique<workers::Worker>(WorkerOpts({{"trn1", 3}, {"cpu", 1}})));
  sched.Start();
  for (auto& w : fleet) w->Start();
  ASSERT_TRUE(WaitFor([&] { return RunEnded(c, run); }, 120));
  EXPECT_EQ(RunStateText(c, run), "succeeded");
  std::string r = std::to_string(run);
  EXPECT_EQ(schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.stages WHERE run_id = " +
                                               r + " AND state <> 'succeeded'"),
            "0");
  EXPECT_EQ(
      schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.attempts WHERE run_id = " + r),
      "122");
  EXPECT_EQ(schema::testing::QueryValue(
                c, "SELECT count(DISTINCT stage_id) FROM trnflow.attempts WHERE run_id = " + r +
                       " AND outcome = 'succeeded'"),
            "122");
  EXPECT_EQ(QueueMismatches(), "0");
  if (GetParam() > 1) {
    EXPECT_GT(std::stoi(schema::testing::QueryValue(
                  c,
                  "SELECT count(DISTINCT worker_id) FROM trnflow.attempts "
                  "WHERE run_id = " +
                      r)),
              1);
  }
}

INSTANTIATE_TEST_SUITE_P(Workers, EngineConcurrency, ::testing::Values(1, 2, 4, 8));

TEST(Engine, ShutdownHandsRunningStagesBack) {
  schema::Catalog c(TestDatabase::url());
  auto p = MustParse("pipeline: slow\nproject: lab\nstages:\n  s:\n    run: [\"sleep\", \"30\"]\n");
  int64_t run = c.SubmitRun(p, Fast());
  auto opts = WorkerOpts({{"cpu", 1}});
  opts.shutdown_grace_s = 0.2;
  {
    workers::Worker worker(opts);
    worker.Start();
    ASSERT_TRUE(WaitFor([&] { return schema::ToSql(c.GetStages(run)[0].state) == "running"; }, 10));
    ASSERT_TRUE(WaitFor([&] { return worker.running() == 1; }, 10));
  }  // Stop(): grace, SIGTERM, hand back
  auto s = c.GetStages(run)[0];
  EXPECT_EQ(schema::ToSql(s.state), "ready");
  EXPECT_EQ(QueueMismatches(), "0");  // handed back: in the queue again
  auto attempts = c.GetAttempts(run);
  ASSERT_EQ(attempts.size(), 1u);
  EXPECT_EQ(schema::ToSql(attempts[0].outcome), "cancelled");
  EXPECT_EQ(schema::testing::QueryValue(c, "SELECT errors + preemptions FROM trnflow.stages WHERE run_id = " +
                         std::to_string(run)),
            "0");
}

// Migration 0022 moves the queue out of `stages`; daemons of the version before would not
// keep it, so it refuses to apply while one runs (exit 4 in the CLI) and applies once they
// stopped.
TEST(Catalog, TheQueueMigrationWaitsForTheOldDaemonsToStop) {
  ScratchDatabase scratch("_q");
  const std::string& owner = scratch.owner_url;
  schema::Catalog o(owner);
  ASSERT_EQ(o.Migrate(sim::Catalog::Builtin(), 21).to_version, 21);
  schema::testing::QueryValue(
      o,
      "INSERT INTO trnflow.workers (id, host, pid, pools) VALUES"
      " ('00000000-0000-4000-8000-0000000000b1', 'old-host', 1, '{}') RETURNING 1");
  try {
    o.Migrate(sim::Catalog::Builtin());
    ADD_FAILURE() << "migrated under a live worker of the previous version";
  } catch (const Refused& e) {
    EXPECT_NE(std::string(e.what()).find("stop every `trnflow worker`"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(schema::testing::QueryValue(o, "SELECT max(version) FROM trnflow.schema_migrations"),
            "21");
  schema::testing::QueryValue(o, "UPDATE trnflow.workers SET stopped_at = now() RETURNING 1");
  EXPECT_EQ(o.Migrate(sim::Catalog::Builtin()).to_version, schema::testing::BinarySchemaVersion());
}

// A catalog that holds history made under an older schema migrates forward, through every
// later migration, and reads back the same: the run, its stages, every attempt with its bill,
// and the spend report, to the cent; then it goes on running. The history is written with SQL
// of schema 13's shape (the version before the hot-path and dashboard migrations), as that
// version's engine wrote it: attempts opened at claim and closed by UPDATE, so the ledger's
// triggers fold them into the rollup. Keep that SQL as it is when later migrations change
// these tables: it is the old catalog. One of its runs is still running, with an attempt open,
// which closes into the ledger after the upgrade (0017 moved open attempts into stage rows).
TEST(Catalog, MigratesForwardWithItsHistory) {
  const int kHistorySchema = 13;
  ScratchDatabase scratch("_fwd");
  const std::string& owner = scratch.owner_url;
  const std::string kOldWorker = "00000000-0000-4000-8000-0000000000aa";
  std::string run, running_run;
  {
    schema::Catalog o(owner);
    auto report = o.Migrate(sim::Catalog::Builtin(), kHistorySchema);
    ASSERT_EQ(report.to_version, kHistorySchema);
    EXPECT_THROW(o.RequireCurrentSchema(), CatalogUnavailable);
    const std::string spec =
        R"({"name":"s","kind":"run","instance":"c6i.large","count":1,"market":"on-demand",)"
        R"("command":{"argv":["true"],"shell":false,"env":{}},"workload":null,)"
        R"("retry":{"max_attempts":2,"on":[],"backoff":{"initial_s":30,"factor":2,"max_s":600},)"
        R"("max_interruptions":6,"then":"on-demand"},"checkpoint":{"every_s":0,"on_notice":false},)"
        R"("timeout_s":0,"cache":false})";
    run = schema::testing::QueryValue(
        o,
        "INSERT INTO trnflow.projects (name) VALUES ('lab');"
        "WITH p AS (INSERT INTO trnflow.pipelines (name, spec_hash, source)"
        "           VALUES ('history', 'h1', '') RETURNING id)"
        "INSERT INTO trnflow.runs (pipeline_id, project, speed, seed, workdir, state, finished_at)"
        "SELECT id, 'lab', 1, 1, '/', 'failed', now() FROM p RETURNING id");
    schema::testing::QueryValue(
        o,
        "INSERT INTO trnflow.stages (run_id, project, name, kind, pool, instance_type,"
        "  instance_count, market, state, spec, attempts, pending_needs, finished_at) VALUES"
        " (" +
            run + ", 'lab', 'ok', 'run', 'cpu', 'c6i.large', 1, 'on-demand', 'succeeded', '" +
            spec +
            "', 1, 0, now()),"
            " (" +
            run + ", 'lab', 'bad', 'run', 'cpu', 'c6i.large', 1, 'on-demand', 'failed', '" + spec +
            "', 2, 1, now()),"
            " (" +
            run + ", 'lab', 'after', 'run', 'cpu', 'c6i.large', 1, 'on-demand', 'skipped', '" +
            spec +
            "', 0, 1, now());"
            "INSERT INTO trnflow.stage_deps (stage_id, needs_id)"
            " SELECT b.id, a.id FROM trnflow.stages a, trnflow.stages b WHERE a.run_id = " +
            run +
            "  AND b.run_id = a.run_id AND (a.name, b.name) IN (('ok', 'bad'), ('bad', 'after'));"
            "INSERT INTO trnflow.attempts (stage_id, run_id, attempt, worker_id, worker_name,"
            "  instance_type, instance_count, market, price_usd_hour, on_demand_price_usd_hour)"
            " SELECT s.id, s.run_id, g, gen_random_uuid(), 'old-worker', 'c6i.large', 1,"
            "  'on-demand', 0.17, 0.17 FROM trnflow.stages s, generate_series(1, s.attempts) g"
            " WHERE s.run_id = " +
            run +
            ";"
            "UPDATE trnflow.attempts a SET finished_at = now(), sim_seconds = 60,"
            "  billed_seconds = 60 * a.attempt,"
            "  outcome = CASE WHEN s.name = 'ok' THEN 'succeeded' WHEN a.attempt = 1"
            "                 THEN 'infra_error' ELSE 'failed' END,"
            "  cost_usd = CASE WHEN s.name = 'ok' THEN 0.010000 WHEN a.attempt = 1 THEN 0.020000"
            "                  ELSE 0.030000 END,"
            "  wasted_usd = CASE WHEN s.name = 'bad' THEN 0.020000 ELSE 0 END, saved_usd = 0,"
            "  progress_to = 1"
            " FROM trnflow.stages s WHERE s.id = a.stage_id AND a.run_id = " +
            run +
            ";"
            "SELECT 1");
    // A run still running when the catalog is upgraded: its stage's attempt is open (0017
    // moves it into the stage row; its ledger row is written when it closes).
    running_run = schema::testing::QueryValue(
        o,
        "INSERT INTO trnflow.runs (pipeline_id, project, speed, seed, workdir, state)"
        " SELECT id, 'lab', 1, 1, '/', 'running' FROM trnflow.pipelines"
        " WHERE name = 'history' RETURNING id");
    schema::testing::QueryValue(
        o,
        "INSERT INTO trnflow.stages (run_id, project, name, kind, pool, instance_type,"
        "  instance_count, market, state, spec, attempts, pending_needs, lease_owner,"
        "  lease_expires_at, heartbeat_at, progress) VALUES"
        " (" +
            running_run +
            ", 'lab', 'long', 'run', 'cpu', 'c6i.large', 1, 'on-demand',"
            "  'running', '" +
            spec + "', 1, 0, '" + kOldWorker +
            "', now() + interval '1 day',"
            "  now(), 0.25);"
            "INSERT INTO trnflow.attempts (stage_id, run_id, attempt, worker_id, worker_name,"
            "  instance_type, instance_count, market, price_usd_hour, on_demand_price_usd_hour,"
            "  progress_from, started_at)"
            " SELECT id, run_id, 1, '" +
            kOldWorker +
            "', 'old-worker', 'c6i.large', 1, 'on-demand',"
            "  0.17, 0.17, 0.25, now() - interval '1 hour' FROM trnflow.stages WHERE run_id = " +
            running_run +
            ";"
            "SELECT 1");
  }
  {
    schema::Catalog o(owner);
    auto report = o.Migrate(sim::Catalog::Builtin());
    EXPECT_EQ(report.from_version, kHistorySchema);
    EXPECT_EQ(report.to_version, schema::testing::BinarySchemaVersion());
    o.RequireCurrentSchema();
  }
  // The migration filled the queue tables from the stages as they were (the running one
  // included) and zeroed the skipped stage's pending needs.
  EXPECT_EQ(QueueMismatches(), "0");
  const std::string daemon = schema::EnableDaemonLogin(owner);
  schema::Catalog c(daemon);
  const int64_t old_run = std::stoll(run);
  auto got_run = c.GetRun(old_run);
  ASSERT_TRUE(got_run);
  EXPECT_EQ(schema::ToSql(got_run->state), "failed");
  std::map<std::string, std::string> state;
  std::map<int64_t, std::string> name_of;
  for (const auto& s : c.GetStages(old_run)) {
    state[s.name] = schema::ToSql(s.state);
    name_of[s.id] = s.name;
  }
  EXPECT_EQ(state, (std::map<std::string, std::string>{
                       {"ok", "succeeded"}, {"bad", "failed"}, {"after", "skipped"}}));
  std::vector<std::string> attempts;
  for (const auto& a : c.GetAttempts(old_run))
    attempts.push_back(name_of[a.stage_id] + "#" + std::to_string(a.attempt) + " " +
                       schema::ToSql(a.outcome) + " " + a.cost.ToDecimal() + " " +
                       std::to_string(a.billed_seconds) + "s " + a.price_per_hour.ToDecimal() +
                       "/h");
  std::sort(attempts.begin(), attempts.end());
  EXPECT_EQ(attempts, (std::vector<std::string>{"bad#1 infra_error 0.020000 60s 0.170000/h",
                                                "bad#2 failed 0.030000 120s 0.170000/h",
                                                "ok#1 succeeded 0.010000 60s 0.170000/h"}));
  schema::SpendQuery by_stage{"lab", "", "", "", {"stage"}};
  std::map<std::string, std::string> spend;
  for (const auto& r : c.Spend(by_stage)) spend[r.keys.at(0)] = r.cost.ToDecimal();
  EXPECT_EQ(spend, (std::map<std::string, std::string>{{"bad", "0.050000"}, {"ok", "0.010000"}}));
  std::vector<schema::SpendRow> before_spend = c.Spend(by_stage);

  auto run_to_end = [&](const std::string& yaml) {
    int64_t id = c.SubmitRun(MustParse(yaml), Fast());
    auto sched_opts = SchedOpts();
    sched_opts.database_url = daemon;
    auto worker_opts = WorkerOpts({{"cpu", 4}});
    worker_opts.database_url = daemon;
    scheduler::Scheduler sched(sched_opts);
    workers::Worker worker(worker_opts);
    sched.Start();
    worker.Start();
    EXPECT_TRUE(WaitFor([&] { return RunEnded(c, id); }, 60));
    return id;
  };
  // The migrated catalog goes on: a new run adds to the same ledger and report.
  int64_t new_run = run_to_end(
      "pipeline: after-upgrade\nproject: lab\nstages:\n  a:\n    run: [\"true\"]\n"
      "  b:\n    run: [\"true\"]\n    needs: [a]\n");
  EXPECT_EQ(RunStateText(c, new_run), "succeeded");
  Money total_before, total_after;
  for (const auto& r : before_spend) total_before += r.cost;
  for (const auto& r : c.Spend(schema::SpendQuery{"lab", "", "", "", {"project"}}))
    total_after += r.cost;
  Money new_cost;
  for (const auto& a : c.GetAttempts(new_run)) new_cost += a.cost;
  EXPECT_GT(new_cost.micros(), 0);
  EXPECT_EQ(total_after.micros(), total_before.micros() + new_cost.micros());

  // The attempt that was open at the upgrade is open still, with what its claim knew, and
  // closes into the ledger at the price it was claimed at.
  const std::string long_stage =
      schema::testing::QueryValue(c, "SELECT id FROM trnflow.stages WHERE run_id = " + running_run);
  EXPECT_EQ(schema::testing::QueryValue(
                c,
                "SELECT worker_name || ' ' || price_usd_hour || ' ' || progress_from"
                " FROM trnflow.open_attempts WHERE stage_id = " +
                    long_stage + " AND attempt = 1"),
            "old-worker 0.170000 0.25");
  EXPECT_EQ(schema::testing::QueryValue(
                c, "SELECT count(*) FROM trnflow.attempt_ledger WHERE run_id = " + running_run +
                       " AND outcome IS NULL"),
            "1");
  schema::AttemptResult done;
  done.stage_id = std::stoll(long_stage);
  done.attempt = 1;
  done.lease_owner = kOldWorker;
  done.outcome = Outcome::kSucceeded;
  done.next_state = StageState::kSucceeded;
  done.sim_seconds = 3600;
  done.billed_seconds = 3600;
  done.cost = Money::FromMicros(170'000);
  done.progress_to = 1;
  ASSERT_EQ(schema::testing::CompleteAttempts(c, {done}).size(), 1u);
  EXPECT_EQ(schema::testing::QueryValue(
                c,
                "SELECT outcome || ' ' || price_usd_hour || ' ' || worker_name || ' ' ||"
                " cost_usd || ' ' || progress_from FROM trnflow.attempts"
                " WHERE stage_id = " +
                    long_stage + " AND attempt = 1"),
            "succeeded 0.170000 old-worker 0.170000 0.25");
  EXPECT_EQ(schema::testing::QueryValue(
                c, "SELECT count(*) FROM trnflow.open_attempts WHERE run_id = " + running_run),
            "0");
}

}  // namespace trnflow

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new trnflow::testing::TestDatabase("trnflow_catalog_test"));
  return RUN_ALL_TESTS();
}
