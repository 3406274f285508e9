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
#include "pipelines/checks.h"
#include "pipelines/diagnostics.h"
#include "pipelines/plan.h"
#include "serve/client.h"
#include "sim/catalog.h"

namespace trnflow::cli {

using schema::StageMatches;

namespace {
double Usd(const Money& m) { return static_cast<double>(m.micros()) / 1e6; }
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
    // The file's budget_usd was warned about when it loaded; the project's budget is the
    // catalog's to tell.
    if (!pipeline->budget && !pipeline->project.empty() &&
        !catalog->ProjectBudgets(pipeline->project).empty()) {
      pipelines::Diagnostics d(a.file);
      pipelines::CheckBudgetedCommands(*pipeline, "project " + pipeline->project + "'s budget", d);
      std::cerr << d.Format();
    }
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
  return schema::RunListJson(catalog.ListRuns(query));
}

int CmdRuns(const schema::RunsQuery& query, const std::string& format) {
  auto catalog = OpenCatalog();
  if (format == "json") {
    std::cout << RunsJson(*catalog, query).dump(2) << "\n";
    return kExitOk;
  }
  RequireProject(*catalog, query.project);
  std::cout << schema::RunListTable(catalog->ListRuns(query), query.project);
  return kExitOk;
}

namespace {

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

// The run's view (schema/run_view.h) with what the JSON adds from outside its rows: whether
// the process holding a running run is gone.
std::optional<schema::RunView> ReadForJson(schema::Catalog& catalog, int64_t run_id) {
  auto view = catalog.ReadRunView(run_id);
  if (view && view->run.state == schema::RunState::kRunning)
    view->holder_gone = HolderGone(catalog, run_id);
  return view;
}

}  // namespace

std::optional<nlohmann::json> ShowJson(schema::Catalog& catalog, int64_t run_id,
                                       const std::optional<std::set<std::string>>& collapse) {
  auto view = ReadForJson(catalog, run_id);
  if (!view) return std::nullopt;
  return schema::RunJson(*view, "", collapse);
}

void PrintRunJson(schema::Catalog& catalog, int64_t run_id) {
  auto view = ReadForJson(catalog, run_id);
  if (!view) throw UserError("no run " + std::to_string(run_id) + "; `trnflow runs` lists them");
  std::cout << schema::RunJson(*view).dump(2) << "\n";
}

int CmdShow(const std::string& run_text, const std::string& stage_filter,
            const std::string& format, bool collapse) {
  if (collapse && !stage_filter.empty())
    throw UserError("--collapse shows every stage, a matrix stage as one line; --stage NAME "
                    "shows one stage's attempts (a matrix stage: of every expansion)");
  int64_t run_id = ParseRunId(run_text);
  auto catalog = OpenCatalog();
  bool json = format == "json";
  // The stage table prints no attempt: only JSON and one stage's table read them.
  auto view = catalog->ReadRunView(run_id, json || !stage_filter.empty());
  if (!view) throw UserError("no run " + run_text + "; `trnflow runs` lists them");
  const auto& stages = view->stages;
  if (!stage_filter.empty()) {
    bool found = false;
    for (const auto& s : stages) found = found || StageMatches(s.name, stage_filter);
    if (!found)
      throw UserError("run " + run_text + " has no stage '" + stage_filter + "'" +
                      NameHint(stage_filter, StageNames(stages),
                               "; `trnflow show " + run_text + "` lists them"));
  }
  if (json) {
    if (view->run.state == schema::RunState::kRunning)
      view->holder_gone = HolderGone(*catalog, run_id);
    std::optional<std::set<std::string>> groups;
    if (collapse) groups.emplace();
    std::cout << schema::RunJson(*view, stage_filter, groups).dump(2) << "\n";
    return kExitOk;
  }
  view->warnings = UnrunnableStages(*catalog, run_id, stages);
  for (const auto& s : stages)
    if (!stage_filter.empty() && StageMatches(s.name, stage_filter))
      view->waits[s.id] = ExplainStageLines(*catalog, run_id, s.name);
  std::cout << schema::RunTable(*view, stage_filter, collapse);
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
      last = !run || run->state != schema::RunState::kRunning;
    }
    auto attempts = catalog->GetAttempts(run_id);
    for (const auto& s : stages) {
      if (!StageMatches(s.name, stage)) continue;
      if (s.kind != StageKind::kRun) continue;
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
          if (a.outcome != Outcome::kCached && ec == std::errc::permission_denied &&
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
          if (a.outcome != Outcome::kCached && !a.worker_home.empty() &&
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
