// trnflow serve / workers: the dashboard (serve/), wired to the JSON the data commands print,
// and the workers' list it shows.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "cli/commands.h"
#include "common/env.h"
#include "common/error.h"
#include "common/file_names.h"
#include "scheduler/cron.h"
#include "serve/server.h"

namespace trnflow::cli {
namespace {

std::string Param(const serve::ApiRequest& r, const std::string& name) {
  auto it = r.params.find(name);
  return it == r.params.end() ? "" : it->second;
}

// The filters /api/spend and /api/savings share with `trnflow spend`.
SpendArgs SpendFilters(const serve::ApiRequest& r) {
  SpendArgs s;
  s.project = Param(r, "project");
  s.pipeline = Param(r, "pipeline");
  s.since = Param(r, "since");
  s.until = Param(r, "until");
  return s;
}

// A whole number from the query string within [lo, hi], `fallback` when absent; UserError else.
int64_t NumberParam(const serve::ApiRequest& r, const std::string& name, int64_t fallback,
                    int64_t lo, int64_t hi) {
  std::string text = Param(r, name);
  if (text.empty()) return fallback;
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text[0] == '+' || v < lo || v > hi)
    throw UserError(name + " " + text + ": a whole number from " + std::to_string(lo) + " to " +
                    std::to_string(hi));
  return v;
}

constexpr int64_t kLogChunk = 256 * 1024;  // bytes of a log one request returns at most

// GET /api/runs/ID/log?stage=NAME&attempt=N&offset=BYTES: a piece of a run: stage attempt's
// log (TRNFLOW_HOME/logs/run-ID/STAGE.attempt-N.log) from `offset`, to tail it. `catalog`
// acts as the person: the run, the stage and the attempt are looked up through it first, so
// row-level security decides (nullopt, 404, for what they may not see), and the file's path
// is made only of what the catalog returned (the stage's name, the attempt's number, the
// worker's home), never of the request's text.
std::optional<nlohmann::json> StageLogJson(schema::Catalog& catalog, const serve::ApiRequest& r) {
  namespace fs = std::filesystem;
  int64_t run_id = ParseRunId(r.id);
  std::string stage_name = Param(r, "stage");
  if (stage_name.empty()) throw UserError("which stage? ?stage=NAME&attempt=N");
  int attempt_no = static_cast<int>(NumberParam(r, "attempt", 0, 1, 1000000));
  int64_t offset = NumberParam(r, "offset", 0, 0, int64_t{1} << 50);
  if (!catalog.GetRun(run_id)) return std::nullopt;
  const schema::StageRow* stage = nullptr;
  auto stages = catalog.GetStages(run_id);
  for (const auto& s : stages)
    if (s.name == stage_name) stage = &s;
  if (!stage) return std::nullopt;
  if (stage->kind != StageKind::kRun)
    throw UserError("stage " + stage->name + " is a " + schema::ToSql(stage->kind) +
                    " stage; only run: stages write logs");
  std::optional<schema::AttemptRow> attempt;
  for (const auto& a : catalog.GetAttempts(run_id))
    if (a.stage_id == stage->id && (attempt_no == 0 ? true : a.attempt == attempt_no))
      attempt = a;  // attempt 0 (none given): the latest
  if (!attempt) return std::nullopt;
  // Named as the worker named it (common/file_names.h).
  auto log_in = [&](const fs::path& home) -> fs::path {
    return AttemptLogPath(home.string(), run_id, stage->name, attempt->attempt);
  };
  std::vector<fs::path> homes;
  if (!attempt->worker_home.empty()) homes.push_back(attempt->worker_home);
  homes.push_back(HomeDir());
  nlohmann::json out = {{"run_id", std::to_string(run_id)},
                        {"stage", stage->name},
                        {"attempt", attempt->attempt},
                        {"outcome", OrNull(schema::ToSql(attempt->outcome))},
                        {"offset", offset},
                        {"next_offset", offset},
                        {"size", nullptr},
                        {"text", ""},
                        {"available", false},
                        {"complete", false}};
  for (const auto& home : homes) {
    // Whatever the names hold, the file must be inside this run's log directory.
    fs::path dir = fs::path(RunLogDir(home.string(), run_id)).lexically_normal();
    fs::path p = log_in(home).lexically_normal();
    if (p.parent_path() != dir) throw UserError("stage " + stage->name + ": not a log file name");
    std::error_code ec;
    auto size = fs::file_size(p, ec);
    if (ec || fs::is_symlink(fs::symlink_status(p, ec))) continue;
    std::ifstream in(p, std::ios::binary);
    if (!in) continue;
    int64_t from = std::min<int64_t>(offset, static_cast<int64_t>(size));
    int64_t n = std::min<int64_t>(kLogChunk, static_cast<int64_t>(size) - from);
    std::string text(static_cast<size_t>(n), '\0');
    in.seekg(from);
    in.read(text.data(), n);
    text.resize(static_cast<size_t>(in.gcount()));
    out["offset"] = from;
    out["next_offset"] = from + static_cast<int64_t>(text.size());
    out["size"] = static_cast<int64_t>(size);
    out["text"] = text;
    out["available"] = true;
    out["complete"] = attempt->outcome.has_value() &&
                      from + static_cast<int64_t>(text.size()) >= static_cast<int64_t>(size);
    return out;
  }
  // Not on this host: its worker's TRNFLOW_HOME is elsewhere (docs/operations.md).
  out["complete"] = attempt->outcome.has_value();
  out["path"] = log_in(homes.front()).string();
  return out;
}

// /metrics samples the catalog's SQL cannot compute: each active schedule's lag (its cron is
// evaluated here) and each budget's forecast band (BudgetForecasts).
std::vector<schema::MetricRow> ExtraMetrics(schema::Catalog& catalog) {
  std::vector<schema::MetricRow> out;
  auto now = std::chrono::system_clock::now();
  for (const auto& s : catalog.ListSchedules()) {
    if (s.paused) continue;
    std::string error;
    auto cron = scheduler::ParseCron(s.cron, &error);
    if (!cron || !scheduler::IsTimeZone(s.tz)) continue;
    auto last = std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::duration<double>(s.last_slot_epoch)));
    auto due = scheduler::NextSlot(*cron, s.tz, last);
    double lag = due && *due < now ? std::chrono::duration<double>(now - *due).count() : 0;
    out.push_back(
        {"trnflow_schedule_lag_seconds", nlohmann::json({{"schedule", s.name}}).dump(), lag});
  }
  auto usd = [](Money m) { return static_cast<double>(m.micros()) / 1e6; };
  for (const auto& b : catalog.BudgetForecasts()) {
    std::string labels = nlohmann::json({{"project", b.project}, {"period", b.period}}).dump();
    out.push_back({"trnflow_budget_forecast_usd", labels, usd(b.forecast)});
    out.push_back({"trnflow_budget_forecast_low_usd", labels, usd(b.forecast_low)});
    out.push_back({"trnflow_budget_forecast_high_usd", labels, usd(b.forecast_high)});
    out.push_back({"trnflow_budget_committed_usd", labels, usd(b.committed)});
  }
  return out;
}

}  // namespace

nlohmann::ordered_json WorkersJson(schema::Catalog& catalog) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& w : catalog.LiveWorkers(86400)) {
    nlohmann::ordered_json pools = nlohmann::ordered_json::array();
    for (const auto& [pool, capacity] : w.pools) {
      auto used = w.in_use.find(pool);
      pools.push_back({{"pool", pool},
                       {"capacity", capacity},
                       {"in_use", used == w.in_use.end() ? 0 : used->second}});
    }
    out.push_back({{"worker_id", w.id},
                   {"host", w.host},
                   {"pid", w.pid},
                   // Dead once silent past its lease: its stages are rescued elsewhere.
                   {"state", w.heartbeat_age_s > w.lease_s ? "dead" : "live"},
                   {"heartbeat_age_seconds", std::round(w.heartbeat_age_s * 10) / 10},
                   {"only_run_id", IdOrNull(w.only_run)},
                   {"projects", w.projects},
                   {"pools", pools}});
  }
  return out;
}

int CmdWorkers(const std::string& format) {
  auto catalog = OpenCatalog();
  auto workers = WorkersJson(*catalog);
  if (format == "json") {
    std::cout << workers.dump(2) << "\n";
    return kExitOk;
  }
  if (workers.empty()) {
    std::cout << "no workers have heartbeated in the last day; start one with `trnflow worker "
                 "--pool NAME=N`\n";
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& w : workers) {
    std::string pools;
    for (const auto& p : w["pools"])
      pools += (pools.empty() ? "" : " ") + p["pool"].get<std::string>() + " " +
               std::to_string(p["in_use"].get<int>()) + "/" +
               std::to_string(p["capacity"].get<int>());
    char age[32];
    std::snprintf(age, sizeof age, "%.1fs", w["heartbeat_age_seconds"].get<double>());
    std::string projects;
    for (const auto& p : w["projects"])
      projects += (projects.empty() ? "" : ",") + p.get<std::string>();
    rows.push_back({w["worker_id"].get<std::string>().substr(0, 8), w["host"],
                    std::to_string(w["pid"].get<int>()), w["state"], age, pools,
                    w["only_run_id"].is_null() ? "" : w["only_run_id"].get<std::string>(),
                    projects.empty() ? "all" : projects});
  }
  std::cout << Table({"WORKER", "HOST", ">PID", "STATE", ">HEARTBEAT", "POOLS (IN USE/CAPACITY)",
                      "ONLY RUN", "PROJECTS"},
                     rows);
  return kExitOk;
}

int CmdWorkersForget(const std::string& which, const std::string& format) {
  auto catalog = OpenCatalog();
  auto gone = catalog->ForgetWorkers(which);
  if (gone.empty() && !which.empty())
    throw UserError("no stopped or dead worker has id or host " + which +
                    " (live workers are never forgotten); `trnflow workers` lists them");
  if (format == "json") {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& w : gone)
      out.push_back({{"worker_id", w.id}, {"host", w.host}, {"pid", w.pid}});
    std::cout << out.dump(2) << "\n";
    return kExitOk;
  }
  if (gone.empty()) std::cout << "no stopped or dead workers to forget\n";
  for (const auto& w : gone)
    std::cout << "forgot worker " << w.id.substr(0, 8) << " (pid " << w.pid << " on " << w.host
              << ")\n";
  return kExitOk;
}

int CmdServe(const ServeArgs& a) {
  serve::Options o = a.options;
  serve::ParseListen(a.listen, o);
  o.auth = a.auth == "proxy" ? serve::Auth::kProxy : serve::Auth::kLocal;
  o.token_file = a.token_file.empty() ? ConfigDir() + "/serve.token" : a.token_file;
  o.proxy_secret_file =
      a.proxy_secret_file.empty() ? ConfigDir() + "/serve-proxy.secret" : a.proxy_secret_file;
  o.database_url = DatabaseUrl();
  OpenCatalog();  // the schema is this binary's, or the error says what to run
  o.views["runs"] = [](schema::Catalog& c, const serve::ApiRequest& r) {
    schema::RunsQuery q;
    q.project = Param(r, "project");
    q.pipeline = Param(r, "pipeline");
    q.state = Param(r, "state");
    if (!q.state.empty() && !schema::ParseRunState(q.state))
      throw UserError("state " + q.state + ": one of running, succeeded, failed, cancelled");
    q.since = ReadDateFlag("since", Param(r, "since"));
    if (std::string limit = Param(r, "limit"); !limit.empty()) {
      try {
        q.limit = std::stoi(limit);
      } catch (const std::exception&) {
        q.limit = 0;
      }
      if (q.limit < 1 || q.limit > 100000) throw UserError("limit " + limit + ": 1 to 100000");
    }
    return std::optional<std::string>(RunsJson(c, q).dump());
  };
  o.views["run"] = [](schema::Catalog& c,
                      const serve::ApiRequest& r) -> std::optional<std::string> {
    // ?collapse=1: matrix fan-outs as one entry each (`show --collapse`) but those ?expand=
    // names (comma-separated; "all": none), the run page's reading.
    std::optional<std::set<std::string>> collapse;
    if (std::string v = Param(r, "collapse"); !v.empty() && v != "0") {
      collapse.emplace();
      std::string expand = Param(r, "expand");
      for (size_t from = 0; from <= expand.size();) {
        size_t comma = std::min(expand.find(',', from), expand.size());
        if (comma > from) collapse->insert(expand.substr(from, comma - from));
        from = comma + 1;
      }
    }
    auto j = ShowJson(c, ParseRunId(r.id), collapse);
    if (!j) return std::nullopt;
    return j->dump();
  };
  o.views["spend"] = [](schema::Catalog& c, const serve::ApiRequest& r) {
    SpendArgs s = SpendFilters(r);
    s.by = Param(r, "by");
    return std::optional<std::string>(SpendJson(c, s).dump());
  };
  o.views["cache"] = [](schema::Catalog& c, const serve::ApiRequest&) {
    return std::optional<std::string>(CacheListJson(c).dump());
  };
  o.views["schedules"] = [](schema::Catalog& c, const serve::ApiRequest&) {
    return std::optional<std::string>(ScheduleListJson(c).dump());
  };
  o.views["workers"] = [](schema::Catalog& c, const serve::ApiRequest&) {
    return std::optional<std::string>(WorkersJson(c).dump());
  };
  o.views["budgets"] = [](schema::Catalog& c, const serve::ApiRequest&) {
    return std::optional<std::string>(BudgetsJson(c).dump());
  };
  o.views["savings"] = [](schema::Catalog& c, const serve::ApiRequest& r) {
    return std::optional<std::string>(SavingsJson(c, SpendFilters(r)).dump());
  };
  o.views["log"] = [](schema::Catalog& c,
                      const serve::ApiRequest& r) -> std::optional<std::string> {
    auto j = StageLogJson(c, r);
    if (!j) return std::nullopt;
    // A log is bytes: what is not UTF-8 is shown as U+FFFD rather than refused.
    return j->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  o.metrics = ExtraMetrics;
  InstallSignalHandlers();
  serve::Serve(o, g_interrupted, [&](int port) {
    if (!o.unix_path.empty()) {
      std::cout << "trnflow serve: listening on unix:" << o.unix_path
                << " (auth local: this user and root; Ctrl-C stops)\n"
                << "trnflow serve: from a laptop, `ssh -L 8080:" << o.unix_path
                << " HOST` and open http://localhost:8080/" << std::endl;
      return;
    }
    std::string host = o.host.find(':') != std::string::npos ? "[" + o.host + "]" : o.host;
    std::string url = "http://" + host + ":" + std::to_string(port) + "/";
    std::cout << "trnflow serve: listening on " << url << " (auth " << a.auth << "; Ctrl-C stops)"
              << std::endl;
    if (o.auth == serve::Auth::kLocal) {
      // As Jupyter does: the address with the token, for the operator who started it. Only
      // on a terminal: a service's output goes to logs others may read.
      if (isatty(STDOUT_FILENO))
        std::cout << "trnflow serve: open " << url
                  << "?token=" << serve::LoadOrCreateSecret(o.token_file, "--token-file")
                  << std::endl;
      else
        std::cout << "trnflow serve: the token is in " << o.token_file << " (open " << url
                  << "?token=TOKEN once, or send Authorization: Bearer TOKEN)" << std::endl;
    } else {
      std::cout << "trnflow serve: the proxy must send X-Trnflow-Proxy-Secret with the secret in "
                << o.proxy_secret_file << std::endl;
    }
  });
  return kExitOk;
}

}  // namespace trnflow::cli
