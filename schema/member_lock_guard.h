#pragma once
// The lock guard (docs/security.md, "Attacks"): a member can SET its own lock and idle timeouts
// to nothing and hold a lock the daemons need (a transaction open on its run's row). The guard
// ends the session of any member whose lock one of this catalog's daemon sessions has waited on
// for longer than `limit_s` (trnflow.end_member_blockers; the limit is the daemons', not a
// setting a member can change). Its own thread and connection, so a blocked service cannot
// stall it. Every daemon runs one: the scheduler while it leads, and each worker, so a worker's
// commit is not held up on a fleet whose scheduler is down.
#include <atomic>
#include <functional>
#include <string>
#include <thread>

namespace trnflow::schema {

class MemberLockGuard {
 public:
  // `active`: whether to act on this tick (the scheduler: while it leads); null: always.
  MemberLockGuard(std::string database_url, double limit_s, double every_s,
                  std::function<bool()> active = nullptr);
  ~MemberLockGuard();  // Stop()
  MemberLockGuard(const MemberLockGuard&) = delete;
  MemberLockGuard& operator=(const MemberLockGuard&) = delete;
  void Start();  // no-op when limit_s <= 0
  void Stop();

 private:
  void Loop();
  std::string url_;
  double limit_s_, every_s_;
  std::function<bool()> active_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace trnflow::schema
