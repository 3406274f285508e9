#pragma once
// Helpers shared by the subcommands: option structs, loading a pipeline with diagnostics,
// opening the catalog, tables (common/text_table.h), money and time formatting.
#include <atomic>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/json_text.h"
#include "common/text_table.h"
#include "pipelines/pipeline.h"
#include "schema/catalog.h"
#include "schema/run_view.h"
#include "serve/server.h"

namespace trnflow::cli {

inline constexpr double kDefaultSpeed = 7200;  // two simulated hours per wall second
inline constexpr int64_t kDefaultSeed = 7;

// The job sandbox's switches, shared by `run` and `worker` (docs/security.md).
// trnflow worker --executor slurm and its switches (docs/executors.md).
struct ExecutorArgs {
  std::string executor = "local";  // local | slurm
  std::string partition, account, shared_dir;
  std::string slurm_config;  // the partition map (instance types, devices)
  bool spot_partition = false;
};

// How the stages a command runs are run: the sandbox, and where (every command that runs
// stages: run, watch --execute, worker).
struct SandboxArgs {
  bool no_sandbox = false;     // or TRNFLOW_SANDBOX=off
  std::string job_limits;      // as=16G,nproc=1024,... over TRNFLOW_JOB_LIMITS and the defaults
  bool allow_network = false;  // stages with `network: host` may share the host's network
  ExecutorArgs executor;
};

struct RunArgs {
  std::string file;
  std::string project;
  std::vector<std::string> params;  // key=value
  double speed = kDefaultSpeed;
  int64_t seed = kDefaultSeed;
  std::vector<std::string> pools;  // NAME=N overrides
  std::string format = "table";
  bool force = false;
  bool share = false;  // run: daemon workers may take stages of this run too
  bool retry_failed_compilation = false;
  SandboxArgs sandbox;
};

struct ScheduleArgs {
  std::string name, cron, tz = "UTC", catchup = "latest";
  RunArgs run;  // file, project, params, speed
};

struct EventsArgs {
  std::string project, run, since, kind, format = "table";
  int limit = 100;
};

// `schedule update NAME`: what to change; empty means keep.
struct ScheduleUpdateArgs {
  std::string name, file, cron, tz;
  std::vector<std::string> params;  // key=value, over the stored ones
  bool reset_params = false;        // drop the stored params first
};

// `trnflow serve` (docs/serve.md).
struct ServeArgs {
  std::string listen = "127.0.0.1:8080";
  std::string auth = "local";     // local | proxy
  std::string token_file;         // --auth local; default CONFIG_DIR/serve.token
  std::string proxy_secret_file;  // --auth proxy; default CONFIG_DIR/serve-proxy.secret
  // --user-header, --allowed-host and the limits, bound straight into the server's options
  // (their defaults are serve::Options'); the rest of them CmdServe fills in.
  serve::Options options;
};

struct SpendArgs {
  std::string project, pipeline, since, until, by, format = "table";
  bool savings = false;  // --savings: what spot, the cache and Neuron saved, by project
};

// Parses key=value pairs; throws UserError naming the bad one.
std::map<std::string, std::string> ParseParams(const std::vector<std::string>& kv);
// Loads and validates; prints diagnostics (errors and warnings) to stderr. nullopt on error.
std::optional<pipelines::Pipeline> LoadOrReport(const std::string& file,
                                                const pipelines::LoadOptions& options);
// A LoadOptions::stage_bound that asks the catalog (a connection of this command's login, per
// file parsed); when the catalog cannot say (unreachable, an older schema), the default
// quota. submit_run counts again under the project's lock, so this bound is the early refusal.
std::function<pipelines::StageBound(const std::string&)> CatalogStageBound();
// Opens the catalog at TRNFLOW_DATABASE_URL and checks its schema version.
// Which login a command uses: the daemons' (or the person's own), or the schema owner's for
// administration (`db migrate`, `project`).
// A pool name from the command line, checked against the hardware catalog's pools; throws
// UserError naming the pools (and the closest) otherwise. `flag` is what the user typed.
void CheckPoolName(const std::string& name, const std::string& flag);
// The project naming rule, checked before the catalog is asked (which checks it too).
void RequireProjectName(const std::string& name);

enum class CatalogLogin { kDefault, kAdmin };
std::unique_ptr<schema::Catalog> OpenCatalog(CatalogLogin login = CatalogLogin::kDefault);
// The schema owner's URL for `command` (`db migrate`, `project`): TRNFLOW_ADMIN_DATABASE_URL,
// else /etc/trnflow/owner.url — refused (UserError) when that file names another catalog than
// a TRNFLOW_DATABASE_URL that is set, saying which variable to set.
std::string CheckedAdminUrl(const std::string& command);
// "42" -> 42; throws UserError otherwise.
int64_t ParseRunId(const std::string& text);

// The switches of every command that deletes (docs/cli.md, "Deleting safely").
struct DeleteArgs {
  bool dry_run = false;  // say what would be removed; remove nothing
  bool yes = false;      // do not ask, even on a terminal
};

// Asks `question` with "[y/N]" when a person is at a terminal (stdin and stdout both are
// one) and --yes was not given; true for y or yes. Without a terminal (scripts, CI) it does
// not ask: the command line is the decision.
bool Confirm(const std::string& question, bool yes);
// What a deleting command prints and returns when the person answered no: exit code 1, the
// command was cancelled (nothing was removed).
int Declined();

// A duration flag: 30s, 10m, 12h, 7d, 2w, 1h30m. A bare number is refused (30 what?), as is
// anything else that is not a positive duration; throws UserError naming the flag.
double ParseDurationFlag(const std::string& flag, const std::string& text);

// A date flag: 2026-11-01 as it is, or a time ago with its unit (7d, 12h, 2w) as the UTC date
// that long before now; "" stays "". Throws UserError naming the flag otherwise.
std::string ReadDateFlag(const std::string& flag, const std::string& text);

// Throws UserError (exit 2) when `project` is given and does not exist, with the closest name.
void RequireProject(schema::Catalog& catalog, const std::string& project);

// "; did you mean 'x'?" when `name` is close to one of `names`, else `otherwise`.
std::string NameHint(const std::string& name, const std::vector<std::string>& names,
                     const std::string& otherwise);

// While it lives, what the command prints on stdout goes to stderr: `run` and `watch` with
// --format json keep stdout for the JSON of the finished run.
class StdoutToStderr {
 public:
  explicit StdoutToStderr(bool active)
      : saved_(active ? std::cout.rdbuf(std::cerr.rdbuf()) : nullptr) {}
  ~StdoutToStderr() {
    if (saved_) std::cout.rdbuf(saved_);
  }
  StdoutToStderr(const StdoutToStderr&) = delete;
  StdoutToStderr& operator=(const StdoutToStderr&) = delete;

 private:
  std::streambuf* saved_;
};

// A number for people: 7200, 1000000, 0.5, 1e-3 (never 1e+06 or 7200.000000).
std::string Number(double v);

// Set by SIGINT/SIGTERM; long-running commands poll it.
extern std::atomic<bool> g_interrupted;
void InstallSignalHandlers();

}  // namespace trnflow::cli
