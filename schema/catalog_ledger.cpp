// What stages cost: spend reports (from the spend rollup, or the ledger for per-run ones), the
// spend of running stages, project and run budgets and their notices, and rebuilding the
// rollup. SQL: queries/runs.sql; Spend builds its statement from fixed fields.
#include <algorithm>
#include <cstdio>
#include <map>
#include <pqxx/pqxx>

#include "common/error.h"
#include "schema/catalog.h"
#include "schema/catalog_impl.h"

namespace trnflow::schema {

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

bool WholeMonths(const std::string& since, const std::string& until) {
  auto parse = [](const std::string& d, int& y, int& m, int& day) {
    char tail = 0;
    return d.size() == 10 && std::sscanf(d.c_str(), "%4d-%2d-%2d%c", &y, &m, &day, &tail) == 3 &&
           m >= 1 && m <= 12;
  };
  int y = 0, m = 0, d = 0;
  if (!since.empty() && !(parse(since, y, m, d) && d == 1)) return false;
  if (until.empty()) return true;
  if (!parse(until, y, m, d)) return false;
  static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  return d == days[m - 1] + (m == 2 && leap ? 1 : 0);
}

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
  // The smallest rollup that holds the groups and the dates answers (migration 0030); per-run
  // questions need the ledger itself. Every source sums the same ledger columns.
  std::string source;
  auto only = [&](std::initializer_list<const char*> allowed) {
    for (const auto& b : q.by)
      if (std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return b == a; }) ==
          allowed.end())
        return false;
    return true;
  };
  const bool months = WholeMonths(q.since, q.until);
  if (per_run)
    source =
        "(SELECT a.run_id::text AS run, r.project, p.name AS pipeline, s.name AS stage, "
        "s.kind, a.instance_type, a.market, (a.started_at AT TIME ZONE 'UTC')::date AS day, "
        "1 AS attempts, coalesce(a.billed_seconds, 0) AS billed_seconds, "
        "coalesce(a.cost_usd, 0) AS cost_usd, coalesce(a.wasted_usd, 0) AS wasted_usd, "
        "coalesce(a.saved_usd, 0) AS saved_usd FROM trnflow.attempts a "
        "JOIN trnflow.stages s ON s.id = a.stage_id JOIN trnflow.runs r ON r.id = a.run_id "
        "JOIN trnflow.pipelines p ON p.id = r.pipeline_id) x";
  else if (months && only({"project", "pipeline", "kind", "instance", "market", "month"}))
    source = "(SELECT *, month AS day FROM trnflow.spend_month) x";
  else if (months && only({"project", "pipeline", "stage", "kind", "instance", "market", "month"}))
    source = "(SELECT *, month AS day FROM trnflow.spend_month_stage) x";
  else if (only({"project", "pipeline", "day", "month"}))
    source = "trnflow.spend_day";
  else
    source = "trnflow.spend_rollup";
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

std::pair<int64_t, Money> Catalog::RunningSpend(const std::string& project,
                                                const std::string& pipeline) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    auto row = impl_->Exec(tx, "RunningSpend", project, pipeline)[0];
    return std::make_pair(row[0].as<int64_t>(), MoneyOf(row[1]));
  });
}

bool Catalog::RemoveBudget(const std::string& project) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    bool removed = !impl_->Exec(tx, "RemoveBudget", project).empty();
    impl_->Exec(tx, "WakeBudgetWaits", project);  // nothing holds them back any more
    tx.commit();
    return removed;
  });
}

void Catalog::SetBudget(const std::string& project, Money amount, const std::string& period) {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    impl_->Exec(tx, "EnsureProject", project);
    impl_->Exec(tx, "UpsertBudget", project, amount.ToDecimal(), period);
    impl_->Exec(tx, "WakeBudgetWaits", project);  // a raised budget may cover them now
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

std::optional<BudgetWaitRow> Catalog::StageBudgetWait(int64_t run_id, int64_t stage_id) {
  return impl_->Guard([&]() -> std::optional<BudgetWaitRow> {
    pqxx::work tx(impl_->C());
    pqxx::result r = impl_->Exec(tx, "StageBudgetWait", run_id, stage_id);
    if (r.empty()) return std::nullopt;
    BudgetWaitRow w;
    w.since = r[0][0].as<std::string>();
    w.needs = MoneyOf(r[0][1]);
    w.left = MoneyOf(r[0][2]);
    w.held = MoneyOf(r[0][3]);
    w.holders = r[0][4].is_null() ? 0 : r[0][4].as<int>();
    w.scope = r[0][5].is_null() ? "" : r[0][5].as<std::string>();
    return w;
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

}  // namespace trnflow::schema
