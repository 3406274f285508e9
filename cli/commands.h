#pragma once
// One function per subcommand; each returns the process exit code (docs/cli.md) and may
// throw UserError (exit 2), CatalogUnavailable (exit 3), PermissionDenied or Refused (exit 4),
// which main() reports. `format` is "table" or "json" (docs/cli.md: the JSON rules).
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cli/cli_util.h"
#include "pipelines/plan.h"

namespace trnflow::workers {
struct WorkerOptions;
}

namespace trnflow::cli {

int CmdValidate(const std::vector<std::string>& files, const std::string& format);
int CmdPlan(const RunArgs& args);
int CmdRun(const RunArgs& args);
int CmdSubmit(const RunArgs& args);
// execute: run the run's stages in this process too (as `run` does), not only follow it.
int CmdWatch(const std::string& run, bool execute, const SandboxArgs& sandbox,
             const std::string& format);
int CmdCancel(const std::string& run);
int CmdResume(const std::string& run);
int CmdRetry(const std::string& run, const std::string& stage);
int CmdRuns(const schema::RunsQuery& query, const std::string& format);
// collapse: each matrix fan-out as one line (one entry of --format json) with its counts.
int CmdShow(const std::string& run, const std::string& stage, const std::string& format,
            bool collapse = false);
// follow: keep printing what the run's attempts write until the run ends (`logs -f`).
int CmdLogs(const std::string& run, const std::string& stage, bool follow,
            const std::string& format);
int CmdInstances(const std::string& format, bool sources);
// The models a stage may name (sim/models.yaml) with their architecture figures.
int CmdModels(const std::string& format);
// `job_uid_range`: "START-END" to set this catalog's job uid range, "" to keep it.
int CmdDbMigrate(const std::string& job_uid_range);
int CmdDbDrop(const DeleteArgs& del);
// `trnflow db archive --month YYYY-MM`: pg_dump of the month's ledger partition to `file`
// (default trnflow-attempts-YYYY-MM.dump), checked with pg_restore --list, then the partition
// detached and dropped unless `keep`. Throws UserError (exit 2, nothing dropped) for a
// malformed, current, future or unpartitioned month, an open attempt of it, or a failed dump.
struct ArchiveArgs {
  std::string month;
  std::string file;
  bool keep = false;
  DeleteArgs del;
};
int CmdDbArchive(const ArchiveArgs& args);
int CmdWorker(const std::vector<std::string>& pools, double lease_s,
              const std::vector<std::string>& projects, const SandboxArgs& sandbox);
// Runs one simulated attempt described by DIR/context.json in this process, printing
// ::progress and ::checkpoint lines, and writes DIR/result.json: what a Slurm job runs for a
// simulated stage (docs/executors.md). Hidden from --help: the worker's tool, not a person's.
int CmdExecStage(const std::string& dir);
// The sandbox switches and limits from the flags and the environment, and the executor
// (--executor slurm, checked against the cluster); throws UserError on a malformed limit or
// a partition Slurm does not have.
void ApplySandboxArgs(const SandboxArgs& args, workers::WorkerOptions& options);
int CmdScheduler();

int CmdSpend(const SpendArgs& args);
int CmdEvents(const EventsArgs& args);
int CmdBudgetSet(const std::string& project, const std::string& usd, const std::string& period);
int CmdBudgetRemove(const std::string& project, const DeleteArgs& del);
int CmdBudgetList(const std::string& format);
// `--weight W` and `--max-running N|POOL=N|none` (repeatable) of `project add` and `update`.
struct ProjectShareArgs {
  std::optional<double> weight;
  std::vector<std::string> max_running;
};
int CmdProjectAdd(const std::string& name, const std::vector<std::string>& members,
                  std::optional<int> max_stages_per_run, std::optional<int> max_queued_stages,
                  std::optional<int64_t> job_uid, const ProjectShareArgs& share);
int CmdProjectUpdate(const std::string& name, std::optional<int> max_stages_per_run,
                     std::optional<int> max_queued_stages, std::optional<int64_t> job_uid,
                     const ProjectShareArgs& share);
int CmdProjectGrant(const std::string& project, const std::string& role, bool write);
int CmdProjectList(const std::string& format);

int CmdScheduleAdd(const ScheduleArgs& args);
int CmdScheduleList(const std::string& format);
int CmdScheduleShow(const std::string& name, const std::string& format);
// Re-reads and validates the file (errors: exit 2, nothing written), then replaces the
// snapshot, and params or cron when given.
int CmdScheduleUpdate(const ScheduleUpdateArgs& args);
int CmdScheduleRun(const std::string& name, const std::string& format);
int CmdSchedulePause(const std::string& name, bool paused);
int CmdScheduleRemove(const std::string& name, const DeleteArgs& del);
int CmdCacheList(const std::string& format);
int CmdCacheShow(const std::string& key, const std::string& format);
int CmdCacheRemove(const std::string& key, const DeleteArgs& del);
int CmdCacheVerify(const DeleteArgs& del, const std::string& format);
int CmdCacheGc(const std::string& max_bytes, const std::string& older_than, const DeleteArgs& del,
               const std::string& format);
int CmdCacheWhy(const std::string& run, const std::string& stage, const std::string& format);
// `cache trust PROJECT TRUSTED` / `cache untrust ...`; with `list`, the pairs instead.
int CmdCacheTrust(const std::string& project, const std::string& trusted, bool trust, bool list,
                  const std::string& format);

int CmdExplain(const std::string& run, const std::string& stage, const std::string& format);
// Ready stages of the run that no live worker can take, one sentence per pool and size.
// Set when the process holding a run (`trnflow run`, `watch --execute`) has stopped or gone
// silent past its lease: what happened and the command that continues the run.
std::optional<std::string> HolderGone(schema::Catalog& catalog, int64_t run_id);
std::vector<std::string> UnrunnableStages(schema::Catalog& catalog, int64_t run_id,
                                          const std::vector<schema::StageRow>& stages);
// What a stage of the run waits for, a sentence each (empty: no such stage).
std::vector<std::string> ExplainStageLines(schema::Catalog& catalog, int64_t run_id,
                                           const std::string& stage);

// The JSON the data commands print with --format json; the dashboard's /api serves the same
// (cli/cmd_serve.cpp hands these to serve/). Each throws what its command would (UserError for
// an unknown project, a bad flag).
nlohmann::json RunsJson(schema::Catalog& catalog, const schema::RunsQuery& query);  // runs
// show RUN [--collapse]: with `collapse`, matrix fan-outs as one entry each but those it names
// ("all": none collapsed).
std::optional<nlohmann::json> ShowJson(
    schema::Catalog& catalog, int64_t run_id,
    const std::optional<std::set<std::string>>& collapse = std::nullopt);
nlohmann::ordered_json SpendJson(schema::Catalog& catalog, const SpendArgs& args);    // spend
nlohmann::ordered_json SavingsJson(schema::Catalog& catalog, const SpendArgs& args);  // --savings
nlohmann::ordered_json BudgetsJson(schema::Catalog& catalog);                         // budget ls
nlohmann::ordered_json CacheListJson(schema::Catalog& catalog);                       // cache ls
nlohmann::ordered_json ScheduleListJson(schema::Catalog& catalog);                    // schedule ls
nlohmann::ordered_json WorkersJson(schema::Catalog& catalog);                         // workers
int CmdWorkers(const std::string& format);
int CmdWorkersForget(const std::string& which, const std::string& format);  // `workers forget`
int CmdServe(const ServeArgs& args);

void PrintRunSummary(schema::Catalog& catalog, int64_t run_id);
// The run as `trnflow show RUN --format json` prints it (`run` and `watch` with --format json
// print it when the run ends).
void PrintRunJson(schema::Catalog& catalog, int64_t run_id);
// The file of `run`, `submit` and `plan`, validated (diagnostics printed), with the
// environment's spot rate applied; nullopt when it has errors.
std::optional<pipelines::Pipeline> LoadForSubmit(const RunArgs& a);

}  // namespace trnflow::cli
