// The ledger in monthly partitions (migration 0031) against a real PostgreSQL: rows land in
// their UTC month's partition and the rollups still see every one; a second close of an
// attempt is still refused through the partitioned table; attempts_partitions_ahead checks its
// argument and only the daemons may call it; `trnflow db archive` dumps, checks and drops a past
// month (and the dump restores it), refuses what it must, and the spend reports and /metrics
// read the same after a month is archived.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "common/error.h"
#include "pipelines/pipeline.h"
#include "scheduler/scheduler.h"
#include "schema/catalog.h"
#include "schema/catalog_testing.h"
#include "tests/run_cli.h"
#include "tests/test_db.h"
#include "tests/test_engine.h"
#include "workers/worker.h"

namespace trnflow {
namespace {

using testing::CliResult;
using testing::MustParse;
using testing::RunToEnd;
using testing::RunTrnflow;
using testing::Sh;
using testing::TestDatabase;
using testing::WaitFor;

const char* const kSmall = testing::kSmallPipeline;

// The first day of the UTC month `back` months before this one, as PostgreSQL reads it.
std::string MonthStart(schema::Catalog& owner, int back) {
  return schema::testing::QueryValue(owner, 
      "SELECT to_char(date_trunc('month', now() AT TIME ZONE 'UTC') - "
      "interval '" +
      std::to_string(back) + " months', 'YYYY-MM-DD')");
}

// Copies of run's closed attempts into the month starting on `first_day` (later attempt
// numbers, so they are other attempts of the same stages), written as the owner through the
// partitioned table with its triggers on, so the rollups and counters count them. Makes the
// month's partition first.
void CopyAttemptsInto(schema::Catalog& owner, int64_t run, const std::string& first_day,
                      int attempt_offset) {
  schema::testing::QueryValue(owner, "SELECT trnflow.attempts_make_partition(DATE '" + first_day + "')");
  std::string list = schema::testing::QueryValue(owner, 
      "SELECT string_agg(column_name, ',' ORDER BY ordinal_position) FROM "
      "information_schema.columns WHERE table_schema = 'trnflow' AND table_name = 'attempts' "
      "AND column_name NOT IN ('id', 'attempt', 'started_at', 'finished_at')");
  std::string from = "(TIMESTAMPTZ '" + first_day + " 00:00:00+00' + interval '3 days')";
  schema::testing::QueryValue(owner, "INSERT INTO trnflow.attempts (attempt, started_at, finished_at, " + list +
                   ") SELECT attempt + " + std::to_string(attempt_offset) + ", " + from + ", " +
                   from + " + (finished_at - started_at), " + list +
                   " FROM trnflow.attempts WHERE run_id = " + std::to_string(run) +
                   " AND attempt < 100 RETURNING 1");
}

// Every /metrics sample, by name and labels.
std::map<std::string, double> MetricsOf(schema::Catalog& c) {
  std::map<std::string, double> m;
  for (const auto& row : c.Metrics()) m[row.name + row.labels_json] = row.value;
  return m;
}

// The spend reports that read rollups (all history, by each field), as text.
std::string Reports(schema::Catalog& c) {
  std::string out;
  for (const std::vector<std::string>& by : std::vector<std::vector<std::string>>{
           {}, {"project"}, {"month"}, {"stage"}, {"day"}, {"kind", "instance", "market"}}) {
    for (const auto& r : c.Spend({"", "", "", "", by})) {
      for (const auto& k : r.keys) out += k + "|";
      out += std::to_string(r.attempts) + " " + r.cost.ToDecimal() + " " + r.wasted.ToDecimal() +
             " " + r.saved.ToDecimal() + "\n";
    }
  }
  for (const auto& s : c.Savings({"", "", "", "", {}}))
    out += s.project + " " + s.spot_saved.ToDecimal() + " " + s.cache_saved.ToDecimal() + " " +
           s.gpu_saved.ToDecimal() + " " + std::to_string(s.cache_hits) + "\n";
  return out;
}

std::string TempPath(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("trnflow_partitions_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

}  // namespace

TEST(Partitions, RowsLandInTheirMonthsPartitionAndTheRollupsSeeThem) {
  schema::Catalog c(TestDatabase::url());
  schema::Catalog owner(TestDatabase::owner_url());
  EXPECT_EQ(schema::testing::QueryValue(owner, "SELECT relkind::text FROM pg_class WHERE oid = "
                             "'trnflow.attempts'::regclass"),
            "p");
  int64_t run = RunToEnd(c, MustParse(kSmall, "land"));
  ASSERT_EQ(schema::ToSql(c.GetRun(run)->state), "succeeded");
  std::string r = std::to_string(run);
  CopyAttemptsInto(owner, run, MonthStart(owner, 5), 100);
  // Every row is in the partition named after its started_at's UTC month; none in the default.
  EXPECT_EQ(schema::testing::QueryValue(owner, "SELECT count(*) FROM trnflow.attempts a WHERE a.run_id = " + r +
                             " AND (SELECT c.relname FROM pg_class c WHERE c.oid = a.tableoid) <> "
                             "'attempts_' || to_char(a.started_at AT TIME ZONE 'UTC', 'YYYY_MM')"),
            "0");
  EXPECT_EQ(
      schema::testing::QueryValue(owner, "SELECT count(DISTINCT tableoid) FROM trnflow.attempts WHERE run_id = " + r),
      "2");
  EXPECT_EQ(schema::testing::QueryValue(owner, "SELECT count(*) FROM trnflow.attempts_default WHERE run_id = " + r),
            "0");
  // The statement triggers on the partitioned table counted both months' rows: the monthly
  // rollup and the ledger agree, as do the /metrics counters.
  EXPECT_EQ(
      schema::testing::QueryValue(owner, "SELECT sum(cost_usd) FROM trnflow.spend_month WHERE project = 'land'"),
      schema::testing::QueryValue(owner, "SELECT sum(cost_usd) FROM trnflow.attempts WHERE run_id = " + r));
  EXPECT_EQ(schema::testing::QueryValue(owner, "SELECT count(DISTINCT month) FROM trnflow.spend_month WHERE "
                             "project = 'land'"),
            "2");
  // Members read through the partitioned table as before (the view and row-level security).
  EXPECT_EQ(schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.attempt_ledger WHERE run_id = " + r),
            schema::testing::QueryValue(owner, "SELECT count(*) FROM trnflow.attempts WHERE run_id = " + r));
  // A partition is append-only by itself too.
  std::string part = schema::testing::QueryValue(owner, 
      "SELECT 'trnflow.attempts_' || to_char(now() AT TIME ZONE "
      "'UTC', 'YYYY_MM')");
  EXPECT_ANY_THROW(schema::testing::QueryValue(owner, "UPDATE " + part + " SET cost_usd = 0 RETURNING 1"));
  EXPECT_ANY_THROW(schema::testing::QueryValue(owner, "DELETE FROM " + part + " RETURNING 1"));
  EXPECT_ANY_THROW(schema::testing::QueryValue(owner, "UPDATE trnflow.attempts SET cost_usd = 0 WHERE run_id = " + r +
                                    " RETURNING 1"));
}

// The close writes the ledger row with the id and started_at the claim put on the stage row,
// so a second close of the same attempt, even past the stage row's fence, hits the keys of the
// same partition.
TEST(Partitions, ADuplicateCloseIsRefusedThroughThePartitionedTable) {
  schema::Catalog c(TestDatabase::url());
  schema::Catalog owner(TestDatabase::owner_url());
  auto p = MustParse(
      "pipeline: dup\nproject: lab\nstages:\n"
      "  a: {kind: compile, target: inf2, instance: trn1.2xlarge, model: bert-large, "
      "cache: false}\n",
      "dup");
  int64_t run = c.SubmitRun(p, testing::FastSubmit(1e6));
  const std::string me = "00000000-0000-4000-8000-000000000036";
  auto claimed = c.ClaimReadyStages("trn1", 4, me, "test:36", 30, run);
  ASSERT_EQ(claimed.size(), 1u);
  schema::AttemptResult res;
  res.stage_id = claimed[0].stage_id;
  res.attempt = claimed[0].attempt;
  res.lease_owner = me;
  res.outcome = Outcome::kSucceeded;
  res.next_state = StageState::kSucceeded;
  res.cost = Money::FromMicros(2'000'000);
  ASSERT_EQ(schema::testing::CompleteAttempts(c, {res}).size(), 1u);
  EXPECT_TRUE(schema::testing::CompleteAttempts(c, {res}).empty());  // the fence: the stage is no longer running
  std::string s = std::to_string(res.stage_id);
  auto ledger_rows = [&] {
    return schema::testing::QueryValue(owner, "SELECT count(*) FROM trnflow.attempts WHERE stage_id = " + s);
  };
  ASSERT_EQ(ledger_rows(), "1");
  // Past the fence: the stage row put back as if the lease were still held (a bug, or a
  // lost update), then the same close again. The ledger's keys refuse the second row.
  schema::testing::QueryValue(owner, "UPDATE trnflow.stages SET state = 'running', lease_owner = '" + me +
                   "', lease_expires_at = now() + interval '1 minute', finished_at = NULL "
                   "WHERE id = " +
                   s + " RETURNING 1");
  EXPECT_ANY_THROW(schema::testing::CompleteAttempts(c, {res}));
  EXPECT_EQ(ledger_rows(), "1");
  // The same row written directly, by the daemons' login, in either key.
  std::string cols =
      "stage_id, run_id, attempt, worker_id, worker_name, instance_type, instance_count, market, "
      "price_usd_hour, started_at, finished_at, outcome, cost_usd";
  EXPECT_ANY_THROW(schema::testing::QueryValue(c, "INSERT INTO trnflow.attempts (id, " + cols + ") SELECT id, " +
                                cols + " FROM trnflow.attempts WHERE stage_id = " + s +
                                " RETURNING 1"));
  EXPECT_ANY_THROW(schema::testing::QueryValue(c, "INSERT INTO trnflow.attempts (" + cols + ") SELECT " + cols +
                                " FROM trnflow.attempts WHERE stage_id = " + s + " RETURNING 1"));
  EXPECT_EQ(ledger_rows(), "1");
  EXPECT_EQ(schema::testing::QueryValue(owner, "SELECT sum(cost_usd) FROM trnflow.spend_month WHERE project = 'dup'"),
            "2.000000");
  schema::testing::QueryValue(owner, 
      "UPDATE trnflow.stages SET state = 'succeeded', lease_owner = NULL, "
      "lease_expires_at = NULL, finished_at = now() WHERE id = " +
      s + " RETURNING 1");
}

TEST(Partitions, PartitionsAheadChecksItsArgumentAndOnlyTheDaemonsMayCallIt) {
  schema::Catalog c(TestDatabase::url());
  schema::Catalog owner(TestDatabase::owner_url());
  for (int bad : {-1, 25, 1000}) EXPECT_ANY_THROW(c.MakeAttemptsPartitionsAhead(bad)) << bad;
  try {
    schema::testing::QueryValue(c, "SELECT trnflow.attempts_partitions_ahead(NULL)");
    ADD_FAILURE() << "NULL accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("expected 0 to 24 months"), std::string::npos) << e.what();
  }
  EXPECT_GE(c.MakeAttemptsPartitionsAhead(3), 0);
  EXPECT_EQ(c.MakeAttemptsPartitionsAhead(3), 0);  // all there now
  EXPECT_EQ(c.MakeAttemptsPartitionsAhead(6), 3);
  std::string far = schema::testing::QueryValue(owner, 
      "SELECT 'trnflow.attempts_' || to_char(now() AT TIME ZONE "
      "'UTC' + interval '6 months', 'YYYY_MM')");
  EXPECT_EQ(schema::testing::QueryValue(owner, "SELECT to_regclass('" + far + "') IS NOT NULL"), "t");
  EXPECT_EQ(schema::testing::QueryValue(owner, "SELECT count(*) FROM pg_trigger WHERE tgrelid = '" + far +
                             "'::regclass AND tgname = 'attempts_closed_once'"),
            "1");

  // A member and the reader may call neither function; nobody but the owner reads a partition.
  std::string member = TestDatabase::NewLogin("ahead_member");
  owner.AddProject("ahead", {"trnflow_test_" + TestDatabase::database_name() + "_ahead_member"});
  std::string reader = TestDatabase::NewLogin("ahead_reader");
  schema::testing::QueryValue(owner, "GRANT " + TestDatabase::database_name() + "_reader TO trnflow_test_" +
                   TestDatabase::database_name() + "_ahead_reader; SELECT 1");
  for (const auto& url : {member, reader}) {
    schema::Catalog who(url);
    for (const char* sql : {"SELECT trnflow.attempts_partitions_ahead(1)",
                            "SELECT trnflow.attempts_make_partition(DATE '2001-01-01')",
                            "SELECT count(*) FROM trnflow.attempts_default"}) {
      try {
        schema::testing::QueryValue(who, sql);
        ADD_FAILURE() << url << ": " << sql << " was allowed";
      } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("permission denied"), std::string::npos)
            << sql << ": " << e.what();
      }
    }
  }
  EXPECT_EQ(schema::testing::QueryValue(owner, "SELECT count(*) FROM pg_proc p WHERE p.pronamespace = "
                             "'trnflow'::regnamespace AND p.proname IN "
                             "('attempts_partitions_ahead', 'attempts_make_partition') AND "
                             "has_function_privilege('public', p.oid, 'EXECUTE')"),
            "0");
}

TEST(Partitions, ArchiveDumpsChecksAndDropsAPastMonthAndTheReportsStayTheSame) {
  schema::Catalog c(TestDatabase::url());
  schema::Catalog owner(TestDatabase::owner_url());
  int64_t run = RunToEnd(c, MustParse(kSmall, "archive"));
  ASSERT_EQ(schema::ToSql(c.GetRun(run)->state), "succeeded");
  std::string first_day = MonthStart(owner, 2);  // YYYY-MM-01
  std::string month = first_day.substr(0, 7);
  std::string part = "trnflow.attempts_" + month.substr(0, 4) + "_" + month.substr(5, 2);
  CopyAttemptsInto(owner, run, first_day, 200);
  std::string in_month = schema::testing::QueryValue(owner, "SELECT count(*) FROM " + part);
  ASSERT_NE(in_month, "0");
  std::string total = schema::testing::QueryValue(owner, "SELECT count(*) FROM trnflow.attempts");
  auto metrics = MetricsOf(owner);
  std::string reports = Reports(owner);
  ASSERT_NE(reports.find(month), std::string::npos) << reports;

  // Refused, exit 2, nothing written: malformed months, the current month, one to come, one
  // without a partition.
  std::string file = TempPath("archive.dump");
  std::string this_month = schema::testing::QueryValue(owner, "SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM')");
  std::string next_month =
      schema::testing::QueryValue(owner, "SELECT to_char(now() AT TIME ZONE 'UTC' + interval '1 month', 'YYYY-MM')");
  for (const auto& [m, says] : std::vector<std::pair<std::string, std::string>>{
           {"2025-13", "expected a UTC month as YYYY-MM"},
           {"2025/11", "expected a UTC month as YYYY-MM"},
           {"25-11", "expected a UTC month as YYYY-MM"},
           {this_month, "the current UTC month"},
           {next_month, "a month to come"},
           {"2001-01", "no partition trnflow.attempts_2001_01"}}) {
    CliResult r = RunTrnflow("db archive --month " + m + " --file " + file + " --yes");
    EXPECT_EQ(r.exit_code, 2) << m << ": " << r.out << r.err;
    EXPECT_NE(r.err.find(says), std::string::npos) << m << ": " << r.err;
    EXPECT_FALSE(std::filesystem::exists(file)) << m;
  }

  // --dry-run says what it would do and does nothing.
  CliResult dry = RunTrnflow("db archive --month " + month + " --file " + file + " --dry-run");
  EXPECT_EQ(dry.exit_code, 0) << dry.out << dry.err;
  EXPECT_NE(dry.out.find("would dump " + in_month + " attempts of " + month), std::string::npos)
      << dry.out;
  EXPECT_FALSE(std::filesystem::exists(file));
  EXPECT_EQ(schema::testing::QueryValue(owner, "SELECT count(*) FROM " + part), in_month);

  // --keep: the dump only.
  std::string kept = TempPath("kept.dump");
  CliResult keep = RunTrnflow("db archive --month " + month + " --file " + kept + " --keep");
  EXPECT_EQ(keep.exit_code, 0) << keep.out << keep.err;
  EXPECT_TRUE(std::filesystem::exists(kept));
  EXPECT_EQ(schema::testing::QueryValue(owner, "SELECT count(*) FROM " + part), in_month);
  // An archive is never overwritten.
  CliResult again = RunTrnflow("db archive --month " + month + " --file " + kept + " --yes");
  EXPECT_EQ(again.exit_code, 2) << again.out << again.err;
  EXPECT_NE(again.err.find("the file exists"), std::string::npos) << again.err;

  // The archive: dumped, listed, dropped.
  CliResult r = RunTrnflow("db archive --month " + month + " --file " + file + " --yes");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("detached and dropped " + part), std::string::npos) << r.out;
  ASSERT_TRUE(std::filesystem::exists(file));
  std::string list = Sh("pg_restore --list " + file).out;
  EXPECT_NE(list.find("TABLE DATA trnflow " + part.substr(8) + " "), std::string::npos) << list;
  EXPECT_EQ(schema::testing::QueryValue(owner, "SELECT to_regclass('" + part + "') IS NULL"), "t");
  EXPECT_EQ(std::stoll(schema::testing::QueryValue(owner, "SELECT count(*) FROM trnflow.attempts")),
            std::stoll(total) - std::stoll(in_month));
  // The rollups and counters keep the month.
  EXPECT_EQ(Reports(owner), reports);
  EXPECT_EQ(MetricsOf(owner), metrics);
  CliResult gone = RunTrnflow("db archive --month " + month + " --file " + TempPath("x.dump"));
  EXPECT_EQ(gone.exit_code, 2);
  EXPECT_NE(gone.err.find("no partition"), std::string::npos) << gone.err;

  // Restored as docs/operations.md says: the table without the dump's ATTACH entries, then
  // attached; the partition comes back under the ledger, rows and all, without counting them
  // twice.
  std::string url = TestDatabase::owner_url();
  CliResult restore =
      Sh("pg_restore --list " + file + " | grep -v ' ATTACH ' > " + file +
         ".list && pg_restore --no-owner --exit-on-error --use-list=" + file + ".list --dbname='" +
         url + "' " + file + " 2>&1 && psql -X -q '" + url +
         "' -c \"ALTER TABLE trnflow.attempts ATTACH PARTITION " + part + " FOR VALUES FROM ('" +
         first_day + " 00:00:00+00') TO ('" +
         schema::testing::QueryValue(owner, "SELECT (DATE '" + first_day + "' + interval '1 month')::date") +
         " 00:00:00+00')\" 2>&1");
  EXPECT_EQ(restore.exit_code, 0) << restore.out;
  EXPECT_EQ(schema::testing::QueryValue(owner, "SELECT count(*) FROM trnflow.attempts"), total);
  EXPECT_EQ(schema::testing::QueryValue(owner, "SELECT count(*) FROM trnflow.attempts WHERE tableoid = '" + part +
                             "'::regclass"),
            in_month);
  EXPECT_EQ(Reports(owner), reports);
  EXPECT_ANY_THROW(schema::testing::QueryValue(owner, "DELETE FROM " + part + " RETURNING 1"));  // its trigger too
  std::filesystem::remove_all(std::filesystem::path(file).parent_path());
}

TEST(Partitions, ArchiveRefusesAMonthWithAnOpenAttempt) {
  schema::Catalog c(TestDatabase::url());
  schema::Catalog owner(TestDatabase::owner_url());
  std::string first_day = MonthStart(owner, 3);
  std::string month = first_day.substr(0, 7);
  schema::testing::QueryValue(owner, "SELECT trnflow.attempts_make_partition(DATE '" + first_day + "')");
  auto p = MustParse(
      "pipeline: open\nproject: lab\nstages:\n"
      "  a: {kind: compile, target: inf2, instance: trn1.2xlarge, model: bert-large, "
      "cache: false}\n",
      "open");
  int64_t run = c.SubmitRun(p, testing::FastSubmit(1e6));
  const std::string me = "00000000-0000-4000-8000-000000000037";
  auto claimed = c.ClaimReadyStages("trn1", 4, me, "test:37", 300, run);
  ASSERT_EQ(claimed.size(), 1u);
  // An attempt that started in that month and is still running (a long one).
  schema::testing::QueryValue(owner, "UPDATE trnflow.stages SET attempt_started_at = TIMESTAMPTZ '" + first_day +
                   " 12:00:00+00' WHERE id = " + std::to_string(claimed[0].stage_id) +
                   " RETURNING 1");
  std::string file = TempPath("open.dump");
  CliResult r = RunTrnflow("db archive --month " + month + " --file " + file + " --yes");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("1 attempts that started then are still open"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(file));
  std::string part = "trnflow.attempts_" + month.substr(0, 4) + "_" + month.substr(5, 2);
  EXPECT_EQ(schema::testing::QueryValue(owner, "SELECT to_regclass('" + part + "') IS NOT NULL"), "t");
  // Its close lands in that month's partition, which is still there.
  schema::AttemptResult res;
  res.stage_id = claimed[0].stage_id;
  res.attempt = claimed[0].attempt;
  res.lease_owner = me;
  res.cost = Money::FromMicros(1'000'000);
  ASSERT_EQ(schema::testing::CompleteAttempts(c, {res}).size(), 1u);
  EXPECT_EQ(schema::testing::QueryValue(owner, "SELECT 'trnflow.' || c.relname FROM pg_class c WHERE c.oid = (SELECT "
                             "a.tableoid FROM trnflow.attempts a WHERE a.stage_id = " +
                             std::to_string(res.stage_id) + ")"),
            part);
}

}  // namespace trnflow

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(
      new trnflow::testing::TestDatabase("trnflow_partitions_test"));
  return RUN_ALL_TESTS();
}
