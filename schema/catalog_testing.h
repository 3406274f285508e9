#pragma once
// What only tests and benchmarks call on a catalog: raw SQL, closing attempts without claiming
// again, rebuilding the ledger's rollups after a bulk load, the binary's schema version. Kept
// out of Catalog's production interface (catalog.h) and in a library of its own,
// trnflow_schema_testing, that tests and bench/ link and no product binary does. Each function
// runs as the Catalog method it once was: one transaction (RunOutsideTransaction: none), on the
// catalog's own connection, throwing CatalogUnavailable when the server cannot be reached.
#include <string>
#include <vector>

#include "schema/catalog.h"

namespace trnflow::schema::testing {

// The newest migration compiled into this binary.
int BinarySchemaVersion();

// One value of a one-row query, as text ("" for NULL or no row), in a transaction committed
// after it (so it may write).
std::string QueryValue(Catalog& catalog, const std::string& sql);

// A statement that cannot run in a transaction (VACUUM, CREATE DATABASE).
void RunOutsideTransaction(Catalog& catalog, const std::string& sql);

// Closes attempts (fenced on their lease), releases dependents of stages that succeeded, skips
// what is downstream of stages that failed, and finishes runs, in one transaction: what a
// worker's CompleteAndClaim does, without claiming again. Returns the results that were applied
// (a stale result is silently dropped).
std::vector<LeaseKey> CompleteAttempts(Catalog& catalog, const std::vector<AttemptResult>& results);
// The result that closes a claimed attempt as succeeded under `owner`'s lease, nothing billed.
AttemptResult Succeeded(const ClaimedStage& claimed, const std::string& owner);

// Recomputes what the ledger's triggers keep from the closed ledger rows (spend_rollup and
// /metrics' counters, migration 0024); for ledgers loaded in bulk with the triggers off.
void RebuildSpendRollup(Catalog& catalog);

}  // namespace trnflow::schema::testing
