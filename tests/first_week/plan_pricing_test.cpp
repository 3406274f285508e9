// Issue 16, item 7: plans that price commands. A `run:` stage is billed wall time x speed x
// price like any other, so `plan` prices it from its `estimate:`, else from the median of its
// past runs, else says it does not know; and budget admission checks the very figure `plan`
// prints. The real binary against a real catalog.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "schema/catalog.h"
#include "schema/catalog_testing.h"
#include "tests/run_cli.h"
#include "tests/test_db.h"

namespace trnflow {
namespace {

using testing::CliResult;
using testing::RunTrnflow;
using testing::TestDatabase;
using testing::WriteTempFile;

::testing::Environment* const kDatabase =
    ::testing::AddGlobalTestEnvironment(new TestDatabase("plan_pricing"));

// The hardware catalog's price, as `trnflow instances` publishes it.
double OnDemandPerHour(const std::string& instance) {
  CliResult r = RunTrnflow("instances --format json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const auto& t : nlohmann::json::parse(r.out))
    if (t["name"] == instance) return t["on_demand_usd_hour"].get<double>();
  ADD_FAILURE() << "no instance " << instance;
  return 0;
}

nlohmann::json PlanJson(const std::string& args) {
  CliResult r = RunTrnflow("plan " + args + " --format json");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  return nlohmann::json::parse(r.out);
}

const nlohmann::json& StageOf(const nlohmann::json& plan, const std::string& name) {
  for (const auto& s : plan["stages"])
    if (s["name"] == name) return s;
  ADD_FAILURE() << "no stage " << name << " in " << plan.dump();
  static const nlohmann::json none;
  return none;
}

int64_t Micros(double usd) { return std::llround(usd * 1e6); }

// EC2 billing: whole seconds rounded up, at least 60, per instance.
int64_t ChargeMicros(double usd_per_hour, int count, double seconds) {
  double billed = std::max(60.0, std::ceil(seconds));
  return std::llround(usd_per_hour * 1e6 * count * billed / 3600);
}

TEST(PlanPricing, ARunStageWithAnEstimateIsPricedAtEstimateTimesPriceTimesCount) {
  std::string file = WriteTempFile("estimate.yaml", R"(pipeline: estimate-demo
project: estimates
stages:
  prepare:
    run: ["true"]
    instance: c6i.xlarge
    count: 3
    estimate: 2h
  score:
    needs: [prepare]
    run: ["true"]
    instance: c6i.xlarge
)");
  double price = OnDemandPerHour("c6i.xlarge");
  ASSERT_GT(price, 0);
  nlohmann::json plan = PlanJson(file);
  const auto& prepare = StageOf(plan, "prepare");
  EXPECT_EQ(prepare["estimate_source"], "estimate");
  EXPECT_DOUBLE_EQ(prepare["hours"].get<double>(), 2.0);
  EXPECT_EQ(Micros(prepare["cost_usd"].get<double>()), ChargeMicros(price, 3, 7200));
  EXPECT_GT(prepare["cost_usd"].get<double>(), 1.0) << "three instances for two hours";

  // No estimate and no past runs: unknown, said so, never a silent $0.
  const auto& score = StageOf(plan, "score");
  EXPECT_EQ(score["estimate_source"], "unknown");
  EXPECT_EQ(plan["unknown_stages"], nlohmann::json::array({"score"}));
  EXPECT_EQ(Micros(plan["total_cost_usd"].get<double>()),
            Micros(prepare["cost_usd"].get<double>()) + Micros(score["cost_usd"].get<double>()));
  CliResult table = RunTrnflow("plan " + file);
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("total: at least $"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("unknown length (score)"), std::string::npos) << table.out;
  std::istringstream lines(table.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("score ", 0) == 0) {
      EXPECT_NE(line.find(" ? "), std::string::npos) << "hours unknown: " << line;
      EXPECT_NE(line.find(">=$"), std::string::npos) << "a floor, not a figure: " << line;
      EXPECT_NE(line.find("unknown"), std::string::npos) << line;
    }
    if (line.rfind("prepare ", 0) == 0) {
      EXPECT_NE(line.find("estimate"), std::string::npos) << line;
    }
  }
}

TEST(PlanPricing, AnEstimateIsValidatedLikeEveryOtherField) {
  std::string words = WriteTempFile("estimate-words.yaml", R"(pipeline: estimate-demo
project: estimates
stages:
  prepare:
    run: ["true"]
    estimate: 2 hours
)");
  CliResult r = RunTrnflow("plan " + words);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.err.find(words + ":6:15: error: estimate must be a duration, not '2 hours'"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("hint: write it like 30s, 10m, 2h or 1h30m"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "") << "nothing planned from a broken file";

  // Simulated stages are priced by the performance model: an estimate there is a mistake.
  std::string sim = WriteTempFile("estimate-train.yaml", R"(pipeline: estimate-demo
project: estimates
stages:
  train:
    kind: train
    instance: trn1.32xlarge
    model: llama-2-7b
    tokens: 1e9
    estimate: 2h
)");
  CliResult t = RunTrnflow("validate " + sim);
  EXPECT_EQ(t.exit_code, 2);
  EXPECT_NE(t.err.find(sim + ":9:5: error: unknown field 'estimate' in stage 'train'"),
            std::string::npos)
      << t.err;
}

TEST(PlanPricing, AfterRunsTheMedianOfPastRunsIsUsedAndLabelled) {
  std::string file = WriteTempFile("history.yaml", R"(pipeline: history-demo
project: history
params:
  nap: 0.1
stages:
  score:
    run: ["sleep", "${{ params.nap }}"]
    instance: c6i.xlarge
    count: 2
  report:
    needs: [score]
    run: ["true"]
    instance: c6i.xlarge
    estimate: 45m
)");
  EXPECT_EQ(StageOf(PlanJson(file), "score")["estimate_source"], "unknown");
  // Three runs of different lengths: the median is not the mean.
  for (const char* nap : {"0.1", "0.6", "0.25"}) {
    CliResult r = RunTrnflow("run " + file + " --param nap=" + nap + " --speed 3600");
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  schema::Catalog c(TestDatabase::url());
  std::string seconds = schema::testing::QueryValue(
      c,
      "SELECT string_agg(a.sim_seconds::text, ',' ORDER BY a.sim_seconds) FROM trnflow.attempts a "
      "JOIN trnflow.stages s ON s.id = a.stage_id JOIN trnflow.runs r ON r.id = a.run_id "
      "WHERE r.project = 'history' AND s.name = 'score' AND a.outcome = 'succeeded'");
  std::vector<double> past;
  std::istringstream in(seconds);
  for (std::string x; std::getline(in, x, ',');) past.push_back(std::stod(x));
  ASSERT_EQ(past.size(), 3u) << seconds;
  double median = past[1];
  double mean = (past[0] + past[1] + past[2]) / 3;
  ASSERT_GT(std::abs(mean - median), 60) << "the naps differ enough to tell them apart";

  double price = OnDemandPerHour("c6i.xlarge");
  nlohmann::json plan = PlanJson(file);
  const auto& score = StageOf(plan, "score");
  EXPECT_EQ(score["estimate_source"], "history");
  EXPECT_EQ(score["history_runs"], 3);
  EXPECT_NEAR(score["hours"].get<double>(), median / 3600, 0.0006);
  EXPECT_EQ(Micros(score["cost_usd"].get<double>()), ChargeMicros(price, 2, median));
  EXPECT_EQ(plan["unknown_stages"], nlohmann::json::array());
  // A stage's own estimate wins over its past.
  const auto& report = StageOf(plan, "report");
  EXPECT_EQ(report["estimate_source"], "estimate");
  EXPECT_EQ(Micros(report["cost_usd"].get<double>()), ChargeMicros(price, 1, 45 * 60));

  CliResult table = RunTrnflow("plan " + file);
  EXPECT_NE(table.out.find("history (3 runs)"), std::string::npos) << table.out;
  EXPECT_EQ(table.out.find("at least"), std::string::npos) << table.out;

  // The past is the project's own: another project's plan of the same file knows nothing.
  EXPECT_EQ(StageOf(PlanJson(file + " --project elsewhere"), "score")["estimate_source"],
            "unknown");
}

// Admission and `plan` are one number: a run is refused exactly when the plan's total exceeds
// the budget left. A compile stage whose graph is cached is where they used to part: `plan`
// priced it at $0, admission in full.
TEST(PlanPricing, AdmissionRefusesExactlyWhenThePlanTotalExceedsTheBudgetLeft) {
  std::string file = WriteTempFile("admit.yaml", R"(pipeline: admit-demo
project: admit
stages:
  compile:
    kind: compile
    model: llama-2-7b
    target: inf2
    instance: trn1.2xlarge
    tp_degree: 2
    batch: 1
    seq_len: 512
  score:
    needs: [compile]
    run: ["true"]
    instance: c6i.xlarge
    estimate: 30m
)");
  ASSERT_EQ(RunTrnflow("project add admit").exit_code, 0);
  ASSERT_EQ(RunTrnflow("budget set admit 1000 --period total").exit_code, 0);
  nlohmann::json cold = PlanJson(file);
  EXPECT_EQ(StageOf(cold, "compile")["estimate_source"], "model");
  EXPECT_GT(StageOf(cold, "compile")["cost_usd"].get<double>(), 0.1);
  // One run fills the compile cache; the next plan prices the compile at $0.
  CliResult first = RunTrnflow("run " + file + " --speed 1000000");
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  nlohmann::json warm = PlanJson(file);
  EXPECT_EQ(StageOf(warm, "compile")["estimate_source"], "cache");
  EXPECT_EQ(StageOf(warm, "compile")["cost_usd"], 0.0);
  int64_t total = Micros(warm["total_cost_usd"].get<double>());
  ASSERT_LT(total, Micros(cold["total_cost_usd"].get<double>()));
  ASSERT_GT(total, 0);

  CliResult ls = RunTrnflow("budget ls --format json");
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  int64_t spent = Micros(nlohmann::json::parse(ls.out)[0]["spent_usd"].get<double>());
  ASSERT_GT(spent, 0) << "the first run was charged";
  auto usd = [](int64_t micros) {
    char b[64];
    std::snprintf(b, sizeof b, "%lld.%06lld", static_cast<long long>(micros / 1000000),
                  static_cast<long long>(micros % 1000000));
    return std::string(b);
  };
  schema::Catalog c(TestDatabase::url());
  auto runs = [&] { return schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.runs"); };

  // Exactly the plan's total left: admitted.
  ASSERT_EQ(RunTrnflow("budget set admit " + usd(spent + total) + " --period total").exit_code, 0);
  CliResult fits = RunTrnflow("submit " + file + " --format json");
  ASSERT_EQ(fits.exit_code, 0) << fits.err;
  std::string run = nlohmann::json::parse(fits.out)["run_id"];
  ASSERT_EQ(RunTrnflow("cancel " + run).exit_code, 0);

  // A micro-dollar less: refused, with the plan's own figure, and nothing written.
  ASSERT_EQ(RunTrnflow("budget set admit " + usd(spent + total - 1) + " --period total").exit_code,
            0);
  std::string before = runs();
  CliResult over = RunTrnflow("submit " + file + " --format json");
  EXPECT_EQ(over.exit_code, 4) << "refused (docs/cli.md#exit-codes): " << over.out;
  // Cents for people, unless cents would show the two figures as one.
  auto shown = [&](int64_t micros, int64_t other) {
    auto cents = [](int64_t m) {
      char b[64];
      std::snprintf(b, sizeof b, "$%lld.%02lld", static_cast<long long>((m + 5000) / 1000000),
                    static_cast<long long>((m + 5000) / 10000 % 100));
      return std::string(b);
    };
    return cents(micros) == cents(other) ? "$" + usd(micros) : cents(micros);
  };
  EXPECT_NE(over.err.find("the plan estimates " + shown(total, total - 1) + " but project admit has " +
                          shown(total - 1, total) + " left"),
            std::string::npos)
      << over.err;
  EXPECT_EQ(runs(), before);
}

}  // namespace
}  // namespace trnflow
