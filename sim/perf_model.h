#pragma once
// The performance model: how long a workload takes on `count` instances of a type, and what
// it delivers. Pure functions of their arguments; the formulas and constants are documented
// in sim/README.md.
#include <string>

#include "sim/catalog.h"
#include "sim/workload.h"

namespace trnflow::sim {

struct Estimate {
  double seconds = 0;            // simulated duration of the stage: setup + work
  double setup_seconds = 0;      // graph compilation / warm-up / model load: not progress
  double work_seconds = 0;       // the work itself, which checkpoints measure
  double tokens_per_second = 0;  // train: whole stage; deploy: output tokens, whole instance
  double ms_per_token = 0;       // deploy: decode latency per token at the batch
  double ttft_ms = 0;            // deploy: time to first token
  double mfu = 0;                // train: model FLOPs utilization used
};

// Model FLOPs utilization for training a model of `parameters` on this accelerator (before
// multi-node scaling): the family's best, less for small models that cannot fill the chips.
double TrainingMfu(const InstanceType& t, double parameters);
// Data-parallel efficiency across `count` instances over the instance's network.
double ScalingEfficiency(const InstanceType& t, int count);
// `first_attempt`: the training graph is compiled (neuron_parallel_compile) before step one;
// later attempts find it cached and only warm up and load the checkpoint.
Estimate EstimateTrain(const Workload& w, const InstanceType& t, int count,
                       bool first_attempt = true);
// Wall seconds of the Neuron compiler for one graph of this workload.
Estimate EstimateCompile(const Workload& w, const InstanceType& t);
Estimate EstimateServe(const Workload& w, const InstanceType& t, int count);
// Dispatches on w.kind. A run: stage has no model estimate (seconds = 0).
Estimate EstimateStage(const Workload& w, const InstanceType& t, int count,
                       bool first_attempt = true);

// Spot notice before an instance is reclaimed, seconds.
inline constexpr double kSpotNoticeSeconds = 120;
// With checkpoint.on_notice, the work an interruption loses: the notice less the time to
// write the training state (14 bytes/parameter) to the instances' local storage. Negative
// when the state cannot be written inside the notice (the last periodic checkpoint counts).
double OnNoticeLossSeconds(const Workload& w, const InstanceType& t, int count);

// What neuron-monitor would show while the stage runs: NeuronCore utilization and device
// memory in use per instance.
struct Metrics {
  double neuroncore_utilization = 0;  // 0..1
  double hbm_used_gib = 0;
  double hbm_total_gib = 0;
};
Metrics StageMetrics(const Workload& w, const InstanceType& t, int count);

}  // namespace trnflow::sim

namespace trnflow::sim {
// Interruptions per instance-hour on spot, from the Spot Advisor frequency bucket (the share of
// instances interrupted in a month, bucket midpoint) as a Poisson rate.
double SpotInterruptionsPerHour(const InstanceType& t);
}  // namespace trnflow::sim
