// The workers a stage can run on: registering, heartbeating (with HeartbeatLeases) and stopping
// workers, listing the live ones, and explaining what a stage waits for. SQL:
// queries/workers.sql.
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

#include "schema/catalog.h"
#include "schema/catalog_impl.h"

namespace trnflow::schema {

void Catalog::RegisterWorker(const std::string& worker_id, const std::string& host, int pid,
                             const std::string& pools_json, int64_t only_run,
                             const std::string& home, double lease_s,
                             const std::vector<std::string>& projects) {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::optional<std::string> served;
    if (!projects.empty()) served = TextArray(projects);
    impl_->Exec(tx, "RegisterWorker", worker_id, host, pid, pools_json, only_run, home, lease_s,
                served);
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
      w.lease_s = row[6].as<double>();
      auto in_use = nlohmann::json::parse(row[7].as<std::string>());
      for (auto it = in_use.begin(); it != in_use.end(); ++it)
        w.in_use[it.key()] = static_cast<int>(it->get<double>());
      w.projects = SplitComma(row[8].as<std::string>());
      out.push_back(std::move(w));
    }
    return out;
  });
}

std::vector<LiveWorker> Catalog::ForgetWorkers(const std::string& which) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<LiveWorker> out;
    for (const auto& row : impl_->Exec(tx, "ForgetWorkers", which)) {
      LiveWorker w;
      w.id = row[0].as<std::string>();
      w.host = row[1].as<std::string>();
      w.pid = row[2].as<int>();
      out.push_back(std::move(w));
    }
    tx.commit();
    return out;
  });
}

std::optional<RunHolder> Catalog::HolderOf(int64_t run_id) {
  return impl_->Guard([&]() -> std::optional<RunHolder> {
    pqxx::work tx(impl_->C());
    auto r = impl_->Exec(tx, "RunHolder", run_id);
    if (r.empty()) return std::nullopt;
    RunHolder h;
    h.host = r[0][0].as<std::string>();
    h.pid = r[0][1].as<int>();
    h.heartbeat_age_s = r[0][2].as<double>();
    h.stopped = r[0][3].as<bool>();
    h.lease_s = r[0][4].as<double>();
    h.registered = r[0][5].as<bool>();
    return h;
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
    w.state = StageStateFromSql(row[1].as<std::string>());
    w.pool = row[2].as<std::string>();
    w.instance_count = row[3].as<int>();
    w.attempts = row[4].as<int>();
    w.priority = row[5].as<int>();
    w.run_state = RunStateFromSql(row[6].as<std::string>());
    w.project = row[7].as<std::string>();
    w.ready_in_s = row[8].as<double>();
    for (const auto& item : SplitComma(row[9].as<std::string>())) {
      auto colon = item.rfind(':');
      w.waiting_for.push_back({item.substr(0, colon), StageStateFromSql(item.substr(colon + 1))});
    }
    w.queued_ahead = row[10].as<int64_t>();
    w.last_outcome = OptionalOutcomeFromSql(row[11].as<std::string>());
    w.last_message = row[12].as<std::string>();
    w.running_on = row[13].as<std::string>();
    if (row[14].as<bool>()) {
      StageWait::Share share;
      share.weight = row[15].as<double>();
      share.running_in_pool = row[16].as<int>();
      share.running = row[17].as<int>();
      share.pool_running = row[18].as<int>();
      if (int cap = row[19].as<int>(); cap >= 0) share.max_running = cap;
      if (int cap = row[20].as<int>(); cap >= 0) share.pool_max_running = cap;
      share.ahead_in_project = row[21].as<int>();
      share.ahead_elsewhere = row[22].as<int>();
      share.projects_waiting = row[23].as<int>();
      share.running_stages_in_pool = row[24].as<int>();
      w.share = share;
    }
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

}  // namespace trnflow::schema
