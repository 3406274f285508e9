// Issue 35, "names and small things": project names may hold '_', and one whose roles
// another project has is refused naming it; `project ls` lists people, not the write role; a member's `budget set`
// says who may; a login with no PostgreSQL role is told so, not "Is PostgreSQL running?";
// `db migrate` refuses when owner.url and TRNFLOW_DATABASE_URL name different catalogs; and
// `db drop` drops a catalog's database and only its own roles, so the name can be used again.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "schema/catalog.h"
#include "schema/catalog_testing.h"
#include "tests/run_cli.h"
#include "tests/test_db.h"

namespace trnflow {
namespace {

using testing::CliResult;
using testing::RunShell;
using testing::RunTrnflow;
using testing::TestDatabase;

::testing::Environment* const kDatabase =
    ::testing::AddGlobalTestEnvironment(new TestDatabase("smallthings"));

std::string Role(const std::string& who) {
  return "trnflow_test_" + TestDatabase::database_name() + "_" + who;
}

TEST(SmallThings, AProjectNameMayHoldAnUnderscoreUnlessAnotherProjectHasItsRoles) {
  // '_' is allowed where projects are made (`project add`), named (a pipeline's `project:`)
  // and submitted to.
  CliResult add = RunTrnflow("project add ml_group");
  ASSERT_EQ(add.exit_code, 0) << add.out << add.err;
  EXPECT_EQ(testing::Query("SELECT name FROM trnflow.projects WHERE name = 'ml_group'"), "ml_group");
  std::string file = testing::WriteTempFile(
      "underscore.yaml", "pipeline: p\nproject: ml_group\nstages:\n  a:\n    run: [\"true\"]\n");
  CliResult v = RunTrnflow("validate " + file);
  EXPECT_EQ(v.exit_code, 0) << v.out << v.err;
  CliResult sub = RunTrnflow("submit " + file);
  EXPECT_EQ(sub.exit_code, 0) << sub.out << sub.err;

  // Its roles spell '-' as '_': 'ml-group' would share them, and is refused naming ml_group.
  CliResult clash = RunTrnflow("project add ml-group");
  EXPECT_EQ(clash.exit_code, 2) << clash.out << clash.err;
  EXPECT_NE(clash.err.find("clashes with the existing project \"ml_group\""), std::string::npos)
      << clash.err;
  EXPECT_NE(clash.err.find("project_ml_group"), std::string::npos) << clash.err;
  // A submit by the daemons' login, which makes a run's project, is refused the same way.
  CliResult run = RunTrnflow("submit " + file + " --project ml-group");
  EXPECT_EQ(run.exit_code, 2) << run.out << run.err;
  EXPECT_NE(run.err.find("\"ml_group\""), std::string::npos) << run.err;
  EXPECT_EQ(testing::Query("SELECT count(*) FROM trnflow.projects WHERE name = 'ml-group'"), "0");

  // A name whose read role is another project's write role: x-write beside x, and x beside
  // x_write.
  ASSERT_EQ(RunTrnflow("project add wlab").exit_code, 0);
  CliResult w = RunTrnflow("project add wlab-write");
  EXPECT_EQ(w.exit_code, 2) << w.out << w.err;
  EXPECT_NE(w.err.find("\"wlab\""), std::string::npos) << w.err;
  ASSERT_EQ(RunTrnflow("project add vlab_write").exit_code, 0);
  CliResult v2 = RunTrnflow("project add vlab");
  EXPECT_EQ(v2.exit_code, 2) << v2.out << v2.err;
  EXPECT_NE(v2.err.find("\"vlab_write\""), std::string::npos) << v2.err;

  // In SQL, whoever inserts: the owner's ensure_project, and a plain INSERT (the unique index
  // on the roles' spelling holds even where the trigger is not the first to see it).
  CliResult sql = RunShell("psql -X -q -v ON_ERROR_STOP=1 '" + TestDatabase::owner_url() +
                           "' -c \"SELECT trnflow.ensure_project('ml-group')\" 2>&1");
  EXPECT_NE(sql.exit_code, 0) << sql.out;
  EXPECT_NE(sql.out.find("clashes with the existing project \"ml_group\""), std::string::npos)
      << sql.out;
  CliResult dup = RunShell("psql -X -q -v ON_ERROR_STOP=1 '" + TestDatabase::owner_url() +
                           "' -c \"ALTER TABLE trnflow.projects DISABLE TRIGGER projects_name_clash;"
                           " INSERT INTO trnflow.projects (name) VALUES ('ml-group')\" 2>&1");
  EXPECT_NE(dup.exit_code, 0) << dup.out;
  EXPECT_NE(dup.out.find("projects_role_spelling"), std::string::npos) << dup.out;
  // A same-name ensure_project (project grant, project add again) is no clash.
  CliResult again = RunTrnflow("project add ml_group");
  EXPECT_EQ(again.exit_code, 0) << again.out << again.err;

  // Capitals are still refused, with the name to write.
  CliResult caps = RunTrnflow("project add ML_group");
  EXPECT_EQ(caps.exit_code, 2) << caps.out << caps.err;
  EXPECT_NE(caps.err.find("write 'ml_group'"), std::string::npos) << caps.err;
}

TEST(SmallThings, ProjectLsListsPeopleNotTheWriteRole) {
  TestDatabase::NewLogin("alice");
  TestDatabase::NewLogin("bob");
  ASSERT_EQ(RunTrnflow("project add people-lab --member " + Role("alice")).exit_code, 0);
  CliResult g = RunTrnflow("project grant people-lab " + Role("bob") + " --read");
  ASSERT_EQ(g.exit_code, 0) << g.out << g.err;
  CliResult ls = RunTrnflow("project ls --format json");
  ASSERT_EQ(ls.exit_code, 0) << ls.out << ls.err;
  nlohmann::json lab;
  for (const auto& p : nlohmann::json::parse(ls.out))
    if (p.at("project") == "people-lab") lab = p;
  ASSERT_FALSE(lab.is_null()) << ls.out;
  EXPECT_EQ(lab.at("members"), nlohmann::json({Role("alice"), Role("bob")})) << ls.out;
  EXPECT_EQ(lab.at("readers"), nlohmann::json({Role("bob")})) << ls.out;
  CliResult table = RunTrnflow("project ls");
  EXPECT_EQ(table.out.find("_write"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find(Role("bob") + " (read)"), std::string::npos) << table.out;
}

TEST(SmallThings, AMembersBudgetSetSaysWhoMay) {
  std::string carol = TestDatabase::NewLogin("carol");
  ASSERT_EQ(RunTrnflow("project add budget-lab --member " + Role("carol")).exit_code, 0);
  CliResult r = RunTrnflow("budget set budget-lab 100", "TRNFLOW_DATABASE_URL='" + carol + "'");
  EXPECT_EQ(r.exit_code, 4) << r.out << r.err;
  EXPECT_EQ(r.err.find("permission denied for table"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("setting project budget-lab's budget needs the daemons' login"),
            std::string::npos)
      << r.err;
  // The daemons' login may.
  CliResult ok = RunTrnflow("budget set budget-lab 100");
  EXPECT_EQ(ok.exit_code, 0) << ok.out << ok.err;
}

TEST(SmallThings, ALoginWithNoRoleIsToldSoNotAskedWhetherPostgresRuns) {
  // `nobody` over the local socket (peer authentication): the server answers that it has no
  // such role.
  CliResult r = RunShell("runuser -u nobody -- env TRNFLOW_HOME=/tmp TRNFLOW_CONFIG_DIR=/nonexistent "
                         "TRNFLOW_DATABASE_URL=postgresql:///" + TestDatabase::database_name() +
                         " '" TRNFLOW_BINARY "' runs 2>&1");
  EXPECT_EQ(r.exit_code / 256 == 3 || r.exit_code == 3, true) << r.exit_code << r.out;
  EXPECT_NE(r.out.find("has no role \"nobody\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("CREATE ROLE nobody LOGIN"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("Is PostgreSQL running"), std::string::npos) << r.out;
}

nlohmann::json StageOf(const nlohmann::json& plan, const std::string& name) {
  for (const auto& s : plan.at("stages"))
    if (s.at("name") == name) return s;
  ADD_FAILURE() << "no stage " << name << " in " << plan.dump();
  return {};
}

TEST(SmallThings, PlanSpeedPlansACommandsPastAtTheSpeedYouMeanToRunAt) {
  std::string file = testing::WriteTempFile("speed.yaml", R"(pipeline: speed-demo
project: speed-lab
stages:
  score:
    run: ["sleep", "0.5"]
    instance: c6i.xlarge
  report:
    needs: [score]
    run: ["true"]
    instance: c6i.xlarge
    estimate: 45m
)");
  CliResult ran = RunTrnflow("run " + file + " --speed 3600");
  ASSERT_EQ(ran.exit_code, 0) << ran.out << ran.err;
  CliResult as_ran = RunTrnflow("plan " + file + " --format json");
  CliResult at = RunTrnflow("plan " + file + " --speed 36000 --format json");
  ASSERT_EQ(as_ran.exit_code, 0) << as_ran.err;
  ASSERT_EQ(at.exit_code, 0) << at.err;
  auto a = nlohmann::json::parse(as_ran.out), b = nlohmann::json::parse(at.out);
  double h1 = StageOf(a, "score").at("hours").get<double>();
  double h10 = StageOf(b, "score").at("hours").get<double>();
  ASSERT_GT(h1, 0.1) << "half a second at 3600x is at least 0.14 simulated hours";
  EXPECT_NEAR(h10 / h1, 10.0, 0.05) << "ten times the speed, ten times the billed time";
  EXPECT_EQ(StageOf(b, "score").at("estimate_source"), "history");
  EXPECT_EQ(StageOf(a, "report").at("hours"), StageOf(b, "report").at("hours"))
      << "an estimate: is simulated time, not scaled";
  EXPECT_EQ(b.at("speed").get<double>(), 36000);
  EXPECT_FALSE(a.contains("speed"));
  CliResult table = RunTrnflow("plan " + file + " --speed 36000");
  EXPECT_NE(table.out.find("planned at --speed 36000"), std::string::npos) << table.out;
  CliResult bad = RunTrnflow("plan " + file + " --speed 0");
  EXPECT_EQ(bad.exit_code, 2) << bad.out << bad.err;
}

TEST(SmallThings, RunOutputSaysEveryInterruptionEvenWhenItLastedLessThanAPoll) {
  // At a million times real time the climate example's spot interruption and its retry
  // happen within one 100 ms poll; the output still says it, once per interrupted attempt.
  CliResult r = RunTrnflow("run examples/climate/pipeline.yaml --speed 1000000 --project "
                           "poll-lab");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  schema::Catalog c(TestDatabase::url());
  std::string interrupted = schema::testing::QueryValue(
      c,
      "SELECT count(*) FROM trnflow.attempts a JOIN trnflow.runs r ON r.id = a.run_id WHERE "
      "r.project = 'poll-lab' AND a.outcome = 'spot_interruption'");
  ASSERT_NE(interrupted, "0") << "the example is interrupted at its default seed";
  size_t said = 0;
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line))
    if (line.find("spot_interruption") != std::string::npos && line.rfind("[", 0) == 0) ++said;
  EXPECT_EQ(std::to_string(said), interrupted) << r.out;
}

TEST(SmallThings, AMembersLogsOnThisHostButNotTheirsToReadAreSaidSoNotSentToAnotherHost) {
  // A run: stage's log under the workers' TRNFLOW_HOME, which only its user may enter; a member
  // (OS user nobody, PostgreSQL login dave, a member of the project) asks for it on this host,
  // where no dashboard answers (tests/second_week/member_logs_test.cpp has one that does).
  std::string file = testing::WriteTempFile("logged.yaml", "pipeline: logged\nproject: log-lab\n"
                                                           "stages:\n  hello:\n    run: [\"echo\", \"hi\"]\n");
  CliResult ran = RunTrnflow("run " + file + " --format json");
  ASSERT_EQ(ran.exit_code, 0) << ran.out << ran.err;
  std::string run = nlohmann::json::parse(ran.out)["run"]["run_id"];
  std::string dave = TestDatabase::NewLogin("dave");
  ASSERT_EQ(RunTrnflow("project add log-lab --member " + Role("dave")).exit_code, 0);
  std::string logs = testing::CliHome() + "/logs";
  ASSERT_TRUE(std::filesystem::exists(logs + "/run-" + run + "/hello.attempt-1.log"));
  std::filesystem::permissions(logs, std::filesystem::perms::owner_all);  // 0700, root's
  CliResult r = RunShell("cd '" TRNFLOW_SOURCE_DIR "' && runuser -u nobody -- env TRNFLOW_HOME=/tmp "
                         "TRNFLOW_CONFIG_DIR=/nonexistent TRNFLOW_SERVE_URL=http://127.0.0.1:1 "
                         "TRNFLOW_DATABASE_URL='" + dave +
                         "' '" TRNFLOW_BINARY "' logs " + run + " hello 2>&1");
  CliResult j = RunShell("cd '" TRNFLOW_SOURCE_DIR "' && runuser -u nobody -- env TRNFLOW_HOME=/tmp "
                         "TRNFLOW_CONFIG_DIR=/nonexistent TRNFLOW_SERVE_URL=http://127.0.0.1:1 "
                         "TRNFLOW_DATABASE_URL='" + dave +
                         "' '" TRNFLOW_BINARY "' logs " + run + " hello --format json 2>&1");
  std::filesystem::permissions(logs, std::filesystem::perms::owner_all |
                                         std::filesystem::perms::group_read |
                                         std::filesystem::perms::group_exec |
                                         std::filesystem::perms::others_read |
                                         std::filesystem::perms::others_exec);
  EXPECT_EQ(r.exit_code, 3) << "the dashboard does not answer: " << r.out;
  EXPECT_EQ(r.out.find("through trnflow serve) <=="), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("its log is on this host at " + logs + "/run-" + run + "/hello.attempt-1.log"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("which only the workers' user may read"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("share TRNFLOW_HOME"), std::string::npos) << "not another host: " << r.out;
  auto entries = nlohmann::json::parse(j.out, nullptr, false);
  ASSERT_TRUE(entries.is_array() && entries.size() == 1) << j.out;
  EXPECT_EQ(entries[0]["readable"], false);
  EXPECT_TRUE(entries[0]["host"].is_null());
  EXPECT_TRUE(entries[0]["text"].is_null());
}

// A catalog of the test's own, beside this binary's: created, and dropped at the end whatever
// the test did.
struct ScratchCatalog {
  std::string name, url;
  explicit ScratchCatalog(const std::string& n) : name(n) {
    url = schema::CreateDatabase(testing::AdminUrl(), name);
  }
  ~ScratchCatalog() {
    try {
      schema::DropDatabase(testing::AdminUrl(), name);
      schema::DropCatalogRoles(testing::AdminUrl(), name);
    } catch (const std::exception&) {
    }
  }
};

TEST(SmallThings, DbMigrateRefusesWhenOwnerUrlNamesAnotherCatalog) {
  ScratchCatalog other("trnflow_other_" + std::to_string(getpid()));
  std::string config = testing::ProcessDir("/tmp/trnflow-config");
  std::filesystem::create_directories(config);
  std::ofstream(config + "/owner.url") << TestDatabase::owner_url() << "\n";
  // Only TRNFLOW_DATABASE_URL, at the other catalog: refused, nothing migrated there.
  CliResult r = RunTrnflow("db migrate", "env -u TRNFLOW_ADMIN_DATABASE_URL TRNFLOW_CONFIG_DIR=" +
                                             config + " TRNFLOW_DATABASE_URL='" + other.url + "'");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("set TRNFLOW_ADMIN_DATABASE_URL"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/" + other.name), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/" + TestDatabase::database_name()), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(":***@"), std::string::npos) << "no URL, no password: " << r.err;
  CliResult check = RunShell("psql '" + other.url +
                             "' -X -A -t -c \"SELECT to_regclass('trnflow.runs') IS NULL\"");
  EXPECT_EQ(check.out, "t\n");
  // The same catalog through both: migrates (it is up to date).
  CliResult same = RunTrnflow("db migrate", "env -u TRNFLOW_ADMIN_DATABASE_URL TRNFLOW_CONFIG_DIR=" +
                                                config + " TRNFLOW_DATABASE_URL='" +
                                                TestDatabase::url() + "'");
  EXPECT_EQ(same.exit_code, 0) << same.out << same.err;
  EXPECT_NE(same.out.find("(up to date)"), std::string::npos) << same.out;
}

std::string RolesOf(const std::string& database) {
  return RunShell("psql '" + testing::AdminUrl() +
                  "' -X -A -t -c \"SELECT count(*) FROM pg_roles r JOIN pg_shdescription d ON "
                  "d.objoid = r.oid WHERE position('(" + database + "):' IN d.description) > 0\"")
      .out;
}

TEST(SmallThings, DbDropDropsTheCatalogAndOnlyItsRolesAndTheNameCanBeUsedAgain) {
  // Two catalogs whose names differ in one character where the first has '_': a LIKE on the
  // name would take the second's roles too.
  std::string pid = std::to_string(getpid());
  ScratchCatalog a("trnflow_dd_" + pid), b("trnflow_ddx" + pid);
  for (auto* c : {&a, &b}) {
    CliResult m = RunTrnflow("db migrate", "TRNFLOW_ADMIN_DATABASE_URL='" + c->url + "'");
    ASSERT_EQ(m.exit_code, 0) << m.out << m.err;
    ASSERT_EQ(RunTrnflow("project add drop-lab", "TRNFLOW_ADMIN_DATABASE_URL='" + c->url + "'")
                  .exit_code,
              0);
  }
  std::string b_roles = RolesOf(b.name);
  ASSERT_NE(b_roles, "0\n");
  ASSERT_NE(RolesOf(a.name), "0\n");

  CliResult dry = RunTrnflow("db drop --dry-run", "TRNFLOW_ADMIN_DATABASE_URL='" + a.url + "'");
  ASSERT_EQ(dry.exit_code, 0) << dry.out << dry.err;
  EXPECT_NE(dry.out.find("role " + a.name + "_project_drop_lab_write"), std::string::npos)
      << dry.out;
  EXPECT_EQ(dry.out.find(b.name), std::string::npos) << dry.out;
  CliResult drop = RunTrnflow("db drop --yes", "TRNFLOW_ADMIN_DATABASE_URL='" + a.url + "'");
  ASSERT_EQ(drop.exit_code, 0) << drop.out << drop.err;
  EXPECT_EQ(RolesOf(a.name), "0\n");
  EXPECT_EQ(RolesOf(b.name), b_roles) << "the other catalog's roles are its own";
  EXPECT_EQ(RunShell("psql '" + testing::AdminUrl() +
                     "' -X -A -t -c \"SELECT count(*) FROM pg_database WHERE datname = '" +
                     a.name + "'\"")
                .out,
            "0\n");
  // The name again, from scratch: no role left over to refuse it.
  schema::CreateDatabase(testing::AdminUrl(), a.name);
  CliResult again = RunTrnflow("db migrate", "TRNFLOW_ADMIN_DATABASE_URL='" + a.url + "'");
  EXPECT_EQ(again.exit_code, 0) << again.out << again.err;
  EXPECT_EQ(RunTrnflow("project add drop-lab", "TRNFLOW_ADMIN_DATABASE_URL='" + a.url + "'")
                .exit_code,
            0);
  // A database with no catalog in it: refused, nothing dropped.
  ScratchCatalog plain("trnflow_plain_" + pid);
  CliResult refused = RunTrnflow("db drop --yes", "TRNFLOW_ADMIN_DATABASE_URL='" + plain.url + "'");
  EXPECT_EQ(refused.exit_code, 2) << refused.out << refused.err;
  EXPECT_NE(refused.err.find("holds no trnflow catalog"), std::string::npos) << refused.err;
  EXPECT_EQ(RunShell("psql '" + plain.url + "' -X -A -t -c 'SELECT 1'").out, "1\n");
}

}  // namespace
}  // namespace trnflow
