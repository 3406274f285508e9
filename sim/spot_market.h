#pragma once
// The spot market as one attempt meets it: whether the launch finds capacity, and when the
// market reclaims the instances. The one draw every executor uses (sim, process, and the sim
// executor inside a Slurm job), so the same seed gives the same market whichever runs the
// stage. Pure: randomness only from the seed handed in.
#include <cstdint>
#include <limits>
#include <random>
#include <string>

#include "common/stage_spec.h"
#include "sim/catalog.h"

namespace trnflow::sim {

struct MarketDraw {
  // InsufficientInstanceCapacity at launch: the attempt never starts.
  bool short_of_capacity = false;
  // Simulated seconds after launch when the market reclaims the instances (the two-minute
  // notice comes kSpotNoticeSeconds before, or at launch when that is sooner); infinity on
  // on-demand or when the rate is zero.
  double interrupt_at_s = std::numeric_limits<double>::infinity();
};

// Draws, in this order, from `rng`: the launch shortage (probability min(20%, 1% × multiplier)
// on spot, 0.1% on-demand), then on spot the interruption, a Poisson process over `instances`
// at SpotInterruptionsPerHour × `rate_multiplier`. The sim executor goes on drawing its
// metrics' jitter from the same engine.
MarketDraw DrawMarket(const InstanceType& type, Market market, int instances,
                      double rate_multiplier, std::mt19937_64& rng);
// The same from a fresh engine seeded with `seed` (the attempt's seed).
MarketDraw DrawMarket(const InstanceType& type, Market market, int instances,
                      double rate_multiplier, uint64_t seed);

// What an attempt that met a shortage says: "InsufficientInstanceCapacity: no TYPE MARKET
// capacity for N instance(s)".
std::string ShortageMessage(const InstanceType& type, Market market, int instances);

}  // namespace trnflow::sim
