#include <gtest/gtest.h>

#include "sim/catalog.h"
#include "sim/perf_model.h"

namespace trnflow::sim {

TEST(SimCatalog, HasTheInstancesAndModelsPipelinesName) {
  const Catalog& c = Catalog::Builtin();
  for (const char* name :
       {"trn1.2xlarge", "trn1.32xlarge", "inf2.xlarge", "inf2.48xlarge", "c6i.xlarge"}) {
    const InstanceType* t = c.FindInstance(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_GT(t->on_demand_per_hour.micros(), 0) << name;
    EXPECT_LT(t->spot_per_hour, t->on_demand_per_hour) << name;
  }
  const InstanceType* trn = c.FindInstance("trn1.32xlarge");
  EXPECT_EQ(trn->chips, 16);
  EXPECT_EQ(trn->neuron_cores(), 32);
  for (const char* name :
       {"llama-2-7b", "llama-2-13b", "llama-2-70b", "bert-large", "climate-emulator-1b"})
    EXPECT_NE(c.FindModel(name), nullptr) << name;
  EXPECT_EQ(c.FindInstance("trn9.huge"), nullptr);
}

TEST(PerfModel, TrainingTimeFollowsSixNTOverPeakTimesMfu) {
  const Catalog& c = Catalog::Builtin();
  Workload w;
  w.kind = StageKind::kTrain;
  w.model = *c.FindModel("llama-2-7b");
  w.tokens = 1e9;
  const InstanceType& t = *c.FindInstance("trn1.32xlarge");
  Estimate one = EstimateTrain(w, t, 1);
  double expected =
      6 * w.model.parameters * w.tokens / (16 * 190e12 * TrainingMfu(t, w.model.parameters));
  EXPECT_NEAR(one.work_seconds, expected, expected * 1e-9);
  EXPECT_DOUBLE_EQ(one.seconds, one.setup_seconds + one.work_seconds);
  // Twice the instances: faster, but not more than twice as fast.
  Estimate two = EstimateTrain(w, t, 2);
  EXPECT_LT(two.work_seconds, one.work_seconds);
  EXPECT_GT(two.work_seconds, one.work_seconds / 2);
  // Later attempts find the training graph compiled: less setup, same work.
  Estimate again = EstimateTrain(w, t, 1, /*first_attempt=*/false);
  EXPECT_LT(again.setup_seconds, one.setup_seconds);
  EXPECT_DOUBLE_EQ(again.work_seconds, one.work_seconds);
}

TEST(PerfModel, StaysPhysical) {
  const Catalog& c = Catalog::Builtin();
  for (const auto& t : c.instances())
    for (const auto& m : c.models()) {
      EXPECT_LE(TrainingMfu(t, m.parameters), 0.6) << t.name << " " << m.name;
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
