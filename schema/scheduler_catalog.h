#pragma once
// SchedulerCatalog: the part of the catalog the scheduler uses (scheduler/), and nothing else:
// leadership, the maintenance services (promoter, rescuer, finisher, budget guard), cron fires
// and the estimate budget admission is given (admission.h). schema::Catalog (catalog.h)
// implements it; code in scheduler/ holds a SchedulerCatalog and never names Catalog (the ctest
// catalog_doors_hold checks).
//
// As Catalog: one object owns one connection and is NOT thread-safe (each thread opens its
// own); every method runs in one transaction and throws CatalogUnavailable when the server
// cannot be reached; rows that are not there are values (nullopt, empty, false).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "schema/catalog_rows.h"

namespace trnflow::pipelines {
struct Pipeline;
}

namespace trnflow::schema {

class SchedulerCatalog {
 public:
  virtual ~SchedulerCatalog() = default;

  // --- leadership and the maintenance services -----------------------------------------------
  // Takes or confirms leadership: an EXCLUSIVE lock on trnflow.leader_lock, held by an open
  // transaction on a connection of its own (daemons only: members cannot lock the table).
  virtual bool TryAcquireLeadership() = 0;
  virtual int PromoteRetries() = 0;
  // Ends expired leases: `decide` turns each into the result to record (outcome lost).
  virtual int RescueExpiredLeases(
      const std::function<AttemptResult(const ExpiredLease&)>& decide) = 0;
  // Releases runs whose holder (`trnflow run`, `watch --execute`) is gone: daemon workers may
  // take their stages. Returns how many.
  virtual int ReleaseDeadHolds() = 0;
  // Finishes runs none of whose stages can still change. Returns their ids.
  virtual std::vector<int64_t> FinishRuns() = 0;
  // The ledger's month partitions for this month and `months_ahead` more (migration 0031);
  // how many were made.
  virtual int MakeAttemptsPartitionsAhead(int months_ahead) = 0;

  // --- budgets --------------------------------------------------------------------------------
  virtual std::vector<BudgetRow> ProjectBudgets(const std::string& project = "") = 0;
  virtual void RecordBudgetNotice(const std::string& project, int percent) = 0;
  virtual std::vector<RunBudgetRow> RunBudgets() = 0;
  virtual void RecordRunBudgetNotice(int64_t run_id, int percent) = 0;
  virtual std::vector<int64_t> RunningRunsOfProject(const std::string& project) = 0;
  // reason: "cancelled" (an operator) or "budget_exceeded" (the budget guard).
  virtual CancelReport CancelRun(int64_t run_id, Outcome reason = Outcome::kCancelled) = 0;
  // project: for events about a project as a whole (run_id 0), so its members see them.
  virtual void InsertEvent(int64_t run_id, int64_t stage_id, const std::string& kind,
                           const std::string& message, const std::string& data_json = "{}",
                           const std::string& project = "") = 0;

  // --- schedules ------------------------------------------------------------------------------
  virtual std::vector<ScheduleRow> ListSchedules() = 0;
  // nullopt: no such schedule.
  virtual std::optional<ScheduleRow> GetSchedule(const std::string& name) = 0;
  // Fires one slot: records it and submits the run in one transaction. Returns the run id, or
  // 0 when the slot had already fired (another scheduler, a restart). Moves last_slot on.
  virtual int64_t FireSchedule(const std::string& name, double slot_epoch,
                               const pipelines::Pipeline& pipeline,
                               const SubmitOptions& options) = 0;
  // Fires it now, outside its cron (`schedule run`): records a manual fire at this moment and
  // submits the run in one transaction, as FireSchedule does, and leaves last_slot alone.
  virtual int64_t FireScheduleNow(const std::string& name, const pipelines::Pipeline& pipeline,
                                  const SubmitOptions& options) = 0;
  // Marks slots up to `slot_epoch` as past without firing them (catch-up none/latest).
  virtual void AdvanceSchedule(const std::string& name, double slot_epoch) = 0;
  // The room `project` has for one more run (migration 0024's stage_room): what the parser
  // bounds a file's stage count by before it expands a matrix.
  virtual StageRoom GetStageRoom(const std::string& project) = 0;

  // --- planning (admission.h) -------------------------------------------------------------------
  // The past of run: stages named `stages` in `project`'s runs of `pipeline` (latest 20 runs
  // each); a stage that never succeeded there is absent.
  virtual std::map<std::string, StageHistoryRow> StageHistory(
      const std::string& project, const std::string& pipeline,
      const std::vector<std::string>& stages) = 0;
  // A compiled-artifact cache entry (a compile whose graph is ready costs $0); nullopt: none.
  virtual std::optional<ArtifactRow> GetArtifact(const std::string& key) = 0;
};

// A new connection to the catalog at `url`, seen through the scheduler's door. Throws
// CatalogUnavailable with the URL (password hidden) and how to fix it.
std::unique_ptr<SchedulerCatalog> OpenSchedulerCatalog(const std::string& url);

}  // namespace trnflow::schema
