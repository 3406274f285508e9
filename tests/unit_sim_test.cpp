#include <gtest/gtest.h>

#include "sim/catalog.h"
#include "sim/perf_model.h"

namespace trnflow::sim {

TEST(SimCatalog, HasTheInstancesAndModelsPipelinesName) {
  const Catalog& c = Catalog::Builtin();
  for (const char* name : {"trn1.2xlarge", "trn1.32xlarge", "inf2.xlarge", "inf2.48xlarge",
                           "c6i.xlarge"}) {
    const InstanceType* t = c.FindInstance(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_GT(t->on_demand_per_hour.micros(), 0) << name;
    EXPECT_LT(t->spot_per_hour, t->on_demand_per_hour) << name;
  }
  const InstanceType* trn = c.FindInstance("trn1.32xlarge");
  EXPECT_EQ(trn->chips, 16);
  EXPECT_EQ(trn->neuron_cores(), 32);
  for (const char* name : {"llama-2-7b", "llama-2-13b", "llama-2-70b", "bert-large",
                           "climate-emulator-1b"})
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
  double expected = 6 * w.model.parameters * w.tokens / (16 * 190e12 * TrainingMfu(t));
  EXPECT_NEAR(one.seconds - 600, expected, expected * 1e-9);
  // Twice the instances: faster, but not more than twice as fast.
  Estimate two = EstimateTrain(w, t, 2);
  EXPECT_LT(two.seconds, one.seconds);
  EXPECT_GT(two.seconds - 600, (one.seconds - 600) / 2);
  EXPECT_LE(TrainingMfu(t), 0.6);
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
