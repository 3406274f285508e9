#pragma once
// The GPU baseline: the instance type Neuron's savings are measured against ("what did Neuron
// save us": `trnflow spend --savings`, the ledger's baseline_usd, the dashboard). The one
// place its name and its pricing of a stage's work live. Pure.
#include <optional>
#include <string_view>

#include "common/money.h"
#include "common/stage_spec.h"
#include "sim/catalog.h"
#include "sim/workload.h"

namespace trnflow::sim {

inline constexpr std::string_view kGpuBaseline = "p4d.24xlarge";

// The baseline's entry in the built-in catalog.
const InstanceType& GpuBaseline();

// What `useful` (a share of the stage's work, 0..1) of `w` costs on `count` baseline instances
// in `market`. nullopt where the baseline changes nothing (compiles, no useful work) or
// the model has no estimate for it there: the stage costs the same on GPUs.
std::optional<Money> GpuBaselineCost(const Workload& w, int count, Market market,
                                     bool first_attempt, double useful);

}  // namespace trnflow::sim
