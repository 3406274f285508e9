// Simulated train/compile/deploy/benchmark stages: simulated time passes at the run's speed;
// spot interruptions and capacity shortages come from the attempt's seed (reproducible from
// the run's seed); checkpoints bound what an interruption loses.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "common/log.h"
#include "sim/feasibility.h"
#include "sim/perf_model.h"
#include "sim/spot_market.h"
#include "workers/executor.h"
#include "workers/pause.h"

namespace trnflow::workers {
namespace {
constexpr double kMetricsEverySimSeconds = 600;
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
  // The market first (sim/spot_market.h: the draw every executor makes from the seed), then
  // the metrics' jitter from the same engine.
  std::mt19937_64 rng(ctx.seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const sim::MarketDraw market =
      sim::DrawMarket(*type, ctx.market, ctx.instance_count, ctx.spot_rate_multiplier, rng);
  if (market.short_of_capacity) {
    r.outcome = Outcome::kCapacityUnavailable;
    r.progress_to = ctx.progress;
    r.message = sim::ShortageMessage(*type, ctx.market, ctx.instance_count);
    return r;
  }

  sim::Estimate est = sim::EstimateStage(w, *type, ctx.instance_count, ctx.attempt == 1);
  double setup = est.setup_seconds;
  double work = std::max(1.0, est.work_seconds);
  double done_before = ctx.progress * work;
  double end_of_stage = setup + (work - done_before);

  // Deterministic compiler failures surface once the compiler has run for a while.
  std::optional<sim::CompileOutcome> compile_failure;
  if (w.kind == StageKind::kCompile) {
    sim::CompileOutcome o = sim::PredictCompile(hw, w, *type);
    if (!o.ok) {
      compile_failure = o;
      end_of_stage = std::min(end_of_stage, 0.2 * work);
    }
  }

  const double interrupt_at = market.interrupt_at_s;
  double timeout_at =
      ctx.spec.timeout_s > 0 ? ctx.spec.timeout_s : std::numeric_limits<double>::infinity();
  SpendCap spend(ctx);  // topped up while it runs when its reservation falls short
  double end = std::min({end_of_stage, interrupt_at, timeout_at, spend.cap()});

  sim::Metrics metrics = sim::StageMetrics(w, *type, ctx.instance_count);
  auto report = [&](double at) {
    if (!ctx.report_metrics || w.kind == StageKind::kCompile) return;
    // neuron-monitor jitters around the steady state.
    double util = std::clamp(metrics.neuroncore_utilization * (0.97 + 0.06 * unit(rng)), 0.0, 1.0);
    nlohmann::json j = {{"neuroncore_utilization", std::round(util * 1000) / 1000},
                        {"hbm_used_gib", std::round(metrics.hbm_used_gib * 10) / 10},
                        {"hbm_total_gib", metrics.hbm_total_gib},
                        {"sim_hours", std::round(at / 36) / 100}};
    ctx.report_metrics(j.dump());
  };

  // What periodic checkpoints have saved by simulated time `at`, in seconds of work.
  auto periodic = [&](double at) {
    double done = done_before + std::max(0.0, at - setup);
    double saved = done_before;
    if (ctx.spec.checkpoint.every_s > 0)
      saved = std::max(
          saved, std::floor(done / ctx.spec.checkpoint.every_s) * ctx.spec.checkpoint.every_s);
    return std::clamp(saved, done_before, done);
  };
  auto report_progress = [&](double at) {
    if (!ctx.report_progress) return;
    LiveProgress p;
    p.progress = std::min(1.0, (done_before + std::max(0.0, at - setup)) / work);
    p.checkpointed = std::min(1.0, periodic(at) / work);
    p.sim_seconds = at;
    p.eta_s = std::max(0.0, end_of_stage - at);  // unless the market or a failure intervenes
    ctx.report_progress(p);
  };

  // Simulated time passes at `speed` simulated seconds per wall second.
  auto start = ctx.claimed_at;
  double elapsed = 0, next_metrics = 0;
  while (elapsed < end) {
    if (ctx.stop_reason() != StopReason::kNone) break;
    if (elapsed >= next_metrics && elapsed >= setup) {
      report(elapsed);
      next_metrics = elapsed + kMetricsEverySimSeconds;
    }
    report_progress(elapsed);
    if (end == spend.cap() && end < end_of_stage)
      end = std::min({end_of_stage, interrupt_at, timeout_at, spend.At(elapsed)});
    double wall_left = (end - elapsed) / ctx.speed;
    PauseFor(std::min(wall_left, 0.02));
    elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() * ctx.speed;
  }
  elapsed = std::min(elapsed, end);
  r.sim_seconds = elapsed;

  // Durable progress: what the last checkpoint (or one written inside the notice) saved.
  auto checkpointed = [&](double at) {
    double worked = std::max(0.0, at - setup);
    double done = done_before + worked;
    double saved = periodic(at);
    if (ctx.spec.checkpoint.on_notice && w.kind == StageKind::kTrain && worked > 0) {
      double loss = sim::OnNoticeLossSeconds(w, *type, ctx.instance_count);
      if (loss >= 0) saved = std::max(saved, done - loss);
    }
    return std::clamp(saved, done_before, done);
  };
  auto finish_partial = [&](double at) {
    double saved = checkpointed(at);
    r.progress_to = saved / work;
    // Wasted: the work done since the last checkpoint, which the next attempt redoes.
    double worked = std::max(0.0, at - setup);
    double useful = saved - done_before;
    r.lost_fraction = at > 0 ? std::clamp((worked - useful) / at, 0.0, 1.0) : 0;
  };

  if (ctx.stop_reason() != StopReason::kNone && elapsed < end) {
    r.outcome = Outcome::kCancelled;
    finish_partial(elapsed);
    r.message = "stopped";
    return r;
  }
  if (compile_failure && end == end_of_stage) {
    r.outcome = Outcome::kUserError;
    r.progress_to = 0;
    r.lost_fraction = 1;
    r.message = compile_failure->message + " (hint: " + compile_failure->hint + ")";
    return r;
  }
  if (end == end_of_stage) {
    report(elapsed);
    r.outcome = Outcome::kSucceeded;
    r.progress_to = 1;
    return r;
  }
  finish_partial(elapsed);
  char buf[200];
  if (end == spend.cap()) {
    r.outcome = Outcome::kBudgetExceeded;
    std::snprintf(buf, sizeof buf,
                  "stopped at its spend cap after %.2f simulated hours: the budget is spent",
                  elapsed / 3600);
  } else if (end == interrupt_at) {
    r.outcome = Outcome::kSpotInterruption;
    std::snprintf(buf, sizeof buf,
                  "spot interruption after %.2f simulated hours; progress %.1f%% -> %.1f%% "
                  "saved by checkpoint",
                  elapsed / 3600, 100 * (done_before + std::max(0.0, elapsed - setup)) / work,
                  100 * r.progress_to);
  } else {
    r.outcome = Outcome::kTimeout;
    std::snprintf(buf, sizeof buf, "timed out after %.2f simulated hours (timeout %g h)",
                  elapsed / 3600, ctx.spec.timeout_s / 3600);
  }
  r.message = buf;
  return r;
}

}  // namespace trnflow::workers
