// trnflow db migrate / worker / scheduler / exec-stage.
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "cli/commands.h"
#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "scheduler/scheduler.h"
#include "sim/catalog.h"
#include "workers/executor.h"
#include "workers/worker.h"

namespace trnflow::cli {
namespace {
void WaitForSignal() {
  InstallSignalHandlers();
  while (!g_interrupted) std::this_thread::sleep_for(std::chrono::milliseconds(50));
}
}  // namespace

int CmdDbMigrate(const std::string& job_uid_range) {
  int64_t lo = 0, hi = 0;
  if (!job_uid_range.empty()) {
    std::smatch m;
    static const std::regex kRange(R"(^\s*(\d{1,10})\s*-\s*(\d{1,10})\s*$)");
    if (!std::regex_match(job_uid_range, m, kRange) || (lo = std::stoll(m[1])) < 1000 ||
        (hi = std::stoll(m[2])) < lo || hi > 2147483646LL)
      throw UserError("--job-uid-range " + job_uid_range +
                      ": expected START-END with 1000 <= START <= END <= 2147483646 (the job's "
                      "namespaces cannot map larger uids), e.g. 200000-299999");
  }
  schema::Catalog catalog(CheckedAdminUrl("db migrate"));
  auto report = catalog.Migrate(sim::Catalog::Builtin());
  std::string range =
      job_uid_range.empty() ? catalog.JobUidRange() : catalog.SetJobUidRange(lo, hi);
  std::cout << "catalog " << RedactUrl(catalog.url()) << ": schema version " << report.from_version
            << " -> " << report.to_version;
  if (report.applied.empty()) std::cout << " (up to date)";
  for (const auto& m : report.applied) std::cout << "\n  applied " << m;
  if (!range.empty()) std::cout << "\n  job uids " << range;
  std::cout << "\n";
  return kExitOk;
}

int CmdDbDrop(const DeleteArgs& del) {
  std::string url = CheckedAdminUrl("db drop");
  schema::CatalogDropPlan plan = schema::PlanCatalogDrop(url);
  std::string roles;
  for (const auto& r : plan.roles) roles += "\n  role " + r;
  std::string what = "database " + plan.database + " (catalog " + plan.catalog_id + ", " +
                     std::to_string(plan.runs) + " runs and their ledger) and its " +
                     std::to_string(plan.roles.size()) + " roles";
  if (del.dry_run) {
    std::cout << "would drop " << what << ":" << roles
              << "\nthe owner's role and people's logins stay; dry run: nothing was dropped\n";
    return kExitOk;
  }
  if (plan.other_sessions > 0)
    std::cerr << "trnflow: " << plan.other_sessions << " other sessions use " << plan.database
              << "; they are ended where this login may, else the drop is refused\n";
  if (!Confirm("drop " + what +
                   "? Its ledger is gone for good (back it up first: "
                   "docs/operations.md, \"Backup and restore\")",
               del.yes))
    return Declined();
  auto kept = schema::DropCatalog(url, plan);
  std::cout << "dropped database " << plan.database << " and " << plan.roles.size() - kept.size()
            << " of its roles" << roles << "\n";
  for (const auto& k : kept)
    std::cout << "kept role " << k << ": drop it by hand once nothing else uses it\n";
  return kExitOk;
}

namespace {
// A Slurm client command's standard output and exit status (-1: it could not run).
std::string SlurmToolOutput(const std::string& command, int* status) {
  std::string out;
  *status = -1;
  if (FILE* p = ::popen(("timeout 15 " + command + " 2>/dev/null").c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    *status = ::pclose(p);
  }
  return out;
}

// The accounts and QOS of the map, checked against Slurm's accounting (sacctmgr) where the
// cluster has one: a name it does not know is the operator's error now (every job of that
// project would be refused), with the closest name. A cluster whose sacctmgr does not answer
// (no slurmdbd) is not checked: sbatch is the judge there.
void CheckSlurmAccounts(const workers::slurm::AccountMap& map, const std::string& config) {
  std::vector<std::pair<std::string, std::string>> accounts, qos;  // name, where it came from
  if (!map.fallback.account.empty())
    accounts.push_back({map.fallback.account, "the default account"});
  if (!map.fallback.qos.empty()) qos.push_back({map.fallback.qos, "the default QOS"});
  for (const auto& [project, a] : map.projects) {
    accounts.push_back({a.account, "project " + project + "'s account"});
    if (!a.qos.empty()) qos.push_back({a.qos, "project " + project + "'s QOS"});
  }
  auto check = [&](const std::vector<std::pair<std::string, std::string>>& wanted,
                   const std::string& command, const std::string& what) {
    if (wanted.empty()) return;
    int status = -1;
    std::string out = SlurmToolOutput(command, &status);
    if (status != 0) {
      Logger("workers.slurm")
          ->warn("{}: Slurm's accounting did not answer ({}); {}s not checked", config, command,
                 what);
      return;
    }
    std::vector<std::string> names;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) names.push_back(line);
    for (const auto& [name, where] : wanted) {
      // Slurm keeps account and QOS names in lower case and matches them so.
      std::string lower = name;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      if (std::find(names.begin(), names.end(), lower) == names.end())
        throw UserError((config.empty() ? "--account" : config) + ": " + where + " " + name +
                        ": Slurm has no such " + what +
                        NameHint(lower, names, "; `" + command + "` lists them"));
    }
  };
  check(accounts, "sacctmgr -n -P show account format=account", "account");
  check(qos, "sacctmgr -n -P show qos format=name", "QOS");
}

// The Slurm executor's options, checked against the cluster: a partition it does not have is
// the operator's error now, not every job's later.
workers::SlurmOptions SlurmFromArgs(const ExecutorArgs& a) {
  workers::SlurmOptions s;
  s.partition = a.partition;
  s.account = a.account;
  s.spot_partition = a.spot_partition;
  s.shared_dir = a.shared_dir.empty() ? HomeDir() + "/slurm" : a.shared_dir;
  s.trnflow_binary = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string partitions;
  int status = -1;
  if (FILE* p = ::popen("timeout 15 sinfo -h -o %R 2>&1", "r")) {
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) partitions.append(buf, n);
    status = ::pclose(p);
  }
  while (!partitions.empty() && partitions.back() == '\n') partitions.pop_back();
  if (status != 0)
    throw UserError("--executor slurm: cannot reach Slurm (sinfo: " + partitions +
                    "); is SLURM_CONF set? ops/slurm.sh up starts a one-host cluster");
  if (!a.partition.empty()) {
    std::vector<std::string> names;
    std::istringstream in(partitions);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) names.push_back(line);
    if (std::find(names.begin(), names.end(), a.partition) == names.end())
      throw UserError("--partition " + a.partition + ": Slurm has no such partition" +
                      NameHint(a.partition, names, "; `sinfo` lists them"));
  }
  if (!a.slurm_config.empty()) {
    std::ifstream in(a.slurm_config);
    if (!in) throw UserError("--slurm-config " + a.slurm_config + ": cannot read it");
    std::stringstream text;
    text << in.rdbuf();
    workers::slurm::SlurmConfig config;
    if (std::string e = workers::slurm::ParseSlurmConfig(text.str(), a.slurm_config, &config);
        !e.empty())
      throw UserError(e);
    s.partitions = config.partitions;
    s.arrays = config.arrays;
    s.accounts = config.accounts;
    if (!a.account.empty() && !s.accounts.fallback.account.empty() &&
        a.account != s.accounts.fallback.account)
      throw UserError("--account " + a.account + " and " + a.slurm_config + "'s default_account " +
                      s.accounts.fallback.account +
                      " disagree: give the default account in one place");
    std::vector<std::string> names;
    std::istringstream known(partitions);
    for (std::string line; std::getline(known, line);)
      if (!line.empty()) names.push_back(line);
    for (const auto& p : s.partitions)
      if (std::find(names.begin(), names.end(), p.name) == names.end())
        throw UserError(a.slurm_config + ": partition " + p.name + ": Slurm has no such partition" +
                        NameHint(p.name, names, "; `sinfo` lists them"));
  }
  if (s.accounts.fallback.account.empty()) s.accounts.fallback.account = a.account;
  CheckSlurmAccounts(s.accounts, a.slurm_config);
  std::error_code ec;
  std::filesystem::create_directories(s.shared_dir, ec);
  if (ec) throw UserError("--shared-dir " + s.shared_dir + ": " + ec.message());
  ::chmod(s.shared_dir.c_str(), 0711);  // jobs reach their own attempt's directory by name
  return s;
}

}  // namespace

void ApplySandboxArgs(const SandboxArgs& args, workers::WorkerOptions& o) {
  o.sandbox = !args.no_sandbox && workers::SandboxRequestedByEnvironment();
  o.allow_network = args.allow_network;
  if (const char* dir = std::getenv("TRNFLOW_SECRETS_DIR"); dir && *dir) o.secrets_dir = dir;
  if (const char* env = std::getenv("TRNFLOW_JOB_LIMITS"))
    if (std::string e = workers::ParseJobLimits(env, o.job_limits); !e.empty())
      throw UserError("TRNFLOW_JOB_LIMITS: " + e);
  if (std::string e = workers::ParseJobLimits(args.job_limits, o.job_limits); !e.empty())
    throw UserError("--job-limits: " + e);
  const ExecutorArgs& ex = args.executor;
  if (ex.executor != "slurm" &&
      (!ex.partition.empty() || !ex.account.empty() || !ex.shared_dir.empty() ||
       ex.spot_partition || !ex.slurm_config.empty()))
    throw UserError(
        "--partition, --account, --shared-dir, --spot-partition and --slurm-config "
        "are for --executor slurm");
  // What runs the stages: this host, or one Slurm batch job per attempt for every stage.
  if (ex.executor == "slurm")
    o.executors =
        workers::Executors::AllOn(std::make_shared<workers::SlurmExecutor>(SlurmFromArgs(ex)));
  else
    o.executors = workers::Executors::Local();
}

int CmdWorker(const std::vector<std::string>& pool_args, double lease_s,
              const std::vector<std::string>& projects, const SandboxArgs& sandbox) {
  workers::WorkerOptions o;
  ApplySandboxArgs(sandbox, o);
  o.database_url = DatabaseUrl();
  o.home = HomeDir();
  o.lease_s = lease_s;
  o.heartbeat_s = std::max(0.2, lease_s / 5);
  for (const auto& p : pool_args) {
    auto eq = p.find('=');
    int n = 0;
    if (eq != std::string::npos) try {
        n = std::stoi(p.substr(eq + 1));
      } catch (const std::exception&) {
      }
    if (eq == std::string::npos || eq == 0 || n <= 0 || n > 100000)
      throw UserError("--pool " + p +
                      ": expected NAME=N with 1 to 100000 instances, e.g. --pool trn1=4");
    CheckPoolName(p.substr(0, eq), "--pool " + p);
    o.pools.push_back({p.substr(0, eq), n});
  }
  if (o.pools.empty()) throw UserError("give at least one --pool NAME=N, e.g. --pool cpu=4");
  // Fail fast: exit 3 when the catalog is unusable, 4 when this login is not the daemons'.
  auto catalog = OpenCatalog();
  catalog->RequireStageRunner("`trnflow worker`");
  for (const auto& p : projects) {
    RequireProjectName(p);
    if (!catalog->ProjectExists(p))
      throw UserError("--project " + p + ": no such project; `trnflow project ls` lists them");
    if (std::find(o.projects.begin(), o.projects.end(), p) == o.projects.end())
      o.projects.push_back(p);
  }
  catalog.reset();
  workers::Worker worker(o);
  worker.Start();
  WaitForSignal();
  Logger("workers")->info("signal received: stopping (grace {:.0f}s)", o.shutdown_grace_s);
  worker.Stop();
  return kExitOk;
}

namespace {
std::atomic<int> g_exec_stop{0};
std::atomic<bool> g_exec_noticed{false};
extern "C" void OnExecSignal(int sig) {
  if (sig == SIGUSR1) g_exec_noticed = true;
  g_exec_stop = static_cast<int>(workers::StopReason::kCancelled);
}
}  // namespace

int CmdExecStage(const std::string& dir) {
  namespace fs = std::filesystem;
  std::ifstream in(fs::path(dir) / "context.json");
  if (!in)
    throw UserError(dir + "/context.json: cannot read it (exec-stage runs what a worker wrote)");
  nlohmann::json c = nlohmann::json::parse(in);
  workers::ExecContext ctx;
  ctx.spec = StageSpecFromJson(c.at("spec").dump());
  ctx.run_id = c.at("run_id").get<int64_t>();
  ctx.attempt = c.at("attempt").get<int>();
  ctx.market = ParseMarket(c.at("market").get<std::string>()).value_or(Market::kOnDemand);
  ctx.instance_count = c.at("instance_count").get<int>();
  ctx.progress = c.at("progress").get<double>();
  ctx.speed = c.at("speed").get<double>();
  ctx.seed = c.at("seed").get<uint64_t>();
  ctx.spot_rate_multiplier = c.at("spot_rate_multiplier").get<double>();
  double cap = c.at("spend_cap_s").get<double>();
  if (cap >= 0) ctx.spend_cap_s = cap;
  ctx.stop = &g_exec_stop;
  std::signal(SIGUSR1, OnExecSignal);
  std::signal(SIGTERM, OnExecSignal);
  std::signal(SIGINT, OnExecSignal);
  // The same lines a command prints: the worker reads them from the job's output.
  double said = -1, saved = ctx.progress;
  ctx.report_progress = [&](const workers::LiveProgress& p) {
    if (p.checkpointed > saved) {
      saved = p.checkpointed;
      std::printf("::progress %.6f\n::checkpoint sim:%.6f\n", saved, saved);
    }
    if (p.progress - said >= 0.005) {
      said = p.progress;
      std::printf("::progress %.6f\n", said);
    }
    std::fflush(stdout);
  };
  workers::ExecResult r = workers::SimExecutor().Run(ctx);
  if (g_exec_noticed && r.outcome == Outcome::kCancelled) r.outcome = Outcome::kSpotInterruption;
  nlohmann::json out = {{"outcome", std::string(ToString(r.outcome))},
                        {"sim_seconds", r.sim_seconds},
                        {"progress_to", r.progress_to},
                        {"lost_fraction", r.lost_fraction},
                        {"message", r.message},
                        {"ran_instance", r.ran_instance}};
  std::printf("%s: %s%s%s\n", ctx.spec.name.c_str(), std::string(ToString(r.outcome)).c_str(),
              r.message.empty() ? "" : ": ", r.message.c_str());
  std::fflush(stdout);
  // In the attempt's work/, the one part of its directory the job may write.
  fs::path work = fs::path(dir) / "work";
  fs::path tmp = work / ".result.json.tmp";
  {
    std::ofstream f(tmp);
    f << out.dump() << "\n";
    if (!f) throw std::runtime_error("cannot write " + tmp.string());
  }
  fs::rename(tmp, work / "result.json");
  return r.outcome == Outcome::kSucceeded ? kExitOk : kExitRunFailed;
}

int CmdScheduler() {
  OpenCatalog()->RequireStageRunner("`trnflow scheduler`");
  scheduler::SchedulerOptions o;
  o.database_url = DatabaseUrl();
  scheduler::Scheduler s(o);
  s.Start();
  WaitForSignal();
  s.Stop();
  return kExitOk;
}

}  // namespace trnflow::cli
