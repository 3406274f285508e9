// Failure as the normal case, with real processes on a real PostgreSQL: worker and scheduler
// daemons killed with SIGKILL while a 2,003-stage DAG runs, a worker frozen past its lease,
// and the PostgreSQL server restarted mid-run. The catalog must stay consistent: every stage
// succeeds exactly once, no two attempts of a stage overlap, every lost attempt is recorded.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "pipelines/pipeline.h"
#include "schema/catalog.h"
#include "schema/catalog_testing.h"
#include "tests/daemon.h"
#include "tests/run_cli.h"
#include "tests/test_db.h"


namespace trnflow {
namespace {

using testing::TestDatabase;
using testing::WaitFor;

using testing::Daemon;

std::string LogDir() { return testing::DaemonLogDir(); }

std::string Home() { return LogDir() + "/home"; }

int64_t Submit(const std::string& yaml, double speed, int64_t seed = 1) {
  auto r = pipelines::ParsePipeline(yaml, "chaos.yaml", {});
  EXPECT_TRUE(r.pipeline) << r.diagnostics.Format();
  schema::Catalog c(TestDatabase::url());
  schema::SubmitOptions o;
  o.speed = speed;
  o.seed = seed;
  o.workdir = TRNFLOW_SOURCE_DIR;
  return c.SubmitRun(*r.pipeline, o);
}

// A catalog that re-opens itself: the server may be restarted under the test.
std::string Query(const std::string& sql) {
  for (int i = 0; i < 100; ++i) {
    try {
      schema::Catalog c(TestDatabase::url());
      return schema::testing::QueryValue(c, sql);
    } catch (const std::exception&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ADD_FAILURE() << "catalog unreachable for 10 s: " << sql;
  return "";
}

std::string RunStateText(int64_t run) {
  return Query("SELECT state FROM trnflow.runs WHERE id = " + std::to_string(run));
}

// The invariants every run must keep, whatever was killed.
void ExpectConsistent(int64_t run, int stages) {
  std::string r = std::to_string(run);
  EXPECT_EQ(RunStateText(run), "succeeded");
  EXPECT_EQ(Query("SELECT count(*) FROM trnflow.stages WHERE run_id = " + r),
            std::to_string(stages));
  EXPECT_EQ(Query("SELECT count(*) FROM trnflow.stages s WHERE run_id = " + r +
                  " AND (SELECT count(*) FROM trnflow.attempts a WHERE a.stage_id = s.id"
                  " AND a.outcome = 'succeeded') <> 1"),
            "0")
      << "every stage must have exactly one succeeded attempt";
  EXPECT_EQ(Query("SELECT count(*) FROM trnflow.open_attempts WHERE run_id = " + r), "0")
      << "every attempt must be closed with an outcome";
  EXPECT_EQ(Query("SELECT count(*) FROM trnflow.attempts a JOIN trnflow.attempts b"
                  " ON a.stage_id = b.stage_id AND a.attempt < b.attempt"
                  " WHERE a.run_id = " +
                  r + " AND b.started_at < a.finished_at"),
            "0")
      << "two attempts of one stage overlap in time";
  EXPECT_EQ(Query("SELECT count(*) FROM trnflow.stages s WHERE run_id = " + r +
                  " AND s.attempts <> (SELECT count(*) FROM trnflow.attempts a"
                  " WHERE a.stage_id = s.id)"),
            "0")
      << "an attempt number without its ledger row";
  EXPECT_EQ(Query(testing::kQueueMismatchesSql), "0") << "a stage out of step with the queue tables";
}

// root -> 1,000-way fan-out -> join -> 10 chains of 100 -> final: 2,003 stages.
std::string BigDag() {
  std::string y =
      "pipeline: chaos\nproject: chaos\ndefaults:\n  retry: {backoff: {initial: 1s, max: 2s}}\n"
      "stages:\n"
      "  root: {kind: compile, target: inf2, instance: trn1.2xlarge, model: bert-large, cache: "
      "false}\n"
      "  fan:\n    kind: compile\n    needs: [root]\n    target: inf2\n"
      "    instance: trn1.2xlarge\n    model: bert-large\n    cache: false\n    matrix: {i: [";
  for (int i = 0; i < 1000; ++i) y += (i ? "," : "") + std::to_string(i);
  y += "]}\n  join: {kind: compile, needs: [fan], target: inf2, instance: trn1.2xlarge, "
       "model: bert-large, cache: false}\n";
  std::string ends;
  for (int c = 0; c < 10; ++c)
    for (int k = 0; k < 100; ++k) {
      std::string name = "c" + std::to_string(c) + "_" + std::to_string(k);
      std::string need = k == 0 ? "join" : "c" + std::to_string(c) + "_" + std::to_string(k - 1);
      y += "  " + name + ": {kind: compile, needs: [" + need +
           "], target: inf2, instance: trn1.2xlarge, model: bert-large, cache: false}\n";
      if (k == 99) ends += (ends.empty() ? "" : ", ") + name;
    }
  y += "  final: {kind: compile, needs: [" + ends +
       "], target: inf2, instance: trn1.2xlarge, model: bert-large, cache: false}\n";
  return y;
}

std::unique_ptr<Daemon> Worker(int i, const std::string& lease = "2",
                               const std::string& pool = "trn1=16") {
  return std::make_unique<Daemon>(
      "worker" + std::to_string(i),
      std::vector<std::string>{"worker", "--pool", pool, "--lease", lease});
}

std::unique_ptr<Daemon> Scheduler(int i) {
  return std::make_unique<Daemon>("scheduler" + std::to_string(i),
                                  std::vector<std::string>{"scheduler"});
}

// The scheduler process holding the leader lock (trnflow.leader_lock), by the application_name its connections carry.
pid_t LeaderPid() {
  std::string app = Query(
      "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
      " WHERE l.locktype = 'relation' AND l.granted AND l.mode = 'ExclusiveLock'"
      " AND l.relation = 'trnflow.leader_lock'::regclass"
      // Copies of one template share relation oids: this catalog's database only.
      " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
      " LIMIT 1");
  return app.rfind("trnflow:", 0) == 0 ? std::stoi(app.substr(8)) : -1;
}

}  // namespace

TEST(Chaos, KillingWorkersAndTheLeaderLosesNothing) {
  setenv("TRNFLOW_HOME", Home().c_str(), 1);
  // bert-large compiles in 13 simulated minutes: ~100 ms of wall time per stage.
  int64_t run = Submit(BigDag(), 7800);
  std::vector<std::unique_ptr<Daemon>> workers, schedulers;
  for (int i = 0; i < 3; ++i) workers.push_back(Worker(i)), workers.back()->Start();
  for (int i = 0; i < 2; ++i) schedulers.push_back(Scheduler(i)), schedulers.back()->Start();

  std::mt19937 rng(20261121);
  int worker_kills = 0, leader_kills = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(4);
  while (RunStateText(run) == "running" && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    if (rng() % 10 < 7) {
      auto& w = workers[rng() % workers.size()];
      w->Kill(SIGKILL);
      ++worker_kills;
      w->Start();
    } else if (pid_t leader = LeaderPid(); leader > 0) {
      for (auto& s : schedulers)
        if (s->pid() == leader) {
          s->Kill(SIGKILL);
          ++leader_kills;
          s->Start();
        }
    }
  }
  ASSERT_NE(RunStateText(run), "running")
      << "the run did not finish in 4 minutes; logs in " << LogDir();
  std::cout << "killed " << worker_kills << " workers and " << leader_kills << " leaders; "
            << Query("SELECT count(*) FROM trnflow.attempts WHERE outcome = 'lost' AND run_id = " +
                     std::to_string(run))
            << " attempts lost and retried\n";
  ExpectConsistent(run, 2003);
  EXPECT_GT(worker_kills, 0);
  if (worker_kills > 2) {
    EXPECT_NE(Query("SELECT count(*) FROM trnflow.attempts WHERE outcome = 'lost' AND run_id = " +
                    std::to_string(run)),
              "0");
  }
}

TEST(Chaos, AWorkerFrozenPastItsLeaseDoesNotWriteItsStaleResult) {
  setenv("TRNFLOW_HOME", Home().c_str(), 1);
  // One stage of ~3 s wall time: bert-large compile (780 simulated s) at speed 260.
  int64_t run = Submit(
      "pipeline: frozen\nproject: chaos\nstages:\n"
      "  only: {kind: compile, target: inf2, instance: trn1.2xlarge, model: bert-large, cache: "
      "false}\n",
      260);
  auto scheduler = Scheduler(9);
  scheduler->Start();
  auto frozen = Worker(10, "1.5");
  frozen->Start();
  std::string r = std::to_string(run);
  ASSERT_TRUE(WaitFor(
      [&] { return Query("SELECT count(*) FROM trnflow.attempt_ledger WHERE run_id = " + r) == "1"; },
      20));
  frozen->Kill(SIGSTOP);
  // Its lease runs out; the scheduler records the attempt as lost.
  ASSERT_TRUE(WaitFor(
      [&] {
        return Query("SELECT outcome FROM trnflow.attempts WHERE attempt = 1 AND run_id = " + r) ==
               "lost";
      },
      20));
  auto healthy = Worker(11);
  healthy->Start();
  ASSERT_TRUE(WaitFor(
      [&] { return Query("SELECT count(*) FROM trnflow.attempt_ledger WHERE run_id = " + r) == "2"; },
      20));
  // The frozen worker wakes with an attempt it no longer owns, past its stage's end.
  frozen->Kill(SIGCONT);
  ASSERT_TRUE(WaitFor([&] { return RunStateText(run) != "running"; }, 30));
  // The stale worker has tried to write once it says it lost the lease.
  auto worker_log = [] { return testing::ReadFile(LogDir() + "/worker10.log"); };
  WaitFor([&] {
    std::string text = worker_log();
    return text.find("lease lost") != std::string::npos || text.find("stale") != std::string::npos;
  }, 30);
  ExpectConsistent(run, 1);
  EXPECT_EQ(Query("SELECT outcome FROM trnflow.attempts WHERE attempt = 1 AND run_id = " + r),
            "lost");
  EXPECT_EQ(
      Query("SELECT (SELECT worker_id FROM trnflow.attempts WHERE attempt = 2 AND run_id = " + r +
            ") <> (SELECT worker_id FROM trnflow.attempts WHERE attempt = 1 AND run_id = " + r +
            ")"),
      "t")
      << "the result must be the healthy worker's";
  std::string text = worker_log();
  EXPECT_TRUE(text.find("lease lost") != std::string::npos ||
              text.find("stale") != std::string::npos)
      << "the frozen worker should have noticed it lost the lease:\n"
      << text;
}

TEST(Chaos, RunSurvivesAPostgresRestart) {
  if (geteuid() != 0)
    GTEST_SKIP() << "restarting the local PostgreSQL needs root (CI runs as root)";
  setenv("TRNFLOW_HOME", Home().c_str(), 1);
  std::string y =
      "pipeline: restart\nproject: chaos\nstages:\n"
      "  a: {kind: compile, target: inf2, instance: trn1.2xlarge, model: bert-large, "
      "cache: false, matrix: {i: [";
  for (int i = 0; i < 200; ++i) y += (i ? "," : "") + std::to_string(i);
  y += "]}}\n  b: {kind: compile, needs: [a], target: inf2, instance: trn1.2xlarge, "
       "model: bert-large, cache: false, matrix: {i: [";
  for (int i = 0; i < 200; ++i) y += (i ? "," : "") + std::to_string(i);
  y += "]}}\n";
  int64_t run = Submit(y, 7800);
  auto scheduler = Scheduler(20);
  scheduler->Start();
  std::vector<std::unique_ptr<Daemon>> workers;
  for (int i = 0; i < 2; ++i) workers.push_back(Worker(20 + i, "5")), workers.back()->Start();
  std::string r = std::to_string(run);
  ASSERT_TRUE(WaitFor(
      [&] {
        return std::stoi(Query(
                   "SELECT count(*) FROM trnflow.stages WHERE state = 'succeeded' AND run_id = " +
                   r)) > 20;
      },
      30));
  ASSERT_EQ(std::system("pg_ctlcluster 15 main restart -m fast >/dev/null 2>&1"), 0);
  ASSERT_TRUE(WaitFor([&] { return RunStateText(run) != "running"; }, 120))
      << "logs in " << LogDir();
  ExpectConsistent(run, 400);
}

// A job's background children neither hold its stage open nor outlive it; and a job dies
// with its worker, so a retry elsewhere never runs beside it.
TEST(Chaos, JobsDieWithTheirStageAndTheirWorker) {
  setenv("TRNFLOW_HOME", Home().c_str(), 1);
  auto scheduler = Scheduler(30);
  scheduler->Start();
  auto worker = Worker(30, "30", "cpu=2");
  worker->Start();
  int64_t quick = Submit(
      "pipeline: leftovers\nproject: chaos\nstages:\n"
      "  s:\n    run: \"sleep 301.25 & echo started\"\n    shell: true\n",
      1);
  ASSERT_TRUE(WaitFor([&] { return RunStateText(quick) != "running"; }, 20));
  EXPECT_EQ(RunStateText(quick), "succeeded");
  EXPECT_NE(std::system("pgrep -f 'sleep 30[1].25' >/dev/null"), 0)
      << "the background child outlived its stage";

  // 317.5 s: no other test's job sleeps that long (pgrep sees the processes of every test).
  int64_t slow = Submit(
      "pipeline: orphan\nproject: chaos\nstages:\n  s:\n    run: [\"sleep\", \"317.5\"]\n", 1);
  ASSERT_TRUE(WaitFor([&] { return std::system("pgrep -f 'sleep 31[7].5' >/dev/null") == 0; }, 20));
  worker->Kill(SIGKILL);
  EXPECT_TRUE(WaitFor([&] { return std::system("pgrep -f 'sleep 31[7].5' >/dev/null") != 0; }, 5))
      << "the job outlived its worker";
  Query("UPDATE trnflow.runs SET state = 'cancelled' WHERE id = " + std::to_string(slow) +
        " RETURNING 1");
}

// Two worker processes, two runs needing the same graph at once: one compiles, the other
// waits unbilled and is served; the catalog records a single compile attempt.
TEST(Chaos, IdenticalCompilesFromTwoProcessesCompileOnce) {
  setenv("TRNFLOW_HOME", Home().c_str(), 1);
  const std::string yaml =
      "pipeline: shared-graph\nproject: chaos\nstages:\n"
      "  compile: {kind: compile, target: inf2, instance: trn1.2xlarge, model: llama-2-13b, "
      "tp_degree: 4, batch: 1, seq_len: 1024}\n";
  int64_t r1 = Submit(yaml, 600), r2 = Submit(yaml, 600);  // ~1.6 s of compiling
  auto scheduler = Scheduler(40);
  scheduler->Start();
  auto w1 = Worker(41, "5", "trn1=1"), w2 = Worker(42, "5", "trn1=1");
  w1->Start();
  w2->Start();
  ASSERT_TRUE(
      WaitFor([&] { return RunStateText(r1) != "running" && RunStateText(r2) != "running"; }, 60));
  EXPECT_EQ(RunStateText(r1), "succeeded");
  EXPECT_EQ(RunStateText(r2), "succeeded");
  std::string runs = std::to_string(r1) + "," + std::to_string(r2);
  EXPECT_EQ(Query("SELECT string_agg(outcome, ',' ORDER BY outcome) FROM trnflow.attempts "
                  "WHERE run_id IN (" +
                  runs + ")"),
            "cached,succeeded");
  EXPECT_EQ(Query("SELECT count(DISTINCT worker_id) FROM trnflow.attempts WHERE run_id IN (" +
                  runs + ")"),
            "2")
      << "each process took one run";
  EXPECT_EQ(Query("SELECT sum(cost_usd) FROM trnflow.attempts WHERE outcome = 'cached' AND "
                  "run_id IN (" +
                  runs + ")"),
            "0.000000");
}

}  // namespace trnflow

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new trnflow::testing::TestDatabase("trnflow_chaos_test"));
  return RUN_ALL_TESTS();
}
