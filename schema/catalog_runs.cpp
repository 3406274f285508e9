// Reading a run's stages and attempts after (or while) they run, their events, and changing
// a run's course: cancel, resume, retry a stage. SQL: queries/runs.sql.
#include <map>
#include <pqxx/pqxx>

#include "schema/catalog.h"
#include "schema/catalog_impl.h"
#include "schema/run_view.h"

namespace trnflow::schema {

namespace {
RunRow ReadRun(const pqxx::row& row) {
  RunRow r;
  r.id = row[0].as<int64_t>();
  r.project = row[1].as<std::string>();
  r.pipeline = row[2].as<std::string>();
  r.state = RunStateFromSql(row[3].as<std::string>());
  r.speed = row[4].as<double>();
  r.seed = row[5].as<int64_t>();
  r.workdir = row[6].as<std::string>();
  r.created_at = row[7].as<std::string>();
  r.finished_at = row[8].as<std::string>();
  r.cost = MoneyOf(row[9]);
  if (!row[10].as<std::string>().empty()) r.budget = MoneyOf(row[10]);
  r.wall_seconds = row[11].as<double>();
  r.cancel_reason = OptionalOutcomeFromSql(row[12].as<std::string>());
  r.wasted = MoneyOf(row[13]);
  return r;
}

std::vector<StageRow> ReadStages(const pqxx::result& result) {
  std::vector<StageRow> out;
  out.reserve(result.size());
  for (const auto& row : result) {
    StageRow s;
    s.id = row[0].as<int64_t>();
    s.name = row[1].as<std::string>();
    s.kind = StageKindFromSql(row[2].as<std::string>());
    s.state = StageStateFromSql(row[3].as<std::string>());
    s.instance_type = row[4].as<std::string>();
    s.instance_count = row[5].as<int>();
    s.market = MarketFromSql(row[6].as<std::string>());
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
    s.last_outcome = OptionalOutcomeFromSql(row[17].as<std::string>());
    s.last_message = row[18].as<std::string>();
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<AttemptRow> ReadAttempts(const pqxx::result& result) {
  std::vector<AttemptRow> out;
  out.reserve(result.size());
  for (const auto& row : result) {
    AttemptRow a;
    a.stage_id = row[0].as<int64_t>();
    a.attempt = row[1].as<int>();
    a.outcome = OptionalOutcomeFromSql(row[2].as<std::string>());
    a.worker = row[3].as<std::string>();
    a.instance_type = row[4].as<std::string>();
    a.instance_count = row[5].as<int>();
    a.market = MarketFromSql(row[6].as<std::string>());
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
    a.queued_at = row[19].as<std::string>();
    out.push_back(std::move(a));
  }
  return out;
}
}  // namespace

std::optional<RunRow> Catalog::GetRun(int64_t run_id) {
  return impl_->Guard([&]() -> std::optional<RunRow> {
    pqxx::work tx(impl_->C());
    PlanForTheseValues(tx);
    pqxx::result r = impl_->Exec(tx, "ListRuns", std::string(), std::string(), 1, run_id,
                                 std::string(), std::string());
    if (r.empty()) return std::nullopt;
    return ReadRun(r[0]);
  });
}

std::vector<RunRow> Catalog::ListRuns(const RunsQuery& q) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    PlanForTheseValues(tx);
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
    return ReadStages(impl_->Exec(tx, "GetStages", run_id));
  });
}

std::vector<AttemptRow> Catalog::GetAttempts(int64_t run_id) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    return ReadAttempts(impl_->Exec(tx, "GetAttempts", run_id));
  });
}

std::optional<RunView> Catalog::ReadRunView(int64_t run_id, bool with_attempts) {
  return impl_->Guard([&]() -> std::optional<RunView> {
    // One snapshot: the run's figures, its stages and their attempts agree with each other.
    pqxx::transaction<pqxx::repeatable_read, pqxx::read_only> tx(impl_->C());
    PlanForTheseValues(tx);
    pqxx::result r = impl_->Exec(tx, "ListRuns", std::string(), std::string(), 1, run_id,
                                 std::string(), std::string());
    if (r.empty()) return std::nullopt;
    RunView v;
    v.run = ReadRun(r[0]);
    v.stages = ReadStages(impl_->Exec(tx, "GetStages", run_id));
    if (with_attempts) v.attempts = ReadAttempts(impl_->Exec(tx, "GetAttempts", run_id));
    for (const auto& row : impl_->Exec(tx, "LatestStageMetrics", run_id))
      v.metrics[row[0].as<int64_t>()] = row[1].as<std::string>();
    return v;
  });
}

int Catalog::CountRunningStages(int64_t run_id) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    return impl_->Exec(tx, "CountRunningStages", run_id)[0][0].as<int>();
  });
}

void Catalog::Impl::InsertEvents(pqxx::work& tx, const std::vector<EventRow>& events) {
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

void Catalog::InsertEvents(const std::vector<EventRow>& events) {
  if (events.empty()) return;
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    impl_->InsertEvents(tx, events);
    tx.commit();
  });
}

CancelReport Catalog::CancelRun(int64_t run_id, Outcome reason) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    pqxx::row r = impl_->Exec(tx, "CancelRun", run_id, ToSql(reason))[0];
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

}  // namespace trnflow::schema
