#include "sim/perf_model.h"

#include <algorithm>
#include <cmath>

namespace trnflow::sim {
namespace {

constexpr double kBytesBf16 = 2.0;
// Share of peak HBM bandwidth that decode sustains (reads of weights and KV cache).
constexpr double kDecodeBandwidthEfficiency = 0.60;
// Per-layer cost of the tensor-parallel collectives in a decode step (two all-reduces per
// layer), fixed part and part per sequence in the batch, in milliseconds.
constexpr double kCollectiveMsPerLayer = 0.108;
constexpr double kCollectiveMsPerLayerPerSeq = 0.020;
// Prefill runs compute bound at this utilization, plus per-layer launch and collective cost.
constexpr double kPrefillMfu = 0.30;
constexpr double kPrefillMsPerLayer = 0.70;
// Warm-up of a training job: graph load, data loader start, first-step tracing.
constexpr double kTrainWarmupSeconds = 600;
// Loading weights and the compiled graph onto the device before serving.
constexpr double kDeployLoadSeconds = 120;

double CoreBandwidthGBps(const InstanceType& t) {
  return t.cores_per_chip > 0 ? t.hbm_gbps_per_chip / t.cores_per_chip : t.hbm_gbps_per_chip;
}

double CoreTflops(const InstanceType& t) {
  return t.cores_per_chip > 0 ? t.bf16_tflops_per_chip / t.cores_per_chip
                              : t.bf16_tflops_per_chip;
}

int CoresPerInstance(const InstanceType& t) {
  return t.cores_per_chip > 0 ? t.chips * t.cores_per_chip : t.chips;
}

}  // namespace

double TrainingMfu(const InstanceType& t) {
  if (t.accelerator == "trainium") return t.family == "trn2" ? 0.30 : 0.35;
  if (t.accelerator == "gpu") return 0.40;
  if (t.accelerator == "inferentia") return 0.10;
  return 0.0;
}

Estimate EstimateTrain(const Workload& w, const InstanceType& t, int count) {
  Estimate e;
  double peak = t.chips * t.bf16_tflops_per_chip * 1e12 * count;
  // Data parallelism across instances loses a little per doubling to gradient all-reduce.
  double scaling = count > 1 ? std::pow(0.985, std::log2(static_cast<double>(count))) : 1.0;
  e.mfu = TrainingMfu(t) * scaling;
  if (peak <= 0 || e.mfu <= 0) return e;
  double flops = 6.0 * w.model.parameters * w.tokens;
  double compute_s = flops / (peak * e.mfu);
  e.tokens_per_second = w.tokens / compute_s;
  e.seconds = compute_s + kTrainWarmupSeconds;
  return e;
}

Estimate EstimateCompile(const Workload& w, const InstanceType&) {
  // Fitted to the Neuron compiler figures in calibration/targets.yaml: ~13 min for a
  // BERT-large graph, ~15 min for a 7B (15 GB) graph, 30-60 min for 70B-class models.
  Estimate e;
  double billions = w.model.parameters / 1e9;
  e.seconds = 60.0 * (12.95 + 0.197 * std::pow(billions, 1.2));
  return e;
}

Estimate EstimateServe(const Workload& w, const InstanceType& t, int count) {
  Estimate e;
  int tp = std::max(1, w.tp_degree);
  int cores = CoresPerInstance(t);
  if (cores <= 0) return e;
  int replicas = std::max(1, cores / tp) * count;
  double group_bw = tp * CoreBandwidthGBps(t) * 1e9 * kDecodeBandwidthEfficiency;  // bytes/s
  double group_flops = tp * CoreTflops(t) * 1e12;
  const Model& m = w.model;
  double weights = m.parameters * kBytesBf16;
  int batch = std::max(1, w.batch);
  double context = w.input_tokens + w.output_tokens / 2.0;
  double kv_head_share = m.heads > 0 ? static_cast<double>(m.kv_heads) / m.heads : 1.0;
  double kv = batch * m.layers * context * m.hidden * kv_head_share * 2 * kBytesBf16;
  double collective_ms =
      tp > 1 ? m.layers * (kCollectiveMsPerLayer + kCollectiveMsPerLayerPerSeq * batch) : 0.0;
  double memory_ms = (weights + kv) / group_bw * 1e3;
  double compute_ms = 2.0 * m.parameters * batch / group_flops * 1e3;
  e.ms_per_token = std::max(memory_ms, compute_ms) + collective_ms;
  double prefill_flops = 2.0 * m.parameters * w.input_tokens * batch;
  e.ttft_ms = prefill_flops / (group_flops * kPrefillMfu) * 1e3 + weights / group_bw * 1e3 +
              (tp > 1 ? m.layers * kPrefillMsPerLayer : 0.0);
  e.tokens_per_second = replicas * batch / (e.ms_per_token / 1e3);
  double serve_s = w.duration_s;
  if (serve_s <= 0 && w.requests > 0) {
    // Each batch of requests pays its prefill, then decodes the output tokens.
    double batches = std::ceil(w.requests / (static_cast<double>(batch) * replicas));
    serve_s = batches * (e.ttft_ms + w.output_tokens * e.ms_per_token) / 1e3;
  }
  e.seconds = kDeployLoadSeconds + serve_s;
  return e;
}

Estimate EstimateStage(const Workload& w, const InstanceType& t, int count) {
  switch (w.kind) {
    case StageKind::kTrain: return EstimateTrain(w, t, count);
    case StageKind::kCompile: return EstimateCompile(w, t);
    case StageKind::kDeploy:
    case StageKind::kBenchmark: return EstimateServe(w, t, count);
    case StageKind::kRun: break;
  }
  return {};
}

}  // namespace trnflow::sim

namespace trnflow::sim {
double SpotInterruptionsPerHour(const InstanceType& t) {
  const std::string& b = t.spot_interruption_bucket;
  double monthly = b == "<5%" ? 0.025 : b == "5-10%" ? 0.075 : b == "10-15%" ? 0.125
                 : b == "15-20%" ? 0.175 : 0.25;
  return -std::log(1.0 - monthly) / 730.0;
}
}  // namespace trnflow::sim
