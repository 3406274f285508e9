#include "sim/spot_market.h"

#include <algorithm>

#include "sim/perf_model.h"

namespace trnflow::sim {
namespace {
// InsufficientInstanceCapacity at launch, per attempt. The spot figure scales with the run's
// spot rate multiplier (at most 20%); on-demand shortages are rarer and do not.
constexpr double kSpotShortage = 0.01;
constexpr double kMaxSpotShortage = 0.2;
constexpr double kOnDemandShortage = 0.001;
}  // namespace

MarketDraw DrawMarket(const InstanceType& type, Market market, int instances,
                      double rate_multiplier, std::mt19937_64& rng) {
  MarketDraw d;
  double shortage = market == Market::kSpot
                        ? std::min(kMaxSpotShortage, kSpotShortage * rate_multiplier)
                        : kOnDemandShortage;
  d.short_of_capacity = std::uniform_real_distribution<double>(0.0, 1.0)(rng) < shortage;
  if (d.short_of_capacity || market != Market::kSpot) return d;
  double per_second = SpotInterruptionsPerHour(type) * rate_multiplier * instances / 3600.0;
  if (per_second > 0) d.interrupt_at_s = std::exponential_distribution<double>(per_second)(rng);
  return d;
}

std::string ShortageMessage(const InstanceType& type, Market market, int instances) {
  return "InsufficientInstanceCapacity: no " + type.name + " " + std::string(ToString(market)) +
         " capacity for " + std::to_string(instances) + " instance(s)";
}

MarketDraw DrawMarket(const InstanceType& type, Market market, int instances,
                      double rate_multiplier, uint64_t seed) {
  std::mt19937_64 rng(seed);
  return DrawMarket(type, market, instances, rate_multiplier, rng);
}

}  // namespace trnflow::sim
