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
  // The operator: every request presents the token in `token_file` (a header, a cookie, or
  // ?token= once); acts as the daemons' login; loopback addresses only.
  kLocal,
  // A trusted reverse proxy adds the secret in `proxy_secret_file` to every request and names
  // the user in a header; acts as that role.
  kProxy,
};

struct Options {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port (printed when listening)
  // --listen unix:PATH (--auth local only): a Unix socket instead of host and port, mode 0600
  // in a directory made 0700 when missing; a peer must be this process's user or root
  // (SO_PEERCRED), and then needs no token: the file system decides who connects.
  std::string unix_path;
  Auth auth = Auth::kLocal;
  std::string user_header = "X-Forwarded-User";
  // --auth local: the token every request must present (Authorization: Bearer, the cookie
  // ?token= sets, or ?token=). --auth proxy: the secret the proxy adds to every request
  // (X-Trnflow-Proxy-Secret, or Authorization: Bearer for a scraper). Each is created (random,
  // mode 0600) when missing; one others may read or write is refused (LoadOrCreateSecret).
  std::string token_file;
  std::string proxy_secret_file;
  // Host header names a request may give (the port aside), besides the listen address and,
  // on loopback, localhost. Anything else is 403: a DNS name pointed at this host by another
  // site (DNS rebinding) is not this dashboard's name.
  std::vector<std::string> allowed_hosts;
  // A request's line and headers must arrive within this many seconds of it starting, however
  // slowly they trickle in; then the connection is closed.
  double header_timeout_s = 10;
  // Connections from one client address that have not yet presented the token or the proxy
  // secret, at once; more are answered 429 and closed. Slow clients from one address hold at
  // most this many of the threads that serve connections.
  int max_pending_per_client = 16;
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

// Parses "HOST:PORT" ("127.0.0.1:8080", "[::1]:8080", ":8080" for all addresses) or
// "unix:/absolute/path"; throws UserError.
void ParseListen(const std::string& text, Options& options);
// Whether `host` is a loopback address: an IPv4 address in 127.0.0.0/8, ::1 (bracketed or
// not), or the name localhost; nothing else (127.attacker.example is a name, not an address).
bool IsLoopback(const std::string& host);
// Whether a request's Host header ("name", "name:port", "[v6]:port") names one of `allowed`
// exactly (case aside; "[::1]" for an IPv6 address). An empty or malformed Host is not.
bool HostAllowed(const std::string& host_header, const std::vector<std::string>& allowed);
// The names Host may give: the listen address (unless it is every address), localhost when
// it is a loopback one, and `extra`.
std::vector<std::string> AllowedHosts(const std::string& listen_host,
                                      const std::vector<std::string>& extra);
// The secret kept in `path` (its first line), made (32 random bytes as hex, mode 0600) when
// the file does not exist. Throws UserError, naming the file and how to fix it, when it cannot
// be made or read, is not a regular file owned by this user, others may read it or anyone
// but its owner may write it (mode & 0027), or it holds fewer than 16 characters.
std::string LoadOrCreateSecret(const std::string& path, const std::string& what);

// Serves until `stop` becomes true. `on_listening` is called with the bound port (0 on a Unix
// socket) once the socket listens. Throws UserError when it cannot bind (address in use, --auth local on a
// non-loopback address) and CatalogUnavailable when the catalog cannot be reached at start.
void Serve(const Options& options, const std::atomic<bool>& stop,
           const std::function<void(int port)>& on_listening);

}  // namespace trnflow::serve
