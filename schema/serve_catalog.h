#pragma once
// ServeCatalog: the part of the catalog the dashboard itself uses (serve/): acting as the
// request's role, log tickets, /metrics, the change stream its EventHub follows, and the
// operator buttons (cancel, resume, retry). schema::Catalog (catalog.h) implements it. The /api
// views are not here: the command line writes them over the whole Catalog (cli/cmd_serve.cpp,
// serve/server.h's ApiView), so serve/server.cpp still keeps a pool of Catalogs to hand them;
// everything serve/ calls itself goes through this door.
//
// As Catalog: one object owns one connection and is NOT thread-safe (each thread opens its
// own); every method runs in one transaction and throws CatalogUnavailable when the server
// cannot be reached; rows that are not there are values (nullopt, empty, false).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "schema/catalog_rows.h"
#include "schema/notifications.h"

namespace trnflow::schema {

class ServeCatalog {
 public:
  virtual ~ServeCatalog() = default;

  // --- who the request is ------------------------------------------------------------------
  // From now on this connection acts as `role` (SET ROLE, for the session), so row-level
  // security shows what that role may see; "" goes back to the login's own role. Throws
  // PermissionDenied when the login may not act as it.
  virtual void ActAs(const std::string& role) = 0;
  // The projects login role `role` is a member of, when the dashboard may act as it (not
  // privileged, not the daemons' or the reader's); empty otherwise.
  virtual std::vector<std::string> MemberProjects(const std::string& role) = 0;
  // Whether login role `role` may write (submit, cancel, retry, resume) in `project`.
  virtual bool MayWrite(const std::string& role, const std::string& project) = 0;
  // What ticket `ticket` was issued for, once; nullopt for one unknown, spent or expired. The
  // daemons' login only.
  virtual std::optional<SpentLogTicket> SpendLogTicket(const std::string& ticket) = 0;

  // --- reads and the operator buttons ----------------------------------------------------------
  virtual std::optional<RunRow> GetRun(int64_t run_id) = 0;
  // reason: "cancelled" (an operator) or "budget_exceeded" (the budget guard).
  virtual CancelReport CancelRun(int64_t run_id, Outcome reason = Outcome::kCancelled) = 0;
  // A failed or cancelled run continues: its failed, cancelled and skipped stages start over
  // with fresh budgets, from their last checkpoint; succeeded and cached stages stay.
  // Returns the stages reset; throws UserError when the run is running or succeeded.
  virtual int ResumeRun(int64_t run_id) = 0;
  // One stage (every expansion of a matrix stage) and everything downstream start over from
  // scratch, whatever they ended as. Throws UserError for an unknown stage or one of them
  // still running.
  virtual int RetryStage(int64_t run_id, const std::string& stage) = 0;
  // Every /metrics sample, from the ledger and the live tables (schema/queries/serve.sql).
  virtual std::vector<MetricRow> Metrics() = 0;

  // --- the change stream (serve/event_hub.h) ----------------------------------------------------
  // LISTEN where state changes are announced (trnflow.changes; the dashboard's event stream).
  virtual void ListenForChanges() = 0;
  // Waits up to `timeout_ms` for notifications; returns how many of each arrived.
  virtual Notifications AwaitNotifications(int timeout_ms) = 0;
  // State changes after `after_id`, oldest first, at most `limit`.
  virtual std::vector<ChangeRow> ChangesSince(int64_t after_id, int limit) = 0;
  virtual int64_t LatestChangeId() = 0;
  // Deletes changes older than `max_age_s`; returns how many.
  virtual int64_t PruneChanges(double max_age_s) = 0;
  // The oldest transaction id still running (pg_current_snapshot()'s xmin): every older one has
  // ended.
  virtual int64_t OldestRunningTransaction() = 0;
  // A transaction id newer than every one given out so far: this call's own (it takes one).
  // Not the snapshot's xmax, which is one past the newest *ended* transaction: transactions
  // still running may hold ids above it.
  virtual int64_t NewTransactionId() = 0;
};

// A new connection to the catalog at `url`, seen through the dashboard's door. Throws
// CatalogUnavailable with the URL (password hidden) and how to fix it.
std::unique_ptr<ServeCatalog> OpenServeCatalog(const std::string& url);

}  // namespace trnflow::schema
