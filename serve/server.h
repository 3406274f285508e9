#pragma once
// trnflow serve: the web dashboard, its JSON API, the live event stream and Prometheus /metrics
// (docs/serve.md). One process reading the catalog through the daemons' login; each request
// acts as the PostgreSQL role of the person behind it, so row-level security decides what it
// shows. Pages and assets are compiled into the binary (serve/assets, cmake/embed.cmake).
//
// The JSON of /api is not made here: the command line hands over the functions that print its
// `--format json` (cli/cmd_serve.cpp), so the dashboard and the CLI cannot disagree. serve/
// uses common and schema only; httplib stays inside server.cpp.
#include <atomic>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace trnflow::schema {
class Catalog;
struct MetricRow;
}

namespace trnflow::serve {

// One /api request: its query string (the first value of each name) and the id in its path
// (/api/runs/ID), "" when none.
struct ApiRequest {
  std::map<std::string, std::string> params;
  std::string id;
};

// The JSON text of one /api resource, read through `catalog` (which acts as the request's
// role); nullopt: not found (404). May throw UserError (400), PermissionDenied (403),
// CatalogUnavailable (503).
using ApiView = std::function<std::optional<std::string>(schema::Catalog& catalog,
                                                          const ApiRequest& request)>;

enum class Auth {
  kLocal,  // no authentication: acts as the daemons' login; loopback addresses only
  kProxy,  // a trusted reverse proxy names the user in a header; acts as that role
};

struct Options {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (printed when listening)
  Auth auth = Auth::kLocal;
  std::string user_header = "X-Forwarded-User";
  int max_clients = 64;     // event streams open at once; more are refused with 503
  double heartbeat_s = 15;  // an idle event stream gets a comment line this often
  // An event stream ends after this long; the browser reconnects and resumes from its
  // Last-Event-ID, losing nothing (it keeps proxies' idle timers and stale streams in check).
  double stream_lifetime_s = 300;
  std::string database_url;
  // "runs", "run" (id), "log" (id), "spend", "savings", "budgets", "cache", "schedules",
  // "workers".
  std::map<std::string, ApiView> views;
  // /metrics samples besides the catalog's own (schedule lag, budget forecasts), read through
  // the same connection (acting as the request's role, when it names one).
  std::function<std::vector<schema::MetricRow>(schema::Catalog& catalog)> metrics;
};

// Parses "HOST:PORT" ("127.0.0.1:8080", "[::1]:8080", ":8080" for all addresses); throws
// UserError.
void ParseListen(const std::string& text, Options& options);
// Whether `host` is a loopback address (127.0.0.0/8, ::1, localhost).
bool IsLoopback(const std::string& host);

// Serves until `stop` becomes true. `on_listening` is called with the bound port once the
// socket listens. Throws UserError when it cannot bind (address in use, --auth local on a
// non-loopback address) and CatalogUnavailable when the catalog cannot be reached at start.
void Serve(const Options& options, const std::atomic<bool>& stop,
           const std::function<void(int port)>& on_listening);

}  // namespace trnflow::serve
