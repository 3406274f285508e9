// trnflow serve / workers: the dashboard (serve/), wired to the JSON the data commands print,
// and the workers' list it shows.
#include <cmath>
#include <iostream>

#include "cli/commands.h"
#include "common/env.h"
#include "common/error.h"
#include "serve/server.h"

namespace trnflow::cli {
namespace {

std::string Param(const serve::ApiRequest& r, const std::string& name) {
  auto it = r.params.find(name);
  return it == r.params.end() ? "" : it->second;
}

// A worker whose heartbeat is older than this is shown as stale (leases are 15 s by default
// and renewed three times a lease).
constexpr double kStaleAfterS = 60;

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
                   {"state", w.heartbeat_age_s > kStaleAfterS ? "stale" : "live"},
                   {"heartbeat_age_seconds", std::round(w.heartbeat_age_s * 10) / 10},
                   {"only_run_id", IdOrNull(w.only_run)},
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
    rows.push_back({w["worker_id"].get<std::string>().substr(0, 8), w["host"],
                    std::to_string(w["pid"].get<int>()), w["state"], age, pools,
                    w["only_run_id"].is_null() ? "" : w["only_run_id"].get<std::string>()});
  }
  std::cout << Table({"WORKER", "HOST", ">PID", "STATE", ">HEARTBEAT", "POOLS (IN USE/CAPACITY)",
                      "ONLY RUN"},
                     rows);
  return kExitOk;
}

int CmdServe(const ServeArgs& a) {
  serve::Options o;
  serve::ParseListen(a.listen, o);
  o.auth = a.auth == "proxy" ? serve::Auth::kProxy : serve::Auth::kLocal;
  o.user_header = a.user_header;
  o.max_clients = a.max_clients;
  o.heartbeat_s = a.heartbeat_s;
  o.stream_lifetime_s = a.stream_lifetime_s;
  o.database_url = DatabaseUrl();
  OpenCatalog();  // the schema is this binary's, or the error says what to run
  o.views["runs"] = [](schema::Catalog& c, const serve::ApiRequest& r) {
    schema::RunsQuery q;
    q.project = Param(r, "project");
    q.pipeline = Param(r, "pipeline");
    q.state = Param(r, "state");
    if (!q.state.empty() && q.state != "running" && q.state != "succeeded" &&
        q.state != "failed" && q.state != "cancelled")
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
  o.views["run"] = [](schema::Catalog& c, const serve::ApiRequest& r) -> std::optional<std::string> {
    auto j = ShowJson(c, ParseRunId(r.id));
    if (!j) return std::nullopt;
    return j->dump();
  };
  o.views["spend"] = [](schema::Catalog& c, const serve::ApiRequest& r) {
    SpendArgs s;
    s.project = Param(r, "project");
    s.pipeline = Param(r, "pipeline");
    s.since = Param(r, "since");
    s.until = Param(r, "until");
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
  InstallSignalHandlers();
  serve::Serve(o, g_interrupted, [&](int port) {
    std::string host = o.host.find(':') != std::string::npos ? "[" + o.host + "]" : o.host;
    std::cout << "trnflow serve: listening on http://" << host << ":" << port << "/ (auth "
              << a.auth << "; Ctrl-C stops)" << std::endl;
  });
  return kExitOk;
}

}  // namespace trnflow::cli
