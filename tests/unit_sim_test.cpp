#include <gtest/gtest.h>

#include "sim/catalog.h"
#include "sim/perf_model.h"

namespace trnflow::sim {

TEST(SimCatalog, HasTheInstancesAndModelsPipelinesName) {
  const Catalog& c = Catalog::Builtin();
  for (const char* name :
       {"trn1.2xlarge", "trn1.32xlarge", "inf2.xlarge", "inf2.48xlarge", "trn2.3xlarge",
        "trn2.48xlarge", "trn2u.48xlarge", "c6i.xlarge"}) {
    const InstanceType* t = c.FindInstance(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_GT(t->on_demand_per_hour.micros(), 0) << name;
    EXPECT_LT(t->spot_per_hour, t->on_demand_per_hour) << name;
  }
  const InstanceType* trn = c.FindInstance("trn1.32xlarge");
  EXPECT_EQ(trn->chips, 16);
  EXPECT_EQ(trn->neuron_cores(), 32);
  for (const char* name :
       {"llama-2-7b", "llama-2-13b", "llama-2-70b", "bert-large", "climate-emulator-1b",
        "llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "llama-3.2-1b", "llama-3.3-70b",
        "mistral-7b-v0.2", "qwen2.5-7b", "qwen2.5-72b"})
    EXPECT_NE(c.FindModel(name), nullptr) << name;
  // trn2: logical NeuronCores at the default LNC=2, 4 per chip, 24 GiB each.
  const InstanceType* trn2 = c.FindInstance("trn2.48xlarge");
  EXPECT_EQ(trn2->neuron_cores(), 64);
  EXPECT_EQ(trn2->physical_cores_per_chip * trn2->chips, 128);
  EXPECT_EQ(trn2->lnc, 2);
  EXPECT_EQ(c.FindInstance("trn2.3xlarge")->neuron_cores(), 4);
  for (const auto& t : c.instances())
    if (t.accelerator == "trainium" || t.accelerator == "inferentia")
      for (const char* what : {"specs", "price", "spot"})
        EXPECT_TRUE(t.sources.count(what)) << t.name << " has no source for its " << what;
}

TEST(SimCatalog, ModelShapesAddUpToTheirParameters) {
  // The published parameter counts of the catalog's decoders follow from their shapes
  // (gated MLP, untied embeddings; within 3%: tied embeddings and biases aside).
  for (const char* name : {"llama-2-7b", "llama-2-70b", "llama-3.1-8b", "llama-3.1-70b",
                           "llama-3.1-405b", "mistral-7b-v0.2", "qwen2.5-72b"}) {
    const Model& m = *Catalog::Builtin().FindModel(name);
    EXPECT_NEAR(ParametersFromShape(m) / m.parameters, 1.0, 0.03) << name;
  }
  EXPECT_EQ(Catalog::Builtin().FindInstance("trn9.huge"), nullptr);
}

TEST(PerfModel, TrainingTimeIsTokensOverTheStepsThroughput) {
  const Catalog& c = Catalog::Builtin();
  Workload w;
  w.kind = StageKind::kTrain;
  w.model = *c.FindModel("llama-2-7b");
  w.tokens = 1e9;
  w.seq_len = 4096;
  w.tp = 8;
  const InstanceType& t = *c.FindInstance("trn1.32xlarge");
  Estimate one = EstimateTrain(w, t, 1);
  TrainBreakdown b = TrainStep(w, t, 1);
  EXPECT_NEAR(one.work_seconds, w.tokens / b.tokens_per_second, one.work_seconds * 1e-9);
  EXPECT_DOUBLE_EQ(one.mfu, b.mfu);
  EXPECT_DOUBLE_EQ(one.seconds, one.setup_seconds + one.work_seconds);
  // The step is the sum of its parts; one instance has no gradient traffic over the network.
  EXPECT_NEAR(b.step_s, b.compute_s + b.tp_comm_s + b.bubble_s + b.dp_comm_s, b.step_s * 1e-12);
  EXPECT_EQ(b.dp_comm_s, 0);
  EXPECT_EQ(b.dp, 4);  // 32 NeuronCores / tp 8
  // Twice the instances: faster, but not more than twice as fast.
  Estimate two = EstimateTrain(w, t, 2);
  EXPECT_LT(two.work_seconds, one.work_seconds);
  EXPECT_GT(two.work_seconds, one.work_seconds / 2);
  EXPECT_GT(TrainStep(w, t, 2).dp_comm_s, 0);
  // Later attempts find the training graph compiled: less setup, same work.
  Estimate again = EstimateTrain(w, t, 1, /*first_attempt=*/false);
  EXPECT_LT(again.setup_seconds, one.setup_seconds);
  EXPECT_DOUBLE_EQ(again.work_seconds, one.work_seconds);
}

TEST(PerfModel, TrainingPhysics) {
  const Catalog& c = Catalog::Builtin();
  const InstanceType& trn1 = *c.FindInstance("trn1.32xlarge");
  const InstanceType& trn1n = *c.FindInstance("trn1n.32xlarge");
  Workload w;
  w.kind = StageKind::kTrain;
  w.model = *c.FindModel("llama-3.1-8b");
  w.tp = 8;
  // Attention grows with the sequence: more FLOPs per token at 8K than at 2K.
  w.seq_len = 2048;
  TrainBreakdown short_seq = TrainStep(w, trn1, 4);
  w.seq_len = 8192;
  TrainBreakdown long_seq = TrainStep(w, trn1, 4);
  EXPECT_GT(long_seq.flops_per_token, short_seq.flops_per_token);
  EXPECT_LT(long_seq.tokens_per_second, short_seq.tokens_per_second);
  // trn1n's network halves the gradient all-reduce.
  EXPECT_NEAR(TrainStep(w, trn1n, 16).dp_comm_s, TrainStep(w, trn1, 16).dp_comm_s / 2,
              TrainStep(w, trn1, 16).dp_comm_s * 1e-9);
  // Scaling from 1 to 32 instances: each instance keeps most, not all, of its throughput.
  double one_node = TrainStep(w, trn1, 1).tokens_per_second;
  double per_node_32 = TrainStep(w, trn1, 32).tokens_per_second / 32;
  EXPECT_LT(per_node_32, one_node);
  EXPECT_GT(per_node_32, 0.7 * one_node);
  // Pipeline parallelism costs a bubble; without it there is none.
  EXPECT_EQ(long_seq.bubble_s, 0);
  w.pp = 4;
  EXPECT_GT(TrainStep(w, trn1, 4).bubble_s, 0);
  // A 70B model at tp 8 on one instance cannot hold its activations beside its state:
  // it recomputes them (more FLOPs per token than the model needs).
  w.model = *c.FindModel("llama-3.1-70b");
  w.pp = 1;
  TrainBreakdown big = TrainStep(w, trn1, 32);
  EXPECT_TRUE(big.recompute);
  EXPECT_GT(big.flops_per_token, 6 * w.model.parameters + 6.0 * 80 * 8192 * 8192);
  // MFU follows from the parts and stays physical everywhere.
  for (const auto& t : c.instances())
    for (const auto& m : c.models()) {
      Workload any;
      any.kind = StageKind::kTrain;
      any.model = m;
      TrainBreakdown b = TrainStep(any, t, 1);
      EXPECT_LE(b.mfu, 0.6) << t.name << " " << m.name;
      EXPECT_GE(b.mfu, 0) << t.name << " " << m.name;
    }
}

TEST(PerfModel, ServingPhysics) {
  const Catalog& c = Catalog::Builtin();
  const InstanceType& inf2 = *c.FindInstance("inf2.48xlarge");
  Workload w;
  w.kind = StageKind::kDeploy;
  w.model = *c.FindModel("llama-2-13b");
  w.batch = 4;
  w.input_tokens = 1024;
  w.output_tokens = 1024;
  w.tp_degree = 24;
  ServeBreakdown mha = ServeStep(w, inf2);
  // Grouped-query attention (8 KV heads for 40) moves fewer KV-cache bytes per token.
  Workload gqa = w;
  gqa.model.kv_heads = 8;
  EXPECT_LT(ServeStep(gqa, inf2).kv_ms, mha.kv_ms);
  // Prefill is quadratic in the prompt (attention): four times the prompt costs more than
  // four times the compute.
  Workload longer = w;
  longer.input_tokens = 4096;
  EXPECT_GT(ServeStep(longer, inf2).prefill_compute_ms, 4 * mha.prefill_compute_ms);
  // Collectives grow with tp_degree; none on one core.
  Workload tp8 = w;
  tp8.tp_degree = 8;
  EXPECT_GT(mha.collective_ms, ServeStep(tp8, inf2).collective_ms);
  Workload tp1 = w;
  tp1.model = *c.FindModel("llama-3.2-1b");
  tp1.tp_degree = 1;
  EXPECT_EQ(ServeStep(tp1, inf2).collective_ms, 0);
  // Data-parallel replicas on one instance: a TP8 model on inf2.48xlarge runs three, and
  // the instance delivers three times one replica's tokens/s.
  EXPECT_EQ(ServeStep(tp8, inf2).replicas, 3);
  Estimate three = EstimateServe(tp8, inf2, 1);
  EXPECT_NEAR(three.tokens_per_second, 3 * tp8.batch * 1e3 / three.ms_per_token, 1e-6);
  // Fewer requests than a compiled batch still pay a whole batch.
  tp8.requests = 1;
  Workload full = tp8;
  full.requests = tp8.batch * 3;
  EXPECT_DOUBLE_EQ(EstimateServe(tp8, inf2, 1).work_seconds,
                   EstimateServe(full, inf2, 1).work_seconds);
}

// Prefill runs a static-shape context-encoding graph (sim/README.md): a static batch takes
// the smallest bucket that holds the prompt (powers of two from 128, then seq_len), a
// continuous-batching server (optimum-neuron) pads every prompt to its one graph of seq_len.
TEST(PerfModel, PrefillPadsThePromptToItsContextEncodingGraph) {
  const Catalog& c = Catalog::Builtin();
  const InstanceType& inf2 = *c.FindInstance("inf2.48xlarge");
  const InstanceType& trn2 = *c.FindInstance("trn2.3xlarge");
  Workload w;
  w.kind = StageKind::kDeploy;
  w.model = *c.FindModel("llama-3.1-8b");
  w.batch = 32;
  w.tp_degree = 4;
  w.input_tokens = 1500;
  w.output_tokens = 250;
  w.seq_len = 4096;
  EXPECT_EQ(ServeStep(w, inf2).prefill_tokens, 2048);
  Workload at = w;
  at.input_tokens = 2048;
  EXPECT_EQ(ServeStep(at, inf2).prefill_tokens, 2048);
  at.input_tokens = 10;
  EXPECT_EQ(ServeStep(at, inf2).prefill_tokens, 128);
  at.input_tokens = 3000;  // above the last power of two below seq_len: seq_len itself
  at.seq_len = 5000;
  EXPECT_EQ(ServeStep(at, inf2).prefill_tokens, 5000);
  Workload server = w;
  server.max_concurrency = 1;
  ServeBreakdown s = ServeStep(server, inf2);
  EXPECT_EQ(s.prefill_tokens, 4096);
  // A 1,500-token prompt costs the server what a 4,096-token one does, and more than the
  // 1,500 tokens alone would.
  Workload full = server;
  full.input_tokens = 4000;
  EXPECT_DOUBLE_EQ(ServeStep(full, inf2).ttft_ms, s.ttft_ms);
  Workload unpadded = server;
  unpadded.seq_len = 1500;
  EXPECT_GT(s.ttft_ms, 1.5 * ServeStep(unpadded, inf2).ttft_ms);
  // optimum-neuron runs its flash-attention kernel on NeuronCore-v2 graphs of 4,096 tokens
  // and more: no unfused scores there; below, they go through HBM.
  EXPECT_EQ(s.prefill_attention_ms, 0);
  EXPECT_GT(ServeStep(unpadded, inf2).prefill_attention_ms, 0);
  // NeuronCore-v3 sustains a larger share of its peak in prefill: trn2's one chip (TP4) is
  // faster per FLOP of peak than four NeuronCore-v2.
  ServeBreakdown v3 = ServeStep(server, trn2);
  double peak_v2 = 4 * inf2.bf16_tflops_per_chip / inf2.cores_per_chip;
  double peak_v3 = 4 * trn2.bf16_tflops_per_chip / trn2.cores_per_chip;
  EXPECT_LT(v3.prefill_compute_ms * peak_v3, 0.6 * s.prefill_compute_ms * peak_v2);
}

TEST(PerfModel, StaysPhysical) {
  const Catalog& c = Catalog::Builtin();
  for (const auto& t : c.instances())
    for (const auto& m : c.models()) {
      Workload w;
      w.kind = StageKind::kDeploy;
      w.model = m;
      w.input_tokens = 128;
      w.output_tokens = 128;
      w.requests = 1;
      for (int batch : {1, 8, 64}) {
        w.batch = batch;
        for (int tp : {1, 2, 8}) {
          int cores = t.cores_per_chip > 0 ? t.chips * t.cores_per_chip : t.chips;
          if (tp > cores || cores == 0) continue;
          w.tp_degree = tp;
          Estimate e = EstimateServe(w, t, 1);
          double bw = tp * t.hbm_gbps_per_chip / std::max(1, t.cores_per_chip) * 1e9;
          double floor_ms = 2 * m.parameters / bw * 1e3;  // every weight read once per token
          EXPECT_GE(e.ms_per_token, floor_ms) << t.name << " " << m.name << " tp " << tp;
        }
      }
    }
}

TEST(PerfModel, DecodeIsNeverFasterThanBandwidthAllows) {
  const Catalog& c = Catalog::Builtin();
  Workload w;
  w.kind = StageKind::kDeploy;
  w.model = *c.FindModel("llama-2-7b");
  w.tp_degree = 24;
  w.batch = 1;
  w.input_tokens = 128;
  w.output_tokens = 128;
  w.requests = 100;
  const InstanceType& t = *c.FindInstance("inf2.48xlarge");
  Estimate e = EstimateServe(w, t, 1);
  double floor_ms = w.model.parameters * 2 / (t.chips * t.hbm_gbps_per_chip * 1e9) * 1e3;
  EXPECT_GT(e.ms_per_token, floor_ms);
  EXPECT_GT(e.ttft_ms, 0);
  EXPECT_GT(e.seconds, 0);
}

TEST(PerfModel, CompileTakesLongerForBiggerModels) {
  const Catalog& c = Catalog::Builtin();
  Workload small, big;
  small.kind = big.kind = StageKind::kCompile;
  small.model = *c.FindModel("bert-large");
  big.model = *c.FindModel("llama-2-70b");
  const InstanceType& t = *c.FindInstance("trn1.2xlarge");
  EXPECT_NEAR(EstimateCompile(small, t).seconds / 60, 13, 2);
  double big_minutes = EstimateCompile(big, t).seconds / 60;
  EXPECT_GE(big_minutes, 30);
  EXPECT_LE(big_minutes, 60);
}

TEST(SpotMarket, RatesFollowTheFrequencyBucket) {
  InstanceType low, high;
  low.spot_interruption_bucket = "<5%";
  high.spot_interruption_bucket = ">20%";
  EXPECT_GT(SpotInterruptionsPerHour(high), SpotInterruptionsPerHour(low));
  // <5% a month: about 2.5% of instances, i.e. roughly one interruption per 29,000 hours.
  EXPECT_NEAR(1 / SpotInterruptionsPerHour(low), 29'000, 1'000);
}

}  // namespace trnflow::sim
