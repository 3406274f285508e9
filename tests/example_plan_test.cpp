// `trnflow plan` on examples/llama3-70b-serving, measured the way a user sees it: every
// deploy stage's ms/token and time to first token against the published figures of
// sim/benchmarks.yaml for the same instance, model architecture and shape. Those rows are
// `split: holdout`: the simulator's constants were not fitted to them. No figure is written
// here; a stage without a matching published row fails.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/run_cli.h"

namespace trnflow {
namespace {

constexpr const char* kExample = "examples/llama3-70b-serving/pipeline.yaml";

// Catalog models with the same architecture count as the same model (the published inf2 and
// trn1 figures are for Llama-3-70B, the trn2 one for Llama-3.3-70B: the same network).
bool SameArchitecture(const std::string& a, const std::string& b) {
  auto shape = [](const std::string& name) {
    static const YAML::Node models = YAML::LoadFile(TRNFLOW_SOURCE_DIR "/sim/models.yaml");
    for (const auto& m : models["models"])
      if (m["name"].as<std::string>() == name)
        return m["parameters"].as<std::string>() + "/" + m["layers"].as<std::string>() + "/" +
               m["hidden"].as<std::string>() + "/" + m["heads"].as<std::string>() + "/" +
               m["kv_heads"].as<std::string>() + "/" + m["ffn"].as<std::string>();
    return std::string("unknown ") + name;
  };
  return shape(a) == shape(b);
}

TEST(ExamplePlan, Llama3_70bServingOnInf2Trn1Trn2IsWithin25PercentOfPublished) {
  auto r = testing::RunTrnflow(std::string("plan --format json ") + kExample);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto plan = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(plan.is_discarded()) << r.out;
  YAML::Node pipeline = YAML::LoadFile(std::string(TRNFLOW_SOURCE_DIR "/") + kExample);
  YAML::Node published = YAML::LoadFile(TRNFLOW_SOURCE_DIR "/sim/benchmarks.yaml")["serving"];

  int stages = 0;
  for (const auto& stage : plan["stages"]) {
    if (stage["kind"] != "deploy") continue;
    ++stages;
    std::string name = stage["name"];
    YAML::Node s = pipeline["stages"][name];
    int matched = 0;
    for (const auto& row : published) {
      if (row["split"].as<std::string>() != "holdout" ||
          row["instance"].as<std::string>() != stage["instance"].get<std::string>() ||
          !SameArchitecture(row["model"].as<std::string>(), s["model"].as<std::string>()))
        continue;
      bool same_shape = true;
      for (const char* key : {"tp_degree", "batch", "input_tokens", "output_tokens"})
        same_shape = same_shape && row[key].as<int>() == s[key].as<int>();
      if (!same_shape) continue;
      for (const auto& [key, plan_key] : {std::pair{"ms_per_token", "ms_per_token"},
                                          std::pair{"ttft_ms", "ttft_ms"}}) {
        if (!row[key]) continue;
        ++matched;
        double want = row[key].as<double>();
        double got = stage[plan_key].get<double>();
        EXPECT_LE(std::abs(got / want - 1), 0.25)
            << name << " on " << stage["instance"] << ": " << key << " planned " << got
            << ", published " << want << " (" << row["source"].as<std::string>() << ")";
      }
    }
    EXPECT_EQ(matched, 2) << name << ": expected one published ms/token and one TTFT figure "
                          << "for this shape in sim/benchmarks.yaml";
  }
  EXPECT_EQ(stages, 3) << "one deploy stage per family: inf2, trn1, trn2";
}

}  // namespace
}  // namespace trnflow
