// The `trnflow` binary as a user runs it: real child processes, a real catalog.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "schema/catalog.h"
#include "schema/catalog_testing.h"
#include "tests/run_cli.h"
#include "tests/test_db.h"

namespace trnflow {
namespace {

using testing::TestDatabase;

using Result = testing::CliResult;

Result Trnflow(const std::string& args, const std::string& env = "") {
  return testing::RunTrnflow(args, env);
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  return testing::WriteTempFile(name, text);
}

int64_t RunIdFrom(const std::string& out) {
  std::smatch m;
  std::regex re(R"(^run (\d+): )");
  EXPECT_TRUE(std::regex_search(out, m, re)) << out;
  return std::stoll(m[1]);
}

}  // namespace

TEST(Cli, ClimateRunSucceedsAndEveryTotalAgrees) {
  // A calm spot market: every stage should take exactly one attempt.
  Result r = Trnflow("run examples/climate/pipeline.yaml --speed 1000000",
                     "TRNFLOW_SPOT_RATE_MULTIPLIER=0");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  int64_t run = RunIdFrom(r.out);
  // The printed total...
  std::smatch m;
  std::regex total_re(R"(\ntotal\s+(\$[0-9.]+)\n)");
  ASSERT_TRUE(std::regex_search(r.out, m, total_re)) << r.out;
  std::string printed = m[1];
  // ... equals the ledger's sum, to the cent...
  schema::Catalog c(TestDatabase::url());
  std::string sql_sum = schema::testing::QueryValue(
      c, "SELECT '$' || round(sum(cost_usd), 2)::text FROM trnflow.attempt_ledger WHERE run_id = " +
             std::to_string(run));
  EXPECT_EQ(printed, sql_sum);
  EXPECT_NE(printed, "$0.00");
  // ... and the views agree with the ledger to the micro-dollar.
  EXPECT_EQ(
      schema::testing::QueryValue(
          c, "SELECT cost_usd::text FROM trnflow.run_status WHERE run_id = " + std::to_string(run)),
      schema::testing::QueryValue(
          c, "SELECT sum(cost_usd)::text FROM trnflow.attempt_ledger WHERE run_id = " +
                 std::to_string(run)));
  // All ten stages succeeded with exactly one attempt each.
  Result show = Trnflow("show " + std::to_string(run) + " --format json");
  ASSERT_EQ(show.exit_code, 0) << show.err;
  auto j = nlohmann::json::parse(show.out);
  EXPECT_EQ(j["run"]["state"], "succeeded");
  ASSERT_EQ(j["stages"].size(), 10u);
  for (const auto& s : j["stages"]) {
    EXPECT_EQ(s["state"], "succeeded") << s.dump();
    ASSERT_EQ(s["attempts"].size(), 1u) << s.dump();
    EXPECT_EQ(s["attempts"][0]["outcome"], "succeeded");
  }
  // The real scripts ran and wrote their outputs.
  Result logs = Trnflow("logs " + std::to_string(run) + " evaluate");
  EXPECT_NE(logs.out.find("evaluated"), std::string::npos) << logs.out;
  Result runs = Trnflow("runs --format json --project climate-lab");
  ASSERT_EQ(runs.exit_code, 0);
  EXPECT_NE(runs.out.find("\"run_id\": \"" + std::to_string(run) + "\""), std::string::npos);
}

// At its own (demo) spot rate and the default seed, the climate example survives an
// interruption of its training stage and still succeeds.
TEST(Cli, ClimateRunSurvivesASpotInterruptionAtTheDefaultSeed) {
  Result r = Trnflow("run examples/climate/pipeline.yaml --speed 200000");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto j = nlohmann::json::parse(
      Trnflow("show " + std::to_string(RunIdFrom(r.out)) + " --stage train --format json").out);
  EXPECT_EQ(j["run"]["state"], "succeeded");
  ASSERT_EQ(j["stages"].size(), 1u);
  const auto& attempts = j["stages"][0]["attempts"];
  ASSERT_GE(attempts.size(), 2u);
  EXPECT_EQ(attempts[0]["outcome"], "spot_interruption");
  EXPECT_GT(attempts[0]["progress_to"].get<double>(), 0.5) << "resumes from its checkpoint";
  EXPECT_EQ(attempts[1]["progress_from"], attempts[0]["progress_to"]);
  EXPECT_EQ(attempts.back()["outcome"], "succeeded");
}

TEST(Cli, BudgetAdmissionRefusesWithTheNumbersUnlessForced) {
  Result unknown = Trnflow("budget set tight 10");
  EXPECT_EQ(unknown.exit_code, 2) << "a budget for a project that does not exist guards nothing";
  EXPECT_NE(unknown.err.find("there is no project 'tight'"), std::string::npos) << unknown.err;
  ASSERT_EQ(Trnflow("project add tight").exit_code, 0);
  ASSERT_EQ(Trnflow("budget set tight 10").exit_code, 0);
  schema::Catalog c(TestDatabase::url());
  std::string before = schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.runs");
  Result r = Trnflow("run examples/climate/pipeline.yaml --project tight");
  EXPECT_EQ(r.exit_code, 4) << "refused, not bad input (docs/cli.md#exit-codes): " << r.out
                            << r.err;
  EXPECT_NE(r.err.find("trnflow: refused: the plan estimates"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("project tight has $10.00 left of its month budget of $10.00"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("--force"), std::string::npos);
  EXPECT_EQ(schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.runs"), before);
  Result forced =
      Trnflow("submit examples/climate/pipeline.yaml --project tight --force --format json");
  EXPECT_EQ(forced.exit_code, 0) << forced.err;
  EXPECT_NE(forced.out.find("run_id"), std::string::npos);
  Result ls = Trnflow("budget ls --format json");
  EXPECT_NE(ls.out.find("\"project\": \"tight\""), std::string::npos) << ls.out;
  // The forced run never started (no daemons here): cancel it so nothing lingers.
  EXPECT_EQ(
      Trnflow("cancel " + nlohmann::json::parse(forced.out)["run_id"].get<std::string>()).exit_code,
      0);
  EXPECT_EQ(Trnflow("budget rm tight").exit_code, 0);
  EXPECT_EQ(Trnflow("budget ls --format json").out.find("\"tight\""), std::string::npos);
  EXPECT_EQ(Trnflow("budget rm tight").exit_code, 2) << "nothing left to remove";
}

TEST(Cli, SpendEqualsTheViewsToTheCent) {
  Result run = Trnflow("run examples/climate/pipeline.yaml --project spend-check --speed 1000000",
                       "TRNFLOW_SPOT_RATE_MULTIPLIER=0");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  Result r = Trnflow("spend --project spend-check --by stage --format json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  schema::Catalog c(TestDatabase::url());
  auto rows = nlohmann::json::parse(r.out);
  ASSERT_EQ(rows.size(), 10u);
  for (const auto& row : rows) {
    std::string view = schema::testing::QueryValue(
        c,
        "SELECT round(cost_usd, 2)::text FROM trnflow.spend_by_stage WHERE project = "
        "'spend-check' AND stage = '" +
            row["stage"].get<std::string>() + "'");
    char mine[32];
    std::snprintf(mine, sizeof mine, "%.2f", row["cost_usd"].get<double>());
    EXPECT_EQ(view, mine) << row.dump();
  }
  Result csv = Trnflow("spend --project spend-check --by month,market --format csv");
  EXPECT_EQ(csv.out.rfind("month,market,attempts,billed_hours,cost_usd,wasted_usd,saved_usd\n", 0),
            0u)
      << csv.out;
  EXPECT_EQ(Trnflow("spend --by colour").exit_code, 2);
  EXPECT_EQ(Trnflow("spend --since yesterday").exit_code, 2);
}

// Precompile overnight, and the climate pipeline's compile stages are all cache hits.
TEST(Cli, NightlyPrecompileMakesTheClimateCompilesCacheHits) {
  std::string home = "TRNFLOW_HOME=" + testing::WriteTempFile("cache-home", "") + ".d";
  Result nightly = Trnflow("run examples/nightly-precompile/pipeline.yaml --speed 1000000",
                           "TRNFLOW_SPOT_RATE_MULTIPLIER=0 " + home);
  ASSERT_EQ(nightly.exit_code, 0) << nightly.out << nightly.err;
  Result ls = Trnflow("cache ls", home);
  EXPECT_NE(ls.out.find("24 entries"), std::string::npos) << ls.out;
  Result plan = Trnflow("plan examples/climate/pipeline.yaml --format json", home);
  auto j = nlohmann::json::parse(plan.out);
  for (const auto& s : j["stages"])
    if (s["kind"] == "compile") {
      EXPECT_TRUE(s["cached"].get<bool>()) << s.dump();
      EXPECT_EQ(s["cost_usd"].get<double>(), 0.0);
    }
  Result climate = Trnflow("run examples/climate/pipeline.yaml --speed 1000000",
                           "TRNFLOW_SPOT_RATE_MULTIPLIER=0 " + home);
  ASSERT_EQ(climate.exit_code, 0) << climate.err;
  auto show = nlohmann::json::parse(
      Trnflow("show " + std::to_string(RunIdFrom(climate.out)) + " --format json", home).out);
  int cached = 0;
  for (const auto& s : show["stages"])
    if (s["kind"] == "compile") {
      EXPECT_EQ(s["state"], "cached") << s.dump();
      EXPECT_EQ(s["attempts"][0]["cost_usd"].get<double>(), 0.0);
      EXPECT_GT(s["attempts"][0]["saved_usd"].get<double>(), 0.0);
      ++cached;
    }
  EXPECT_EQ(cached, 6);
  // A size gc cannot read removes nothing; --dry-run says what it would remove and removes it
  // not; then gc keeps the most recently used entries: the six climate graphs were just used.
  std::string listed = Trnflow("cache ls", home).out;
  Result unreadable = Trnflow("cache gc --max-bytes 1XB", home);
  EXPECT_EQ(unreadable.exit_code, 2) << unreadable.out;
  EXPECT_NE(unreadable.err.find("nothing was removed"), std::string::npos) << unreadable.err;
  Result dry = Trnflow("cache gc --max-bytes 0.7MB --dry-run", home);
  EXPECT_EQ(dry.exit_code, 2) << "a fraction is not read as 0";
  dry = Trnflow("cache gc --max-bytes 700KB --dry-run", home);
  EXPECT_EQ(dry.exit_code, 0) << dry.err;
  EXPECT_NE(dry.out.find("would remove"), std::string::npos) << dry.out;
  EXPECT_EQ(Trnflow("cache ls", home).out, listed) << "a dry run removed something";
  Result gc = Trnflow("cache gc --max-bytes 700KB", home);
  EXPECT_EQ(gc.exit_code, 0) << gc.err;
  Result after = Trnflow("cache ls", home);
  EXPECT_NE(after.out.find("6 entries"), std::string::npos) << gc.out << after.out;
  EXPECT_EQ(std::count(after.out.begin(), after.out.end(), '\n'), 9) << after.out;
  EXPECT_EQ(after.out.find("llama-2-7b"), std::string::npos) << "least recently used go first";
  Result verify = Trnflow("cache verify", home);
  EXPECT_NE(verify.out.find("6 entries verified, 0 corrupt"), std::string::npos) << verify.out;
}

// Any stage with cache: true: a second run serves it from the cache while nothing it consumes
// changed, restores a run: stage's declared outputs into the new run's directory, and runs it
// again once its script changes; a stage after one whose product is unknown is not served.
TEST(Cli, AnyCachedStageIsServedWhileItsInputsAreUnchanged) {
  namespace fs = std::filesystem;
  // The job sees this directory read-only (its namespaces show the workdir's tree): it marks
  // its own run's directory when it really runs.
  fs::path dir = testing::JobVisibleDir("generic-cache");
  std::string home = "TRNFLOW_SPOT_RATE_MULTIPLIER=0 TRNFLOW_HOME=" + (dir / "home").string();
  std::ofstream(dir / "prep.sh") << "set -e\necho ran >> \"$TRNFLOW_RUN_DIR/ran-prepare\""
                                 << "\nmkdir -p \"$1\"\necho 'tokens 1 2 3' > \"$1/tokens.txt\"\n";
  std::string file = (dir / "pipeline.yaml").string();
  std::ofstream(file)
      << "pipeline: cached-stages\nproject: lab\nstages:\n"
         "  prepare:\n"
         "    run: [\"bash\", \""
      << (dir / "prep.sh").string()
      << "\", \"${{ run.dir }}/data\"]\n"
         "    cache: true\n"
         "    outputs: [\"${{ run.dir }}/data\"]\n"
         "  check:\n"
         "    needs: [prepare]\n"
         "    run: [\"grep\", \"-q\", \"tokens\", \"${{ run.dir }}/data/tokens.txt\"]\n"
         "  tune:\n"
         "    kind: train\n    needs: [prepare]\n    cache: true\n"
         "    instance: trn1.2xlarge\n    model: bert-large\n    tokens: 1.0e8\n"
         "  pretrain:\n"
         "    kind: train\n    instance: trn1.2xlarge\n    model: bert-large\n"
         "    tokens: 1.0e8\n"
         "  probe:\n"
         "    kind: deploy\n    needs: [pretrain]\n    cache: true\n"
         "    instance: inf2.xlarge\n    requests: 100\n"
         "    input_tokens: 128\n    output_tokens: 32\n";
  auto run = [&] {
    Result r = Trnflow("run " + file + " --speed 1000000", home);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    auto show = nlohmann::json::parse(
        Trnflow("show " + std::to_string(RunIdFrom(r.out)) + " --format json", home).out);
    std::map<std::string, nlohmann::json> by_name;
    for (const auto& s : show["stages"]) by_name[s["name"]] = s;
    return std::make_pair(RunIdFrom(r.out), by_name);
  };
  auto calls = [&] {
    long n = 0;
    for (const auto& r : fs::directory_iterator(dir / "home" / "runs"))
      n += fs::exists(r.path() / "ran-prepare");
    return n;
  };
  auto [first_id, first] = run();
  EXPECT_EQ(first["prepare"]["state"], "succeeded");
  EXPECT_EQ(first["tune"]["state"], "succeeded");
  EXPECT_EQ(calls(), 1);

  auto [second_id, second] = run();
  EXPECT_EQ(second["prepare"]["state"], "cached") << second["prepare"].dump();
  EXPECT_EQ(calls(), 1) << "the script did not run again";
  EXPECT_EQ(second["check"]["state"], "succeeded") << "the outputs were restored for it";
  EXPECT_EQ(second["tune"]["state"], "cached");
  const auto& hit = second["tune"]["attempts"][0];
  EXPECT_EQ(hit["cost_usd"].get<double>(), 0.0);
  EXPECT_EQ(hit["saved_usd"].get<double>(), first["tune"]["attempts"][0]["cost_usd"].get<double>());
  EXPECT_GT(hit["saved_usd"].get<double>(), 0.0);
  EXPECT_EQ(second["probe"]["state"], "succeeded") << "pretrain's weights are new each run";

  // An edited script is a new key: prepare runs again. It writes the same data, so what is
  // keyed on its outputs (tune) is still served.
  std::ofstream(dir / "prep.sh", std::ios::app) << "# a comment\n";
  auto [third_id, third] = run();
  EXPECT_EQ(third["prepare"]["state"], "succeeded");
  EXPECT_EQ(calls(), 2);
  EXPECT_EQ(third["tune"]["state"], "cached");

  Result why = Trnflow("cache why " + std::to_string(first_id) + " prepare", home);
  EXPECT_EQ(why.exit_code, 0) << why.err;
  EXPECT_NE(why.out.find("is in the cache"), std::string::npos) << why.out;
  Result ls = Trnflow("cache ls", home);
  EXPECT_NE(ls.out.find("bash"), std::string::npos) << ls.out;
  Result verify = Trnflow("cache verify", home);
  EXPECT_NE(verify.out.find("0 corrupt"), std::string::npos) << verify.out;
  fs::remove_all(dir);
}

TEST(Cli, FailingStageFailsTheRunWithExitOne) {
  std::string file = WriteTemp("fail.yaml",
                               "pipeline: failing\nproject: lab\nstages:\n"
                               "  a:\n    run: [\"false\"]\n"
                               "  b:\n    run: [\"true\"]\n    needs: [a]\n");
  Result r = Trnflow("run " + file);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  auto show = nlohmann::json::parse(
      Trnflow("show " + std::to_string(RunIdFrom(r.out)) + " --format json").out);
  EXPECT_EQ(show["run"]["state"], "failed");
  EXPECT_EQ(show["stages"][0]["state"], "failed");
  EXPECT_EQ(show["stages"][1]["state"], "skipped");
}

TEST(Cli, BrokenFileIsLocatedExitsTwoAndWritesNothing) {
  schema::Catalog c(TestDatabase::url());
  std::string before = schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.runs");
  std::string file = WriteTemp("broken.yaml",
                               "pipeline: broken\nproject: lab\nstages:\n"
                               "  train:\n    kind: train\n    instance: trn1.32xlarge\n"
                               "    modle: llama-2-7b\n    tokens: 1e9\n");
  for (const char* cmd : {"run ", "validate ", "submit ", "plan "}) {
    Result r = Trnflow(cmd + file);
    EXPECT_EQ(r.exit_code, 2) << cmd << r.out << r.err;
    EXPECT_NE(r.err.find(file + ":7:5: error: unknown field 'modle' in stage 'train'"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("hint: did you mean 'model'?"), std::string::npos) << r.err;
  }
  EXPECT_EQ(schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.runs"), before);
}

TEST(Cli, UnreachableCatalogExitsThreeNamingTheUrlWithoutPassword) {
  Result r = Trnflow("run examples/climate/pipeline.yaml",
                     "TRNFLOW_DATABASE_URL='postgresql://trnflow:s3cret@127.0.0.1:1/trnflow'");
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_NE(r.err.find("postgresql://trnflow:***@127.0.0.1:1/trnflow"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("s3cret"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(Cli, ValidateAndPlanTheExample) {
  Result v = Trnflow("validate examples/climate/pipeline.yaml");
  EXPECT_EQ(v.exit_code, 0) << v.err;
  Result p = Trnflow("plan examples/climate/pipeline.yaml --format json");
  ASSERT_EQ(p.exit_code, 0) << p.err;
  auto j = nlohmann::json::parse(p.out);
  EXPECT_EQ(j["pipeline"], "climate-forecast");
  EXPECT_EQ(j["stages"].size(), 10u);
  EXPECT_GT(j["total_cost_usd"].get<double>(), 0);
  EXPECT_GT(j["total_hours"].get<double>(), 0);
  Result bad_id = Trnflow("show not-a-run");
  EXPECT_EQ(bad_id.exit_code, 2);
  Result missing = Trnflow("show 999999");
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("no run 999999"), std::string::npos);
}

// Hostile files end promptly with exit 2 and a message: never a crash or a hang. (`timeout`
// turns a hang into exit 124; the limit is generous so a slow machine is not a failure.)
TEST(Cli, HostileFilesAreRefusedNotFatal) {
  std::string bomb =
      "pipeline: bomb\nproject: lab\nparams:\n  a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 12; ++i) {
    bomb += "  a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int k = 0; k < 10; ++k) bomb += (k ? ", *a" : "*a") + std::to_string(i - 1);
    bomb += "]\n";
  }
  bomb += "stages:\n  a:\n    run: *a11\n    needs: *a11\n";
  std::string deep = "pipeline: deep\nproject: lab\nstages: " + std::string(20000, '[') +
                     std::string(20000, ']') + "\n";
  std::string deep_maps = "pipeline: deep\nproject: lab\nstages: ";
  for (int i = 0; i < 20000; ++i) deep_maps += "{a: ";
  deep_maps += "1" + std::string(20000, '}') + "\n";
  std::string big = "pipeline: big\nproject: lab\nstages:\n";
  while (big.size() < 20u << 20)
    big += "  s" + std::to_string(big.size()) + ":\n    run: [\"true\"]\n";
  std::string garbage;
  uint64_t x = 88172645463325252ULL;
  for (int i = 0; i < 1 << 20; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    garbage += static_cast<char>(x & 0xFF);
  }
  for (const auto& [name, text] :
       std::vector<std::pair<std::string, std::string>>{{"bomb.yaml", bomb},
                                                        {"deep.yaml", deep},
                                                        {"deep-maps.yaml", deep_maps},
                                                        {"big.yaml", big},
                                                        {"garbage.yaml", garbage}}) {
    std::string file = WriteTemp(name, text);
    Result r = Trnflow("validate " + file, "timeout 60");
    EXPECT_EQ(r.exit_code, 2) << name << ": " << r.err.substr(0, 500);
    EXPECT_NE(r.err.find("error: "), std::string::npos) << name;
    std::filesystem::remove(file);
  }
}

}  // namespace trnflow

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::AddGlobalTestEnvironment(new trnflow::testing::TestDatabase("trnflow_cli_test"));
  return RUN_ALL_TESTS();
}
