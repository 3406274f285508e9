#pragma once
// Catalog is the only gateway to PostgreSQL. One Catalog owns one connection and is NOT
// thread-safe: each thread that talks to the catalog opens its own. Every method runs in one
// transaction (or one statement) and is named after the SQL query it runs (schema/queries).
//
// Failure: the constructor and every method throw CatalogUnavailable when the server cannot
// be reached or the connection broke (the URL in the message has its password hidden); a
// caller that wants to carry on calls Reconnect() with backoff. Rows that are not there are
// values (std::nullopt, empty vectors, false), never exceptions.
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/money.h"
#include "common/stage_spec.h"
#include "schema/catalog_rows.h"
#include "schema/notifications.h"
#include "schema/scheduler_catalog.h"
#include "schema/serve_catalog.h"
#include "schema/worker_catalog.h"

namespace trnflow::pipelines {
struct Pipeline;
}
namespace trnflow::sim {
class Catalog;
}

namespace trnflow::schema {

struct RunView;  // schema/run_view.h

// The whole catalog: what the command line (cli/) and the dashboard's /api views use. Workers,
// the scheduler and serve/ each see only their door (worker_catalog.h, scheduler_catalog.h,
// serve_catalog.h), which Catalog implements; what only tests and benchmarks call is in
// schema/catalog_testing.h, a library no product binary links.
class Catalog final : public WorkerCatalog, public SchedulerCatalog, public ServeCatalog {
 public:
  // Connects; throws CatalogUnavailable with the URL (password hidden) and how to fix it.
  explicit Catalog(const std::string& url);
  ~Catalog();
  Catalog(const Catalog&) = delete;
  Catalog& operator=(const Catalog&) = delete;

  const std::string& url() const;
  // Drops the connection and opens a new one; throws CatalogUnavailable.
  void Reconnect();

  // --- schema -----------------------------------------------------------------------------
  // Applies pending migrations under an EXCLUSIVE lock on trnflow.migration_lock (safe to run
  // concurrently; schema owner only), then loads the hardware catalog's instance types and
  // prices (a changed price adds a row). Throws CatalogUnavailable if the catalog is newer than
  // this binary, PermissionDenied for a login that is not the owner. `up_to` > 0: stop after
  // that version (tests that migrate an older catalog forward).
  MigrateReport Migrate(const sim::Catalog& hardware, int up_to = 0);
  // Throws CatalogUnavailable saying what to run when the schema is not this binary's.
  void RequireCurrentSchema();

  // --- submission -------------------------------------------------------------------------
  // Pipeline (stored once per text), run, stages and dependencies in one transaction.
  int64_t SubmitRun(const pipelines::Pipeline& pipeline, const SubmitOptions& options);

  // --- workers ----------------------------------------------------------------------------
  // only_run: the worker runs that run's stages only (`trnflow run`); 0: any run.
  // Such a worker holds its run: daemon workers skip its stages. lease_s: how long it may go
  // without a heartbeat before it is dead.
  void RegisterWorker(const std::string& worker_id, const std::string& host, int pid,
                      const std::string& pools_json, int64_t only_run = 0,
                      const std::string& home = "", double lease_s = 15,
                      const std::vector<std::string>& projects = {});
  // Workers that heartbeated in the last `max_age_s` seconds and have not stopped.
  std::vector<LiveWorker> LiveWorkers(double max_age_s);
  // Removes workers that are not live (all; or those whose id or host is `which`); returns
  // them (id, host, pid).
  std::vector<LiveWorker> ForgetWorkers(const std::string& which);
  // Who holds a run (a foreground `trnflow run` or `watch --execute`); nullopt: nobody.
  std::optional<RunHolder> HolderOf(int64_t run_id);
  // What a stage waits for (`trnflow explain`); nullopt: the run has no such stage.
  std::optional<StageWait> ExplainStage(int64_t run_id, const std::string& stage);
  void StopWorker(const std::string& worker_id);
  // Claims ready stages of `pool` that fit in `free_instances`, shared between projects
  // (queries/stages.sql); `max_stages` > 0 takes at most that many.
  std::vector<ClaimedStage> ClaimReadyStages(const std::string& pool, int free_instances,
                                             const std::string& worker_id,
                                             const std::string& worker_name, double lease_s,
                                             int64_t only_run = 0, int max_stages = 0,
                                             const std::vector<std::string>& projects = {});
  // Reserves spend caps for claimed attempts of budgeted runs and projects (WorkerCatalog).
  std::vector<BudgetReservation> ReserveBudgets(const std::vector<ClaimedStage>& claims,
                                                const std::vector<std::optional<Money>>& want,
                                                const std::string& worker_id);
  // Raises a running attempt's reservation in a slice (WorkerCatalog).
  std::optional<Money> TopUpBudget(int64_t stage_id, int attempt, const std::string& worker_id,
                                   Money more);
  // Renews the leases of the stages this worker runs (one report each) and returns those it
  // still holds; an in-flight stage missing here was taken over. Records what each attempt
  // said of itself: a checkpoint moves its stage's resume point forward at once.
  // Stores the executor's id for a running attempt (a Slurm job id) if `worker_id` still holds
  // its lease; false otherwise.
  bool RecordExecutorJob(int64_t stage_id, int attempt, const std::string& worker_id,
                         const std::string& job);
  std::vector<EarlierAttemptRow> EarlierAttempts(int64_t stage_id, int attempt);
  std::vector<LeaseKey> HeartbeatLeases(const std::string& worker_id, double lease_s,
                                        const std::vector<LiveReport>& reports);
  // Closes attempts (fenced on their lease), releases dependents of stages that succeeded,
  // skips what is downstream of stages that failed, and finishes runs, then claims again for
  // each of `claims`, in one transaction (worker_catalog.h; ClaimRequest and Committed are
  // WorkerCatalog's).
  Committed CompleteAndClaim(const std::vector<AttemptResult>& results,
                             const std::vector<ClaimRequest>& claims, const std::string& worker_id,
                             const std::string& worker_name, double lease_s, int64_t only_run = 0,
                             const std::vector<std::string>& projects = {});

  // Releases runs whose holder (`trnflow run`, `watch --execute`) is gone: daemon workers may
  // take their stages. Returns how many.
  int ReleaseDeadHolds();

  // --- scheduler --------------------------------------------------------------------------
  // Takes or confirms leadership: an EXCLUSIVE lock on trnflow.leader_lock, held by an open
  // transaction on a connection of its own (daemons only: members cannot lock the table).
  bool TryAcquireLeadership();
  int PromoteRetries();
  // Ends expired leases: `decide` turns each into the result to record (outcome lost).
  int RescueExpiredLeases(const std::function<AttemptResult(const ExpiredLease&)>& decide);
  // Finishes runs none of whose stages can still change. Returns their ids.
  std::vector<int64_t> FinishRuns();
  // The ledger's partitions (migration 0031) of the current UTC month and the months_ahead
  // after it, those missing made (trnflow.attempts_partitions_ahead; daemons only). Returns
  // how many were made. A months_ahead outside 0-24 is refused by the catalog (CatalogError).
  int MakeAttemptsPartitionsAhead(int months_ahead);

  // --- reads ------------------------------------------------------------------------------
  std::optional<RunRow> GetRun(int64_t run_id);
  std::vector<RunRow> ListRuns(const RunsQuery& query);
  std::vector<StageRow> GetStages(int64_t run_id);
  std::vector<AttemptRow> GetAttempts(int64_t run_id);
  // Everything `show` and /api/runs/ID print of a run (run_view.h), in one read-only
  // transaction (one snapshot), each statement by index on the run: four whatever its size
  // and the catalog's history (three without the attempts, which `show`'s stage table does
  // not print). nullopt: no such run, or one this login may not see.
  std::optional<RunView> ReadRunView(int64_t run_id, bool with_attempts = true);
  // trnflow.event_log, the newest `limit` (oldest first): '' / 0 filters match anything; since
  // is a timestamp PostgreSQL reads ('-infinity' for all).
  std::vector<EventLogRow> EventLog(const std::string& project, int64_t run_id,
                                    const std::string& since, const std::string& kind, int limit);
  // Attempts still open (`project`, `pipeline`: '' = any) and what they have cost so far.
  std::pair<int64_t, Money> RunningSpend(const std::string& project, const std::string& pipeline);
  // project: for events about a project as a whole (run_id 0), so its members see them.
  void InsertEvent(int64_t run_id, int64_t stage_id, const std::string& kind,
                   const std::string& message, const std::string& data_json = "{}",
                   const std::string& project = "");
  void InsertEvents(const std::vector<EventRow>& events);

  // --- notifications ----------------------------------------------------------------------
  // LISTEN where stages becoming ready (payload: the pool) and runs being cancelled are
  // announced.
  void ListenForReadyStages();
  bool IsListening() const;
  // LISTEN where state changes are announced (trnflow.changes; the dashboard's event stream).
  void ListenForChanges();
  // Waits up to `timeout_ms` for notifications; returns how many of each arrived.
  Notifications AwaitNotifications(int timeout_ms);

  // --- operators --------------------------------------------------------------------------
  // reason: Outcome::kCancelled (an operator) or kBudgetExceeded (the budget guard).
  CancelReport CancelRun(int64_t run_id, Outcome reason = Outcome::kCancelled);
  // A failed or cancelled run continues: its failed, cancelled and skipped stages start over
  // with fresh budgets, from their last checkpoint; succeeded and cached stages stay.
  // Returns the stages reset; throws UserError when the run is running or succeeded.
  int ResumeRun(int64_t run_id);
  // One stage (every expansion of a matrix stage) and everything downstream start over from
  // scratch, whatever they ended as. Throws UserError for an unknown stage or one of them
  // still running.
  int RetryStage(int64_t run_id, const std::string& stage);
  int CountRunningStages(int64_t run_id);

  // --- spend, budgets, projects -------------------------------------------------------------
  // Throws UserError for a --by field it does not know.
  std::vector<SpendRow> Spend(const SpendQuery& query);
  bool ProjectExists(const std::string& project);
  // Removes the project's budget; false when it had none.
  bool RemoveBudget(const std::string& project);
  void SetBudget(const std::string& project, Money amount, const std::string& period);
  std::vector<BudgetRow> ProjectBudgets(const std::string& project = "");
  void RecordBudgetNotice(const std::string& project, int percent);
  // Why a retry_wait stage waits for its budget (`explain`); nullopt: it does not.
  std::optional<BudgetWaitRow> StageBudgetWait(int64_t run_id, int64_t stage_id);
  std::vector<RunBudgetRow> RunBudgets();
  void RecordRunBudgetNotice(int64_t run_id, int percent);
  std::vector<int64_t> RunningRunsOfProject(const std::string& project);
  // Creates the project (if new), its group role trnflow_project_NAME with read access, and
  // grants it to each member login role. Returns the group role. UserError for a bad name or
  // a member role that does not exist.
  std::string AddProject(const std::string& name, const std::vector<std::string>& members);
  // Throws PermissionDenied unless this login may claim and run stages (the daemons' role or
  // the schema owner); `what` names the command that needs it.
  void RequireStageRunner(const std::string& what);
  // Gives `role` read (or read and write) access to `project`; returns the group role granted.
  // Schema owner only. Throws UserError for an unknown or privileged role.
  std::string GrantProject(const std::string& project, const std::string& role, bool write);
  // Sets this catalog's job uid range [lo, hi] (schema owner only): refused (UserError) when it
  // overlaps another catalog's on the server or leaves out a project's uid. JobUidRange():
  // "LO-HI", "" before migration 0023.
  std::string SetJobUidRange(int64_t lo, int64_t hi);
  std::string JobUidRange();
  // Sets the project's quotas and the uid its jobs run as; unset ones keep their value. Throws
  // UserError when the uid is another project's or outside the catalog's job uid range.
  void SetProjectQuotas(const std::string& project, std::optional<int> max_stages_per_run,
                        std::optional<int> max_queued_stages, std::optional<int64_t> job_uid);
  // Sets the project's weight and caps on running stages (ProjectShare). Owner only. UserError
  // for a project that does not exist.
  void SetProjectShare(const std::string& project, const ProjectShare& share);
  // `with_share`: also each project's weight and caps (the owner's and the daemons' to read).
  std::vector<ProjectRow> ListProjects(bool with_share = false);
  // The room `project` has for one more run (migration 0024's stage_room): what the parser
  // bounds a file's stage count by before it expands a matrix.
  StageRoom GetStageRoom(const std::string& project);

  // --- compiled-artifact cache ---------------------------------------------------------------
  // Become the builder of `key` (true) when nobody builds it, its builder's attempt is gone,
  // `retry_failed` and it failed before, or it is ready with `corrupt_digest` (found corrupt).
  // The entry is `project`'s ("" for an engine-produced compiled graph, shared by all).
  bool AcquireArtifact(const std::string& key, int64_t stage_id, int attempt,
                       const std::string& manifest_json, bool retry_failed,
                       const std::string& corrupt_digest, const std::string& project = "");
  std::optional<ArtifactRow> GetArtifact(const std::string& key);
  // The builder's result: kReady (digest, bytes, path) or kFailed (failure). False when this
  // attempt was no longer the builder.
  bool FinishArtifact(const std::string& key, int64_t stage_id, int attempt, ArtifactState state,
                      const std::string& digest, int64_t bytes, const std::string& path,
                      const std::string& failure);
  void ReleaseArtifact(const std::string& key, int64_t stage_id, int attempt);
  void RecordArtifactHit(const std::string& key);
  std::vector<ArtifactRow> ListArtifacts();
  // Deletes an entry that is not being built; returns its directory, or nullopt.
  std::optional<std::string> DeleteArtifact(const std::string& key);
  // Cache trust: the projects whose entries `project`'s cached stages may be served.
  std::vector<std::string> TrustedProjects(const std::string& project);
  // Lets `project` be served entries `trusts` built; false when it already was. Throws
  // UserError when either project does not exist or they are the same.
  bool AddCacheTrust(const std::string& project, const std::string& trusts);
  bool RemoveCacheTrust(const std::string& project, const std::string& trusts);  // false: none
  std::vector<std::pair<std::string, std::string>> ListCacheTrust();  // (project, trusts)
  // --- planning ------------------------------------------------------------------------------
  // The past of run: stages named `stages` in `project`'s runs of `pipeline` (latest 20 runs
  // each); a stage that never succeeded there is absent.
  std::map<std::string, StageHistoryRow> StageHistory(const std::string& project,
                                                      const std::string& pipeline,
                                                      const std::vector<std::string>& stages);
  // --- schedules -----------------------------------------------------------------------------
  // False when a schedule of that name exists.
  bool AddSchedule(const ScheduleRow& s);
  std::vector<ScheduleRow> ListSchedules();
  std::optional<ScheduleRow> GetSchedule(const std::string& name);  // nullopt: no such schedule
  // Replaces the snapshot, params, project, cron, tz and workdir of `s.name` (a new cron or tz
  // counts from now). False: no such schedule.
  bool UpdateSchedule(const ScheduleRow& s);
  bool SetSchedulePaused(const std::string& name, bool paused);  // false: no such schedule
  bool RemoveSchedule(const std::string& name);
  // Fires one slot: records it and submits the run in one transaction. Returns the run id, or
  // 0 when the slot had already fired (another scheduler, a restart). Moves last_slot on.
  int64_t FireSchedule(const std::string& name, double slot_epoch,
                       const pipelines::Pipeline& pipeline, const SubmitOptions& options);
  // Fires it now, outside its cron (`schedule run`): records a manual fire at this moment and
  // submits the run in one transaction, as FireSchedule does, and leaves last_slot alone.
  int64_t FireScheduleNow(const std::string& name, const pipelines::Pipeline& pipeline,
                          const SubmitOptions& options);
  // Marks slots up to `slot_epoch` as past without firing them (catch-up none/latest).
  void AdvanceSchedule(const std::string& name, double slot_epoch);

  // A stage's cache key inputs: nullopt when the run has no such stage, "" when not cached.
  std::optional<std::string> StageCacheInputs(int64_t run_id, const std::string& stage);
  // The inputs of the key a running cached stage computed (for `cache why`).
  void RecordStageCacheInputs(int64_t stage_id, int attempt, const std::string& inputs);
  // Every stage upstream of `stage_id`, by name, with the digest of what it produced (or
  // "attempt:<stage>/<n>" when that is unknown).
  std::vector<std::pair<std::string, std::string>> StageInputDigests(int64_t stage_id);

  // --- the dashboard (serve/) ---------------------------------------------------------------
  // A one-use ticket (valid for a minute) for this login to read the log of `attempt` (0: the
  // latest) of stage `stage` of run `run` through `trnflow serve` (migration 0028). Throws
  // PermissionDenied when the login is not a member of the run's project, UserError for a
  // stage that writes no log or an attempt it does not have.
  LogTicket IssueLogTicket(int64_t run, const std::string& stage, int attempt);
  // What ticket `ticket` was issued for, once; nullopt for one unknown, spent or expired. The
  // daemons' login only.
  std::optional<SpentLogTicket> SpendLogTicket(const std::string& ticket);
  // From now on this connection acts as `role` (SET ROLE, for the session), so row-level
  // security shows what that role may see; "" goes back to the login's own role. Throws
  // PermissionDenied when the login may not act as it.
  void ActAs(const std::string& role);
  // The projects login role `role` is a member of, when the dashboard may act as it (not
  // privileged, not the daemons' or the reader's); empty otherwise.
  std::vector<std::string> MemberProjects(const std::string& role);
  // Whether login role `role` may write (submit, cancel, retry, resume) in `project`.
  bool MayWrite(const std::string& role, const std::string& project);
  // State changes after `after_id`, oldest first, at most `limit`.
  std::vector<ChangeRow> ChangesSince(int64_t after_id, int limit);
  int64_t LatestChangeId();
  // Deletes changes older than `max_age_s`; returns how many.
  int64_t PruneChanges(double max_age_s);
  // Every /metrics sample, from the ledger and the live tables (schema/queries/serve.sql).
  std::vector<MetricRow> Metrics();

  // Ends the sessions of members holding a lock one of the daemons' sessions has waited on for
  // longer than `after_s` (the lock guard every daemon runs, schema/member_lock_guard.h; migration
  // 0023). Returns one line per session ended: "pid=N member=ROLE waited=S".
  std::vector<std::string> EndMemberBlockers(double after_s);

  // --- the dashboard, continued (schema/queries/serve.sql) ----------------------------------
  // Each budget with its spend, the open attempts' part of it and a month-end forecast band.
  std::vector<BudgetForecastRow> BudgetForecasts();
  // Savings by project (spot, cache, GPU baseline) over SpendQuery's project, pipeline and days.
  std::vector<SavingsRow> Savings(const SpendQuery& q);
  // The oldest transaction id still running (pg_current_snapshot()'s xmin): every older one has
  // ended.
  int64_t OldestRunningTransaction();
  // A transaction id newer than every one given out so far: this call's own (it takes one).
  // Not the snapshot's xmax, which is one past the newest *ended* transaction: transactions
  // still running may hold ids above it.
  int64_t NewTransactionId();

 private:
  friend class CatalogTestAccess;  // schema/catalog_testing.cpp
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Creates database `name` on the server of `admin_url` (dropping it first if it exists),
// copied from `template_name` and in `tablespace` when given; returns a URL for it. Dropping
// likewise. For tests and `trnflow db` tooling.
struct NewDatabase {
  std::string template_name;
  std::string tablespace;
};
std::string CreateDatabase(const std::string& admin_url, const std::string& name,
                           const NewDatabase& how = {});
void DropDatabase(const std::string& admin_url, const std::string& name);
// Lets the catalog's daemon role (made by `db migrate`) log in with a new random password and
// returns its URL (the owner's URL with the daemon's user and password). Schema owner only.
std::string EnableDaemonLogin(const std::string& owner_url);
// Drops the roles `db migrate` and `project` made for the catalog in database `name` (found by
// their comments); call after dropping the database.
void DropCatalogRoles(const std::string& admin_url, const std::string& name);
// Which catalog a libpq URL or connection string names, for comparing two of them: "host:port/
// database", with the local socket and localhost alike as "local" and libpq's defaults filled
// in (port 5432, the database named after the user). "" when it does not parse.
std::string CatalogAddress(const std::string& url);
// `trnflow db drop`: the catalog the schema owner's URL names — its database, its catalog id,
// and the roles `db migrate` and `project` made for it (found by their comments, which name
// this catalog's id: never another catalog's, whatever the names). Throws UserError when the
// database holds no trnflow catalog.
struct CatalogDropPlan {
  std::string database;
  std::string catalog_id;
  std::vector<std::string> roles;
  int64_t runs = 0;
  int64_t other_sessions = 0;  // connections to the database besides this one
};
CatalogDropPlan PlanCatalogDrop(const std::string& owner_url);
// Drops the plan's database (ending its sessions where this login may) and then its roles.
// Returns the roles it could not drop (still granted in another database), named for a person.
std::vector<std::string> DropCatalog(const std::string& owner_url, const CatalogDropPlan& plan);
// `trnflow db archive --month YYYY-MM`: one UTC month of the ledger, the partition
// trnflow.attempts_YYYY_MM (migration 0031), as the schema owner. PlanArchive throws UserError
// (nothing changed) for a malformed month, the current month or a later one, a month without
// a partition, and a month with an open attempt (a running stage whose attempt started then:
// its close writes into that partition).
struct ArchivePlan {
  std::string database;
  std::string month;      // YYYY-MM
  std::string partition;  // attempts_YYYY_MM, in schema trnflow
  std::string from, to;   // the month's bounds, UTC timestamps PostgreSQL reads
  int64_t attempts = 0;   // rows in the partition
  int64_t open_attempts = 0;
};
ArchivePlan PlanArchive(const std::string& owner_url, const std::string& month);
// Detaches and drops the plan's partition, after checking again with the ledger locked
// (ACCESS EXCLUSIVE, waiting at most 5 s: closes queue behind it) that no attempt of the month
// is open and that it still holds plan.attempts rows; throws UserError otherwise (nothing
// dropped).
void DropArchivedPartition(const std::string& owner_url, const ArchivePlan& plan);
// A URL with its user and password replaced.
std::string WithLogin(const std::string& url, const std::string& user, const std::string& password);
// 32 random hex digits from the kernel, for generated passwords.
std::string RandomSecret();

}  // namespace trnflow::schema
