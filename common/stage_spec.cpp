#include "common/stage_spec.h"

#include <array>
#include <cmath>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace trnflow {
namespace {

constexpr std::array<std::string_view, 5> kKinds = {"run", "train", "compile", "deploy",
                                                    "benchmark"};
constexpr std::array<std::string_view, 2> kMarkets = {"on-demand", "spot"};
constexpr std::array<std::string_view, 9> kStates = {"blocked",    "ready",     "running",
                                                     "retry_wait", "succeeded", "cached",
                                                     "failed",     "skipped",   "cancelled"};
constexpr std::array<std::string_view, 11> kOutcomes = {
    "succeeded", "cached",      "failed",     "spot_interruption", "capacity_unavailable", "lost",
    "timeout",   "infra_error", "user_error", "cancelled",         "budget_exceeded"};

template <typename E, size_t N>
std::optional<E> Lookup(const std::array<std::string_view, N>& names, std::string_view s) {
  for (size_t i = 0; i < N; ++i)
    if (names[i] == s) return static_cast<E>(i);
  return std::nullopt;
}

}  // namespace

std::string_view ToString(StageKind v) { return kKinds[static_cast<size_t>(v)]; }
std::string_view ToString(Market v) { return kMarkets[static_cast<size_t>(v)]; }
std::string_view ToString(StageState v) { return kStates[static_cast<size_t>(v)]; }
std::string_view ToString(Outcome v) { return kOutcomes[static_cast<size_t>(v)]; }
std::optional<StageKind> ParseStageKind(std::string_view s) { return Lookup<StageKind>(kKinds, s); }
std::optional<Market> ParseMarket(std::string_view s) { return Lookup<Market>(kMarkets, s); }
std::optional<StageState> ParseStageState(std::string_view s) {
  return Lookup<StageState>(kStates, s);
}
std::optional<Outcome> ParseOutcome(std::string_view s) { return Lookup<Outcome>(kOutcomes, s); }

bool IsPreemption(Outcome o) {
  return o == Outcome::kSpotInterruption || o == Outcome::kCapacityUnavailable ||
         o == Outcome::kLost;
}

bool IsTerminal(StageState s) {
  switch (s) {
    case StageState::kSucceeded:
    case StageState::kCached:
    case StageState::kFailed:
    case StageState::kSkipped:
    case StageState::kCancelled:
      return true;
    default:
      return false;
  }
}

std::string SubstituteRunExpressions(const std::string& text, const std::string& run_id,
                                     const std::string& run_dir) {
  std::string out = text;
  for (const auto& [expr, value] :
       {std::pair<std::string, std::string>{"${{ run.id }}", run_id}, {"${{ run.dir }}", run_dir}})
    for (size_t pos = out.find(expr); pos != std::string::npos;
         pos = out.find(expr, pos + value.size()))
      out.replace(pos, expr.size(), value);
  return out;
}

std::string ToJson(const StageSpec& s) {
  static const StageSpec d;
  nlohmann::json j = {{"name", s.name},
                      {"kind", ToString(s.kind)},
                      {"instance", s.instance},
                      {"count", s.count},
                      {"market", ToString(s.market)}};
  nlohmann::json c = nlohmann::json::object();
  if (!s.command.argv.empty()) c["argv"] = s.command.argv;
  if (s.command.shell) c["shell"] = true;
  if (!s.command.env.empty()) c["env"] = s.command.env;
  if (!s.command.secrets.empty()) c["secrets"] = s.command.secrets;
  if (s.command.outputs) c["outputs"] = *s.command.outputs;
  if (s.command.network) c["network"] = "host";
  if (!c.empty()) j["command"] = std::move(c);
  if (!s.workload_json.empty()) j["workload"] = nlohmann::json::parse(s.workload_json);
  if (s.retry != d.retry) {
    nlohmann::json on = nlohmann::json::array();
    for (Outcome o : s.retry.on) on.push_back(ToString(o));
    j["retry"] = {{"max_attempts", s.retry.max_attempts},
                  {"on", on},
                  {"backoff",
                   {{"initial_s", s.retry.backoff.initial_s},
                    {"factor", s.retry.backoff.factor},
                    {"max_s", s.retry.backoff.max_s}}},
                  {"max_interruptions", s.retry.max_interruptions},
                  {"then", s.retry.then_market}};
  }
  if (s.checkpoint != d.checkpoint)
    j["checkpoint"] = {{"every_s", s.checkpoint.every_s}, {"on_notice", s.checkpoint.on_notice}};
  if (s.timeout_s != d.timeout_s) j["timeout_s"] = s.timeout_s;
  if (s.priority != d.priority) j["priority"] = s.priority;
  if (s.estimate_s > 0) j["estimate_s"] = s.estimate_s;
  if (s.cache) j["cache"] = true;
  if (!s.cache_key.empty()) j["cache_key"] = s.cache_key;
  if (!s.cache_inputs.empty()) j["cache_inputs"] = s.cache_inputs;
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

StageSpec StageSpecFromJson(std::string_view text) {
  try {
    auto j = nlohmann::json::parse(text);
    StageSpec s;
    s.name = j.at("name").get<std::string>();
    s.kind = ParseStageKind(j.at("kind").get<std::string>()).value();
    s.instance = j.at("instance").get<std::string>();
    s.count = j.at("count").get<int>();
    s.market = ParseMarket(j.at("market").get<std::string>()).value();
    if (auto c = j.find("command"); c != j.end()) {
      if (c->contains("argv")) s.command.argv = c->at("argv").get<std::vector<std::string>>();
      s.command.shell = c->value("shell", false);
      if (c->contains("env"))
        s.command.env = c->at("env").get<std::map<std::string, std::string>>();
      if (c->contains("secrets"))
        s.command.secrets = c->at("secrets").get<std::vector<std::string>>();
      if (c->contains("outputs") && !c->at("outputs").is_null())
        s.command.outputs = c->at("outputs").get<std::vector<std::string>>();
      s.command.network = c->value("network", "") == "host";
    }
    if (auto w = j.find("workload"); w != j.end() && !w->is_null()) s.workload_json = w->dump();
    if (auto r = j.find("retry"); r != j.end()) {
      s.retry.max_attempts = r->at("max_attempts").get<int>();
      s.retry.on.clear();
      for (const auto& o : r->at("on"))
        s.retry.on.push_back(ParseOutcome(o.get<std::string>()).value());
      s.retry.backoff.initial_s = r->at("backoff").at("initial_s").get<double>();
      s.retry.backoff.factor = r->at("backoff").at("factor").get<double>();
      s.retry.backoff.max_s = r->at("backoff").at("max_s").get<double>();
      s.retry.max_interruptions = r->at("max_interruptions").get<int>();
      s.retry.then_market = r->at("then").get<std::string>();
    }
    if (auto c = j.find("checkpoint"); c != j.end()) {
      s.checkpoint.every_s = c->at("every_s").get<double>();
      s.checkpoint.on_notice = c->at("on_notice").get<bool>();
    }
    s.timeout_s = j.value("timeout_s", 0.0);
    s.priority = j.value("priority", 0);
    // Only a budget's first reservation reads it: anything but a sane number is no estimate.
    if (auto e = j.find("estimate_s"); e != j.end() && e->is_number()) {
      double v = e->get<double>();
      if (std::isfinite(v) && v > 0 && v <= 1e9) s.estimate_s = v;
    }
    s.cache = j.value("cache", false);
    s.cache_key = j.value("cache_key", "");
    s.cache_inputs = j.value("cache_inputs", "");
    return s;
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("malformed stage spec in the catalog: ") + e.what());
  }
}

}  // namespace trnflow
