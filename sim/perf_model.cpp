#include "sim/perf_model.h"

#include <algorithm>
#include <cmath>

#include "sim/feasibility.h"

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
  return t.cores_per_chip > 0 ? t.bf16_tflops_per_chip / t.cores_per_chip : t.bf16_tflops_per_chip;
}

int CoresPerInstance(const InstanceType& t) {
  return t.cores_per_chip > 0 ? t.chips * t.cores_per_chip : t.chips;
}

}  // namespace

double TrainingMfu(const InstanceType& t, double parameters) {
  double best = t.accelerator == "trainium"     ? (t.family == "trn2" ? 0.30 : 0.35)
                : t.accelerator == "gpu"        ? 0.40
                : t.accelerator == "inferentia" ? 0.10
                                                : 0.0;
  // Models under ~7B cannot keep the matrix engines busy: 60% of the best at 100M
  // parameters, rising with log size to the best at 7B and above.
  double size =
      std::clamp(std::log10(std::max(parameters, 1e8) / 1e8) / std::log10(70.0), 0.0, 1.0);
  return best * (0.6 + 0.4 * size);
}

double ScalingEfficiency(const InstanceType& t, int count) {
  if (count <= 1) return 1.0;
  // Gradient all-reduce cost grows with log2(instances) and shrinks with the network:
  // 16 x trn1.32xlarge (800 Gbps EFA) keep ~94%.
  double network = std::max(1.0, t.network_gbps);
  return 1.0 / (1.0 + 0.045 * std::log2(static_cast<double>(count)) * std::sqrt(100.0 / network));
}

Estimate EstimateTrain(const Workload& w, const InstanceType& t, int count, bool first_attempt) {
  Estimate e;
  double peak = t.chips * t.bf16_tflops_per_chip * 1e12 * count;
  e.mfu = TrainingMfu(t, w.model.parameters) * ScalingEfficiency(t, count);
  if (peak <= 0 || e.mfu <= 0) return e;
  double flops = 6.0 * w.model.parameters * w.tokens;
  e.work_seconds = flops / (peak * e.mfu);
  e.tokens_per_second = w.tokens / e.work_seconds;
  Workload graph = w;
  e.setup_seconds =
      kTrainWarmupSeconds + (first_attempt ? EstimateCompile(graph, t).work_seconds : 0.0);
  e.seconds = e.setup_seconds + e.work_seconds;
  return e;
}

Estimate EstimateCompile(const Workload& w, const InstanceType&) {
  // Fitted to the Neuron compiler figures in calibration/targets.yaml: ~13 min for a
  // BERT-large graph, ~15 min for a 7B (15 GB) graph, 30-60 min for 70B-class models.
  Estimate e;
  double billions = w.model.parameters / 1e9;
  e.work_seconds = 60.0 * (12.95 + 0.197 * std::pow(billions, 1.2));
  e.seconds = e.work_seconds;
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
  e.setup_seconds = kDeployLoadSeconds;
  e.work_seconds = serve_s;
  e.seconds = e.setup_seconds + e.work_seconds;
  return e;
}

Estimate EstimateStage(const Workload& w, const InstanceType& t, int count, bool first_attempt) {
  switch (w.kind) {
    case StageKind::kTrain:
      return EstimateTrain(w, t, count, first_attempt);
    case StageKind::kCompile:
      return EstimateCompile(w, t);
    case StageKind::kDeploy:
    case StageKind::kBenchmark:
      return EstimateServe(w, t, count);
    case StageKind::kRun:
      break;
  }
  return {};
}

}  // namespace trnflow::sim

namespace trnflow::sim {
double SpotInterruptionsPerHour(const InstanceType& t) {
  const std::string& b = t.spot_interruption_bucket;
  double monthly = b == "<5%"      ? 0.025
                   : b == "5-10%"  ? 0.075
                   : b == "10-15%" ? 0.125
                   : b == "15-20%" ? 0.175
                                   : 0.25;
  return -std::log(1.0 - monthly) / 730.0;
}
}  // namespace trnflow::sim

namespace trnflow::sim {
double OnNoticeLossSeconds(const Workload& w, const InstanceType& t, int count) {
  constexpr double kCheckpointBytesPerParameter = 14;  // bf16 weights + fp32 master + Adam
  double bytes = w.model.parameters * kCheckpointBytesPerParameter;
  double write_s = bytes / std::max(1e8, t.storage_write_gbps * 1e9 * std::max(1, count));
  return write_s <= kSpotNoticeSeconds ? kSpotNoticeSeconds - write_s : -1;
}

Metrics StageMetrics(const Workload& w, const InstanceType& t, int count) {
  Metrics m;
  m.hbm_total_gib = t.hbm_gib();
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  switch (w.kind) {
    case StageKind::kTrain: {
      Estimate e = EstimateTrain(w, t, count);
      m.neuroncore_utilization = std::min(1.0, e.mfu / 0.6 + 0.25);  // busy beyond pure MFU
      m.hbm_used_gib = std::min(m.hbm_total_gib, TrainingStateBytes(w.model) / count / kGiB +
                                                     0.15 * m.hbm_total_gib);  // + activations
      break;
    }
    case StageKind::kDeploy:
    case StageKind::kBenchmark: {
      Estimate e = EstimateServe(w, t, count);
      int tp = std::max(1, w.tp_degree);
      int cores = t.cores_per_chip > 0 ? t.chips * t.cores_per_chip : t.chips;
      int replicas = std::max(1, cores / tp);
      double per_replica = WeightBytes(w.model) + KvCacheBytes(w.model, std::max(1, w.batch),
                                                               w.input_tokens + w.output_tokens);
      m.hbm_used_gib = std::min(m.hbm_total_gib, replicas * per_replica / kGiB);
      // Decode is memory bound: the engines idle while weights stream in.
      double compute_ms = 2.0 * w.model.parameters * std::max(1, w.batch) /
                          (tp * t.bf16_tflops_per_chip / std::max(1, t.cores_per_chip) * 1e12) *
                          1e3;
      m.neuroncore_utilization =
          e.ms_per_token > 0 ? std::min(1.0, 0.1 + compute_ms / e.ms_per_token) : 0;
      break;
    }
    default:
      break;  // compile runs on the host CPUs
  }
  return m;
}
}  // namespace trnflow::sim
