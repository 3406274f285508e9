// A member's SQL calls, tried as a hostile tenant would (issue 32, parts 3 and 6): every
// argument of trnflow.submit_run is the caller's to choose, so each attack here calls it
// directly as a real member login against a real PostgreSQL, with the arrays a valid submission
// would pass and one of them changed. Each is refused, and nothing is written. Then what the
// daemons must survive or must not do: a malformed spec in the catalog, a member holding a lock
// with its timeouts SET to nothing, a negative ledger row, another catalog's project.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <latch>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <regex>
#include <thread>

#include "common/error.h"
#include "common/sha256.h"
#include "pipelines/pipeline.h"
#include "scheduler/scheduler.h"
#include "schema/catalog.h"
#include "schema/catalog_testing.h"
#include "sim/catalog.h"
#include "tests/run_cli.h"
#include "tests/test_db.h"
#include "tests/test_engine.h"
#include "workers/worker.h"

namespace trnflow {
namespace {

using testing::Query;
using testing::RunTrnflow;
using testing::TestDatabase;
using testing::WaitFor;

const std::string& Db() { return TestDatabase::database_name(); }
std::string Member(const std::string& who) { return "trnflow_test_" + Db() + "_" + who; }

// What submit_run takes, built from a parsed pipeline as Catalog::Impl::Submit builds it.
struct Call {
  std::string project, pipeline, hash, source, params = "{}";
  double speed = 1e7;
  std::vector<std::string> names, kinds, pools, types, markets, specs;
  std::vector<int> counts, pending, from, to;
};

Call FromYaml(const std::string& yaml, const std::string& project) {
  pipelines::Pipeline p = testing::MustParse(yaml, project);
  Call c;
  c.project = project;
  c.pipeline = p.name;
  c.hash = p.spec_hash;
  c.source = p.source;
  std::map<std::string, int> at;
  for (const auto& s : p.stages) {
    at[s.spec.name] = static_cast<int>(c.names.size()) + 1;
    c.names.push_back(s.spec.name);
    c.kinds.emplace_back(ToString(s.spec.kind));
    c.pools.push_back(s.pool);
    c.types.push_back(s.spec.instance);
    c.counts.push_back(s.spec.count);
    c.markets.emplace_back(ToString(s.spec.market));
    c.pending.push_back(static_cast<int>(s.needs.size()));
    c.specs.push_back(ToJson(s.spec));
  }
  for (const auto& s : p.stages)
    for (const auto& n : s.needs) {
      c.from.push_back(at.at(s.spec.name));
      c.to.push_back(at.at(n));
    }
  return c;
}

std::string TextArray(const std::vector<std::string>& v) {
  std::string out = "{";
  for (size_t i = 0; i < v.size(); ++i) {
    out += i ? ",\"" : "\"";
    for (char ch : v[i]) {
      if (ch == '"' || ch == '\\') out += '\\';
      out += ch;
    }
    out += "\"";
  }
  return out + "}";
}

std::string IntArray(const std::vector<int>& v) {
  std::string out = "{";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out + "}";
}

// Calls submit_run as `url`'s login; returns the run id, or throws pqxx's error.
int64_t Submit(pqxx::connection& conn, const Call& c) {
  pqxx::work tx(conn);
  auto r = tx.exec_params(
      "SELECT trnflow.submit_run($1, $2, $3, $4, $5::jsonb, $6, 1, 1, NULL, $7, false, $8::text[], "
      "$9::text[], $10::text[], $11::text[], $12::int[], $13::text[], $14::int[], $15::jsonb[], "
      "$16::int[], $17::int[])",
      c.project, c.pipeline, c.hash, c.source, c.params, c.speed, std::string(TRNFLOW_SOURCE_DIR),
      TextArray(c.names), TextArray(c.kinds), TextArray(c.pools), TextArray(c.types),
      IntArray(c.counts), TextArray(c.markets), IntArray(c.pending), TextArray(c.specs),
      IntArray(c.from), IntArray(c.to));
  tx.commit();
  return r[0][0].as<int64_t>();
}

// The SQLSTATE a refused call raised ("" if it went through).
std::string Refusal(pqxx::connection& conn, const Call& c, std::string* message = nullptr) {
  try {
    Submit(conn, c);
    return "";
  } catch (const pqxx::sql_error& e) {
    if (message) *message = e.what();
    return e.sqlstate().empty() ? "?" : e.sqlstate();
  }
}

// Everything a submission writes, counted (as the owner: every project's rows).
std::string Written() {
  return Query(
      "SELECT (SELECT count(*) FROM trnflow.runs) || '/' || (SELECT count(*) FROM trnflow.stages)"
      " || '/' || (SELECT count(*) FROM trnflow.pipelines) || '/' ||"
      " (SELECT count(*) FROM trnflow.artifacts)");
}

nlohmann::json Spec(const Call& c, size_t i) { return nlohmann::json::parse(c.specs[i]); }

const char* kOne = "pipeline: one\nstages:\n  hello:\n    run: [\"true\"]\n";
const char* kTrain =
    "pipeline: big-train\nstages:\n  train:\n    kind: train\n    instance: trn1.32xlarge\n"
    "    model: climate-emulator-1b\n    tokens: 1e9\n";
const char* kCompile =
    "pipeline: graphs\nstages:\n  compile:\n    kind: compile\n    target: inf2\n"
    "    instance: trn1.2xlarge\n    model: bert-large\n    tp_degree: 2\n    batch: 1\n"
    "    seq_len: 512\n";

class SqlAttacks : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    mallory_url_ = TestDatabase::NewLogin("mallory");
    ASSERT_EQ(RunTrnflow("project add atk --member " + Member("mallory")).exit_code, 0);
    ASSERT_EQ(RunTrnflow("project add vic").exit_code, 0);
  }
  void MembersIdleTransactionDoesNotStallAWorkersCommit(
      const std::function<std::function<void()>()>& run_daemons);
  static inline std::string mallory_url_;
};

TEST_F(SqlAttacks, AValidCallGoesThrough) {
  // The baseline every attack below changes one thing of: it must be accepted as it is.
  pqxx::connection m(mallory_url_);
  for (const char* y : {kOne, kTrain, kCompile}) {
    Call c = FromYaml(y, "atk");
    EXPECT_EQ(Refusal(m, c), "") << y;
  }
}

TEST_F(SqlAttacks, StageNamesThatArePathsOrControlCharactersAreRefused) {
  pqxx::connection m(mallory_url_);
  std::string before = Written();
  const std::vector<std::string> names = {
      "..",      ".", "", "a/b", "../../checkpoints", "a\x01z", "a\nb", std::string(300, 'x'),
      "x[i=a/b]"};
  for (const std::string& name : names) {
    Call c = FromYaml(kOne, "atk");
    nlohmann::json s = Spec(c, 0);
    s["name"] = name;
    c.names[0] = name;
    c.specs[0] = s.dump();
    EXPECT_EQ(Refusal(m, c), "22023") << "stage named '" << name << "'";
  }
  EXPECT_EQ(Written(), before) << "a refused call wrote something";
  // Retry takes a name too: refused as bad input before any stage is looked at.
  int64_t run = Submit(m, FromYaml(kOne, "atk"));
  for (const std::string name : {"../x", "a/b", "%"}) {
    std::string state;
    try {
      pqxx::work tx(m);
      tx.exec_params("SELECT trnflow.reset_stages($1, $2)", run, name);
    } catch (const pqxx::sql_error& e) {
      state = e.sqlstate();
    }
    EXPECT_EQ(state, "22023") << "retry of stage '" << name << "'";
  }
}

TEST_F(SqlAttacks, InstancesMustBeTheCatalogsAndSuitTheKind) {
  pqxx::connection m(mallory_url_);
  std::string before = Written();
  std::string why;
  // A compute-heavy training billed as a c6i.large: the row's type is what the claim prices,
  // the spec's is what the simulator runs.
  Call c = FromYaml(kTrain, "atk");
  c.types[0] = "c6i.large";
  c.pools[0] = "cpu";
  EXPECT_EQ(Refusal(m, c, &why), "22023") << "billed as c6i.large";
  EXPECT_NE(why.find("not the stage's own"), std::string::npos) << why;
  // The same with the spec saying c6i.large too: a training cannot run on a CPU instance.
  nlohmann::json s = Spec(c, 0);
  s["instance"] = "c6i.large";
  c.specs[0] = s.dump();
  EXPECT_EQ(Refusal(m, c, &why), "22023");
  EXPECT_NE(why.find("train stages run on Trainium"), std::string::npos) << why;
  // Not in the catalog at all; a pool that is not the instance's.
  c = FromYaml(kOne, "atk");
  s = Spec(c, 0);
  s["instance"] = "x9.free";
  c.types[0] = "x9.free";
  c.specs[0] = s.dump();
  EXPECT_EQ(Refusal(m, c), "22023") << "an instance type not in the catalog";
  c = FromYaml(kOne, "atk");
  c.pools[0] = "trn2";
  EXPECT_EQ(Refusal(m, c), "22023") << "a pool that is not the instance's";
  // A kind, a count, a market the parser never makes.
  c = FromYaml(kOne, "atk");
  s = Spec(c, 0);
  s["kind"] = "mine";
  c.kinds[0] = "mine";
  c.specs[0] = s.dump();
  EXPECT_EQ(Refusal(m, c), "22023") << "unknown kind";
  c = FromYaml(kOne, "atk");
  s = Spec(c, 0);
  s["count"] = 100000;
  c.counts[0] = 100000;
  c.specs[0] = s.dump();
  EXPECT_EQ(Refusal(m, c), "22023") << "count 100000";
  // A workload with a negative figure, and a retry policy that retries user errors.
  c = FromYaml(kTrain, "atk");
  s = Spec(c, 0);
  s["workload"]["tokens"] = -1e12;
  c.specs[0] = s.dump();
  EXPECT_EQ(Refusal(m, c), "22023") << "negative tokens";
  c = FromYaml(kOne, "atk");
  s = Spec(c, 0);
  s["retry"] = {{"max_attempts", 100000},
                {"on", {"user_error"}},
                {"backoff", {{"initial_s", 0}, {"factor", 1}, {"max_s", 0}}},
                {"max_interruptions", 6},
                {"then", "on-demand"}};
  c.specs[0] = s.dump();
  EXPECT_EQ(Refusal(m, c), "22023") << "retry policy";
  EXPECT_EQ(Written(), before) << "a refused call wrote something";
}

// A priority or an estimate the parser never makes (migrations 0032, 0033): a priority that
// would sort a member's stages past every other, a fraction, a string; an estimate that is
// negative, huge, a string, or on a simulated stage. The parser's own values go through.
TEST_F(SqlAttacks, PrioritiesAndEstimatesAreTheParsersOwn) {
  pqxx::connection m(mallory_url_);
  std::string before = Written();
  auto with = [](const char* yaml, const char* key, const nlohmann::json& value) {
    Call c = FromYaml(yaml, "atk");
    nlohmann::json s = Spec(c, 0);
    s[key] = value;
    c.specs[0] = s.dump();
    return c;
  };
  std::string why;
  for (const nlohmann::json& bad :
       {nlohmann::json(1e9), nlohmann::json(-1001), nlohmann::json(2.5), nlohmann::json("high")}) {
    EXPECT_EQ(Refusal(m, with(kOne, "priority", bad), &why), "22023") << "priority " << bad;
    EXPECT_NE(why.find("priority"), std::string::npos) << why;
  }
  for (const nlohmann::json& bad :
       {nlohmann::json(-1), nlohmann::json(1e12), nlohmann::json("1h")}) {
    EXPECT_EQ(Refusal(m, with(kOne, "estimate_s", bad), &why), "22023") << "estimate " << bad;
    EXPECT_NE(why.find("estimate"), std::string::npos) << why;
  }
  EXPECT_EQ(Refusal(m, with(kTrain, "estimate_s", 60)), "22023") << "an estimate on a train stage";
  EXPECT_EQ(Written(), before) << "a refused call wrote something";
  EXPECT_EQ(Refusal(m, with(kOne, "priority", -1000)), "");
  EXPECT_EQ(Refusal(m, with(kOne, "estimate_s", 3600)), "");
}

TEST_F(SqlAttacks, SpeedOutsideTheClisBoundsIsRefused) {
  pqxx::connection m(mallory_url_);
  std::string before = Written();
  for (double speed : {1e-9, 1e12, 0.0, -1.0}) {
    Call c = FromYaml(kOne, "atk");
    c.speed = speed;
    EXPECT_EQ(Refusal(m, c), "22023") << "speed " << speed;
  }
  EXPECT_EQ(Written(), before);
}

TEST_F(SqlAttacks, TwentyMegabytesInOneCallAreRefused) {
  pqxx::connection m(mallory_url_);
  std::string before = Written();
  Call c = FromYaml(kOne, "atk");
  nlohmann::json s = Spec(c, 0);
  s["command"]["env"] = {{"BLOB", std::string(20 << 20, 'x')}};
  c.specs[0] = s.dump();
  std::string state = Refusal(m, c);
  EXPECT_TRUE(state == "TF001" || state == "22023") << "a 20 MB spec: " << state;
  // In many small specs, and in the source.
  c = FromYaml(kOne, "atk");
  for (int i = 0; i < 200; ++i) {
    nlohmann::json si = Spec(c, 0);
    si["name"] = "s" + std::to_string(i);
    si["command"]["env"] = {{"BLOB", std::string(200 << 10, 'y')}};
    c.names.push_back(si["name"]);
    c.kinds.push_back(c.kinds[0]);
    c.pools.push_back(c.pools[0]);
    c.types.push_back(c.types[0]);
    c.counts.push_back(1);
    c.markets.push_back(c.markets[0]);
    c.pending.push_back(0);
    c.specs.push_back(si.dump());
  }
  EXPECT_EQ(Refusal(m, c), "TF001") << "40 MB in 200 specs of 200 KB";
  c = FromYaml(kOne, "atk");
  c.source = std::string(20 << 20, '#');
  EXPECT_EQ(Refusal(m, c), "TF001") << "a 20 MB source";
  EXPECT_EQ(Written(), before);
}

TEST_F(SqlAttacks, ACompileCacheKeyCannotBeChosen) {
  pqxx::connection m(mallory_url_);
  std::string before = Written();
  // The victim's graph: its key is the hash of its inputs.
  Call victim = FromYaml(kCompile, "vic");
  nlohmann::json vs = Spec(victim, 0);
  std::string key = vs["cache_key"];
  ASSERT_EQ(key, Sha256Hex(vs["cache_inputs"].get<std::string>()));
  // Mallory's compile that fails (tp_degree 3 is not valid on inf2), under the victim's key,
  // to leave a `failed` entry the victim's run would be served.
  Call c = FromYaml(kCompile, "atk");
  nlohmann::json s = Spec(c, 0);
  s["workload"]["tp_degree"] = 3;
  s["cache_key"] = key;
  c.specs[0] = s.dump();
  EXPECT_EQ(Refusal(m, c), "22023") << "a key that is not the hash of the stage's inputs";
  // With the victim's inputs as well: the inputs are not the graph the workload builds.
  s["cache_inputs"] = vs["cache_inputs"];
  c.specs[0] = s.dump();
  EXPECT_EQ(Refusal(m, c), "22023") << "the victim's inputs over another workload";
  // A cache key on a stage that is not a compile.
  c = FromYaml(kOne, "atk");
  s = Spec(c, 0);
  s["cache_key"] = key;
  c.specs[0] = s.dump();
  EXPECT_EQ(Refusal(m, c), "22023");
  EXPECT_EQ(Written(), before);
  EXPECT_EQ(Query("SELECT count(*) FROM trnflow.artifacts WHERE cache_key = '" + key + "'"), "0");
}

// The key holds the graph, not the host: compiling the victim's very graph on a host too small
// for the compiler (HOST_OOM) is a valid call, and must fail only the caller's stage, not leave
// a failure under the key that the victim's run would be served.
TEST_F(SqlAttacks, ACompileThatRanOutOfHostMemoryPoisonsNoKey) {
  pqxx::connection m(mallory_url_);
  Call c = FromYaml(kCompile, "atk");
  nlohmann::json s = Spec(c, 0);
  std::string key = s["cache_key"];
  s["instance"] = "c6i.large";
  c.types[0] = "c6i.large";
  c.pools[0] = "cpu";
  c.specs[0] = s.dump();
  int64_t mine = Submit(m, c);
  workers::Worker worker(testing::TestWorkerOptions({{"cpu", 4}, {"trn1", 2}}));
  scheduler::Scheduler sched(testing::TestSchedulerOptions());
  sched.Start();
  worker.Start();
  auto state = [](int64_t run) {
    return Query("SELECT state FROM trnflow.runs WHERE id = " + std::to_string(run));
  };
  ASSERT_TRUE(WaitFor([&] { return state(mine) != "running"; }, 30));
  EXPECT_EQ(state(mine), "failed");
  EXPECT_NE(Query("SELECT coalesce(string_agg(state, ','), 'none') FROM trnflow.artifacts WHERE "
                  "cache_key = '" +
                  key + "'"),
            "failed")
      << "a host's out-of-memory was remembered as the graph's failure";
  // The victim's compile of that graph, on a host that fits it, succeeds.
  schema::Catalog daemon(TestDatabase::url());
  auto o = testing::FastSubmit();
  o.project = "vic";
  int64_t theirs = daemon.SubmitRun(testing::MustParse(kCompile, "vic"), o);
  ASSERT_TRUE(WaitFor([&] { return state(theirs) != "running"; }, 30));
  worker.Stop();
  sched.Stop();
  EXPECT_EQ(state(theirs), "succeeded")
      << Query("SELECT string_agg(message, '; ') FROM trnflow.attempts WHERE run_id = " +
               std::to_string(theirs));
}

TEST_F(SqlAttacks, ConcurrentSubmitsCannotRaceTheQueuedStagesQuota) {
  ASSERT_EQ(
      RunTrnflow("project add race --member " + Member("mallory") + " --max-queued-stages 100")
          .exit_code,
      0);
  std::string y = "pipeline: sweep\nstages:\n  s:\n    run: [\"true\"]\n    matrix: {i: [";
  for (int i = 0; i < 40; ++i) y += (i ? "," : "") + std::to_string(i);
  y += "]}\n";
  Call c = FromYaml(y, "race");
  constexpr int kSubmitters = 8;
  std::vector<std::unique_ptr<pqxx::connection>> conns;
  for (int i = 0; i < kSubmitters; ++i)
    conns.push_back(std::make_unique<pqxx::connection>(mallory_url_));
  std::latch start(kSubmitters);
  std::atomic<int> accepted{0}, refused{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kSubmitters; ++i)
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      std::string state = Refusal(*conns[i], c);
      (state.empty() ? accepted : refused)++;
      EXPECT_TRUE(state.empty() || state == "TF001") << state;
    });
  for (auto& t : threads) t.join();
  std::string queued = Query(
      "SELECT count(*) FROM trnflow.stages s JOIN trnflow.runs r ON r.id = s.run_id "
      "WHERE r.project = 'race' AND s.state IN ('blocked', 'ready', 'running', 'retry_wait')");
  EXPECT_LE(std::stoi(queued), 100) << accepted << " of 8 submits of 40 stages got in";
  EXPECT_EQ(accepted.load(), 2);
  EXPECT_EQ(refused.load(), kSubmitters - 2);
  Query("UPDATE trnflow.runs SET state = 'cancelled' WHERE project = 'race'; SELECT 1");
}

TEST_F(SqlAttacks, TheDaemonsLoginCannotWriteANegativeOrHugeCost) {
  schema::Catalog daemon(TestDatabase::url());
  int64_t run = daemon.SubmitRun(testing::MustParse(kOne, "vic"), [] {
    auto o = testing::FastSubmit();
    o.project = "vic";
    return o;
  }());
  std::string stage = Query("SELECT id FROM trnflow.stages WHERE run_id = " + std::to_string(run));
  std::string before = Query("SELECT count(*) FROM trnflow.attempts");
  for (const char* cost : {"-1000", "1e12"}) {
    std::string sql =
        "INSERT INTO trnflow.attempts (stage_id, run_id, attempt, worker_id, worker_name, "
        "instance_type, instance_count, market, price_usd_hour, finished_at, sim_seconds, "
        "billed_seconds, outcome, cost_usd) VALUES (" +
        stage + ", " + std::to_string(run) +
        ", 77, '00000000-0000-0000-0000-000000000077', 'forged', 'c6i.large', 1, 'on-demand', "
        "0.085, now(), 60, 60, 'succeeded', " +
        cost + ") RETURNING id";
    EXPECT_ANY_THROW(schema::testing::QueryValue(daemon, sql)) << "cost " << cost;
  }
  EXPECT_ANY_THROW(schema::testing::QueryValue(
      daemon,
      "INSERT INTO trnflow.attempts (stage_id, run_id, attempt, worker_id, worker_name, "
      "instance_type, instance_count, market, price_usd_hour, finished_at, sim_seconds, "
      "billed_seconds, outcome, cost_usd) VALUES (" +
          stage + ", " + std::to_string(run) +
          ", 78, '00000000-0000-0000-0000-000000000078', 'forged', 'c6i.large', 1, 'on-demand', "
          "0.085, now(), -3600, 60, 'succeeded', 0) RETURNING id"))
      << "negative simulated seconds";
  EXPECT_EQ(Query("SELECT count(*) FROM trnflow.attempts"), before);
  daemon.CancelRun(run);
}

// A malformed spec written around submit_run (as the owner, directly into the row) fails its
// own stage; the other stages of its run and another project's run complete.
TEST_F(SqlAttacks, AMalformedSpecFailsItsOwnStageAndStallsNothing) {
  std::string y =
      "pipeline: three\nstages:\n  good1:\n    run: [\"true\"]\n  bad:\n    run: [\"true\"]\n"
      "  good2:\n    run: [\"true\"]\n";
  schema::Catalog daemon(TestDatabase::url());
  auto o = testing::FastSubmit();
  o.project = "atk";
  int64_t mine = daemon.SubmitRun(testing::MustParse(y, "atk"), o);
  o.project = "vic";
  int64_t other = daemon.SubmitRun(testing::MustParse(y, "vic"), o);
  Query("UPDATE trnflow.stages SET spec = '{\"name\": \"bad\", \"kind\": 7}' WHERE run_id = " +
        std::to_string(mine) + " AND name = 'bad'; SELECT 1");
  workers::Worker worker(testing::TestWorkerOptions({{"cpu", 4}}));
  scheduler::Scheduler sched(testing::TestSchedulerOptions());
  sched.Start();
  worker.Start();
  auto state = [](int64_t run) {
    return Query("SELECT state FROM trnflow.runs WHERE id = " + std::to_string(run));
  };
  // Without the fix every claim that met the spec failed and was retried: the runs ended only
  // after ~30 s of stalled claims. With it they end in a few seconds.
  EXPECT_TRUE(WaitFor([&] { return state(other) != "running" && state(mine) != "running"; }, 15))
      << "a malformed spec stalled the worker";
  worker.Stop();
  sched.Stop();
  EXPECT_EQ(state(other), "succeeded");
  EXPECT_EQ(state(mine), "failed");
  EXPECT_EQ(Query("SELECT string_agg(name || '=' || state, ',' ORDER BY name) FROM trnflow.stages "
                  "WHERE run_id = " +
                  std::to_string(mine)),
            "bad=failed,good1=succeeded,good2=succeeded");
  std::string why = Query(
      "SELECT a.outcome || ': ' || a.message FROM trnflow.attempts a JOIN trnflow.stages s ON "
      "s.id = a.stage_id WHERE s.run_id = " +
      std::to_string(mine) + " AND s.name = 'bad'");
  EXPECT_NE(why.find("user_error: the stage's stored spec cannot be run"), std::string::npos)
      << why;
}

// The same spec in a running stage whose worker died: the rescuer closes it with every other
// expired lease (another project's among them) instead of failing the whole rescue.
TEST_F(SqlAttacks, AMalformedSpecDoesNotStallTheLeaseRescuer) {
  schema::Catalog daemon(TestDatabase::url());
  auto o = testing::FastSubmit();
  o.project = "atk";
  int64_t mine = daemon.SubmitRun(testing::MustParse(kOne, "atk"), o);
  o.project = "vic";
  int64_t other = daemon.SubmitRun(testing::MustParse(kOne, "vic"), o);
  const std::string dead = "00000000-0000-0000-0000-0000000000d1";
  for (int64_t run : {mine, other})
    ASSERT_EQ(daemon.ClaimReadyStages("cpu", 4, dead, "dead", 1, run).size(), 1u);
  Query("UPDATE trnflow.stages SET spec = '[1, 2]' WHERE run_id = " + std::to_string(mine) +
        "; SELECT 1");
  scheduler::Scheduler sched(testing::TestSchedulerOptions());
  sched.Start();
  auto attempt = [](int64_t run) {
    return Query(
        "SELECT coalesce(string_agg(a.outcome, ','), '') FROM trnflow.attempts a "
        "WHERE a.run_id = " +
        std::to_string(run));
  };
  // The dead worker's lease lapses after 1 s; the rescuer closes both attempts as lost.
  EXPECT_TRUE(WaitFor([&] { return attempt(other) == "lost" && attempt(mine) == "lost"; }, 20))
      << "other: " << attempt(other) << "; mine: " << attempt(mine);
  // A worker then fails the malformed stage on its next claim and runs the other's.
  workers::Worker worker(testing::TestWorkerOptions({{"cpu", 4}}));
  worker.Start();
  auto state = [](int64_t run) {
    return Query("SELECT state FROM trnflow.runs WHERE id = " + std::to_string(run));
  };
  EXPECT_TRUE(WaitFor([&] { return state(other) != "running" && state(mine) != "running"; }, 30));
  worker.Stop();
  sched.Stop();
  EXPECT_EQ(state(other), "succeeded");
  EXPECT_EQ(state(mine), "failed");
}

// A member opens a transaction that holds its own run's row, with its timeouts SET to nothing:
// the worker's commit, which closes another project's stage in the same batch, must not wait
// until that stage is declared lost. The scheduler's lock guard ends the member's session.
// A member's transaction holds its run's row with its own timeouts off, while a worker commits
// a batch that touches that row: `run_daemons` starts the daemons whose lock guard must end the
// member's session.
void SqlAttacks::MembersIdleTransactionDoesNotStallAWorkersCommit(
    const std::function<std::function<void()>()>& run_daemons) {
  schema::Catalog daemon(TestDatabase::url());
  schema::Catalog mallory(mallory_url_);
  auto o = testing::FastSubmit();
  o.project = "atk";
  int64_t mine = mallory.SubmitRun(testing::MustParse(kOne, "atk"), o);
  o.project = "vic";
  int64_t other = daemon.SubmitRun(testing::MustParse(kOne, "vic"), o);
  const std::string worker_id = "00000000-0000-0000-0000-0000000000a1";
  std::vector<schema::AttemptResult> results;
  for (int64_t run : {mine, other}) {
    auto claimed = daemon.ClaimReadyStages("cpu", 4, worker_id, "w", 120, run);
    ASSERT_EQ(claimed.size(), 1u);
    schema::AttemptResult r;
    r.stage_id = claimed[0].stage_id;
    r.attempt = claimed[0].attempt;
    r.lease_owner = worker_id;
    r.sim_seconds = 1;
    r.billed_seconds = 60;
    results.push_back(r);
  }
  auto hold = std::make_unique<pqxx::connection>(mallory_url_);
  pqxx::nontransaction(*hold).exec(
      "SET idle_in_transaction_session_timeout = 0; SET statement_timeout = 0; "
      "SET lock_timeout = 0; BEGIN; SELECT trnflow.cancel_run(" +
      std::to_string(mine) + ", 'cancelled')");

  std::function<void()> stop_daemons = run_daemons();
  std::atomic<bool> done{false};
  std::thread commit([&] {
    try {
      schema::Catalog worker(TestDatabase::url());
      schema::testing::CompleteAttempts(worker, results);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "the worker's commit failed: " << e.what();
    }
    done = true;
  });
  bool finished = WaitFor([&] { return done.load(); }, 30);
  EXPECT_TRUE(finished) << "a member's open transaction stalled the worker's commit";
  hold.reset();  // ends the member's transaction if the guard did not
  commit.join();
  stop_daemons();
  EXPECT_EQ(Query("SELECT state FROM trnflow.stages WHERE run_id = " + std::to_string(other)),
            "succeeded");
}

TEST_F(SqlAttacks, AMembersIdleTransactionDoesNotStallAWorkersCommit) {
  MembersIdleTransactionDoesNotStallAWorkersCommit([] {
    auto opts = testing::TestSchedulerOptions();
    opts.member_lock_limit_s = 1;
    opts.member_lock_every_s = 0.2;
    auto sched = std::make_shared<scheduler::Scheduler>(opts);
    sched->Start();
    return [sched] { sched->Stop(); };
  });
}

// With no scheduler running: each worker runs the lock guard too.
TEST_F(SqlAttacks, AMembersIdleTransactionDoesNotStallAWorkersCommitWithoutAScheduler) {
  std::string home =
      (std::filesystem::temp_directory_path() / ("trnflow-lockguard-" + std::to_string(getpid())))
          .string();
  MembersIdleTransactionDoesNotStallAWorkersCommit([home] {
    workers::WorkerOptions o;
    o.database_url = TestDatabase::url();
    o.home = home;
    o.pools = {{"gpu", 1}};  // nothing of these runs to claim: the guard is what is tested
    o.sandbox = false;
    o.executors = workers::Executors::Local();
    o.member_lock_limit_s = 1;
    o.member_lock_every_s = 0.2;
    auto worker = std::make_shared<workers::Worker>(o);
    worker->Start();
    return [worker, home] {
      worker->Stop();
      std::error_code ec;
      std::filesystem::remove_all(home, ec);
    };
  });
}

// Two catalogs on one server: one catalog's daemons read nothing of the other's projects,
// though they are granted a login that is a member in both; their job uid ranges never overlap.
TEST_F(SqlAttacks, TwoCatalogsOnOneServerShareNoProjectAndNoUid) {
  const std::string other_db = Db() + "_two";
  std::string other_owner = schema::CreateDatabase(testing::AdminUrl(), other_db);
  struct Cleanup {
    std::string db;
    ~Cleanup() {
      schema::DropDatabase(testing::AdminUrl(), db);
      schema::DropCatalogRoles(testing::AdminUrl(), db);
    }
  } cleanup{other_db};
  {
    schema::Catalog two(other_owner);
    two.Migrate(sim::Catalog::Builtin());
  }
  // alice is a member in both catalogs; this catalog's daemons are granted her role.
  std::string alice = TestDatabase::NewLogin("alice2");
  ASSERT_EQ(RunTrnflow("project add here --member " + Member("alice2")).exit_code, 0);
  schema::Catalog two(other_owner);
  two.AddProject("secret", {Member("alice2")});
  std::string daemon_two = schema::EnableDaemonLogin(other_owner);
  schema::Catalog(daemon_two).SubmitRun(testing::MustParse(kOne, "secret"), [] {
    auto o = testing::FastSubmit();
    o.project = "secret";
    return o;
  }());
  // This catalog's daemons' login, pointed at the other catalog's database.
  std::smatch m;
  const std::string& url = TestDatabase::url();
  ASSERT_TRUE(std::regex_search(url, m, std::regex(R"(://([^:@/]+):([^@/]+)@)"))) << "a URI";
  std::string here_daemon_there = schema::WithLogin(other_owner, m[1].str(), m[2].str());
  // The daemons may SET ROLE to alice (the dashboard acts as its viewer), and alice may read
  // "secret" there: the other catalog's database must refuse the connection itself.
  std::string seen;
  try {
    schema::Catalog d(here_daemon_there);
    seen = schema::testing::QueryValue(
        d, "SET ROLE " + Member("alice2") +
               "; SELECT count(*) FROM trnflow.runs WHERE project = 'secret'");
  } catch (const std::exception& e) {
    seen = std::string("refused: ") + e.what();
  }
  EXPECT_EQ(seen.rfind("refused", 0), 0u)
      << "one catalog's daemons read another catalog's project as a shared member: " << seen;
  EXPECT_NE(seen.find("may not connect"), std::string::npos) << seen;

  // Job uids: each catalog has its own range, and cannot be given the other's.
  schema::Catalog here_owner(TestDatabase::owner_url());
  std::string mine = here_owner.JobUidRange(), theirs = two.JobUidRange();
  ASSERT_FALSE(mine.empty());
  ASSERT_FALSE(theirs.empty());
  auto lo = [](const std::string& r) { return std::stoll(r.substr(0, r.find('-'))); };
  auto hi = [](const std::string& r) { return std::stoll(r.substr(r.find('-') + 1)); };
  EXPECT_TRUE(hi(mine) < lo(theirs) || hi(theirs) < lo(mine)) << mine << " and " << theirs;
  EXPECT_THROW(two.SetJobUidRange(lo(mine) + 10, hi(mine) + 10), UserError);
  EXPECT_EQ(two.JobUidRange(), theirs);
  // Every project's uid lies in its catalog's range; one outside is refused.
  auto outside = [&](schema::Catalog& c, const std::string& r) {
    return schema::testing::QueryValue(
        c, "SELECT count(*) FROM trnflow.projects WHERE job_uid NOT BETWEEN " +
               std::to_string(lo(r)) + " AND " + std::to_string(hi(r)));
  };
  EXPECT_EQ(outside(here_owner, mine), "0");
  EXPECT_EQ(outside(two, theirs), "0");
  EXPECT_THROW(here_owner.SetProjectQuotas("here", std::nullopt, std::nullopt, lo(theirs) + 5),
               UserError);
  auto r = RunTrnflow("project add outside --job-uid " + std::to_string(lo(theirs) + 6));
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  // Through `db migrate`: the other catalog's range is refused, this one's own is kept.
  r = RunTrnflow("db migrate --job-uid-range " + theirs);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("overlaps"), std::string::npos) << r.err;
  EXPECT_EQ(RunTrnflow("db migrate --job-uid-range 300-200").exit_code, 2);
  r = RunTrnflow("db migrate --job-uid-range " + mine);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("job uids " + mine), std::string::npos) << r.out;
}

}  // namespace
}  // namespace trnflow

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new trnflow::testing::TestDatabase("trnflow_sql_attack"));
  return RUN_ALL_TESTS();
}
