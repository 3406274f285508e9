#pragma once
// Scheduler runs the leader-only maintenance services on one thread with one catalog
// connection: each tick it takes or confirms leadership, then runs every service that is
// due (promoter, rescuer, run finisher), each on its own interval with jitter; a second thread
// ends members' sessions that block the daemons (the lock guard). A failing
// tick is logged and the loop carries on; a lost connection is re-opened with backoff (and
// leadership re-contested). Start/Stop may be called from any one thread.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

namespace trnflow::schema {
class SchedulerCatalog;
class MemberLockGuard;
}

namespace trnflow::scheduler {

// The cron service's tick: fires every schedule's due slots (those after its last slot, up to
// `now`) under its catch-up policy — all: each missed slot; latest: only the newest; none:
// only a slot that is on time (within two minutes) — each at most once whichever scheduler
// fires it. Returns the runs submitted. Leader-only in the daemon; callable from tests.
int FireDueSchedules(schema::SchedulerCatalog& catalog, std::chrono::system_clock::time_point now);

// `trnflow schedule run NAME`: fires the schedule now, as its cron would — the same snapshot,
// params, project, speed and workdir, submitted through the same function (so the same quotas
// and permission checks), a market seeded by the moment — recorded as a manual fire. The
// cron's slots are untouched: a due slot still fires under the catch-up policy. Throws
// UserError for no such schedule, a paused one, or a snapshot that no longer validates.
int64_t FireScheduleNow(schema::SchedulerCatalog& catalog, const std::string& name);

struct SchedulerOptions {
  std::string database_url;
  double tick_s = 0.25;  // how often leadership and due services are checked
  double promote_every_s = 0.5;
  double rescue_every_s = 1.0;
  double finish_every_s = 2.0;
  double budget_every_s = 1.0;
  double cron_every_s = 5.0;
  // The ledger's monthly partitions (migration 0031): the current UTC month's and
  // partitions_ahead months after it are made if missing, hourly.
  double partitions_every_s = 3600.0;
  int partitions_ahead = 3;
  // The lock guard (its own thread and connection, so a blocked service cannot stall it): a
  // member's session holding a lock that one of the daemons' sessions has waited on for longer
  // than member_lock_limit_s is ended (schema/member_lock_guard.h; workers run one too). A
  // member can SET its own timeouts to nothing; this limit is the daemons'. 0: off.
  double member_lock_limit_s = 5.0;
  double member_lock_every_s = 1.0;
  uint64_t seed = 0;  // jitter of intervals and of retry backoff
};

class Scheduler {
 public:
  explicit Scheduler(SchedulerOptions options);
  ~Scheduler();  // stops the loop
  void Start();
  void Stop();
  bool is_leader() const { return leader_.load(); }

 private:
  void Loop();
  SchedulerOptions options_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> leader_{false};
  std::thread thread_;
  std::unique_ptr<schema::MemberLockGuard> guard_;
};

}  // namespace trnflow::scheduler
