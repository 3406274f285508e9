// The test-only catalog calls (catalog_testing.h), over Catalog's connection.
#include "schema/catalog_testing.h"

#include <algorithm>
#include <pqxx/pqxx>

#include "schema/catalog_impl.h"
#include "schema/sql_text.h"

namespace trnflow::schema {

// The one way into a Catalog's connection from outside its members (a friend of Catalog).
class CatalogTestAccess {
 public:
  static Catalog::Impl& Of(Catalog& c) { return *c.impl_; }
};

namespace testing {

int BinarySchemaVersion() {
  int latest = 0;
  for (const auto& m : Migrations()) latest = std::max(latest, m.version);
  return latest;
}

std::string QueryValue(Catalog& catalog, const std::string& sql) {
  auto& m = CatalogTestAccess::Of(catalog);
  return m.Guard([&] {
    pqxx::work tx(m.C());
    pqxx::result r = tx.exec(sql);
    tx.commit();
    if (r.empty() || r[0][0].is_null()) return std::string();
    return r[0][0].as<std::string>();
  });
}

void RunOutsideTransaction(Catalog& catalog, const std::string& sql) {
  auto& m = CatalogTestAccess::Of(catalog);
  m.Guard([&] {
    pqxx::nontransaction nt(m.C());
    nt.exec(sql);
  });
}

AttemptResult Succeeded(const ClaimedStage& claimed, const std::string& owner) {
  AttemptResult r;
  r.stage_id = claimed.stage_id;
  r.attempt = claimed.attempt;
  r.lease_owner = owner;
  r.outcome = Outcome::kSucceeded;
  r.next_state = StageState::kSucceeded;
  r.next_market = claimed.market;
  r.progress_to = 1;
  return r;
}

std::vector<LeaseKey> CompleteAttempts(Catalog& catalog,
                                       const std::vector<AttemptResult>& results) {
  if (results.empty()) return {};
  auto& m = CatalogTestAccess::Of(catalog);
  return m.Guard([&] {
    pqxx::work tx(m.C());
    auto applied = m.Complete(tx, results);
    tx.commit();
    return applied;
  });
}

void RebuildSpendRollup(Catalog& catalog) {
  auto& m = CatalogTestAccess::Of(catalog);
  m.Guard([&] {
    pqxx::work tx(m.C());
    m.Exec(tx, "RebuildSpendRollups");
    m.Exec(tx, "RebuildMetricCounters");
    tx.commit();
  });
}

}  // namespace testing
}  // namespace trnflow::schema
