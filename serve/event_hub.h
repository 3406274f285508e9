#pragma once
// EventHub: one LISTEN connection to the catalog (NOTIFY trnflow_changes, with polling as the
// safety net), fanned out to every event stream of the dashboard. It keeps the newest changes
// in memory; streams wait on it and never query the catalog while they follow along.
//
// In commit order, without losing any: change ids come from a sequence, in the order
// statements ran, while transactions commit in any order. So the hub passes changes on only
// up to the first id it cannot see (a hole): a transaction still running holds it, or one
// that rolled back burned it. It looks again every 50 ms; once every transaction that had begun
// writing when it first saw the hole has ended (the oldest running transaction is newer than a
// transaction id the hub took then) and the id is still not there, it never will be, and the
// hub moves on (after 30 s it
// moves on anyway, with a warning: an unrelated transaction open for minutes holds the
// horizon back too). Latest() is therefore settled: every change up to it is passed on or
// never existed.
//
// Thread-safe. Start() runs the listener on a thread of its own; Stop() ends it and wakes
// every waiting stream.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "schema/catalog_rows.h"

namespace trnflow::serve {

// One change as an event stream sends it: `id:`, `event: change`, its JSON as `data:`.
std::string ChangeEvent(const schema::ChangeRow& change);

// A change the hub holds, with its event text made once for every stream that sends it.
struct HeldChange {
  schema::ChangeRow row;
  std::string event;  // ChangeEvent(row)
};

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

  // The newest change id the hub has passed on; everything up to it is settled (above).
  int64_t Latest() const;
  struct Batch {
    std::vector<std::shared_ptr<const HeldChange>> changes;  // after the id asked for, oldest first
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
  std::deque<std::shared_ptr<const HeldChange>> recent_;  // guarded by mu_; ids ascending
  int64_t latest_ = 0;                    // guarded by mu_
  // The first id not yet seen while later ones are (0: none), and the transaction horizon
  // (xmax) when it was first seen. Loop() only.
  int64_t hole_at_ = 0;
  int64_t hole_horizon_ = 0;
  std::chrono::steady_clock::time_point hole_since_;
  std::atomic<bool> stop_{false};
  std::atomic<int> clients_{0};
  std::thread thread_;
};

}  // namespace trnflow::serve
