// trnflow: the command line. Parses arguments and hands each subcommand to its function;
// maps errors to the exit codes of docs/cli.md (one table), and suggests the closest command or
// option after a typo.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "cli/commands.h"
#include "common/error.h"
#include "common/log.h"
#include "pipelines/diagnostics.h"
#include "sim/baseline.h"

using namespace trnflow;
using namespace trnflow::cli;

namespace {

// A number that is finite and within [lo, hi] (CLI::Range lets NaN through: it compares false).
CLI::Validator FiniteRange(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        char* end = nullptr;
        double v = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || !std::isfinite(v) || v < lo || v > hi)
          return "must be a finite number from " + Number(lo) + " to " + Number(hi) + ", not '" +
                 text + "'";
        return "";
      },
      "NUMBER in [" + Number(lo) + ", " + Number(hi) + "]");
}

// --format: how data is printed (docs/cli.md). Every command that prints data takes it.
CLI::Option* AddFormat(CLI::App* cmd, std::string& format) {
  return cmd->add_option("--format", format, "table (default) or json")
      ->check(CLI::IsMember({"table", "json"}));
}

// --dry-run and --yes: every command that deletes takes both (docs/cli.md).
void AddDeleteOptions(CLI::App* cmd, DeleteArgs& a) {
  cmd->add_flag("--dry-run", a.dry_run, "say what would be removed; remove nothing");
  cmd->add_flag("-y,--yes", a.yes, "do not ask for confirmation on a terminal");
}

// After a parse error: the word that is not a command of the command before it, or the
// option that command does not have, with the closest name ("did you mean `runs`?").
std::optional<std::string> Suggestion(CLI::App& app, int argc, char** argv) {
  CLI::App* cur = &app;
  std::string path = "trnflow";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") break;
    if (a.size() > 1 && a[0] == '-') {
      std::string name = a.substr(0, a.find('='));
      if (name == "-h" || name == "--help") return std::nullopt;
      const CLI::Option* opt = nullptr;
      for (CLI::App* app_or_parent = cur; app_or_parent && !opt;
           app_or_parent = app_or_parent->get_parent())
        opt = app_or_parent->get_option_no_throw(name);
      if (opt) {
        if (opt->get_type_size() > 0 && a.find('=') == std::string::npos) ++i;  // its value
        continue;
      }
      if (a.rfind("--", 0) != 0) continue;
      std::vector<std::string> names;
      for (const CLI::Option* o : cur->get_options())
        for (const auto& l : o->get_lnames()) names.push_back("--" + l);
      std::string close = pipelines::ClosestMatch(name, names);
      return "`" + path + "` has no option " + name +
             (close.empty() ? "" : "; did you mean `" + close + "`?") + " (`" + path +
             " --help` lists them)";
    }
    auto subs = cur->get_subcommands([](CLI::App*) { return true; });
    if (subs.empty()) continue;  // a positional argument of `cur`
    CLI::App* next = nullptr;
    std::vector<std::string> names;
    for (CLI::App* sub : subs) {
      names.push_back(sub->get_name());
      if (sub->get_name() == a) next = sub;
    }
    if (!next) {
      std::string close = pipelines::ClosestMatch(a, names);
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      return "unknown command '" + (path == "trnflow" ? a : path.substr(8) + " " + a) + "'" +
             (close.empty()
                  ? "; the commands: " + list
                  : "; did you mean `" +
                        (path == "trnflow" ? close : path.substr(8) + " " + close) + "`?") +
             " (`" + path + " --help` lists them)";
    }
    cur = next;
    path += " " + a;
  }
  return std::nullopt;
}

void AddSandboxOptions(CLI::App* cmd, SandboxArgs& a) {
  cmd->add_flag("--no-sandbox", a.no_sandbox,
                "run jobs as this process, unconfined (or TRNFLOW_SANDBOX=off); trusted jobs only");
  cmd->add_option("--job-limits", a.job_limits,
                  "per-job limits, e.g. as=16G,nproc=1024,fsize=64G,nofile=4096,output=64M,mem=16G,"
                  "tasks=4096 "
                  "(or TRNFLOW_JOB_LIMITS)");
  cmd->add_flag("--allow-network", a.allow_network,
                "let stages that say `network: host` share this host's network (jobs have "
                "loopback only otherwise)");
  ExecutorArgs& e = a.executor;
  cmd->add_option("--executor", e.executor,
                  "where stages run: local (this host, default) or slurm (one batch job per "
                  "attempt; SLURM_CONF as usual)")
      ->check(CLI::IsMember({"local", "slurm"}));
  cmd->add_option("--partition", e.partition,
                  "slurm: the partition jobs go to (default: the cluster's default)");
  cmd->add_option("--account", e.account,
                  "slurm: the account jobs charge when --slurm-config maps none for their "
                  "project");
  cmd->add_option("--shared-dir", e.shared_dir,
                  "slurm: a directory every node sees, for the attempts' wrappers "
                  "(default: $TRNFLOW_HOME/slurm)");
  cmd->add_flag("--spot-partition", e.spot_partition,
                "slurm: the partition is spot capacity (a node failure is an interruption)");
  cmd->add_option("--slurm-config", e.slurm_config,
                  "slurm: a YAML file mapping partitions to instance types and devices "
                  "(stages go to their instance's partition, with --gres) and projects to "
                  "Slurm accounts and QOS");
}

void AddRunOptions(CLI::App* cmd, RunArgs& a, bool execution) {
  cmd->add_option("FILE", a.file, "pipeline YAML file")->required();
  cmd->add_option("--project", a.project, "project to charge (overrides the file's project:)");
  cmd->add_option("--param", a.params, "override a parameter: --param key=value (repeatable)");
  if (execution) {
    cmd->add_option("--speed", a.speed,
                    "simulated seconds per wall second (default 7200: two hours a second)")
        ->check(FiniteRange(1e-3, 1e9));
    cmd->add_option("--seed", a.seed, "seed of the simulated spot market (default 7)");
    cmd->add_flag("--retry-failed-compilation", a.retry_failed_compilation,
                  "compile again graphs whose compilation failed before (instead of failing fast)");
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"trnflow: batch ML pipelines on (simulated) AWS Trainium and Inferentia"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "trnflow 0.1.0");
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error (or TRNFLOW_LOG)");

  RunArgs run_args, submit_args, plan_args;
  auto* run = app.add_subcommand("run", "submit a pipeline, execute it in this process, wait");
  AddRunOptions(run, run_args, true);
  run->add_option("--pool", run_args.pools, "pool capacity in instances: NAME=N (repeatable)");
  run->add_flag("--force", run_args.force, "override budget admission");
  run->add_flag("--share", run_args.share,
                "let daemon workers take stages of this run too (by default this process runs "
                "all of them)");
  AddSandboxOptions(run, run_args.sandbox);
  AddFormat(run, run_args.format)
      ->description(
          "table (default) or json: the finished run as `show --format json` prints it (progress "
          "goes to stderr)");

  auto* submit = app.add_subcommand("submit", "submit a pipeline for the daemons to execute");
  AddRunOptions(submit, submit_args, true);
  AddFormat(submit, submit_args.format);
  submit->add_flag("--force", submit_args.force, "override budget admission");

  std::vector<std::string> validate_files;
  std::string validate_format = "table";
  auto* validate = app.add_subcommand("validate", "check pipeline files; writes nothing");
  validate->add_option("FILE", validate_files, "pipeline YAML files")->required();
  AddFormat(validate, validate_format);

  auto* plan = app.add_subcommand("plan", "estimate time and cost per stage");
  AddRunOptions(plan, plan_args, false);
  plan_args.speed = 0;  // unless given: past runs as they ran
  plan->add_option("--speed", plan_args.speed,
                   "plan run: stages' past at this speed (their wall time x SPEED, as a run "
                   "at that speed bills them); default: as they ran")
      ->check(FiniteRange(1e-3, 1e9));
  AddFormat(plan, plan_args.format);

  schema::RunsQuery runs_query;
  std::string runs_format = "table", runs_since;
  auto* runs = app.add_subcommand("runs", "list runs, newest first");
  runs->add_option("--project", runs_query.project, "only this project");
  runs->add_option("--pipeline", runs_query.pipeline, "only runs of this pipeline");
  runs->add_option("--state", runs_query.state, "only runs in this state")
      ->check(CLI::IsMember({"running", "succeeded", "failed", "cancelled"}));
  runs->add_option("--since", runs_since,
                   "created on or after this day (YYYY-MM-DD, UTC) or a time ago (7d, 12h)");
  runs->add_option("--limit", runs_query.limit, "at most this many (default 50)")
      ->check(CLI::Range(1, 100000));
  AddFormat(runs, runs_format);

  std::string show_run, show_stage, show_format = "table";
  auto* show = app.add_subcommand("show", "one run: stages, attempts, costs");
  show->add_option("RUN", show_run, "run id")->required();
  show->add_option("--stage", show_stage,
                   "list every attempt of this stage (a matrix stage: of every expansion)");
  bool show_collapse = false;
  show->add_flag("--collapse", show_collapse,
                 "each matrix fan-out as one line with how many expansions are in each state "
                 "(the dashboard's run page reads the same)");
  AddFormat(show, show_format);

  std::string explain_run, explain_stage, explain_format = "table";
  auto* explain = app.add_subcommand("explain", "why a stage is not running (or what it did)");
  explain->add_option("RUN", explain_run, "run id")->required();
  explain->add_option("STAGE", explain_stage, "stage name")->required();
  AddFormat(explain, explain_format);

  std::string watch_run, watch_format = "table";
  auto* watch = app.add_subcommand("watch", "follow a run live until it ends");
  watch->add_option("RUN", watch_run, "run id")->required();
  bool watch_execute = false;
  watch->add_flag("--execute", watch_execute,
                  "also run its stages in this process, as `run` does (no daemons needed)");
  SandboxArgs watch_sandbox;
  AddSandboxOptions(watch, watch_sandbox);
  AddFormat(watch, watch_format)
      ->description(
          "table (default) or json: the finished run as `show --format json` prints it "
          "(progress goes to stderr)");

  std::string cancel_run;
  auto* cancel =
      app.add_subcommand("cancel", "cancel a run: pending stages end, running ones stop");
  cancel->add_option("RUN", cancel_run, "run id")->required();

  std::string resume_run;
  auto* resume = app.add_subcommand(
      "resume", "continue a failed or cancelled run: its failed, cancelled and skipped stages");
  resume->add_option("RUN", resume_run, "run id")->required();

  std::string retry_run, retry_stage;
  auto* retry = app.add_subcommand("retry", "run a stage and everything downstream again");
  retry->add_option("RUN", retry_run, "run id")->required();
  retry->add_option("STAGE", retry_stage, "stage name (a matrix stage: all its expansions)")
      ->required();

  std::string logs_run, logs_stage, logs_format = "table";
  auto* logs = app.add_subcommand("logs", "captured output of a run's stages");
  logs->add_option("RUN", logs_run, "run id")->required();
  logs->add_option("STAGE", logs_stage, "only this stage (a matrix stage: every expansion)");
  bool logs_follow = false;
  logs->add_flag("-f,--follow", logs_follow, "keep printing new output until the run ends");
  AddFormat(logs, logs_format);

  std::string instances_format = "table";
  bool instances_sources = false;
  auto* instances = app.add_subcommand("instances", "the hardware catalog with prices");
  AddFormat(instances, instances_format);
  instances->add_flag("--sources", instances_sources, "list the source of every figure");

  std::string models_format = "table";
  auto* models =
      app.add_subcommand("models", "the models a stage may name, with their architecture figures");
  AddFormat(models, models_format);

  SpendArgs spend_args;
  auto* spend = app.add_subcommand("spend", "spend report from the ledger");
  spend->add_option("--project", spend_args.project, "only this project");
  spend->add_option("--pipeline", spend_args.pipeline, "only this pipeline");
  spend->add_option("--since", spend_args.since,
                    "from this day (YYYY-MM-DD, UTC) or a time ago with its unit (7d, 12h, 2w)");
  spend->add_option("--until", spend_args.until,
                    "to this day, inclusive (YYYY-MM-DD, UTC) or a time ago (1d)");
  spend->add_option("--by", spend_args.by,
                    "group by any of project,pipeline,run,stage,kind,instance,market,day,month");
  spend->add_option("--format", spend_args.format, "table, csv or json")
      ->check(CLI::IsMember({"table", "csv", "json"}));
  spend->add_flag("--savings", spend_args.savings,
                  "what was saved, by project: spot against on-demand, cache hits, and Neuron "
                  "against the GPU baseline (" +
                      std::string(sim::kGpuBaseline) + ")");

  EventsArgs events_args;
  auto* events = app.add_subcommand(
      "events",
      "what happened to money and stages: budget thresholds and stops, interruptions, "
      "lost attempts");
  events->add_option("--project", events_args.project, "only this project");
  events->add_option("--run", events_args.run, "only this run");
  events->add_option("--since", events_args.since, "from this day (YYYY-MM-DD) or time ago (7d)");
  events->add_option("--kind", events_args.kind, "only this kind")
      ->check(CLI::IsMember({"budget", "interruption", "capacity", "lost"}));
  events->add_option("--limit", events_args.limit, "the newest this many (default 100)")
      ->check(CLI::Range(1, 100000));
  AddFormat(events, events_args.format);

  auto* budget = app.add_subcommand("budget", "project budgets");
  budget->require_subcommand(1);
  std::string budget_project, budget_usd, budget_period = "month", budget_format = "table";
  auto* budget_rm = budget->add_subcommand("rm", "remove a project's budget");
  budget_rm->add_option("PROJECT", budget_project, "project")->required();
  DeleteArgs budget_rm_args;
  AddDeleteOptions(budget_rm, budget_rm_args);
  auto* budget_set = budget->add_subcommand("set", "set a project's budget");
  budget_set->add_option("PROJECT", budget_project, "project")->required();
  budget_set->add_option("USD", budget_usd, "dollars per period")->required();
  budget_set->add_option("--period", budget_period, "month (default, UTC) or total")
      ->check(CLI::IsMember({"month", "total"}));
  auto* budget_ls = budget->add_subcommand("ls", "budgets with what is spent and left");
  AddFormat(budget_ls, budget_format);

  auto* project = app.add_subcommand("project", "projects and their PostgreSQL roles");
  project->require_subcommand(1);
  std::string project_name;
  std::vector<std::string> project_members;
  auto* project_add = project->add_subcommand(
      "add", "create a project, its group roles (read, write) and members (as the schema owner)");
  project_add->add_option("NAME", project_name, "project name")->required();
  project_add->add_option("--member", project_members,
                          "a login role that may read, submit, cancel, retry and resume "
                          "(repeatable)");
  std::optional<int> max_stages_per_run, max_queued_stages;
  project_add
      ->add_option("--max-stages-per-run", max_stages_per_run,
                   "quota: stages in one run (default 250000)")
      ->check(CLI::Range(1, 100000000));
  project_add
      ->add_option("--max-queued-stages", max_queued_stages,
                   "quota: unfinished stages over the project's runs (default 1000000)")
      ->check(CLI::Range(1, 1000000000));
  std::optional<int64_t> job_uid;
  project_add
      ->add_option("--job-uid", job_uid,
                   "the uid the project's jobs run as on every worker (default: the next "
                   "free from 200001)")
      ->check(CLI::Range(int64_t{1000}, int64_t{2147483646}));
  ProjectShareArgs project_share;
  auto* project_update = project->add_subcommand(
      "update", "change a project's share of the fleet (weight, caps) and quotas");
  project_update->add_option("NAME", project_name, "project name")->required();
  for (auto* cmd : {project_add, project_update}) {
    cmd->add_option("--weight", project_share.weight,
                    "its share of each pool against other projects' (default 1): weight 2 runs "
                    "twice the stages of weight 1 when both wait")
        ->check(CLI::Range(0.01, 1000.0));
    cmd->add_option("--max-running", project_share.max_running,
                    "at most N of its stages run at once: N (all pools), POOL=N (one pool), "
                    "none or POOL=none to remove (repeatable)");
  }
  project_update->add_option("--max-stages-per-run", max_stages_per_run, "quota: stages in one run")
      ->check(CLI::Range(1, 100000000));
  project_update
      ->add_option("--max-queued-stages", max_queued_stages,
                   "quota: unfinished stages over the project's runs")
      ->check(CLI::Range(1, 1000000000));
  project_update
      ->add_option("--job-uid", job_uid, "the uid the project's jobs run as on every worker")
      ->check(CLI::Range(int64_t{1000}, int64_t{2147483646}));
  std::string grant_role;
  bool grant_read = false, grant_write = false;
  auto* project_grant = project->add_subcommand(
      "grant", "give a login role read (--read) or read and write (--write) access to a project");
  project_grant->add_option("PROJECT", project_name, "project name")->required();
  project_grant->add_option("ROLE", grant_role, "an existing PostgreSQL login role")->required();
  auto* read_flag =
      project_grant->add_flag("--read", grant_read, "see the project's runs and spend");
  auto* write_flag =
      project_grant->add_flag("--write", grant_write, "also submit, cancel, retry, resume");
  read_flag->excludes(write_flag);
  auto* project_ls = project->add_subcommand("ls", "projects, roles and members");
  std::string project_format = "table";
  AddFormat(project_ls, project_format);
  auto* schedule = app.add_subcommand("schedule", "cron schedules (nightly precompilation)");
  schedule->require_subcommand(1);
  ScheduleArgs sched_args;
  std::string sched_name;
  auto* sched_add = schedule->add_subcommand("add", "run a pipeline on a cron schedule");
  sched_add->add_option("NAME", sched_args.name, "schedule name")->required();
  sched_add->add_option("FILE", sched_args.run.file, "pipeline YAML file")->required();
  sched_add->add_option("--cron", sched_args.cron, "five fields, e.g. \"0 2 * * *\"")->required();
  sched_add->add_option("--tz", sched_args.tz, "IANA time zone (default UTC)");
  sched_add
      ->add_option("--catchup", sched_args.catchup, "missed slots: none, latest (default) or all")
      ->check(CLI::IsMember({"none", "latest", "all"}));
  sched_add->add_option("--param", sched_args.run.params, "key=value (repeatable)");
  sched_add->add_option("--project", sched_args.run.project, "project to charge");
  sched_add->add_option("--speed", sched_args.run.speed, "simulated seconds per wall second");
  auto* sched_ls = schedule->add_subcommand("ls", "schedules with their next slot");
  std::string sched_format = "table";
  AddFormat(sched_ls, sched_format);
  auto* sched_show = schedule->add_subcommand(
      "show",
      "a schedule: its pipeline snapshot, params, next slots, last fire, and whether "
      "the file differs from the snapshot");
  sched_show->add_option("NAME", sched_name, "schedule")->required();
  AddFormat(sched_show, sched_format);
  ScheduleUpdateArgs sched_update_args;
  auto* sched_update = schedule->add_subcommand(
      "update", "re-read the pipeline file (or --file), validate it, replace the snapshot");
  sched_update->add_option("NAME", sched_update_args.name, "schedule")->required();
  sched_update->add_option("--file", sched_update_args.file, "take the pipeline from this file");
  sched_update->add_option("--param", sched_update_args.params,
                           "key=value over the stored params (repeatable)");
  sched_update->add_flag("--reset-params", sched_update_args.reset_params,
                         "drop the stored params first");
  sched_update->add_option("--cron", sched_update_args.cron, "a new cron expression");
  sched_update->add_option("--tz", sched_update_args.tz, "a new IANA time zone");
  auto* sched_run = schedule->add_subcommand(
      "run",
      "fire a schedule now, as its cron would (its snapshot and params); its cron slots "
      "are unchanged");
  sched_run->add_option("NAME", sched_name, "schedule")->required();
  AddFormat(sched_run, sched_format);
  auto* sched_pause = schedule->add_subcommand("pause", "stop firing a schedule");
  sched_pause->add_option("NAME", sched_name, "schedule")->required();
  auto* sched_resume = schedule->add_subcommand("resume", "fire it again, from now on");
  sched_resume->add_option("NAME", sched_name, "schedule")->required();
  auto* sched_rm = schedule->add_subcommand("rm", "remove a schedule");
  sched_rm->add_option("NAME", sched_name, "schedule")->required();
  DeleteArgs sched_rm_args;
  AddDeleteOptions(sched_rm, sched_rm_args);

  auto* cache = app.add_subcommand(
      "cache", "the artifact cache: compiled graphs (NEFFs) and stages with cache: true");
  cache->require_subcommand(1);
  std::string cache_key, gc_max_bytes, gc_older_than, why_run, why_stage;
  std::string cache_format = "table";
  DeleteArgs cache_del;
  auto* cache_ls = cache->add_subcommand("ls", "entries: key, model, shapes, target, bytes, hits");
  AddFormat(cache_ls, cache_format);
  auto* cache_show = cache->add_subcommand("show", "one entry and the inputs of its key");
  cache_show->add_option("KEY", cache_key, "key or digest (or their first characters)")->required();
  AddFormat(cache_show, cache_format);
  auto* cache_rm = cache->add_subcommand(
      "rm", "remove an entry (its files only when they lie inside the store)");
  cache_rm->add_option("KEY", cache_key, "key or digest (or their first characters)")->required();
  AddDeleteOptions(cache_rm, cache_del);
  auto* cache_verify = cache->add_subcommand("verify", "re-hash every entry; drop corrupt ones");
  AddDeleteOptions(cache_verify, cache_del);
  AddFormat(cache_verify, cache_format);
  auto* cache_gc = cache->add_subcommand("gc", "remove least recently used entries");
  cache_gc->add_option("--max-bytes", gc_max_bytes,
                       "keep at most this much: bytes, or 500MB, 1GB (powers of 1000), 1G, 1GiB "
                       "(powers of 1024)");
  AddDeleteOptions(cache_gc, cache_del);
  cache_gc->add_option("--older-than", gc_older_than,
                       "remove entries unused for this long, with its unit (30d, 12h, 2w)");
  AddFormat(cache_gc, cache_format);
  std::string trust_project, trust_trusted;
  bool trust_list = false;
  auto* cache_trust = cache->add_subcommand(
      "trust",
      "let PROJECT's cached stages be served entries TRUSTED built for the same inputs (each "
      "project's entries are its own otherwise; compiled graphs are everyone's)");
  cache_trust->add_option("PROJECT", trust_project, "the project that is served");
  cache_trust->add_option("TRUSTED", trust_trusted, "the project whose entries it may use");
  cache_trust->add_flag("--list", trust_list, "list who trusts whom");
  AddFormat(cache_trust, cache_format);
  auto* cache_untrust = cache->add_subcommand("untrust", "undo `cache trust PROJECT TRUSTED`");
  cache_untrust->add_option("PROJECT", trust_project, "project")->required();
  cache_untrust->add_option("TRUSTED", trust_trusted, "the project it trusted")->required();
  auto* cache_why = cache->add_subcommand("why", "why a stage missed the cache");
  cache_why->add_option("RUN", why_run, "run id")->required();
  cache_why->add_option("STAGE", why_stage, "stage name")->required();
  AddFormat(cache_why, cache_format);

  auto* db = app.add_subcommand("db", "catalog administration");
  db->require_subcommand(1);
  auto* db_drop = db->add_subcommand(
      "drop",
      "drop the catalog: its database and the roles made for it (not the owner's role, "
      "nor people's logins)");
  DeleteArgs db_drop_args;
  AddDeleteOptions(db_drop, db_drop_args);
  auto* db_archive = db->add_subcommand(
      "archive",
      "dump one past UTC month of the ledger (its partition) to a file, check the "
      "file, then drop the month from the catalog");
  ArchiveArgs archive_args;
  db_archive->add_option("--month", archive_args.month, "the month, YYYY-MM (UTC; a past month)")
      ->required();
  db_archive->add_option(
      "--file", archive_args.file,
      "the dump (pg_dump --format=custom); default trnflow-attempts-YYYY-MM.dump");
  db_archive->add_flag("--keep", archive_args.keep, "dump and check only; keep the partition");
  AddDeleteOptions(db_archive, archive_args.del);
  auto* migrate = db->add_subcommand("migrate", "apply pending migrations (safe concurrently)");
  std::string job_uid_range;
  migrate->add_option("--job-uid-range", job_uid_range,
                      "this catalog's job uids, START-END (default: the first block of 100,000 "
                      "from 200000-299999 no other catalog on the server claims)");

  std::vector<std::string> worker_pools;
  std::string lease = "15s";
  auto* worker = app.add_subcommand("worker", "worker daemon: claims and runs stages");
  worker->add_option("--pool", worker_pools, "pool capacity in instances: NAME=N (repeatable)")
      ->required();
  worker->add_option("--lease", lease,
                     "lease length: 15s (default), 1m; from 1s to 1h (a bare number is seconds)");
  std::vector<std::string> worker_projects;
  worker->add_option("--project", worker_projects,
                     "serve only this project (repeatable): capacity reserved for it; by "
                     "default a worker serves every project");
  SandboxArgs worker_sandbox;
  AddSandboxOptions(worker, worker_sandbox);

  std::string exec_stage_dir;
  auto* exec_stage = app.add_subcommand("exec-stage", "");  // hidden: what a Slurm job runs
  exec_stage->group("");
  exec_stage->add_option("DIR", exec_stage_dir, "the attempt's directory")->required();

  auto* sched = app.add_subcommand("scheduler", "scheduler daemon (several may run; one leads)");

  std::string workers_format = "table";
  auto* workers_cmd = app.add_subcommand(
      "workers",
      "workers that heartbeated in the last day: pools, what they run, live or dead (silent past "
      "their lease)");
  AddFormat(workers_cmd, workers_format);
  std::string forget_which;
  auto* workers_forget = workers_cmd->add_subcommand(
      "forget", "remove stopped and dead workers from the list now (all, or one id or host)");
  workers_forget->add_option("WHICH", forget_which, "a worker id or a host (default: all)");
  std::string forget_format = "table";
  AddFormat(workers_forget, forget_format);

  ServeArgs serve_args;
  auto* serve_cmd = app.add_subcommand(
      "serve", "the web dashboard, its JSON API, live events and Prometheus /metrics (a daemon)");
  serve_cmd->add_option("--listen", serve_args.listen,
                        "HOST:PORT to listen on (default 127.0.0.1:8080; port 0: any free one), "
                        "or unix:PATH (--auth local: a socket only this user and root reach)");
  serve_cmd
      ->add_option("--auth", serve_args.auth,
                   "local (default: the operator, with the token in --token-file; loopback "
                   "only) or proxy (a reverse proxy adds the secret in --proxy-secret-file "
                   "and names the user in --user-header; docs/serve.md)")
      ->check(CLI::IsMember({"local", "proxy"}));
  serve_cmd->add_option("--user-header", serve_args.options.user_header,
                        "--auth proxy: the header naming the PostgreSQL role (default "
                        "X-Forwarded-User)");
  serve_cmd->add_option("--token-file", serve_args.token_file,
                        "--auth local: the token every request presents (made, mode 0600, when "
                        "missing; default /etc/trnflow/serve.token)");
  serve_cmd->add_option("--proxy-secret-file", serve_args.proxy_secret_file,
                        "--auth proxy: the secret the proxy sends in X-Trnflow-Proxy-Secret "
                        "(made, mode 0600, when missing; default /etc/trnflow/serve-proxy.secret)");
  serve_cmd->add_option("--allowed-host", serve_args.options.allowed_hosts,
                        "a Host name requests may give besides the listen address (and "
                        "localhost on loopback); repeat for more");
  serve_cmd
      ->add_option("--header-timeout", serve_args.options.header_timeout_s,
                   "seconds a request's line and headers may take to arrive (default 10)")
      ->check(FiniteRange(0.5, 300));
  serve_cmd
      ->add_option("--max-pending-per-client", serve_args.options.max_pending_per_client,
                   "connections from one address that have not yet presented the token or "
                   "the proxy secret, at once; more get 429 (default 16)")
      ->check(CLI::Range(1, 4096));
  serve_cmd
      ->add_option("--max-clients", serve_args.options.max_clients,
                   "live event streams at once (default 64)")
      ->check(CLI::Range(1, 4096));
  serve_cmd
      ->add_option("--heartbeat", serve_args.options.heartbeat_s,
                   "seconds between keep-alive lines on an idle event stream (default 15)")
      ->check(FiniteRange(0.1, 300));
  serve_cmd
      ->add_option("--stream-lifetime", serve_args.options.stream_lifetime_s,
                   "seconds an event stream lasts before the browser reconnects and resumes "
                   "from its last event (default 300)")
      ->check(FiniteRange(1, 86400));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() != 0)
      if (auto hint = Suggestion(app, argc, argv)) {
        std::cerr << "trnflow: error: " << *hint << "\n";
        return kExitBadInput;
      }
    int code = app.exit(e);
    return code == 0 ? kExitOk : kExitBadInput;
  }
  bool daemon = worker->parsed() || sched->parsed() || serve_cmd->parsed();
  SetupLogging(daemon && log_level == "warn" ? "info" : log_level);
  try {
    if (run->parsed()) return CmdRun(run_args);
    if (submit->parsed()) return CmdSubmit(submit_args);
    if (validate->parsed()) return CmdValidate(validate_files, validate_format);
    if (plan->parsed()) return CmdPlan(plan_args);
    if (runs->parsed()) {
      runs_query.since = ReadDateFlag("--since", runs_since);
      return CmdRuns(runs_query, runs_format);
    }
    if (workers_forget->parsed()) return CmdWorkersForget(forget_which, forget_format);
    if (workers_cmd->parsed()) return CmdWorkers(workers_format);
    if (serve_cmd->parsed()) return CmdServe(serve_args);
    if (show->parsed()) return CmdShow(show_run, show_stage, show_format, show_collapse);
    if (watch->parsed()) return CmdWatch(watch_run, watch_execute, watch_sandbox, watch_format);
    if (explain->parsed()) return CmdExplain(explain_run, explain_stage, explain_format);
    if (cancel->parsed()) return CmdCancel(cancel_run);
    if (resume->parsed()) return CmdResume(resume_run);
    if (retry->parsed()) return CmdRetry(retry_run, retry_stage);
    if (logs->parsed()) return CmdLogs(logs_run, logs_stage, logs_follow, logs_format);
    if (instances->parsed()) return CmdInstances(instances_format, instances_sources);
    if (models->parsed()) return CmdModels(models_format);
    if (migrate->parsed()) return CmdDbMigrate(job_uid_range);
    if (db_drop->parsed()) return CmdDbDrop(db_drop_args);
    if (db_archive->parsed()) return CmdDbArchive(archive_args);
    if (spend->parsed()) return CmdSpend(spend_args);
    if (events->parsed()) return CmdEvents(events_args);
    if (sched_add->parsed()) return CmdScheduleAdd(sched_args);
    if (sched_ls->parsed()) return CmdScheduleList(sched_format);
    if (sched_show->parsed()) return CmdScheduleShow(sched_name, sched_format);
    if (sched_update->parsed()) return CmdScheduleUpdate(sched_update_args);
    if (sched_run->parsed()) return CmdScheduleRun(sched_name, sched_format);
    if (sched_pause->parsed()) return CmdSchedulePause(sched_name, true);
    if (sched_resume->parsed()) return CmdSchedulePause(sched_name, false);
    if (sched_rm->parsed()) return CmdScheduleRemove(sched_name, sched_rm_args);
    if (cache_ls->parsed()) return CmdCacheList(cache_format);
    if (cache_show->parsed()) return CmdCacheShow(cache_key, cache_format);
    if (cache_rm->parsed()) return CmdCacheRemove(cache_key, cache_del);
    if (cache_verify->parsed()) return CmdCacheVerify(cache_del, cache_format);
    if (cache_gc->parsed()) return CmdCacheGc(gc_max_bytes, gc_older_than, cache_del, cache_format);
    if (cache_why->parsed()) return CmdCacheWhy(why_run, why_stage, cache_format);
    if (cache_trust->parsed())
      return CmdCacheTrust(trust_project, trust_trusted, true,
                           trust_list || (trust_project.empty() && trust_trusted.empty()),
                           cache_format);
    if (cache_untrust->parsed())
      return CmdCacheTrust(trust_project, trust_trusted, false, false, "table");
    if (budget_set->parsed()) return CmdBudgetSet(budget_project, budget_usd, budget_period);
    if (budget_ls->parsed()) return CmdBudgetList(budget_format);
    if (budget_rm->parsed()) return CmdBudgetRemove(budget_project, budget_rm_args);
    if (project_add->parsed())
      return CmdProjectAdd(project_name, project_members, max_stages_per_run, max_queued_stages,
                           job_uid, project_share);
    if (project_update->parsed())
      return CmdProjectUpdate(project_name, max_stages_per_run, max_queued_stages, job_uid,
                              project_share);
    if (project_grant->parsed()) {
      if (!grant_read && !grant_write) throw UserError("say --read or --write");
      return CmdProjectGrant(project_name, grant_role, grant_write);
    }
    if (project_ls->parsed()) return CmdProjectList(project_format);
    if (worker->parsed()) {
      // Seconds when bare (its old grammar), else a duration with its unit.
      char* end = nullptr;
      double lease_s = std::strtod(lease.c_str(), &end);
      if (lease.empty() || *end != '\0') lease_s = ParseDurationFlag("--lease", lease);
      if (!std::isfinite(lease_s) || lease_s < 1 || lease_s > 3600)
        throw UserError("--lease " + lease + ": must be from 1s to 1h");
      return CmdWorker(worker_pools, lease_s, worker_projects, worker_sandbox);
    }
    if (sched->parsed()) return CmdScheduler();
    if (exec_stage->parsed()) return CmdExecStage(exec_stage_dir);
  } catch (const UserError& e) {
    std::cerr << "trnflow: error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const CatalogUnavailable& e) {
    std::cerr << "trnflow: error: " << e.what() << "\n";
    return kExitNoCatalog;
  } catch (const PermissionDenied& e) {
    std::cerr << "trnflow: " << e.what() << "\n";
    return kExitPermissionDenied;
  } catch (const Refused& e) {
    std::cerr << "trnflow: refused: " << e.what() << "\n";
    return kExitPermissionDenied;
  } catch (const std::exception& e) {
    std::cerr << "trnflow: internal error: " << e.what() << "\n";
    return kExitRunFailed;
  }
  return kExitBadInput;
}
