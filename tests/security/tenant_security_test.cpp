// Tenants that share one catalog and one fleet, tried as a hostile tenant would: a member of
// one project, a pipeline author whose job looks for a way into the catalog, a runaway run, a
// sweep that would starve everyone else. Each attack is refused, and the ledger is the same
// before and after. Real PostgreSQL, real logins, real jobs through the `trnflow` binary.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "common/error.h"
#include "common/money.h"
#include "common/sha256.h"
#include "pipelines/pipeline.h"
#include "schema/catalog.h"
#include "schema/catalog_testing.h"
#include "tests/daemon.h"
#include "tests/run_cli.h"
#include "tests/test_db.h"
#include "tests/test_engine.h"

namespace trnflow {
namespace {

namespace fs = std::filesystem;
using testing::CliResult;
using testing::RunTrnflow;
using testing::TestDatabase;
using testing::WriteTempFile;

const std::string& Db() { return TestDatabase::database_name(); }

// Every closed and open ledger row, as one digest.
std::string LedgerChecksum() {
  schema::Catalog owner(TestDatabase::owner_url());
  return schema::testing::QueryValue(
      owner,
      "SELECT md5(coalesce(string_agg(a::text, '|' ORDER BY id), '')) FROM trnflow.attempts a");
}

int64_t RunIdFrom(const std::string& out) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(out, m, std::regex(R"(run (\d+)[: ])"))) << out;
  return m.empty() ? 0 : std::stoll(m[1]);
}

const char* kTiny =
    "pipeline: tiny\nproject: ten-b\nstages:\n"
    "  hello:\n    run: [\"true\"]\n    env: {NOTE: \"b's private note\"}\n";

// A project with a run, a schedule and ledger rows, and a member of another project.
class Tenants : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string file = WriteTempFile("tiny.yaml", kTiny);
    CliResult r = RunTrnflow("run " + file + " --speed 1000000");
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    b_run_ = RunIdFrom(r.out);
    CliResult sched =
        RunTrnflow("schedule add b-nightly " + file + " --cron '0 2 * * *' --project ten-b");
    ASSERT_EQ(sched.exit_code, 0) << sched.err;
    alice_url_ = TestDatabase::NewLogin("alice");
    CliResult add = RunTrnflow("project add ten-a --member trnflow_test_" + Db() + "_alice");
    ASSERT_EQ(add.exit_code, 0) << add.err;
    ASSERT_EQ(RunTrnflow("project add ten-b").exit_code, 0);
  }
  static inline int64_t b_run_ = 0;
  static inline std::string alice_url_;
};

TEST_F(Tenants, AMemberCannotWriteTheLedgerOrTakeTheServicesLocks) {
  std::string before = LedgerChecksum();
  schema::Catalog alice(alice_url_);
  for (const std::string sql : {
           "UPDATE trnflow.attempts SET cost_usd = 0 RETURNING 1",
           "DELETE FROM trnflow.attempts RETURNING 1",
           "TRUNCATE trnflow.attempts; SELECT 1",
           "ALTER TABLE trnflow.attempts DISABLE TRIGGER attempts_closed_once; SELECT 1",
           "INSERT INTO trnflow.budgets (project, amount_usd) VALUES ('ten-b', 1) RETURNING 1",
           "UPDATE trnflow.runs SET state = 'failed' RETURNING 1",
           "COPY (SELECT 1) TO PROGRAM 'id'",
           "CREATE TABLE trnflow.mine (x int); SELECT 1",
           "CREATE TABLE public.mine (x int); SELECT 1",
           "LOCK TABLE trnflow.leader_lock IN EXCLUSIVE MODE; SELECT 1",
           "LOCK TABLE trnflow.migration_lock IN EXCLUSIVE MODE; SELECT 1",
           "SELECT trnflow.reserve_budgets('{1}', '{1}', gen_random_uuid(), '{NULL}')",
           "SELECT trnflow.top_up_budget(1, 1, gen_random_uuid(), 1000)",
           "SELECT * FROM trnflow.budget_left(1, 1)",
           "SELECT * FROM trnflow.budget_waits",
           "SELECT trnflow.grant_project('ten-b', current_user, true)",
           "SELECT trnflow.release_dependents('{1}')",
       })
    EXPECT_THROW(schema::testing::QueryValue(alice, sql), PermissionDenied) << sql;
  EXPECT_EQ(LedgerChecksum(), before) << "a member changed the ledger";

  // An advisory lock on the old leadership key is open to anyone, and now means nothing.
  schema::testing::QueryValue(alice, "SELECT pg_advisory_lock(" + std::to_string(0x74726e02) + ")");
  schema::Catalog daemon(TestDatabase::url());
  EXPECT_TRUE(daemon.TryAcquireLeadership()) << "a member's lock held the scheduler back";
}

TEST_F(Tenants, AMemberSeesAndActsOnlyInItsOwnProjects) {
  std::string before = LedgerChecksum();
  schema::Catalog alice(alice_url_);
  EXPECT_EQ(schema::testing::QueryValue(
                alice, "SELECT count(*) FROM trnflow.runs WHERE project = 'ten-b'"),
            "0");
  EXPECT_EQ(schema::testing::QueryValue(alice, "SELECT count(*) FROM trnflow.schedules"), "0")
      << "another project's schedule (and its pipeline source) is visible";
  EXPECT_EQ(schema::testing::QueryValue(
                alice, "SELECT count(*) FROM trnflow.pipelines WHERE source LIKE '%private%'"),
            "0");
  EXPECT_EQ(schema::testing::QueryValue(alice, "SELECT count(*) FROM trnflow.schedule_fires"), "0");
  // Submit, cancel, retry and resume in another project: refused in SQL, whatever the CLI says.
  auto p = testing::MustParse(kTiny);
  schema::SubmitOptions o = testing::FastSubmit();
  o.project = "ten-b";
  EXPECT_THROW(alice.SubmitRun(p, o), PermissionDenied);
  EXPECT_THROW(alice.CancelRun(b_run_), PermissionDenied);
  EXPECT_THROW(alice.RetryStage(b_run_, "hello"), PermissionDenied);
  EXPECT_THROW(alice.ResumeRun(b_run_), PermissionDenied);
  EXPECT_THROW(alice.CancelRun(b_run_, Outcome::kBudgetExceeded), PermissionDenied);
  // In its own project it submits and cancels, under its own name.
  o.project = "ten-a";
  int64_t mine = alice.SubmitRun(p, o);
  EXPECT_EQ(schema::testing::QueryValue(
                alice, "SELECT submitted_by FROM trnflow.runs WHERE id = " + std::to_string(mine)),
            "trnflow_test_" + Db() + "_alice");
  EXPECT_TRUE(alice.CancelRun(mine).cancelled);
  EXPECT_THROW(alice.CancelRun(mine, Outcome::kBudgetExceeded), PermissionDenied)
      << "only the daemons stop a run for its budget";
  // Through the CLI: a distinct exit code, and what was refused.
  std::string file = WriteTempFile("tiny-cli.yaml", kTiny);
  std::string as_alice = "TRNFLOW_DATABASE_URL='" + alice_url_ + "'";
  CliResult submit = RunTrnflow("submit " + file + " --project ten-b", as_alice);
  EXPECT_EQ(submit.exit_code, 4) << submit.out << submit.err;
  EXPECT_NE(submit.err.find("permission denied: submitting a run in project \"ten-b\""),
            std::string::npos)
      << submit.err;
  CliResult cancel = RunTrnflow("cancel " + std::to_string(b_run_), as_alice);
  EXPECT_NE(cancel.exit_code, 0);
  std::string runs_before = schema::testing::QueryValue(alice, "SELECT count(*) FROM trnflow.runs");
  CliResult run = RunTrnflow("run " + file + " --project ten-a", as_alice);
  EXPECT_EQ(run.exit_code, 4) << run.out << run.err;
  EXPECT_NE(run.err.find("daemons' login"), std::string::npos) << run.err;
  EXPECT_EQ(schema::testing::QueryValue(alice, "SELECT count(*) FROM trnflow.runs"), runs_before)
      << "a refused `trnflow run` submitted anyway";
  EXPECT_EQ(LedgerChecksum(), before);
}

TEST_F(Tenants, AMemberCannotExhaustConnectionsOrHoldLocksForever) {
  schema::Catalog alice(alice_url_);
  EXPECT_EQ(schema::testing::QueryValue(alice, "SHOW statement_timeout"), "1min");
  EXPECT_EQ(schema::testing::QueryValue(alice, "SHOW idle_in_transaction_session_timeout"), "1min");
  std::vector<std::unique_ptr<schema::Catalog>> held;
  held.push_back(nullptr);  // `alice` is the first of its 16
  bool refused = false;
  for (int i = 0; i < 40 && !refused; ++i) {
    try {
      held.push_back(std::make_unique<schema::Catalog>(alice_url_));
    } catch (const CatalogUnavailable& e) {
      refused = std::string(e.what()).find("too many connections") != std::string::npos;
      EXPECT_TRUE(refused) << e.what();
    }
  }
  EXPECT_TRUE(refused);
  EXPECT_EQ(held.size(), 16u) << "a member's connection limit";
  // The daemons still connect.
  schema::Catalog daemon(TestDatabase::url());
  EXPECT_EQ(schema::testing::QueryValue(daemon, "SELECT 1"), "1");
}

TEST_F(Tenants, TheDaemonsLoginCannotRewriteTheLedgerOrChangeTheSchema) {
  std::string before = LedgerChecksum();
  schema::Catalog daemon(TestDatabase::url());
  for (const std::string sql : {
           "UPDATE trnflow.attempts SET cost_usd = 0 RETURNING 1",
           "UPDATE trnflow.attempts SET price_usd_hour = 0 RETURNING 1",
           "DELETE FROM trnflow.attempts RETURNING 1",
           "TRUNCATE trnflow.attempts; SELECT 1",
           "ALTER TABLE trnflow.attempts DISABLE TRIGGER attempts_closed_once; SELECT 1",
           "DROP TRIGGER attempts_closed_once ON trnflow.attempts; SELECT 1",
           "CREATE TABLE trnflow.mine (x int); SELECT 1",
           "CREATE ROLE mine; SELECT 1",
           "COPY (SELECT 1) TO PROGRAM 'id'",
           "DELETE FROM trnflow.spend_rollup RETURNING 1",
       })
    EXPECT_ANY_THROW(schema::testing::QueryValue(daemon, sql)) << sql;
  EXPECT_EQ(LedgerChecksum(), before);
}

TEST_F(Tenants, QuotasRefuseASubmitWithTheFigures) {
  ASSERT_EQ(RunTrnflow("project add ten-q --max-stages-per-run 5").exit_code, 0);
  std::string y =
      "pipeline: sweep\nproject: ten-q\nstages:\n  s:\n    run: [\"true\"]\n"
      "    matrix: {i: [1, 2, 3, 4, 5, 6]}\n";
  schema::Catalog daemon(TestDatabase::url());
  std::string runs = schema::testing::QueryValue(daemon, "SELECT count(*) FROM trnflow.runs");
  // The parser counts the stages before it expands the matrix and refuses past the quota, at
  // the file's place, as `validate` and `plan` do (docs/cli.md#exit-codes: 2).
  std::string file = WriteTempFile("sweep.yaml", y);
  for (const char* command : {"submit ", "validate ", "plan "}) {
    CliResult r = RunTrnflow(command + file);
    EXPECT_EQ(r.exit_code, 2) << command << r.out << r.err;
    EXPECT_NE(r.err.find("sweep.yaml:4:3: error: the pipeline's stages expand to 6 stages"),
              std::string::npos)
        << command << r.err;
    EXPECT_NE(r.err.find("project \"ten-q\" allows at most 5 per run"), std::string::npos)
        << command << r.err;
    EXPECT_NE(r.err.find("trnflow project add ten-q --max-stages-per-run N"), std::string::npos)
        << command << r.err;
  }
  // The catalog's own check stays (a submit that raced another, a client that is not this
  // one): 6 stages through submit_run directly.
  pipelines::LoadOptions unbounded;
  unbounded.stage_bound = [](const std::string&) {
    pipelines::StageBound b;
    b.max_stages = 1000;
    return b;
  };
  auto six = pipelines::ParsePipeline(y, "sweep.yaml", unbounded);
  ASSERT_TRUE(six.pipeline) << six.diagnostics.Format();
  try {
    daemon.SubmitRun(*six.pipeline, testing::FastSubmit());
    ADD_FAILURE() << "submit_run took 6 stages past a quota of 5";
  } catch (const Refused& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "the run has 6 stages; project \"ten-q\" allows at most 5 per run"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(schema::testing::QueryValue(daemon, "SELECT count(*) FROM trnflow.runs"), runs)
      << "nothing written";
  EXPECT_EQ(RunTrnflow("run examples/climate/pipeline.yaml --speed 1e300").exit_code, 2);
  EXPECT_EQ(RunTrnflow("run examples/climate/pipeline.yaml --speed nan").exit_code, 2);
  EXPECT_EQ(RunTrnflow("submit examples/climate/pipeline.yaml --speed 1e307").exit_code, 2);
  EXPECT_EQ(schema::testing::QueryValue(daemon, "SELECT count(*) FROM trnflow.runs"), runs);
  EXPECT_ANY_THROW(
      schema::testing::QueryValue(daemon, "UPDATE trnflow.runs SET speed = 'NaN' RETURNING 1"));
  EXPECT_ANY_THROW(
      schema::testing::QueryValue(daemon, "UPDATE trnflow.runs SET speed = 1e307 RETURNING 1"));
}

// While one project has 20,000 stages ready in a pool, another's single stage is in the very
// next claim: the pool is shared by running share (tests/fleet_share_test.cpp has the rest).
TEST_F(Tenants, ClaimsShareAPoolBetweenProjects) {
  std::string y = "pipeline: flood\nproject: ten-flood\nstages:\n";
  for (const char* stage : {"s", "t"}) {  // two sweeps of 10,000 (a matrix's most)
    y += std::string("  ") + stage +
         ":\n    run: [\"true\"]\n    instance: c6i.large\n"
         "    matrix: {i: [";
    for (int i = 0; i < 10000; ++i) y += (i ? "," : "") + std::to_string(i);
    y += "]}\n";
  }
  schema::Catalog daemon(TestDatabase::url());
  auto flood = testing::MustParse(y);
  ASSERT_EQ(flood.stages.size(), 20000u);
  int64_t a = daemon.SubmitRun(flood, testing::FastSubmit());
  int64_t b = daemon.SubmitRun(
      testing::MustParse("pipeline: one\nproject: ten-single\nstages:\n  s:\n    run: "
                         "[\"true\"]\n    instance: c6i.large\n"),
      testing::FastSubmit());
  const std::string worker = "00000000-0000-4000-8000-000000000001";
  auto claimed = daemon.ClaimReadyStages("cpu", 2, worker, "fairness", 60, 0);
  std::set<std::string> projects;
  for (const auto& c : claimed) projects.insert(c.project);
  EXPECT_EQ(projects, (std::set<std::string>{"ten-flood", "ten-single"}))
      << "the single stage waited behind the sweep";
  // Nothing else of ten-single is ready: the next claim is all the sweep's.
  claimed = daemon.ClaimReadyStages("cpu", 3, worker, "fairness", 60, 0);
  ASSERT_EQ(claimed.size(), 3u);
  for (const auto& c : claimed) EXPECT_EQ(c.run_id, a);
  daemon.CancelRun(a);
  daemon.CancelRun(b);
}

// A job looks for a way into the catalog: its environment, every process's, the credential
// files, the worker's logs, and psql as every role it can name, over the socket and TCP.
TEST_F(Tenants, AJobFindsNoWayIntoTheCatalog) {
  std::string dir = testing::JobVisibleDir("attack");
  schema::Catalog daemon(TestDatabase::url());
  std::string roles = "postgres trnflow " +
                      schema::testing::QueryValue(daemon, "SELECT trnflow.daemon_role()") + " " +
                      schema::testing::QueryValue(daemon, "SELECT trnflow.reader_role()") +
                      " trnflow_test_" + Db() + "_alice root nobody";
  std::ofstream(dir + "/attack.sh")
      << "blocked=0; leaks=0\n"
         "try() { if eval \"$1\" >/dev/null 2>&1; then echo \"LEAK: $2\"; leaks=$((leaks+1)); "
         "else echo \"BLOCKED: $2\"; blocked=$((blocked+1)); fi; }\n"
         "try \"env | grep -qiE 'postgres(ql)?://|PGPASSWORD|DATABASE_URL|password'\" env\n"
         "try \"cat /proc/[0-9]*/environ 2>/dev/null | tr '\\\\0' '\\\\n' | grep -qiE "
         "'postgres(ql)?://|PGPASSWORD'\" proc-environ\n"
         "try 'cat /etc/trnflow/owner.url' owner-url\n"
         "try 'cat /etc/trnflow/daemon.url' daemon-url\n"
         "try 'ls \"$WORKER_HOME/logs\"' worker-logs\n"
         "try 'ls \"$WORKER_HOME/artifacts\"' cache-store\n"
         "for r in $ROLES; do\n"
         "  try \"PGCONNECT_TIMEOUT=3 psql -w -h /var/run/postgresql -U $r -d $DB -c 'select 1'\" "
         "socket-$r\n"
         "  try \"PGCONNECT_TIMEOUT=3 psql -w -h 127.0.0.1 -U $r -d $DB -c 'select 1'\" tcp-$r\n"
         "done\n"
         "echo \"TOTAL blocked=$blocked leaks=$leaks\"\n";
  std::string y = "pipeline: attack\nproject: ten-a\nstages:\n  attack:\n    run: [\"bash\", \"" +
                  dir + "/attack.sh\"]\n    env: {ROLES: \"" + roles + "\", DB: \"" + Db() +
                  "\", WORKER_HOME: \"/tmp/trnflow-cli-home-" + std::to_string(getpid()) + "\"}\n";
  std::string file = dir + "/pipeline.yaml";
  std::ofstream(file) << y;
  CliResult r = RunTrnflow("run " + file + " --speed 1000000");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  CliResult logs = RunTrnflow("logs " + std::to_string(RunIdFrom(r.out)) + " attack");
  EXPECT_EQ(logs.out.find("LEAK:"), std::string::npos) << logs.out;
  int n_roles = 0;
  for (size_t at = 0; (at = roles.find(' ', at)) != std::string::npos; ++at) ++n_roles;
  ++n_roles;
  EXPECT_NE(logs.out.find("TOTAL blocked=" + std::to_string(6 + 2 * n_roles) + " leaks=0"),
            std::string::npos)
      << logs.out;
  fs::remove_all(dir);
}

// Secrets are named in the file and resolved on the worker host: the job has the value, the
// catalog and the log never do.
TEST_F(Tenants, SecretsReachTheJobAndNothingElse) {
  std::string dir = WriteTempFile("secrets.d", "");
  fs::remove(dir);
  fs::create_directories(dir + "/secrets");
  const std::string value = "tok-" + schema::RandomSecret();
  {
    std::ofstream f(dir + "/secrets/ten-a.env");
    f << "# project ten-a\nAPI_TOKEN=" << value << "\n";
  }
  fs::permissions(dir + "/secrets/ten-a.env", fs::perms::owner_read | fs::perms::owner_write);
  std::string y =
      "pipeline: secret\nproject: ten-a\nstages:\n  use:\n    run: \"echo token=$API_TOKEN; "
      "printf %s \\\"$API_TOKEN\\\" | sha256sum | grep -q " +
      Sha256Hex(value) + " && echo MATCH\"\n    shell: true\n    secrets: [API_TOKEN]\n";
  std::string file = WriteTempFile("secret.yaml", y);
  CliResult r =
      RunTrnflow("run " + file + " --speed 1000000", "TRNFLOW_SECRETS_DIR=" + dir + "/secrets");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  int64_t run = RunIdFrom(r.out);
  CliResult logs = RunTrnflow("logs " + std::to_string(run));
  EXPECT_NE(logs.out.find("token=***"), std::string::npos) << logs.out;
  EXPECT_NE(logs.out.find("MATCH"), std::string::npos) << logs.out;
  EXPECT_EQ(logs.out.find(value), std::string::npos) << "the secret is in the log";
  schema::Catalog owner(TestDatabase::owner_url());
  for (const std::string table : {"pipelines", "stages", "attempts", "events", "runs"})
    EXPECT_EQ(schema::testing::QueryValue(owner, "SELECT count(*) FROM trnflow." + table +
                                                     " t WHERE t::text LIKE '%" + value + "%'"),
              "0")
        << table;
  // Another project names the same secret: it is not its to have.
  std::string other =
      WriteTempFile("secret-b.yaml", std::regex_replace(y, std::regex("ten-a"), "ten-b"));
  CliResult b =
      RunTrnflow("run " + other + " --speed 1000000", "TRNFLOW_SECRETS_DIR=" + dir + "/secrets");
  EXPECT_EQ(b.exit_code, 1) << b.out << b.err;
  CliResult show = RunTrnflow("show " + std::to_string(RunIdFrom(b.out)) + " --format json");
  EXPECT_NE(show.out.find("secret API_TOKEN is not set for project ten-b"), std::string::npos)
      << show.out;
  fs::remove_all(dir);
}

// A runaway command in a run with a budget is stopped at the budget, whatever the speed:
// at most one billing minute over.
class Runaway : public ::testing::TestWithParam<double> {};

TEST_P(Runaway, StopsAtTheBudget) {
  double speed = GetParam();
  // trn1.32xlarge on-demand: ~$21.50 an hour; at speed 1 a small budget keeps the test short
  // (the first billing minute is the least an attempt can cost).
  std::string budget = speed < 10 ? "0.38" : "50";  // 0.38: a little over one minute
  std::string y = "pipeline: runaway\nproject: ten-runaway\nbudget_usd: " + budget +
                  "\nstages:\n  forever:\n    run: [\"sleep\", \"100000\"]\n"
                  "    instance: trn1.32xlarge\n";
  std::string file = WriteTempFile("runaway.yaml", y);
  char speed_text[32];
  std::snprintf(speed_text, sizeof speed_text, "%g", speed);
  CliResult r = RunTrnflow("run " + file + " --force --speed " + speed_text, "timeout 300");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  int64_t run = RunIdFrom(r.out);
  schema::Catalog daemon(TestDatabase::url());
  auto got = daemon.GetRun(run);
  ASSERT_TRUE(got);
  EXPECT_EQ(schema::ToSql(got->state), "cancelled");
  EXPECT_EQ(schema::ToSql(got->cancel_reason), "budget_exceeded");
  auto attempts = daemon.GetAttempts(run);
  ASSERT_EQ(attempts.size(), 1u);
  EXPECT_EQ(schema::ToSql(attempts[0].outcome), "budget_exceeded") << attempts[0].message;
  Money limit, price;
  ASSERT_TRUE(Money::Parse(budget, &limit));
  ASSERT_TRUE(
      Money::Parse(schema::testing::QueryValue(daemon,
                                               "SELECT price_usd_hour FROM trnflow.attempts WHERE "
                                               "run_id = " +
                                                   std::to_string(run)),
                   &price));
  Money minute = Charge(price, 1, 60);
  EXPECT_LE(got->cost, limit + minute) << "spent past the budget";
  EXPECT_GE(got->cost + minute, limit) << "stopped long before the budget was spent";
}

INSTANTIATE_TEST_SUITE_P(Speeds, Runaway, ::testing::Values(1.0, 7200.0, 100000.0));

// Four commands of one budgeted run at once, each with a timeout, each ignoring SIGTERM. They
// used to get 10 s of wall-clock grace after their timeout (20 simulated hours at speed 7200)
// and run to the whole cap each: $197.87 of a $50 budget. Each is now held to what it
// reserved, its timeout and a grace on the run's clock.
TEST(Runaway, ParallelCommandsThatIgnoreSigtermStayInsideTheBudget) {
  std::string y = "pipeline: stubborn\nproject: ten-stubborn\nbudget_usd: 50\nstages:\n";
  for (int i = 0; i < 4; ++i)
    y += "  s" + std::to_string(i) +
         ":\n    run: \"trap '' TERM; while true; do sleep 1; done\"\n    shell: true\n"
         "    timeout: 30m\n    instance: trn1.32xlarge\n";
  std::string file = WriteTempFile("stubborn.yaml", y);
  CliResult r = RunTrnflow("run " + file + " --force --speed 7200", "timeout 300");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  int64_t run = RunIdFrom(r.out);
  schema::Catalog daemon(TestDatabase::url());
  auto got = daemon.GetRun(run);
  ASSERT_TRUE(got);
  auto attempts = daemon.GetAttempts(run);
  ASSERT_EQ(attempts.size(), 4u);
  for (const auto& a : attempts) EXPECT_EQ(schema::ToSql(a.outcome), "timeout") << a.message;
  Money price;
  ASSERT_TRUE(Money::Parse(
      schema::testing::QueryValue(
          daemon,
          "SELECT max(price_usd_hour) FROM trnflow.attempts WHERE run_id = " + std::to_string(run)),
      &price));
  Money limit;
  ASSERT_TRUE(Money::Parse("50", &limit));
  Money minute = Charge(price, 1, 60);
  EXPECT_LE(got->cost, limit + minute + minute + minute + minute) << "spent past the budget";
  // Each ran its 30 minutes and at most its grace after them.
  for (const auto& a : attempts) {
    EXPECT_GE(a.cost, Charge(price, 1, 1800)) << a.message;
    EXPECT_LE(a.cost, Charge(price, 1, 1800 + 120 + 60)) << a.message;
  }
}

// Budgets reserve what a stage will cost, not everything left (issue 45, migration 0033).
// The most attempts of run `run` open at once, from the ledger's started_at and finished_at.
int MostAtOnce(schema::Catalog& c, int64_t run) {
  std::string r = std::to_string(run);
  return std::stoi(schema::testing::QueryValue(
      c, "SELECT coalesce(max((SELECT count(*) FROM trnflow.attempts b WHERE b.run_id = " + r +
             " AND b.started_at <= a.started_at AND b.finished_at > a.started_at)), 0) "
             "FROM trnflow.attempts a WHERE a.run_id = " +
             r));
}

int Count(schema::Catalog& c, const std::string& sql) {
  return std::stoi(schema::testing::QueryValue(c, sql));
}

std::string EightCommands(const std::string& project, const std::string& budget,
                          const std::string& command, const std::string& extra) {
  return "pipeline: eight\nproject: " + project + "\nbudget_usd: " + budget +
         "\nstages:\n  work:\n    matrix: {i: [1, 2, 3, 4, 5, 6, 7, 8]}\n    run: " + command +
         "\n    instance: trn1.32xlarge\n" + extra;
}

// Eight commands without a timeout under a budget that covers them all run together: each
// reserves a billing minute and tops up as it runs. They used to reserve everything left one
// at a time: 43 s instead of 5 and 111 `$0 cancelled` attempts.
TEST(Budgets, EightUntimedCommandsRunTogether) {
  std::string file =
      WriteTempFile("eight.yaml", EightCommands("ten-eight", "100", "[\"sleep\", \"3\"]", ""));
  CliResult r = RunTrnflow("run " + file + " --speed 1", "timeout 120");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // Under a budget, a command with neither timeout: nor estimate: is worth a warning.
  EXPECT_NE(r.err.find("neither timeout: nor estimate:"), std::string::npos) << r.err;
  int64_t run = RunIdFrom(r.out);
  schema::Catalog daemon(TestDatabase::url());
  std::string where = " FROM trnflow.attempts WHERE run_id = " + std::to_string(run);
  EXPECT_EQ(Count(daemon, "SELECT count(*)" + where), 8);
  EXPECT_EQ(Count(daemon, "SELECT count(*)" + where + " AND outcome <> 'succeeded'"), 0);
  EXPECT_EQ(MostAtOnce(daemon, run), 8) << "they did not run together";
  EXPECT_EQ(Count(daemon,
                  "SELECT count(*) FROM trnflow.events WHERE kind = 'budget' AND "
                  "message LIKE 'waiting for its budget%' AND run_id = " +
                      std::to_string(run)),
            0);
}

// A budget that covers three reservations runs three at a time: the others wait in the
// catalog, writing no ledger row (one `budget` event each), and start as reservations free.
TEST(Budgets, ABudgetForThreeReservationsRunsThreeAtATime) {
  // trn1.32xlarge at $21.50/h: an `estimate: 10m` reserves 12.5 minutes, $4.48; three fit in
  // $15, four do not. Each ran 2 s, billed a minute ($0.36), so all eight fit in the end.
  std::string file = WriteTempFile(
      "three.yaml", EightCommands("ten-three", "15", "[\"sleep\", \"2\"]", "    estimate: 10m\n"));
  CliResult r = RunTrnflow("run " + file + " --force --speed 1", "timeout 200");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.err.find("neither timeout: nor estimate:"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("retry_wait (waiting for its budget"), std::string::npos) << r.out;
  int64_t run = RunIdFrom(r.out);
  schema::Catalog daemon(TestDatabase::url());
  std::string where = " FROM trnflow.attempts WHERE run_id = " + std::to_string(run);
  EXPECT_EQ(Count(daemon, "SELECT count(*)" + where), 8) << "a wait wrote a ledger row";
  EXPECT_EQ(Count(daemon, "SELECT count(*)" + where + " AND outcome <> 'succeeded'"), 0);
  EXPECT_EQ(MostAtOnce(daemon, run), 3);
  int waits = Count(daemon,
                    "SELECT count(*) FROM trnflow.events WHERE kind = 'budget' AND message LIKE "
                    "'waiting for its budget%' AND run_id = " +
                        std::to_string(run));
  EXPECT_GE(waits, 5);  // the five that could not start at first, once per wait
  EXPECT_LE(waits, 8);
  EXPECT_EQ(Count(daemon, "SELECT count(*) FROM trnflow.budget_waits"), 0);
  EXPECT_EQ(schema::testing::QueryValue(daemon, testing::kQueueMismatchesSql), "0");
}

// Eight runaway commands under a budget that covers three reservations: three run, top up
// until nothing is left and are stopped there, exactly; the five that waited never ran and
// wrote nothing to the ledger.
TEST(Budgets, RunawayCommandsStopExactlyAtABudgetForThree) {
  std::string file = WriteTempFile(
      "runaway8.yaml",
      EightCommands("ten-runaway8", "15", "[\"sleep\", \"100000\"]", "    estimate: 10m\n"));
  CliResult r = RunTrnflow("run " + file + " --force --speed 7200", "timeout 200");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  int64_t run = RunIdFrom(r.out);
  schema::Catalog daemon(TestDatabase::url());
  auto got = daemon.GetRun(run);
  ASSERT_TRUE(got);
  EXPECT_EQ(schema::ToSql(got->state), "cancelled");
  EXPECT_EQ(schema::ToSql(got->cancel_reason), "budget_exceeded");
  auto attempts = daemon.GetAttempts(run);
  ASSERT_EQ(attempts.size(), 3u);
  for (const auto& a : attempts)
    EXPECT_EQ(schema::ToSql(a.outcome), "budget_exceeded") << a.message;
  std::string rs = std::to_string(run);
  EXPECT_EQ(Count(daemon, "SELECT count(*) FROM trnflow.stages WHERE run_id = " + rs +
                              " AND attempts = 0 AND state = 'cancelled'"),
            5);
  EXPECT_EQ(Count(daemon,
                  "SELECT count(*) FROM trnflow.events WHERE kind = 'budget' AND "
                  "message LIKE 'waiting for its budget%' AND run_id = " +
                      rs),
            5);
  Money limit, price;
  ASSERT_TRUE(Money::Parse("15", &limit));
  ASSERT_TRUE(
      Money::Parse(schema::testing::QueryValue(daemon,
                                               "SELECT max(price_usd_hour) FROM trnflow.attempts "
                                               "WHERE run_id = " +
                                                   rs),
                   &price));
  Money second = Charge(price, 1, 61) - Charge(price, 1, 60);  // the ledger bills whole seconds
  EXPECT_LE(got->cost, limit + second + second + second) << "spent past the budget";
  EXPECT_GE(got->cost + second, limit) << "stopped before the budget was spent";
  EXPECT_EQ(schema::testing::QueryValue(daemon, testing::kQueueMismatchesSql), "0");
}

// A stage waiting for its budget: `explain` says how much it waits for, and the ledger has no
// row for it. Under a project budget, `plan` warns about a command nothing prices.
TEST(Budgets, ExplainSaysHowMuchAWaitingStageWaitsFor) {
  std::string y =
      "pipeline: pair\nproject: ten-explain\nbudget_usd: 6\nstages:\n"
      "  a:\n    run: [\"sleep\", \"30\"]\n    estimate: 10m\n    instance: trn1.32xlarge\n"
      "  b:\n    run: [\"sleep\", \"30\"]\n    estimate: 10m\n    instance: trn1.32xlarge\n";
  std::string file = WriteTempFile("pair.yaml", y);
  testing::Daemon run_proc("budget-wait-run", {"run", file, "--force", "--speed", "1"});
  run_proc.Start();
  std::string waiting =
      "SELECT s.run_id || ' ' || s.name FROM trnflow.events e JOIN trnflow.stages s ON "
      "s.id = e.stage_id WHERE e.kind = 'budget' AND e.project = 'ten-explain' AND e.message "
      "LIKE 'waiting for its budget%' ORDER BY e.id LIMIT 1";
  ASSERT_TRUE(testing::WaitFor([&] { return !testing::Query(waiting).empty(); }, 60))
      << testing::ReadFile(run_proc.log_path());
  std::string run_and_stage = testing::Query(waiting);
  std::string run = run_and_stage.substr(0, run_and_stage.find(' '));
  CliResult why = RunTrnflow("explain " + run_and_stage);
  EXPECT_EQ(why.exit_code, 0) << why.out << why.err;
  // $4.48: 12.5 minutes (its estimate and a quarter) of trn1.32xlarge; the other holds as much.
  EXPECT_NE(why.out.find("it waits for its budget"), std::string::npos) << why.out;
  EXPECT_NE(why.out.find("reserves $4.48"), std::string::npos) << why.out;
  EXPECT_NE(why.out.find("held by 1 running attempt"), std::string::npos) << why.out;
  EXPECT_EQ(testing::Query("SELECT count(*) FROM trnflow.attempts a JOIN trnflow.stages s ON "
                           "s.id = a.stage_id WHERE a.run_id = " +
                           run + " AND s.state = 'retry_wait'"),
            "0");
  EXPECT_EQ(testing::Query("SELECT count(*) FROM trnflow.budget_waits WHERE run_id = " + run), "1");
  EXPECT_EQ(RunTrnflow("cancel " + run).exit_code, 0);
  ASSERT_TRUE(
      testing::WaitFor([&] { return testing::RunStateText(std::stoll(run)) == "cancelled"; }, 60));
  run_proc.Kill(SIGKILL);
  // The stage that waited never had an attempt.
  EXPECT_EQ(testing::Query("SELECT count(*) FROM trnflow.stages WHERE run_id = " + run +
                           " AND attempts = 0"),
            "1");

  // The project's budget is the catalog's: `plan` warns about a command it cannot price.
  ASSERT_EQ(RunTrnflow("budget set ten-explain 100").exit_code, 0);
  std::string plain = WriteTempFile(
      "planwarn.yaml", "pipeline: p\nproject: ten-explain\nstages:\n  s:\n    run: [\"true\"]\n");
  CliResult plan = RunTrnflow("plan " + plain);
  EXPECT_EQ(plan.exit_code, 0) << plan.out << plan.err;
  EXPECT_NE(plan.err.find("under project ten-explain's budget with neither timeout: nor "
                          "estimate:"),
            std::string::npos)
      << plan.err;
}

}  // namespace
}  // namespace trnflow

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new trnflow::testing::TestDatabase("trnflow_tenant_test"));
  return RUN_ALL_TESTS();
}
