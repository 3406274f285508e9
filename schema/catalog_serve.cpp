// Watching stages from the dashboard: acting as a member (row-level security), which projects
// a member sees or may write, the feed of stage state changes and its horizon, metrics, budget
// forecasts, savings and queue waits. SQL: queries/serve.sql.
#include <pqxx/pqxx>

#include "schema/catalog.h"
#include "schema/catalog_impl.h"

namespace trnflow::schema {

LogTicket Catalog::IssueLogTicket(int64_t run, const std::string& stage, int attempt) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::optional<int> which;
    if (attempt > 0) which = attempt;
    auto row = impl_->Exec(tx, "IssueLogTicket", run, stage, which)[0];
    LogTicket t{row[0].as<std::string>(), row[1].as<int>()};
    tx.commit();
    return t;
  });
}

std::optional<SpentLogTicket> Catalog::SpendLogTicket(const std::string& ticket) {
  return impl_->Guard([&]() -> std::optional<SpentLogTicket> {
    pqxx::work tx(impl_->C());
    auto r = impl_->Exec(tx, "SpendLogTicket", ticket);
    tx.commit();
    if (r.empty()) return std::nullopt;
    return SpentLogTicket{r[0][0].as<std::string>(), r[0][1].as<int64_t>(),
                          r[0][2].as<std::string>(), r[0][3].as<int>()};
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
      if (c.stage.empty())
        c.state = RunStateFromSql(row[5].as<std::string>());
      else
        c.state = StageStateFromSql(row[5].as<std::string>());
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
    // Whole months (or all history) from spend_month, cache hits included; other dates from
    // the daily rollup and the ledger's cache hits.
    const char* query = WholeMonths(q.since, q.until) ? "SavingsByMonth" : "Savings";
    for (const auto& row : impl_->Exec(tx, query, q.project, q.pipeline, q.since, q.until))
      out.push_back({row[0].as<std::string>(), MoneyOf(row[1]), MoneyOf(row[2]), MoneyOf(row[3]),
                     row[4].as<int64_t>(), MoneyOf(row[5]), MoneyOf(row[6]), MoneyOf(row[7]),
                     MoneyOf(row[8])});
    return out;
  });
}

int64_t Catalog::OldestRunningTransaction() {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    return impl_->Exec(tx, "OldestRunningTransaction")[0][0].as<int64_t>();
  });
}

int64_t Catalog::NewTransactionId() {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    int64_t id = impl_->Exec(tx, "NewTransactionId")[0][0].as<int64_t>();
    tx.commit();
    return id;
  });
}

}  // namespace trnflow::schema
