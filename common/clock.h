#pragma once
// Clock is injected wherever time decides behaviour (backoff, leases, cron) so tests can
// control it. SystemClock is the real one; ManualClock is moved by hand.
#include <atomic>
#include <chrono>

namespace trnflow {

using TimePoint = std::chrono::system_clock::time_point;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
};

class SystemClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::system_clock::now(); }
};

class ManualClock final : public Clock {
 public:
  explicit ManualClock(TimePoint start) : now_(start.time_since_epoch().count()) {}
  TimePoint Now() const override { return TimePoint(TimePoint::duration(now_.load())); }
  void Advance(std::chrono::microseconds d) {
    now_ += std::chrono::duration_cast<TimePoint::duration>(d).count();
  }

 private:
  std::atomic<TimePoint::rep> now_;
};

}  // namespace trnflow
