// Issue 35: the samples a newcomer copies from docs/spend.md run, as they are written, against
// a real catalog holding the climate example's run: every fenced SQL block as the schema owner
// and as a member with their own login (row-level security on), and every `trnflow` line of
// its shell blocks. "This month by stage" answers by month and agrees with the ledger.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/run_cli.h"
#include "tests/test_db.h"

namespace trnflow {
namespace {

namespace fs = std::filesystem;
using testing::CliResult;
using testing::RunShell;
using testing::RunTrnflow;
using testing::TestDatabase;

::testing::Environment* const kDatabase =
    ::testing::AddGlobalTestEnvironment(new TestDatabase("docsamples"));

std::string Read(const fs::path& p) {
  std::ifstream in(p);
  EXPECT_TRUE(in) << "cannot read " << p;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Block {
  int line;  // of the opening fence
  std::string text;
};

// The fenced blocks of `markdown` whose info string is `lang`.
std::vector<Block> Fenced(const std::string& markdown, const std::string& lang) {
  std::vector<Block> blocks;
  std::istringstream in(markdown);
  std::string line;
  int n = 0;
  Block* open = nullptr;
  bool other = false;
  while (std::getline(in, line)) {
    ++n;
    if (line.rfind("```", 0) == 0) {
      if (open || other) {
        open = nullptr;
        other = false;
      } else if (line == "```" + lang) {
        blocks.push_back({n, ""});
        open = &blocks.back();
      } else {
        other = true;
      }
      continue;
    }
    if (open) open->text += line + "\n";
  }
  return blocks;
}

std::string Shell(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs `sql` with psql as the login of `url`; stops at the first error.
CliResult Psql(const std::string& url, const std::string& sql) {
  std::string file = testing::WriteTempFile("sample.sql", sql);
  return RunShell("psql " + Shell(url) + " -X -q -A -t -v ON_ERROR_STOP=1 -f " + Shell(file) +
                  " 2>&1");
}

std::string One(const std::string& url, const std::string& sql) {
  CliResult r = Psql(url, sql);
  EXPECT_EQ(r.exit_code, 0) << sql << "\n" << r.out;
  std::string out = r.out;
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

const std::string kThisMonth = "date_trunc('month', now() AT TIME ZONE 'UTC')::date";

class SpendDoc : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    CliResult run = RunTrnflow("run examples/climate/pipeline.yaml --speed 1000000");
    ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
    alice_role_ = "trnflow_test_" + TestDatabase::database_name() + "_alice";
    bob_role_ = "trnflow_test_" + TestDatabase::database_name() + "_bob";
    alice_url_ = TestDatabase::NewLogin("alice");
    TestDatabase::NewLogin("bob");
  }
  static std::string alice_role_, bob_role_, alice_url_;
};
std::string SpendDoc::alice_role_, SpendDoc::bob_role_, SpendDoc::alice_url_;

TEST_F(SpendDoc, TheAccessBlockRuns) {
  // Its `trnflow` lines, with the doc's people replaced by this catalog's test logins (the
  // CREATE ROLE and GRANT lines are PostgreSQL's own, run by an administrator).
  auto blocks = Fenced(Read(fs::path(TRNFLOW_SOURCE_DIR) / "docs/spend.md"), "sh");
  ASSERT_FALSE(blocks.empty()) << "docs/spend.md's Access section has a ```sh block";
  int ran = 0;
  for (const auto& b : blocks) {
    std::istringstream in(b.text);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("trnflow ", 0) != 0) continue;
      std::string args = line.substr(8, line.find('#') - 8);
      args = std::regex_replace(args, std::regex(R"(\balice\b)"), alice_role_);
      args = std::regex_replace(args, std::regex(R"(\bbob\b)"), bob_role_);
      CliResult r = RunTrnflow(args);
      EXPECT_EQ(r.exit_code, 0) << "docs/spend.md:" << b.line << ": " << line << "\n"
                                << r.out << r.err;
      ++ran;
    }
  }
  EXPECT_GE(ran, 2);
  // And what it says then holds: alice sees climate-lab; bob reads and cannot submit.
  EXPECT_NE(One(alice_url_, "SELECT count(*) FROM trnflow.spend_by_stage_daily"), "0");
}

TEST_F(SpendDoc, EverySqlSampleRunsAsTheOwnerAndAsAMember) {
  RunTrnflow("project add climate-lab --member " + alice_role_);
  auto blocks = Fenced(Read(fs::path(TRNFLOW_SOURCE_DIR) / "docs/spend.md"), "sql");
  ASSERT_FALSE(blocks.empty());
  size_t statements = 0;
  for (const auto& b : blocks) {
    statements += std::count(b.text.begin(), b.text.end(), ';');
    for (const std::string& url : {TestDatabase::owner_url(), alice_url_}) {
      CliResult r = Psql(url, b.text);
      EXPECT_EQ(r.exit_code, 0) << "docs/spend.md:" << b.line << " as "
                                << (url == alice_url_ ? "a member" : "the owner") << "\n"
                                << r.out;
    }
  }
  EXPECT_GE(statements, 8u);
}

TEST_F(SpendDoc, ThisMonthByStageIsTheLedgerOfThisMonth) {
  // The run just happened, so this month's rows are all of it, stage by stage, to the
  // micro-dollar; and the daily interruption rows add up to interruption_waste.
  std::string ledger = One(TestDatabase::owner_url(),
                           "SELECT sum(cost_usd) FROM trnflow.attempts a JOIN trnflow.runs r ON "
                           "r.id = a.run_id WHERE r.project = 'climate-lab' AND "
                           "date_trunc('month', a.started_at AT TIME ZONE 'UTC')::date = " +
                               kThisMonth);
  ASSERT_NE(ledger, "");
  EXPECT_EQ(One(TestDatabase::owner_url(),
                "SELECT sum(cost_usd) FROM trnflow.spend_by_stage_daily WHERE project = "
                "'climate-lab' AND month = " + kThisMonth),
            ledger);
  EXPECT_EQ(One(TestDatabase::owner_url(),
                "SELECT count(*) FROM (SELECT stage, sum(cost_usd) c FROM "
                "trnflow.spend_by_stage_daily GROUP BY 1) d JOIN trnflow.spend_by_stage s USING "
                "(stage) WHERE d.c <> s.cost_usd"),
            "0");
  // The README's example is interrupted once on spot: the day's waste is there and agrees.
  EXPECT_NE(One(TestDatabase::owner_url(),
                "SELECT count(*) FROM trnflow.interruption_waste_daily WHERE project = "
                "'climate-lab'"),
            "0");
  EXPECT_EQ(One(TestDatabase::owner_url(),
                "SELECT sum(wasted_usd) FROM trnflow.interruption_waste_daily"),
            One(TestDatabase::owner_url(), "SELECT sum(wasted_usd) FROM trnflow.interruption_waste"));
}

TEST_F(SpendDoc, TheSiteReaderReadsTheDailyViews) {
  std::string rita = TestDatabase::NewLogin("rita");
  One(TestDatabase::owner_url(), "GRANT " + TestDatabase::database_name() + "_reader TO trnflow_test_" +
                                     TestDatabase::database_name() + "_rita");
  EXPECT_NE(One(rita, "SELECT count(*) FROM trnflow.spend_by_stage_daily"), "0");
  EXPECT_EQ(One(rita, "SELECT sum(wasted_usd) FROM trnflow.interruption_waste_daily"),
            One(TestDatabase::owner_url(), "SELECT sum(wasted_usd) FROM trnflow.interruption_waste"));
}

// The README's "Inspect it afterwards" block and docs/operations.md's logs samples, as written:
// run 1 is this catalog's climate run, as it is the quick start's.
TEST_F(SpendDoc, TheInspectAndLogsSamplesRunAsWritten) {
  std::vector<std::string> lines;
  std::string readme = Read(fs::path(TRNFLOW_SOURCE_DIR) / "README.md");
  size_t at = readme.find("Inspect it afterwards:");
  ASSERT_NE(at, std::string::npos);
  for (const auto& b : Fenced(readme.substr(at), "")) {
    std::istringstream in(b.text);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    break;  // the first block after the words
  }
  std::string ops = Read(fs::path(TRNFLOW_SOURCE_DIR) / "docs/operations.md");
  size_t logs = ops.find("\n## Logs\n");
  ASSERT_NE(logs, std::string::npos);
  for (const auto& b : Fenced(ops.substr(logs, ops.find("\n## ", logs + 5) - logs), "")) {
    std::istringstream in(b.text);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  }
  int ran = 0;
  bool psql = false;
  for (const auto& l : lines) {
    std::string cmd = l.substr(0, l.find('#'));
    while (!cmd.empty() && cmd.back() == ' ') cmd.pop_back();
    for (const std::string prefix : {"build/trnflow ", "trnflow "}) {
      if (cmd.rfind(prefix, 0) != 0) continue;
      CliResult r = RunTrnflow(cmd.substr(prefix.size()));
      EXPECT_EQ(r.exit_code, 0) << l << "\n" << r.out << r.err;
      EXPECT_FALSE(r.out.empty()) << l;
      if (cmd.find(" logs 1 evaluate") != std::string::npos && cmd.find("json") == std::string::npos)
        EXPECT_NE(r.out.find("==> evaluate attempt 1"), std::string::npos) << r.out;
      ++ran;
      break;
    }
    // `psql trnflow -c "..."`: with a member's own login (the test's catalog stands for trnflow).
    if (cmd.rfind("psql trnflow -c \"", 0) == 0) {
      std::string sql = cmd.substr(17, cmd.rfind('"') - 17);
      RunTrnflow("project add climate-lab --member " + alice_role_);
      std::string out = One(alice_url_, sql);
      EXPECT_NE(out.find("train|1|spot_interruption|"), std::string::npos) << out;
      psql = true;
    }
  }
  EXPECT_GE(ran, 7);
  EXPECT_TRUE(psql) << "the README's psql line";
}

}  // namespace
}  // namespace trnflow
