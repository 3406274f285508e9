#pragma once
// Waiting without holding a thread. A pool's stages run as tasks in a TBB arena only as wide
// as the machine's cores; a stage that waits (simulated time passing, a child process, a Slurm
// job, a cache entry being built) suspends its task and a timer thread resumes it, so the
// arena's few threads run other stages meanwhile instead of hundreds of threads sleeping.
namespace trnflow::workers {

// Marks the current thread as running a pool task that may suspend (the worker sets it
// around each stage). Outside such a scope PauseFor simply sleeps.
class SuspendableScope {
 public:
  SuspendableScope();
  ~SuspendableScope();
  SuspendableScope(const SuspendableScope&) = delete;
  SuspendableScope& operator=(const SuspendableScope&) = delete;
};

// Waits about `seconds` (a suspended task resumes on whichever arena thread is free).
void PauseFor(double seconds);

}  // namespace trnflow::workers
