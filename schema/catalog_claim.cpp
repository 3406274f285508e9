// A stage's life on a worker: waiting for work (LISTEN/NOTIFY), claiming ready stages,
// reserving budget, heartbeating leases, completing attempts and releasing dependents,
// finishing runs; and the scheduler's side: leadership, promoting retries, rescuing expired
// leases. SQL: queries/stages.sql (CanRunStages and CancelRun: queries/runs.sql).
#include <algorithm>
#include <cmath>
#include <map>
#include <pqxx/pqxx>
#include <set>

#include "common/env.h"
#include "common/error.h"
#include "schema/catalog.h"
#include "schema/catalog_impl.h"

namespace trnflow::schema {

std::vector<int64_t> Catalog::Impl::FinishRuns(pqxx::work& tx,
                                               const std::vector<int64_t>* run_ids) {
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

std::vector<LeaseKey> Catalog::Impl::Complete(pqxx::work& tx,
                                              const std::vector<AttemptResult>& results,
                                              std::vector<int64_t>* released,
                                              std::vector<int64_t>* closing_runs) {
  std::vector<int64_t> ids, billed, cost, wasted, saved, baseline;
  std::vector<int> attempts;
  std::vector<std::string> owners, outcomes, states, markets, messages, digests;
  std::vector<double> retry, sim, progress;
  std::map<int64_t, int> attempt_of;
  for (const auto& r : results) {
    ids.push_back(r.stage_id);
    attempts.push_back(r.attempt);
    owners.push_back(r.lease_owner);
    outcomes.push_back(ToSql(r.outcome));
    states.push_back(ToSql(r.next_state));
    markets.push_back(ToSql(r.next_market));
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
    StageState state = StageStateFromSql(row[2].as<std::string>());
    if (state == StageState::kSucceeded || state == StageState::kCached) succeeded.push_back(id);
    if (state == StageState::kFailed || state == StageState::kCancelled) failed.push_back(id);
    runs.push_back(row[1].as<int64_t>());
    applied.push_back({id, attempt_of[id], false, std::nullopt});
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
  // the budget guard would stop it, at once rather than at the guard's next tick, once no
  // other attempt of it still runs on money it reserved (that one spends its reservation and
  // is stopped at its own cap: the budget is spent exactly, migration 0033).
  std::set<int64_t> over_budget;
  for (const auto& r : results)
    if (r.outcome == Outcome::kBudgetExceeded && run_of.count(r.stage_id))
      over_budget.insert(run_of[r.stage_id]);
  if (!over_budget.empty()) {
    std::vector<int64_t> ids(over_budget.begin(), over_budget.end());
    for (const auto& row : Exec(tx, "RunsSpentOut", NumberArray(ids)))
      Exec(tx, "CancelRun", row[0].as<int64_t>(), ToSql(Outcome::kBudgetExceeded));
  }
  if (!succeeded.empty()) {
    std::vector<int64_t> ready;
    for (const auto& row : Exec(tx, "ReleaseDependents", NumberArray(succeeded)))
      ready.push_back(row[0].as<int64_t>());
    if (released)
      released->insert(released->end(), ready.begin(), ready.end());
    else if (!ready.empty())
      Exec(tx, "NotifyReady", NumberArray(ready));
  }
  if (!failed.empty()) Exec(tx, "SkipDescendants", NumberArray(failed));
  std::sort(runs.begin(), runs.end());
  runs.erase(std::unique(runs.begin(), runs.end()), runs.end());
  if (closing_runs)
    *closing_runs = std::move(runs);
  else if (!runs.empty())
    FinishRuns(tx, &runs);
  return applied;
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

namespace {

// ClaimReadyStages's rows, in its SELECT's order.
std::vector<ClaimedStage> ReadClaims(const pqxx::result& r) {
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
    // A spec the catalog should never hold (written around submit_run's checks) fails its own
    // stage when the worker runs it; it must not abort the claim of every other stage.
    try {
      c.spec = StageSpecFromJson(row[8].as<std::string>());
    } catch (const std::exception& e) {
      c.spec_error = e.what();
      c.spec.name = "stage-" + std::to_string(c.stage_id);
    }
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
}

// The projects a worker serves, as the claim's $8: NULL when it serves every project.
std::optional<std::string> ProjectsArray(const std::vector<std::string>& projects) {
  if (projects.empty()) return std::nullopt;
  return TextArray(projects);
}

}  // namespace

std::vector<ClaimedStage> Catalog::ClaimReadyStages(const std::string& pool, int free_instances,
                                                    const std::string& worker_id,
                                                    const std::string& worker_name, double lease_s,
                                                    int64_t only_run, int max_stages,
                                                    const std::vector<std::string>& projects) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    pqxx::result r =
        impl_->Exec(tx, "ClaimReadyStages", pool, free_instances, worker_id, worker_name, lease_s,
                    only_run, max_stages, ProjectsArray(projects));
    tx.commit();
    return ReadClaims(r);
  });
}

Catalog::Committed Catalog::CompleteAndClaim(const std::vector<AttemptResult>& results,
                                             const std::vector<ClaimRequest>& claims,
                                             const std::string& worker_id,
                                             const std::string& worker_name, double lease_s,
                                             int64_t only_run,
                                             const std::vector<std::string>& projects) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    Committed out;
    std::vector<int64_t> released, closing_runs;
    if (!results.empty()) out.applied = impl_->Complete(tx, results, &released, &closing_runs);
    // Own writes are visible to the next statement: the stages just released are ready here.
    for (const auto& c : claims)
      out.claimed.push_back(c.free_instances <= 0
                                ? std::vector<ClaimedStage>{}
                                : ReadClaims(impl_->Exec(
                                      tx, "ClaimReadyStages", c.pool, c.free_instances, worker_id,
                                      worker_name, lease_s, only_run, 0, ProjectsArray(projects))));
    // Only what this transaction left ready wakes the workers (this one included): announcing
    // what it claimed itself made each of them run a claim that found nothing.
    if (!released.empty()) {
      std::set<int64_t> taken;
      for (const auto& batch : out.claimed)
        for (const auto& c : batch) taken.insert(c.stage_id);
      std::erase_if(released, [&](int64_t id) { return taken.count(id) > 0; });
      if (!released.empty()) impl_->Exec(tx, "NotifyReady", NumberArray(released));
    }
    // A run of which this transaction claimed a stage has that stage running: it cannot have
    // ended, and asking (FinishRuns, ~0.9 ms a batch in a drain) is left to that stage's close.
    std::set<int64_t> claimed_runs;
    for (const auto& batch : out.claimed)
      for (const auto& c : batch) claimed_runs.insert(c.run_id);
    std::erase_if(closing_runs, [&](int64_t run) { return claimed_runs.count(run) > 0; });
    if (!closing_runs.empty()) impl_->FinishRuns(tx, &closing_runs);
    tx.commit();
    return out;
  });
}

std::vector<BudgetReservation> Catalog::ReserveBudgets(
    const std::vector<ClaimedStage>& claims, const std::vector<std::optional<Money>>& want,
    const std::string& worker_id) {
  if (claims.empty()) return {};
  return impl_->Guard([&] {
    std::vector<int64_t> ids;
    std::vector<int> attempts;
    std::string amounts = "{";
    for (size_t i = 0; i < claims.size(); ++i) {
      ids.push_back(claims[i].stage_id);
      attempts.push_back(claims[i].attempt);
      amounts += (i ? "," : "") + (want[i] ? want[i]->ToDecimal() : std::string("NULL"));
    }
    amounts += "}";
    pqxx::work tx(impl_->C());
    pqxx::result r = impl_->Exec(tx, "ReserveBudgets", NumberArray(ids), NumberArray(attempts),
                                 worker_id, amounts);
    tx.commit();
    std::vector<BudgetReservation> out;
    for (const auto& row : r) {
      BudgetReservation b;
      b.stage_id = row[0].as<int64_t>();
      if (!row[1].is_null()) b.cap = MoneyOf(row[1]);
      if (!row[2].is_null()) b.waits = MoneyOf(row[2]);
      out.push_back(b);
    }
    return out;
  });
}

std::optional<Money> Catalog::TopUpBudget(int64_t stage_id, int attempt,
                                          const std::string& worker_id, Money more) {
  return impl_->Guard([&]() -> std::optional<Money> {
    pqxx::work tx(impl_->C());
    pqxx::result r = impl_->Exec(tx, "TopUpBudget", stage_id, attempt, worker_id, more.ToDecimal());
    tx.commit();
    if (r.empty() || r[0][0].is_null()) return std::nullopt;
    return MoneyOf(r[0][0]);
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

std::vector<EarlierAttemptRow> Catalog::EarlierAttempts(int64_t stage_id, int attempt) {
  return impl_->Guard([&] {
    pqxx::read_transaction tx(impl_->C());
    pqxx::result r = impl_->Exec(tx, "EarlierAttempts", stage_id, attempt);
    std::vector<EarlierAttemptRow> out;
    for (const auto& row : r)
      out.push_back(
          {row[0].as<int>(), OutcomeFromSql(row[1].c_str()), row[2].c_str(), row[3].as<double>()});
    return out;
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
    pqxx::result r = impl_->Exec(tx, "HeartbeatLeases", worker_id, lease_s, NumberArray(ids),
                                 NumberArray(progress), NumberArray(checkpointed),
                                 NumberArray(sim_seconds), NumberArray(eta));
    impl_->Exec(tx, "WorkerHeartbeat", worker_id);
    tx.commit();
    std::vector<LeaseKey> out;
    for (const auto& row : r)
      out.push_back({row[0].as<int64_t>(), row[1].as<int>(), row[2].as<bool>(),
                     OptionalOutcomeFromSql(row[3].as<std::string>())});
    return out;
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

int Catalog::ReleaseDeadHolds() {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    int n = impl_->Exec(tx, "ReleaseDeadHolds")[0][0].as<int>();
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
      try {
        e.spec = StageSpecFromJson(row[6].as<std::string>());
      } catch (const std::exception& ex) {
        e.spec_error = ex.what();  // rescued with the default policy; its next claim fails it
        e.spec.name = "stage-" + std::to_string(e.stage_id);
      }
      e.progress = row[7].as<double>();
      e.instance_count = row[8].as<int>();
      e.price_per_hour = Money::FromMicros(row[9].as<int64_t>());
      e.sim_seconds = row[10].as<double>();
      e.market = ParseMarket(row[11].as<std::string>()).value_or(e.spec.market);
      e.speed = row[12].as<double>();
      e.progress_from = row[13].as<double>();
      e.live_progress = row[14].as<double>();
      e.run_cancelled = row[15].as<bool>();
      results.push_back(decide(e));
    }
    auto applied = results.empty() ? std::vector<LeaseKey>{} : impl_->Complete(tx, results);
    tx.commit();
    return static_cast<int>(applied.size());
  });
}

std::vector<std::string> Catalog::EndMemberBlockers(double after_s) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<std::string> out;
    for (const auto& row : impl_->Exec(tx, "EndMemberBlockers", after_s))
      out.push_back("pid=" + row[0].as<std::string>() + " member=" + row[1].as<std::string>() +
                    " waited=" + row[2].as<std::string>());
    tx.commit();
    return out;
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
    impl_->changes_receiver =
        std::make_unique<Receiver>(impl_->C(), "trnflow_changes", &impl_->changes_notifications);
  });
}

Notifications Catalog::AwaitNotifications(int timeout_ms) {
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

}  // namespace trnflow::schema
