// trnflow validate / plan / runs / show / logs / instances / models: commands that read.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <thread>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "scheduler/admission.h"
#include "common/env.h"
#include "common/error.h"
#include "common/file_names.h"
#include "pipelines/diagnostics.h"
#include "pipelines/plan.h"
#include "serve/client.h"
#include "sim/catalog.h"

namespace trnflow::cli {
namespace {

double Usd(const Money& m) { return static_cast<double>(m.micros()) / 1e6; }

std::string InstanceCell(const std::string& type, int count) {
  return type + (count > 1 ? " x" + std::to_string(count) : "");
}

}  // namespace

int CmdValidate(const std::vector<std::string>& files, const std::string& format) {
  int bad = 0;
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& f : files) {
    auto r = pipelines::LoadPipelineFile(f, {{}, {}, CatalogStageBound()});
    bool ok = !r.diagnostics.has_errors();
    if (!ok) ++bad;
    if (format == "json") {
      nlohmann::ordered_json diags = nlohmann::ordered_json::array();
      int warnings = 0;
      for (const auto& d : r.diagnostics.all()) {
        bool error = d.severity == pipelines::Severity::kError;
        warnings += error ? 0 : 1;
        diags.push_back(
            {{"file", f},
             {"line", d.loc.line > 0 ? nlohmann::json(d.loc.line) : nlohmann::json(nullptr)},
             {"col", d.loc.col > 0 ? nlohmann::json(d.loc.col) : nlohmann::json(nullptr)},
             {"severity", error ? "error" : "warning"},
             {"message", d.message},
             {"hint", OrNull(d.hint)}});
      }
      out.push_back(
          {{"file", f},
           {"ok", ok},
           {"pipeline", ok ? OrNull(r.pipeline->name) : nlohmann::json(nullptr)},
           {"stages", ok ? nlohmann::json(r.pipeline->stages.size()) : nlohmann::json(nullptr)},
           {"errors", r.diagnostics.error_count()},
           {"warnings", warnings},
           {"diagnostics", diags}});
      continue;
    }
    std::cerr << r.diagnostics.Format();
    if (!ok) {
      int n = r.diagnostics.error_count();
      std::cerr << n << (n == 1 ? " error" : " errors") << " in " << f << "\n";
    } else {
      size_t n = r.pipeline->stages.size();
      std::cout << f << ": ok (" << n << (n == 1 ? " stage)\n" : " stages)\n");
    }
  }
  if (format == "json") std::cout << out.dump(2) << "\n";
  return bad ? kExitBadInput : kExitOk;
}

int CmdPlan(const RunArgs& a) {
  auto pipeline = LoadForSubmit(a);  // loaded as `run` and `submit` load it
  if (!pipeline) return kExitBadInput;
  // The cache and past runs come from the catalog when it is reachable; without it the plan
  // still prices every simulated stage and every run: stage with an estimate:.
  std::unique_ptr<schema::Catalog> catalog;
  pipelines::Plan plan;
  try {
    catalog = OpenCatalog();
    plan = scheduler::EstimatePlan(*pipeline, catalog.get(), a.speed);
  } catch (const CatalogUnavailable& e) {
    std::cerr << "trnflow: note: planning without the catalog (" << e.what()
              << "): no compile cache, no past runs\n";
    plan = scheduler::EstimatePlan(*pipeline, nullptr, a.speed);
  }
  std::cout << (a.format == "json" ? pipelines::PlanToJson(plan) : pipelines::PlanToTable(plan));
  return kExitOk;
}

nlohmann::json RunsJson(schema::Catalog& catalog, const schema::RunsQuery& query) {
  RequireProject(catalog, query.project);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : catalog.ListRuns(query))
    out.push_back({{"run_id", std::to_string(r.id)},
                   {"project", r.project},
                   {"pipeline", r.pipeline},
                   {"state", r.state},
                   {"cancel_reason", OrNull(r.cancel_reason)},
                   {"created_at", r.created_at},
                   {"finished_at", r.finished_at.empty() ? nlohmann::json(nullptr)
                                                         : nlohmann::json(r.finished_at)},
                   {"cost_usd", Usd(r.cost)},
                   {"wasted_usd", Usd(r.wasted)}});
  return out;
}

int CmdRuns(const schema::RunsQuery& query, const std::string& format) {
  auto catalog = OpenCatalog();
  if (format == "json") {
    std::cout << RunsJson(*catalog, query).dump(2) << "\n";
    return kExitOk;
  }
  RequireProject(*catalog, query.project);
  const std::string& project = query.project;
  auto runs = catalog->ListRuns(query);
  std::vector<std::vector<std::string>> rows;
  for (const auto& r : runs)
    rows.push_back({std::to_string(r.id), r.pipeline, r.project,
                    r.cancel_reason == "budget_exceeded" ? "over budget" : r.state, r.created_at,
                    r.cost.ToDollars(), r.budget ? r.budget->ToDollars() : ""});
  if (rows.empty()) {
    std::cout << "no runs" << (project.empty() ? "" : " in project " + project) << "\n";
    return kExitOk;
  }
  std::cout << Table({">RUN", "PIPELINE", "PROJECT", "STATE", "CREATED", ">COST", ">BUDGET"}, rows);
  return kExitOk;
}

namespace {

// A stage named `filter`: by its name, or for a matrix stage by the name in the file
// ("compile" for every "compile[batch=...]").
bool StageMatches(const std::string& name, const std::string& filter) {
  return filter.empty() || name == filter || name.substr(0, name.find('[')) == filter;
}

// Matrix fan-outs shown as one entry each (`show --collapse`, the dashboard's run page): the
// expansions `base[...]` of a matrix stage, two or more, when no stage is named `base` itself
// and `expand` names neither it nor "all". Maps each stage's name to the name it is shown
// under.
std::map<std::string, std::string> MatrixNodes(const std::vector<schema::StageRow>& stages,
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
std::string GroupState(const std::map<std::string, int>& counts) {
  for (const char* s : {"running", "failed", "retry_wait", "ready", "blocked", "cancelled", "skipped"})
    if (counts.count(s)) return s;
  return counts.count("cached") && !counts.count("succeeded") ? "cached" : "succeeded";
}

// One stage's entry of `show --format json`.
nlohmann::json StageJson(const schema::StageRow& s, nlohmann::json attempts,
                         std::vector<std::string> needs, std::map<int64_t, std::string>& metrics) {
  return {{"name", s.name},
          {"kind", s.kind},
          {"state", s.state},
          {"instance_type", OrNull(s.instance_type)},
          {"instance_count", s.instance_count},
          {"market", OrNull(s.market)},
          {"needs", std::move(needs)},
          {"cost_usd", Usd(s.cost)},
          {"running_cost_usd", s.state == "running" ? nlohmann::json(s.running_cost_usd)
                                                    : nlohmann::json(nullptr)},
          {"progress",
           s.live_progress >= 0 ? nlohmann::json(s.live_progress) : nlohmann::json(nullptr)},
          {"eta_sim_seconds",
           s.live_eta_s >= 0 ? nlohmann::json(s.live_eta_s) : nlohmann::json(nullptr)},
          {"last_outcome", OrNull(s.last_outcome)},
          {"last_message", OrNull(s.last_message)},
          {"metrics", metrics.count(s.id) ? nlohmann::json::parse(metrics[s.id], nullptr, false)
                                          : nlohmann::json(nullptr)},
          {"attempts", std::move(attempts)}};
}

// `show --format json`: the run, its stages (or one, by name) and their attempts; with
// `collapse`, each matrix fan-out as one entry but those `collapse` names (MatrixNodes), and
// the run's totals.
nlohmann::json RunJson(schema::Catalog& catalog, const schema::RunRow& run,
                       const std::vector<schema::StageRow>& stages,
                       const std::vector<schema::AttemptRow>& attempts,
                       std::map<int64_t, std::string> metrics, const std::string& stage_filter,
                       const std::optional<std::set<std::string>>& collapse) {
  auto queued = catalog.AttemptQueuedAt(run.id);
  std::map<std::string, std::string> node;
  if (collapse) node = MatrixNodes(stages, *collapse);
  auto shown_as = [&](const std::string& name) {
    auto it = node.find(name);
    return it == node.end() ? name : it->second;
  };
  std::map<int64_t, const schema::StageRow*> by_id;
  for (const auto& s : stages) by_id[s.id] = &s;
  // A collapsed matrix stage: its expansions' states, attempts and dollars, summed.
  struct Group {
    const schema::StageRow* first = nullptr;
    int count = 0;
    std::map<std::string, int> states, outcomes;
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
  std::map<int64_t, nlohmann::json> stage_attempts;
  for (const auto& a : attempts) {
    const schema::StageRow& s = *by_id.at(a.stage_id);
    if (!StageMatches(s.name, stage_filter)) continue;
    total_wasted += a.wasted;
    ++total_attempts;
    interruptions += a.outcome == "spot_interruption";
    std::string q = queued[{a.stage_id, a.attempt}];
    if (std::string n = shown_as(s.name); n != s.name) {
      Group& g = groups[n];
      ++g.attempts;
      ++g.outcomes[a.outcome.empty() ? "running" : a.outcome];
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
                  {"outcome", OrNull(a.outcome)},
                  {"worker", OrNull(a.worker)},
                  {"instance_type", OrNull(a.instance_type)},
                  {"instance_count", a.instance_count},
                  {"market", OrNull(a.market)},
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
    std::string n = shown_as(s.name);
    std::vector<std::string> needs;
    std::set<std::string> seen;
    for (const auto& x : s.needs)
      if (std::string m = shown_as(x); m != n && (!collapse || seen.insert(m).second))
        needs.push_back(m);
    if (n == s.name) {
      auto it = stage_attempts.find(s.id);
      js.push_back(StageJson(s, it == stage_attempts.end() ? nlohmann::json::array()
                                                           : std::move(it->second),
                             std::move(needs), metrics));
      continue;
    }
    Group& g = groups[n];
    if (!g.first) g.first = &s, group_at[n] = js.size(), js.push_back(nullptr);
    ++g.count;
    ++g.states[s.state];
    g.needs.insert(needs.begin(), needs.end());
    g.cost += s.cost;
    if (s.state == "running") g.running_cost += s.running_cost_usd;
  }
  for (auto& [n, g] : groups) {
    if (!g.first) continue;
    bool running = g.states.count("running") > 0;
    js[group_at[n]] = {
        {"name", n},
        {"kind", g.first->kind},
        {"state", GroupState(g.states)},
        {"instance_type", OrNull(g.first->instance_type)},
        {"instance_count", g.first->instance_count},
        {"market", OrNull(g.first->market)},
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
          {"states", g.states},
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
        {"state", run.state},
        {"cancel_reason", OrNull(run.cancel_reason)},
        {"budget_usd", run.budget ? nlohmann::json(Usd(*run.budget)) : nlohmann::json(nullptr)},
        {"speed", run.speed},
        {"seed", run.seed},
        {"created_at", run.created_at},
        {"finished_at", OrNull(run.finished_at)},
        {"cost_usd", Usd(run.cost)},
        // Set when the process running it (`trnflow run`) is gone: what happened, what to do.
        {"holder_gone", run.state == "running" ? OrNull(HolderGone(catalog, run.id).value_or(""))
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

// The stage names of a run, for "did you mean" (expanded names and matrix base names).
std::vector<std::string> StageNames(const std::vector<schema::StageRow>& stages) {
  std::vector<std::string> names;
  for (const auto& s : stages) {
    names.push_back(s.name);
    std::string base = s.name.substr(0, s.name.find('['));
    if (base != s.name && std::find(names.begin(), names.end(), base) == names.end())
      names.push_back(base);
  }
  return names;
}

}  // namespace

std::optional<nlohmann::json> ShowJson(schema::Catalog& catalog, int64_t run_id,
                                       const std::optional<std::set<std::string>>& collapse) {
  auto run = catalog.GetRun(run_id);
  if (!run) return std::nullopt;
  return RunJson(catalog, *run, catalog.GetStages(run_id), catalog.GetAttempts(run_id),
                 catalog.LatestStageMetrics(run_id), "", collapse);
}

void PrintRunJson(schema::Catalog& catalog, int64_t run_id) {
  auto run = catalog.GetRun(run_id);
  if (!run) throw UserError("no run " + std::to_string(run_id) + "; `trnflow runs` lists them");
  std::cout << RunJson(catalog, *run, catalog.GetStages(run_id), catalog.GetAttempts(run_id),
                      catalog.LatestStageMetrics(run_id), "", std::nullopt)
                  .dump(2)
            << "\n";
}

int CmdShow(const std::string& run_text, const std::string& stage_filter,
            const std::string& format, bool collapse) {
  if (collapse && !stage_filter.empty())
    throw UserError("--collapse shows every stage, a matrix stage as one line; --stage NAME "
                    "shows one stage's attempts (a matrix stage: of every expansion)");
  int64_t run_id = ParseRunId(run_text);
  auto catalog = OpenCatalog();
  auto run = catalog->GetRun(run_id);
  if (!run) throw UserError("no run " + run_text + "; `trnflow runs` lists them");
  auto stages = catalog->GetStages(run_id);
  auto attempts = catalog->GetAttempts(run_id);
  auto metrics = catalog->LatestStageMetrics(run_id);
  if (!stage_filter.empty()) {
    bool found = false;
    for (const auto& s : stages) found = found || StageMatches(s.name, stage_filter);
    if (!found)
      throw UserError("run " + run_text + " has no stage '" + stage_filter + "'" +
                      NameHint(stage_filter, StageNames(stages),
                               "; `trnflow show " + run_text + "` lists them"));
  }
  if (format == "json") {
    std::optional<std::set<std::string>> groups;
    if (collapse) groups.emplace();
    std::cout << RunJson(*catalog, *run, stages, attempts, std::move(metrics), stage_filter, groups)
                     .dump(2)
              << "\n";
    return kExitOk;
  }
  std::string state = run->state;
  if (run->cancel_reason == "budget_exceeded") state = "over budget";  // as `runs` says
  double running = 0;
  for (const auto& s : stages) running += s.running_cost_usd;
  std::cout << "run " << run->id << "  " << run->pipeline << "  project " << run->project << "  "
            << state << "  created " << run->created_at
            << (run->finished_at.empty() ? "" : "  finished " + run->finished_at) << "  spent "
            << run->cost.ToDollars()
            << (running > 0 ? " (running attempts included, marked *)" : "")
            << (run->budget ? "  budget " + run->budget->ToDollars() : std::string()) << "\n";
  for (const auto& w : UnrunnableStages(*catalog, run_id, stages)) std::cout << "! " << w << "\n";
  std::cout << "\n";
  auto metrics_cell = [&](int64_t stage_id) -> std::string {
    auto it = metrics.find(stage_id);
    if (it == metrics.end()) return "";
    auto j = nlohmann::json::parse(it->second, nullptr, false);
    if (j.is_discarded() || !j.contains("neuroncore_utilization")) return "";
    char buf[96];
    std::snprintf(buf, sizeof buf, "NC util %.0f%%, HBM %.1f/%.0f GiB",
                  100 * j["neuroncore_utilization"].get<double>(), j["hbm_used_gib"].get<double>(),
                  j["hbm_total_gib"].get<double>());
    return buf;
  };
  if (stage_filter.empty()) {
    std::vector<std::vector<std::string>> rows;
    auto node = collapse ? MatrixNodes(stages, {}) : std::map<std::string, std::string>();
    // A collapsed matrix stage: one line, where its first expansion is, summed over them all.
    struct Group {
      size_t row = 0;
      int count = 0, attempts = 0;
      std::map<std::string, int> states;
      double seconds = 0;
      Money spent;
      bool running = false;
    };
    std::map<std::string, Group> groups;
    for (const auto& s : stages) {
      double seconds = static_cast<double>(s.billed_seconds) + std::max(0.0, s.live_sim_seconds);
      auto n = node.find(s.name);
      if (n == node.end() || n->second == s.name) {
        rows.push_back({s.name, s.kind, s.state, std::to_string(s.attempts),
                        InstanceCell(s.instance_type, s.instance_count), s.market, Hours(seconds),
                        SpentCell(s), ProgressCell(s, run->speed), metrics_cell(s.id)});
        continue;
      }
      auto [g, fresh] = groups.try_emplace(n->second);
      if (fresh) {
        g->second.row = rows.size();
        rows.push_back({"", s.kind, "", "", InstanceCell(s.instance_type, s.instance_count),
                        s.market, "", "", "", ""});
      }
      Group& x = g->second;
      ++x.count;
      x.attempts += s.attempts;
      ++x.states[s.state];
      x.seconds += seconds;
      x.spent += s.cost + Money::FromMicros(std::llround(s.running_cost_usd * 1e6));
      x.running = x.running || s.state == "running";
    }
    for (const auto& [name, g] : groups) {
      std::string states;
      for (const auto& [st, k] : g.states)
        states += (states.empty() ? "" : ", ") + std::to_string(k) + " " + st;
      auto& row = rows[g.row];
      row[0] = name + " x" + std::to_string(g.count);
      row[2] = states;
      row[3] = std::to_string(g.attempts);
      row[6] = Hours(g.seconds);
      row[7] = g.spent.ToDollars() + (g.running ? "*" : "");
    }
    std::cout << Table({"STAGE", "KIND", "STATE", ">ATTEMPTS", "INSTANCE", "MARKET", ">SIM HOURS",
                        ">SPENT", "PROGRESS", "LATEST METRICS"},
                       rows);
    return kExitOk;
  }
  bool first = true;
  for (const auto& s : stages) {
    if (!StageMatches(s.name, stage_filter)) continue;
    std::vector<std::vector<std::string>> rows;
    std::cout << (first ? "" : "\n") << "stage " << s.name << " (" << s.kind << ")  " << s.state
              << "\n";
    first = false;
    for (const auto& line : ExplainStageLines(*catalog, run_id, s.name))
      std::cout << "  - " << line << "\n";
    std::cout << "\n";
    for (const auto& a : attempts) {
      if (a.stage_id != s.id) continue;
      bool open = a.outcome.empty();
      rows.push_back({std::to_string(a.attempt), open ? "running" : a.outcome, a.worker,
                      InstanceCell(a.instance_type, a.instance_count), a.market, a.started_at,
                      Hours(open ? std::max(0.0, s.live_sim_seconds) : a.sim_seconds),
                      open ? Money::FromMicros(std::llround(s.running_cost_usd * 1e6)).ToDollars() +
                                 "*"
                           : a.cost.ToDollars(),
                      a.wasted.ToDollars(),
                      open ? ProgressCell(s, run->speed) : a.message});
    }
    std::cout << Table({">ATTEMPT", "OUTCOME", "WORKER", "INSTANCE", "MARKET", "STARTED",
                        ">SIM HOURS", ">COST", ">WASTED", "WHY"},
                       rows);
  }
  return kExitOk;
}

namespace {
std::string ThisHost() {
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  return host;
}

// Where a member's `trnflow logs` finds the dashboard that serves their logs.
std::string ServeUrl() {
  const char* url = std::getenv("TRNFLOW_SERVE_URL");
  std::string u = url && *url ? url : "http://127.0.0.1:8080";
  while (!u.empty() && u.back() == '/') u.pop_back();
  return u;
}

// One attempt's log read through `trnflow serve` (a member's, under the workers' TRNFLOW_HOME):
// how far it was read, and whether there is more to come.
struct ServedLog {
  int64_t offset = 0;
  bool announced = false;  // its "==> ... <==" line was printed
  bool done = false;     // complete, or it cannot be had (error says why)
  std::string error;     // "" when served
  int exit_code = 0;     // for an error: 3 (serve not reachable) or 4 (refused)
};

// Reads what follows `log.offset` of the log of `attempt` of stage `stage`: a ticket from the
// catalog with this login (trnflow.log_ticket, which checks that it is a member of the run's
// project), then GET /api/log-ticket from the dashboard, which spends it (docs/serve.md).
// Returns the text read; on failure sets log.error and log.done.
std::string ReadThroughServe(schema::Catalog& catalog, int64_t run_id, const std::string& stage,
                             int attempt, ServedLog& log) {
  std::string text;
  std::string url = ServeUrl();
  for (int pieces = 0; pieces < 1024; ++pieces) {  // 256 KiB a piece: the 64 MiB cap, and more
    schema::LogTicket ticket = catalog.IssueLogTicket(run_id, stage, attempt);
    serve::HttpAnswer a =
        serve::HttpGet(url, "/api/log-ticket?offset=" + std::to_string(log.offset),
                       {{"X-Trnflow-Log-Ticket", ticket.ticket}}, 10);
    if (a.status == 0) {
      log.error = "the dashboard (`trnflow serve`), which serves members their projects' logs, "
                  "does not answer at " + url + " (" + a.error + "): ask an operator to run "
                  "`trnflow serve` on this host, or set TRNFLOW_SERVE_URL to where it listens "
                  "(docs/serve.md, \"Logs from the command line\")";
      log.exit_code = kExitNoCatalog;
      log.done = true;
      return text;
    }
    auto body = nlohmann::json::parse(a.body, nullptr, false);
    if (a.status != 200 || !body.is_object()) {
      std::string why = body.is_object() && body.contains("error") && body["error"].is_string()
                            ? body["error"].get<std::string>()
                            : "HTTP " + std::to_string(a.status);
      log.error = "the dashboard at " + url + " refused it: " + why;
      log.exit_code = a.status == 403 || a.status == 401 ? kExitPermissionDenied : kExitNoCatalog;
      log.done = true;
      return text;
    }
    if (!body.value("available", false)) {
      log.error = "the dashboard at " + url + " does not have it either (its worker's "
                  "TRNFLOW_HOME is on another host: docs/operations.md)";
      log.exit_code = 0;
      log.done = true;
      return text;
    }
    std::string piece = body.value("text", "");
    text += piece;
    log.offset = body.value("next_offset", log.offset);
    if (body.value("complete", false)) {
      log.done = true;
      return text;
    }
    if (piece.empty() || log.offset >= body.value("size", int64_t{0})) return text;  // all so far
  }
  return text;
}
}  // namespace

int CmdLogs(const std::string& run_text, const std::string& stage, bool follow,
            const std::string& format) {
  bool json = format == "json";
  int64_t run_id = ParseRunId(run_text);
  auto catalog = OpenCatalog();
  if (!catalog->GetRun(run_id))
    throw UserError("no run " + run_text + "; `trnflow runs` lists them");
  namespace fs = std::filesystem;
  fs::path dir = RunLogDir(HomeDir(), run_id);
  auto stages = catalog->GetStages(run_id);
  if (!stage.empty() && std::none_of(stages.begin(), stages.end(),
                                     [&](const auto& s) { return StageMatches(s.name, stage); }))
    throw UserError(
        "run " + run_text + " has no stage '" + stage + "'" +
        NameHint(stage, StageNames(stages), "; `trnflow show " + run_text + "` lists them"));
  // Each attempt's log, by path: how much of it is printed. A log that is not on this host (its
  // worker ran elsewhere, with a TRNFLOW_HOME of its own) is named with the host that has it.
  std::map<std::string, std::streamoff> printed;
  std::set<std::string> elsewhere;
  // --format json: one entry per attempt, its whole text (with --follow, once the run ends);
  // "text" is null for a log on another host.
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  std::map<std::string, size_t> entry_of;  // path -> index in `out`
  // Logs this user may not open, read through `trnflow serve` (by path).
  std::map<std::string, ServedLog> served;
  int exit_code = kExitOk;
  int shown = 0;
  if (follow) InstallSignalHandlers();
  while (true) {
    // Whether this is the last pass: the run's state is read before its logs, so what its
    // attempts wrote before it ended is all printed.
    bool last = !follow;
    if (follow) {
      auto run = catalog->GetRun(run_id);
      last = !run || run->state != "running";
    }
    auto attempts = catalog->GetAttempts(run_id);
    for (const auto& s : stages) {
      if (!StageMatches(s.name, stage)) continue;
      if (s.kind != "run") continue;
      for (const auto& a : attempts) {
        if (a.stage_id != s.id) continue;
        // Where its worker wrote it (found here when TRNFLOW_HOME is shared or this is that
        // host), else this host's own TRNFLOW_HOME.
        auto log_in = [&](const std::string& home) -> fs::path {
          return AttemptLogPath(home, run_id, s.name, a.attempt);
        };
        fs::path p = log_in(a.worker_home.empty() ? HomeDir() : a.worker_home);
        std::ifstream in(p, std::ios::binary);
        if (!in && !a.worker_home.empty()) in.open(p = log_in(HomeDir()), std::ios::binary);
        if (!in) {
          std::string worker_host = a.worker.substr(0, a.worker.find(':'));
          // On this host, but not this user's to read: TRNFLOW_HOME is root's (workers run
          // jobs as per-project uids, docs/security.md). Say that, not "another host".
          std::error_code ec;
          fs::path here = log_in(a.worker_home.empty() ? HomeDir() : a.worker_home);
          (void)fs::symlink_status(here, ec);
          // A member reads it through the dashboard, which serves them their projects' logs.
          if (a.outcome != "cached" && ec == std::errc::permission_denied &&
              worker_host == ThisHost()) {
            auto [st, fresh] = served.try_emplace(here.string());
            ServedLog& log = st->second;
            if (log.done) continue;
            std::string text = ReadThroughServe(*catalog, run_id, s.name, a.attempt, log);
            if (fresh) ++shown;
            if (!log.error.empty() && log.exit_code) exit_code = std::max(exit_code, log.exit_code);
            if (json) {
              auto [e, added] = entry_of.try_emplace(here.string(), out.size());
              if (added)
                out.push_back({{"stage", s.name},
                               {"attempt", a.attempt},
                               {"path", here.string()},
                               {"host", nullptr},
                               {"text", ""},
                               {"served_by", ServeUrl()}});
              auto& entry = out[e->second];
              if (!log.error.empty()) {
                if (entry["text"] == "") entry["text"] = nullptr;
                entry["readable"] = false;
                entry["error"] = log.error;
              } else {
                entry["text"] = entry["text"].get<std::string>() + text;
              }
              continue;
            }
            if (!log.announced && (log.error.empty() || !text.empty())) {
              log.announced = true;
              std::cout << "==> " << s.name << " attempt " << a.attempt << " (" << here.string()
                        << ", through trnflow serve) <==\n";
            }
            std::cout << text;
            if (!log.error.empty())
              std::cout << (text.empty() || text.back() == '\n' ? "" : "\n") << "==> " << s.name
                        << " attempt " << a.attempt << ": its log is on this host at "
                        << here.string()
                        << ", under TRNFLOW_HOME, which only the workers' user may read; "
                        << log.error << " <==\n";
            continue;
          }
          if (a.outcome != "cached" && !a.worker_home.empty() &&
              elsewhere.insert(p.string()).second) {
            std::string there = log_in(a.worker_home).string();
            if (json)
              out.push_back({{"stage", s.name},
                             {"attempt", a.attempt},
                             {"path", there},
                             {"host", OrNull(worker_host)},
                             {"text", nullptr}});
            else
              std::cout << "==> " << s.name << " attempt " << a.attempt << ": its log is on "
                        << worker_host << " at " << there
                        << ", which this host cannot read (share TRNFLOW_HOME between hosts: "
                           "docs/operations.md) <==\n";
            ++shown;
          }
          continue;
        }
        auto [it, fresh] = printed.try_emplace(p.string(), 0);
        in.seekg(it->second);
        std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        it->second += static_cast<std::streamoff>(chunk.size());
        if (fresh) ++shown;
        if (json) {
          auto [e, added] = entry_of.try_emplace(p.string(), out.size());
          if (added)
            out.push_back({{"stage", s.name},
                           {"attempt", a.attempt},
                           {"path", p.string()},
                           {"host", nullptr},
                           {"text", ""}});
          out[e->second]["text"] = out[e->second]["text"].get<std::string>() + chunk;
          continue;
        }
        if (fresh)
          std::cout << "==> " << s.name << " attempt " << a.attempt << " (" << p.string()
                    << ") <==\n";
        std::cout << chunk;
      }
    }
    std::cout << std::flush;
    if (last) break;
    if (g_interrupted) return kExitInterrupted;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    stages = catalog->GetStages(run_id);
  }
  if (json) {
    // Output is bytes; anything that is not UTF-8 is replaced rather than refused.
    std::cout << out.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    return exit_code;
  }
  if (!shown)
    std::cout << "no captured output" << (stage.empty() ? "" : " for stage " + stage)
              << " (only run: stages write logs, under " << dir.string() << ")\n";
  return exit_code;
}

int CmdInstances(const std::string& format, bool sources) {
  const sim::Catalog& hw = sim::Catalog::Builtin();
  if (format == "json") {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& t : hw.instances())
      out.push_back({{"name", t.name},
                     {"family", t.family},
                     {"pool", t.pool},
                     {"accelerator", t.accelerator},
                     {"chips", t.chips},
                     {"cores_per_chip", t.cores_per_chip},
                     {"physical_cores_per_chip", t.physical_cores_per_chip},
                     {"lnc", t.lnc},
                     {"hbm_gib_per_chip", t.hbm_gib_per_chip},
                     {"hbm_gbps_per_chip", t.hbm_gbps_per_chip},
                     {"bf16_tflops_per_chip", t.bf16_tflops_per_chip},
                     {"fp8_tflops_per_chip", t.fp8_tflops_per_chip},
                     {"neuronlink_gbps_per_chip", t.neuronlink_gbps_per_chip},
                     {"vcpus", t.vcpus},
                     {"memory_gib", t.memory_gib},
                     {"network_gbps", t.network_gbps},
                     {"on_demand_usd_hour", Usd(t.on_demand_per_hour)},
                     {"spot_usd_hour", Usd(t.spot_per_hour)},
                     {"spot_interruption_bucket", t.spot_interruption_bucket},
                     {"prices_as_of", hw.prices_as_of()},
                     {"sources", t.sources}});
    std::cout << out.dump(2) << "\n";
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  auto num = [](double v) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", v);
    return std::string(b);
  };
  for (const auto& t : hw.instances())
    rows.push_back({t.name, t.pool, std::to_string(t.chips),
                    t.cores_per_chip ? std::to_string(t.chips * t.cores_per_chip) : "-",
                    num(t.hbm_gib()), num(t.chips * t.bf16_tflops_per_chip),
                    std::to_string(t.vcpus), t.on_demand_per_hour.ToDollars(),
                    t.spot_per_hour.ToDollars(), t.spot_interruption_bucket});
  std::cout << Table({"INSTANCE", "POOL", ">CHIPS", ">CORES", ">HBM GiB", ">BF16 TFLOPS", ">VCPUS",
                      ">ON-DEMAND/H", ">SPOT/H", "INTERRUPTS"},
                     rows)
            << "\nprices as of " << hw.prices_as_of() << " (us-east-1, Linux)";
  if (!sources) {
    std::cout << "; where each figure comes from: trnflow instances --sources\n";
    return kExitOk;
  }
  std::cout << "\n\nsources:\n";
  for (const auto& t : hw.instances()) {
    std::cout << "  " << t.name << "\n";
    for (const auto& [what, source] : t.sources)
      std::cout << "    " << what << ": " << source << "\n";
  }
  return kExitOk;
}

int CmdModels(const std::string& format) {
  const auto& models = sim::Catalog::Builtin().models();
  if (format == "json") {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& m : models)
      out.push_back({{"name", m.name},
                     {"architecture", OrNull(m.architecture)},
                     {"parameters", m.parameters},
                     {"layers", m.layers},
                     {"hidden", m.hidden},
                     {"heads", m.heads},
                     {"kv_heads", m.kv_heads},
                     {"ffn", m.ffn},
                     {"vocab", m.vocab},
                     {"context", m.context},
                     {"features", m.features},
                     {"source", OrNull(m.source)}});
    std::cout << out.dump(2) << "\n";
    return kExitOk;
  }
  auto params = [](double p) {
    char b[32];
    if (p >= 1e9)
      std::snprintf(b, sizeof b, "%.2fB", p / 1e9);
    else
      std::snprintf(b, sizeof b, "%.0fM", p / 1e6);
    return std::string(b);
  };
  std::vector<std::vector<std::string>> rows;
  for (const auto& m : models) {
    std::string features;
    for (const auto& f : m.features) features += (features.empty() ? "" : ",") + f;
    rows.push_back({m.name, m.architecture, params(m.parameters), std::to_string(m.layers),
                    std::to_string(m.hidden), std::to_string(m.heads), std::to_string(m.kv_heads),
                    std::to_string(m.ffn), std::to_string(m.vocab), std::to_string(m.context),
                    features});
  }
  std::cout << Table({"MODEL", "ARCHITECTURE", ">PARAMETERS", ">LAYERS", ">HIDDEN", ">HEADS",
                      ">KV HEADS", ">FFN", ">VOCAB", ">CONTEXT", "FEATURES"},
                     rows)
            << "\na stage names one with `model: NAME`, or describes its own inline "
               "(docs/pipeline-format.md); sources: trnflow models --format json\n";
  return kExitOk;
}

}  // namespace trnflow::cli
