#include "schema/catalog.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <regex>
#include <set>
#include <unordered_map>

#include "common/embedded.h"
#include "common/env.h"
#include "common/error.h"
#include "pipelines/pipeline.h"
#include "schema/sql_text.h"
#include "sim/catalog.h"

namespace trnflow::schema {
namespace {

class Receiver final : public pqxx::notification_receiver {
 public:
  Receiver(pqxx::connection_base& c, const std::string& channel, int* count)
      : pqxx::notification_receiver(c, channel), count_(count) {}
  void operator()(const std::string&, int) override { ++*count_; }

 private:
  int* count_;
};

Money MoneyOf(const pqxx::field& f) {
  Money m;
  if (!f.is_null()) Money::Parse(f.as<std::string>(), &m);
  return m;
}

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string TextArray(const std::vector<std::string>& v) {
  std::string out = "{";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + Quote(v[i]);
  return out + "}";
}

template <typename T>
std::string NumberArray(const std::vector<T>& v) {
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
std::string ServerMessage(const pqxx::sql_error& e) {
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

std::vector<std::string> SplitComma(const std::string& s) {
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

}  // namespace

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

  std::unique_ptr<pqxx::connection> Open() {
    auto c = std::make_unique<pqxx::connection>(url);
    // Operators (and tests) can tell trnflow processes apart in pg_stat_activity. JIT off:
    // once the catalog holds a million rows, estimated costs cross jit_above_cost and every
    // short statement would pay ~10 ms of LLVM compilation (claim_bench measured it).
    pqxx::nontransaction nt(*c);
    nt.exec("SET application_name = 'trnflow:" + std::to_string(getpid()) + "'; SET jit = off");
    return c;
  }

  // Forgets the connection. Receivers go first: they unregister from it as they die.
  void Drop() {
    receiver.reset();
    cancel_receiver.reset();
    changes_receiver.reset();
    prepared.clear();
    leader_tx.reset();
    leader_conn.reset();
    conn.reset();
  }

  void Connect() {
    Drop();
    try {
      conn = Open();
    } catch (const std::exception& e) {
      std::string why = e.what();
      while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
      why = RedactSecrets(std::regex_replace(why, std::regex("\n"), " "), url);
      throw CatalogUnavailable("cannot reach the catalog at " + RedactUrl(url) + ": " + why +
                               ". Is PostgreSQL running (ops/setup.sh starts it)? Set "
                               "TRNFLOW_DATABASE_URL to point elsewhere.");
    }
  }

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
      if (state == "TF001") throw Refused(ServerMessage(e));  // a project's quota (exit 4)
      if (state.rfind("TF", 0) == 0 || state == "22023" || state == "42704" || state == "42710" ||
          state == "23514")
        throw UserError(ServerMessage(e));
      throw;
    }
  }

  void InsertEvents(pqxx::work& tx, const std::vector<EventRow>& events) {
    std::vector<int64_t> runs, stages;
    std::vector<std::string> kinds, messages, data;
    for (const auto& e : events) {
      runs.push_back(e.run_id);
      stages.push_back(e.stage_id);
      kinds.push_back(e.kind);
      messages.push_back(e.message);
      data.push_back(e.data_json);
    }
    Exec(tx, "InsertEvents", NumberArray(runs), NumberArray(stages), TextArray(kinds),
         TextArray(messages), TextArray(data));
  }

  // Pipeline (stored once per text), run, stages and dependencies, within `tx`.
  int64_t Submit(pqxx::work& tx, const pipelines::Pipeline& p, const SubmitOptions& o) {
    std::string project = o.project.empty() ? p.project : o.project;
    nlohmann::json params(p.params);
    std::vector<std::string> names, kinds, pools, types, markets, specs;
    std::vector<int> counts, pending, dep_from, dep_to;
    std::unordered_map<std::string, int> position;
    for (const auto& s : p.stages) {
      position[s.spec.name] = static_cast<int>(names.size()) + 1;
      names.push_back(s.spec.name);
      kinds.emplace_back(ToString(s.spec.kind));
      pools.push_back(s.pool);
      types.push_back(s.spec.instance);
      counts.push_back(s.spec.count);
      markets.emplace_back(ToString(s.spec.market));
      pending.push_back(static_cast<int>(s.needs.size()));
      specs.push_back(ToJson(s.spec));
    }
    for (const auto& s : p.stages)
      for (const auto& n : s.needs) {
        dep_from.push_back(position.at(s.spec.name));
        dep_to.push_back(position.at(n));
      }
    return Exec(tx, "SubmitRun", project, p.name, p.spec_hash, p.source, params.dump(), o.speed,
                o.seed, p.spot_rate_multiplier,
                p.budget ? std::optional<std::string>(p.budget->ToDecimal()) : std::nullopt,
                o.workdir, o.retry_failed_compilation, TextArray(names), TextArray(kinds),
                TextArray(pools), TextArray(types), NumberArray(counts), TextArray(markets),
                NumberArray(pending), TextArray(specs), NumberArray(dep_from),
                NumberArray(dep_to))[0][0]
        .as<int64_t>();
  }

  std::vector<int64_t> FinishRuns(pqxx::work& tx, const std::vector<int64_t>* run_ids) {
    pqxx::result r =
        run_ids ? Exec(tx, "FinishRuns", NumberArray(*run_ids)) : Exec(tx, "FinishRuns", nullptr);
    std::vector<int64_t> out;
    for (const auto& row : r) out.push_back(row[0].as<int64_t>());
    if (!run_ids) return out;
    // Two workers closing a run's last stages at once each see the other's still running,
    // and neither would finish the run. When all that is left of a run is running, lock it
    // and look again in a new statement: the second committer waits for the first and then
    // sees its stages finished.
    std::vector<int64_t> rest;
    for (int64_t id : *run_ids)
      if (std::find(out.begin(), out.end(), id) == out.end()) rest.push_back(id);
    if (rest.empty()) return out;
    std::vector<int64_t> only_running;
    for (const auto& row : Exec(tx, "RunsOnlyRunning", NumberArray(rest)))
      only_running.push_back(row[0].as<int64_t>());
    if (only_running.empty()) return out;
    Exec(tx, "LockRuns", NumberArray(only_running));
    for (const auto& row : Exec(tx, "FinishRuns", NumberArray(only_running)))
      out.push_back(row[0].as<int64_t>());
    return out;
  }

  std::vector<LeaseKey> Complete(pqxx::work& tx, const std::vector<AttemptResult>& results) {
    std::vector<int64_t> ids, billed, cost, wasted, saved, baseline;
    std::vector<int> attempts;
    std::vector<std::string> owners, outcomes, states, markets, messages, digests;
    std::vector<double> retry, sim, progress;
    std::map<int64_t, int> attempt_of;
    for (const auto& r : results) {
      ids.push_back(r.stage_id);
      attempts.push_back(r.attempt);
      owners.push_back(r.lease_owner);
      outcomes.emplace_back(ToString(r.outcome));
      states.emplace_back(ToString(r.next_state));
      markets.emplace_back(ToString(r.next_market));
      retry.push_back(r.retry_in_s);
      sim.push_back(r.sim_seconds);
      billed.push_back(r.billed_seconds);
      cost.push_back(r.cost.micros());
      wasted.push_back(r.wasted.micros());
      saved.push_back(r.saved.micros());
      progress.push_back(r.progress_to);
      messages.push_back(r.message);
      baseline.push_back(r.baseline.micros());
      digests.push_back(r.output_digest);
      attempt_of[r.stage_id] = r.attempt;
    }
    pqxx::result done =
        Exec(tx, "CompleteAttempts", NumberArray(ids), NumberArray(attempts), TextArray(owners),
             TextArray(outcomes), TextArray(states), TextArray(markets), NumberArray(retry),
             NumberArray(sim), NumberArray(billed), NumberArray(cost), NumberArray(wasted),
             NumberArray(saved), NumberArray(progress), TextArray(messages), NumberArray(baseline),
             TextArray(digests));
    std::vector<int64_t> succeeded, failed, runs;
    std::vector<LeaseKey> applied;
    for (const auto& row : done) {
      int64_t id = row[0].as<int64_t>();
      std::string state = row[2].as<std::string>();
      if (state == "succeeded" || state == "cached") succeeded.push_back(id);
      if (state == "failed" || state == "cancelled") failed.push_back(id);
      runs.push_back(row[1].as<int64_t>());
      applied.push_back({id, attempt_of[id], false, ""});
    }
    // The last metrics of each applied attempt become an event; stale results add nothing.
    std::map<int64_t, int64_t> run_of;
    for (const auto& row : done) run_of[row[0].as<int64_t>()] = row[1].as<int64_t>();
    std::vector<EventRow> metrics;
    for (const auto& r : results)
      if (!r.metrics_json.empty() && run_of.count(r.stage_id))
        metrics.push_back(
            {run_of[r.stage_id], r.stage_id, "metrics", "neuron-monitor", r.metrics_json});
    if (!metrics.empty()) InsertEvents(tx, metrics);
    // An attempt stopped at its spend cap spent what its budget had left: the run stops as
    // the budget guard would stop it, at once rather than at the guard's next tick.
    std::set<int64_t> over_budget;
    for (const auto& r : results)
      if (r.outcome == Outcome::kBudgetExceeded && run_of.count(r.stage_id))
        over_budget.insert(run_of[r.stage_id]);
    for (int64_t run : over_budget) Exec(tx, "CancelRun", run, std::string("budget_exceeded"));
    if (!succeeded.empty()) Exec(tx, "ReleaseDependents", NumberArray(succeeded));
    if (!failed.empty()) Exec(tx, "SkipDescendants", NumberArray(failed));
    if (!runs.empty()) {
      std::sort(runs.begin(), runs.end());
      runs.erase(std::unique(runs.begin(), runs.end()), runs.end());
      FinishRuns(tx, &runs);
    }
    return applied;
  }
};

Catalog::Catalog(const std::string& url) : impl_(std::make_unique<Impl>()) {
  impl_->url = url;
  impl_->Connect();
}

Catalog::~Catalog() = default;

const std::string& Catalog::url() const { return impl_->url; }

void Catalog::Reconnect() { impl_->Connect(); }

int Catalog::BinarySchemaVersion() {
  int latest = 0;
  for (const auto& m : Migrations()) latest = std::max(latest, m.version);
  return latest;
}

MigrateReport Catalog::Migrate(const sim::Catalog& hw) {
  return impl_->Guard([&] {
    MigrateReport report;
    pqxx::connection& c = impl_->C();
    // Migrations run one at a time under an EXCLUSIVE lock on trnflow.migration_lock, held by
    // a transaction on a second connection. Only the schema owner may lock it (members cannot,
    // as they could take an advisory lock). Two first-time migrators may race to create it.
    for (int tries = 0;; ++tries) {
      try {
        pqxx::work tx(c);
        tx.exec(
            "CREATE SCHEMA IF NOT EXISTS trnflow;"
            "CREATE TABLE IF NOT EXISTS trnflow.migration_lock ();"
            "CREATE TABLE IF NOT EXISTS trnflow.schema_migrations ("
            "  version int PRIMARY KEY, name text NOT NULL,"
            "  applied_at timestamptz NOT NULL DEFAULT now())");
        tx.commit();
        break;
      } catch (const pqxx::unique_violation&) {
        if (tries >= 3) throw;
      }
    }
    auto lock_conn = impl_->Open();
    pqxx::work lock(*lock_conn);
    lock.exec("LOCK TABLE trnflow.migration_lock IN EXCLUSIVE MODE");
    {
      pqxx::work tx(c);
      report.from_version =
          tx.exec("SELECT coalesce(max(version), 0) FROM trnflow.schema_migrations")[0][0]
              .as<int>();
    }
    if (report.from_version > BinarySchemaVersion())
      throw CatalogUnavailable("the catalog at " + RedactUrl(impl_->url) + " has schema version " +
                               std::to_string(report.from_version) + ", newer than this trnflow (" +
                               std::to_string(BinarySchemaVersion()) +
                               "); refusing to touch it. Upgrade trnflow.");
    for (const auto& m : Migrations()) {
      if (m.version <= report.from_version) continue;
      pqxx::work tx(c);
      tx.exec(m.sql);
      tx.exec_params("INSERT INTO trnflow.schema_migrations (version, name) VALUES ($1, $2)",
                     m.version, m.name);
      tx.commit();
      report.applied.push_back(m.name);
    }
    report.to_version = std::max(report.from_version, BinarySchemaVersion());
    // The hardware catalog ships with the binary; prices get a new row only when they change.
    pqxx::work tx(c);
    for (const auto& t : hw.instances()) {
      nlohmann::json sources(t.sources);
      impl_->Exec(tx, "UpsertInstanceType", t.name, t.family, t.pool, t.accelerator, t.chips,
                  t.cores_per_chip, t.hbm_gib_per_chip, t.hbm_gbps_per_chip, t.bf16_tflops_per_chip,
                  t.fp8_tflops_per_chip, t.vcpus, t.memory_gib, t.network_gbps,
                  t.spot_interruption_bucket, sources.dump());
      impl_->Exec(tx, "InsertPriceIfChanged", t.name, hw.prices_as_of(),
                  t.on_demand_per_hour.ToDecimal(), t.spot_per_hour.ToDecimal());
    }
    tx.commit();
    return report;
  });
}

void Catalog::RequireCurrentSchema() {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    auto exists =
        tx.exec("SELECT to_regclass('trnflow.schema_migrations') IS NOT NULL")[0][0].as<bool>();
    int version = exists ? tx.exec(
                                 "SELECT coalesce(max(version), 0) FROM "
                                 "trnflow.schema_migrations")[0][0]
                               .as<int>()
                         : 0;
    if (version < BinarySchemaVersion())
      throw CatalogUnavailable("the catalog at " + RedactUrl(impl_->url) +
                               " is at schema version " + std::to_string(version) +
                               "; this trnflow needs " + std::to_string(BinarySchemaVersion()) +
                               ". Run `trnflow db migrate`.");
    if (version > BinarySchemaVersion())
      throw CatalogUnavailable("the catalog at " + RedactUrl(impl_->url) +
                               " is at schema version " + std::to_string(version) +
                               ", newer than this trnflow (" +
                               std::to_string(BinarySchemaVersion()) + "). Upgrade trnflow.");
  });
}

int64_t Catalog::SubmitRun(const pipelines::Pipeline& p, const SubmitOptions& o) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    int64_t run_id = impl_->Submit(tx, p, o);
    tx.commit();
    return run_id;
  });
}

void Catalog::RegisterWorker(const std::string& worker_id, const std::string& host, int pid,
                             const std::string& pools_json, int64_t only_run,
                             const std::string& home) {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    impl_->Exec(tx, "RegisterWorker", worker_id, host, pid, pools_json, only_run, home);
    tx.commit();
  });
}

std::vector<LiveWorker> Catalog::LiveWorkers(double max_age_s) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<LiveWorker> out;
    for (const auto& row : impl_->Exec(tx, "LiveWorkers", max_age_s)) {
      LiveWorker w;
      w.id = row[0].as<std::string>();
      w.host = row[1].as<std::string>();
      w.pid = row[2].as<int>();
      auto pools = nlohmann::json::parse(row[3].as<std::string>());
      for (auto it = pools.begin(); it != pools.end(); ++it) w.pools[it.key()] = it->get<int>();
      w.only_run = row[4].as<int64_t>();
      w.heartbeat_age_s = row[5].as<double>();
      auto in_use = nlohmann::json::parse(row[6].as<std::string>());
      for (auto it = in_use.begin(); it != in_use.end(); ++it)
        w.in_use[it.key()] = static_cast<int>(it->get<double>());
      out.push_back(std::move(w));
    }
    return out;
  });
}

std::optional<StageWait> Catalog::ExplainStage(int64_t run_id, const std::string& stage) {
  return impl_->Guard([&]() -> std::optional<StageWait> {
    pqxx::work tx(impl_->C());
    pqxx::result r = impl_->Exec(tx, "ExplainStage", run_id, stage);
    if (r.empty()) return std::nullopt;
    const auto& row = r[0];
    StageWait w;
    w.stage_id = row[0].as<int64_t>();
    w.state = row[1].as<std::string>();
    w.pool = row[2].as<std::string>();
    w.instance_count = row[3].as<int>();
    w.attempts = row[4].as<int>();
    w.priority = row[5].as<int>();
    w.run_state = row[6].as<std::string>();
    w.project = row[7].as<std::string>();
    w.ready_in_s = row[8].as<double>();
    for (const auto& item : SplitComma(row[9].as<std::string>())) {
      auto colon = item.rfind(':');
      w.waiting_for.push_back({item.substr(0, colon), item.substr(colon + 1)});
    }
    w.queued_ahead = row[10].as<int64_t>();
    w.last_outcome = row[11].as<std::string>();
    w.last_message = row[12].as<std::string>();
    w.running_on = row[13].as<std::string>();
    return w;
  });
}

void Catalog::StopWorker(const std::string& worker_id) {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    impl_->Exec(tx, "StopWorker", worker_id);
    tx.commit();
  });
}

std::vector<ClaimedStage> Catalog::ClaimReadyStages(const std::string& pool, int free_instances,
                                                    const std::string& worker_id,
                                                    const std::string& worker_name, double lease_s,
                                                    int64_t only_run) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    pqxx::result r = impl_->Exec(tx, "ClaimReadyStages", pool, free_instances, worker_id,
                                 worker_name, lease_s, only_run);
    tx.commit();
    std::vector<ClaimedStage> out;
    for (const auto& row : r) {
      ClaimedStage c;
      c.stage_id = row[0].as<int64_t>();
      c.run_id = row[1].as<int64_t>();
      c.attempt = row[2].as<int>();
      c.instance_count = row[3].as<int>();
      c.market = ParseMarket(row[4].as<std::string>()).value_or(Market::kOnDemand);
      c.progress = row[5].as<double>();
      c.errors = row[6].as<int>();
      c.preemptions = row[7].as<int>();
      c.spec = StageSpecFromJson(row[8].as<std::string>());
      c.price_per_hour = Money::FromMicros(row[9].as<int64_t>());
      c.speed = row[10].as<double>();
      c.seed = row[11].as<int64_t>();
      c.spot_rate_multiplier = row[12].as<double>();
      c.workdir = row[13].as<std::string>();
      c.retry_failed_compilation = row[14].as<bool>();
      c.project = row[15].as<std::string>();
      c.budgeted = row[16].as<bool>();
      c.job_uid = row[17].as<int64_t>();
      out.push_back(std::move(c));
    }
    return out;
  });
}

std::vector<BudgetReservation> Catalog::ReserveBudgets(
    const std::vector<ClaimedStage>& claims, const std::vector<std::optional<Money>>& expected) {
  if (claims.empty()) return {};
  return impl_->Guard([&] {
    std::vector<int64_t> ids;
    std::vector<int> attempts;
    std::string amounts = "{";
    for (size_t i = 0; i < claims.size(); ++i) {
      ids.push_back(claims[i].stage_id);
      attempts.push_back(claims[i].attempt);
      amounts += (i ? "," : "") + (expected[i] ? expected[i]->ToDecimal() : std::string("NULL"));
    }
    amounts += "}";
    pqxx::work tx(impl_->C());
    pqxx::result r =
        impl_->Exec(tx, "ReserveBudgets", NumberArray(ids), NumberArray(attempts), amounts);
    tx.commit();
    std::vector<BudgetReservation> out;
    for (const auto& row : r)
      out.push_back({row[0].as<int64_t>(), MoneyOf(row[1]), MoneyOf(row[2])});
    return out;
  });
}

bool Catalog::RecordExecutorJob(int64_t stage_id, int attempt, const std::string& worker_id,
                                const std::string& job) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    pqxx::result r = impl_->Exec(tx, "RecordExecutorJob", stage_id, attempt, job, worker_id);
    tx.commit();
    return r.affected_rows() == 1;
  });
}

std::vector<LeaseKey> Catalog::HeartbeatLeases(const std::string& worker_id, double lease_s,
                                               const std::vector<LiveReport>& reports) {
  std::vector<int64_t> ids;
  std::vector<double> progress, checkpointed, sim_seconds, eta;
  for (const auto& r : reports) {
    ids.push_back(r.stage_id);
    auto finite = [](double v) { return std::isfinite(v) ? v : -1.0; };
    progress.push_back(r.known ? std::clamp(finite(r.progress), 0.0, 1.0) : -1);
    checkpointed.push_back(r.known ? std::clamp(finite(r.checkpointed), 0.0, 1.0) : -1);
    sim_seconds.push_back(r.known ? std::max(0.0, finite(r.sim_seconds)) : -1);
    eta.push_back(r.known ? finite(r.eta_s) : -1);
  }
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    pqxx::result r =
        impl_->Exec(tx, "HeartbeatLeases", worker_id, lease_s, NumberArray(ids),
                    NumberArray(progress), NumberArray(checkpointed), NumberArray(sim_seconds),
                    NumberArray(eta));
    impl_->Exec(tx, "WorkerHeartbeat", worker_id);
    tx.commit();
    std::vector<LeaseKey> out;
    for (const auto& row : r)
      out.push_back(
          {row[0].as<int64_t>(), row[1].as<int>(), row[2].as<bool>(), row[3].as<std::string>()});
    return out;
  });
}

std::vector<LeaseKey> Catalog::CompleteAttempts(const std::vector<AttemptResult>& results) {
  if (results.empty()) return {};
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    auto applied = impl_->Complete(tx, results);
    tx.commit();
    return applied;
  });
}

bool Catalog::TryAcquireLeadership() {
  Impl& m = *impl_;
  try {
    if (m.leader_tx) {
      m.leader_tx->exec("SELECT 1");  // the lock lives as long as this transaction
      return true;
    }
    if (!m.leader_conn) m.leader_conn = m.Open();
    auto tx = std::make_unique<pqxx::work>(*m.leader_conn);
    try {
      tx->exec("LOCK TABLE trnflow.leader_lock IN EXCLUSIVE MODE NOWAIT");
    } catch (const pqxx::sql_error& e) {
      if (e.sqlstate() != "55P03") throw;  // lock_not_available: another scheduler leads
      return false;
    }
    m.leader_tx = std::move(tx);
    return true;
  } catch (const pqxx::insufficient_privilege& e) {
    m.leader_tx.reset();
    m.leader_conn.reset();
    throw PermissionDenied(ServerMessage(e));
  } catch (const pqxx::sql_error& e) {
    m.leader_tx.reset();
    m.leader_conn.reset();
    throw CatalogUnavailable("lost the leader's connection to the catalog at " + RedactUrl(m.url) +
                             ": " + RedactSecrets(e.what(), m.url));
  } catch (const pqxx::broken_connection& e) {
    m.leader_tx.reset();
    m.leader_conn.reset();
    throw CatalogUnavailable("lost the leader's connection to the catalog at " + RedactUrl(m.url) +
                             ": " + RedactSecrets(e.what(), m.url));
  }
}

int Catalog::PromoteRetries() {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    int n = impl_->Exec(tx, "PromoteRetries")[0][0].as<int>();
    tx.commit();
    return n;
  });
}

int Catalog::RescueExpiredLeases(const std::function<AttemptResult(const ExpiredLease&)>& decide) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    pqxx::result r = impl_->Exec(tx, "ExpiredLeases");
    std::vector<AttemptResult> results;
    for (const auto& row : r) {
      ExpiredLease e;
      e.stage_id = row[0].as<int64_t>();
      e.run_id = row[1].as<int64_t>();
      e.attempt = row[2].as<int>();
      e.lease_owner = row[3].as<std::string>();
      e.errors = row[4].as<int>();
      e.preemptions = row[5].as<int>();
      e.spec = StageSpecFromJson(row[6].as<std::string>());
      e.progress = row[7].as<double>();
      e.instance_count = row[8].as<int>();
      e.price_per_hour = Money::FromMicros(row[9].as<int64_t>());
      e.sim_seconds = row[10].as<double>();
      e.market = ParseMarket(row[11].as<std::string>()).value_or(e.spec.market);
      e.speed = row[12].as<double>();
      e.progress_from = row[13].as<double>();
      e.live_progress = row[14].as<double>();
      results.push_back(decide(e));
    }
    auto applied = results.empty() ? std::vector<LeaseKey>{} : impl_->Complete(tx, results);
    tx.commit();
    return static_cast<int>(applied.size());
  });
}

std::vector<int64_t> Catalog::FinishRuns() {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    auto ids = impl_->FinishRuns(tx, nullptr);
    tx.commit();
    return ids;
  });
}

namespace {
RunRow ReadRun(const pqxx::row& row) {
  RunRow r;
  r.id = row[0].as<int64_t>();
  r.project = row[1].as<std::string>();
  r.pipeline = row[2].as<std::string>();
  r.state = row[3].as<std::string>();
  r.speed = row[4].as<double>();
  r.seed = row[5].as<int64_t>();
  r.workdir = row[6].as<std::string>();
  r.created_at = row[7].as<std::string>();
  r.finished_at = row[8].as<std::string>();
  r.cost = MoneyOf(row[9]);
  if (!row[10].as<std::string>().empty()) r.budget = MoneyOf(row[10]);
  r.wall_seconds = row[11].as<double>();
  r.cancel_reason = row[12].as<std::string>();
  r.wasted = MoneyOf(row[13]);
  return r;
}
}  // namespace

std::optional<RunRow> Catalog::GetRun(int64_t run_id) {
  return impl_->Guard([&]() -> std::optional<RunRow> {
    pqxx::work tx(impl_->C());
    pqxx::result r = impl_->Exec(tx, "ListRuns", std::string(), std::string(), 1, run_id,
                                 std::string(), std::string());
    if (r.empty()) return std::nullopt;
    return ReadRun(r[0]);
  });
}

std::vector<RunRow> Catalog::ListRuns(const std::string& project, const std::string& state,
                                      int limit) {
  RunsQuery q;
  q.project = project;
  q.state = state;
  q.limit = limit;
  return ListRuns(q);
}

std::vector<RunRow> Catalog::ListRuns(const RunsQuery& q) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<RunRow> out;
    for (const auto& row : impl_->Exec(tx, "ListRuns", q.project, q.state, q.limit, int64_t{0},
                                       q.pipeline, q.since))
      out.push_back(ReadRun(row));
    return out;
  });
}

std::vector<StageRow> Catalog::GetStages(int64_t run_id) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<StageRow> out;
    for (const auto& row : impl_->Exec(tx, "GetStages", run_id)) {
      StageRow s;
      s.id = row[0].as<int64_t>();
      s.name = row[1].as<std::string>();
      s.kind = row[2].as<std::string>();
      s.state = row[3].as<std::string>();
      s.instance_type = row[4].as<std::string>();
      s.instance_count = row[5].as<int>();
      s.market = row[6].as<std::string>();
      s.attempts = row[7].as<int>();
      s.progress = row[8].as<double>();
      s.cost = MoneyOf(row[9]);
      s.billed_seconds = row[10].as<int64_t>();
      s.running_cost_usd = row[11].as<double>();
      s.needs = SplitComma(row[12].as<std::string>());
      s.live_progress = row[13].as<double>();
      s.live_sim_seconds = row[14].as<double>();
      s.live_eta_s = row[15].as<double>();
      s.heartbeat_age_s = row[16].as<double>();
      s.last_outcome = row[17].as<std::string>();
      s.last_message = row[18].as<std::string>();
      out.push_back(std::move(s));
    }
    return out;
  });
}

std::vector<AttemptRow> Catalog::GetAttempts(int64_t run_id) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<AttemptRow> out;
    for (const auto& row : impl_->Exec(tx, "GetAttempts", run_id)) {
      AttemptRow a;
      a.stage_id = row[0].as<int64_t>();
      a.attempt = row[1].as<int>();
      a.outcome = row[2].as<std::string>();
      a.worker = row[3].as<std::string>();
      a.instance_type = row[4].as<std::string>();
      a.instance_count = row[5].as<int>();
      a.market = row[6].as<std::string>();
      a.price_per_hour = MoneyOf(row[7]);
      a.started_at = row[8].as<std::string>();
      a.finished_at = row[9].as<std::string>();
      a.sim_seconds = row[10].as<double>();
      a.billed_seconds = row[11].as<int64_t>();
      a.cost = MoneyOf(row[12]);
      a.wasted = MoneyOf(row[13]);
      a.saved = MoneyOf(row[14]);
      a.progress_from = row[15].as<double>();
      a.progress_to = row[16].as<double>();
      a.message = row[17].as<std::string>();
      a.worker_home = row[18].as<std::string>();
      out.push_back(std::move(a));
    }
    return out;
  });
}

void Catalog::InsertEvent(int64_t run_id, int64_t stage_id, const std::string& kind,
                          const std::string& message, const std::string& data_json,
                          const std::string& project) {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    impl_->Exec(tx, "InsertEvent", run_id, stage_id, kind, message, data_json, project);
    tx.commit();
  });
}

std::vector<EventLogRow> Catalog::EventLog(const std::string& project, int64_t run_id,
                                          const std::string& since, const std::string& kind,
                                          int limit) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<EventLogRow> out;
    for (const auto& row :
         impl_->Exec(tx, "EventLog", project, run_id, since.empty() ? "-infinity" : since, kind,
                     limit)) {
      EventLogRow e;
      e.at = row[0].as<std::string>();
      e.kind = row[1].as<std::string>();
      e.project = row[2].as<std::string>();
      e.run_id = row[3].as<int64_t>();
      e.stage = row[4].as<std::string>();
      e.attempt = row[5].as<int>();
      e.message = row[6].as<std::string>();
      e.data_json = row[7].as<std::string>();
      out.push_back(std::move(e));
    }
    return out;
  });
}

std::pair<int64_t, Money> Catalog::RunningSpend(const std::string& project,
                                                const std::string& pipeline) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    auto row = impl_->Exec(tx, "RunningSpend", project, pipeline)[0];
    return std::make_pair(row[0].as<int64_t>(), MoneyOf(row[1]));
  });
}

void Catalog::InsertEvents(const std::vector<EventRow>& events) {
  if (events.empty()) return;
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    impl_->InsertEvents(tx, events);
    tx.commit();
  });
}

std::map<int64_t, std::string> Catalog::LatestStageMetrics(int64_t run_id) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::map<int64_t, std::string> out;
    for (const auto& row : impl_->Exec(tx, "LatestStageMetrics", run_id))
      out[row[0].as<int64_t>()] = row[1].as<std::string>();
    return out;
  });
}

void Catalog::ListenForReadyStages() {
  impl_->Guard([&] {
    impl_->receiver =
        std::make_unique<Receiver>(impl_->C(), "trnflow_ready", &impl_->notifications);
    impl_->cancel_receiver =
        std::make_unique<Receiver>(impl_->C(), "trnflow_cancel", &impl_->cancel_notifications);
  });
}

bool Catalog::IsListening() const {
  return impl_->receiver != nullptr || impl_->changes_receiver != nullptr;
}

void Catalog::ListenForChanges() {
  impl_->Guard([&] {
    impl_->changes_receiver = std::make_unique<Receiver>(impl_->C(), "trnflow_changes",
                                                         &impl_->changes_notifications);
  });
}

Catalog::Notifications Catalog::AwaitNotifications(int timeout_ms) {
  return impl_->Guard([&] {
    impl_->notifications = 0;
    impl_->cancel_notifications = 0;
    impl_->changes_notifications = 0;
    impl_->C().await_notification(timeout_ms / 1000, (timeout_ms % 1000) * 1000L);
    impl_->C().get_notifs();
    return Notifications{impl_->notifications, impl_->cancel_notifications,
                         impl_->changes_notifications};
  });
}

CancelReport Catalog::CancelRun(int64_t run_id, const std::string& reason) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    pqxx::row r = impl_->Exec(tx, "CancelRun", run_id, reason)[0];
    tx.commit();
    return CancelReport{r[0].as<int>() > 0, r[1].as<int>(), r[2].as<int>()};
  });
}

int Catalog::ResumeRun(int64_t run_id) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    int n = impl_->Exec(tx, "ResetStages", run_id, std::optional<std::string>())[0][0].as<int>();
    tx.commit();
    return n;
  });
}

int Catalog::RetryStage(int64_t run_id, const std::string& stage) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    int n =
        impl_->Exec(tx, "ResetStages", run_id, std::optional<std::string>(stage))[0][0].as<int>();
    tx.commit();
    return n;
  });
}

namespace {
// --by fields and the SQL expression each reads; nothing a user types reaches SQL text.
const std::map<std::string, std::string>& SpendFields() {
  static const std::map<std::string, std::string> fields = {
      {"project", "project"}, {"pipeline", "pipeline"}, {"run", "run"},
      {"stage", "stage"},     {"kind", "kind"},         {"instance", "instance_type"},
      {"market", "market"},   {"day", "day::text"},     {"month", "to_char(day, 'YYYY-MM')"}};
  return fields;
}
}  // namespace

std::vector<SpendRow> Catalog::Spend(const SpendQuery& q) {
  std::vector<std::string> keys;
  bool per_run = false;
  for (const auto& b : q.by) {
    auto it = SpendFields().find(b);
    if (it == SpendFields().end())
      throw UserError("--by " + b +
                      ": unknown field; use any of project, pipeline, run, stage, "
                      "kind, instance, market, day, month");
    keys.push_back(it->second);
    per_run = per_run || b == "run";
  }
  // The rollup answers everything but per-run questions, which need the ledger itself.
  std::string source =
      per_run
          ? "(SELECT a.run_id::text AS run, r.project, p.name AS pipeline, s.name AS stage, "
            "s.kind, a.instance_type, a.market, (a.started_at AT TIME ZONE 'UTC')::date AS day, "
            "1 AS attempts, coalesce(a.billed_seconds, 0) AS billed_seconds, "
            "coalesce(a.cost_usd, 0) AS cost_usd, coalesce(a.wasted_usd, 0) AS wasted_usd, "
            "coalesce(a.saved_usd, 0) AS saved_usd FROM trnflow.attempts a "
            "JOIN trnflow.stages s ON s.id = a.stage_id JOIN trnflow.runs r ON r.id = a.run_id "
            "JOIN trnflow.pipelines p ON p.id = r.pipeline_id) x"
          : "trnflow.spend_rollup";
  std::string select, group;
  for (size_t i = 0; i < keys.size(); ++i) {
    select += keys[i] + ", ";
    group += (i ? ", " : "") + std::to_string(i + 1);
  }
  std::string sql = "SELECT " + select +
                    "sum(attempts), sum(billed_seconds) / 3600.0, sum(cost_usd)::text, "
                    "sum(wasted_usd)::text, sum(saved_usd)::text FROM " +
                    source +
                    " WHERE ($1 = '' OR project = $1) AND ($2 = '' OR pipeline = $2)"
                    " AND ($3 = '' OR day >= $3::date) AND ($4 = '' OR day <= $4::date)" +
                    (group.empty() ? "" : " GROUP BY " + group) +
                    " ORDER BY sum(cost_usd) DESC NULLS LAST" + (group.empty() ? "" : ", " + group);
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<SpendRow> out;
    pqxx::result r;
    try {
      r = tx.exec_params(sql, q.project, q.pipeline, q.since, q.until);
    } catch (const pqxx::data_exception& e) {
      throw UserError("--since/--until take dates like 2026-11-01");
    }
    for (const auto& row : r) {
      const auto k = static_cast<pqxx::row::size_type>(keys.size());
      if (row[k].is_null()) continue;  // no rows at all
      SpendRow s;
      for (pqxx::row::size_type i = 0; i < k; ++i) s.keys.push_back(row[i].as<std::string>());
      s.attempts = row[k].as<int64_t>();
      s.billed_hours = row[k + 1].as<double>();
      s.cost = MoneyOf(row[k + 2]);
      s.wasted = MoneyOf(row[k + 3]);
      s.saved = MoneyOf(row[k + 4]);
      out.push_back(std::move(s));
    }
    return out;
  });
}

bool Catalog::ProjectExists(const std::string& project) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    return !impl_->Exec(tx, "ProjectExists", project).empty();
  });
}

bool Catalog::RemoveBudget(const std::string& project) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    bool removed = !impl_->Exec(tx, "RemoveBudget", project).empty();
    tx.commit();
    return removed;
  });
}

void Catalog::SetBudget(const std::string& project, Money amount, const std::string& period) {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    impl_->Exec(tx, "EnsureProject", project);
    impl_->Exec(tx, "UpsertBudget", project, amount.ToDecimal(), period);
    tx.commit();
  });
}

std::vector<BudgetRow> Catalog::ProjectBudgets(const std::string& project) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<BudgetRow> out;
    for (const auto& row : impl_->Exec(tx, "ProjectBudgets", project)) {
      BudgetRow b;
      b.project = row[0].as<std::string>();
      b.amount = MoneyOf(row[1]);
      b.period = row[2].as<std::string>();
      b.notified_percent = row[4].as<bool>() ? row[3].as<int>() : 0;
      b.spent = MoneyOf(row[5]);
      out.push_back(std::move(b));
    }
    return out;
  });
}

void Catalog::RecordBudgetNotice(const std::string& project, int percent) {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    impl_->Exec(tx, "RecordBudgetNotice", project, percent);
    tx.commit();
  });
}

std::vector<RunBudgetRow> Catalog::RunBudgets() {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<RunBudgetRow> out;
    for (const auto& row : impl_->Exec(tx, "RunBudgets"))
      out.push_back({row[0].as<int64_t>(), row[1].as<std::string>(), MoneyOf(row[2]),
                     row[3].as<int>(), MoneyOf(row[4])});
    return out;
  });
}

void Catalog::RecordRunBudgetNotice(int64_t run_id, int percent) {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    impl_->Exec(tx, "RecordRunBudgetNotice", run_id, percent);
    tx.commit();
  });
}

std::vector<int64_t> Catalog::RunningRunsOfProject(const std::string& project) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<int64_t> out;
    for (const auto& row : impl_->Exec(tx, "RunningRunsOfProject", project))
      out.push_back(row[0].as<int64_t>());
    return out;
  });
}

std::string Catalog::AddProject(const std::string& name, const std::vector<std::string>& members) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::string role =
        impl_->Exec(tx, "AddProject", name, TextArray(members))[0][0].as<std::string>();
    tx.commit();
    return role;
  });
}

void Catalog::RequireStageRunner(const std::string& what) {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    pqxx::row r = impl_->Exec(tx, "CanRunStages")[0];
    if (r[0].as<bool>()) return;
    throw PermissionDenied("permission denied: " + what +
                           " claims and runs stages, which takes "
                           "the daemons' login; " +
                           r[1].as<std::string>() +
                           " is not it.\nhint: `trnflow submit` the pipeline and let the site's "
                           "workers run it, or run as the daemons' user (/etc/trnflow/daemon.url)");
  });
}

std::string Catalog::GrantProject(const std::string& project, const std::string& role, bool write) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::string group =
        impl_->Exec(tx, "GrantProject", project, role, write)[0][0].as<std::string>();
    tx.commit();
    return group;
  });
}

void Catalog::SetProjectQuotas(const std::string& project, std::optional<int> max_stages_per_run,
                               std::optional<int> max_queued_stages,
                               std::optional<int64_t> job_uid) {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    try {
      impl_->Exec(tx, "SetProjectQuotas", project, max_stages_per_run, max_queued_stages, job_uid);
    } catch (const pqxx::unique_violation&) {
      throw UserError("uid " + std::to_string(job_uid.value_or(0)) +
                      " already runs another project's jobs; each project needs its own");
    }
    tx.commit();
  });
}

std::vector<ProjectRow> Catalog::ListProjects() {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<ProjectRow> out;
    for (const auto& row : impl_->Exec(tx, "ListProjects")) {
      ProjectRow p;
      p.name = row[0].as<std::string>();
      p.role = row[1].as<std::string>();
      std::string members = row[2].as<std::string>();
      if (!members.empty()) p.members = SplitComma(members);
      p.runs = row[3].as<int64_t>();
      out.push_back(std::move(p));
    }
    return out;
  });
}

namespace {
ArtifactRow ReadArtifact(const pqxx::row& row) {
  ArtifactRow a;
  a.key = row[0].as<std::string>();
  a.state = row[1].as<std::string>();
  a.digest = row[2].as<std::string>();
  a.bytes = row[3].as<int64_t>();
  a.path = row[4].as<std::string>();
  a.failure = row[5].as<std::string>();
  a.hits = row[6].as<int64_t>();
  a.manifest_json = row[7].as<std::string>();
  a.last_used_at = row[8].as<std::string>();
  a.created_at = row[9].as<std::string>();
  a.builder_stage = row[10].as<int64_t>();
  a.producer_cost = Money::FromMicros(row[11].as<int64_t>());
  a.project = row[12].as<std::string>();
  return a;
}
}  // namespace

bool Catalog::AcquireArtifact(const std::string& key, int64_t stage_id, int attempt,
                              const std::string& manifest_json, bool retry_failed,
                              const std::string& corrupt_digest, const std::string& project) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    bool mine = !impl_
                     ->Exec(tx, "AcquireArtifact", key, stage_id, attempt, manifest_json,
                            retry_failed, corrupt_digest, project)
                     .empty();
    tx.commit();
    return mine;
  });
}

std::optional<ArtifactRow> Catalog::GetArtifact(const std::string& key) {
  return impl_->Guard([&]() -> std::optional<ArtifactRow> {
    pqxx::work tx(impl_->C());
    auto r = impl_->Exec(tx, "ListArtifacts", key);
    if (r.empty()) return std::nullopt;
    return ReadArtifact(r[0]);
  });
}

bool Catalog::FinishArtifact(const std::string& key, int64_t stage_id, int attempt,
                             const std::string& state, const std::string& digest, int64_t bytes,
                             const std::string& path, const std::string& failure) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    bool ok = !impl_
                   ->Exec(tx, "FinishArtifact", key, stage_id, attempt, state, digest, bytes, path,
                          failure)
                   .empty();
    tx.commit();
    return ok;
  });
}

void Catalog::ReleaseArtifact(const std::string& key, int64_t stage_id, int attempt) {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    impl_->Exec(tx, "ReleaseArtifact", key, stage_id, attempt);
    tx.commit();
  });
}

void Catalog::RecordArtifactHit(const std::string& key) {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    impl_->Exec(tx, "RecordArtifactHit", key);
    tx.commit();
  });
}

std::vector<ArtifactRow> Catalog::ListArtifacts() {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<ArtifactRow> out;
    for (const auto& row : impl_->Exec(tx, "ListArtifacts", nullptr))
      out.push_back(ReadArtifact(row));
    return out;
  });
}

bool Catalog::AddSchedule(const ScheduleRow& r) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    bool added = !impl_
                      ->Exec(tx, "AddSchedule", r.name, r.file, r.source, r.params_json, r.project,
                             r.cron, r.tz, r.catchup, r.speed, r.workdir)
                      .empty();
    tx.commit();
    return added;
  });
}

namespace {
// The columns ListSchedules and GetSchedule share; GetSchedule's extra ones follow them.
ScheduleRow ReadSchedule(const pqxx::row& row) {
  ScheduleRow r;
  r.name = row[0].as<std::string>();
  r.file = row[1].as<std::string>();
  r.source = row[2].as<std::string>();
  r.params_json = row[3].as<std::string>();
  r.project = row[4].as<std::string>();
  r.cron = row[5].as<std::string>();
  r.tz = row[6].as<std::string>();
  r.catchup = row[7].as<std::string>();
  r.speed = row[8].as<double>();
  r.workdir = row[9].as<std::string>();
  r.paused = row[10].as<bool>();
  r.last_slot_epoch = row[11].as<double>();
  r.last_run = row[12].as<int64_t>();
  r.fires = row[13].as<int64_t>();
  return r;
}
}  // namespace

std::vector<ScheduleRow> Catalog::ListSchedules() {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<ScheduleRow> out;
    for (const auto& row : impl_->Exec(tx, "ListSchedules")) out.push_back(ReadSchedule(row));
    return out;
  });
}

std::optional<ScheduleRow> Catalog::GetSchedule(const std::string& name) {
  return impl_->Guard([&]() -> std::optional<ScheduleRow> {
    pqxx::work tx(impl_->C());
    auto rows = impl_->Exec(tx, "GetSchedule", name);
    if (rows.empty()) return std::nullopt;
    const auto& row = rows[0];
    ScheduleRow r = ReadSchedule(row);
    r.created_at = row[14].as<std::string>();
    r.updated_at = row[15].as<std::string>();
    r.last_slot_fired = row[16].as<std::string>();
    r.last_fired_at = row[17].as<std::string>();
    r.last_run_state = row[18].as<std::string>();
    return r;
  });
}

bool Catalog::UpdateSchedule(const ScheduleRow& r) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    bool found = !impl_
                      ->Exec(tx, "UpdateSchedule", r.name, r.file, r.source, r.params_json,
                             r.project, r.cron, r.tz, r.workdir)
                      .empty();
    tx.commit();
    return found;
  });
}

std::map<std::string, StageHistoryRow> Catalog::StageHistory(
    const std::string& project, const std::string& pipeline,
    const std::vector<std::string>& stages) {
  if (stages.empty()) return {};
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::map<std::string, StageHistoryRow> out;
    for (const auto& row : impl_->Exec(tx, "StageHistory", project, pipeline, TextArray(stages)))
      out[row[0].as<std::string>()] = {row[1].as<double>(), row[2].as<int>()};
    return out;
  });
}

bool Catalog::SetSchedulePaused(const std::string& name, bool paused) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    bool found = !impl_->Exec(tx, "PauseSchedule", name, paused).empty();
    tx.commit();
    return found;
  });
}

bool Catalog::RemoveSchedule(const std::string& name) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    bool found = !impl_->Exec(tx, "RemoveSchedule", name).empty();
    tx.commit();
    return found;
  });
}

int64_t Catalog::FireSchedule(const std::string& name, double slot_epoch,
                              const pipelines::Pipeline& pipeline, const SubmitOptions& options) {
  return impl_->Guard([&]() -> int64_t {
    pqxx::work tx(impl_->C());
    if (impl_->Exec(tx, "RecordFire", name, slot_epoch).empty()) return 0;  // fired already
    int64_t run_id = impl_->Submit(tx, pipeline, options);
    impl_->Exec(tx, "SetFireRun", name, slot_epoch, run_id);
    impl_->Exec(tx, "AdvanceSchedule", name, slot_epoch);
    tx.commit();
    return run_id;
  });
}

void Catalog::AdvanceSchedule(const std::string& name, double slot_epoch) {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    impl_->Exec(tx, "AdvanceSchedule", name, slot_epoch);
    tx.commit();
  });
}

std::optional<std::string> Catalog::StageCacheInputs(int64_t run_id, const std::string& stage) {
  return impl_->Guard([&]() -> std::optional<std::string> {
    pqxx::work tx(impl_->C());
    auto r = impl_->Exec(tx, "StageCacheInputs", run_id, stage);
    if (r.empty()) return std::nullopt;
    return r[0][0].as<std::string>();
  });
}

void Catalog::RecordStageCacheInputs(int64_t stage_id, int attempt, const std::string& inputs) {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    impl_->Exec(tx, "RecordStageCacheInputs", stage_id, attempt, inputs);
    tx.commit();
  });
}

std::vector<std::pair<std::string, std::string>> Catalog::StageInputDigests(int64_t stage_id) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& row : impl_->Exec(tx, "StageInputDigests", stage_id))
      out.emplace_back(row[0].as<std::string>(), row[1].as<std::string>());
    return out;
  });
}

std::optional<std::string> Catalog::DeleteArtifact(const std::string& key) {
  return impl_->Guard([&]() -> std::optional<std::string> {
    pqxx::work tx(impl_->C());
    auto r = impl_->Exec(tx, "DeleteArtifact", key);
    tx.commit();
    if (r.empty()) return std::nullopt;
    return r[0][0].as<std::string>();
  });
}

std::vector<std::string> Catalog::TrustedProjects(const std::string& project) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<std::string> out;
    for (const auto& row : impl_->Exec(tx, "TrustedProjects", project))
      out.push_back(row[0].as<std::string>());
    return out;
  });
}

bool Catalog::AddCacheTrust(const std::string& project, const std::string& trusts) {
  if (project == trusts)
    throw UserError("project " + project + " always uses its own cache entries; name another");
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    auto r = impl_->Exec(tx, "AddCacheTrust", project, trusts);
    tx.commit();
    for (int i : {0, 1})
      if (!r[0][i].as<bool>())
        throw UserError("there is no project " + (i == 0 ? project : trusts) +
                        "; `trnflow project ls` lists them");
    return r[0][2].as<bool>();
  });
}

bool Catalog::RemoveCacheTrust(const std::string& project, const std::string& trusts) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    bool removed = !impl_->Exec(tx, "RemoveCacheTrust", project, trusts).empty();
    tx.commit();
    return removed;
  });
}

std::vector<std::pair<std::string, std::string>> Catalog::ListCacheTrust() {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& row : impl_->Exec(tx, "ListCacheTrust"))
      out.emplace_back(row[0].as<std::string>(), row[1].as<std::string>());
    return out;
  });
}

int Catalog::CountRunningStages(int64_t run_id) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    return impl_->Exec(tx, "CountRunningStages", run_id)[0][0].as<int>();
  });
}

void Catalog::ActAs(const std::string& role) {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    impl_->Exec(tx, "ActAs", role.empty() ? std::string("none") : role);
    tx.commit();
  });
}

std::vector<std::string> Catalog::MemberProjects(const std::string& role) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<std::string> out;
    for (const auto& row : impl_->Exec(tx, "MemberProjects", role))
      out.push_back(row[0].as<std::string>());
    return out;
  });
}

bool Catalog::MayWrite(const std::string& role, const std::string& project) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    auto r = impl_->Exec(tx, "MayWrite", role, project);
    return !r.empty() && !r[0][0].is_null() && r[0][0].as<bool>();
  });
}

std::vector<std::string> Catalog::VisibleProjects() {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<std::string> out;
    for (const auto& row : impl_->Exec(tx, "VisibleProjects")) out.push_back(row[0].as<std::string>());
    return out;
  });
}

std::vector<ChangeRow> Catalog::ChangesSince(int64_t after_id, int limit) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<ChangeRow> out;
    for (const auto& row : impl_->Exec(tx, "ChangesSince", after_id, limit)) {
      ChangeRow c;
      c.id = row[0].as<int64_t>();
      c.at = row[1].as<std::string>();
      c.project = row[2].as<std::string>();
      c.run_id = row[3].as<int64_t>();
      c.stage = row[4].as<std::string>();
      c.state = row[5].as<std::string>();
      out.push_back(std::move(c));
    }
    return out;
  });
}

int64_t Catalog::LatestChangeId() {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    return impl_->Exec(tx, "LatestChangeId")[0][0].as<int64_t>();
  });
}

int64_t Catalog::PruneChanges(double max_age_s) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    auto r = impl_->Exec(tx, "PruneChanges", max_age_s);
    tx.commit();
    return static_cast<int64_t>(r.affected_rows());
  });
}

std::vector<MetricRow> Catalog::Metrics() {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<MetricRow> out;
    for (const auto& row : impl_->Exec(tx, "Metrics"))
      out.push_back({row[0].as<std::string>(), row[1].as<std::string>(),
                     row[2].is_null() ? 0.0 : row[2].as<double>()});
    return out;
  });
}

std::string Catalog::QueryValue(const std::string& sql) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    pqxx::result r = tx.exec(sql);
    tx.commit();
    if (r.empty() || r[0][0].is_null()) return std::string();
    return r[0][0].as<std::string>();
  });
}

void Catalog::RebuildSpendRollup() {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    impl_->Exec(tx, "ClearSpendRollup");
    impl_->Exec(tx, "FillSpendRollup");
    tx.commit();
  });
}

void Catalog::RunOutsideTransaction(const std::string& sql) {
  impl_->Guard([&] {
    pqxx::nontransaction nt(impl_->C());
    nt.exec(sql);
  });
}

namespace {
std::string WithDatabase(const std::string& url, const std::string& name) {
  static const std::regex uri(R"(^(postgres(?:ql)?://[^/?]*)(/[^?]*)?(\?.*)?$)");
  std::smatch m;
  if (std::regex_match(url, m, uri)) return m[1].str() + "/" + name + m[3].str();
  return url + " dbname=" + name;
}
}  // namespace

// --- the dashboard, continued -------------------------------------------------------------

std::vector<BudgetForecastRow> Catalog::BudgetForecasts() {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<BudgetForecastRow> out;
    for (const auto& row : impl_->Exec(tx, "BudgetForecasts"))
      out.push_back({row[0].as<std::string>(), row[1].as<std::string>(), MoneyOf(row[2]),
                     MoneyOf(row[3]), MoneyOf(row[4]), MoneyOf(row[5]), MoneyOf(row[6]),
                     MoneyOf(row[7])});
    return out;
  });
}

std::vector<SavingsRow> Catalog::Savings(const SpendQuery& q) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<SavingsRow> out;
    for (const auto& row : impl_->Exec(tx, "Savings", q.project, q.pipeline, q.since, q.until))
      out.push_back({row[0].as<std::string>(), MoneyOf(row[1]), MoneyOf(row[2]), MoneyOf(row[3]),
                     row[4].as<int64_t>(), MoneyOf(row[5]), MoneyOf(row[6]), MoneyOf(row[7]),
                     MoneyOf(row[8])});
    return out;
  });
}

Catalog::Horizon Catalog::TransactionHorizon() {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    auto row = impl_->Exec(tx, "TransactionHorizon")[0];
    return Horizon{row[0].as<int64_t>(), row[1].as<int64_t>()};
  });
}

std::map<std::pair<int64_t, int>, std::string> Catalog::AttemptQueuedAt(int64_t run_id) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::map<std::pair<int64_t, int>, std::string> out;
    for (const auto& row : impl_->Exec(tx, "AttemptQueuedAt", run_id))
      out[{row[0].as<int64_t>(), row[1].as<int>()}] = row[2].as<std::string>();
    return out;
  });
}

std::string CreateDatabase(const std::string& admin_url, const std::string& name) {
  try {
    pqxx::connection c(admin_url);
    pqxx::nontransaction nt(c);
    nt.exec("DROP DATABASE IF EXISTS " + nt.quote_name(name) + " WITH (FORCE)");
    nt.exec("CREATE DATABASE " + nt.quote_name(name));
  } catch (const pqxx::broken_connection& e) {
    throw CatalogUnavailable("cannot reach " + RedactUrl(admin_url) + ": " + e.what());
  }
  return WithDatabase(admin_url, name);
}

void DropDatabase(const std::string& admin_url, const std::string& name) {
  pqxx::connection c(admin_url);
  std::string db = c.quote_name(name);
  try {
    pqxx::nontransaction(c).exec("DROP DATABASE IF EXISTS " + db + " WITH (FORCE)");
  } catch (const pqxx::insufficient_privilege&) {
    // FORCE may not end a superuser's session, such as an autovacuum worker busy in the
    // database after a benchmark; a plain DROP cancels autovacuum and waits for the rest.
    pqxx::nontransaction(c).exec("DROP DATABASE IF EXISTS " + db);
  }
}

std::string RandomSecret() {
  std::ifstream random("/dev/urandom", std::ios::binary);
  unsigned char bytes[16] = {};
  random.read(reinterpret_cast<char*>(bytes), sizeof bytes);
  if (!random) throw std::runtime_error("cannot read /dev/urandom");
  std::string out;
  char hex[3];
  for (unsigned char b : bytes) {
    std::snprintf(hex, sizeof hex, "%02x", b);
    out += hex;
  }
  return out;
}

std::string WithLogin(const std::string& url, const std::string& user,
                      const std::string& password) {
  static const std::regex uri(R"(^(postgres(?:ql)?://)(?:[^@/]*@)?(.*)$)");
  std::smatch m;
  if (std::regex_match(url, m, uri)) return m[1].str() + user + ":" + password + "@" + m[2].str();
  return url + " user=" + user + " password=" + password;
}

std::string EnableDaemonLogin(const std::string& owner_url) {
  pqxx::connection c(owner_url);
  pqxx::nontransaction nt(c);
  std::string role = nt.exec("SELECT trnflow.daemon_role()")[0][0].as<std::string>();
  std::string password = RandomSecret();
  nt.exec("ALTER ROLE " + nt.quote_name(role) + " LOGIN PASSWORD " + nt.quote(password));
  return WithLogin(owner_url, role, password);
}

void DropCatalogRoles(const std::string& admin_url, const std::string& name) {
  pqxx::connection c(admin_url);
  pqxx::nontransaction nt(c);
  pqxx::result roles = nt.exec_params(
      "SELECT r.rolname FROM pg_roles r JOIN pg_shdescription d ON d.objoid = r.oid "
      "AND d.classoid = 'pg_authid'::regclass "
      "WHERE d.description LIKE 'trnflow catalog % (' || $1 || '): %' ORDER BY r.rolname DESC",
      name);
  for (const auto& row : roles) {
    try {
      nt.exec("DROP ROLE IF EXISTS " + nt.quote_name(row[0].as<std::string>()));
    } catch (const pqxx::sql_error&) {  // still granted somewhere else: leave it
    }
  }
}

}  // namespace trnflow::schema
