// Heartbeats: one thread with its own catalog connection renews every lease of this
// incarnation in one statement each heartbeat_s (or at once when the LISTEN loop hears a
// cancel), carrying each running attempt's live progress and its latest metrics. From the
// answer it stops what must stop, by setting the attempt's StopReason (the executor sees it
// through ExecContext::stop): a stage of a cancelled run (kCancelled, or kBudgetExceeded when
// the run went over budget) and a stage whose lease this worker no longer holds (kLeaseLost:
// taken over; its result will be discarded). Only attempts running before the statement was
// sent are judged by its answer. It runs until Stop() sets `stopping`.
#include <set>
#include <utility>

#include "workers/worker_impl.h"

namespace trnflow::workers {

void Worker::Impl::HeartbeatLoop() {
  std::unique_ptr<schema::WorkerCatalog> cat;
  while (!stopping) {
    // Only stages that were running before the query can be judged by its answer.
    std::vector<std::pair<int64_t, std::shared_ptr<Running>>> before;
    {
      std::scoped_lock lock(mu);
      for (auto& [sid, r] : running) before.push_back({sid, r});
    }
    std::vector<schema::LeaseKey> held;
    std::vector<schema::EventRow> metrics;
    std::vector<schema::LiveReport> reports;
    for (auto& [sid, r] : before) {
      std::scoped_lock lock(r->metrics_mu);
      reports.push_back({sid, r->live_known, r->live.progress, r->live.checkpointed,
                         r->live.sim_seconds, r->live.eta_s});
      if (!r->metrics_dirty) continue;
      metrics.push_back({r->claim.run_id, sid, "metrics", "neuron-monitor", r->metrics});
      r->metrics_dirty = false;
    }
    bool ok = WithCatalog(cat, "heartbeat", [&](schema::WorkerCatalog& c) {
      held = c.HeartbeatLeases(id, opt.lease_s, reports);
      c.InsertEvents(metrics);
    });
    if (ok) {
      std::set<std::pair<int64_t, int>> keys;
      for (const auto& k : held) {
        keys.insert({k.stage_id, k.attempt});
        if (!k.run_cancelled) continue;
        std::scoped_lock lock(mu);
        if (auto it = running.find(k.stage_id); it != running.end()) {
          int expected = static_cast<int>(StopReason::kNone);
          Outcome reason = k.cancel_reason.value_or(Outcome::kCancelled);
          auto why = reason == Outcome::kBudgetExceeded ? StopReason::kBudgetExceeded
                                                        : StopReason::kCancelled;
          if (it->second->stop.compare_exchange_strong(expected, static_cast<int>(why)))
            log->info("run cancelled ({}): stopping stage={}", schema::ToSql(reason), k.stage_id);
        }
      }
      for (auto& [sid, r] : before) {
        if (keys.count({sid, r->claim.attempt})) continue;
        {
          // Finished meanwhile (and perhaps committed): nothing left to stop.
          std::scoped_lock lock(mu);
          auto it = running.find(sid);
          if (it == running.end() || it->second != r) continue;
        }
        int expected = static_cast<int>(StopReason::kNone);
        if (r->stop.compare_exchange_strong(expected, static_cast<int>(StopReason::kLeaseLost)))
          log->warn("lease lost stage={} attempt={}: stopping it, its result will be discarded",
                    sid, r->claim.attempt);
      }
    }
    std::unique_lock lock(mu);
    heartbeat_cv.wait_for(lock, std::chrono::duration<double>(opt.heartbeat_s),
                          [&] { return wake_heartbeat || stopping.load(); });
    wake_heartbeat = false;
  }
}

}  // namespace trnflow::workers
