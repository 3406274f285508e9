#include "sim/baseline.h"

#include <stdexcept>
#include <string>

#include "sim/perf_model.h"

namespace trnflow::sim {

const InstanceType& GpuBaseline() {
  const InstanceType* gpu = Catalog::Builtin().FindInstance(kGpuBaseline);
  if (!gpu)
    throw std::logic_error("the GPU baseline " + std::string(kGpuBaseline) +
                           " is missing from sim/instances.yaml");
  return *gpu;
}

std::optional<Money> GpuBaselineCost(const Workload& w, int count, Market market,
                                     bool first_attempt, double useful) {
  if (useful <= 0 || (w.kind != StageKind::kTrain && w.kind != StageKind::kDeploy &&
                      w.kind != StageKind::kBenchmark))
    return std::nullopt;
  const InstanceType& gpu = GpuBaseline();
  Estimate e = EstimateStage(w, gpu, count, first_attempt);
  if (e.work_seconds <= 0) return std::nullopt;
  return Charge(gpu.price(market == Market::kSpot), count, useful * e.work_seconds);
}

}  // namespace trnflow::sim
