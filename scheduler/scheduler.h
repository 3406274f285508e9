#pragma once
// Scheduler runs the leader-only maintenance services on one thread with one catalog
// connection: each tick it takes or confirms leadership, then runs every service that is
// due (promoter, rescuer, run finisher), each on its own interval with jitter. A failing
// tick is logged and the loop carries on; a lost connection is re-opened with backoff (and
// leadership re-contested). Start/Stop may be called from any one thread.
#include <atomic>
#include <memory>
#include <string>
#include <thread>

namespace trnflow::scheduler {

struct SchedulerOptions {
  std::string database_url;
  double tick_s = 0.25;  // how often leadership and due services are checked
  double promote_every_s = 0.5;
  double rescue_every_s = 1.0;
  double finish_every_s = 2.0;
  double budget_every_s = 1.0;
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
};

}  // namespace trnflow::scheduler
