// The performance model against the published Neuron figures of sim/benchmarks.yaml. Its
// fitted constants were chosen on the `split: fit` rows; this test reports the error on every
// row, the median and the worst of each half, and bounds both. The holdout half is the one
// that says whether the model predicts: nothing was tuned on it.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "sim/catalog.h"
#include "sim/feasibility.h"
#include "sim/perf_model.h"

namespace trnflow::sim {
namespace {

YAML::Node Benchmarks() { return YAML::LoadFile(TRNFLOW_SOURCE_DIR "/sim/benchmarks.yaml"); }

// A catalog model by name, or an inline one with the keys of a pipeline's inline model.
Model ModelOf(const YAML::Node& n) {
  if (n.IsScalar()) {
    const Model* m = Catalog::Builtin().FindModel(n.as<std::string>());
    if (!m) throw std::runtime_error("benchmarks.yaml: unknown model " + n.as<std::string>());
    return *m;
  }
  Model m;
  m.name = n["name"].as<std::string>();
  m.layers = n["layers"].as<int>();
  m.hidden = n["hidden"].as<int>();
  m.heads = n["heads"].as<int>();
  m.kv_heads = n["kv_heads"] ? n["kv_heads"].as<int>() : m.heads;
  m.ffn = n["ffn"].as<int>();
  m.vocab = n["vocab"].as<int>();
  m.context = n["context"].as<int>();
  m.architecture = n["architecture"].as<std::string>("decoder");
  if (n["features"]) m.features = n["features"].as<std::vector<std::string>>();
  m.parameters = n["parameters"] ? n["parameters"].as<double>() : ParametersFromShape(m);
  return m;
}

const InstanceType& InstanceOf(const YAML::Node& n) {
  const InstanceType* t = Catalog::Builtin().FindInstance(n.as<std::string>());
  if (!t) throw std::runtime_error("benchmarks.yaml: unknown instance " + n.as<std::string>());
  return *t;
}

struct Figure {
  std::string what;
  std::string split;
  std::string regime;      // the kind of run (sim/README.md's per-regime table)
  double tolerance = 0.25; // |error| within which the figure counts as reproduced
  std::string instance;
  std::string model;
  std::string metric;
  double published = 0;
  double model_value = 0;
  double error() const { return model_value / published - 1; }
};

std::vector<Figure> Evaluate() {
  std::vector<Figure> out;
  YAML::Node b = Benchmarks();
  for (const auto& row : b["serving"]) {
    Workload w;
    w.kind = StageKind::kDeploy;
    w.model = ModelOf(row["model"]);
    w.tp_degree = row["tp_degree"].as<int>();
    w.batch = row["batch"].as<int>();
    w.seq_len = row["seq_len"].as<int>();
    w.input_tokens = row["input_tokens"].as<int>();
    w.output_tokens = row["output_tokens"].as<int>();
    w.max_concurrency = row["concurrency"].as<int>(0);
    const InstanceType& t = InstanceOf(row["instance"]);
    ServeBreakdown s = ServeStep(w, t);
    Figure f;
    f.split = row["split"].as<std::string>();
    f.tolerance = row["tolerance"].as<double>(0.25);
    f.instance = t.name;
    f.model = w.model.name;
    char what[160];
    std::snprintf(what, sizeof what, "tp%-2d b%d%s in%-5d out%-5d", w.tp_degree, w.batch,
                  w.max_concurrency > 0 ? (" c" + std::to_string(w.max_concurrency)).c_str() : "",
                  w.input_tokens, w.output_tokens);
    f.what = what;
    if (row["ms_per_token"]) {
      f.metric = "ms/token";
      f.published = row["ms_per_token"].as<double>();
      f.model_value = s.ms_per_token;
      f.regime = "decode";
    } else {
      f.metric = "TTFT ms";
      f.published = row["ttft_ms"].as<double>();
      f.model_value = s.ttft_ms;
      f.regime = w.input_tokens >= 1500 ? "long-prompt TTFT" : "short-prompt TTFT";
    }
    f.regime = row["regime"].as<std::string>(f.regime);
    out.push_back(f);
  }
  for (const auto& row : b["training"]) {
    Workload w;
    w.kind = StageKind::kTrain;
    w.model = ModelOf(row["model"]);
    w.tp = row["tp"].as<int>();
    w.pp = row["pp"].as<int>();
    w.seq_len = row["seq_len"].as<int>();
    w.global_batch = row["global_batch"].as<double>(0);
    int nodes = row["nodes"].as<int>();
    const InstanceType& t = InstanceOf(row["instance"]);
    TrainBreakdown tb = TrainStep(w, t, nodes);
    Figure f;
    f.split = row["split"].as<std::string>();
    f.tolerance = row["tolerance"].as<double>(0.25);
    f.regime = row["regime"].as<std::string>(w.model.parameters < 2e10 ? "small-model training"
                                                                         : "large-model training");
    f.instance = std::to_string(nodes) + " x " + t.name;
    f.model = w.model.name;
    char what[160];
    std::snprintf(what, sizeof what, "tp%d pp%d dp%d seq %d", w.tp, w.pp, tb.dp, w.seq_len);
    f.what = what;
    f.metric = "tok/s/node";
    f.published = row["tokens_per_second_per_node"].as<double>();
    f.model_value = tb.tokens_per_second / nodes;
    out.push_back(f);
  }
  return out;
}

struct Summary {
  size_t n = 0;
  double median = 0;
  double worst = 0;
  size_t within_25 = 0;
};

Summary Summarize(const std::vector<Figure>& all, const std::string& split) {
  std::vector<double> e;
  for (const auto& f : all)
    if (f.split == split) e.push_back(std::abs(f.error()));
  Summary s;
  s.n = e.size();
  if (e.empty()) return s;
  std::sort(e.begin(), e.end());
  s.median = e.size() % 2 ? e[e.size() / 2] : (e[e.size() / 2 - 1] + e[e.size() / 2]) / 2;
  s.worst = e.back();
  s.within_25 = std::count_if(e.begin(), e.end(), [](double x) { return x <= 0.25; });
  return s;
}

void Print(const std::vector<Figure>& all, const std::string& split) {
  std::printf("\n%s half (|error| per figure):\n", split.c_str());
  for (const auto& f : all)
    if (f.split == split)
      std::printf("  %-16s %-20s %-28s %-10s published %9.1f model %9.1f %+6.1f%%\n",
                  f.model.c_str(), f.instance.c_str(), f.what.c_str(), f.metric.c_str(),
                  f.published, f.model_value, 100 * f.error());
  Summary s = Summarize(all, split);
  std::printf("%s: %zu figures, median |error| %.1f%%, worst %.1f%%, within 25%%: %zu\n",
              split.c_str(), s.n, 100 * s.median, 100 * s.worst, s.within_25);
}

TEST(Benchmarks, EveryFigureIsSourcedAndSplit) {
  YAML::Node b = Benchmarks();
  size_t rows = 0;
  for (const char* section : {"serving", "training"})
    for (const auto& row : b[section]) {
      ++rows;
      std::string split = row["split"].as<std::string>("");
      EXPECT_TRUE(split == "fit" || split == "holdout") << section << " row " << rows;
      std::string source = row["source"].as<std::string>("");
      EXPECT_TRUE(source.rfind("https://", 0) == 0 || source.rfind("sim/calibration/", 0) == 0)
          << section << " row " << rows << ": a figure needs the address it was published at";
    }
  EXPECT_GT(rows, 100u);
}

TEST(Benchmarks, FitHalfErrors) {
  auto all = Evaluate();
  Print(all, "fit");
  Summary s = Summarize(all, "fit");
  ASSERT_GT(s.n, 50u);
  // Bounds of the fit half (sim/README.md lists the figures beyond 25%: long prompts of 7B
  // and 13B models, whose published prefill is slower than its FLOPs explain).
  EXPECT_LE(s.median, 0.15);
  EXPECT_LE(s.worst, 1.00);
}

TEST(Benchmarks, HoldoutHalfErrors) {
  auto all = Evaluate();
  Print(all, "holdout");
  Summary s = Summarize(all, "holdout");
  ASSERT_GT(s.n, 20u);
  EXPECT_LE(s.median, 0.15) << "median |error| on figures the model was not fitted to";
  // Issue 38: at least 80% of the holdout within each figure's tolerance.
  size_t within = std::count_if(all.begin(), all.end(), [](const Figure& f) {
    return f.split == "holdout" && std::abs(f.error()) <= f.tolerance;
  });
  EXPECT_GE(within * 5, s.n * 4) << within << " of " << s.n << " holdout figures within tolerance";
  // The holdout covers every family the issue names: inf2, trn1, trn2 serving and training.
  for (const char* family : {"inf2.", "trn1.", "trn2."})
    EXPECT_TRUE(std::any_of(all.begin(), all.end(),
                            [&](const Figure& f) {
                              return f.split == "holdout" &&
                                     f.instance.find(family) != std::string::npos;
                            }))
        << family;
}

// The holdout per regime (sim/README.md prints this table): every regime the issue names has
// held-out figures, and in none is any figure off by more than 35%.
TEST(Benchmarks, HoldoutPerRegime) {
  auto all = Evaluate();
  std::vector<std::string> regimes;
  for (const auto& f : all)
    if (f.split == "holdout" &&
        std::find(regimes.begin(), regimes.end(), f.regime) == regimes.end())
      regimes.push_back(f.regime);
  std::sort(regimes.begin(), regimes.end());
  std::printf("\n| regime | holdout figures | within tolerance | median abs error | mean abs "
              "error | worst |\n|---|---|---|---|---|---|\n");
  for (const auto& r : regimes) {
    std::vector<double> e;
    size_t within = 0;
    for (const auto& f : all)
      if (f.split == "holdout" && f.regime == r) {
        e.push_back(std::abs(f.error()));
        within += std::abs(f.error()) <= f.tolerance;
      }
    std::sort(e.begin(), e.end());
    double median = e.size() % 2 ? e[e.size() / 2] : (e[e.size() / 2 - 1] + e[e.size() / 2]) / 2;
    double mean = 0;
    for (double x : e) mean += x / e.size();
    std::printf("| %s | %zu | %zu | %.1f%% | %.1f%% | %.1f%% |\n", r.c_str(), e.size(), within,
                100 * median, 100 * mean, 100 * e.back());
    EXPECT_LE(e.back(), 0.35) << r << ": its worst held-out figure";
  }
  for (const char* r : {"decode", "long-prompt TTFT", "short-prompt TTFT",
                        "small-concurrency serving", "small-model training",
                        "large-model training"})
    EXPECT_NE(std::find(regimes.begin(), regimes.end(), r), regimes.end()) << r;
}

// Llama-3 70B serving held out on inf2, trn1 and trn2: every published figure within 30%
// (25% for the shapes of examples/llama3-70b-serving, tests/example_plan_test.cpp; the
// 2,048-token prompts' TTFT is 25-27% under the published one, sim/README.md).
TEST(Benchmarks, Llama3_70bServingWithin30PercentOnInf2Trn1Trn2) {
  auto all = Evaluate();
  int checked = 0;
  for (const auto& f : all) {
    if (f.split != "holdout" || f.model.find("-70b") == std::string::npos) continue;
    if (f.metric == "tok/s/node") continue;
    ++checked;
    EXPECT_LE(std::abs(f.error()), 0.30) << f.model << " " << f.instance << " " << f.what << " "
                                         << f.metric << ": published " << f.published
                                         << ", model " << f.model_value;
  }
  EXPECT_GE(checked, 20);
}

}  // namespace
}  // namespace trnflow::sim
