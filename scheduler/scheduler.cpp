#include "scheduler/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "common/error.h"
#include "common/log.h"
#include "common/money.h"
#include "common/retry_policy.h"
#include "pipelines/pipeline.h"
#include "scheduler/admission.h"
#include "scheduler/cron.h"
#include "schema/attempt_end.h"
#include "schema/member_lock_guard.h"
#include "schema/scheduler_catalog.h"

namespace trnflow::scheduler {
namespace {

using Steady = std::chrono::steady_clock;

// One maintenance service: what it does each time it is due, and how often.
struct Service {
  Service(const char* n, double every, std::function<void(schema::SchedulerCatalog&)> body)
      : name(n), every_s(every), run(std::move(body)), log(Logger(std::string("scheduler.") + n)) {}
  const char* name;
  double every_s;
  std::function<void(schema::SchedulerCatalog&)> run;
  std::shared_ptr<spdlog::logger> log;
  Steady::time_point due = Steady::now();
};

// The highest of 50, 80, 100 that `spent` has reached of `budget`, or 0.
int ThresholdReached(Money spent, Money budget) {
  if (budget.micros() <= 0) return 0;
  double pct = 100.0 * static_cast<double>(spent.micros()) / static_cast<double>(budget.micros());
  return pct >= 100 ? 100 : pct >= 80 ? 80 : pct >= 50 ? 50 : 0;
}

// Budgets are enforced on actual spend (running attempts included): announce each threshold
// once per period, and at 100% stop the project's (or the run's) running runs.
void GuardBudgets(schema::SchedulerCatalog& c) {
  auto log = Logger("scheduler.budget");
  for (const auto& b : c.ProjectBudgets()) {
    int reached = ThresholdReached(b.spent, b.amount);
    for (int t : {50, 80, 100}) {  // each threshold once per period, even if a tick jumps two
      if (t > reached || t <= b.notified_percent) continue;
      std::string msg = "project " + b.project + " has spent " + b.spent.ToDollars() + " of its " +
                        b.period + " budget of " + b.amount.ToDollars() + " (past " +
                        std::to_string(t) + "%)";
      c.InsertEvent(0, 0, "budget", msg,
                    R"({"project": ")" + b.project + R"(", "percent": )" + std::to_string(t) + "}",
                    b.project);
      log->warn("{}", msg);
    }
    if (reached > b.notified_percent) c.RecordBudgetNotice(b.project, reached);
    if (reached >= 100)
      for (int64_t run : c.RunningRunsOfProject(b.project)) {
        c.CancelRun(run, Outcome::kBudgetExceeded);
        c.InsertEvent(run, 0, "budget", "run stopped: project " + b.project + " is over budget");
        log->warn("run={} stopped: project {} over budget", run, b.project);
      }
  }
  for (const auto& r : c.RunBudgets()) {
    int reached = ThresholdReached(r.spent, r.budget);
    for (int t : {50, 80, 100}) {
      if (t > reached || t <= r.notified_percent) continue;
      c.InsertEvent(r.run_id, 0, "budget",
                    "run has spent " + r.spent.ToDollars() + " of its budget_usd " +
                        r.budget.ToDollars() + " (past " + std::to_string(t) + "%)",
                    R"({"percent": )" + std::to_string(t) + "}");
    }
    if (reached > r.notified_percent) c.RecordRunBudgetNotice(r.run_id, reached);
    if (reached >= 100) {
      c.CancelRun(r.run_id, Outcome::kBudgetExceeded);
      log->warn("run={} stopped: over its budget_usd {}", r.run_id, r.budget.ToDollars());
    }
  }
}

}  // namespace

namespace {
// A schedule's snapshot with its params and project, as every fire of it submits it.
pipelines::LoadResult LoadSnapshot(schema::SchedulerCatalog& c, const schema::ScheduleRow& s) {
  nlohmann::json params = nlohmann::json::parse(s.params_json, nullptr, false);
  pipelines::LoadOptions opts;
  if (params.is_object())
    for (auto& [k, v] : params.items()) opts.params[k] = v.get<std::string>();
  opts.project = s.project;
  // Bounded before expansion (a schedule holding a million-stage file costs the daemon
  // nothing): the project's quotas as submit_run counts them.
  opts.stage_bound = [&c](const std::string& project) {
    auto room = c.GetStageRoom(project);
    return pipelines::QuotaStageBound(project, room.max_stages_per_run, room.max_queued_stages,
                                      room.unfinished);
  };
  return pipelines::ParsePipeline(s.source, s.file, opts);
}

schema::SubmitOptions FireOptions(const schema::ScheduleRow& s) {
  schema::SubmitOptions so;
  so.project = s.project;
  so.speed = s.speed;
  so.workdir = s.workdir;
  return so;
}
}  // namespace

int64_t FireScheduleNow(schema::SchedulerCatalog& c, const std::string& name) {
  auto s = c.GetSchedule(name);
  if (!s) throw UserError("there is no schedule '" + name + "'; `trnflow schedule ls` lists them");
  if (s->paused)
    throw UserError("schedule " + name + " is paused, and a paused schedule does not fire; "
                    "`trnflow schedule resume " + name + "` first");
  auto loaded = LoadSnapshot(c, *s);
  if (!loaded.pipeline)
    throw UserError("schedule " + name + ": its snapshot no longer validates (the cron's fires "
                    "are skipped too):\n" + loaded.diagnostics.Format() +
                    "\nfix the file and `trnflow schedule update " + name + "`");
  schema::SubmitOptions so = FireOptions(*s);
  so.seed = static_cast<int64_t>(std::chrono::duration_cast<std::chrono::seconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count());  // its own market, as each slot has
  PlanForAdmission(c, *loaded.pipeline, &so);  // admitted by the budget as a cron fire is
  return c.FireScheduleNow(name, *loaded.pipeline, so);
}

int FireDueSchedules(schema::SchedulerCatalog& c, std::chrono::system_clock::time_point now) {
  auto log = Logger("scheduler.cron");
  auto epoch = [](SysTime t) {
    return std::chrono::duration<double>(t.time_since_epoch()).count();
  };
  int fired = 0;
  for (const auto& s : c.ListSchedules()) {
    if (s.paused) continue;
    std::string error;
    auto cron = ParseCron(s.cron, &error);
    if (!cron || !IsTimeZone(s.tz)) {
      log->error("schedule={}: cannot evaluate '{}' in {}: {}", s.name, s.cron, s.tz, error);
      continue;
    }
    std::vector<SysTime> due;
    SysTime t{std::chrono::duration_cast<SysTime::duration>(
        std::chrono::duration<double>(s.last_slot_epoch))};
    while (due.size() < 1000) {
      auto next = NextSlot(*cron, s.tz, t);
      if (!next || *next > now) break;
      due.push_back(t = *next);
    }
    if (due.empty()) continue;
    std::vector<SysTime> fire;
    if (s.catchup == "all")
      fire = due;
    else if (s.catchup == "latest")
      fire = {due.back()};
    else if (now - due.back() <= std::chrono::minutes(2))
      fire = {due.back()};
    if (!fire.empty()) {
      auto loaded = LoadSnapshot(c, s);
      if (!loaded.pipeline) {
        log->error("schedule={}: its pipeline no longer validates:\n{}", s.name,
                   loaded.diagnostics.Format());
      } else {
        schema::SubmitOptions so = FireOptions(s);
        for (SysTime slot : fire) {
          so.seed = static_cast<int64_t>(epoch(slot));  // each slot its own market
          // Admitted by the budget like any submission (admission.h); a refused slot is
          // recorded as an event of the project and not tried again.
          PlanForAdmission(c, *loaded.pipeline, &so);
          try {
            if (int64_t run = c.FireSchedule(s.name, epoch(slot), *loaded.pipeline, so)) {
              ++fired;
              log->info("schedule={} slot={} run={}", s.name, static_cast<int64_t>(epoch(slot)),
                        run);
            }
          } catch (const Refused& e) {
            log->warn("schedule={} slot={} refused: {}", s.name,
                      static_cast<int64_t>(epoch(slot)), e.what());
            c.InsertEvent(0, 0, "budget",
                          "schedule " + s.name + " did not fire: " + std::string(e.what()),
                          nlohmann::json{{"project", s.project}, {"schedule", s.name}}.dump(),
                          s.project);
          }
        }
      }
    }
    c.AdvanceSchedule(s.name, epoch(due.back()));
  }
  return fired;
}

Scheduler::Scheduler(SchedulerOptions options) : options_(std::move(options)) {}

Scheduler::~Scheduler() { Stop(); }

void Scheduler::Start() {
  stop_ = false;
  thread_ = std::thread([this] { Loop(); });
  guard_ = std::make_unique<schema::MemberLockGuard>(options_.database_url,
                                                     options_.member_lock_limit_s,
                                                     options_.member_lock_every_s,
                                                     [this] { return leader_.load(); });
  guard_->Start();
}

void Scheduler::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (guard_) guard_->Stop();
}

void Scheduler::Loop() {
  auto log = Logger("scheduler");
  std::mt19937_64 rng(options_.seed ? options_.seed : std::random_device{}());
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::vector<Service> services = {
      {"promoter", options_.promote_every_s,
       [&](schema::SchedulerCatalog& c) {
         if (int n = c.PromoteRetries()) Logger("scheduler.promoter")->debug("promoted={}", n);
       }},
      {"rescuer", options_.rescue_every_s,
       [&](schema::SchedulerCatalog& c) {
         int n = c.RescueExpiredLeases([&](const schema::ExpiredLease& e) {
           schema::AttemptFacts f{e.stage_id,    e.attempt, e.lease_owner, &e.spec,
                                  e.market,      e.errors,  e.preemptions, e.speed,
                                  e.price_per_hour, e.instance_count, e.run_cancelled};
           schema::AttemptEnding end;
           end.outcome = Outcome::kLost;
           end.sim_seconds = e.sim_seconds;
           end.progress_to = e.progress;  // what it checkpointed: the next attempt starts there
           end.lost_fraction = schema::LostFraction(e.progress_from, e.progress, e.live_progress);
           char buf[200];
           std::snprintf(buf, sizeof buf,
                         "lost: its worker stopped heartbeating (billed to the last heartbeat, "
                         "%.2f simulated hours); resumes from %.1f%%",
                         e.sim_seconds / 3600, 100 * e.progress);
           end.message = buf;
           schema::AttemptResult r = schema::EndAttempt(f, end, unit(rng));
           Logger("scheduler.rescuer")
               ->warn("lost stage={} attempt={} next={}", e.stage_id, e.attempt,
                      ToString(r.next_state));
           return r;
         });
         if (n) Logger("scheduler.rescuer")->info("rescued={}", n);
         if (int h = c.ReleaseDeadHolds())
           Logger("scheduler.rescuer")->info("released runs={} whose foreground process is gone", h);
       }},
      {"cron", options_.cron_every_s,
       [&](schema::SchedulerCatalog& c) {
         if (int n = FireDueSchedules(c, std::chrono::system_clock::now()))
           Logger("scheduler.cron")->info("fired runs={}", n);
       }},
      {"budget", options_.budget_every_s, [&](schema::SchedulerCatalog& c) { GuardBudgets(c); }},
      {"partitions", options_.partitions_every_s,
       [&](schema::SchedulerCatalog& c) {
         if (int n = c.MakeAttemptsPartitionsAhead(options_.partitions_ahead))
           Logger("scheduler.partitions")->info("made ledger partitions={}", n);
       }},
      {"finisher", options_.finish_every_s,
       [&](schema::SchedulerCatalog& c) {
         for (int64_t id : c.FinishRuns())
           Logger("scheduler.finisher")->info("finished run={}", id);
       }},
  };

  std::unique_ptr<schema::SchedulerCatalog> catalog;
  double backoff_s = 0.1;
  while (!stop_) {
    try {
      if (!catalog) catalog = schema::OpenSchedulerCatalog(options_.database_url);
      bool lead = catalog->TryAcquireLeadership();
      if (lead != leader_.exchange(lead))
        log->info(lead ? "leading" : "standing by: another scheduler leads");
      if (lead) {
        auto now = Steady::now();
        for (auto& s : services) {
          if (now < s.due) continue;
          try {
            s.run(*catalog);
          } catch (const CatalogUnavailable&) {
            throw;
          } catch (const std::exception& e) {
            s.log->error("tick failed: {}", e.what());
          }
          // Jitter keeps several processes' services from ticking in lockstep.
          double next = s.every_s * (0.9 + 0.2 * unit(rng));
          s.due = now +
                  std::chrono::duration_cast<Steady::duration>(std::chrono::duration<double>(next));
        }
      }
      backoff_s = 0.1;
    } catch (const CatalogUnavailable& e) {
      if (leader_.exchange(false)) log->warn("lost leadership with the connection");
      log->warn("{}; retrying in {:.1f}s", e.what(), backoff_s);
      catalog.reset();
      auto until = Steady::now() + std::chrono::duration_cast<Steady::duration>(
                                       std::chrono::duration<double>(backoff_s));
      while (!stop_ && Steady::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      backoff_s = std::min(backoff_s * 2, 5.0);
      continue;
    } catch (const std::exception& e) {
      log->error("tick failed: {}", e.what());
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(options_.tick_s));
  }
}

}  // namespace trnflow::scheduler
