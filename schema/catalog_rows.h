#pragma once
// The catalog's rows and requests: plain structs that Catalog's methods (catalog.h) take and
// return, apart from the methods so that code which only reads rows (renderers, tests, the
// dashboard's views) needs neither the Catalog class nor libpqxx. States, outcomes, kinds and
// markets are enums (schema/sql_enums.h), never the catalog's text. Plain data: any thread.
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/money.h"
#include "common/stage_spec.h"
#include "schema/sql_enums.h"

namespace trnflow::schema {

struct SubmitOptions {
  std::string project;  // overrides the pipeline's project when set
  double speed = 3600;  // simulated seconds per wall second
  int64_t seed = 1;
  std::string workdir;                    // where run: commands start
  bool retry_failed_compilation = false;  // compile keys that failed before are tried again
  // Budget admission (in SQL, trnflow.admit_run): the plan's cost (unset: SQL's own floor, a
  // billing minute per stage), how many stages it counted at the billing minimum, and whether
  // to skip admission (`--force`).
  std::optional<Money> planned_cost;
  int unknown_stages = 0;
  bool force = false;
  bool hold = false;  // a foreground `trnflow run` executes it: daemon workers skip its stages
};

// A stage this worker now holds a lease on, with everything needed to run it.
struct ClaimedStage {
  int64_t stage_id = 0;
  int64_t run_id = 0;
  int attempt = 0;
  int instance_count = 1;
  Market market = Market::kOnDemand;
  double progress = 0;  // resume point from the last checkpoint, 0..1
  int errors = 0;
  int preemptions = 0;
  StageSpec spec;
  // Not empty: the stored spec could not be read (why); `spec` is a default one named after
  // the stage's id, and the worker fails the attempt as a user error without running it.
  std::string spec_error;
  Money price_per_hour;  // price snapshot of this attempt
  double speed = 1;
  int64_t seed = 0;
  double spot_rate_multiplier = 1;
  std::string workdir;
  bool retry_failed_compilation = false;
  std::string project;
  bool budgeted = false;  // its run or project has a budget: reserve a cap before running
  // Set by the worker from its reservation: the cap in simulated seconds, and whether it waits
  // for its budget (the reservation un-claimed it: the worker lets it go, nothing to write).
  double spend_cap_s = std::numeric_limits<double>::infinity();
  bool budget_wait = false;
  // The uid (and gid) the project's jobs run as; 0: not set, the worker's job_uid_base.
  int64_t job_uid = 0;
};

// A freshly claimed attempt's reservation (trnflow.reserve_budgets, migration 0033): granted,
// it may spend at most `cap` (topped up in slices while it runs); else it waits for `waits` to
// be free, un-claimed by the reservation itself (no ledger row).
struct BudgetReservation {
  int64_t stage_id = 0;
  std::optional<Money> cap;
  std::optional<Money> waits;
};

// An earlier attempt of a stage as the ledger has it: what an executor that hands attempts to
// another system needs to find a job no attempt has taken the result of yet (a Slurm job that
// finished while no worker watched it).
struct EarlierAttemptRow {
  int attempt = 0;
  Outcome outcome = Outcome::kLost;
  std::string executor_job;  // "": none recorded
  double sim_seconds = 0;    // what it was billed for, simulated seconds
};

// The end of one attempt, as its worker (or the rescuer) saw it.
struct AttemptResult {
  int64_t stage_id = 0;
  int attempt = 0;
  std::string lease_owner;  // the incarnation that held the lease
  Outcome outcome = Outcome::kSucceeded;
  StageState next_state = StageState::kSucceeded;
  Market next_market = Market::kOnDemand;
  double retry_in_s = 0;
  double sim_seconds = 0;
  int64_t billed_seconds = 0;
  Money cost;
  Money wasted;
  Money saved;
  double progress_to = 0;
  std::string message;
  std::string metrics_json;   // latest neuron-monitor-like metrics, recorded as an event
  Money baseline;             // the same useful work on the GPU baseline, plus the waste
  std::string output_digest;  // succeeded/cached: the digest of what it produced, if known
};

struct EventRow {
  int64_t run_id = 0;
  int64_t stage_id = 0;  // 0: the run as a whole
  std::string kind;
  std::string message;
  std::string data_json = "{}";
};

struct LeaseKey {
  int64_t stage_id = 0;
  int attempt = 0;
  bool run_cancelled = false;  // HeartbeatLeases: the run was cancelled; stop the stage
  // Why: Outcome::kCancelled (an operator) or kBudgetExceeded; nullopt: not said (cancelled).
  std::optional<Outcome> cancel_reason;
};

// What a running attempt last said about itself, sent with its lease's heartbeat.
struct LiveReport {
  int64_t stage_id = 0;
  bool known = false;       // false: nothing reported yet; only the lease is renewed
  double progress = 0;      // how far it is, 0..1
  double checkpointed = 0;  // how far its last checkpoint got, 0..1 (the next attempt's start)
  double sim_seconds = 0;   // simulated seconds it has run
  double eta_s = -1;        // simulated seconds it expects still to run; < 0: unknown
};

struct LiveWorker {
  std::string id;
  std::string host;
  int pid = 0;
  std::map<std::string, int> pools;   // pool -> capacity in instances
  std::map<std::string, int> in_use;  // pool -> instances its running stages hold
  int64_t only_run = 0;               // runs this run's stages only; 0: any run
  double heartbeat_age_s = 0;
  double lease_s = 15;                // silent for longer than this: dead
  std::vector<std::string> projects;  // reserved for these projects (--project); empty: all
};

// The process holding a run (`trnflow run`, `watch --execute`), as its heartbeats tell.
struct RunHolder {
  bool registered = false;  // false: the run was submitted held, its worker never registered
  std::string host;
  int pid = 0;
  double heartbeat_age_s = -1;
  bool stopped = false;
  double lease_s = 15;
  bool gone() const { return !registered || stopped || heartbeat_age_s > lease_s; }
};

struct StageWait {
  int64_t stage_id = 0;
  StageState state = StageState::kBlocked;
  std::string pool;
  int instance_count = 1;
  int attempts = 0;
  int priority = 0;
  RunState run_state = RunState::kRunning;
  std::string project;
  double ready_in_s = 0;  // retry_wait: wall seconds until its backoff ends
  std::vector<std::pair<std::string, StageState>> waiting_for;  // needs not done: name, state
  int64_t queued_ahead = 0;  // ready: ready stages of its pool that are claimed before it
  std::optional<Outcome> last_outcome;  // nullopt: no attempt has ended
  std::string last_message;
  std::string running_on;  // running: the host of the worker that holds its lease
  // Ready: where it stands in its pool's fair share (migration 0032's queue_position).
  struct Share {
    double weight = 1;
    int running_in_pool = 0;  // slots its project's stages hold in the pool now
    int running = 0;          // its project's stages running, all pools
    int running_stages_in_pool = 0;
    int pool_running = 0;  // slots every project's stages hold in the pool
    std::optional<int> max_running, pool_max_running;  // the project's caps
    int ahead_in_project = 0;  // its project's ready stages claimed before it
    int ahead_elsewhere = 0;   // about how many of other projects' go first
    int projects_waiting = 0;  // other projects with ready stages in the pool
  };
  std::optional<Share> share;
};

// A stage waiting for its budget (migration 0033), as the `budget` event its wait began with
// says: what it reserves, and what the budget that binds it (scope: "run" or "project") had
// left beside what `holders` running attempts held.
struct BudgetWaitRow {
  std::string since;  // ISO 8601 UTC
  Money needs, left, held;
  int holders = 0;
  std::string scope;
};

struct EventLogRow {
  std::string at;    // ISO 8601 UTC
  std::string kind;  // budget, interruption, capacity, lost, ...
  std::string project;
  int64_t run_id = 0;  // 0: about the project as a whole
  std::string stage;
  int attempt = 0;
  std::string message;
  std::string data_json;
};

struct CancelReport {
  bool cancelled = false;  // false: the run had already ended
  int stages_cancelled = 0;
  int stages_running = 0;  // still running; their workers stop them
};

struct RunRow {
  int64_t id = 0;
  std::string project;
  std::string pipeline;
  RunState state = RunState::kRunning;
  double speed = 0;
  int64_t seed = 0;
  std::string workdir;
  std::string created_at;   // ISO 8601 UTC
  std::string finished_at;  // "" while running
  Money cost;
  std::optional<Money> budget;
  double wall_seconds = 0;
  // nullopt unless cancelled: Outcome::kCancelled (an operator) or kBudgetExceeded.
  std::optional<Outcome> cancel_reason;
  Money wasted;  // closed attempts' work lost to interruptions and failures
};

// `trnflow runs` and the dashboard's /api/runs: every filter optional ("" = any).
struct RunsQuery {
  std::string project, pipeline, state;
  std::string since;  // created at or after this time (a timestamp PostgreSQL reads)
  int limit = 50;
};

// A ticket for one attempt's log (Catalog::IssueLogTicket), and what one was issued for.
struct LogTicket {
  std::string ticket;
  int attempt = 0;
};
struct SpentLogTicket {
  std::string member;
  int64_t run_id = 0;
  std::string stage;
  int attempt = 0;
};

// One change of a run's (stage "") or a stage's state, from trnflow.changes: the dashboard's
// event stream. `id` is the sequence a client resumes from.
struct ChangeRow {
  int64_t id = 0;
  std::string at;  // ISO 8601 UTC, milliseconds
  std::string project;
  int64_t run_id = 0;
  std::string stage;                         // "" for the run itself
  std::variant<RunState, StageState> state;  // RunState when `stage` is ""
};

// One sample of /metrics: the metric's name, its labels (a JSON object of strings), its value.
struct MetricRow {
  std::string name;
  std::string labels_json;
  double value = 0;
};

struct StageRow {
  int64_t id = 0;
  std::string name;
  StageKind kind = StageKind::kRun;
  StageState state = StageState::kBlocked;
  std::string instance_type;
  int instance_count = 1;
  Market market = Market::kOnDemand;
  int attempts = 0;
  double progress = 0;
  Money cost;                   // closed attempts
  int64_t billed_seconds = 0;   // closed attempts
  double running_cost_usd = 0;  // the attempt in progress, for the simulated time it has run
  // The attempt in progress, as its last heartbeat reported it; < 0: not reported.
  double live_progress = -1;
  double live_sim_seconds = -1;
  double live_eta_s = -1;
  double heartbeat_age_s = -1;  // wall seconds since that heartbeat
  // The last attempt that ended: its outcome (nullopt if none) and why.
  std::optional<Outcome> last_outcome;
  std::string last_message;
  std::vector<std::string> needs;
};

struct AttemptRow {
  int64_t stage_id = 0;
  int attempt = 0;
  std::optional<Outcome> outcome;  // nullopt while running
  std::string worker;
  std::string instance_type;
  int instance_count = 1;
  Market market = Market::kOnDemand;
  Money price_per_hour;
  std::string started_at;
  std::string finished_at;
  double sim_seconds = 0;
  int64_t billed_seconds = 0;
  Money cost;
  Money wasted;
  Money saved;
  double progress_from = 0;
  double progress_to = 0;
  std::string message;
  std::string worker_home;  // the TRNFLOW_HOME of the worker that ran it ("" if unknown)
  std::string queued_at;    // when it became ready to run (UTC, ms; "" unknown): its queue wait
};

struct ExpiredLease {
  int64_t stage_id = 0;
  int64_t run_id = 0;
  int attempt = 0;
  std::string lease_owner;
  int errors = 0;
  int preemptions = 0;
  StageSpec spec;
  std::string spec_error;  // as ClaimedStage's
  Market market = Market::kOnDemand;
  double progress = 0;        // the stage's resume point: the attempt's last checkpoint
  double progress_from = 0;   // where the attempt started
  double live_progress = -1;  // how far its last heartbeat said it was; < 0: never said
  int instance_count = 1;
  Money price_per_hour;
  double sim_seconds = 0;      // billable: to its last heartbeat (trnflow.billable_sim_seconds)
  double speed = 1;            // the run's simulated seconds per wall second
  bool run_cancelled = false;  // its run was cancelled (or stopped over budget)
};

struct BudgetRow {
  std::string project;
  Money amount;
  std::string period;        // month | total
  int notified_percent = 0;  // highest threshold announced in this period (0, 50, 80, 100)
  Money spent;               // this period, running attempts included
};

struct RunBudgetRow {
  int64_t run_id = 0;
  std::string project;
  Money budget;
  int notified_percent = 0;
  Money spent;
};

// `trnflow spend`: totals grouped by any of project, pipeline, run, stage, kind, instance,
// market, day, month; filters are optional ("" = all; dates YYYY-MM-DD, until inclusive).
struct SpendQuery {
  std::string project, pipeline, since, until;
  std::vector<std::string> by;
};

// Whether SPEND's dates cover whole UTC months ("" open-ended; since the 1st of a month, until
// the last day of one): such reports read the monthly rollups (migration 0030).
bool WholeMonths(const std::string& since, const std::string& until);

struct BudgetForecastRow {
  std::string project;
  std::string period;  // month | total
  Money amount;
  Money spent;      // this period, open attempts included (as BudgetRow::spent)
  Money committed;  // the open attempts' part of `spent`
  Money forecast, forecast_low, forecast_high;  // at the period's end (docs/serve.md)
};

struct SavingsRow {
  std::string project;
  Money spot_cost, spot_on_demand, spot_saved;  // spot attempts, and on-demand for the same time
  int64_t cache_hits = 0;
  Money cache_saved;
  Money cost, gpu_baseline, gpu_saved;  // all attempts, and the same work on p4d.24xlarge
};

struct SpendRow {
  std::vector<std::string> keys;  // in the order of SpendQuery::by
  int64_t attempts = 0;
  double billed_hours = 0;
  Money cost, wasted, saved;
};

struct ProjectRow {
  std::string name;
  std::string role;
  std::vector<std::string> members;  // the people: writers, then those who only read
  std::vector<std::string> readers;  // the members who may only read
  int64_t runs = 0;
  double weight = 1;                            // its share of each pool, against others'
  std::optional<int> max_running;               // stages running at once, all pools
  std::map<std::string, int> pool_max_running;  // the same, per pool
};

// What `project add/update --weight/--max-running` change (migration 0032); unset fields keep
// their value, and a cap of -1 removes it.
struct ProjectShare {
  std::optional<double> weight;
  std::optional<int> max_running;
  std::map<std::string, int> pool_max_running;
};

// A project's quotas and its unfinished stages (ready, running, waiting on needs or a retry),
// as submit_run counts them. A project not made yet has the defaults and no stages.
struct StageRoom {
  int64_t max_stages_per_run = 250000;
  int64_t max_queued_stages = 1000000;
  int64_t unfinished = 0;
};

struct ArtifactRow {
  std::string key;
  ArtifactState state = ArtifactState::kBuilding;
  std::string digest;
  int64_t bytes = 0;
  std::string path;
  std::string failure;  // failed: the compiler's message
  int64_t hits = 0;
  std::string manifest_json;  // the key's inputs
  std::string last_used_at;
  std::string created_at;
  int64_t builder_stage = 0;
  Money producer_cost;  // what the attempt that built it cost (GetArtifact only; 0 in a listing)
  std::string project;  // whose entry it is; "" for a compiled graph (every project's)
};

struct ScheduleRow {
  std::string name, file, source, params_json, project, cron, tz, catchup;
  double speed = 0;
  std::string workdir;
  bool paused = false;
  double last_slot_epoch = 0;  // slots after this are due (seconds since 1970, UTC)
  int64_t last_run = 0;        // run of the latest fired slot, 0 if none
  int64_t fires = 0;
  // GetSchedule only (UTC, ISO 8601; "" when none):
  std::string created_at, updated_at;          // added; its snapshot taken
  std::string last_slot_fired, last_fired_at;  // the latest fire
  std::optional<RunState> last_run_state;      // its run's state; nullopt: none
};

// A run: stage's past, for planning: the median simulated seconds of its succeeded attempts
// and over how many runs.
struct StageHistoryRow {
  double median_seconds = 0;
  int runs = 0;
  double median_wall_seconds = 0;  // simulated seconds / the run's speed
};

struct MigrateReport {
  int from_version = 0;
  int to_version = 0;
  std::vector<std::string> applied;
};

}  // namespace trnflow::schema
