// Stages that come back on a cron: schedules, and firing one (a submitted run) at most once per
// slot. SQL: queries/schedules.sql.
#include <pqxx/pqxx>

#include "schema/catalog.h"
#include "schema/catalog_impl.h"

namespace trnflow::schema {

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
    r.last_run_state = OptionalRunStateFromSql(row[18].as<std::string>());
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

int64_t Catalog::FireScheduleNow(const std::string& name, const pipelines::Pipeline& pipeline,
                                 const SubmitOptions& options) {
  return impl_->Guard([&]() -> int64_t {
    pqxx::work tx(impl_->C());
    double slot = impl_->Exec(tx, "RecordManualFire", name)[0][0].as<double>();
    int64_t run_id = impl_->Submit(tx, pipeline, options);
    impl_->Exec(tx, "SetManualFireRun", name, slot, run_id);
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

}  // namespace trnflow::schema
