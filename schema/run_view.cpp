// The renderers of RunView (run_view.h): a run and the list of runs, as tables and as JSON.
#include "schema/run_view.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_map>

#include "common/json_text.h"
#include "common/text_table.h"

namespace trnflow::schema {
namespace {

double Usd(const Money& m) { return static_cast<double>(m.micros()) / 1e6; }

// Matrix fan-outs shown as one entry each (`show --collapse`, the dashboard's run page): the
// expansions `base[...]` of a matrix stage, two or more, when no stage is named `base` itself
// and `expand` names neither it nor "all". Maps each stage's name to the name it is shown
// under.
std::map<std::string, std::string> MatrixNodes(const std::vector<StageRow>& stages,
                                               const std::set<std::string>& expand) {
  std::map<std::string, int> members;
  std::set<std::string> names;
  auto base = [](const std::string& name) {
    size_t open = name.find('[');
    return open != std::string::npos && open > 0 && name.back() == ']' ? name.substr(0, open)
                                                                        : std::string();
  };
  for (const auto& s : stages) {
    names.insert(s.name);
    if (std::string b = base(s.name); !b.empty()) ++members[b];
  }
  std::map<std::string, std::string> node;
  for (const auto& s : stages) {
    std::string b = base(s.name);
    bool collapse = !b.empty() && members[b] >= 2 && !names.count(b) && !expand.count(b) &&
                    !expand.count("all");
    node[s.name] = collapse ? b : s.name;
  }
  return node;
}

// What a matrix stage is, as one: the state that most needs a look first.
StageState GroupState(const std::map<StageState, int>& counts) {
  for (StageState s :
       {StageState::kRunning, StageState::kFailed, StageState::kRetryWait, StageState::kReady,
        StageState::kBlocked, StageState::kCancelled, StageState::kSkipped})
    if (counts.count(s)) return s;
  return counts.count(StageState::kCached) && !counts.count(StageState::kSucceeded)
             ? StageState::kCached
             : StageState::kSucceeded;
}

// A matrix stage's states by their text (so in the text's order): "1 failed, 3 succeeded".
std::map<std::string, int> ByText(const std::map<StageState, int>& counts) {
  std::map<std::string, int> out;
  for (const auto& [state, n] : counts) out[ToSql(state)] = n;
  return out;
}

// One stage's entry of `show --format json`.
nlohmann::json StageJson(const StageRow& s, nlohmann::json attempts,
                         std::vector<std::string> needs,
                         const std::map<int64_t, std::string>& metrics) {
  auto m = metrics.find(s.id);
  return {{"name", s.name},
          {"kind", ToSql(s.kind)},
          {"state", ToSql(s.state)},
          {"instance_type", OrNull(s.instance_type)},
          {"instance_count", s.instance_count},
          {"market", ToSql(s.market)},
          {"needs", std::move(needs)},
          {"cost_usd", Usd(s.cost)},
          {"running_cost_usd", s.state == StageState::kRunning ? nlohmann::json(s.running_cost_usd)
                                                               : nlohmann::json(nullptr)},
          {"progress",
           s.live_progress >= 0 ? nlohmann::json(s.live_progress) : nlohmann::json(nullptr)},
          {"eta_sim_seconds",
           s.live_eta_s >= 0 ? nlohmann::json(s.live_eta_s) : nlohmann::json(nullptr)},
          {"last_outcome", OrNull(ToSql(s.last_outcome))},
          {"last_message", OrNull(s.last_message)},
          {"metrics", m != metrics.end() ? nlohmann::json::parse(m->second, nullptr, false)
                                         : nlohmann::json(nullptr)},
          {"attempts", std::move(attempts)}};
}

// The table's LATEST METRICS cell: "NC util 87%, HBM 12.5/32 GiB", "" without them.
std::string MetricsCell(const std::map<int64_t, std::string>& metrics, int64_t stage_id) {
  auto it = metrics.find(stage_id);
  if (it == metrics.end()) return "";
  auto j = nlohmann::json::parse(it->second, nullptr, false);
  if (j.is_discarded() || !j.contains("neuroncore_utilization")) return "";
  char buf[96];
  std::snprintf(buf, sizeof buf, "NC util %.0f%%, HBM %.1f/%.0f GiB",
                100 * j["neuroncore_utilization"].get<double>(), j["hbm_used_gib"].get<double>(),
                j["hbm_total_gib"].get<double>());
  return buf;
}

}  // namespace

bool StageMatches(const std::string& name, const std::string& filter) {
  return filter.empty() || name == filter || name.substr(0, name.find('[')) == filter;
}

std::string SpentCell(const StageRow& s) {
  Money running = Money::FromMicros(std::llround(s.running_cost_usd * 1e6));
  return (s.cost + running).ToDollars() + (s.state == StageState::kRunning ? "*" : "");
}

std::string ProgressCell(const StageRow& s, double speed) {
  if (s.state != StageState::kRunning || s.live_progress < 0) return "";
  char buf[96];
  int n = std::snprintf(buf, sizeof buf, "%.0f%%", 100 * s.live_progress);
  if (s.live_eta_s >= 0) {
    double wall = s.live_eta_s / std::max(speed, 1e-9);
    std::snprintf(buf + n, sizeof buf - n, ", %.1f sim h left (~%.0fs)", s.live_eta_s / 3600,
                  std::ceil(wall));
  }
  return buf;
}

std::string RunStateCell(const RunRow& r) {
  return r.cancel_reason == Outcome::kBudgetExceeded ? "over budget" : ToSql(r.state);
}

std::string InstanceCell(const std::string& type, int count) {
  return type + (count > 1 ? " x" + std::to_string(count) : "");
}

nlohmann::json RunJson(const RunView& view, const std::string& stage_filter,
                       const std::optional<std::set<std::string>>& collapse) {
  const RunRow& run = view.run;
  const std::vector<StageRow>& stages = view.stages;
  std::map<std::string, std::string> node;
  if (collapse) node = MatrixNodes(stages, *collapse);
  auto shown_as = [&](const std::string& name) -> const std::string& {
    auto it = node.find(name);
    return it == node.end() ? name : it->second;
  };
  std::unordered_map<int64_t, const StageRow*> by_id;
  by_id.reserve(stages.size());
  for (const auto& s : stages) by_id[s.id] = &s;
  // A collapsed matrix stage: its expansions' states, attempts and dollars, summed.
  struct Group {
    const StageRow* first = nullptr;
    int count = 0;
    std::map<StageState, int> states;
    std::map<std::string, int> outcomes;  // by text; "running" for the open attempts
    std::set<std::string> needs;
    Money cost, wasted;
    double running_cost = 0, sim_seconds = 0;
    int attempts = 0;
    std::string first_queued, first_started, last_finished;
    bool open = false;
  };
  std::map<std::string, Group> groups;
  Money total_cost, total_wasted;
  int total_attempts = 0, interruptions = 0;
  std::unordered_map<int64_t, nlohmann::json> stage_attempts;
  for (const auto& a : view.attempts) {
    const StageRow& s = *by_id.at(a.stage_id);
    if (!StageMatches(s.name, stage_filter)) continue;
    total_wasted += a.wasted;
    ++total_attempts;
    interruptions += a.outcome == Outcome::kSpotInterruption;
    const std::string& q = a.queued_at;
    if (const std::string& n = shown_as(s.name); n != s.name) {
      Group& g = groups[n];
      ++g.attempts;
      ++g.outcomes[a.outcome ? ToSql(*a.outcome) : "running"];
      g.wasted += a.wasted;
      g.sim_seconds += a.sim_seconds;
      if (!q.empty() && (g.first_queued.empty() || q < g.first_queued)) g.first_queued = q;
      if (g.first_started.empty() || a.started_at < g.first_started) g.first_started = a.started_at;
      g.open = g.open || a.finished_at.empty();
      if (a.finished_at > g.last_finished) g.last_finished = a.finished_at;
      continue;
    }
    auto& ja = stage_attempts[a.stage_id];
    if (ja.is_null()) ja = nlohmann::json::array();
    ja.push_back({{"attempt", a.attempt},
                  {"outcome", OrNull(ToSql(a.outcome))},
                  {"worker", OrNull(a.worker)},
                  {"instance_type", OrNull(a.instance_type)},
                  {"instance_count", a.instance_count},
                  {"market", ToSql(a.market)},
                  {"price_usd_hour", Usd(a.price_per_hour)},
                  {"queued_at", OrNull(q)},
                  {"started_at", OrNull(a.started_at)},
                  {"finished_at", OrNull(a.finished_at)},
                  {"sim_hours", a.sim_seconds / 3600},
                  {"billed_seconds", a.billed_seconds},
                  {"cost_usd", Usd(a.cost)},
                  {"wasted_usd", Usd(a.wasted)},
                  {"saved_usd", Usd(a.saved)},
                  {"progress_from", a.progress_from},
                  {"progress_to", a.progress_to},
                  {"message", OrNull(a.message)}});
  }
  nlohmann::json js = nlohmann::json::array();
  std::map<std::string, size_t> group_at;  // a group's place in `js`, kept where its first is
  for (const auto& s : stages) {
    if (!StageMatches(s.name, stage_filter)) continue;
    total_cost += s.cost;
    const std::string& n = shown_as(s.name);
    std::vector<std::string> needs;
    std::set<std::string> seen;
    for (const auto& x : s.needs)
      if (const std::string& m = shown_as(x); m != n && (!collapse || seen.insert(m).second))
        needs.push_back(m);
    if (n == s.name) {
      auto it = stage_attempts.find(s.id);
      js.push_back(StageJson(s, it == stage_attempts.end() ? nlohmann::json::array()
                                                           : std::move(it->second),
                             std::move(needs), view.metrics));
      continue;
    }
    Group& g = groups[n];
    if (!g.first) g.first = &s, group_at[n] = js.size(), js.push_back(nullptr);
    ++g.count;
    ++g.states[s.state];
    g.needs.insert(needs.begin(), needs.end());
    g.cost += s.cost;
    if (s.state == StageState::kRunning) g.running_cost += s.running_cost_usd;
  }
  for (auto& [n, g] : groups) {
    if (!g.first) continue;
    bool running = g.states.count(StageState::kRunning) > 0;
    js[group_at[n]] = {
        {"name", n},
        {"kind", ToSql(g.first->kind)},
        {"state", ToSql(GroupState(g.states))},
        {"instance_type", OrNull(g.first->instance_type)},
        {"instance_count", g.first->instance_count},
        {"market", ToSql(g.first->market)},
        {"needs", std::vector<std::string>(g.needs.begin(), g.needs.end())},
        {"cost_usd", Usd(g.cost)},
        {"running_cost_usd", running ? nlohmann::json(g.running_cost) : nlohmann::json(nullptr)},
        {"progress", nullptr},
        {"eta_sim_seconds", nullptr},
        {"last_outcome", nullptr},
        {"last_message", nullptr},
        {"metrics", nullptr},
        {"attempts", nlohmann::json::array()},
        {"matrix",
         {{"count", g.count},
          {"states", ByText(g.states)},
          {"attempts", g.attempts},
          {"outcomes", g.outcomes},
          {"sim_hours", g.sim_seconds / 3600},
          {"wasted_usd", Usd(g.wasted)},
          {"first_queued_at", OrNull(g.first_queued)},
          {"first_started_at", OrNull(g.first_started)},
          {"last_finished_at", g.open ? nlohmann::json(nullptr) : OrNull(g.last_finished)}}}};
  }
  nlohmann::json out = {
      {"run",
       {{"run_id", std::to_string(run.id)},
        {"project", run.project},
        {"pipeline", run.pipeline},
        {"state", ToSql(run.state)},
        {"cancel_reason", OrNull(ToSql(run.cancel_reason))},
        {"budget_usd", run.budget ? nlohmann::json(Usd(*run.budget)) : nlohmann::json(nullptr)},
        {"speed", run.speed},
        {"seed", run.seed},
        {"created_at", run.created_at},
        {"finished_at", OrNull(run.finished_at)},
        {"cost_usd", Usd(run.cost)},
        // Set when the process running it (`trnflow run`) is gone: what happened, what to do.
        {"holder_gone", run.state == RunState::kRunning ? OrNull(view.holder_gone.value_or(""))
                                                        : nlohmann::json(nullptr)}}},
      {"stages", std::move(js)}};
  if (collapse)
    out["totals"] = {{"stages", stages.size()},
                     {"cost_usd", Usd(total_cost)},
                     {"wasted_usd", Usd(total_wasted)},
                     {"attempts", total_attempts},
                     {"spot_interruptions", interruptions}};
  return out;
}

std::string RunTable(const RunView& view, const std::string& stage_filter, bool collapse) {
  const RunRow& run = view.run;
  const std::vector<StageRow>& stages = view.stages;
  std::string out;
  std::string state = RunStateCell(run);
  double running = 0;
  for (const auto& s : stages) running += s.running_cost_usd;
  out += "run " + std::to_string(run.id) + "  " + run.pipeline + "  project " + run.project +
         "  " + state + "  created " + run.created_at +
         (run.finished_at.empty() ? "" : "  finished " + run.finished_at) + "  spent " +
         run.cost.ToDollars() + (running > 0 ? " (running attempts included, marked *)" : "") +
         (run.budget ? "  budget " + run.budget->ToDollars() : std::string()) + "\n";
  for (const auto& w : view.warnings) out += "! " + w + "\n";
  out += "\n";
  if (stage_filter.empty()) {
    std::vector<std::vector<std::string>> rows;
    rows.reserve(stages.size());
    auto node = collapse ? MatrixNodes(stages, {}) : std::map<std::string, std::string>();
    // A collapsed matrix stage: one line, where its first expansion is, summed over them all.
    struct Group {
      size_t row = 0;
      int count = 0, attempts = 0;
      std::map<StageState, int> states;
      double seconds = 0;
      Money spent;
      bool running = false;
    };
    std::map<std::string, Group> groups;
    for (const auto& s : stages) {
      double seconds = static_cast<double>(s.billed_seconds) + std::max(0.0, s.live_sim_seconds);
      auto n = node.find(s.name);
      if (n == node.end() || n->second == s.name) {
        rows.push_back({s.name, ToSql(s.kind), ToSql(s.state), std::to_string(s.attempts),
                        InstanceCell(s.instance_type, s.instance_count), ToSql(s.market),
                        Hours(seconds), SpentCell(s), ProgressCell(s, run.speed),
                        MetricsCell(view.metrics, s.id)});
        continue;
      }
      auto [g, fresh] = groups.try_emplace(n->second);
      if (fresh) {
        g->second.row = rows.size();
        rows.push_back({"", ToSql(s.kind), "", "", InstanceCell(s.instance_type, s.instance_count),
                        ToSql(s.market), "", "", "", ""});
      }
      Group& x = g->second;
      ++x.count;
      x.attempts += s.attempts;
      ++x.states[s.state];
      x.seconds += seconds;
      x.spent += s.cost + Money::FromMicros(std::llround(s.running_cost_usd * 1e6));
      x.running = x.running || s.state == StageState::kRunning;
    }
    for (const auto& [name, g] : groups) {
      std::string states;
      for (const auto& [st, k] : ByText(g.states))
        states += (states.empty() ? "" : ", ") + std::to_string(k) + " " + st;
      auto& row = rows[g.row];
      row[0] = name + " x" + std::to_string(g.count);
      row[2] = states;
      row[3] = std::to_string(g.attempts);
      row[6] = Hours(g.seconds);
      row[7] = g.spent.ToDollars() + (g.running ? "*" : "");
    }
    out += Table({"STAGE", "KIND", "STATE", ">ATTEMPTS", "INSTANCE", "MARKET", ">SIM HOURS",
                  ">SPENT", "PROGRESS", "LATEST METRICS"},
                 rows);
    return out;
  }
  bool first = true;
  for (const auto& s : stages) {
    if (!StageMatches(s.name, stage_filter)) continue;
    std::vector<std::vector<std::string>> rows;
    out += std::string(first ? "" : "\n") + "stage " + s.name + " (" + ToSql(s.kind) + ")  " +
           ToSql(s.state) + "\n";
    first = false;
    if (auto w = view.waits.find(s.id); w != view.waits.end())
      for (const auto& line : w->second) out += "  - " + line + "\n";
    out += "\n";
    // The attempts are ordered by stage: this stage's are one stretch of them.
    auto from = std::lower_bound(view.attempts.begin(), view.attempts.end(), s.id,
                                 [](const AttemptRow& a, int64_t id) { return a.stage_id < id; });
    for (auto a = from; a != view.attempts.end() && a->stage_id == s.id; ++a) {
      bool open = !a->outcome;
      rows.push_back(
          {std::to_string(a->attempt), open ? "running" : ToSql(*a->outcome), a->worker,
           InstanceCell(a->instance_type, a->instance_count), ToSql(a->market), a->started_at,
           Hours(open ? std::max(0.0, s.live_sim_seconds) : a->sim_seconds),
           open ? Money::FromMicros(std::llround(s.running_cost_usd * 1e6)).ToDollars() + "*"
                : a->cost.ToDollars(),
           a->wasted.ToDollars(), open ? ProgressCell(s, run.speed) : a->message});
    }
    out += Table({">ATTEMPT", "OUTCOME", "WORKER", "INSTANCE", "MARKET", "STARTED", ">SIM HOURS",
                  ">COST", ">WASTED", "WHY"},
                 rows);
  }
  return out;
}

std::string RunSummaryTable(const std::vector<StageRow>& stages) {
  std::vector<std::vector<std::string>> rows;
  Money total;
  for (const auto& s : stages) {
    rows.push_back({s.name, ToSql(s.state), std::to_string(s.attempts),
                    s.instance_type + " x" + std::to_string(s.instance_count), ToSql(s.market),
                    Hours(static_cast<double>(s.billed_seconds)), s.cost.ToDollars()});
    total += s.cost;
  }
  rows.push_back({"total", "", "", "", "", "", total.ToDollars()});
  return Table({"STAGE", "STATE", ">ATTEMPTS", "INSTANCE", "MARKET", ">SIM HOURS", ">COST"}, rows);
}

nlohmann::json RunListJson(const std::vector<RunRow>& runs) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : runs)
    out.push_back({{"run_id", std::to_string(r.id)},
                   {"project", r.project},
                   {"pipeline", r.pipeline},
                   {"state", ToSql(r.state)},
                   {"cancel_reason", OrNull(ToSql(r.cancel_reason))},
                   {"created_at", r.created_at},
                   {"finished_at", r.finished_at.empty() ? nlohmann::json(nullptr)
                                                         : nlohmann::json(r.finished_at)},
                   {"cost_usd", Usd(r.cost)},
                   {"wasted_usd", Usd(r.wasted)}});
  return out;
}

std::string RunListTable(const std::vector<RunRow>& runs, const std::string& project) {
  if (runs.empty()) return "no runs" + (project.empty() ? "" : " in project " + project) + "\n";
  std::vector<std::vector<std::string>> rows;
  for (const auto& r : runs)
    rows.push_back({std::to_string(r.id), r.pipeline, r.project, RunStateCell(r), r.created_at,
                    r.cost.ToDollars(), r.budget ? r.budget->ToDollars() : ""});
  return Table({">RUN", "PIPELINE", "PROJECT", "STATE", "CREATED", ">COST", ">BUDGET"}, rows);
}

}  // namespace trnflow::schema
