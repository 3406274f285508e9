// One spot market for every executor (sim/spot_market.h): the same attempt seed gives the same
// interruption time whether the sim executor or the process executor runs the stage. Real
// executors, a real child process; no catalog.
#include "sim/spot_market.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "sim/catalog.h"
#include "sim/workload.h"
#include "workers/executor.h"

namespace fs = std::filesystem;
using namespace trnflow;

namespace {

constexpr const char* kInstance = "trn1.32xlarge";
constexpr double kMultiplier = 50;

const sim::InstanceType& Trn1() { return *sim::Catalog::Builtin().FindInstance(kInstance); }

// The first seed from `from` on whose market launches and reclaims after the notice.
uint64_t InterruptedSeed(uint64_t from) {
  for (uint64_t seed = from;; ++seed) {
    auto d = sim::DrawMarket(Trn1(), Market::kSpot, 1, kMultiplier, seed);
    if (!d.short_of_capacity && d.interrupt_at_s > 600 && d.interrupt_at_s < 1e7) return seed;
  }
}

workers::ExecContext SpotContext(uint64_t seed) {
  workers::ExecContext ctx;
  ctx.spec.name = "work";
  ctx.spec.instance = kInstance;
  ctx.spec.market = Market::kSpot;
  ctx.market = Market::kSpot;
  ctx.seed = seed;
  ctx.spot_rate_multiplier = kMultiplier;
  return ctx;
}

}  // namespace

TEST(SpotMarket, TheSeedAloneDecidesTheDraw) {
  uint64_t seed = InterruptedSeed(1);
  auto a = sim::DrawMarket(Trn1(), Market::kSpot, 1, kMultiplier, seed);
  std::mt19937_64 rng(seed);
  auto b = sim::DrawMarket(Trn1(), Market::kSpot, 1, kMultiplier, rng);
  EXPECT_EQ(a.interrupt_at_s, b.interrupt_at_s);
  EXPECT_NE(a.interrupt_at_s,
            sim::DrawMarket(Trn1(), Market::kSpot, 1, kMultiplier, InterruptedSeed(seed + 1))
                .interrupt_at_s);
  // On-demand is never reclaimed; more instances are reclaimed sooner.
  EXPECT_EQ(sim::DrawMarket(Trn1(), Market::kOnDemand, 1, kMultiplier, seed).interrupt_at_s,
            std::numeric_limits<double>::infinity());
  EXPECT_LT(sim::DrawMarket(Trn1(), Market::kSpot, 4, kMultiplier, seed).interrupt_at_s,
            a.interrupt_at_s);
}

TEST(SpotMarket, SimAndProcessExecutorsAreInterruptedAtTheSameTimeForTheSameSeed) {
  uint64_t seed = InterruptedSeed(7);
  const double at = sim::DrawMarket(Trn1(), Market::kSpot, 1, kMultiplier, seed).interrupt_at_s;

  // The sim executor: a training stage far longer than the market lets it run.
  workers::ExecContext sim_ctx = SpotContext(seed);
  sim::Workload w;
  w.kind = StageKind::kTrain;
  w.model = *sim::Catalog::Builtin().FindModel("llama-2-7b");
  w.tokens = 1e13;
  w.seq_len = 4096;
  w.tp = 8;
  sim_ctx.spec.kind = StageKind::kTrain;
  sim_ctx.spec.workload_json = sim::ToJson(w);
  sim_ctx.speed = at * 4;  // a quarter of a wall second to the interruption
  workers::ExecResult sim_r = workers::SimExecutor().Run(sim_ctx);
  ASSERT_EQ(sim_r.outcome, Outcome::kSpotInterruption) << sim_r.message;
  EXPECT_EQ(sim_r.sim_seconds, at);

  // The process executor: a command that ignores the notice's SIGTERM, so only the reclaim
  // (SIGKILL) ends it, at the same simulated second.
  fs::path dir = fs::temp_directory_path() / ("trnflow-spot-market-" + std::to_string(getpid()));
  fs::create_directories(dir / "logs");
  workers::ExecContext proc_ctx = SpotContext(seed);
  proc_ctx.spec.kind = StageKind::kRun;
  proc_ctx.spec.command.argv = {"bash", "-c", "trap '' TERM; sleep 60 & wait; sleep 60"};
  proc_ctx.workdir = dir.string();
  proc_ctx.run_dir = dir.string();
  proc_ctx.log_path = (dir / "logs" / "work.attempt-1.log").string();
  proc_ctx.checkpoint_dir = (dir / "checkpoint").string();
  proc_ctx.speed = at / 2;  // two wall seconds to the reclaim
  workers::ExecResult proc_r = workers::ProcessExecutor().Run(proc_ctx);
  fs::remove_all(dir);
  ASSERT_EQ(proc_r.outcome, Outcome::kSpotInterruption) << proc_r.message;
  EXPECT_NE(proc_r.message.find("SIGKILL at reclaim"), std::string::npos) << proc_r.message;
  // Killed at the reclaim, give or take the executor's poll (and a loaded host's delays).
  EXPECT_GE(proc_r.sim_seconds, at);
  EXPECT_LT(proc_r.sim_seconds, at * 2) << "reclaimed at " << proc_r.sim_seconds
                                          << " simulated seconds, drawn " << at;
}
