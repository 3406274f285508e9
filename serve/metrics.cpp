#include "serve/metrics.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

namespace trnflow::serve {
namespace {

struct Meta {
  const char* type;
  const char* help;
};

// Counters end in _total and are sums over the append-only ledger; gauges are the live state.
const std::map<std::string, Meta>& Known() {
  static const std::map<std::string, Meta> known = {
      {"trnflow_attempts_total", {"counter", "Closed attempts, by outcome (the ledger)."}},
      {"trnflow_spot_interruptions_total",
       {"counter", "Attempts ended by a spot interruption, by instance type."}},
      {"trnflow_spend_usd_total", {"counter", "Dollars charged by closed attempts (the ledger)."}},
      {"trnflow_wasted_usd_total",
       {"counter", "Dollars of work lost to interruptions and failures (the ledger)."}},
      {"trnflow_saved_usd_total",
       {"counter", "Dollars saved against on-demand and the GPU baseline (the ledger)."}},
      {"trnflow_billed_seconds_total",
       {"counter", "Billed instance-seconds of closed attempts, by instance type."}},
      {"trnflow_running_spend_usd",
       {"gauge", "Dollars that open attempts have cost so far (not yet in the ledger)."}},
      {"trnflow_runs", {"gauge", "Runs in the catalog, by state."}},
      {"trnflow_runs_finished_total", {"counter", "Runs that finished, by final state."}},
      {"trnflow_stages", {"gauge", "Unfinished stages, by pool and state."}},
      {"trnflow_queue_ready_stages", {"gauge", "Stages ready and waiting for a worker, by pool."}},
      {"trnflow_queue_oldest_ready_age_seconds",
       {"gauge", "How long the oldest ready stage of a pool has waited."}},
      {"trnflow_cache_hits_total", {"counter", "Attempts served from the artifact cache."}},
      {"trnflow_cache_misses_total", {"counter", "Compile attempts that had to compile."}},
      {"trnflow_budget_usd", {"gauge", "A project's budget for its period."}},
      {"trnflow_budget_spent_usd", {"gauge", "What a project's budget period has spent (ledger)."}},
      {"trnflow_budget_forecast_usd",
       {"gauge", "Month-end forecast of a monthly budget's spend at its rate so far."}},
      {"trnflow_workers", {"gauge", "Workers not stopped, live (heartbeat within 60 s) or stale."}},
      {"trnflow_worker_heartbeat_age_seconds_max",
       {"gauge", "Age of the oldest heartbeat among workers not stopped."}},
      {"trnflow_pool_capacity_instances", {"gauge", "Instances live workers offer, by pool."}},
      {"trnflow_schedules", {"gauge", "Cron schedules, by state."}},
      {"trnflow_schedule_fires_total", {"counter", "Schedule slots fired."}},
      {"trnflow_serve_event_clients", {"gauge", "Event streams open on this dashboard."}},
  };
  return known;
}

std::string Value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);  // the shortest text that reads back as v
  return std::string(buf, r.ptr);
}

}  // namespace

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string FormatMetrics(const std::vector<schema::MetricRow>& rows) {
  std::map<std::string, std::vector<const schema::MetricRow*>> by_name;
  for (const auto& r : rows) by_name[r.name].push_back(&r);
  std::string out;
  for (const auto& [name, samples] : by_name) {
    auto it = Known().find(name);
    std::string type = it == Known().end() ? "untyped" : it->second.type;
    std::string help = it == Known().end() ? "trnflow metric" : it->second.help;
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    for (const auto* s : samples) {
      std::string labels;
      auto j = nlohmann::json::parse(s->labels_json, nullptr, false);
      if (j.is_object())
        for (auto l = j.begin(); l != j.end(); ++l)
          labels += (labels.empty() ? "" : ",") + l.key() + "=\"" +
                    EscapeLabelValue(l->is_string() ? l->get<std::string>() : l->dump()) + "\"";
      out += name + (labels.empty() ? "" : "{" + labels + "}") + " " + Value(s->value) + "\n";
    }
  }
  return out;
}

}  // namespace trnflow::serve
