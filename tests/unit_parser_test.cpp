#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <sstream>

#include "pipelines/dag.h"
#include "pipelines/pipeline.h"
#include "pipelines/plan.h"
#include "sim/catalog.h"

namespace trnflow::pipelines {
namespace {

LoadResult Parse(const std::string& text, LoadOptions opts = {}) {
  return ParsePipeline(text, "p.yaml", opts);
}

// The single error of a result, formatted; fails the test if there is not exactly one.
std::string OnlyError(const LoadResult& r) {
  EXPECT_EQ(r.diagnostics.error_count(), 1) << r.diagnostics.Format();
  EXPECT_FALSE(r.pipeline.has_value());
  return r.diagnostics.Format();
}

const char* kSmall = R"(pipeline: small
project: lab
params:
  tokens: 2.0e9
stages:
  prep:
    run: ["echo", "hi"]
  train:
    kind: train
    needs: [prep]
    instance: trn1.32xlarge
    model: llama-2-7b
    tokens: ${{ params.tokens }}
  compile:
    kind: compile
    needs: [train]
    target: inf2
    instance: trn1.2xlarge
    matrix: {seq_len: [128, 256], batch: [1, 8]}
    batch: ${{ matrix.batch }}
    seq_len: ${{ matrix.seq_len }}
  serve:
    kind: deploy
    needs: [compile]
    instance: inf2.xlarge
    input_tokens: 100
    output_tokens: 100
    requests: 1000
)";

}  // namespace

TEST(Parser, ParsesTheClimateExample) {
  auto r =
      LoadPipelineFile(std::string(TRNFLOW_SOURCE_DIR) + "/examples/climate/pipeline.yaml", {});
  ASSERT_TRUE(r.pipeline) << r.diagnostics.Format();
  const Pipeline& p = *r.pipeline;
  EXPECT_EQ(p.name, "climate-forecast");
  EXPECT_EQ(p.project, "climate-lab");
  EXPECT_EQ(p.stages.size(), 10u);
  const Stage* serve = p.Find("serve");
  ASSERT_NE(serve, nullptr);
  EXPECT_EQ(serve->needs.size(), 6u);  // every compile expansion
  ASSERT_TRUE(serve->workload);
  EXPECT_EQ(serve->workload->model.name, "climate-emulator-1b");  // inherited via compile
  const Stage* train = p.Find("train");
  EXPECT_EQ(train->spec.count, 2);
  EXPECT_EQ(train->spec.market, Market::kSpot);
  EXPECT_EQ(train->spec.checkpoint.every_s, 1800);
  EXPECT_EQ(train->spec.retry.max_interruptions, 6);
  EXPECT_EQ(train->pool, "trn1");
  EXPECT_EQ(train->workload->tokens, 1e10);
  EXPECT_EQ(p.spec_hash.size(), 64u);
}

// Anchors and aliases are plain YAML: a mapping or a value written once and reused.
TEST(Parser, ReadsAnchorsAndAliases) {
  auto r = Parse(R"(pipeline: shared
project: lab
stages:
  a:
    run: ["true"]
    env: &common {MODE: fast, SEED: "7"}
    timeout: &limit 10m
  b:
    needs: [a]
    run: ["true"]
    env: *common
    timeout: *limit
)");
  ASSERT_TRUE(r.pipeline) << r.diagnostics.Format();
  const Stage* b = r.pipeline->Find("b");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->spec.command.env, (std::map<std::string, std::string>{{"MODE", "fast"},
                                                                       {"SEED", "7"}}));
  EXPECT_EQ(b->spec.timeout_s, 600);
  EXPECT_EQ(b->spec.command.env, r.pipeline->Find("a")->spec.command.env);

  std::string e = OnlyError(Parse("pipeline: p\nproject: lab\nstages:\n  a:\n    run: *nowhere\n"));
  EXPECT_NE(e.find("p.yaml:5:10: error: invalid YAML"), std::string::npos) << e;
}

TEST(Parser, ExpandsMatrixWithSortedKeysAndSubstitutesValues) {
  auto r = Parse(kSmall);
  ASSERT_TRUE(r.pipeline) << r.diagnostics.Format();
  std::vector<std::string> names;
  for (const auto& s : r.pipeline->stages)
    if (s.base_name == "compile") names.push_back(s.spec.name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "compile[batch=1,seq_len=128]", "compile[batch=1,seq_len=256]",
                       "compile[batch=8,seq_len=128]", "compile[batch=8,seq_len=256]"}));
  const Stage* c = r.pipeline->Find("compile[batch=8,seq_len=256]");
  EXPECT_EQ(c->workload->batch, 8);
  EXPECT_EQ(c->workload->seq_len, 256);
  EXPECT_EQ(c->workload->model.name, "llama-2-7b");
}

TEST(Parser, ParamOverridesStayTyped) {
  auto r = Parse(kSmall, {{{"tokens", "5e9"}}, ""});
  ASSERT_TRUE(r.pipeline) << r.diagnostics.Format();
  EXPECT_EQ(r.pipeline->Find("train")->workload->tokens, 5e9);
  auto bad = Parse(kSmall, {{{"tokens", "lots"}}, ""});
  EXPECT_NE(OnlyError(bad).find("p.yaml:13:13: error: tokens must be a number, not 'lots'"),
            std::string::npos)
      << bad.diagnostics.Format();
  auto unknown = Parse(kSmall, {{{"tokenz", "1"}}, ""});
  EXPECT_NE(OnlyError(unknown).find("did you mean 'tokens'?"), std::string::npos);
}

// A parameter's value is data: it never becomes shell code or extra arguments.
TEST(Parser, ParamsNeverBecomeCode) {
  const std::string text =
      "pipeline: x\nproject: lab\nparams: {name: \"a b; rm -rf /\"}\nstages:\n"
      "  plain:\n    run: \"echo hello ${{ params.name }}\"\n"
      "  listed:\n    run: [\"echo\", \"${{ params.name }}\"]\n"
      "  shelled:\n    run: \"echo ${{ params.name }} | tr a-z A-Z\"\n    shell: true\n";
  auto r = Parse(text);
  ASSERT_TRUE(r.pipeline) << r.diagnostics.Format();
  std::map<std::string, CommandSpec> cmd;
  for (const auto& s : r.pipeline->stages) cmd[s.spec.name] = s.spec.command;
  EXPECT_EQ(cmd["plain"].argv, (std::vector<std::string>{"echo", "hello", "a b; rm -rf /"}));
  EXPECT_EQ(cmd["listed"].argv, (std::vector<std::string>{"echo", "a b; rm -rf /"}));
  ASSERT_EQ(cmd["shelled"].argv.size(), 1u);
  EXPECT_EQ(cmd["shelled"].argv[0], "echo \"${TRNFLOW_PARAM_NAME}\" | tr a-z A-Z");
  EXPECT_EQ(cmd["shelled"].env.at("TRNFLOW_PARAM_NAME"), "a b; rm -rf /");
  // Overridden from the command line, the same.
  auto o = Parse(text, {{{"name", "$(id)"}}, ""});
  ASSERT_TRUE(o.pipeline) << o.diagnostics.Format();
  for (const auto& s : o.pipeline->stages)
    if (s.spec.name == "shelled") EXPECT_EQ(s.spec.command.env.at("TRNFLOW_PARAM_NAME"), "$(id)");
}

// The fuzzer's find: a command holding the word splitter's own marker bytes.
TEST(Parser, ControlCharactersInACommandAreAnErrorNotACrash) {
  auto r = Parse(std::string("pipeline: x\nproject: lab\nstages:\n  a:\n    run: \"echo \x01") +
                 "7\x01 ${{ params.nope }}\"\n");
  EXPECT_NE(OnlyError(r).find("control character"), std::string::npos) << r.diagnostics.Format();
}

// A matrix value is part of its stage's name, which names files on the workers and must pass
// submit_run's check (migration 0023): no '/', no control character, at most 255 bytes.
TEST(Parser, MatrixValuesThatWouldMakeAPathAreErrors) {
  auto r = Parse("pipeline: x\nproject: lab\nstages:\n  a:\n    run: [\"true\"]\n"
                 "    matrix: {d: [\"ok\", \"../../etc\"]}\n");
  EXPECT_NE(OnlyError(r).find("holds '/' or a control character"), std::string::npos)
      << r.diagnostics.Format();
  r = Parse("pipeline: x\nproject: lab\nstages:\n  a:\n    run: [\"true\"]\n"
            "    matrix: {d: [\"" + std::string(300, 'v') + "\"]}\n");
  EXPECT_NE(OnlyError(r).find("longer than 255 bytes"), std::string::npos)
      << r.diagnostics.Format();
}

// Stage counts multiply before anything is expanded: 1.9 KB of YAML (a 10,000-cell matrix
// stage and 99 aliases of it) names a million stages. The parser counts them from the lists'
// sizes and refuses past the project's bound before the first expansion (issue 36: it took
// `validate` 7 s and 1.7 GB to expand them first).
TEST(Parser, StageCountIsBoundedBeforeExpansion) {
  const std::string path =
      std::string(TRNFLOW_SOURCE_DIR) + "/tests/broken/105-alias-matrix-million-stages.yaml";
  std::vector<std::string> asked;
  LoadOptions opts;
  opts.stage_bound = [&](const std::string& project) {
    asked.push_back(project);
    return QuotaStageBound(project, 250000, 1000000, 0);
  };
  auto r = LoadPipelineFile(path, opts);
  std::string out = r.diagnostics.Format();
  EXPECT_FALSE(r.pipeline.has_value());
  EXPECT_EQ(r.diagnostics.error_count(), 1) << out;
  EXPECT_EQ(asked, std::vector<std::string>{"sweeps"}) << "asked once, for the file's project";
  EXPECT_NE(out.find(path + ":6:3: error: the pipeline's stages expand to 1000000 stages (100 "
                            "of its 100 stages have a matrix; 's00' at 6:3 alone makes 10000); "
                            "project \"sweeps\" allows at most 250000 per run"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("hint: split the sweep into several runs, or an administrator raises the "
                     "quota: trnflow project add sweeps --max-stages-per-run N"),
            std::string::npos)
      << out;

  // Exactly at the bound passes; one past it does not. 3 entries x a 2x2 matrix = 12 stages.
  const std::string twelve =
      "pipeline: x\nproject: lab\nstages:\n  a: &a\n    run: [\"true\"]\n"
      "    matrix: {i: [1, 2], j: [3, 4]}\n  b: *a\n  c: *a\n";
  auto bound = [](int64_t n) {
    LoadOptions o;
    o.stage_bound = [n](const std::string& project) {
      return QuotaStageBound(project, n, 1000000, 0);
    };
    return o;
  };
  auto ok = Parse(twelve, bound(12));
  ASSERT_TRUE(ok.pipeline) << ok.diagnostics.Format();
  EXPECT_EQ(ok.pipeline->stages.size(), 12u);
  EXPECT_NE(OnlyError(Parse(twelve, bound(11))).find("expand to 12 stages"), std::string::npos);

  // The project's queue binds when it has less room than a run may have.
  LoadOptions full;
  full.stage_bound = [](const std::string& project) {
    return QuotaStageBound(project, 250000, 100, 95);
  };
  std::string err = OnlyError(Parse(twelve, full));
  EXPECT_NE(err.find("project \"lab\" has 95 unfinished stages, room for 5 more under its quota "
                     "of 100"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("--max-queued-stages N"), std::string::npos) << err;

  // Products past 2^62 saturate instead of wrapping around to a small number.
  std::string huge = "pipeline: x\nproject: lab\nstages:\n  a:\n    run: [\"true\"]\n    matrix: {";
  for (int k = 0; k < 8; ++k) {
    huge += std::string(k ? ", " : "") + "k" + std::to_string(k) + ": [";
    for (int v = 0; v < 1000; ++v) huge += (v ? "," : "") + std::to_string(v);
    huge += "]";
  }
  huge += "}\n";
  EXPECT_NE(OnlyError(Parse(huge)).find("expand to more than 4611686018427387904 stages"),
            std::string::npos);
}

TEST(Parser, CountsTakeSizeSuffixes) {
  auto r = Parse(kSmall, {{{"tokens", "1.5T"}}, ""});
  ASSERT_TRUE(r.pipeline) << r.diagnostics.Format();
  EXPECT_EQ(r.pipeline->Find("train")->workload->tokens, 1.5e12);
  r = Parse(kSmall, {{{"tokens", "20B"}}, ""});
  ASSERT_TRUE(r.pipeline) << r.diagnostics.Format();
  EXPECT_EQ(r.pipeline->Find("train")->workload->tokens, 20e9);
  EXPECT_FALSE(Parse(kSmall, {{{"tokens", "20X"}}, ""}).pipeline);
  EXPECT_FALSE(Parse(kSmall, {{{"tokens", "B"}}, ""}).pipeline);
}

TEST(Parser, UnknownFieldIsLocatedWithDidYouMean) {
  std::string text = kSmall;
  text.replace(text.find("    needs: [prep]"), 17, "    neds: [prep]");
  auto r = Parse(text);
  std::string out = r.diagnostics.Format();
  EXPECT_NE(out.find("p.yaml:10:5: error: unknown field 'neds' in stage 'train'"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("  hint: did you mean 'needs'?"), std::string::npos) << out;
}

TEST(Parser, UnknownNeedsAndInstanceAndModelGetHints) {
  std::string text = kSmall;
  text.replace(text.find("needs: [prep]"), 13, "needs: [prepp]");
  text.replace(text.find("trn1.32xlarge"), 13, "trn1.32xlarg");
  text.replace(text.find("llama-2-7b"), 10, "llama-2-7");
  auto r = Parse(text);
  std::string out = r.diagnostics.Format();
  EXPECT_EQ(r.diagnostics.error_count(), 3) << out;
  EXPECT_NE(out.find("needs unknown stage 'prepp'"), std::string::npos) << out;
  EXPECT_NE(out.find("did you mean 'prep'?"), std::string::npos) << out;
  EXPECT_NE(out.find("p.yaml:11:15: error: unknown instance type 'trn1.32xlarg'"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("did you mean 'trn1.32xlarge'?"), std::string::npos) << out;
  EXPECT_NE(out.find("unknown model 'llama-2-7'"), std::string::npos) << out;
}

TEST(Parser, CycleIsNamed) {
  auto r = Parse(R"(pipeline: cyc
project: lab
stages:
  a:
    run: ["true"]
    needs: [c]
  b:
    run: ["true"]
    needs: [a]
  c:
    run: ["true"]
    needs: [b]
)");
  std::string out = OnlyError(r);
  EXPECT_NE(out.find("dependency cycle: "), std::string::npos) << out;
  for (const char* n : {"a", "b", "c"}) EXPECT_NE(out.find(n), std::string::npos);
  EXPECT_NE(out.find("a -> b -> c -> a"), std::string::npos) << out;
}

TEST(Parser, SelfDependencyAndDuplicateStages) {
  auto self =
      Parse("pipeline: x\nproject: lab\nstages:\n  a:\n    run: [\"true\"]\n    needs: [a]\n");
  EXPECT_NE(OnlyError(self).find("p.yaml:6:13: error: stage 'a' needs itself"), std::string::npos);
  auto dup = Parse(
      "pipeline: x\nproject: lab\nstages:\n  a:\n    run: [\"true\"]\n  a:\n    run: "
      "[\"false\"]\n");
  EXPECT_NE(OnlyError(dup).find("p.yaml:6:3: error: duplicate stage name 'a'"), std::string::npos)
      << dup.diagnostics.Format();
}

TEST(Parser, RepeatedNeedsAreAWarningNotAnError) {
  auto r = Parse(
      "pipeline: x\nproject: lab\nstages:\n  a:\n    run: [\"true\"]\n"
      "  b:\n    run: [\"true\"]\n    needs: [a, a]\n");
  ASSERT_TRUE(r.pipeline) << r.diagnostics.Format();
  EXPECT_EQ(r.pipeline->Find("b")->needs.size(), 1u);
  EXPECT_NE(r.diagnostics.Format().find("p.yaml:8:16: warning: stage 'b' lists 'a' in needs twice"),
            std::string::npos)
      << r.diagnostics.Format();
}

TEST(Parser, KindAndRunTogetherIsAnError) {
  auto r = Parse(
      "pipeline: x\nproject: lab\nstages:\n  t:\n    kind: train\n    run: [\"true\"]\n"
      "    instance: trn1.2xlarge\n");
  EXPECT_NE(OnlyError(r).find("has both kind: train and run:"), std::string::npos);
}

TEST(Parser, SyntaxErrorsAndBadExpressionsAreLocated) {
  auto syntax = Parse("pipeline: x\nstages:\n  a: [unclosed\n");
  EXPECT_NE(OnlyError(syntax).find("p.yaml:"), std::string::npos);
  EXPECT_NE(syntax.diagnostics.Format().find("invalid YAML"), std::string::npos);
  auto expr = Parse(
      "pipeline: x\nproject: lab\nstages:\n  a:\n    run: [\"echo\", \"${{ params.nope }}\"]\n");
  EXPECT_NE(OnlyError(expr).find("p.yaml:5:20: error: unknown parameter 'nope'"), std::string::npos)
      << expr.diagnostics.Format();
  auto open = Parse("pipeline: x\nproject: lab\nstages:\n  a:\n    run: \"echo ${{ run.id\"\n");
  EXPECT_NE(OnlyError(open).find("unterminated expression"), std::string::npos);
}

TEST(Parser, NumbersMustBeFiniteAndInRange) {
  std::string text = kSmall;
  text.replace(text.find("2.0e9"), 5, ".nan");
  EXPECT_NE(OnlyError(Parse(text)).find("must be a finite number"), std::string::npos);
  text = kSmall;
  text.replace(text.find("    needs: [prep]"), 17, "    needs: [prep]\n    count: 0");
  EXPECT_NE(OnlyError(Parse(text)).find("count must be between 1 and 512"), std::string::npos);
  text = kSmall;
  text.replace(text.find("    needs: [prep]"), 17,
               "    needs: [prep]\n    count: 99999999999999999999");
  EXPECT_FALSE(Parse(text).pipeline);
}

TEST(Parser, BinaryGarbageAndEmptyFilesAreRefused) {
  EXPECT_NE(OnlyError(Parse(std::string("pipeline: x\0\x01\x02", 15))).find("NUL bytes"),
            std::string::npos);
  EXPECT_NE(Parse("").diagnostics.Format().find("must be a mapping"), std::string::npos);
}

TEST(Parser, RunStringsSplitIntoArgvUnlessShell) {
  auto r = Parse(
      "pipeline: x\nproject: lab\nstages:\n  a:\n    run: \"python3 -c 'print(1)'\"\n"
      "  b:\n    run: \"echo a | wc -c\"\n    shell: true\n");
  ASSERT_TRUE(r.pipeline) << r.diagnostics.Format();
  EXPECT_EQ(r.pipeline->Find("a")->spec.command.argv,
            (std::vector<std::string>{"python3", "-c", "print(1)"}));
  EXPECT_TRUE(r.pipeline->Find("b")->spec.command.shell);
  EXPECT_EQ(r.pipeline->Find("b")->spec.command.argv, (std::vector<std::string>{"echo a | wc -c"}));
}

TEST(Parser, RunExpressionsAreKeptForRunTime) {
  auto r =
      Parse("pipeline: x\nproject: lab\nstages:\n  a:\n    run: [\"ls\", \"${{run.dir}}/d\"]\n");
  ASSERT_TRUE(r.pipeline) << r.diagnostics.Format();
  std::string arg = r.pipeline->Find("a")->spec.command.argv[1];
  EXPECT_EQ(arg, "${{ run.dir }}/d");
  EXPECT_EQ(SubstituteRunExpressions(arg, "7", "/h/runs/7"), "/h/runs/7/d");
}

TEST(CacheKey, StableForTheSameGraphNewForAnyGraphChange) {
  sim::Workload w;
  w.kind = StageKind::kCompile;
  w.model = *sim::Catalog::Builtin().FindModel("llama-2-7b");
  w.target = "inf2";
  w.batch = 8;
  w.seq_len = 2048;
  w.tp_degree = 2;
  w.compiler_flags = {"-O2", "--auto-cast=none"};
  auto key = [](const sim::Workload& x) { return Sha256Hex(CompileCacheInputs(x)); };
  const std::string base = key(w);
  ASSERT_EQ(base.size(), 64u);
  EXPECT_EQ(key(w), base);
  sim::Workload x = w;
  std::reverse(x.compiler_flags.begin(), x.compiler_flags.end());
  EXPECT_EQ(key(x), base) << "flag order must not matter";
  x = w, x.tokens = 9e12;  // training more (new weights) does not change the graph
  EXPECT_EQ(key(x), base);
  for (auto change : std::vector<std::function<void(sim::Workload&)>>{
           [](sim::Workload& v) { v.batch = 1; }, [](sim::Workload& v) { v.seq_len = 4096; },
           [](sim::Workload& v) { v.tp_degree = 8; }, [](sim::Workload& v) { v.target = "trn1"; },
           [](sim::Workload& v) { v.dtype = "fp16"; },
           [](sim::Workload& v) { v.compiler_flags.push_back("--verbose"); },
           [](sim::Workload& v) { v.model.layers = 33; },
           [](sim::Workload& v) { v.model = *sim::Catalog::Builtin().FindModel("llama-2-13b"); }}) {
    x = w;
    change(x);
    EXPECT_NE(key(x), base) << CompileCacheInputs(x);
  }
  // In a pipeline: each matrix combination has its own key; only cached compiles have one.
  auto r = ParsePipeline(kSmall, "p.yaml", {});
  ASSERT_TRUE(r.pipeline);
  EXPECT_NE(r.pipeline->Find("compile[batch=1,seq_len=128]")->spec.cache_key,
            r.pipeline->Find("compile[batch=8,seq_len=128]")->spec.cache_key);
  EXPECT_TRUE(r.pipeline->Find("train")->spec.cache_key.empty());
}

TEST(Dag, TopologicalOrderPutsNeedsFirst) {
  auto r = Parse(kSmall);
  ASSERT_TRUE(r.pipeline);
  const auto& stages = r.pipeline->stages;
  auto order = TopologicalOrder(stages);
  ASSERT_EQ(order.size(), stages.size());
  std::map<std::string, size_t> pos;
  for (size_t i = 0; i < order.size(); ++i) pos[stages[order[i]].spec.name] = i;
  for (const auto& s : stages)
    for (const auto& n : s.needs) EXPECT_LT(pos[n], pos[s.spec.name]) << s.spec.name;
}

TEST(Dag, LongChainsDoNotOverflowTheStack) {
  std::vector<Stage> chain(100'000);
  for (size_t i = 0; i < chain.size(); ++i) {
    chain[i].spec.name = "s" + std::to_string(i);
    if (i) chain[i].needs = {"s" + std::to_string(i - 1)};
  }
  EXPECT_FALSE(FindCycle(chain));
  chain[0].needs = {"s99999"};
  auto cycle = FindCycle(chain);
  ASSERT_TRUE(cycle);
  EXPECT_EQ(cycle->size(), 100'001u);
}

TEST(Plan, TotalsAreTheSumOfStagesAndTheCriticalPath) {
  auto r = Parse(kSmall);
  ASSERT_TRUE(r.pipeline);
  Plan plan = MakePlan(*r.pipeline);
  Money sum;
  double longest_compile = 0;
  for (const auto& s : plan.stages) {
    sum += s.cost;
    if (s.kind == StageKind::kCompile) longest_compile = std::max(longest_compile, s.hours);
  }
  EXPECT_EQ(sum, plan.total_cost);
  double path =
      plan.stages[0].hours + plan.stages[1].hours + longest_compile + plan.stages.back().hours;
  EXPECT_NEAR(plan.total_hours, path, 1e-9);
  EXPECT_NE(PlanToJson(plan).find("\"total_cost_usd\""), std::string::npos);
}

// A command's length: its estimate:, else its past (the caller's), else unknown and said so.
TEST(Plan, RunStagesArePricedFromTheirEstimateTheirPastOrNotAtAll) {
  auto r = Parse(R"(pipeline: p
project: lab
stages:
  a:
    run: ["true"]
    instance: c6i.xlarge
    count: 4
    estimate: 1h30m
  b:
    run: ["true"]
    instance: c6i.xlarge
  c:
    run: ["true"]
    instance: c6i.xlarge
)");
  ASSERT_TRUE(r.pipeline) << r.diagnostics.Format();
  Money hour = sim::Catalog::Builtin().FindInstance("c6i.xlarge")->on_demand_per_hour;
  PlanInputs in;
  in.history = [](const std::string& stage) -> std::optional<StageHistory> {
    if (stage == "b") return StageHistory{1800, 5};
    return std::nullopt;
  };
  Plan plan = MakePlan(*r.pipeline, in);
  ASSERT_EQ(plan.stages.size(), 3u);
  EXPECT_EQ(plan.stages[0].source, EstimateSource::kEstimate);
  EXPECT_EQ(plan.stages[0].cost, Money::FromMicros(hour.micros() * 4 * 3 / 2));
  EXPECT_EQ(plan.stages[1].source, EstimateSource::kHistory);
  EXPECT_EQ(plan.stages[1].history_runs, 5);
  EXPECT_EQ(plan.stages[1].cost, Money::FromMicros(hour.micros() / 2));
  EXPECT_EQ(plan.stages[2].source, EstimateSource::kUnknown);
  EXPECT_EQ(plan.unknown_stages, std::vector<std::string>{"c"});
  EXPECT_GT(plan.stages[2].cost, Money()) << "a floor, the billing minimum, not $0";
  std::string json = PlanToJson(plan);
  EXPECT_NE(json.find("\"estimate_source\": \"history\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"history_runs\": 5"), std::string::npos) << json;
  EXPECT_NE(json.find("\"unknown_stages\": [\n    \"c\"\n  ]"), std::string::npos) << json;
  std::string table = PlanToTable(plan);
  EXPECT_NE(table.find("history (5 runs)"), std::string::npos) << table;
  EXPECT_NE(table.find("total: at least $"), std::string::npos) << table;
  // Without the history the same stage is unknown.
  EXPECT_EQ(MakePlan(*r.pipeline).stages[1].source, EstimateSource::kUnknown);
}


TEST(Parser, InlineModelCarriesTheShapeThePhysicsNeeds) {
  // Llama-3-70B described inline, without its parameter count: ffn gives it, and a context
  // longer than the default 4096 is the model's own.
  auto r = Parse(R"(pipeline: p
project: lab
stages:
  serve:
    kind: deploy
    instance: trn2.48xlarge
    tp_degree: 64
    model: {name: my-70b, layers: 80, hidden: 8192, heads: 64, kv_heads: 8, ffn: 28672,
            vocab: 128256, context: 16384}
    input_tokens: 10000
    output_tokens: 1500
    requests: 10
)");
  ASSERT_TRUE(r.pipeline.has_value()) << r.diagnostics.Format();
  const sim::Model& m = r.pipeline->stages[0].workload->model;
  EXPECT_EQ(m.ffn, 28672);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_NEAR(m.parameters, 70.55e9, 0.01e9);
  EXPECT_EQ(m.context, 16384);
  // Without ffn the parameter count is required, and the error says ffn would do.
  auto bad = Parse(R"(pipeline: p
project: lab
stages:
  serve:
    kind: deploy
    instance: trn2.48xlarge
    model: {name: my-70b, layers: 80, hidden: 8192}
    input_tokens: 10
    output_tokens: 10
    requests: 10
)");
  std::string err = OnlyError(bad);
  EXPECT_NE(err.find("p.yaml:7:12: error: inline model lacks 'parameters'"), std::string::npos)
      << err;
  EXPECT_NE(err.find("parameters may be left out when ffn is given"), std::string::npos) << err;
}

// Issue 38: a deploy stage says how it shares the instance. One TP8 replica on 8 of
// inf2.48xlarge's 24 cores behind a continuous-batching server, against the default (as many
// replicas as fit, full static batches): plan reports both per replica and per instance.
TEST(Plan, DeployReplicasAndMaxConcurrencyArePlannedPerReplicaAndPerInstance) {
  auto text = [](const std::string& extra) {
    return "pipeline: p\nproject: lab\nstages:\n  serve:\n    kind: deploy\n"
           "    instance: inf2.48xlarge\n    model: llama-3.1-8b\n    tp_degree: 8\n"
           "    batch: 32\n    input_tokens: 1500\n    output_tokens: 250\n"
           "    seq_len: 4096\n    requests: 1000\n" + extra;
  };
  auto one = Parse(text("    replicas: 1\n    max_concurrency: 1\n"));
  ASSERT_TRUE(one.pipeline.has_value()) << one.diagnostics.Format();
  const sim::Workload& w = *one.pipeline->stages[0].workload;
  EXPECT_EQ(w.replicas, 1);
  EXPECT_EQ(w.max_concurrency, 1);
  auto all = Parse(text(""));
  ASSERT_TRUE(all.pipeline.has_value()) << all.diagnostics.Format();
  EXPECT_EQ(all.pipeline->stages[0].workload->replicas, 0);  // as many as fit

  Plan p1 = MakePlan(*one.pipeline), p3 = MakePlan(*all.pipeline);
  const StagePlan& a = p1.stages[0];
  const StagePlan& b = p3.stages[0];
  EXPECT_EQ(a.replicas_per_instance, 1);
  EXPECT_EQ(b.replicas_per_instance, 3);  // 24 cores / tp 8
  // One request in flight decodes one token per step; a full batch of 32 decodes 32 at a
  // slower step: more throughput, longer per-token latency.
  EXPECT_NEAR(a.replica_tokens_per_second, 1000 / a.ms_per_token, 1e-6);
  EXPECT_GT(b.replica_tokens_per_second, 10 * a.replica_tokens_per_second);
  EXPECT_NEAR(b.instance_tokens_per_second, 3 * b.replica_tokens_per_second, 1e-6);
  // The server prefills one prompt per request, padded to its 4,096-token graph: its TTFT
  // is far below a 32-prompt batch's (each prompt in its 2,048-token bucket).
  EXPECT_LT(a.ttft_ms * 5, b.ttft_ms);
  std::string json = PlanToJson(p1);
  for (const char* key : {"\"replicas_per_instance\": 1", "\"neuron_cores_per_instance\": 8",
                          "\"max_concurrency\": 1", "\"per_replica\"", "\"per_instance\""})
    EXPECT_NE(json.find(key), std::string::npos) << key << "\n" << json;
  EXPECT_NE(PlanToTable(p1).find("1 x tp8 per instance"), std::string::npos) << PlanToTable(p1);

  // Four TP8 replicas do not fit inf2.48xlarge; they do fit trn1.32xlarge (32 cores).
  std::string err = OnlyError(Parse(text("    replicas: 4\n")));
  EXPECT_NE(err.find("p.yaml:14:15: error: stage 'serve': replicas 4 x tp_degree 8 needs 32 "
                     "NeuronCores, but inf2.48xlarge has 24"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("set replicas: 3"), std::string::npos) << err;
}

}  // namespace trnflow::pipelines
