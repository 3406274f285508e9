#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>
#include <thread>

#include "common/log.h"
#include "sim/perf_model.h"
#include "workers/executor.h"

namespace trnflow::workers {
namespace {
constexpr double kNoticeSeconds = 120;  // EC2 spot interruption notice
// Checkpoint size: bf16 weights plus fp32 master weights and Adam moments for training state.
constexpr double kTrainStateBytesPerParameter = 14;
}  // namespace

ExecResult SimExecutor::Run(const ExecContext& ctx) {
  ExecResult r;
  const sim::Catalog& hw = sim::Catalog::Builtin();
  const sim::InstanceType* type = hw.FindInstance(ctx.spec.instance);
  if (!type || ctx.spec.workload_json.empty()) {
    r.outcome = Outcome::kUserError;
    r.message = "stage has no simulated workload or an unknown instance type";
    return r;
  }
  sim::Workload w;
  try {
    w = sim::WorkloadFromJson(ctx.spec.workload_json);
  } catch (const std::exception& e) {
    r.outcome = Outcome::kUserError;
    r.message = e.what();
    return r;
  }
  sim::Estimate est = sim::EstimateStage(w, *type, ctx.instance_count);
  double total = std::max(1.0, est.seconds);
  double done_before = ctx.progress * total;
  double remaining = total - done_before;

  // Spot interruptions arrive as a Poisson process over the instances of the stage.
  std::mt19937_64 rng(ctx.seed);
  double interrupt_at = std::numeric_limits<double>::infinity();
  if (ctx.market == Market::kSpot) {
    double per_second = sim::SpotInterruptionsPerHour(*type) * ctx.spot_rate_multiplier *
                        ctx.instance_count / 3600.0;
    if (per_second > 0) interrupt_at = std::exponential_distribution<double>(per_second)(rng);
  }
  double timeout_at = ctx.spec.timeout_s > 0 ? ctx.spec.timeout_s : std::numeric_limits<double>::infinity();
  double end = std::min({remaining, interrupt_at, timeout_at});

  // Simulated time passes at `speed` simulated seconds per wall second.
  auto start = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (elapsed < end) {
    if (ctx.stop_reason() != StopReason::kNone) break;
    double wall_left = (end - elapsed) / ctx.speed;
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(wall_left, 0.02)));
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() *
              ctx.speed;
  }
  elapsed = std::min(elapsed, end);
  r.sim_seconds = elapsed;

  // Durable progress: what the last checkpoint (or a checkpoint inside the notice) saved.
  auto checkpointed = [&](double at) {
    double done = done_before + at;
    double saved = done_before;
    if (ctx.spec.checkpoint.every_s > 0)
      saved = std::max(saved, std::floor(done / ctx.spec.checkpoint.every_s) *
                                  ctx.spec.checkpoint.every_s);
    if (ctx.spec.checkpoint.on_notice && w.kind == StageKind::kTrain) {
      double bytes = w.model.parameters * kTrainStateBytesPerParameter;
      double write_s = bytes / std::max(1e8, type->storage_write_gbps * 1e9 * ctx.instance_count);
      if (write_s <= kNoticeSeconds) saved = std::max(saved, done - kNoticeSeconds + write_s);
    }
    return std::min(saved, done);
  };

  if (ctx.stop_reason() != StopReason::kNone && elapsed < end) {
    r.outcome = Outcome::kCancelled;
    double saved = checkpointed(elapsed);
    r.progress_to = saved / total;
    r.lost_fraction = elapsed > 0 ? (done_before + elapsed - saved) / elapsed : 0;
    r.message = "stopped";
    return r;
  }
  if (end == remaining) {
    r.outcome = Outcome::kSucceeded;
    r.progress_to = 1;
    return r;
  }
  double saved = checkpointed(elapsed);
  r.progress_to = saved / total;
  r.lost_fraction = elapsed > 0 ? (done_before + elapsed - saved) / elapsed : 0;
  if (end == interrupt_at) {
    r.outcome = Outcome::kSpotInterruption;
    char buf[160];
    std::snprintf(buf, sizeof buf,
                  "spot interruption after %.2f simulated hours; progress %.1f%% -> %.1f%% saved",
                  elapsed / 3600, 100 * (done_before + elapsed) / total, 100 * r.progress_to);
    r.message = buf;
  } else {
    r.outcome = Outcome::kTimeout;
    r.message = "timed out after " + std::to_string(ctx.spec.timeout_s / 3600) + " simulated hours";
  }
  return r;
}

}  // namespace trnflow::workers
