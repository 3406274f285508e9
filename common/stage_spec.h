#pragma once
// StageSpec is what one stage needs at run time, fully resolved (expressions substituted,
// matrix expanded, defaults applied). pipelines/ produces it, the catalog stores it as JSON
// with the stage, workers/ reads it back. It knows nothing of YAML, SQL or threads.
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace trnflow {

enum class StageKind { kRun, kTrain, kCompile, kDeploy, kBenchmark };
enum class Market { kOnDemand, kSpot };
enum class StageState {
  kBlocked,
  kReady,
  kRunning,
  kRetryWait,
  kSucceeded,
  kCached,
  kFailed,
  kSkipped,
  kCancelled
};
enum class Outcome {
  kSucceeded,
  kCached,
  kFailed,
  kSpotInterruption,
  kCapacityUnavailable,
  kLost,
  kTimeout,
  kInfraError,
  kUserError,
  kCancelled,
  kBudgetExceeded
};

std::string_view ToString(StageKind);
std::string_view ToString(Market);
std::string_view ToString(StageState);
std::string_view ToString(Outcome);
std::optional<StageKind> ParseStageKind(std::string_view);
std::optional<Market> ParseMarket(std::string_view);
std::optional<StageState> ParseStageState(std::string_view);
std::optional<Outcome> ParseOutcome(std::string_view);

// Preemptions are the market taking the instance away; they draw on their own budget.
bool IsPreemption(Outcome);
bool IsTerminal(StageState);

struct Backoff {
  double initial_s = 30;
  double factor = 2;
  double max_s = 600;
  bool operator==(const Backoff&) const = default;
};

struct RetryPolicy {
  int max_attempts = 1;  // attempts allowed for errors (infra_error, timeout, ...)
  std::vector<Outcome> on = {Outcome::kSpotInterruption, Outcome::kCapacityUnavailable,
                             Outcome::kLost, Outcome::kInfraError, Outcome::kTimeout};
  Backoff backoff;
  int max_interruptions = 6;              // preemption budget
  std::string then_market = "on-demand";  // after the preemption budget: on-demand | fail
  bool operator==(const RetryPolicy&) const = default;
};

struct CheckpointPolicy {
  double every_s = 0;  // 0: the stage does not checkpoint
  bool on_notice = false;
  bool operator==(const CheckpointPolicy&) const = default;
};

struct CommandSpec {
  std::vector<std::string> argv;  // for shell: {"<script>"}, run under /bin/sh -c
  bool shell = false;
  std::map<std::string, std::string> env;
  // Secrets by name only: the worker resolves their values on its own host when the stage runs
  // (never stored in the catalog) and masks them in the captured output.
  std::vector<std::string> secrets;
  // What the command writes, as paths under `${{ run.dir }}/` (relative to it here): hashed
  // into the stage's output digest, stored by the cache and restored on a hit. Absent: the
  // stage declared nothing (its outputs are unknown); empty: it writes nothing.
  std::optional<std::vector<std::string>> outputs;
  // `network: host`: the command shares the worker's network (when the worker allows it,
  // `trnflow worker --allow-network`); otherwise it has a network namespace with loopback only.
  bool network = false;
};

struct StageSpec {
  std::string name;
  StageKind kind = StageKind::kRun;
  std::string instance;
  int count = 1;
  Market market = Market::kOnDemand;
  CommandSpec command;        // kind run
  std::string workload_json;  // sim stages: sim::Workload as JSON (see sim/workload.h)
  RetryPolicy retry;
  CheckpointPolicy checkpoint;
  double timeout_s = 0;  // 0: none
  // Order among the project's own ready stages (higher first; -1000..1000): `priority:` of the
  // stage, else of its pipeline. Never in a cache key; never ahead of another project's share.
  int priority = 0;
  // run: stages: `estimate:`, how long the command is expected to run (simulated seconds; 0:
  // not given). A budgeted attempt without a timeout reserves it, with a margin.
  double estimate_s = 0;
  // Compile stages: the key is known from the file (sha256 of cache_inputs, the canonical JSON
  // of everything that changes the graph). Other stages with cache: true get theirs when they
  // run, over their kind, parameters and the digests of what they consume.
  bool cache = false;
  std::string cache_key;
  std::string cache_inputs;
};

// The expressions a pipeline leaves for run time, `${{ run.id }}` and `${{ run.dir }}`,
// substituted in `text` once the run exists.
std::string SubstituteRunExpressions(const std::string& text, const std::string& run_id,
                                     const std::string& run_dir);

// Compact: the name, kind, instance, count and market, and of the rest only what differs from
// a default StageSpec (a no-op stage's spec is ~120 bytes, not ~650: the stage row is smaller
// to insert, to copy on every state change and to ship with every claim).
std::string ToJson(const StageSpec&);
// Reads ToJson's compact form and the full form older catalogs hold (every field written).
// Throws std::runtime_error on malformed JSON (the catalog only holds what ToJson wrote).
StageSpec StageSpecFromJson(std::string_view json);

}  // namespace trnflow
