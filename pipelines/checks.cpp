#include "pipelines/checks.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <set>

#include "sim/feasibility.h"
#include "sim/perf_model.h"

namespace trnflow::pipelines {
namespace {

constexpr double kLongSpotHours = 1.0;  // past this, an interruption without checkpoints hurts
constexpr double kWorthWarningUsd = 1.0;

// The compile stages a stage builds on, following needs through any stage in between.
std::vector<const Stage*> UpstreamCompiles(const Pipeline& p, const Stage& s) {
  std::vector<const Stage*> out;
  std::set<std::string> seen;
  std::deque<std::string> todo(s.needs.begin(), s.needs.end());
  while (!todo.empty()) {
    std::string name = todo.front();
    todo.pop_front();
    if (!seen.insert(name).second) continue;
    const Stage* u = p.Find(name);
    if (!u) continue;
    if (u->spec.kind == StageKind::kCompile) {
      out.push_back(u);
      continue;  // a compile's own inputs are not graphs this stage serves
    }
    todo.insert(todo.end(), u->needs.begin(), u->needs.end());
  }
  return out;
}

std::string Usd(Money m) { return m.ToDollars(); }

void CheckStage(const Pipeline& p, const Stage& s, Diagnostics& d) {
  const sim::Catalog& hw = sim::Catalog::Builtin();
  const sim::InstanceType* t = hw.FindInstance(s.spec.instance);
  if (!t) return;
  const std::string who = "stage '" + s.base_name + "': ";
  if (s.workload) {
    const sim::Workload& w = *s.workload;
    switch (s.spec.kind) {
      case StageKind::kTrain:
        if (sim::Fit f = sim::CheckTrain(w, *t, s.spec.count); !f.ok)
          d.Error(s.At(f.message.find("parallelism") != std::string::npos      ? "parallelism"
                       : f.message.find("training needs") != std::string::npos ? "count"
                                                                               : "instance"),
                  who + f.message, f.hint);
        break;
      case StageKind::kCompile:
        break;  // checked per matrix group in CheckPipeline
      case StageKind::kDeploy:
      case StageKind::kBenchmark: {
        if (sim::Fit f = sim::CheckServe(hw, w, *t); !f.ok) {
          d.Error(s.At(f.message.rfind("replicas ", 0) == 0 ? "replicas"
                       : f.message.find("NeuronCores, but") != std::string::npos ||
                               f.message.find("no accelerator") != std::string::npos
                           ? "instance"
                           : "tp_degree"),
                  who + f.message, f.hint);
          break;
        }
        auto compiles = UpstreamCompiles(p, s);
        if (compiles.empty()) break;
        int max_seq = 0, max_batch = 0;
        std::set<std::string> targets;
        std::set<int> tps;
        for (const Stage* c : compiles) {
          max_seq = std::max(max_seq, c->workload->seq_len);
          max_batch = std::max(max_batch, c->workload->batch);
          targets.insert(c->workload->target);
          tps.insert(c->workload->tp_degree);
        }
        if (!tps.count(w.tp_degree)) {
          std::string compiled;
          for (int tp : tps) compiled += (compiled.empty() ? "" : ", ") + std::to_string(tp);
          d.Error(s.At("tp_degree"),
                  who + "serves at tp_degree " + std::to_string(w.tp_degree) +
                      " graphs compiled for tp_degree " + compiled,
                  "a Neuron graph runs only at the tp_degree it was compiled for: use tp_degree " +
                      std::to_string(*tps.begin()));
        }
        std::string family = sim::CompileFamily(t->family);
        for (const auto& target : targets)
          if (target != family)
            d.Error(
                s.At("instance"),
                who + "serves on " + t->name + " (" + family + ") graphs compiled for " + target,
                "compile with target: " + family + ", or serve on a " + target + " instance");
        int tokens = w.input_tokens + w.output_tokens;
        if (tokens > max_seq)
          d.Error(s.At("output_tokens"),
                  who + "input_tokens + output_tokens = " + std::to_string(tokens) +
                      " does not fit the largest compiled seq_len bucket (" +
                      std::to_string(max_seq) + "); Neuron graphs have static shapes",
                  "add a seq_len bucket of at least " + std::to_string(tokens) +
                      " to the compile stage, or shorten the requests");
        if (w.batch > max_batch)
          d.Error(s.At("batch"),
                  who + "batch " + std::to_string(w.batch) +
                      " is larger than any compiled batch (" + std::to_string(max_batch) + ")",
                  "compile a batch of " + std::to_string(w.batch) + ", or serve at batch " +
                      std::to_string(max_batch));
        break;
      }
      case StageKind::kRun:
        break;
    }
  }
  // Warnings: costly habits.
  double seconds = 60;
  if (s.workload) seconds = sim::EstimateStage(*s.workload, *t, s.spec.count).seconds;
  if (s.spec.market == Market::kSpot && s.workload && seconds / 3600 > kLongSpotHours &&
      s.spec.checkpoint.every_s <= 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f", seconds / 3600);
    d.Warning(s.At("market"),
              who + "runs about " + std::string(buf) +
                  " hours on spot without checkpoint.every: an interruption loses all of it",
              "add checkpoint: {every: 30m, on_notice: true}");
  }
  if (s.spec.kind == StageKind::kCompile && !s.spec.cache)
    d.Warning(s.At("cache"), who + "compile stage with cache: false recompiles every run",
              "remove cache: false so identical graphs come from the cache");
  if (s.spec.market == Market::kOnDemand &&
      t->spot_per_hour.micros() * 2 < t->on_demand_per_hour.micros()) {
    Money on_demand = Charge(t->on_demand_per_hour, s.spec.count, seconds);
    Money spot = Charge(t->spot_per_hour, s.spec.count, seconds);
    if (on_demand.usd() >= kWorthWarningUsd) {
      int saving = static_cast<int>(100 - 100.0 * spot.micros() / on_demand.micros());
      d.Warning(s.At("market"),
                who + "costs " + Usd(on_demand) + " on on-demand; spot would cost " + Usd(spot) +
                    " (" + std::to_string(saving) + "% less)",
                "set market: spot, with checkpoint: for long stages");
    }
  }
}

}  // namespace

void CheckBudgetedCommands(const Pipeline& p, const std::string& budget, Diagnostics& d) {
  std::set<std::string> warned;
  for (const auto& s : p.stages) {
    if (s.spec.kind != StageKind::kRun || s.spec.timeout_s > 0 || s.estimate_s) continue;
    if (!warned.insert(s.base_name).second) continue;
    d.Warning(s.At("run"),
              "stage '" + s.base_name + "': a command under " + budget +
                  " with neither timeout: nor estimate: reserves one billing minute at a time "
                  "and is stopped wherever the budget runs out",
              "give it an `estimate:` (how long it runs, simulated: `estimate: 30m`) or a "
              "`timeout:`; its reservation is then what it will cost");
  }
}

void CheckPipeline(const Pipeline& p, Diagnostics& d) {
  for (const auto& s : p.stages) CheckStage(p, s, d);
  if (p.budget) CheckBudgetedCommands(p, "budget_usd", d);
  // Compile stages: one report per stage of the file, for its hardest matrix combination
  // (largest batch x seq_len that fails), so the hint covers every bucket.
  std::map<std::string, std::pair<const Stage*, sim::Fit>> worst;
  const sim::Catalog& hw = sim::Catalog::Builtin();
  for (const auto& s : p.stages) {
    if (s.spec.kind != StageKind::kCompile || !s.workload) continue;
    const sim::InstanceType* host = hw.FindInstance(s.spec.instance);
    if (!host) continue;
    sim::CompileOutcome o = sim::PredictCompile(hw, *s.workload, *host);
    if (o.ok) continue;
    sim::Fit f{false, o.message, o.hint};
    auto size = [](const Stage* x) {
      return static_cast<double>(x->workload->batch) * x->workload->seq_len;
    };
    auto it = worst.find(s.base_name);
    if (it == worst.end() || size(&s) > size(it->second.first)) worst[s.base_name] = {&s, f};
  }
  for (const auto& [base, failure] : worst) {
    const Stage* s = failure.first;
    const sim::Fit& f = failure.second;
    std::string field = f.message.find("seq_len") != std::string::npos       ? "seq_len"
                        : f.message.find("NCC_EXTP003") == 0                 ? "target"
                        : f.message.find("host memory") != std::string::npos ? "instance"
                                                                             : "tp_degree";
    d.Error(s->At(field), "stage '" + s->spec.name + "': " + f.message, f.hint);
  }
}

}  // namespace trnflow::pipelines
