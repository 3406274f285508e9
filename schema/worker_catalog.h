#pragma once
// WorkerCatalog: the part of the catalog a worker uses (workers/), and nothing else: register,
// claim, reserve budget caps, heartbeat, complete and claim again, listen for ready stages, and
// the compiled-artifact cache's single flight. schema::Catalog (catalog.h) implements it; code
// in workers/ holds a WorkerCatalog and never names Catalog (the ctest catalog_doors_hold checks).
//
// As Catalog: one object owns one connection and is NOT thread-safe (each thread opens its
// own); every method runs in one transaction and throws CatalogUnavailable when the server
// cannot be reached; rows that are not there are values (nullopt, empty, false).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/money.h"
#include "schema/catalog_rows.h"
#include "schema/notifications.h"

namespace trnflow::schema {

class WorkerCatalog {
 public:
  virtual ~WorkerCatalog() = default;

  // --- the worker's life --------------------------------------------------------------------
  // only_run: the worker runs that run's stages only (`trnflow run`); 0: any run.
  // Such a worker holds its run: daemon workers skip its stages. lease_s: how long it may go
  // without a heartbeat before it is dead.
  virtual void RegisterWorker(const std::string& worker_id, const std::string& host, int pid,
                              const std::string& pools_json, int64_t only_run = 0,
                              const std::string& home = "", double lease_s = 15,
                              const std::vector<std::string>& projects = {}) = 0;
  virtual void StopWorker(const std::string& worker_id) = 0;

  // --- claims, leases, results --------------------------------------------------------------
  // Claims ready stages of `pool` that fit in `free_instances`, shared between projects
  // (queries/stages.sql); `max_stages` > 0 takes at most that many.
  virtual std::vector<ClaimedStage> ClaimReadyStages(
      const std::string& pool, int free_instances, const std::string& worker_id,
      const std::string& worker_name, double lease_s, int64_t only_run = 0, int max_stages = 0,
      const std::vector<std::string>& projects = {}) = 0;
  // Reserves spend caps for attempts of budgeted runs and projects this worker (`worker_id`)
  // claimed, in the order given (`want`: each attempt's estimate, nullopt: one billing
  // minute). One whose estimate is not covered while others hold reservations waits: it is
  // un-claimed in the same transaction, with no ledger row. Attempts no budget limits are left
  // out of the answer.
  virtual std::vector<BudgetReservation> ReserveBudgets(
      const std::vector<ClaimedStage>& claims, const std::vector<std::optional<Money>>& want,
      const std::string& worker_id) = 0;
  // A running attempt's reservation raised by `more`, never past what its budgets have left;
  // returns its cap now, nullopt when it no longer runs under this worker's lease.
  virtual std::optional<Money> TopUpBudget(int64_t stage_id, int attempt,
                                           const std::string& worker_id, Money more) = 0;
  // Stores the executor's id for a running attempt (a Slurm job id) if `worker_id` still holds
  // its lease; false otherwise.
  virtual bool RecordExecutorJob(int64_t stage_id, int attempt, const std::string& worker_id,
                                 const std::string& job) = 0;
  // The ledger's attempts of a stage before `attempt`, in order.
  virtual std::vector<EarlierAttemptRow> EarlierAttempts(int64_t stage_id, int attempt) = 0;
  // Renews the leases of the stages this worker runs (one report each) and returns those it
  // still holds; an in-flight stage missing here was taken over. Records what each attempt
  // said of itself: a checkpoint moves its stage's resume point forward at once.
  virtual std::vector<LeaseKey> HeartbeatLeases(const std::string& worker_id, double lease_s,
                                                const std::vector<LiveReport>& reports) = 0;
  // Closes attempts (fenced on their lease), releases dependents of stages that succeeded,
  // skips what is downstream of stages that failed, and finishes runs; then, in the same
  // transaction, ClaimReadyStages for each pool of `claims` with the free instances it names:
  // a worker that closes a stage takes the dependents it just released (and whatever else is
  // ready) without another round trip, so a chain's next link starts at once. `applied`: the
  // results that were applied (a stale result is silently dropped); claims come back in the
  // order of `claims`.
  struct ClaimRequest {
    std::string pool;
    int free_instances = 0;
  };
  struct Committed {
    std::vector<LeaseKey> applied;
    std::vector<std::vector<ClaimedStage>> claimed;  // one list per request
  };
  virtual Committed CompleteAndClaim(const std::vector<AttemptResult>& results,
                                     const std::vector<ClaimRequest>& claims,
                                     const std::string& worker_id, const std::string& worker_name,
                                     double lease_s, int64_t only_run = 0,
                                     const std::vector<std::string>& projects = {}) = 0;
  virtual void InsertEvents(const std::vector<EventRow>& events) = 0;

  // --- notifications ------------------------------------------------------------------------
  // LISTEN where stages becoming ready (payload: the pool) and runs being cancelled are
  // announced.
  virtual void ListenForReadyStages() = 0;
  virtual bool IsListening() const = 0;
  // Waits up to `timeout_ms` for notifications; returns how many of each arrived.
  virtual Notifications AwaitNotifications(int timeout_ms) = 0;

  // --- the cache's single flight ------------------------------------------------------------
  // Become the builder of `key` (true) when nobody builds it, its builder's attempt is gone,
  // `retry_failed` and it failed before, or it is ready with `corrupt_digest` (found corrupt).
  // The entry is `project`'s ("" for an engine-produced compiled graph, shared by all).
  virtual bool AcquireArtifact(const std::string& key, int64_t stage_id, int attempt,
                               const std::string& manifest_json, bool retry_failed,
                               const std::string& corrupt_digest,
                               const std::string& project = "") = 0;
  virtual std::optional<ArtifactRow> GetArtifact(const std::string& key) = 0;
  // The builder's result: kReady (digest, bytes, path) or kFailed (failure). False when this
  // attempt was no longer the builder.
  virtual bool FinishArtifact(const std::string& key, int64_t stage_id, int attempt,
                              ArtifactState state, const std::string& digest, int64_t bytes,
                              const std::string& path, const std::string& failure) = 0;
  virtual void ReleaseArtifact(const std::string& key, int64_t stage_id, int attempt) = 0;
  virtual void RecordArtifactHit(const std::string& key) = 0;
  // Cache trust: the projects whose entries `project`'s cached stages may be served.
  virtual std::vector<std::string> TrustedProjects(const std::string& project) = 0;
  // The inputs of the key a running cached stage computed (for `cache why`).
  virtual void RecordStageCacheInputs(int64_t stage_id, int attempt, const std::string& inputs) = 0;
  // Every stage upstream of `stage_id`, by name, with the digest of what it produced (or
  // "attempt:<stage>/<n>" when that is unknown).
  virtual std::vector<std::pair<std::string, std::string>> StageInputDigests(int64_t stage_id) = 0;
};

// A new connection to the catalog at `url`, seen through the worker's door. Throws
// CatalogUnavailable with the URL (password hidden) and how to fix it.
std::unique_ptr<WorkerCatalog> OpenWorkerCatalog(const std::string& url);

}  // namespace trnflow::schema
