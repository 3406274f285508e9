#pragma once
// The cost plan of a pipeline before anything runs: per stage (matrix expanded) the simulated
// hours, dollars on the chosen market and on-demand, expected spot interruptions, and what
// serving stages deliver; totals and the critical path. JSON per PIPELINE-FORMAT.md.
//
// Where each stage's length comes from (EstimateSource): simulated stages from the
// performance model; `run:` stages from their `estimate:`, else from the median of their past
// runs (the caller looks those up), else they are unknown: counted at the 60-second billing
// minimum, listed in Plan::unknown_stages and labelled, so the total is a floor, never a
// silent $0. Pure: no I/O; the caller supplies the cache and the history.
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/money.h"
#include "pipelines/pipeline.h"

namespace trnflow::pipelines {

enum class EstimateSource { kModel, kEstimate, kHistory, kUnknown, kCache };
// "model", "estimate", "history", "unknown", "cache"
std::string_view ToString(EstimateSource source);

// A run: stage's past: the median simulated seconds of its succeeded attempts, and of how
// many runs.
struct StageHistory {
  double median_seconds = 0;
  int runs = 0;
  double median_wall_seconds = 0;  // what the command took in wall time (for PlanInputs::speed)
};

struct StagePlan {
  std::string name;
  StageKind kind = StageKind::kRun;
  std::string instance;
  int count = 1;
  std::string market;
  double hours = 0;
  Money cost;
  Money on_demand_cost;
  double expected_interruptions = 0;
  Money expected_interruption_cost;  // work expected to be lost to interruptions
  bool cached = false;
  EstimateSource source = EstimateSource::kModel;
  int history_runs = 0;  // source kHistory: how many past runs the median is of
  // The cheapest instance type that can run the same work, when it costs less.
  std::string cheaper_instance;
  Money cheaper_cost;
  double tokens_per_second = 0;
  double ms_per_token = 0;
  double ttft_ms = 0;
  double mfu = 0;  // train: model FLOPs utilization the performance model derives
  double usd_per_million_tokens = 0;
  // deploy, benchmark: how each instance is shared, and one replica's and one instance's
  // output tokens/s (tokens_per_second above is the whole stage: every instance).
  int replicas_per_instance = 0;
  int tp_degree = 0;
  int max_concurrency = 0;  // 0: static batches
  double replica_tokens_per_second = 0;
  double instance_tokens_per_second = 0;
};

struct Plan {
  std::string pipeline;
  std::vector<StagePlan> stages;
  double total_hours = 0;  // the critical path
  Money total_cost;  // with unknown stages at their billing minimum: then a floor
  std::vector<std::string> unknown_stages;  // run: stages of unknown length, in file order
  double speed = 0;  // PlanInputs::speed
};

struct PlanInputs {
  // Whether the compile cache holds a graph for a compile stage's key (then the stage costs
  // $0). Unset: nothing counts as cached.
  std::function<bool(const std::string&)> is_cached;
  // The past of a run: stage without `estimate:`, by its (expanded) name; nullopt when it has
  // none. Unset: no history.
  std::function<std::optional<StageHistory>(const std::string&)> history;
  // `plan --speed S`: a run: stage's past is planned at S, as a run at S would bill it (its
  // median wall time x S). 0: as it ran (its median simulated time). `estimate:` is simulated
  // time and is not scaled.
  double speed = 0;
};

// `is_cached(key)`: whether the compile cache holds a graph for a compile stage's key (then
// the stage costs $0). Without it nothing counts as cached.
Plan MakePlan(const Pipeline& pipeline,
              const std::function<bool(const std::string&)>& is_cached = {});
Plan MakePlan(const Pipeline& pipeline, const PlanInputs& inputs);
std::string PlanToJson(const Plan& plan);
std::string PlanToTable(const Plan& plan);

}  // namespace trnflow::pipelines
