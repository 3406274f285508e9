#include "pipelines/plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "pipelines/dag.h"
#include "sim/feasibility.h"
#include "sim/perf_model.h"

namespace trnflow::pipelines {
namespace {
// printf into a string of whatever length it takes.
template <typename... Args>
std::string Format(const char* fmt, Args... args) {
  int n = std::snprintf(nullptr, 0, fmt, args...);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::snprintf(out.data(), out.size() + 1, fmt, args...);
  return out;
}

// A table line without the padding a last empty column leaves.
std::string Line(std::string text) {
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text + "\n";
}

double Round(double v, int places) {
  double f = std::pow(10.0, places);
  return std::round(v * f) / f;
}
}  // namespace

namespace {

// Simulated seconds of work one interruption loses: what the notice cannot save when the
// state is written at the notice, else half a checkpoint interval, else half the stage.
double LostPerInterruption(const Stage& s, const sim::InstanceType& t, double seconds) {
  const CheckpointPolicy& c = s.spec.checkpoint;
  if (c.on_notice && s.workload && s.spec.kind == StageKind::kTrain) {
    double loss = sim::OnNoticeLossSeconds(*s.workload, t, s.spec.count);
    if (loss >= 0) return c.every_s > 0 ? std::min(loss, c.every_s / 2) : loss;
  }
  if (c.every_s > 0) return std::min(c.every_s, seconds) / 2;
  return seconds / 2;
}

// Among the instance types that can run this train or serving stage, the cheapest on its
// market, if it is cheaper than the chosen one.
void FindCheaper(const Pipeline& p, const Stage& s, StagePlan& sp) {
  if (!s.workload || (s.spec.kind != StageKind::kTrain && s.spec.kind != StageKind::kDeploy &&
                      s.spec.kind != StageKind::kBenchmark))
    return;
  const sim::Catalog& hw = sim::Catalog::Builtin();
  std::string family;  // a serving stage must stay on the family its graphs were compiled for
  for (const auto& n : s.needs)
    if (const Stage* u = p.Find(n); u && u->spec.kind == StageKind::kCompile)
      family = u->workload->target;
  bool spot = s.spec.market == Market::kSpot;
  for (const auto& t : hw.instances()) {
    if (t.name == s.spec.instance) continue;
    if (!family.empty() && sim::CompileFamily(t.family) != family) continue;
    bool fits = s.spec.kind == StageKind::kTrain ? sim::CheckTrain(*s.workload, t, s.spec.count).ok
                                                 : sim::CheckServe(hw, *s.workload, t).ok;
    if (!fits) continue;
    double seconds = sim::EstimateStage(*s.workload, t, s.spec.count).seconds;
    Money cost = Charge(t.price(spot), s.spec.count, seconds);
    if (cost < sp.cost && (sp.cheaper_instance.empty() || cost < sp.cheaper_cost)) {
      sp.cheaper_instance = t.name;
      sp.cheaper_cost = cost;
    }
  }
}

}  // namespace

std::string_view ToString(EstimateSource source) {
  switch (source) {
    case EstimateSource::kModel:
      return "model";
    case EstimateSource::kEstimate:
      return "estimate";
    case EstimateSource::kHistory:
      return "history";
    case EstimateSource::kUnknown:
      return "unknown";
    case EstimateSource::kCache:
      return "cache";
  }
  return "unknown";
}

Plan MakePlan(const Pipeline& p, const std::function<bool(const std::string&)>& is_cached) {
  return MakePlan(p, PlanInputs{is_cached, {}});
}

Plan MakePlan(const Pipeline& p, const PlanInputs& inputs) {
  const auto& is_cached = inputs.is_cached;
  const sim::Catalog& hw = sim::Catalog::Builtin();
  Plan plan;
  plan.pipeline = p.name;
  plan.speed = inputs.speed;
  std::map<std::string, double> finish;  // critical path: hours from start to stage end
  std::map<std::string, size_t> index;
  for (size_t i : TopologicalOrder(p.stages)) {
    const Stage& s = p.stages[i];
    const sim::InstanceType* t = hw.FindInstance(s.spec.instance);
    StagePlan sp;
    sp.name = s.spec.name;
    sp.kind = s.spec.kind;
    sp.instance = s.spec.instance;
    sp.count = s.spec.count;
    sp.market = std::string(ToString(s.spec.market));
    // A command's length comes from its estimate: or its past; failing both it is unknown,
    // and planned at its billing minimum (a floor, labelled as such).
    double seconds = 60;
    sp.cached = is_cached && !s.spec.cache_key.empty() && is_cached(s.spec.cache_key);
    if (s.spec.kind == StageKind::kRun) {
      std::optional<StageHistory> past;
      if (s.estimate_s) {
        seconds = *s.estimate_s;
        sp.source = EstimateSource::kEstimate;
      } else if (inputs.history && (past = inputs.history(s.spec.name)) && past->runs > 0) {
        seconds = inputs.speed > 0 && past->median_wall_seconds > 0
                      ? past->median_wall_seconds * inputs.speed
                      : past->median_seconds;
        sp.source = EstimateSource::kHistory;
        sp.history_runs = past->runs;
      } else {
        sp.source = EstimateSource::kUnknown;
      }
    }
    if (s.workload && t) {
      sim::Estimate e = sim::EstimateStage(*s.workload, *t, s.spec.count);
      seconds = e.seconds;
      sp.tokens_per_second = e.tokens_per_second;
      sp.ms_per_token = e.ms_per_token;
      sp.ttft_ms = e.ttft_ms;
      sp.mfu = e.mfu;
      if (e.replicas_per_instance > 0 && e.tokens_per_second > 0) {
        sp.replicas_per_instance = e.replicas_per_instance;
        sp.tp_degree = s.workload->tp_degree;
        sp.max_concurrency = s.workload->max_concurrency;
        sp.instance_tokens_per_second = e.tokens_per_second / std::max(1, s.spec.count);
        sp.replica_tokens_per_second = sp.instance_tokens_per_second / e.replicas_per_instance;
      }
      if (e.tokens_per_second > 0 && s.spec.kind != StageKind::kTrain) {
        double usd_per_hour = t->price(s.spec.market == Market::kSpot).usd() * s.spec.count;
        sp.usd_per_million_tokens = usd_per_hour / (e.tokens_per_second * 3600) * 1e6;
      }
    }
    if (sp.cached) {  // served from the cache: no instance, no time
      seconds = 0;
      sp.source = EstimateSource::kCache;
    }
    sp.hours = seconds / 3600;
    if (t && !sp.cached) {
      sp.cost = Charge(t->price(s.spec.market == Market::kSpot), s.spec.count, seconds);
      sp.on_demand_cost = Charge(t->on_demand_per_hour, s.spec.count, seconds);
      if (s.spec.market == Market::kSpot) {
        sp.expected_interruptions =
            sim::SpotInterruptionsPerHour(*t) * p.spot_rate_multiplier * sp.hours * s.spec.count;
        double lost = LostPerInterruption(s, *t, seconds);
        sp.expected_interruption_cost = Money::FromMicros(static_cast<int64_t>(std::llround(
            sp.expected_interruptions * Charge(t->spot_per_hour, s.spec.count, lost).micros() *
            (lost > 0 ? 1 : 0))));
      }
      FindCheaper(p, s, sp);
    }
    double start = 0;
    for (const auto& n : s.needs) start = std::max(start, finish[n]);
    finish[s.spec.name] = start + sp.hours;
    plan.total_hours = std::max(plan.total_hours, finish[s.spec.name]);
    plan.total_cost += sp.cost;
    index[s.spec.name] = plan.stages.size();
    plan.stages.push_back(std::move(sp));
  }
  // Present stages in file order, not dependency order.
  std::vector<StagePlan> ordered;
  for (const auto& s : p.stages) ordered.push_back(plan.stages[index[s.spec.name]]);
  plan.stages = std::move(ordered);
  std::vector<std::string> unknown;  // file order, like the stages
  for (const auto& s : plan.stages)
    if (s.source == EstimateSource::kUnknown) unknown.push_back(s.name);
  plan.unknown_stages = std::move(unknown);
  return plan;
}

std::string PlanToJson(const Plan& plan) {
  nlohmann::ordered_json stages = nlohmann::ordered_json::array();
  for (const auto& s : plan.stages) {
    nlohmann::ordered_json j = {
        {"name", s.name},
        {"kind", std::string(ToString(s.kind))},
        {"instance", s.instance},
        {"count", s.count},
        {"market", s.market},
        {"hours", Round(s.hours, 3)},
        {"cost_usd", s.cost.usd()},
        {"on_demand_cost_usd", s.on_demand_cost.usd()},
        {"expected_interruptions", Round(s.expected_interruptions, 3)},
        {"expected_interruption_cost_usd", s.expected_interruption_cost.usd()},
        {"cached", s.cached},
        {"estimate_source", std::string(ToString(s.source))}};
    if (s.source == EstimateSource::kHistory) j["history_runs"] = s.history_runs;
    if (!s.cheaper_instance.empty())
      j["cheaper_alternative"] = {{"instance", s.cheaper_instance},
                                  {"cost_usd", s.cheaper_cost.usd()}};
    if (s.tokens_per_second > 0) j["tokens_per_second"] = Round(s.tokens_per_second, 1);
    if (s.kind == StageKind::kTrain && s.mfu > 0) j["mfu"] = Round(s.mfu, 3);
    if (s.kind == StageKind::kDeploy || s.kind == StageKind::kBenchmark) {
      j["ms_per_token"] = Round(s.ms_per_token, 2);
      j["ttft_ms"] = Round(s.ttft_ms, 1);
      j["usd_per_million_tokens"] = Round(s.usd_per_million_tokens, 3);
      if (s.replicas_per_instance > 0) {
        j["replicas_per_instance"] = s.replicas_per_instance;
        j["neuron_cores_per_instance"] = s.replicas_per_instance * s.tp_degree;
        if (s.max_concurrency > 0) j["max_concurrency"] = s.max_concurrency;
        j["per_replica"] = {{"tokens_per_second", Round(s.replica_tokens_per_second, 1)},
                            {"ms_per_token", Round(s.ms_per_token, 2)},
                            {"ttft_ms", Round(s.ttft_ms, 1)}};
        j["per_instance"] = {{"tokens_per_second", Round(s.instance_tokens_per_second, 1)},
                             {"usd_per_million_tokens", Round(s.usd_per_million_tokens, 3)}};
      }
    }
    stages.push_back(std::move(j));
  }
  nlohmann::ordered_json out = {{"pipeline", plan.pipeline},
                                {"stages", stages},
                                {"total_hours", Round(plan.total_hours, 3)},
                                {"total_cost_usd", plan.total_cost.usd()},
                                {"unknown_stages", plan.unknown_stages}};
  if (plan.speed > 0) out["speed"] = plan.speed;
  return out.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

std::string PlanToTable(const Plan& plan) {
  size_t w = 5;
  for (const auto& s : plan.stages) w = std::max(w, s.name.size());
  auto source_of = [](const StagePlan& s) {
    if (s.source == EstimateSource::kHistory)
      return "history (" + std::to_string(s.history_runs) +
             (s.history_runs == 1 ? " run)" : " runs)");
    return std::string(ToString(s.source));
  };
  size_t sw = 6;
  for (const auto& s : plan.stages) sw = std::max(sw, source_of(s).size());
  std::string out = Line(Format("%-*s  %-8s  %-18s  %-9s  %8s  %10s  %10s  %-*s  %s",
                                 static_cast<int>(w), "STAGE", "KIND", "INSTANCE", "MARKET",
                                 "HOURS", "COST", "ON-DEMAND", static_cast<int>(sw), "SOURCE",
                                 "NOTES"));
  for (const auto& s : plan.stages) {
    std::string notes;
    bool unknown = s.source == EstimateSource::kUnknown;
    if (unknown)
      notes = "length unknown: counted at the 60 s billing minimum; give it an `estimate:`";
    if (s.expected_interruptions > 0.005) {
      char b[96];
      std::snprintf(b, sizeof b, "%s~%.2f interruptions (~%s lost)", notes.empty() ? "" : "; ",
                    s.expected_interruptions, s.expected_interruption_cost.ToDollars().c_str());
      notes += b;
    }
    if (s.ms_per_token > 0) {
      char b[160];
      std::snprintf(b, sizeof b, "%s%.0f tok/s, %.2f ms/token, TTFT %.0f ms, $%.3f/M tokens",
                    notes.empty() ? "" : "; ", s.tokens_per_second, s.ms_per_token, s.ttft_ms,
                    s.usd_per_million_tokens);
      notes += b;
      if (s.replicas_per_instance > 0) {
        std::snprintf(b, sizeof b, "; %d x tp%d per instance, %.0f tok/s per replica",
                      s.replicas_per_instance, s.tp_degree, s.replica_tokens_per_second);
        notes += b;
        if (s.max_concurrency > 0) notes += ", " + std::to_string(s.max_concurrency) + " in flight";
      }
    } else if (s.kind == StageKind::kTrain && s.tokens_per_second > 0) {
      char b[64];
      std::snprintf(b, sizeof b, "%s%.0f tok/s, MFU %.0f%%", notes.empty() ? "" : "; ",
                    s.tokens_per_second, 100 * s.mfu);
      notes += b;
    }
    if (s.cached) notes += std::string(notes.empty() ? "" : "; ") + "cached: $0";
    if (!s.cheaper_instance.empty())
      notes += (notes.empty() ? "" : "; ") + std::string("cheaper: ") + s.cheaper_instance + " " +
               s.cheaper_cost.ToDollars();
    std::string inst = s.instance + (s.count > 1 ? " x" + std::to_string(s.count) : "");
    char hours[32];
    std::snprintf(hours, sizeof hours, "%.2f", s.hours);
    // An unknown length shows as such: its cost is a floor, not a figure.
    std::string cost = (unknown ? ">=" : "") + s.cost.ToDollars();
    std::string on_demand = (unknown ? ">=" : "") + s.on_demand_cost.ToDollars();
    out += Line(Format("%-*s  %-8s  %-18s  %-9s  %8s  %10s  %10s  %-*s  ", static_cast<int>(w),
                       s.name.c_str(), std::string(ToString(s.kind)).c_str(), inst.c_str(),
                       s.market.c_str(), unknown ? "?" : hours, cost.c_str(), on_demand.c_str(),
                       static_cast<int>(sw), source_of(s).c_str()) +
                notes);
  }
  out += Format("total: %s%s, %.2f hours on the critical path\n",
                plan.unknown_stages.empty() ? "" : "at least ", plan.total_cost.ToDollars().c_str(),
                plan.total_hours);
  if (!plan.unknown_stages.empty()) {
    std::string names;
    for (const auto& n : plan.unknown_stages) names += (names.empty() ? "" : ", ") + n;
    size_t n = plan.unknown_stages.size();
    out += std::to_string(n) + (n == 1 ? " stage runs" : " stages run") +
           " a command of unknown length (" + names +
           "), counted at the 60 s billing minimum. Give " + (n == 1 ? "it" : "each") +
           " an `estimate:` (like `estimate: 30m`), or run the pipeline once: plan then uses "
           "the median of past runs.\n";
  }
  if (plan.speed > 0)
    out += Format("history stages planned at --speed %g: the wall time they took x %g, as a "
                  "run at that speed bills them; `estimate:` is simulated time, unscaled.\n",
                  plan.speed, plan.speed);
  return out;
}

}  // namespace trnflow::pipelines
