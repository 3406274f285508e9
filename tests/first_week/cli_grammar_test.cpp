// Week one, day three: a newcomer scripts against trnflow. Every command that prints data
// takes --format json (the list comes from the binary's own --help, so a new command without
// it fails here), its JSON parses and follows one set of rules (ids as strings, null never "",
// numbers as numbers), typos get the closest name, and the exit codes mean the same thing
// everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "tests/daemon.h"
#include "tests/run_cli.h"
#include "tests/test_db.h"

namespace trnflow {
namespace {

using testing::CliResult;
using testing::RunTrnflow;

const auto* const kDatabase =
    ::testing::AddGlobalTestEnvironment(new testing::TestDatabase("trnflow_grammar_test"));

// The commands of `trnflow PREFIX --help`, recursively: "runs", "cache ls", "db migrate".
std::vector<std::string> LeafCommands(const std::string& prefix = "") {
  CliResult help = RunTrnflow(prefix + " --help");
  EXPECT_EQ(help.exit_code, 0) << prefix << help.err;
  std::vector<std::string> out;
  size_t at = help.out.find("\nSubcommands:\n");
  if (at == std::string::npos) return out;
  std::istringstream in(help.out.substr(at + 14));
  std::string line;
  static const std::regex entry(R"(^  ([a-z][a-z0-9-]*)\s)");
  std::smatch m;
  while (std::getline(in, line)) {
    if (line.empty()) break;
    if (!std::regex_search(line, m, entry)) continue;
    std::string cmd = prefix.empty() ? m[1].str() : prefix + " " + m[1].str();
    auto sub = LeafCommands(cmd);
    if (sub.empty())
      out.push_back(cmd);
    else
      out.insert(out.end(), sub.begin(), sub.end());
  }
  return out;
}

const std::vector<std::string>& Commands() {
  static const std::vector<std::string> commands = LeafCommands();
  return commands;
}

// Commands that only act or are daemons: they print one line of what they did, or logs.
// `serve` is a daemon too: what it serves over HTTP is the JSON of the commands walked here
// (tests/serve checks /api against their --format json).
const std::set<std::string> kNoData = {
    "cancel",        "resume",          "retry",          "db migrate",      "worker",
    "scheduler",     "schedule add",    "schedule pause", "schedule resume", "schedule rm",
    "cache rm",      "cache untrust",   "budget set",     "budget rm",       "project add",
    "project grant", "schedule update", "serve",          "db drop",         "workers forget",
    "db archive",    "project update"};

// Every "" in `j` (a value that should have been null), as JSON pointers; and values that
// break the rules by key: ids must be strings, dollars numbers.
void CheckRules(const nlohmann::json& j, const std::string& where, const std::string& path = "") {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& k = it.key();
      const auto& v = it.value();
      std::string p = path + "/" + k;
      if (k == "run_id" || (k.size() > 3 && k.substr(k.size() - 3) == "_id")) {
        EXPECT_TRUE(v.is_string() || v.is_null()) << where << p << " is an id: a string, not " << v;
      }
      if (k.size() > 4 && k.substr(k.size() - 4) == "_usd") {
        EXPECT_TRUE(v.is_number() || v.is_null())
            << where << p << " is dollars: a number, not " << v;
      }
      CheckRules(v, where, p);
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) CheckRules(j[i], where, path + "/" + std::to_string(i));
  } else if (j.is_string()) {
    EXPECT_FALSE(j.get<std::string>().empty()) << where << path << " is \"\"; absent is null";
  }
}

nlohmann::json ParseJson(const CliResult& r, const std::string& cmd) {
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << "`trnflow " << cmd << "` printed no JSON on stdout:\n"
                                 << r.out.substr(0, 2000) << "\nstderr:\n"
                                 << r.err.substr(0, 2000);
  return j;
}

// One finished climate run, a budget, a project, a schedule and a trust pair: something for
// every command to print.
struct Fixture {
  std::string run_id;
  std::string cache_key;
};

const Fixture& Data() {
  static const Fixture f = [] {
    Fixture f;
    // At its own (demo) spot rate the climate run is interrupted once: `events` has something.
    CliResult run = RunTrnflow("run examples/climate/pipeline.yaml --speed 200000 --format json");
    EXPECT_EQ(run.exit_code, 0) << run.err;
    auto j = ParseJson(run, "run --format json");
    if (j.is_object() && j.contains("run")) f.run_id = j["run"]["run_id"].get<std::string>();
    EXPECT_EQ(RunTrnflow("project add grammar-lab").exit_code, 0);
    EXPECT_EQ(RunTrnflow("budget set climate-lab 100000").exit_code, 0);
    EXPECT_EQ(RunTrnflow("cache trust grammar-lab climate-lab").exit_code, 0);
    EXPECT_EQ(RunTrnflow("schedule add nightly examples/nightly-precompile/pipeline.yaml "
                         "--cron '0 2 * * *' --tz Europe/Berlin")
                  .exit_code,
              0);
    // One for `schedule run` to fire (nightly keeps no last run).
    EXPECT_EQ(RunTrnflow("schedule add tryme examples/nightly-precompile/pipeline.yaml "
                         "--cron '0 3 * * *'")
                  .exit_code,
              0);
    auto cache = nlohmann::json::parse(RunTrnflow("cache ls --format json").out, nullptr, false);
    if (cache.is_array() && !cache.empty()) f.cache_key = cache[0]["key"].get<std::string>();
    return f;
  }();
  return f;
}

// What each command needs to print something; a new command with --format that needs
// arguments must be added here (the walk fails and says so).
std::map<std::string, std::string> ArgsFor(const Fixture& f) {
  return {
      {"run", "examples/cached-stages/pipeline.yaml --speed 1000000"},
      {"submit", "examples/climate/pipeline.yaml --force --project grammar-lab"},
      {"validate", "examples/climate/pipeline.yaml tests/broken/09-unknown-stage-field.yaml"},
      {"plan", "examples/climate/pipeline.yaml"},
      {"show", f.run_id},
      {"watch", f.run_id},
      {"logs", f.run_id},
      {"spend", "--by project,stage,run"},
      {"cache show", f.cache_key},
      {"cache why", f.run_id + " 'compile[batch=1,seq_len=512]'"},
      {"cache gc", "--max-bytes 1TB --dry-run"},
      {"cache verify", "--dry-run"},
      {"cache trust", "--list"},
      {"explain", f.run_id + " evaluate"},
      {"schedule show", "nightly"},
      {"schedule run", "tryme"},
  };
}

TEST(CliGrammar, EveryCommandThatPrintsDataTakesFormat) {
  const auto& commands = Commands();
  ASSERT_GT(commands.size(), 30u) << "the walk of --help found too few commands";
  for (const auto& no_data : kNoData)
    EXPECT_NE(std::find(commands.begin(), commands.end(), no_data), commands.end())
        << "`" << no_data << "` is listed as printing no data but is not a command any more";
  for (const auto& cmd : commands) {
    if (kNoData.count(cmd)) continue;
    CliResult help = RunTrnflow(cmd + " --help");
    EXPECT_NE(help.out.find("--format"), std::string::npos)
        << "`trnflow " << cmd << "` prints data but takes no --format (docs/cli.md)";
    EXPECT_NE(help.out.find("json"), std::string::npos) << cmd;
  }
  for (const char* required : {"models", "logs", "validate", "schedule ls", "cache ls",
                               "cache show", "cache why", "project ls", "run", "watch"})
    EXPECT_NE(std::find(commands.begin(), commands.end(), required), commands.end()) << required;
}

TEST(CliGrammar, EveryJsonOutputParsesAndFollowsTheRules) {
  const Fixture& f = Data();
  ASSERT_FALSE(f.run_id.empty());
  ASSERT_FALSE(f.cache_key.empty());
  auto args = ArgsFor(f);
  // A live worker for `workers`, in a pool nothing here uses (it never runs a stage); stopped
  // before the database is dropped.
  trnflow::testing::Daemon worker("grammar-worker", {"worker", "--pool", "gpu=1"});
  worker.Start();
  ASSERT_TRUE(trnflow::testing::WaitFor(
      [] { return RunTrnflow("workers --format json").out.find("\"gpu\"") != std::string::npos; },
      30));
  int walked = 0;
  for (const auto& cmd : Commands()) {
    if (kNoData.count(cmd)) continue;
    std::string line = cmd + " " + (args.count(cmd) ? args[cmd] : "") + " --format json";
    CliResult r = RunTrnflow(line, cmd == "run" ? "TRNFLOW_SPOT_RATE_MULTIPLIER=0" : "");
    int want = cmd == "validate" ? kExitBadInput : kExitOk;  // one of its files is broken
    EXPECT_EQ(r.exit_code, want) << "`trnflow " << line << "`: " << r.err
                                 << "\n(a new command? give it arguments in ArgsFor)";
    auto j = ParseJson(r, line);
    if (j.is_discarded()) continue;
    EXPECT_TRUE(j.is_object() || j.is_array()) << line;
    EXPECT_FALSE(j.empty()) << "`trnflow " << line << "` printed nothing to check";
    CheckRules(j, "`trnflow " + line + "`: ");
    ++walked;
    if (cmd == "submit") {  // never executed (no daemons): cancel it
      ASSERT_TRUE(j["run_id"].is_string());
      EXPECT_EQ(RunTrnflow("cancel " + j["run_id"].get<std::string>()).exit_code, 0);
    }
  }
  EXPECT_GE(walked, 20);
  worker.Kill(SIGTERM);
}

TEST(CliGrammar, JsonSaysWhatTheTablesSay) {
  const Fixture& f = Data();
  // run --format json is show --format json of the finished run.
  auto show = ParseJson(RunTrnflow("show " + f.run_id + " --format json"), "show");
  auto watch = ParseJson(RunTrnflow("watch " + f.run_id + " --format json"), "watch");
  EXPECT_EQ(show, watch);
  EXPECT_EQ(show["run"]["state"], "succeeded");
  ASSERT_EQ(show["stages"].size(), 10u);
  EXPECT_TRUE(show["run"]["cancel_reason"].is_null());
  // validate: the broken file's diagnostic with its place and hint.
  auto v = ParseJson(
      RunTrnflow("validate examples/climate/pipeline.yaml tests/broken/09-unknown-stage-field.yaml "
                 "--format json"),
      "validate");
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0]["ok"], true);
  EXPECT_EQ(v[0]["stages"], 10);
  EXPECT_EQ(v[1]["ok"], false);
  EXPECT_TRUE(v[1]["stages"].is_null());
  ASSERT_FALSE(v[1]["diagnostics"].empty());
  const auto& d = v[1]["diagnostics"][0];
  EXPECT_EQ(d["severity"], "error");
  EXPECT_TRUE(d["line"].is_number_integer() && d["line"].get<int>() > 0) << d;
  EXPECT_TRUE(d["col"].is_number_integer()) << d;
  EXPECT_NE(d["message"].get<std::string>().find("unknown field"), std::string::npos) << d;
  // logs: the real scripts' output, per stage and attempt.
  auto logs = ParseJson(RunTrnflow("logs " + f.run_id + " evaluate --format json"), "logs");
  ASSERT_EQ(logs.size(), 1u);
  EXPECT_EQ(logs[0]["stage"], "evaluate");
  EXPECT_EQ(logs[0]["attempt"], 1);
  EXPECT_NE(logs[0]["text"].get<std::string>().find("evaluated"), std::string::npos);
  // models: what the parser accepts as model: names.
  auto models = ParseJson(RunTrnflow("models --format json"), "models");
  std::set<std::string> names;
  for (const auto& m : models) names.insert(m["name"].get<std::string>());
  for (const char* name : {"llama-2-7b", "llama-2-70b", "bert-large", "climate-emulator-1b"})
    EXPECT_TRUE(names.count(name)) << name;
  EXPECT_EQ(models[0]["parameters"].type(), nlohmann::json::value_t::number_float);
  // schedule ls: the next slot and no last run yet.
  auto sched = ParseJson(RunTrnflow("schedule ls --format json"), "schedule ls");
  ASSERT_EQ(sched.size(), 2u);
  EXPECT_EQ(sched[0]["name"], "nightly");
  EXPECT_TRUE(sched[0]["last_run_id"].is_null());
  EXPECT_TRUE(std::regex_match(sched[0]["next_at"].get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\dZ)")))
      << sched[0];
  // cache why: a miss names its differences as values, not strings of JSON.
  auto why = ParseJson(
      RunTrnflow("cache why " + f.run_id + " 'compile[batch=1,seq_len=512]' --format json"),
      "cache why");
  EXPECT_EQ(why["run_id"], f.run_id);
  EXPECT_EQ(why["cached"], true) << why;
}

TEST(CliGrammar, UnknownCommandsAndOptionsGetTheClosestName) {
  CliResult r = RunTrnflow("rnus");
  EXPECT_EQ(r.exit_code, kExitBadInput);
  EXPECT_NE(r.err.find("unknown command 'rnus'; did you mean `runs`?"), std::string::npos) << r.err;
  r = RunTrnflow("cache lss");
  EXPECT_EQ(r.exit_code, kExitBadInput);
  EXPECT_NE(r.err.find("did you mean `cache ls`?"), std::string::npos) << r.err;
  r = RunTrnflow("runs --fromat json");
  EXPECT_EQ(r.exit_code, kExitBadInput);
  EXPECT_NE(r.err.find("did you mean `--format`?"), std::string::npos) << r.err;
  r = RunTrnflow("--log-level warn shwo 1");
  EXPECT_EQ(r.exit_code, kExitBadInput);
  EXPECT_NE(r.err.find("did you mean `show`?"), std::string::npos) << r.err;
  r = RunTrnflow("xyzzy");
  EXPECT_EQ(r.exit_code, kExitBadInput);
  EXPECT_NE(r.err.find("the commands: run, submit"), std::string::npos) << r.err;
  EXPECT_EQ(RunTrnflow("--help").exit_code, kExitOk);
  EXPECT_EQ(RunTrnflow("cache --help").exit_code, kExitOk);
}

TEST(CliGrammar, NamesGetTheClosestNameAndExitTwo) {
  const Fixture& f = Data();
  struct Case {
    std::string args, hint;
  };
  for (const Case& c : std::vector<Case>{
           {"show " + f.run_id + " --stage trian", "did you mean 'train'?"},
           {"logs " + f.run_id + " evalute", "did you mean 'evaluate'?"},
           {"logs " + f.run_id + " nosuchstage", "has no stage 'nosuchstage'"},
           {"retry " + f.run_id + " trian", "did you mean 'train'?"},
           {"cache why " + f.run_id + " trian", "did you mean 'train'?"},
           {"schedule rm nightyl", "did you mean 'nightly'?"},
           {"schedule pause nightyl", "did you mean 'nightly'?"},
           {"budget rm climate-lba", "did you mean 'climate-lab'?"},
           {"budget set climate-lba 10", "did you mean 'climate-lab'?"},
           {"runs --project climate-lba", "did you mean 'climate-lab'?"},
           {"spend --project climate-lba", "did you mean 'climate-lab'?"},
           {"show 999999", "no run 999999"},
           {"show nonsense", "is not a run id"},
       }) {
    CliResult r = RunTrnflow(c.args);
    EXPECT_EQ(r.exit_code, kExitBadInput) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.hint), std::string::npos) << c.args << ": " << r.err;
  }
  // Nothing happened on the way: the run is as it was, the schedule and budget are there.
  auto show = ParseJson(RunTrnflow("show " + f.run_id + " --format json"), "show");
  EXPECT_EQ(show["run"]["state"], "succeeded");
  EXPECT_NE(RunTrnflow("schedule ls").out.find("nightly"), std::string::npos);
  EXPECT_NE(RunTrnflow("budget ls").out.find("climate-lab"), std::string::npos);
  // A matrix stage by its name in the file: every expansion.
  auto compile = ParseJson(RunTrnflow("show " + f.run_id + " --stage compile --format json"),
                           "show --stage compile");
  EXPECT_EQ(compile["stages"].size(), 6u);
}

// Without a reachable catalog every command that needs one exits 3, naming the URL without
// its password; those that need none still work.
TEST(CliGrammar, EveryCommandExitsThreeWithoutTheCatalog) {
  const std::string env =
      "TRNFLOW_DATABASE_URL=postgresql://someone:hunter2@127.0.0.1:1/trnflow "
      "TRNFLOW_ADMIN_DATABASE_URL=postgresql://someone:hunter2@127.0.0.1:1/trnflow timeout 60";
  const std::map<std::string, std::string> args = {
      {"run", "examples/climate/pipeline.yaml"},
      {"submit", "examples/climate/pipeline.yaml"},
      {"validate", "examples/climate/pipeline.yaml"},
      {"plan", "examples/climate/pipeline.yaml"},
      {"show", "1"},
      {"watch", "1"},
      {"cancel", "1"},
      {"resume", "1"},
      {"retry", "1 train"},
      {"logs", "1"},
      {"budget set", "climate-lab 10"},
      {"budget rm", "climate-lab"},
      {"project add", "x"},
      {"project update", "x --weight 2"},
      {"project grant", "x someone --read"},
      {"schedule add", "n examples/climate/pipeline.yaml --cron '0 2 * * *'"},
      {"schedule pause", "n"},
      {"schedule show", "n"},
      {"schedule update", "n"},
      {"explain", "1 train"},
      {"schedule resume", "n"},
      {"schedule run", "n"},
      {"schedule rm", "n"},
      {"cache show", "abcdef"},
      {"cache rm", "abcdef"},
      {"cache gc", "--older-than 30d"},
      {"cache why", "1 train"},
      {"cache trust", "a b"},
      {"cache untrust", "a b"},
      {"worker", "--pool cpu=1"},
      {"db archive", "--month 2025-11 --dry-run"},
  };
  const std::set<std::string> offline = {"validate", "plan", "instances", "models"};
  for (const auto& cmd : Commands()) {
    auto it = args.find(cmd);
    CliResult r = RunTrnflow(cmd + " " + (it == args.end() ? "" : it->second), env);
    int want = offline.count(cmd) ? kExitOk : kExitNoCatalog;
    EXPECT_EQ(r.exit_code, want) << "`trnflow " << cmd << "`: " << r.err;
    if (want == kExitNoCatalog) {
      EXPECT_NE(r.err.find("127.0.0.1:1"), std::string::npos) << cmd << ": " << r.err;
      EXPECT_EQ(r.err.find("hunter2"), std::string::npos) << cmd << ": " << r.err;
    }
  }
}

// The exit codes are documented in one table, and it lists exactly the codes the binary has.
TEST(CliGrammar, TheExitCodesAreOneTable) {
  std::ifstream in(std::string(TRNFLOW_SOURCE_DIR) + "/docs/cli.md");
  std::string doc{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  size_t at = doc.find("\n## Exit codes\n");
  ASSERT_NE(at, std::string::npos);
  std::set<int> documented;
  static const std::regex row(R"(\n\| (\d+) \|)");
  std::string section = doc.substr(at, doc.find("\n## ", at + 1) - at);
  for (auto it = std::sregex_iterator(section.begin(), section.end(), row);
       it != std::sregex_iterator(); ++it)
    documented.insert(std::stoi((*it)[1]));
  EXPECT_EQ(documented, (std::set<int>{kExitOk, kExitRunFailed, kExitBadInput, kExitNoCatalog,
                                       kExitPermissionDenied, kExitInterrupted}));
  std::ifstream readme_in(std::string(TRNFLOW_SOURCE_DIR) + "/README.md");
  std::string readme{std::istreambuf_iterator<char>(readme_in), std::istreambuf_iterator<char>()};
  EXPECT_NE(readme.find("docs/cli.md#exit-codes"), std::string::npos);
}

// Numbers in messages read as people write them: no "2.000000".
TEST(CliGrammar, NumbersInMessagesReadAsWritten) {
  CliResult r = RunTrnflow("run examples/climate/pipeline.yaml --speed 0");
  EXPECT_EQ(r.exit_code, kExitBadInput);
  EXPECT_NE(r.err.find("from 0.001 to 1000000000"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(".000000"), std::string::npos) << r.err;
  // A command past its timeout says how long, as the file wrote it.
  std::string file = testing::WriteTempFile("timeout.yaml", R"(pipeline: timeout-words
project: grammar-lab
stages:
  slow:
    run: ["sleep", "30"]
    timeout: 2s
)");
  r = RunTrnflow("run " + file + " --speed 1 --format json");
  EXPECT_EQ(r.exit_code, kExitRunFailed) << r.err;
  auto j = ParseJson(r, "run (timeout)");
  ASSERT_EQ(j["stages"].size(), 1u);
  const auto& a = j["stages"][0]["attempts"][0];
  EXPECT_EQ(a["outcome"], "timeout");
  EXPECT_EQ(a["message"].get<std::string>().rfind("timed out after 2s (simulated)", 0), 0u) << a;
  std::filesystem::remove(file);
}

}  // namespace
}  // namespace trnflow
