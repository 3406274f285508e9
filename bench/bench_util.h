#pragma once
// Small helpers the benchmark programs share.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

namespace trnflow::bench {

using Clock = std::chrono::steady_clock;

// The server the benchmarks create their databases on (the local one of ops/setup.sh).
inline std::string AdminUrl() {
  const char* url = std::getenv("TRNFLOW_TEST_ADMIN_URL");
  return url && *url ? url : "postgresql://trnflow:trnflow@localhost:5432/postgres";
}

inline double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

}  // namespace trnflow::bench
