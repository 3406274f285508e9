#pragma once
// The cost plan of a pipeline before anything runs: per stage (matrix expanded) the simulated
// hours, dollars on the chosen market and on-demand, expected spot interruptions, and what
// serving stages deliver; totals and the critical path. JSON per PIPELINE-FORMAT.md.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/money.h"
#include "pipelines/pipeline.h"

namespace trnflow::pipelines {

struct StagePlan {
  std::string name;
  std::string kind;
  std::string instance;
  int count = 1;
  std::string market;
  double hours = 0;
  Money cost;
  Money on_demand_cost;
  double expected_interruptions = 0;
  Money expected_interruption_cost;  // work expected to be lost to interruptions
  bool cached = false;
  // The cheapest instance type that can run the same work, when it costs less.
  std::string cheaper_instance;
  Money cheaper_cost;
  double tokens_per_second = 0;
  double ms_per_token = 0;
  double ttft_ms = 0;
  double usd_per_million_tokens = 0;
};

struct Plan {
  std::string pipeline;
  std::vector<StagePlan> stages;
  double total_hours = 0;  // the critical path
  Money total_cost;
};

// `is_cached(key)`: whether the compile cache holds a graph for a compile stage's key (then
// the stage costs $0). Without it nothing counts as cached.
Plan MakePlan(const Pipeline& pipeline,
              const std::function<bool(const std::string&)>& is_cached = {});
std::string PlanToJson(const Plan& plan);
std::string PlanToTable(const Plan& plan);

}  // namespace trnflow::pipelines
