#include "common/stage_spec.h"

#include <array>
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
  nlohmann::json on = nlohmann::json::array();
  for (Outcome o : s.retry.on) on.push_back(ToString(o));
  nlohmann::json j = {
      {"name", s.name},
      {"kind", ToString(s.kind)},
      {"instance", s.instance},
      {"count", s.count},
      {"market", ToString(s.market)},
      {"command",
       {{"argv", s.command.argv},
        {"shell", s.command.shell},
        {"env", s.command.env},
        {"secrets", s.command.secrets},
        {"outputs", s.command.outputs ? nlohmann::json(*s.command.outputs) : nullptr}}},
      {"workload",
       s.workload_json.empty() ? nlohmann::json(nullptr) : nlohmann::json::parse(s.workload_json)},
      {"retry",
       {{"max_attempts", s.retry.max_attempts},
        {"on", on},
        {"backoff",
         {{"initial_s", s.retry.backoff.initial_s},
          {"factor", s.retry.backoff.factor},
          {"max_s", s.retry.backoff.max_s}}},
        {"max_interruptions", s.retry.max_interruptions},
        {"then", s.retry.then_market}}},
      {"checkpoint", {{"every_s", s.checkpoint.every_s}, {"on_notice", s.checkpoint.on_notice}}},
      {"timeout_s", s.timeout_s},
      {"cache", s.cache},
      {"cache_key", s.cache_key},
      {"cache_inputs", s.cache_inputs},
  };
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
    const auto& c = j.at("command");
    s.command.argv = c.at("argv").get<std::vector<std::string>>();
    s.command.shell = c.at("shell").get<bool>();
    s.command.env = c.at("env").get<std::map<std::string, std::string>>();
    if (c.contains("secrets")) s.command.secrets = c.at("secrets").get<std::vector<std::string>>();
    if (c.contains("outputs") && !c.at("outputs").is_null())
      s.command.outputs = c.at("outputs").get<std::vector<std::string>>();
    if (!j.at("workload").is_null()) s.workload_json = j.at("workload").dump();
    const auto& r = j.at("retry");
    s.retry.max_attempts = r.at("max_attempts").get<int>();
    s.retry.on.clear();
    for (const auto& o : r.at("on"))
      s.retry.on.push_back(ParseOutcome(o.get<std::string>()).value());
    s.retry.backoff.initial_s = r.at("backoff").at("initial_s").get<double>();
    s.retry.backoff.factor = r.at("backoff").at("factor").get<double>();
    s.retry.backoff.max_s = r.at("backoff").at("max_s").get<double>();
    s.retry.max_interruptions = r.at("max_interruptions").get<int>();
    s.retry.then_market = r.at("then").get<std::string>();
    s.checkpoint.every_s = j.at("checkpoint").at("every_s").get<double>();
    s.checkpoint.on_notice = j.at("checkpoint").at("on_notice").get<bool>();
    s.timeout_s = j.at("timeout_s").get<double>();
    s.cache = j.at("cache").get<bool>();
    s.cache_key = j.value("cache_key", "");
    s.cache_inputs = j.value("cache_inputs", "");
    return s;
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("malformed stage spec in the catalog: ") + e.what());
  }
}

}  // namespace trnflow
