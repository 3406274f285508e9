// Week one, day four: a newcomer cleans up. Commands that delete preview with --dry-run, ask
// on a terminal (and only there: scripts have none), and sizes and durations are read with
// their units or refused, never guessed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "common/duration.h"
#include "common/error.h"
#include "tests/run_cli.h"
#include "tests/test_db.h"

namespace trnflow {
namespace {

using testing::CliResult;
using testing::CliHome;
using testing::RunShell;
using testing::RunTrnflow;

const auto* const kDatabase =
    ::testing::AddGlobalTestEnvironment(new testing::TestDatabase("trnflow_safe_commands_test"));

// `trnflow ARGS` on a terminal (a pseudo-terminal from script(1)), typing `input`; the same
// TRNFLOW_HOME as RunTrnflow, so both see one artifact store. Output is the terminal's, both
// streams together.
CliResult OnTerminal(const std::string& args, const std::string& input) {
  return RunShell("cd '" TRNFLOW_SOURCE_DIR "' && printf '" + input + "' | TRNFLOW_HOME='" +
                  CliHome() + "' script -qec \"'" TRNFLOW_BINARY "' " + args + "\" /dev/null");
}

nlohmann::json Json(const std::string& args) {
  CliResult r = RunTrnflow(args + " --format json");
  EXPECT_EQ(r.exit_code, 0) << args << ": " << r.err;
  return nlohmann::json::parse(r.out, nullptr, false);
}

std::vector<std::string> CacheKeys() {
  std::vector<std::string> keys;
  for (const auto& e : Json("cache ls")) keys.push_back(e["key"].get<std::string>());
  return keys;
}

bool HasBudget(const std::string& project) {
  for (const auto& b : Json("budget ls"))
    if (b["project"] == project) return true;
  return false;
}

bool HasSchedule(const std::string& name) {
  for (const auto& s : Json("schedule ls"))
    if (s["name"] == name) return true;
  return false;
}

// Three compiled graphs in the cache.
void FillCache() {
  std::string file = testing::WriteTempFile("safe-cache.yaml", R"(pipeline: safe-cache
project: safe-lab
stages:
  compile:
    kind: compile
    model: bert-large
    target: inf2
    instance: trn1.2xlarge
    matrix: {seq_len: [128, 256, 512]}
    seq_len: ${{ matrix.seq_len }}
)");
  CliResult r = RunTrnflow("run " + file + " --speed 1000000");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::filesystem::remove(file);
}

TEST(SafeCommands, SizesAndDurationsNeedTheirUnits) {
  FillCache();
  size_t before = CacheKeys().size();
  ASSERT_GE(before, 3u);
  struct Case {
    std::string args, says;
  };
  for (const Case& c : std::vector<Case>{
           {"cache gc --older-than 30", "a bare number has no unit"},
           {"cache gc --older-than 30x", "expected a duration with its unit"},
           {"cache gc --older-than 0d", "expected a duration with its unit"},
           {"cache gc --max-bytes 1.5G", "expected a size like"},
           {"cache gc --max-bytes -1", "expected a size like"},
           {"spend --since 7", "expected a date like 2026-11-01 or a time ago with its unit"},
           {"spend --until yesterday", "expected a date"},
           {"worker --pool inf1=1 --lease 15x", "--lease 15x: expected a duration"},
           {"worker --pool inf1=1 --lease 0.5s", "must be from 1s to 1h"},
           {"worker --pool inf1=1 --lease 2h", "must be from 1s to 1h"},
           {"run examples/climate/pipeline.yaml --job-limits as=16Q", "job limit 'as=16Q'"},
       }) {
    CliResult r = RunTrnflow(c.args, "timeout 30");
    EXPECT_EQ(r.exit_code, kExitBadInput) << c.args << ": " << r.out << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << c.args << ": " << r.err;
  }
  EXPECT_EQ(CacheKeys().size(), before) << "a refused size or duration removes nothing";
  EXPECT_EQ(Json("runs").size(), 1u) << "a refused --job-limits submits nothing";
  for (const char* ok :
       {"spend --since 7d", "spend --since 2w --until 1d", "spend --since 2026-11-01",
        "cache gc --older-than 30d --dry-run", "cache gc --older-than 2w --dry-run",
        "cache gc --max-bytes 1TB --dry-run", "cache gc --max-bytes 50GiB --dry-run"}) {
    CliResult r = RunTrnflow(ok);
    EXPECT_EQ(r.exit_code, kExitOk) << ok << ": " << r.err;
  }
  // A lease with its unit starts a worker (it runs until `timeout` stops it).
  CliResult worker = RunTrnflow("worker --pool inf1=1 --lease 2s", "timeout 3");
  EXPECT_EQ(worker.exit_code, 124) << worker.err;
  CliResult bare = RunTrnflow("worker --pool inf1=1 --lease 15", "timeout 3");
  EXPECT_EQ(bare.exit_code, 124) << "a bare --lease is seconds, as it always was: " << bare.err;
}

TEST(SafeCommands, DryRunRemovesNothing) {
  FillCache();
  auto keys = CacheKeys();
  ASSERT_GE(keys.size(), 3u);
  // cache rm
  CliResult r = RunTrnflow("cache rm " + keys[0].substr(0, 12) + " --dry-run");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("would remove " + keys[0]), std::string::npos) << r.out;
  EXPECT_EQ(CacheKeys(), keys);
  // cache gc
  auto gc = Json("cache gc --max-bytes 0 --dry-run");
  EXPECT_EQ(gc["dry_run"], true);
  EXPECT_EQ(gc["removed"].size(), keys.size());
  EXPECT_EQ(gc["bytes_left"], 0);
  EXPECT_EQ(CacheKeys(), keys);
  // cache verify: a corrupt entry is found, and stays until verify runs without --dry-run.
  auto shown = Json("cache show " + keys[1]);
  std::filesystem::path dir = shown["path"].get<std::string>();
  ASSERT_TRUE(std::filesystem::exists(dir / "model.neff")) << dir;
  std::ofstream(dir / "model.neff", std::ios::app) << "bit rot";
  auto verify = Json("cache verify --dry-run");
  ASSERT_EQ(verify["corrupt"].size(), 1u) << verify;
  EXPECT_EQ(verify["corrupt"][0]["key"], keys[1]);
  EXPECT_EQ(verify["corrupt"][0]["dropped"], false);
  EXPECT_EQ(CacheKeys(), keys);
  EXPECT_TRUE(std::filesystem::exists(dir));
  // Without a terminal there is no prompt: the command line is the decision.
  r = RunTrnflow("cache verify", "</dev/null");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("[y/N]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 corrupt entries dropped"), std::string::npos) << r.out;
  auto after = CacheKeys();
  EXPECT_EQ(after.size(), keys.size() - 1);
  EXPECT_EQ(std::find(after.begin(), after.end(), keys[1]), after.end());
  EXPECT_FALSE(std::filesystem::exists(dir));
  // budget rm and schedule rm
  RunTrnflow("project add safe-lab");  // the runs above may have made it already
  ASSERT_EQ(RunTrnflow("budget set safe-lab 100").exit_code, 0);
  r = RunTrnflow("budget rm safe-lab --dry-run");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("would remove project safe-lab's budget ($100.00 per month)"),
            std::string::npos)
      << r.out;
  EXPECT_TRUE(HasBudget("safe-lab"));
  ASSERT_EQ(RunTrnflow("schedule add safe-nightly examples/nightly-precompile/pipeline.yaml "
                       "--cron '0 2 * * *'")
                .exit_code,
            0);
  r = RunTrnflow("schedule rm safe-nightly --dry-run");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("would remove schedule safe-nightly"), std::string::npos) << r.out;
  EXPECT_TRUE(HasSchedule("safe-nightly"));
  EXPECT_EQ(RunTrnflow("schedule rm safe-nightly").exit_code, 0);
  EXPECT_FALSE(HasSchedule("safe-nightly"));
  EXPECT_EQ(RunTrnflow("budget rm safe-lab").exit_code, 0);
  EXPECT_FALSE(HasBudget("safe-lab"));
}

TEST(SafeCommands, OnATerminalDeletingAsksFirst) {
  FillCache();
  auto keys = CacheKeys();
  ASSERT_FALSE(keys.empty());
  // "n" (or anything but y/yes) removes nothing and exits 1.
  CliResult no = OnTerminal("cache rm " + keys[0], "n\\n");
  EXPECT_NE(no.out.find("[y/N]"), std::string::npos) << no.out;
  EXPECT_NE(no.out.find("cancelled: nothing was removed"), std::string::npos) << no.out;
  EXPECT_EQ(no.exit_code, kExitRunFailed);
  EXPECT_EQ(CacheKeys(), keys);
  CliResult gc_no = OnTerminal("cache gc --max-bytes 0", "\\n");
  EXPECT_NE(gc_no.out.find("remove " + std::to_string(keys.size()) + " cache entries"),
            std::string::npos)
      << gc_no.out;
  EXPECT_EQ(gc_no.exit_code, kExitRunFailed);
  EXPECT_EQ(CacheKeys(), keys);
  // "y" removes.
  CliResult yes = OnTerminal("cache rm " + keys[0], "y\\n");
  EXPECT_EQ(yes.exit_code, 0) << yes.out;
  EXPECT_NE(yes.out.find("removed " + keys[0]), std::string::npos) << yes.out;
  EXPECT_EQ(CacheKeys().size(), keys.size() - 1);
  // --yes does not ask.
  ASSERT_EQ(RunTrnflow("project add safe-tty").exit_code, 0);
  ASSERT_EQ(RunTrnflow("budget set safe-tty 50").exit_code, 0);
  CliResult budget_no = OnTerminal("budget rm safe-tty", "no\\n");
  EXPECT_NE(budget_no.out.find("remove project safe-tty's budget ($50.00 per month)? [y/N]"),
            std::string::npos)
      << budget_no.out;
  EXPECT_TRUE(HasBudget("safe-tty"));
  CliResult budget_yes = OnTerminal("budget rm safe-tty --yes", "");
  EXPECT_EQ(budget_yes.exit_code, 0) << budget_yes.out;
  EXPECT_EQ(budget_yes.out.find("[y/N]"), std::string::npos) << budget_yes.out;
  EXPECT_FALSE(HasBudget("safe-tty"));
  ASSERT_EQ(RunTrnflow("schedule add tty-nightly examples/nightly-precompile/pipeline.yaml "
                       "--cron '0 2 * * *'")
                .exit_code,
            0);
  CliResult sched_no = OnTerminal("schedule rm tty-nightly", "n\\n");
  EXPECT_NE(sched_no.out.find("[y/N]"), std::string::npos) << sched_no.out;
  EXPECT_TRUE(HasSchedule("tty-nightly"));
  CliResult sched_y = OnTerminal("schedule rm tty-nightly -y", "");
  EXPECT_EQ(sched_y.exit_code, 0) << sched_y.out;
  EXPECT_FALSE(HasSchedule("tty-nightly"));
  // --dry-run on a terminal neither asks nor removes.
  CliResult dry = OnTerminal("cache gc --max-bytes 0 --dry-run", "");
  EXPECT_EQ(dry.exit_code, 0) << dry.out;
  EXPECT_EQ(dry.out.find("[y/N]"), std::string::npos) << dry.out;
  EXPECT_EQ(CacheKeys().size(), keys.size() - 1);
}

// Durations in messages read as they are written in files ("timed out after 2s"), and read
// back to the same value.
TEST(SafeCommands, DurationsPrintAsTheyAreWritten) {
  EXPECT_EQ(FormatDuration(2), "2s");
  EXPECT_EQ(FormatDuration(0.5), "0.5s");
  EXPECT_EQ(FormatDuration(90), "1m30s");
  EXPECT_EQ(FormatDuration(7200), "2h");
  EXPECT_EQ(FormatDuration(93784), "1d2h3m4s");
  EXPECT_EQ(FormatDuration(0), "0s");
  for (double s : {1.0, 2.5, 59.0, 60.0, 61.0, 3600.0, 86400.0, 31536000.0})
    EXPECT_EQ(ParseDuration(FormatDuration(s)), s) << FormatDuration(s);
}

}  // namespace
}  // namespace trnflow
