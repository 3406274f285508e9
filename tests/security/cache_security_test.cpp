// The artifact cache when several projects share one catalog, one store and one fleet, and a
// job may be hostile: entries stay within their project unless it trusts another, a poisoned
// entry is never served, nothing follows a symlink out of a run's directory or an entry, and
// `cache rm/gc/verify` delete nothing outside the store. Real PostgreSQL, real files, and the
// `trnflow` binary as a user runs it.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "common/sha256.h"
#include "schema/catalog.h"
#include "schema/catalog_testing.h"
#include "tests/run_cli.h"
#include "tests/test_db.h"
#include "workers/artifact_store.h"

namespace trnflow {
namespace {

namespace fs = std::filesystem;
using testing::CliResult;
using testing::ReadFile;
using testing::RunTrnflow;
using testing::TestDatabase;

// A fresh directory of its own for one test, removed at the end; jobs can read it (their
// namespaces show the source tree the pipelines are run from, read-only).
class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(testing::JobVisibleDir("security-" + name)) {}
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Whether any regular file under `dir` holds `needle` (links are not followed).
bool TreeContains(const fs::path& dir, const std::string& needle) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return false;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && !e.is_symlink() && ReadFile(e.path()).find(needle) != std::string::npos)
      return true;
  return false;
}

int64_t RunIdFrom(const std::string& out) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(out, m, std::regex(R"(^run (\d+): )"))) << out;
  return m.empty() ? 0 : std::stoll(m[1]);
}

// A stage of a run, from `trnflow show --format json`.
nlohmann::json Stage(int64_t run, const std::string& name, const std::string& env) {
  auto show =
      nlohmann::json::parse(RunTrnflow("show " + std::to_string(run) + " --format json", env).out);
  for (const auto& s : show["stages"])
    if (s["name"] == name) return s;
  ADD_FAILURE() << "run " << run << " has no stage " << name;
  return {};
}

// A one-stage pipeline whose cached `prepare` runs prep.sh (which counts its calls) and
// writes ${{ run.dir }}/data/out.txt; the same command and inputs whatever the project.
struct TinyPipeline {
  explicit TinyPipeline(const fs::path& dir) : dir(dir) {
    // The job sees this directory read-only: it marks its run's directory when it runs.
    std::ofstream(dir / "prep.sh") << "set -e\necho ran >> \"$TRNFLOW_RUN_DIR/ran-prepare\""
                                   << "\nmkdir -p \"$1\"\necho 'result 42' > \"$1/out.txt\"\n";
    std::ofstream(file()) << "pipeline: tenancy\nproject: nobody\nstages:\n"
                             "  prepare:\n"
                             "    run: [\"bash\", \""
                          << (dir / "prep.sh").string()
                          << "\", \"${{ run.dir }}/data\"]\n"
                             "    cache: true\n"
                             "    outputs: [\"${{ run.dir }}/data\"]\n";
  }
  std::string file() const { return (dir / "pipeline.yaml").string(); }
  std::string env() const {
    return "TRNFLOW_SPOT_RATE_MULTIPLIER=0 TRNFLOW_HOME=" + (dir / "home").string();
  }
  fs::path home() const { return dir / "home"; }
  // Runs in which the command really ran (a cache hit restores only the declared outputs).
  long calls() const {
    long n = 0;
    std::error_code ec;
    for (const auto& run : fs::directory_iterator(home() / "runs", ec))
      n += fs::exists(run.path() / "ran-prepare");
    return n;
  }
  // Runs it as `project`; returns (run id, prepare's stage JSON).
  std::pair<int64_t, nlohmann::json> Run(const std::string& project) const {
    CliResult r = RunTrnflow("run " + file() + " --speed 1000000 --project " + project, env());
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    int64_t id = RunIdFrom(r.out);
    return {id, Stage(id, "prepare", env())};
  }
  fs::path dir;
};

}  // namespace

// Project B runs what project A ran, with the same inputs: B builds its own entry; a project
// that trusts A is served A's, until it stops trusting it. Each project sees only its own
// entries through its role.
TEST(CacheTenancy, AProjectIsServedOnlyItsOwnEntriesOrThoseOfProjectsItTrusts) {
  TempDir tmp("tenancy");
  TinyPipeline p(tmp.path());
  auto [a1, a_first] = p.Run("sec-a");
  EXPECT_EQ(a_first["state"], "succeeded");
  EXPECT_EQ(p.calls(), 1);
  auto [a2, a_again] = p.Run("sec-a");
  EXPECT_EQ(a_again["state"], "cached") << "a project is served its own entry";
  EXPECT_EQ(p.calls(), 1);

  auto [b1, b_first] = p.Run("sec-b");
  EXPECT_EQ(b_first["state"], "succeeded") << "B is not served A's entry: " << b_first.dump();
  EXPECT_EQ(p.calls(), 2) << "B ran the command itself";

  schema::Catalog c(TestDatabase::url());
  EXPECT_EQ(schema::testing::QueryValue(
                c, "SELECT count(*) FROM trnflow.artifacts WHERE project = 'sec-a'"),
            "1");
  EXPECT_EQ(schema::testing::QueryValue(
                c, "SELECT count(*) FROM trnflow.artifacts WHERE project = 'sec-b'"),
            "1");

  // Trust is between projects that exist, and one way.
  CliResult unknown = RunTrnflow("cache trust sec-c sec-a", p.env());
  EXPECT_EQ(unknown.exit_code, 2) << unknown.out << unknown.err;
  EXPECT_NE(unknown.err.find("no project sec-c"), std::string::npos) << unknown.err;
  ASSERT_EQ(RunTrnflow("project add sec-c", p.env()).exit_code, 0);
  CliResult trust = RunTrnflow("cache trust sec-c sec-a", p.env());
  ASSERT_EQ(trust.exit_code, 0) << trust.out << trust.err;
  CliResult list = RunTrnflow("cache trust --list", p.env());
  EXPECT_NE(list.out.find("sec-c trusts sec-a"), std::string::npos) << list.out;

  auto [c1, c_first] = p.Run("sec-c");
  EXPECT_EQ(c_first["state"], "cached") << "C trusts A: " << c_first.dump();
  EXPECT_EQ(p.calls(), 2);
  EXPECT_NE(c_first["attempts"][0]["message"].get<std::string>().find("trusted project sec-a"),
            std::string::npos)
      << c_first.dump();
  EXPECT_EQ(ReadFile(p.home() / "runs" / std::to_string(c1) / "data/out.txt"), "result 42\n")
      << "A's outputs were restored into C's run";
  EXPECT_EQ(schema::testing::QueryValue(
                c, "SELECT count(*) FROM trnflow.artifacts WHERE project = 'sec-c'"),
            "0");

  ASSERT_EQ(RunTrnflow("cache untrust sec-c sec-a", p.env()).exit_code, 0);
  auto [c2, c_after] = p.Run("sec-c");
  EXPECT_EQ(c_after["state"], "succeeded") << "trust withdrawn: " << c_after.dump();
  EXPECT_EQ(p.calls(), 3);

  // Row-level security: a member of B sees B's entries and compiled graphs only, and whom
  // its projects trust; a member of C sees C's trust. Logins with random passwords, scoped to
  // this test's catalog (dropped with it).
  auto member_of = [&](const std::string& project) {
    std::string who = project.substr(4);
    std::string url = TestDatabase::NewLogin(who);
    std::string role = "trnflow_test_" + TestDatabase::database_name() + "_" + who;
    EXPECT_EQ(RunTrnflow("project grant " + project + " " + role + " --read", p.env()).exit_code,
              0);
    return std::make_unique<schema::Catalog>(url);
  };
  auto b = member_of("sec-b");
  auto cm = member_of("sec-c");
  EXPECT_EQ(schema::testing::QueryValue(
                *b, "SELECT count(*) FROM trnflow.artifacts WHERE project IS NOT NULL"),
            "1");
  EXPECT_EQ(schema::testing::QueryValue(
                *b, "SELECT count(*) FROM trnflow.artifacts WHERE project = 'sec-a'"),
            "0");
  schema::testing::QueryValue(
      c, "INSERT INTO trnflow.cache_trust (project, trusts) VALUES ('sec-c', 'sec-a')");
  EXPECT_EQ(schema::testing::QueryValue(*b, "SELECT count(*) FROM trnflow.cache_trust"), "0");
  EXPECT_EQ(schema::testing::QueryValue(*cm, "SELECT count(*) FROM trnflow.cache_trust"), "1");
  schema::testing::QueryValue(
      c, "DELETE FROM trnflow.cache_trust WHERE project = 'sec-c' RETURNING 1");
}

// An entry whose files were altered after it was stored is never served: it is rebuilt, and
// the run gets what the command writes.
TEST(CacheTenancy, APoisonedEntryIsRebuiltNotServed) {
  TempDir tmp("poison");
  TinyPipeline p(tmp.path());
  auto [r1, first] = p.Run("sec-poison");
  ASSERT_EQ(first["state"], "succeeded");
  schema::Catalog c(TestDatabase::url());
  std::string path = schema::testing::QueryValue(
      c, "SELECT path FROM trnflow.artifacts WHERE project = 'sec-poison'");
  ASSERT_FALSE(path.empty());
  std::ofstream(fs::path(path) / "outputs/out.txt", std::ios::trunc) << "POISON\n";
  auto [r2, second] = p.Run("sec-poison");
  EXPECT_EQ(second["state"], "succeeded") << "rebuilt: " << second.dump();
  EXPECT_EQ(p.calls(), 2);
  EXPECT_EQ(ReadFile(p.home() / "runs" / std::to_string(r2) / "data/out.txt"), "result 42\n");
  auto [r3, third] = p.Run("sec-poison");
  EXPECT_EQ(third["state"], "cached") << "the rebuilt entry is served";
  EXPECT_FALSE(TreeContains(p.home() / "runs" / std::to_string(r3), "POISON"));
}

// A job that declares an output which is a symlink to a file outside its run's directory (a
// secret the worker could read and the job could not) fails with a user error; the store holds
// no copy of the secret.
TEST(CacheLinks, AnOutputLinkingOutOfTheRunDirectoryFailsTheStage) {
  TempDir tmp("leak");
  fs::create_directories(tmp.path() / "secret");
  const std::string canary = "CANARY-" + std::to_string(getpid()) + "-shadow";
  std::ofstream(tmp.path() / "secret/key") << canary << "\n";
  fs::permissions(tmp.path() / "secret/key", fs::perms::owner_read | fs::perms::owner_write);
  std::string file = (tmp.path() / "pipeline.yaml").string();
  std::ofstream(file) << "pipeline: leak\nproject: sec-leak\nstages:\n"
                         "  exfiltrate:\n"
                         "    run: [\"bash\", \"-c\", \"mkdir -p ${{ run.dir }}/data && ln -s "
                      << (tmp.path() / "secret/key").string()
                      << " ${{ run.dir }}/data/loot\"]\n"
                         "    cache: true\n"
                         "    outputs: [\"${{ run.dir }}/data\"]\n";
  std::string env = "TRNFLOW_SPOT_RATE_MULTIPLIER=0 TRNFLOW_HOME=" + (tmp.path() / "home").string();
  CliResult r = RunTrnflow("run " + file + " --speed 1000000", env);
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  auto stage = Stage(RunIdFrom(r.out), "exfiltrate", env);
  EXPECT_EQ(stage["state"], "failed") << stage.dump();
  ASSERT_FALSE(stage["attempts"].empty());
  EXPECT_EQ(stage["attempts"][0]["outcome"], "user_error") << stage.dump();
  std::string message = stage["attempts"][0]["message"];
  EXPECT_NE(message.find("data/loot is a symlink to " + (tmp.path() / "secret/key").string() +
                         " outside the run directory"),
            std::string::npos)
      << message;
  EXPECT_FALSE(TreeContains(tmp.path() / "home/artifacts", canary)) << "the secret was stored";
  schema::Catalog c(TestDatabase::url());
  EXPECT_EQ(schema::testing::QueryValue(
                c, "SELECT count(*) FROM trnflow.artifacts WHERE project = 'sec-leak'"),
            "0");
}

// The same at the store's level, for every way out: a link to an absolute path, a relative
// link climbing out, an output under a linked directory; a link that stays inside is stored as
// a link (not the file it names) and restored as one.
TEST(CacheLinks, StoreRefusesLinksOutAndKeepsLinksInsideAsLinks) {
  TempDir tmp("store-links");
  fs::path run = tmp.path() / "run", home = tmp.path() / "home", outside = tmp.path() / "outside";
  fs::create_directories(run / "data");
  fs::create_directories(outside);
  std::ofstream(outside / "secret") << "CANARY-outside\n";
  std::ofstream(run / "data/real.txt") << "real\n";
  auto refused = [&](const std::vector<std::string>& rels, const std::string& why) {
    EXPECT_THROW(workers::OutputsDigest(run.string(), rels), workers::OutputRefused) << why;
    try {
      workers::StoreOutputs(home.string(), "{}", run.string(), rels);
      ADD_FAILURE() << why << ": stored";
    } catch (const workers::OutputRefused& e) {
      EXPECT_NE(std::string(e.what()).find("outside the run directory"), std::string::npos)
          << e.what();
    }
  };
  fs::create_symlink(outside / "secret", run / "abs");
  refused({"abs"}, "an absolute link out");
  fs::create_symlink("../../outside/secret", run / "data/climb");
  refused({"data"}, "a relative link climbing out, inside a declared directory");
  fs::remove(run / "data/climb");
  fs::create_directory_symlink(outside, run / "linked");
  refused({"linked/secret"}, "an output under a directory that links out");
  EXPECT_FALSE(TreeContains(home / "artifacts", "CANARY-outside"));

  fs::create_symlink("real.txt", run / "data/alias");
  fs::create_symlink(run / "data/real.txt", run / "data/absolute-alias");  // inside: kept
  workers::StoredArtifact a = workers::StoreOutputs(home.string(), "{}", run.string(), {"data"});
  EXPECT_TRUE(workers::VerifyArtifact(a.path, a.digest));
  fs::path stored = fs::path(a.path) / "outputs/data";
  EXPECT_TRUE(fs::is_symlink(stored / "alias"));
  EXPECT_EQ(fs::read_symlink(stored / "alias"), "real.txt");
  EXPECT_EQ(fs::read_symlink(stored / "absolute-alias"), "real.txt") << "made relative";
  EXPECT_EQ(a.bytes, 5) << "one file; links hold no contents";

  // The digest covers a link's target.
  fs::remove(stored / "alias");
  fs::create_symlink("absolute-alias", stored / "alias");
  EXPECT_FALSE(workers::VerifyArtifact(a.path, a.digest)) << "a retargeted link";
  fs::remove(stored / "alias");
  fs::create_symlink("real.txt", stored / "alias");
  EXPECT_TRUE(workers::VerifyArtifact(a.path, a.digest));

  // The executable bit is part of what was stored.
  std::ofstream(run / "tool.sh") << "#!/bin/sh\n";
  fs::permissions(run / "tool.sh", fs::perms::owner_exec, fs::perm_options::add);
  workers::StoredArtifact x = workers::StoreOutputs(home.string(), "{}", run.string(), {"tool.sh"});
  fs::permissions(fs::path(x.path) / "outputs/tool.sh", fs::perms::owner_exec,
                  fs::perm_options::remove);
  EXPECT_FALSE(workers::VerifyArtifact(x.path, x.digest));

  fs::path restored = tmp.path() / "run-2";
  workers::RestoreOutputs(a.path, restored.string());
  EXPECT_TRUE(fs::is_symlink(restored / "data/alias"));
  EXPECT_EQ(ReadFile(restored / "data/alias"), "real\n");
}

// An entry crafted to hold a link out (absolute, or climbing with ..) is refused on restore and
// nothing is written outside the run's directory; an existing link in the destination is
// replaced, never written through.
TEST(CacheLinks, RestoreRefusesEntriesWithLinksOutAndNeverWritesThroughLinks) {
  TempDir tmp("restore-links");
  fs::path run = tmp.path() / "run", home = tmp.path() / "home", outside = tmp.path() / "outside";
  fs::create_directories(run / "data");
  fs::create_directories(outside);
  std::ofstream(run / "data/out.txt") << "payload\n";
  workers::StoredArtifact a = workers::StoreOutputs(home.string(), "{}", run.string(), {"data"});
  fs::path entry = fs::path(a.path) / "outputs";

  for (const fs::path& evil : {fs::path("../../../../../../../" + outside.relative_path().string()),
                               outside, fs::path("x/../../..")}) {
    fs::path victim = tmp.path() / "victim-run";
    fs::remove_all(victim);
    fs::create_directories(entry / "x");
    fs::create_directory_symlink(evil, entry / "escape");
    std::ofstream(entry / "zz-after.txt") << "written after the link\n";
    EXPECT_THROW(workers::RestoreOutputs(a.path, victim.string()), std::runtime_error) << evil;
    EXPECT_TRUE(fs::is_empty(outside)) << evil;
    EXPECT_FALSE(fs::exists(victim / "data")) << "a refused entry writes nothing: " << evil;
    fs::remove(entry / "escape");
    fs::remove(entry / "zz-after.txt");
    fs::remove_all(entry / "x");
  }

  // The destination already has data -> outside (a job left it there): restore replaces the
  // link with the entry's directory instead of writing into `outside`.
  fs::path dest = tmp.path() / "run-3";
  fs::create_directories(dest);
  fs::create_directory_symlink(outside, dest / "data");
  workers::RestoreOutputs(a.path, dest.string());
  EXPECT_TRUE(fs::is_empty(outside));
  EXPECT_FALSE(fs::is_symlink(dest / "data"));
  EXPECT_EQ(ReadFile(dest / "data/out.txt"), "payload\n");
  // A file-level link too: data/out.txt -> outside/target.
  fs::remove(dest / "data/out.txt");
  fs::create_symlink(outside / "target", dest / "data/out.txt");
  workers::RestoreOutputs(a.path, dest.string());
  EXPECT_FALSE(fs::exists(outside / "target"));
  EXPECT_EQ(ReadFile(dest / "data/out.txt"), "payload\n");
  // A destination that is itself a link is refused.
  fs::path linked_dest = tmp.path() / "run-4";
  fs::create_directory_symlink(outside, linked_dest);
  EXPECT_THROW(workers::RestoreOutputs(a.path, linked_dest.string()), std::runtime_error);
  EXPECT_TRUE(fs::is_empty(outside));
}

// RemoveArtifact deletes only inside <home>/artifacts: not a path elsewhere, not one that
// climbs out with .., and a link inside the store is removed as a link, not followed.
TEST(CacheRemoval, RemoveArtifactTouchesOnlyPathsInsideTheStore) {
  TempDir tmp("removal");
  fs::path home = tmp.path() / "home", canary = tmp.path() / "canary";
  fs::create_directories(home / "artifacts/ab");
  fs::create_directories(canary);
  std::ofstream(canary / "keep") << "keep\n";
  for (const std::string& p :
       {canary.string(), (home / "artifacts/../../canary").string(), (home / "artifacts").string(),
        (home / "artifacts/").string(), std::string("canary"), std::string("/")}) {
    EXPECT_FALSE(workers::IsStorePath(home.string(), p)) << p;
    EXPECT_FALSE(workers::RemoveArtifact(home.string(), p)) << p;
  }
  fs::create_directory_symlink(canary, home / "artifacts/ab/link");
  EXPECT_TRUE(workers::RemoveArtifact(home.string(), (home / "artifacts/ab/link").string()));
  EXPECT_FALSE(fs::exists(fs::symlink_status(home / "artifacts/ab/link")));
  fs::create_directory_symlink(tmp.path(), home / "artifacts/up");
  EXPECT_FALSE(workers::RemoveArtifact(home.string(), (home / "artifacts/up/canary").string()))
      << "a parent that links out";
  EXPECT_TRUE(fs::exists(canary / "keep"));
}

// A catalog row whose path names a directory outside the store: `cache gc`, `cache verify`
// and `cache rm` leave it in place and say so.
TEST(CacheRemoval, CacheCommandsLeaveRowsPointingOutsideTheStoreAlone) {
  TempDir tmp("outside-row");
  TinyPipeline p(tmp.path());
  fs::path canary = tmp.path() / "canary";
  fs::create_directories(canary / "outputs");
  std::ofstream(canary / "done") << "x\n";
  std::ofstream(canary / "outputs/keep") << "keep\n";
  auto [run, stage] = p.Run("sec-rows");
  ASSERT_EQ(stage["state"], "succeeded");
  schema::Catalog c(TestDatabase::url());
  std::string key = schema::testing::QueryValue(
      c, "SELECT cache_key FROM trnflow.artifacts WHERE project = 'sec-rows'");
  ASSERT_EQ(key.size(), 64u);
  schema::testing::QueryValue(
      c, "UPDATE trnflow.artifacts SET path = '" + canary.string() +
             "', last_used_at = now() - interval '1 year' WHERE cache_key = '" + key +
             "' RETURNING 1");

  CliResult gc = RunTrnflow("cache gc --older-than 30d", p.env());
  EXPECT_EQ(gc.exit_code, 0) << gc.out << gc.err;
  EXPECT_NE(gc.err.find("outside the store"), std::string::npos) << gc.err;
  EXPECT_TRUE(fs::exists(canary / "outputs/keep"));

  CliResult verify = RunTrnflow("cache verify", p.env());
  EXPECT_EQ(verify.exit_code, 0) << verify.out << verify.err;
  EXPECT_NE(verify.err.find("names a path outside the store"), std::string::npos) << verify.err;
  EXPECT_TRUE(fs::exists(canary / "outputs/keep"));
  EXPECT_EQ(schema::testing::QueryValue(
                c, "SELECT count(*) FROM trnflow.artifacts WHERE cache_key = '" + key + "'"),
            "0")
      << "verify drops the row";

  for (const std::string& path :
       {canary.string(), (p.home() / "artifacts/../../canary").string(), std::string("/etc")}) {
    schema::testing::QueryValue(
        c,
        "INSERT INTO trnflow.artifacts (cache_key, state, digest, bytes, path, project) VALUES "
        "('" +
            key + "', 'ready', 'd', 10, '" + path + "', 'sec-rows') RETURNING 1");
    CliResult rm = RunTrnflow("cache rm " + key.substr(0, 12), p.env());
    EXPECT_EQ(rm.exit_code, 2) << rm.out << rm.err;
    EXPECT_NE(rm.err.find("outside the store"), std::string::npos) << rm.err;
    EXPECT_NE(rm.err.find("nothing deleted"), std::string::npos) << rm.err;
    EXPECT_TRUE(fs::exists(canary / "outputs/keep")) << path;
    EXPECT_TRUE(fs::exists("/etc/hostname") || fs::exists("/etc/passwd"));
  }
}

}  // namespace trnflow

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(
      new trnflow::testing::TestDatabase("trnflow_cache_security_test"));
  return RUN_ALL_TESTS();
}
