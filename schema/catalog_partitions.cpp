// The ledger's monthly partitions (migration 0031): making them ahead (the scheduler's
// `partitions` service) and `trnflow db archive`'s checks and drop. SQL in queries/stages.sql
// (MakeAttemptsPartitionsAhead); the owner's statements here are one-off administration.
#include <pqxx/pqxx>
#include <regex>

#include "common/env.h"
#include "common/error.h"
#include "schema/catalog.h"
#include "schema/catalog_impl.h"

namespace trnflow::schema {

int Catalog::MakeAttemptsPartitionsAhead(int months_ahead) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    int n = impl_->Exec(tx, "MakeAttemptsPartitionsAhead", months_ahead)[0][0].as<int>();
    tx.commit();
    return n;
  });
}

namespace {
// Open attempts of [from, to): running stages whose attempt started then. Their close writes
// the ledger row into that month's partition.
const char* kOpenAttempts =
    "SELECT count(*) FROM trnflow.running_stages q JOIN trnflow.stages s ON s.id = q.stage_id "
    "WHERE s.state = 'running' AND s.attempt_started_at >= $1::timestamptz "
    "AND s.attempt_started_at < $2::timestamptz";
}  // namespace

ArchivePlan PlanArchive(const std::string& owner_url, const std::string& month) {
  static const std::regex kMonth(R"(^(\d{4})-(\d{2})$)");
  std::smatch m;
  if (!std::regex_match(month, m, kMonth) || std::stoi(m[2]) < 1 || std::stoi(m[2]) > 12 ||
      std::stoi(m[1]) < 2000)
    throw UserError("--month " + month + ": expected a UTC month as YYYY-MM, e.g. 2025-11");
  ArchivePlan plan;
  plan.month = month;
  plan.partition = "attempts_" + std::string(m[1]) + "_" + std::string(m[2]);
  plan.from = month + "-01 00:00:00+00";
  int y = std::stoi(m[1]), mo = std::stoi(m[2]) + 1;
  if (mo == 13) mo = 1, ++y;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04d-%02d-01 00:00:00+00", y, mo);
  plan.to = buf;
  try {
    pqxx::connection c(owner_url);
    pqxx::nontransaction nt(c);
    plan.database = nt.exec("SELECT current_database()")[0][0].as<std::string>();
    if (nt.exec("SELECT to_regclass('trnflow.attempts') IS NULL")[0][0].as<bool>())
      throw UserError("database " + plan.database +
                      " holds no trnflow catalog: run `trnflow db "
                      "migrate` first");
    if (nt.exec(
              "SELECT relkind <> 'p' FROM pg_class WHERE oid = 'trnflow.attempts'::regclass")[0][0]
            .as<bool>())
      throw UserError("the ledger of " + plan.database +
                      " is not partitioned by month yet "
                      "(migration 0031): run `trnflow db migrate` first");
    std::string this_month =
        nt.exec("SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM')")[0][0].as<std::string>();
    if (month >= this_month)
      throw UserError("--month " + month + ": " +
                      (month == this_month ? std::string("the current UTC month")
                                           : std::string("a month to come")) +
                      " is still being written; archive only a past month (before " + this_month +
                      ")");
    auto part = nt.exec_params(
        "SELECT c.oid::regclass::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE i.inhparent = 'trnflow.attempts'::regclass AND n.nspname = 'trnflow' "
        "AND c.relname = $1",
        plan.partition);
    if (part.empty()) {
      std::string have;
      for (const auto& row :
           nt.exec("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                   "WHERE i.inhparent = 'trnflow.attempts'::regclass AND c.relname ~ "
                   "'^attempts_[0-9]{4}_[0-9]{2}$' ORDER BY 1 LIMIT 3"))
        have += (have.empty() ? "" : ", ") + row[0].as<std::string>();
      throw UserError("--month " + month + ": the ledger has no partition trnflow." +
                      plan.partition + " (archived already, or before the first month" +
                      (have.empty() ? std::string(")") : "; the oldest are " + have + ")"));
    }
    plan.attempts =
        nt.exec("SELECT count(*) FROM trnflow." + c.quote_name(plan.partition))[0][0].as<int64_t>();
    plan.open_attempts = nt.exec_params(kOpenAttempts, plan.from, plan.to)[0][0].as<int64_t>();
    if (plan.open_attempts > 0)
      throw UserError("--month " + month + ": " + std::to_string(plan.open_attempts) +
                      " attempts that started then are still open; their ledger rows go into "
                      "trnflow." +
                      plan.partition +
                      " when they close. Archive it once they "
                      "have (`trnflow runs --state running`)");
  } catch (const pqxx::broken_connection& e) {
    throw CatalogUnavailable("cannot reach the catalog at " + RedactUrl(owner_url) + ": " +
                             RedactSecrets(e.what(), owner_url));
  }
  return plan;
}

void DropArchivedPartition(const std::string& owner_url, const ArchivePlan& plan) {
  try {
    pqxx::connection c(owner_url);
    pqxx::work tx(c);
    // Closes insert into the ledger under ROW EXCLUSIVE until they commit: with the ledger
    // locked, every close has committed or waits, so the checks below are final.
    tx.exec("SET LOCAL lock_timeout = '5s'");
    tx.exec("LOCK TABLE trnflow.attempts IN ACCESS EXCLUSIVE MODE");
    std::string table = "trnflow." + c.quote_name(plan.partition);
    int64_t open = tx.exec_params(kOpenAttempts, plan.from, plan.to)[0][0].as<int64_t>();
    int64_t rows = tx.exec("SELECT count(*) FROM " + table)[0][0].as<int64_t>();
    if (open > 0 || rows != plan.attempts)
      throw UserError("--month " + plan.month + ": trnflow." + plan.partition +
                      " changed while "
                      "it was dumped (" +
                      std::to_string(plan.attempts) + " attempts then, " + std::to_string(rows) +
                      " now, " + std::to_string(open) +
                      " open); "
                      "nothing was dropped: run the archive again");
    tx.exec("ALTER TABLE trnflow.attempts DETACH PARTITION " + table);
    tx.exec("DROP TABLE " + table);
    tx.commit();
  } catch (const pqxx::broken_connection& e) {
    throw CatalogUnavailable("cannot reach the catalog at " + RedactUrl(owner_url) + ": " +
                             RedactSecrets(e.what(), owner_url));
  }
}

}  // namespace trnflow::schema
