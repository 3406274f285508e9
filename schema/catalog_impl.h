#pragma once
// Private to schema/: Catalog::Impl (the connection, prepared queries, Guard's error mapping)
// and the helpers every schema/catalog_*.cpp file shares. Not installed; catalog.h and code
// outside schema/ never include it (it brings in libpqxx).
#include <cstdio>
#include <memory>
#include <pqxx/pqxx>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "common/env.h"
#include "common/error.h"
#include "schema/catalog.h"
#include "schema/sql_text.h"

namespace trnflow::schema {
namespace detail {

class Receiver final : public pqxx::notification_receiver {
 public:
  Receiver(pqxx::connection_base& c, const std::string& channel, int* count)
      : pqxx::notification_receiver(c, channel), count_(count) {}
  void operator()(const std::string&, int) override { ++*count_; }

 private:
  int* count_;
};

inline Money MoneyOf(const pqxx::field& f) {
  Money m;
  if (!f.is_null()) Money::Parse(f.as<std::string>(), &m);
  return m;
}

inline std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

inline std::string TextArray(const std::vector<std::string>& v) {
  std::string out = "{";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + Quote(v[i]);
  return out + "}";
}

template <typename T>
inline std::string NumberArray(const std::vector<T>& v) {
  std::string out = "{";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ",";
    if constexpr (std::is_floating_point_v<T>) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.17g", v[i]);
      out += buf;
    } else {
      out += std::to_string(v[i]);
    }
  }
  return out + "}";
}

// The server's message without libpq's "ERROR:" prefix and the statement that failed.
inline std::string ServerMessage(const pqxx::sql_error& e) {
  std::string what = e.what();
  if (what.rfind("ERROR:", 0) == 0) what = what.substr(6);
  while (!what.empty() && what.front() == ' ') what.erase(0, 1);
  while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
  auto context = what.find("\nCONTEXT:");
  if (context != std::string::npos) what.erase(context);
  auto hint = what.find("\nHINT:");
  if (hint != std::string::npos) what.replace(hint, 7, "\nhint:");
  return what;
}

inline std::vector<std::string> SplitComma(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (!s.empty() && start <= s.size()) {
    size_t end = s.find(',', start);
    // Matrix names contain commas inside brackets: split only at depth 0.
    size_t depth_end = start;
    int depth = 0;
    for (depth_end = start; depth_end < s.size(); ++depth_end) {
      if (s[depth_end] == '[') ++depth;
      if (s[depth_end] == ']') --depth;
      if (s[depth_end] == ',' && depth == 0) break;
    }
    end = depth_end;
    out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// For a read whose query filters with optional parameters (`$1 = '' OR col = $1`): plans it
// for the values given, in this transaction only. A long-lived process (trnflow serve) would
// otherwise get PostgreSQL's generic plan after five executions, one that cannot use the index
// the values pick (/api/runs?project scanned every run: 134 ms against 22 ms at 100k runs).
inline void PlanForTheseValues(pqxx::transaction_base& tx) {
  tx.exec("SET LOCAL plan_cache_mode = force_custom_plan");
}

}  // namespace detail

using detail::MoneyOf;
using detail::PlanForTheseValues;
using detail::NumberArray;
using detail::Quote;
using detail::Receiver;
using detail::ServerMessage;
using detail::SplitComma;
using detail::TextArray;

struct Catalog::Impl {
  std::string url;
  std::unique_ptr<pqxx::connection> conn;
  std::set<std::string> prepared;
  std::unique_ptr<Receiver> receiver;
  std::unique_ptr<Receiver> cancel_receiver;
  std::unique_ptr<Receiver> changes_receiver;
  int changes_notifications = 0;
  int notifications = 0;
  int cancel_notifications = 0;
  // Leadership is an EXCLUSIVE lock on trnflow.leader_lock held by an open transaction on a
  // connection of its own (locking it needs UPDATE on it, which only the daemon has).
  std::unique_ptr<pqxx::connection> leader_conn;
  std::unique_ptr<pqxx::work> leader_tx;

  // The connection (catalog.cpp): a new one, named and with JIT off.
  std::unique_ptr<pqxx::connection> Open();

  // Forgets the connection. Receivers go first: they unregister from it as they die.
  void Drop();

  void Connect();

  pqxx::connection& C() {
    if (!conn) Connect();
    return *conn;
  }

  // Prepares a named query from schema/queries on first use on this connection.
  const std::string& Prepare(const std::string& name) {
    if (!prepared.count(name)) {
      C().prepare(name, Query(name));
      prepared.insert(name);
    }
    return name;
  }

  template <typename... Args>
  pqxx::result Exec(pqxx::transaction_base& tx, const std::string& name, Args&&... args) {
    return tx.exec_prepared(Prepare(name), std::forward<Args>(args)...);
  }

  // Runs `body`, turning a lost connection into CatalogUnavailable.
  template <typename F>
  auto Guard(F&& body) -> decltype(body()) {
    try {
      return body();
    } catch (const pqxx::broken_connection& e) {
      Drop();
      throw CatalogUnavailable("lost the connection to the catalog at " + RedactUrl(url) + ": " +
                               RedactSecrets(e.what(), url));
    } catch (const pqxx::insufficient_privilege& e) {  // libpqxx 6 drops its sqlstate
      throw PermissionDenied(ServerMessage(e));
    } catch (const pqxx::sql_error& e) {
      const std::string& state = e.sqlstate();
      // 08: connection exception; 57P: operator intervention (server shutting down).
      if (state.rfind("08", 0) == 0 || state.rfind("57P", 0) == 0 || !conn || !conn->is_open()) {
        Drop();
        throw CatalogUnavailable("lost the connection to the catalog at " + RedactUrl(url) + ": " +
                                 RedactSecrets(e.what(), url));
      }
      // Refusals and bad input the catalog names itself: the message (and hint) is the
      // user's answer; the SQL behind it is not.
      if (state == "42501") throw PermissionDenied(ServerMessage(e));
      if (state == "TF001") throw Refused(ServerMessage(e));  // quota; daemons in the way (exit 4)
      if (state.rfind("TF", 0) == 0 || state == "22023" || state == "42704" || state == "42710" ||
          state == "23514")
        throw UserError(ServerMessage(e));
      throw;
    }
  }

  // Events within `tx` (catalog_runs.cpp).
  void InsertEvents(pqxx::work& tx, const std::vector<EventRow>& events);

  // Pipeline (stored once per text), run, stages and dependencies, within `tx`.
  // Defined in catalog_submit.cpp.
  int64_t Submit(pqxx::work& tx, const pipelines::Pipeline& p, const SubmitOptions& o);

  // Runs whose stages have all ended, and the results of attempts (catalog_claim.cpp).
  std::vector<int64_t> FinishRuns(pqxx::work& tx, const std::vector<int64_t>* run_ids);
  // Closes attempts, releases dependents and finishes runs. The stages released are announced
  // (NotifyReady) at once, or, given `released`, left there for the caller to announce after
  // its own claims in the same transaction have taken what they can. Given `closing_runs`, the
  // runs of the closed attempts are left there too, for the caller to finish after its claims.
  std::vector<LeaseKey> Complete(pqxx::work& tx, const std::vector<AttemptResult>& results,
                                 std::vector<int64_t>* released = nullptr,
                                 std::vector<int64_t>* closing_runs = nullptr);
};

}  // namespace trnflow::schema
