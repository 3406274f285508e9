// The committer: one thread with its own catalog connection writes the attempts' results in
// batches (up to commit_batch; a burst of results ending together is gathered for at most
// 2 ms), fenced on the lease (a stale result, its lease taken over, is dropped), and in the
// same transaction claims what is ready for the pools' free instances (CompleteAndClaim), so
// the dependents a batch releases start here without another round trip; those claims go
// through the claimer's RunClaimed. A failed commit is retried until it succeeds, also while
// stopping; the thread ends once the worker is stopping, no task runs and no result is left.
#include "workers/worker_impl.h"

namespace trnflow::workers {

void Worker::Impl::CommitLoop() {
  std::unique_ptr<schema::WorkerCatalog> cat;
  while (true) {
    std::vector<schema::AttemptResult> batch;
    {
      std::unique_lock lock(mu);
      commit_cv.wait(lock, [&] { return !results.empty() || (stopping && tasks == 0); });
      if (results.empty()) return;
      // Short stages launched together end together: while others still run, wait until
      // results stop coming (0.3 ms without a new one, 2 ms at most) so a burst goes in one
      // transaction rather than one each.
      auto deadline = Steady::now() + std::chrono::milliseconds(2);
      for (size_t seen = results.size();
           tasks > 0 && static_cast<int>(seen) < opt.commit_batch && Steady::now() < deadline;
           seen = results.size()) {
        auto until = std::min(deadline, Steady::now() + std::chrono::microseconds(300));
        if (!commit_cv.wait_until(lock, until, [&] { return results.size() != seen; })) break;
      }
      while (!results.empty() && static_cast<int>(batch.size()) < opt.commit_batch) {
        batch.push_back(std::move(results.front()));
        results.pop_front();
      }
    }
    // The same transaction claims what is ready for the pools' free instances, the stages
    // this batch releases among them: a chain's next link starts without another round trip.
    std::vector<schema::WorkerCatalog::ClaimRequest> requests;
    std::vector<std::pair<Pool*, int>> reserved;
    if (claiming)
      for (auto& p : pools)
        if (int n = p->ReserveFree(); n > 0) {
          requests.push_back({p->config.name, n});
          reserved.push_back({p.get(), n});
        }
    // A retry after a lost reply is harmless: writes are fenced on the lease (a claim whose
    // reply was lost expires and is rescued, as any claim's).
    schema::WorkerCatalog::Committed done;
    WithCatalog(
        cat, "commit",
        [&](schema::WorkerCatalog& c) {
          done = c.CompleteAndClaim(batch, requests, id, name, opt.lease_s, opt.only_run,
                                    opt.projects);
          if (done.applied.size() < batch.size())
            log->warn("{} of {} results were stale (lease taken over) and were dropped",
                      batch.size() - done.applied.size(), batch.size());
        },
        /*give_up_on_stop=*/false);
    for (size_t i = 0; i < reserved.size(); ++i) {
      auto& [pool, n] = reserved[i];
      std::vector<schema::ClaimedStage> claimed;
      if (i < done.claimed.size()) claimed = std::move(done.claimed[i]);
      pool->used -= n - Instances(claimed);
      if (!claimed.empty()) RunClaimed(cat, *pool, claimed);
    }
  }
}

}  // namespace trnflow::workers
