// Issue 35, "members cannot read their own logs": a member with their own PostgreSQL login, as
// another OS user than the workers', reads their project's logs with `trnflow logs` (secrets
// masked as on the dashboard), follows a running attempt with -f, and is told what to do when
// no dashboard answers. The ticket the catalog gives them is one-use, short-lived, their
// project's only, and checked argument by argument (migration 0028).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "schema/catalog.h"
#include "tests/daemon.h"
#include "tests/run_cli.h"
#include "tests/test_db.h"

namespace trnflow {
namespace {

namespace fs = std::filesystem;
using testing::CliResult;
using testing::Daemon;
using testing::ReadFile;
using testing::RunShell;
using testing::RunTrnflow;
using testing::TestDatabase;
using testing::WaitFor;
using testing::WriteTempFile;

::testing::Environment* const kDatabase =
    ::testing::AddGlobalTestEnvironment(new TestDatabase("memberlogs"));

std::string Role(const std::string& who) {
  return "trnflow_test_" + TestDatabase::database_name() + "_" + who;
}

std::string Quoted(const std::string& s) { return "'" + s + "'"; }

// `trnflow ARGS` as the OS user nobody (not the workers' user: TRNFLOW_HOME is not theirs to
// read) with PostgreSQL login `url`, the dashboard at `serve_url`.
CliResult AsMember(const std::string& url, const std::string& serve_url, const std::string& args) {
  return RunShell("cd '" TRNFLOW_SOURCE_DIR "' && timeout 120 runuser -u nobody -- env TRNFLOW_HOME=/tmp "
                  "TRNFLOW_CONFIG_DIR=/nonexistent TRNFLOW_DATABASE_URL=" + Quoted(url) +
                  " TRNFLOW_SERVE_URL=" + Quoted(serve_url) + " '" TRNFLOW_BINARY "' " + args +
                  " 2>&1");
}

// One value from `sql` run with login `url` (psql), or the error text; `*ok` says which.
std::string Psql(const std::string& url, const std::string& sql, bool* ok = nullptr) {
  CliResult r = RunShell("psql -X -q -A -t -v ON_ERROR_STOP=1 " + Quoted(url) + " -c \"" + sql +
                         "\" 2>&1");
  if (ok) *ok = r.exit_code == 0;
  std::string out = r.out;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// The workers' TRNFLOW_HOME/logs as on a real host: 0700, root's. Put back at the end.
struct RootOnlyLogs {
  std::string dir = testing::CliHome() + "/logs";
  RootOnlyLogs() { fs::permissions(dir, fs::perms::owner_all); }
  ~RootOnlyLogs() {
    fs::permissions(dir, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                             fs::perms::others_read | fs::perms::others_exec);
  }
};

class MemberLogs : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // A run: stage that prints a secret, run by the daemons' login (as `trnflow run` does).
    std::string dir = testing::ProcessDir("/tmp/trnflow-memberlogs-secrets");
    fs::create_directories(dir);
    {
      std::ofstream f(dir + "/mlog-lab.env");
      f << "API_TOKEN=" << kSecret << "\n";
    }
    fs::permissions(dir + "/mlog-lab.env", fs::perms::owner_read | fs::perms::owner_write);
    std::string file = WriteTempFile(
        "mlog.yaml",
        "pipeline: mlog\nproject: mlog-lab\nstages:\n  hello:\n    run: \"echo hello; echo "
        "token=$API_TOKEN\"\n    shell: true\n    secrets: [API_TOKEN]\n");
    CliResult ran = RunTrnflow("run " + file + " --format json", "TRNFLOW_SECRETS_DIR=" + dir);
    ASSERT_EQ(ran.exit_code, 0) << ran.out << ran.err;
    run_ = nlohmann::json::parse(ran.out)["run"]["run_id"];
    dave_ = TestDatabase::NewLogin("dave");
    erin_ = TestDatabase::NewLogin("erin");
    ASSERT_EQ(RunTrnflow("project add mlog-lab --member " + Role("dave")).exit_code, 0);
    ASSERT_EQ(RunTrnflow("project add other-lab --member " + Role("erin")).exit_code, 0);
    // The dashboard, as an operator runs it (root, the daemons' login, --auth local).
    std::string secrets = testing::ProcessDir("/tmp/trnflow-memberlogs-token");
    fs::create_directories(secrets);
    fs::permissions(secrets, fs::perms::owner_all);
    serve_ = std::make_unique<Daemon>(
        "memberlogs-serve",
        std::vector<std::string>{"serve", "--listen", "127.0.0.1:0", "--token-file",
                                 secrets + "/serve.token"},
        std::vector<std::string>{"TRNFLOW_HOME=" + testing::CliHome()});
    serve_->Start();
    int port = 0;
    std::regex re(R"(listening on http://127\.0\.0\.1:(\d+)/)");
    WaitFor(
        [&] {
          std::smatch m;
          std::string log = ReadFile(serve_->log_path());
          if (std::regex_search(log, m, re)) port = std::stoi(m[1]);
          return port > 0;
        },
        30);
    ASSERT_GT(port, 0) << ReadFile(serve_->log_path());
    url_ = "http://127.0.0.1:" + std::to_string(port);
  }
  static void TearDownTestSuite() { serve_.reset(); }

  static constexpr const char* kSecret = "s3cret-value-for-memberlogs";
  static inline std::string run_, dave_, erin_, url_;
  static inline std::unique_ptr<Daemon> serve_;
};

TEST_F(MemberLogs, AMemberReadsTheirProjectsLogThroughTheDashboardMasked) {
  RootOnlyLogs logs;
  std::string path = logs.dir + "/run-" + run_ + "/hello.attempt-1.log";
  CliResult r = AsMember(dave_, url_, "logs " + run_ + " hello");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("==> hello attempt 1 (" + path + ", through trnflow serve) <==\nhello\n"
                       "token=***\n"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find(kSecret), std::string::npos) << "the secret is masked: " << r.out;
  // docs/cli.md's sample says the same, for its run 7 and stage evaluate.
  std::string doc = ReadFile(TRNFLOW_SOURCE_DIR "/docs/cli.md");
  size_t at = doc.find("## A member's logs");
  ASSERT_NE(at, std::string::npos);
  std::smatch m;
  std::string section = doc.substr(at, doc.find("\n## ", at + 3) - at);
  ASSERT_TRUE(std::regex_search(section, m, std::regex("trnflow logs 7 evaluate\n(==> .*<==)\n")))
      << section;
  std::string header = std::regex_replace(
      std::regex_replace(std::regex_replace(m[1].str(), std::regex("evaluate"), "hello"),
                         std::regex("/var/lib/trnflow"), testing::CliHome()),
      std::regex("run-7/"), "run-" + run_ + "/");
  EXPECT_NE(r.out.find(header + "\nhello\n"), std::string::npos) << header << "\n" << r.out;
  CliResult j = AsMember(dave_, url_, "logs " + run_ + " --format json");
  ASSERT_EQ(j.exit_code, 0) << j.out;
  auto entries = nlohmann::json::parse(j.out, nullptr, false);
  ASSERT_TRUE(entries.is_array() && entries.size() == 1) << j.out;
  EXPECT_EQ(entries[0]["text"], "hello\ntoken=***\n") << j.out;
  EXPECT_EQ(entries[0]["served_by"], url_);
  EXPECT_TRUE(entries[0]["host"].is_null());
  // The catalog holds no ticket it could give again: each was spent.
  EXPECT_EQ(testing::Query("SELECT count(*) FROM trnflow.log_tickets"), "0");

  // A member of another project: refused by the catalog, before any dashboard is asked; the
  // same answer as for a stage that does not exist.
  CliResult other = AsMember(erin_, url_, "logs " + run_ + " hello");
  EXPECT_EQ(other.exit_code, 2) << other.out;
  EXPECT_NE(other.out.find("no run " + run_), std::string::npos) << "RLS hides it: " << other.out;
  EXPECT_EQ(other.out.find("token="), std::string::npos) << other.out;
}

TEST_F(MemberLogs, WithoutADashboardTheMemberIsToldWhatToDo) {
  RootOnlyLogs logs;
  CliResult r = AsMember(dave_, "http://127.0.0.1:1", "logs " + run_ + " hello");
  EXPECT_EQ(r.exit_code, 3) << r.out;
  EXPECT_NE(r.out.find("its log is on this host at " + logs.dir + "/run-" + run_ +
                       "/hello.attempt-1.log"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("does not answer at http://127.0.0.1:1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("run `trnflow serve` on this host, or set TRNFLOW_SERVE_URL"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("share TRNFLOW_HOME"), std::string::npos) << "not another host: " << r.out;
  EXPECT_EQ(r.out.find("through trnflow serve) <=="), std::string::npos) << r.out;
  CliResult j = AsMember(dave_, "http://127.0.0.1:1", "logs " + run_ + " hello --format json");
  EXPECT_EQ(j.exit_code, 3) << j.out;
  auto entries = nlohmann::json::parse(j.out, nullptr, false);
  ASSERT_TRUE(entries.is_array() && entries.size() == 1) << j.out;
  EXPECT_EQ(entries[0]["readable"], false);
  EXPECT_TRUE(entries[0]["text"].is_null());
  EXPECT_NE(entries[0]["error"].get<std::string>().find("TRNFLOW_SERVE_URL"), std::string::npos);
}

TEST_F(MemberLogs, FollowPrintsARunningAttemptUntilTheRunEnds) {
  std::string gate = fs::path(testing::JobVisibleDir("memberlogs-gate")) / "gate";
  fs::remove(gate);
  std::string file = WriteTempFile(
      "follow.yaml", "pipeline: mfollow\nproject: mlog-lab\nstages:\n  say:\n    run: [\"sh\", "
                     "\"-c\", \"echo one; while [ ! -e " + gate +
                         " ]; do sleep 0.1; done; echo two\"]\n    instance: c6i.xlarge\n");
  Daemon worker("memberlogs-worker", {"worker", "--pool", "cpu=2"},
                {"TRNFLOW_HOME=" + testing::CliHome()});
  worker.Start();
  CliResult sub = RunTrnflow("submit " + file + " --format json");
  ASSERT_EQ(sub.exit_code, 0) << sub.out << sub.err;
  std::string id = nlohmann::json::parse(sub.out)["run_id"];
  ASSERT_TRUE(WaitFor(
      [&] {
        return ReadFile(testing::CliHome() + "/logs/run-" + id + "/say.attempt-1.log") == "one\n";
      },
      60))
      << ReadFile(worker.log_path());
  RootOnlyLogs logs;
  CliResult followed;
  std::thread member([&] { followed = AsMember(dave_, url_, "logs " + id + " say -f"); });
  // It has printed the first line and waits for more; then the job goes on and ends.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  std::ofstream(gate) << "go\n";
  member.join();
  fs::remove(gate);
  EXPECT_EQ(followed.exit_code, 0) << followed.out;
  EXPECT_NE(followed.out.find("through trnflow serve) <==\none\ntwo\n"), std::string::npos)
      << followed.out;
  EXPECT_EQ(testing::RunStateText(std::stoll(id)), "succeeded");
}

TEST_F(MemberLogs, ATicketIsOneUseTheMembersProjectsOnlyAndItsArgumentsAreChecked) {
  RootOnlyLogs logs;
  bool ok = false;
  std::string ticket = Psql(dave_, "SELECT ticket FROM trnflow.log_ticket(" + run_ + ", 'hello', 1)", &ok);
  ASSERT_TRUE(ok) << ticket;
  ASSERT_EQ(ticket.size(), 64u) << ticket;
  auto get = [&](const std::string& header) {
    return RunShell("curl -s -w '\\n%{http_code}' " + header + " " + url_ +
                    "/api/log-ticket").out;
  };
  std::string first = get("-H 'X-Trnflow-Log-Ticket: " + ticket + "'");
  EXPECT_NE(first.find("token=***"), std::string::npos) << first;
  EXPECT_EQ(first.substr(first.size() - 3), "200") << first;
  std::string again = get("-H 'X-Trnflow-Log-Ticket: " + ticket + "'");
  EXPECT_EQ(again.substr(again.size() - 3), "403") << "one use: " << again;
  EXPECT_EQ(get("").substr(get("").size() - 3), "401") << "no ticket, no log";
  // Expired: a ticket lives a minute.
  std::string late = Psql(dave_, "SELECT ticket FROM trnflow.log_ticket(" + run_ + ", 'hello', NULL)");
  ASSERT_EQ(late.size(), 64u) << late;
  testing::Query("UPDATE trnflow.log_tickets SET expires_at = now() - interval '1 second'");
  std::string expired = get("-H 'X-Trnflow-Log-Ticket: " + late + "'");
  EXPECT_EQ(expired.substr(expired.size() - 3), "403") << expired;

  // Another project's member, a run that does not exist: the same refusal.
  std::string refused = Psql(erin_, "SELECT ticket FROM trnflow.log_ticket(" + run_ + ", 'hello', 1)", &ok);
  EXPECT_FALSE(ok);
  EXPECT_NE(refused.find("has no stage \"hello\" whose log this login may read"), std::string::npos)
      << refused;
  std::string missing = Psql(dave_, "SELECT ticket FROM trnflow.log_ticket(999999999, 'hello', 1)", &ok);
  EXPECT_FALSE(ok);
  EXPECT_NE(missing.find("whose log this login may read"), std::string::npos) << missing;
  // Every argument.
  for (const std::string& args :
       std::vector<std::string>{"NULL, 'hello', 1", "0, 'hello', 1", run_ + ", NULL, 1", run_ + ", '../hello', 1",
        run_ + ", E'hel\\\\nlo', 1", run_ + ", 'hello', 0", run_ + ", 'hello', 2",
        run_ + ", repeat('a', 300), 1"}) {
    std::string e = Psql(dave_, "SELECT ticket FROM trnflow.log_ticket(" + args + ")", &ok);
    EXPECT_FALSE(ok) << args << ": " << e;
    EXPECT_EQ(e.find("ERROR"), 0u) << args << ": " << e;
  }
  // A member cannot spend a ticket, nor read the table of them.
  std::string spend = Psql(dave_, "SELECT * FROM trnflow.spend_log_ticket('" + ticket + "')", &ok);
  EXPECT_FALSE(ok);
  EXPECT_NE(spend.find("spent by trnflow serve"), std::string::npos) << spend;
  std::string table = Psql(dave_, "SELECT count(*) FROM trnflow.log_tickets", &ok);
  EXPECT_FALSE(ok) << table;
  // Nor hoard them.
  for (int i = 0; i < 32; ++i)
    Psql(dave_, "SELECT ticket FROM trnflow.log_ticket(" + run_ + ", 'hello', 1)");
  std::string hoard = Psql(dave_, "SELECT ticket FROM trnflow.log_ticket(" + run_ + ", 'hello', 1)", &ok);
  EXPECT_FALSE(ok);
  EXPECT_NE(hoard.find("32 unspent log tickets"), std::string::npos) << hoard;
  testing::Query("DELETE FROM trnflow.log_tickets");
}

}  // namespace
}  // namespace trnflow
