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
  int replicas_per_instance = 0; // deploy: replicas of tp_degree NeuronCores on each instance
  int active_sequences = 0;      // deploy: sequences each replica decodes per step
};

// One training step, from first principles (sim/README.md): FLOPs per token including
// causal attention and activation recomputation, tensor-parallel all-reduces over the
// chip-to-chip links, the pipeline bubble and the data-parallel gradient all-reduce over
// the instances' network. MFU follows from these.
struct TrainBreakdown {
  int tp = 1, pp = 1, dp = 1;       // parallel layout over count x NeuronCores
  int seq_len = 0;
  bool recompute = false;           // activations do not fit beside the sharded state
  double flops_per_token = 0;       // executed, incl. attention and recompute
  double sequences_per_step = 0;    // global batch
  double compute_s = 0;             // per step: matmuls at the training efficiency
  double tp_comm_s = 0;             // per step: tensor-parallel all-reduces
  double attention_s = 0;           // per step: unfused attention scores through HBM
  double bubble_s = 0;              // per step: pipeline fill and drain
  double dp_comm_s = 0;             // per step: gradient all-reduce across instances
  double step_s = 0;
  double tokens_per_second = 0;     // whole job
  double mfu = 0;                   // 6 x parameters x tokens/s over peak BF16
};
TrainBreakdown TrainStep(const Workload& w, const InstanceType& t, int count);

// One decode step (one output token for every sequence of the batch) and the prefill of one
// batch, for one replica of tp_degree NeuronCores (sim/README.md).
struct ServeBreakdown {
  int replicas = 1;                // per instance: `replicas`, or NeuronCores / tp_degree
  int active_sequences = 1;        // decoded per step: batch, or max_concurrency (server)
  double weights_ms = 0;           // weights streamed from HBM
  double kv_ms = 0;                // KV cache streamed from HBM (GQA: fewer KV heads)
  double compute_ms = 0;           // matmuls at the serving efficiency (large batches)
  double layer_ms = 0;             // per-layer fixed cost and per (sequence, head) cost
  double collective_ms = 0;        // two all-reduces per layer, growing with tp_degree
  double server_step_ms = 0;       // continuous-batching server: host work per step
  double ms_per_token = 0;
  int prefill_tokens = 0;          // the prompt padded to its context-encoding graph
  double prefill_compute_ms = 0;   // prompt FLOPs incl. attention quadratic in its length
  double prefill_attention_ms = 0; // unfused attention scores through HBM (inf2, trn1)
  double prefill_overhead_ms = 0;  // weights once, per-layer cost and collectives
  double ttft_ms = 0;
};
ServeBreakdown ServeStep(const Workload& w, const InstanceType& t);

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
