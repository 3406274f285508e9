// The stage spec as the catalog stores it: compact (defaults left out), and read back whole,
// from the compact form and from the full form catalogs made before it hold.
#include <gtest/gtest.h>

#include "common/stage_spec.h"

namespace trnflow {
namespace {

void ExpectSame(const StageSpec& a, const StageSpec& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.instance, b.instance);
  EXPECT_EQ(a.count, b.count);
  EXPECT_EQ(a.market, b.market);
  EXPECT_EQ(a.command.argv, b.command.argv);
  EXPECT_EQ(a.command.shell, b.command.shell);
  EXPECT_EQ(a.command.env, b.command.env);
  EXPECT_EQ(a.command.secrets, b.command.secrets);
  EXPECT_EQ(a.command.outputs, b.command.outputs);
  EXPECT_EQ(a.workload_json, b.workload_json);
  EXPECT_TRUE(a.retry == b.retry);
  EXPECT_TRUE(a.checkpoint == b.checkpoint);
  EXPECT_EQ(a.timeout_s, b.timeout_s);
  EXPECT_EQ(a.cache, b.cache);
  EXPECT_EQ(a.cache_key, b.cache_key);
  EXPECT_EQ(a.cache_inputs, b.cache_inputs);
}

TEST(StageSpec, ANoOpStageIsStoredWithoutItsDefaults) {
  StageSpec s;
  s.name = "c0-1";
  s.instance = "c6i.large";
  s.command.argv = {"true"};
  std::string json = ToJson(s);
  EXPECT_EQ(json,
            R"({"command":{"argv":["true"]},"count":1,"instance":"c6i.large","kind":"run",)"
            R"("market":"on-demand","name":"c0-1"})");
  ExpectSame(StageSpecFromJson(json), s);
}

TEST(StageSpec, EveryFieldThatDiffersFromItsDefaultSurvivesTheRoundTrip) {
  StageSpec s;
  s.name = "train[lr=0.1]";
  s.kind = StageKind::kTrain;
  s.instance = "trn1.32xlarge";
  s.count = 4;
  s.market = Market::kSpot;
  s.command.argv = {"sh", "-c", "echo \"ü\""};
  s.command.shell = true;
  s.command.env = {{"A", "1"}};
  s.command.secrets = {"HF_TOKEN"};
  s.command.outputs = std::vector<std::string>{};  // declared empty: not the same as absent
  s.workload_json = R"({"kind":"train","tokens":1000})";
  s.retry.max_attempts = 3;
  s.retry.on = {Outcome::kInfraError};
  s.retry.backoff = {1, 3, 9};
  s.retry.max_interruptions = 2;
  s.retry.then_market = "fail";
  s.checkpoint = {600, true};
  s.timeout_s = 3600;
  s.cache = true;
  s.cache_key = "abc";
  s.cache_inputs = "{}";
  ExpectSame(StageSpecFromJson(ToJson(s)), s);
  // An absent outputs list stays absent.
  s.command.outputs.reset();
  ExpectSame(StageSpecFromJson(ToJson(s)), s);
}

TEST(StageSpec, TheFullFormOlderCatalogsHoldIsStillRead) {
  // As trnflow wrote every spec before the compact form (schema version 18 and earlier).
  const char* full =
      R"({"kind": "run", "name": "c99-99", "cache": false, "count": 1, "retry": {"on": )"
      R"(["spot_interruption", "capacity_unavailable", "lost", "infra_error", "timeout"], )"
      R"("then": "on-demand", "backoff": {"max_s": 600.0, "factor": 2.0, "initial_s": 30.0}, )"
      R"("max_attempts": 2, "max_interruptions": 6}, "market": "spot", "command": {"env": {}, )"
      R"("argv": ["true"], "shell": false, "outputs": null, "secrets": []}, "instance": )"
      R"("c6i.large", "workload": null, "cache_key": "", "timeout_s": 0.0, "checkpoint": )"
      R"({"every_s": 0.0, "on_notice": false}, "cache_inputs": ""})";
  StageSpec want;
  want.name = "c99-99";
  want.instance = "c6i.large";
  want.market = Market::kSpot;
  want.command.argv = {"true"};
  want.retry.max_attempts = 2;
  ExpectSame(StageSpecFromJson(full), want);
}

TEST(StageSpec, MalformedJsonNamesTheCatalog) {
  try {
    StageSpecFromJson(R"({"name": "x"})");
    FAIL() << "a spec without its kind was read";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("malformed stage spec"), std::string::npos);
  }
}

}  // namespace
}  // namespace trnflow
