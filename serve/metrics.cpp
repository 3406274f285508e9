#include "serve/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
      {"trnflow_project_ready_stages",
       {"gauge", "Stages ready and waiting for a worker, by project and pool."}},
      {"trnflow_project_running_stages", {"gauge", "Stages running, by project and pool."}},
      {"trnflow_project_running_instances",
       {"gauge", "Instances a project's running stages hold, by pool: its share of the pool."}},
      {"trnflow_project_oldest_ready_age_seconds",
       {"gauge", "How long a project's oldest ready stage of a pool has waited (0: none waits)."}},
      {"trnflow_cache_hits_total", {"counter", "Attempts served from the artifact cache."}},
      {"trnflow_cache_misses_total", {"counter", "Compile attempts that had to compile."}},
      {"trnflow_budget_usd", {"gauge", "A project's budget for its period."}},
      {"trnflow_budget_spent_usd", {"gauge", "What a project's budget period has spent (ledger)."}},
      {"trnflow_budget_stops_total",
       {"counter", "Attempts a budget stopped (budget_exceeded), by project (the ledger)."}},
      {"trnflow_budget_forecast_usd",
       {"gauge", "Month-end forecast of a monthly budget's spend at its rate so far."}},
      {"trnflow_workers",
       {"gauge",
        "Workers not stopped that heartbeated in the last day: live (within their lease) or "
        "dead."}},
      {"trnflow_worker_heartbeat_age_seconds_max",
       {"gauge", "Age of the oldest heartbeat among workers not stopped."}},
      {"trnflow_pool_capacity_instances", {"gauge", "Instances live workers offer, by pool."}},
      {"trnflow_schedules", {"gauge", "Cron schedules, by state."}},
      {"trnflow_schedule_fires_total", {"counter", "Schedule slots fired."}},
      {"trnflow_serve_event_clients", {"gauge", "Event streams open on this dashboard."}},
      {"trnflow_attempt_duration_seconds",
       {"histogram",
        "Wall-clock seconds from start to close of closed attempts, by pool and "
        "outcome (the ledger)."}},
      {"trnflow_queue_wait_seconds",
       {"histogram", "Seconds from a stage becoming ready to its attempt starting, by pool."}},
      {"trnflow_schedule_lag_seconds",
       {"gauge",
        "How long the earliest slot of an active schedule that has not fired is "
        "overdue (0: on time)."}},
      {"trnflow_budget_committed_usd",
       {"gauge", "What open attempts of a project with a budget have cost so far."}},
      {"trnflow_budget_forecast_low_usd",
       {"gauge", "Low end of the month-end forecast band (docs/serve.md)."}},
      {"trnflow_budget_forecast_high_usd",
       {"gauge", "High end of the month-end forecast band (docs/serve.md)."}},
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

namespace {

// A histogram's samples are named FAMILY_bucket, FAMILY_sum and FAMILY_count; the family is
// what HELP and TYPE name. Returns the family and the sample's rank within a series (bucket 0,
// sum 1, count 2); a name that is not part of a known histogram is its own family.
std::pair<std::string, int> Family(const std::string& name) {
  static const std::pair<const char*, int> suffixes[] = {
      {"_bucket", 0}, {"_sum", 1}, {"_count", 2}};
  for (const auto& [suffix, rank] : suffixes) {
    std::string sfx = suffix;
    if (name.size() <= sfx.size() || name.compare(name.size() - sfx.size(), sfx.size(), sfx) != 0)
      continue;
    std::string family = name.substr(0, name.size() - sfx.size());
    auto it = Known().find(family);
    if (it != Known().end() && std::string(it->second.type) == "histogram") return {family, rank};
  }
  return {name, 0};
}

double LeValue(const std::string& le) {
  if (le == "+Inf") return INFINITY;
  char* end = nullptr;
  double v = std::strtod(le.c_str(), &end);
  return end && *end == 0 ? v : NAN;
}

struct Sample {
  std::string name;
  int rank = 0;        // within a histogram series: bucket, sum, count
  std::string series;  // the labels without `le`: which series of the family
  double le = 0;       // a bucket's bound
  std::string labels;  // formatted, `le` last
  double value = 0;
};

}  // namespace

std::string FormatMetrics(const std::vector<schema::MetricRow>& rows) {
  std::map<std::string, std::vector<Sample>> by_family;
  std::map<std::string, std::vector<std::string>> series_order;  // first appearance
  for (const auto& r : rows) {
    auto [family, rank] = Family(r.name);
    Sample s{r.name, rank, "", 0, "", r.value};
    std::string le;
    auto j = nlohmann::json::parse(r.labels_json, nullptr, false);
    if (j.is_object())
      for (auto l = j.begin(); l != j.end(); ++l) {
        std::string v = l->is_string() ? l->get<std::string>() : l->dump();
        if (l.key() == "le" && family != r.name) {
          le = v;
          continue;
        }
        s.labels += (s.labels.empty() ? "" : ",") + l.key() + "=\"" + EscapeLabelValue(v) + "\"";
      }
    s.series = s.labels;
    if (!le.empty()) {
      s.le = LeValue(le);
      s.labels +=
          (s.labels.empty() ? "" : ",") + std::string("le=\"") + EscapeLabelValue(le) + "\"";
    }
    auto& order = series_order[family];
    if (std::find(order.begin(), order.end(), s.series) == order.end()) order.push_back(s.series);
    by_family[family].push_back(std::move(s));
  }
  std::string out;
  for (auto& [family, samples] : by_family) {
    auto it = Known().find(family);
    std::string type = it == Known().end() ? "untyped" : it->second.type;
    std::string help = it == Known().end() ? "trnflow metric" : it->second.help;
    out += "# HELP " + family + " " + help + "\n# TYPE " + family + " " + type + "\n";
    if (type == "histogram") {
      // Each series together: its buckets by bound, then its sum, then its count.
      const auto& order = series_order[family];
      auto pos = [&](const std::string& series) {
        return std::find(order.begin(), order.end(), series) - order.begin();
      };
      std::stable_sort(samples.begin(), samples.end(), [&](const Sample& a, const Sample& b) {
        if (a.series != b.series) return pos(a.series) < pos(b.series);
        if (a.rank != b.rank) return a.rank < b.rank;
        return a.rank == 0 && a.le < b.le;
      });
    }
    for (const auto& s : samples)
      out += s.name + (s.labels.empty() ? "" : "{" + s.labels + "}") + " " + Value(s.value) + "\n";
  }
  return out;
}

}  // namespace trnflow::serve
