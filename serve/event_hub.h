#pragma once
// EventHub: one LISTEN connection to the catalog (NOTIFY trnflow_changes, with polling as the
// safety net), fanned out to every event stream of the dashboard. It keeps the newest changes
// in memory; streams wait on it and never query the catalog while they follow along.
//
// Thread-safe. Start() runs the listener on a thread of its own; Stop() ends it and wakes
// every waiting stream.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "schema/catalog.h"

namespace trnflow::serve {

class EventHub {
 public:
  EventHub(std::string database_url, size_t keep = 8192);
  ~EventHub();
  EventHub(const EventHub&) = delete;
  EventHub& operator=(const EventHub&) = delete;

  // Reads the newest change id (throws CatalogUnavailable) and starts listening.
  void Start();
  void Stop();
  bool stopped() const { return stop_; }

  // The newest change id the hub has seen.
  int64_t Latest() const;
  struct Batch {
    std::vector<schema::ChangeRow> changes;  // after the id asked for, oldest first
    bool gap = false;  // the hub no longer holds what follows that id: read it from the catalog
  };
  // Changes after `after`; when there are none, waits up to `timeout_s` for some.
  Batch Wait(int64_t after, double timeout_s);

  // Event streams: at most `max` at once; false when full.
  bool TryAddClient(int max);
  void RemoveClient();
  int clients() const { return clients_; }

 private:
  void Loop();

  std::string url_;
  size_t keep_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<schema::ChangeRow> recent_;  // guarded by mu_
  int64_t latest_ = 0;                    // guarded by mu_
  std::atomic<bool> stop_{false};
  std::atomic<int> clients_{0};
  std::thread thread_;
};

}  // namespace trnflow::serve
