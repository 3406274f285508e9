#include "sim/perf_model.h"

#include <algorithm>
#include <cmath>

#include "sim/feasibility.h"

namespace trnflow::sim {
namespace {

constexpr double kBytesBf16 = 2.0;

constexpr double kGB = 1e9;

// The constants below are the only fitted numbers of the performance model. They were fitted
// once on the `split: fit` rows of sim/benchmarks.yaml (minimizing the median |log(model /
// published)|) and are shared by every model and instance; tests/benchmarks_test.cpp reports
// the error on the `split: holdout` rows they never saw. See sim/README.md.
//
// Serving (decode and prefill), seconds unless named otherwise:
// Share of peak HBM bandwidth that streaming the weights sustains.
constexpr double kWeightStreamEfficiency = 0.60;
// Share of peak HBM bandwidth that reading the KV cache sustains (many small reads).
constexpr double kKvStreamEfficiency = 0.40;
// Fixed cost of one decoder layer in a decode step (kernel issue, norms, residuals).
constexpr double kDecodeLayerSeconds = 100e-6;
// Cost per (sequence, query head on a core, layer) of decode attention: one matrix-vector
// product per head that cannot fill the matrix engine.
constexpr double kDecodeHeadSeconds = 1.8e-6;
// Latency of one step of a collective (log2(tp) steps per all-reduce).
constexpr double kCollectiveStepSeconds = 2.1e-6;
// Share of peak BF16 FLOP/s that prefill (and compute-bound decode) sustains: on
// NeuronCore-v2 (inf2, trn1; fitted on the transformers-neuronx tables) and on NeuronCore-v3
// (trn2, whose releases prefill with NKI kernels written for it: fused QKV, MLP and flash
// attention; fitted on the one fit row of trn2, Qwen3-32B behind optimum-neuron's vLLM).
constexpr double kServeMatmulEfficiency = 0.30;
constexpr double kServeMatmulEfficiencyV3 = 0.56;
// Fixed cost of one decoder layer in prefill.
constexpr double kPrefillLayerSeconds = 175e-6;
// Fixed cost of one prefill: the prompt to the device and the first token back.
constexpr double kPrefillRequestSeconds = 3.0e-3;
// Unfused attention (issue 38): where attention runs without a fused (flash) kernel, every
// score of the heads x seq x seq matrix goes through HBM several times (scale, mask,
// softmax, dropout, and in training their backward passes), at the bandwidth of small reads
// (kKvStreamEfficiency). Bytes moved per score element and layer:
// training (forward + backward) and prefill (forward only).
constexpr double kTrainScoreBytes = 56;
constexpr double kPrefillScoreBytes = 24;
// A continuous-batching server (vLLM on Neuron; a deploy stage with max_concurrency): the
// host schedules, samples and detokenizes between device steps (async scheduling is off on
// Neuron), once per decode step. Per request it costs no more than any prefill
// (kPrefillRequestSeconds): what looked like 300 ms of it was the prompt's padding to the
// server's one context-encoding graph (PrefillTokens).
constexpr double kServerStepSeconds = 15e-3;
// Training:
// Share of peak BF16 FLOP/s that training matmuls sustain.
constexpr double kTrainMatmulEfficiency = 0.39;
// Share of the network (EFA) bandwidth the gradient all-reduce sustains.
constexpr double kNetworkEfficiency = 0.75;
// Not fitted: the global batch of a training step, in tokens (the published runs use 1,024
// sequences of 4,096 tokens), and the share of device memory usable for state + activations.
constexpr double kGlobalBatchTokens = 4.0 * 1024 * 1024;
constexpr double kUsableHbm = 0.9;
// Activation bytes per token per layer, before tensor-parallel sharding (Korthikanti et al.
// 2022, arXiv:2205.05198: 34 x hidden bytes per token per layer without the attention scores
// of flash attention).
constexpr double kActivationBytesPerHidden = 34;
// Warm-up of a training job: graph load, data loader start, first-step tracing.
constexpr double kTrainWarmupSeconds = 600;
// Loading weights and the compiled graph onto the device before serving.
constexpr double kDeployLoadSeconds = 120;

int CoresPerInstance(const InstanceType& t) {
  return t.cores_per_chip > 0 ? t.chips * t.cores_per_chip : t.chips;
}
// Per NeuronCore (or GPU): bytes/s of HBM, FLOP/s, bytes of HBM.
double CoreBandwidth(const InstanceType& t) {
  return t.hbm_gbps_per_chip * kGB / std::max(1, t.cores_per_chip);
}
double CoreFlops(const InstanceType& t) {
  return t.bf16_tflops_per_chip * 1e12 / std::max(1, t.cores_per_chip);
}
double CoreHbmBytes(const InstanceType& t) {
  return t.hbm_gib_per_chip * 1024.0 * 1024 * 1024 / std::max(1, t.cores_per_chip);
}
// Bytes/s a NeuronCore sends to the others of its tp group: its share of the chip's
// NeuronLink; within one chip (no link listed), through device memory.
double CoreLinkBandwidth(const InstanceType& t) {
  double chip = t.neuronlink_gbps_per_chip > 0 ? t.neuronlink_gbps_per_chip : t.hbm_gbps_per_chip;
  return chip * kGB / std::max(1, t.cores_per_chip);
}
// One ring all-reduce of `bytes` over `tp` cores: latency log2(tp) steps, bandwidth
// 2 (tp - 1) / tp x bytes over each core's link.
double AllReduceSeconds(double bytes, int tp, double link) {
  if (tp <= 1) return 0;
  return kCollectiveStepSeconds * std::log2(static_cast<double>(tp)) +
         2.0 * (tp - 1) / tp * bytes / link;
}
// Weights read per token: all but the input embedding table (only one row of it is read).
double WeightsRead(const Model& m) {
  double embedding = static_cast<double>(m.vocab) * m.hidden;
  return kBytesBf16 * std::max(0.5 * m.parameters, m.parameters - embedding);
}
double HeadDim(const Model& m) { return m.heads > 0 ? double(m.hidden) / m.heads : m.hidden; }
int CeilDiv(int a, int b) { return (a + b - 1) / b; }
bool HasFeature(const Model& m, const char* f) {
  return std::find(m.features.begin(), m.features.end(), f) != m.features.end();
}
// The training recipes of models with learned absolute positions (HuggingFace BERT,
// Megatron-LM / NeMo GPT on trn1) run attention unfused; the NxD recipes of the rotary
// (Llama-style) models use the fused attention kernel.
bool TrainsUnfusedAttention(const Model& m) { return HasFeature(m, "absolute_position"); }
// Serving on NeuronCore-v2 (inf2, trn1: transformers-neuronx and the NxD Inference of those
// releases) materializes the prompt's attention scores; trn2 (NeuronCore-v3) prefills with
// the flash-attention kernel.
bool PrefillsUnfusedAttention(const InstanceType& t) {
  return t.family == "inf2" || t.family == "trn1" || t.family == "trn1n";
}
bool NeuronCoreV3(const InstanceType& t) { return t.family == "trn2" || t.family == "trn2u"; }
double ServeMatmulEfficiency(const InstanceType& t) {
  return NeuronCoreV3(t) ? kServeMatmulEfficiencyV3 : kServeMatmulEfficiency;
}
// Prefill runs a static-shape context-encoding graph, so the prompt is padded to the graph's
// length. A continuous-batching server (optimum-neuron's vLLM integration) compiles one
// context-encoding graph at the sequence length and pads every prompt to it; a static batch
// (NxD Inference's and transformers-neuronx's buckets) takes the smallest bucket that holds
// the prompt, powers of two from 128 below the sequence length and the sequence length
// itself (NxD Inference's automatic buckets). Without a sequence length that holds the
// prompt, the power of two.
int PrefillTokens(int input, int seq_len, bool server) {
  int n = std::max(1, input);
  bool capped = seq_len >= n;
  if (server) return capped ? seq_len : n;
  int top = capped ? static_cast<int>(std::lround(std::log2(static_cast<double>(seq_len)))) : 31;
  for (int i = 7; i < top; ++i)
    if ((1 << i) >= n) return 1 << i;
  return capped ? seq_len : n;
}

}  // namespace

TrainBreakdown TrainStep(const Workload& w, const InstanceType& t, int count) {
  TrainBreakdown b;
  const Model& m = w.model;
  int cores = CoresPerInstance(t);
  int n = std::max(1, count);
  if (cores <= 0 || CoreFlops(t) <= 0 || m.parameters <= 0) return b;
  b.tp = std::max(1, w.tp);
  b.pp = std::max(1, w.pp);
  b.dp = std::max(1, cores * n / (b.tp * b.pp));
  b.seq_len = w.seq_len > 0 ? w.seq_len : (m.context > 0 ? m.context : 2048);
  double s = b.seq_len, h = m.hidden, layers = std::max(1, m.layers);
  double p = m.parameters;
  // FLOPs per token, forward + backward: 6 per parameter, and causal attention
  // (QK^T and PV over on average half the sequence): 6 x layers x seq x hidden.
  double model_flops = 6 * p + 6 * layers * s * h;
  // Memory per core: bf16 weights and gradients of its shard, fp32 master weights and Adam
  // moments sharded over the data-parallel ranks (ZeRO-1), activations of one microbatch
  // (one sequence) of its pipeline stage.
  double state = 4 * p / (b.tp * b.pp) + 12 * p / (double(b.tp) * b.pp * b.dp);
  double activations = s * h * (layers / b.pp) * kActivationBytesPerHidden / b.tp;
  b.recompute = state + activations > kUsableHbm * CoreHbmBytes(t);
  // Full recomputation runs the forward pass again: 2 more FLOPs per parameter, and the
  // attention forward again.
  b.flops_per_token = model_flops + (b.recompute ? 2 * p + 2 * layers * s * h : 0);
  // One microbatch (one sequence) through one pipeline stage of tp cores.
  double stage_compute =
      b.flops_per_token * s / (double(b.tp) * b.pp * CoreFlops(t) * kTrainMatmulEfficiency);
  // Per layer, two all-reduces forward and two backward of the activations (seq x hidden).
  double stage_tp = 4 * (layers / b.pp) * AllReduceSeconds(s * h * kBytesBf16, b.tp,
                                                           CoreLinkBandwidth(t));
  // Unfused attention: the score matrices of the core's heads through HBM, forward and
  // backward, per layer of the stage.
  double stage_attention =
      TrainsUnfusedAttention(m)
          ? (layers / b.pp) * CeilDiv(std::max(1, m.heads), b.tp) * s * s * kTrainScoreBytes /
                (CoreBandwidth(t) * kKvStreamEfficiency)
          : 0.0;
  double stage = stage_compute + stage_tp + stage_attention;
  b.sequences_per_step = w.global_batch > 0
                             ? std::max<double>(b.dp, w.global_batch)
                             : std::max<double>(b.dp, std::ceil(kGlobalBatchTokens / s));
  double microbatches = b.sequences_per_step / b.dp;
  b.compute_s = microbatches * stage_compute;
  b.tp_comm_s = microbatches * stage_tp;
  b.attention_s = microbatches * stage_attention;
  b.bubble_s = (b.pp - 1) * stage;
  // Gradient all-reduce across instances: each instance holds min(1, cores / (tp x pp)) of
  // the model (fp32 gradients, reduced inside the instance over NeuronLink first); model
  // replicas that span k instances form n / k groups over the network.
  double model_share = std::min(1.0, double(cores) / (b.tp * b.pp));
  double groups = n / std::max(1.0, double(b.tp) * b.pp / cores);
  double network = std::max(1.0, t.network_gbps) * kGB / 8 * kNetworkEfficiency;
  b.dp_comm_s = groups > 1 ? 2 * (groups - 1) / groups * 4 * p * model_share / network : 0;
  b.step_s = b.compute_s + b.tp_comm_s + b.attention_s + b.bubble_s + b.dp_comm_s;
  b.tokens_per_second = b.sequences_per_step * s / b.step_s;
  b.mfu = 6 * p * b.tokens_per_second / (double(cores) * n * CoreFlops(t));
  return b;
}

Estimate EstimateTrain(const Workload& w, const InstanceType& t, int count, bool first_attempt) {
  Estimate e;
  TrainBreakdown b = TrainStep(w, t, count);
  if (b.tokens_per_second <= 0) return e;
  e.mfu = b.mfu;
  e.tokens_per_second = b.tokens_per_second;
  e.work_seconds = w.tokens / b.tokens_per_second;
  e.setup_seconds =
      kTrainWarmupSeconds + (first_attempt ? EstimateCompile(w, t).work_seconds : 0.0);
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

ServeBreakdown ServeStep(const Workload& w, const InstanceType& t) {
  ServeBreakdown b;
  const Model& m = w.model;
  int tp = std::max(1, w.tp_degree);
  int cores = CoresPerInstance(t);
  if (cores <= 0 || CoreBandwidth(t) <= 0 || CoreFlops(t) <= 0) return b;
  b.replicas = w.replicas > 0 ? w.replicas : std::max(1, cores / tp);
  double bw = CoreBandwidth(t), flops = CoreFlops(t), link = CoreLinkBandwidth(t);
  double layers = std::max(1, m.layers), h = m.hidden;
  // With continuous batching the graph is compiled for `batch` sequences and at most
  // max_concurrency are in flight: a step decodes those (the weights stream all the same).
  bool server = w.max_concurrency > 0;
  int batch = server ? std::max(1, std::min(w.batch, w.max_concurrency)) : std::max(1, w.batch);
  b.active_sequences = batch;
  // Heads per core: query heads are split over the tp group; key/value heads too, but
  // with fewer KV heads than cores (grouped-query attention at large tp) each core keeps
  // a copy of one.
  int kv_heads = m.kv_heads > 0 ? m.kv_heads : std::max(1, m.heads);
  int q_per_core = CeilDiv(std::max(1, m.heads), tp);
  int kv_per_core = CeilDiv(kv_heads, tp);
  // Decode: one token per sequence; on average the context holds the prompt and half
  // the output.
  double context = w.input_tokens + w.output_tokens / 2.0;
  double kv_bytes_per_core =
      batch * layers * context * 2 /* k, v */ * kv_per_core * HeadDim(m) * kBytesBf16;
  b.weights_ms = WeightsRead(m) / (tp * bw * kWeightStreamEfficiency) * 1e3;
  b.kv_ms = kv_bytes_per_core / (bw * kKvStreamEfficiency) * 1e3;
  double efficiency = ServeMatmulEfficiency(t);
  b.compute_ms = (2 * m.parameters + 4 * layers * context * h) * batch /
                 (tp * flops * efficiency) * 1e3;
  b.layer_ms = layers * (kDecodeLayerSeconds + batch * q_per_core * kDecodeHeadSeconds) * 1e3;
  b.collective_ms = layers * 2 * AllReduceSeconds(batch * h * kBytesBf16, tp, link) * 1e3;
  b.server_step_ms = server ? kServerStepSeconds * 1e3 : 0.0;
  b.ms_per_token = std::max(b.weights_ms + b.kv_ms, b.compute_ms) + b.layer_ms +
                   b.collective_ms + b.server_step_ms;
  // Prefill: the whole prompt of every sequence, compute bound; causal attention costs
  // 2 x layers x n^2 x hidden FLOPs per sequence; the LM head runs on the last token. n is
  // the prompt padded to its context-encoding graph (PrefillTokens). A server prefills each
  // request as it arrives (one sequence); a static batch prefills all of its sequences
  // together.
  if (server) batch = 1;
  int padded = PrefillTokens(w.input_tokens, w.seq_len, server);
  b.prefill_tokens = padded;
  double n = padded;
  double embedding = static_cast<double>(m.vocab) * h;
  double body = std::max(0.5 * m.parameters, m.parameters - 2 * embedding);
  double prefill_flops = batch * (2 * body * n + 2 * layers * n * n * h + 2 * embedding);
  b.prefill_compute_ms = prefill_flops / (tp * flops * efficiency) * 1e3;
  b.prefill_overhead_ms =
      b.weights_ms + kPrefillRequestSeconds * 1e3 +
      layers * (kPrefillLayerSeconds +
                               2 * AllReduceSeconds(batch * n * h * kBytesBf16, tp, link)) *
                         1e3;
  // Unfused prefill attention: the core's query heads' n x n scores through HBM per layer.
  // optimum-neuron's server on NeuronCore-v2 (one core per logical core) runs its flash
  // attention kernel on context-encoding graphs of 4,096 tokens and more.
  bool unfused = PrefillsUnfusedAttention(t) && !(server && padded >= 4096);
  b.prefill_attention_ms = unfused ? batch * layers * q_per_core * n * n * kPrefillScoreBytes /
                                         (bw * kKvStreamEfficiency) * 1e3
                                   : 0.0;
  b.ttft_ms = b.prefill_compute_ms + b.prefill_attention_ms + b.prefill_overhead_ms;
  return b;
}

Estimate EstimateServe(const Workload& w, const InstanceType& t, int count) {
  Estimate e;
  ServeBreakdown b = ServeStep(w, t);
  if (b.ms_per_token <= 0) return e;
  int replicas = b.replicas * std::max(1, count);
  int batch = b.active_sequences;
  e.ms_per_token = b.ms_per_token;
  e.ttft_ms = b.ttft_ms;
  e.replicas_per_instance = b.replicas;
  e.active_sequences = batch;
  // Every replica decodes a full compiled batch at once.
  e.tokens_per_second = replicas * batch / (e.ms_per_token / 1e3);
  double serve_s = w.duration_s;
  if (serve_s <= 0 && w.requests > 0) {
    // Requests fill compiled batches on every replica; each batch pays its prefill, then
    // decodes the output tokens. A last, partial batch costs as much as a full one.
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
      int replicas = w.replicas > 0 ? w.replicas : std::max(1, cores / tp);
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
