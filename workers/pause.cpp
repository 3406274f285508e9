#include "workers/pause.h"

#include <tbb/task.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

namespace trnflow::workers {
namespace {

using Clock = std::chrono::steady_clock;

// Set while this thread runs a stage's task. A task resumed after a pause may continue on
// another thread, so PauseFor sets it again there.
thread_local bool suspendable = false;

// One thread per process that resumes suspended tasks when their time comes.
class Timer {
 public:
  static Timer& Get() {
    static Timer* timer = new Timer;  // never destroyed: no ordering trouble at exit
    return *timer;
  }
  void Add(Clock::time_point at, tbb::task::suspend_point tag) {
    {
      std::scoped_lock lock(mu_);
      due_.emplace(at, tag);
    }
    cv_.notify_one();
  }

 private:
  Timer() { std::thread([this] { Loop(); }).detach(); }
  void Loop() {
    std::unique_lock lock(mu_);
    while (true) {
      if (due_.empty()) {
        cv_.wait(lock);
        continue;
      }
      auto first = due_.begin();
      if (first->first > Clock::now()) {
        cv_.wait_until(lock, first->first);
        continue;
      }
      tbb::task::suspend_point tag = first->second;
      due_.erase(first);
      tbb::task::resume(tag);
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<Clock::time_point, tbb::task::suspend_point> due_;
};

}  // namespace

SuspendableScope::SuspendableScope() { suspendable = true; }
SuspendableScope::~SuspendableScope() { suspendable = false; }

void PauseFor(double seconds) {
  auto d = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  if (d <= Clock::duration::zero()) return;
  if (!suspendable) {
    std::this_thread::sleep_for(d);
    return;
  }
  auto at = Clock::now() + d;
  suspendable = false;  // this thread runs other tasks meanwhile
  tbb::task::suspend([at](tbb::task::suspend_point tag) { Timer::Get().Add(at, tag); });
  suspendable = true;  // perhaps another thread: the task goes on here
}

}  // namespace trnflow::workers
