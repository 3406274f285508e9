// The Worker's lifecycle: the constructor sizes one TBB arena per pool, Start() decides the
// sandbox, registers this incarnation and starts the threads (committer, heartbeat, LISTEN,
// claim loop), Stop() stops claiming, waits out the grace period, stops what still runs
// (handed back) and records the stop. The parts the threads run are in their own files
// (worker_impl.h lists them).
#include "workers/worker.h"

#include <unistd.h>

#include <filesystem>
#include <stdexcept>

#include "common/env.h"
#include "nlohmann/json.hpp"
#include "schema/member_lock_guard.h"
#include "workers/job_cgroup.h"
#include "workers/worker_impl.h"

namespace trnflow::workers {
namespace {

std::string NewUuid() {
  std::random_device rd;
  std::mt19937_64 g((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                    static_cast<uint64_t>(Steady::now().time_since_epoch().count()));
  uint64_t a = g(), b = g();
  a = (a & ~0xF000ULL) | 0x4000ULL;                         // version 4
  b = (b & 0x3FFFFFFFFFFFFFFFULL) | 0x8000000000000000ULL;  // variant 1
  char buf[40];
  std::snprintf(
      buf, sizeof buf, "%08llx-%04llx-%04llx-%04llx-%012llx",
      static_cast<unsigned long long>(a >> 32), static_cast<unsigned long long>((a >> 16) & 0xFFFF),
      static_cast<unsigned long long>(a & 0xFFFF), static_cast<unsigned long long>(b >> 48),
      static_cast<unsigned long long>(b & 0xFFFFFFFFFFFFULL));
  return buf;
}

}  // namespace

Worker::Worker(WorkerOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  if (!impl_->opt.executors.simulated || !impl_->opt.executors.commands)
    throw std::invalid_argument(
        "WorkerOptions::executors: both executors are required (Executors::Local() runs every "
        "stage on this host)");
  impl_->id = NewUuid();
  impl_->cache =
      std::make_unique<CacheRunner>(impl_->opt.home, impl_->opt.database_url, impl_->log);
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  impl_->name = std::string(host) + ":" + std::to_string(getpid());
  // Stages mostly wait, and their waits suspend their tasks (workers/pause.h): an arena as wide
  // as the cores runs a pool of any capacity (the capacity bounds what is claimed, not
  // threads). Two at least: a stage blocked briefly in a call (the catalog, sbatch, a copy
  // into the cache) leaves the other slot free. None reserved for the calling thread.
  int cores = static_cast<int>(std::max(2u, std::thread::hardware_concurrency()));
  int total = 0;
  for (const auto& p : impl_->opt.pools) {
    auto pool = std::make_unique<Pool>();
    pool->config = p;
    int width = std::min(std::max(1, p.capacity), cores);
    pool->arena = std::make_unique<tbb::task_arena>(width, 0);
    total += width;
    impl_->pools.push_back(std::move(pool));
  }
  // The most restrictive global_control in the process wins, so every Worker asks for at
  // least the same ceiling; the arenas' own limits bound the threads really used.
  impl_->parallelism = std::make_unique<tbb::global_control>(
      tbb::global_control::max_allowed_parallelism, static_cast<size_t>(std::max(total + 2, 64)));
}

Worker::~Worker() { Stop(); }

const std::string& Worker::id() const { return impl_->id; }

int Worker::running() const {
  std::scoped_lock lock(impl_->mu);
  return static_cast<int>(impl_->running.size());
}

void Worker::Start() {
  Impl& w = *impl_;
  SandboxDecision sandbox = DecideSandbox(w.opt.sandbox, CanSwitchUser());
  if (!sandbox.error.empty()) throw UserError(sandbox.error);
  if (!sandbox.warning.empty()) w.log->warn("{}", sandbox.warning);
  if (sandbox.enabled && (w.opt.job_uid_base <= 0 || w.opt.job_uid_base >= (1LL << 31)))
    throw UserError("job uid base " + std::to_string(w.opt.job_uid_base) +
                    " is not a valid unprivileged uid");
  if (std::string e = PrepareHome(w.opt.home, sandbox.enabled); !e.empty()) throw UserError(e);
  w.sandboxed = sandbox.enabled;
  if (sandbox.enabled) {
    w.namespaces.enabled = true;
    w.namespaces.bwrap = FindBwrap();
    if (w.namespaces.bwrap.empty())
      throw UserError(
          "the job sandbox runs every command in namespaces of its own with bubblewrap, which "
          "is not installed: `apt-get install bubblewrap` (ops/setup.sh does), or pass "
          "--no-sandbox where every job is trusted");
    w.namespaces.allow_network = w.opt.allow_network;
    w.namespaces.hidden = {ConfigDir(), w.opt.secrets_dir};
  }
  // Found (and on cgroup v2, the worker moved into its leaf) before any job starts.
  w.log->info("{}", CgroupHost::ForThisProcess().Describe());
  nlohmann::json pools = nlohmann::json::object();
  for (const auto& p : w.opt.pools) pools[p.name] = p.capacity;
  std::unique_ptr<schema::WorkerCatalog> cat;
  w.WithCatalog(cat, "register", [&](schema::WorkerCatalog& c) {
    c.RegisterWorker(w.id, w.name.substr(0, w.name.find(':')), getpid(), pools.dump(),
                     w.opt.only_run, std::filesystem::absolute(w.opt.home).string(), w.opt.lease_s,
                     w.opt.projects);
  });
  w.log->info("worker id={} name={} pools={}", w.id, w.name, pools.dump());
  w.lock_guard = std::make_unique<schema::MemberLockGuard>(
      w.opt.database_url, w.opt.member_lock_limit_s, w.opt.member_lock_every_s);
  w.lock_guard->Start();
  w.claiming = true;
  w.stopping = false;
  w.commit_thread = std::thread([&w] { w.CommitLoop(); });
  w.heartbeat_thread = std::thread([&w] { w.HeartbeatLoop(); });
  w.listen_thread = std::thread([&w] { w.ListenLoop(); });
  w.claim_thread = std::thread([&w] { w.ClaimLoop(); });
}

void Worker::Stop() {
  Impl& w = *impl_;
  if (!w.claim_thread.joinable()) return;
  w.claiming = false;
  w.claim_cv.notify_all();
  w.claim_thread.join();
  w.listen_thread.join();
  {
    // Let running stages finish within the grace period, then hand them back.
    std::unique_lock lock(w.mu);
    if (!w.idle_cv.wait_for(lock, std::chrono::duration<double>(w.opt.shutdown_grace_s),
                            [&] { return w.tasks == 0; })) {
      w.log->info("grace period over: stopping {} running stages", w.running.size());
      for (auto& [sid, r] : w.running) {
        int expected = static_cast<int>(StopReason::kNone);
        r->stop.compare_exchange_strong(expected, static_cast<int>(StopReason::kShutdown));
      }
      w.idle_cv.wait(lock, [&] { return w.tasks == 0; });
    }
  }
  w.stopping = true;
  w.commit_cv.notify_all();
  w.heartbeat_cv.notify_all();
  w.commit_thread.join();
  w.heartbeat_thread.join();
  w.lock_guard.reset();
  for (auto& p : w.pools) p->arena->terminate();
  std::unique_ptr<schema::WorkerCatalog> cat;
  try {
    cat = schema::OpenWorkerCatalog(w.opt.database_url);
    cat->StopWorker(w.id);
  } catch (const std::exception& e) {
    w.log->warn("could not record the stop: {}", e.what());
  }
  w.log->info("worker id={} stopped", w.id);
}

}  // namespace trnflow::workers
