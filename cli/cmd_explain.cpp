// "Why isn't my stage running?": `trnflow explain RUN STAGE`, and the warning `run`, `watch`
// and `show` print when no live worker can run a ready stage.
#include <algorithm>
#include <cmath>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/error.h"
#include "pipelines/diagnostics.h"
#include "sim/catalog.h"

namespace trnflow::cli {
using schema::ToSql;
namespace {

// Workers heartbeated within this long are read; of those, one silent past its own lease is
// dead (its stages are rescued elsewhere), as `trnflow workers` says.
constexpr double kLiveWorkerAge = 3600;

std::string PoolOf(const std::string& instance_type) {
  const auto* t = sim::Catalog::Builtin().FindInstance(instance_type);
  return t ? t->pool : "";
}

bool Serves(const schema::LiveWorker& w, const std::string& project) {
  return w.projects.empty() ||
         std::find(w.projects.begin(), w.projects.end(), project) != w.projects.end();
}

// Live workers that may take stages of `run_id` (not those running another run only).
std::vector<schema::LiveWorker> WorkersFor(schema::Catalog& catalog, int64_t run_id) {
  std::vector<schema::LiveWorker> out;
  for (auto& w : catalog.LiveWorkers(kLiveWorkerAge))
    if ((w.only_run == 0 || w.only_run == run_id) && w.heartbeat_age_s <= w.lease_s)
      out.push_back(std::move(w));
  return out;
}

// "; 2 live worker(s) with a trn1 pool serve only other projects (--project)", or "".
std::string ReservedElsewhere(const std::vector<schema::LiveWorker>& workers,
                              const std::string& pool, const std::string& project) {
  int n = 0;
  for (const auto& w : workers)
    if (!Serves(w, project) && w.pools.count(pool)) ++n;
  if (n == 0) return "";
  return "; " + std::to_string(n) + " live worker(s) with a " + pool +
         " pool serve only other projects (`trnflow worker --project`)";
}

std::string WorkerList(const std::vector<schema::LiveWorker>& workers) {
  if (workers.empty()) return "no worker is running";
  std::string out = "live workers: ";
  for (size_t i = 0; i < workers.size(); ++i) {
    const auto& w = workers[i];
    out += (i ? "; " : "") + w.host + " (";
    bool first = true;
    for (const auto& [pool, cap] : w.pools) {
      out += (first ? "" : ", ") + pool + "=" + std::to_string(cap);
      first = false;
    }
    out += ")";
  }
  return out;
}

// The sentence for a stage of `count` instances in `pool` that no live worker can take, or "".
std::string NoWorkerFor(const std::vector<schema::LiveWorker>& workers, const std::string& pool,
                        int count) {
  int biggest = 0;
  for (const auto& w : workers)
    if (auto it = w.pools.find(pool); it != w.pools.end()) biggest = std::max(biggest, it->second);
  if (biggest >= count) return "";
  std::string what = "no live worker has a " + pool + " pool" +
                     (count > 1 ? " with >= " + std::to_string(count) + " instances" : "");
  if (biggest > 0) what += " (the largest has " + std::to_string(biggest) + ")";
  return what + "; " + WorkerList(workers) + ". Start one: `trnflow worker --pool " + pool + "=" +
         std::to_string(std::max(count, 1)) + "`";
}

struct Reason {
  // run, gone, needs, worker, capacity, share, cap, backoff, budget, running, done
  std::string kind;
  std::string message;
};

std::vector<Reason> Explain(schema::Catalog& catalog, int64_t run_id, const schema::StageWait& w) {
  using enum StageState;
  std::vector<Reason> out;
  if (w.run_state != schema::RunState::kRunning && w.state != kSucceeded && w.state != kCached) {
    out.push_back({"run", "the run is " + ToSql(w.run_state) + ": none of its stages will start. " +
                              (w.run_state == schema::RunState::kSucceeded
                                   ? std::string("Nothing to do.")
                                   : "`trnflow resume " + std::to_string(run_id) +
                                         "` runs its failed, cancelled and skipped stages again")});
  }
  std::string last = !w.last_outcome
                         ? ""
                         : " Last attempt: " + ToSql(*w.last_outcome) +
                               (w.last_message.empty() ? "" : " (" + w.last_message + ")");
  if (w.state == kBlocked || w.state == kSkipped) {
    std::string needs;
    for (const auto& [name, state] : w.waiting_for)
      needs += (needs.empty() ? "" : ", ") + name + " (" + ToSql(state) + ")";
    out.push_back({"needs", w.state == kBlocked
                                ? "it waits for the stages it needs: " + needs
                                : "it was skipped: a stage it needs did not succeed: " + needs});
  } else if (w.state == kRetryWait) {
    if (auto b = catalog.StageBudgetWait(run_id, w.stage_id)) {
      // Waiting for its reservation (migration 0033): no attempt, no ledger row.
      std::string budget =
          b->scope == "run" ? "the run's budget_usd" : "project " + w.project + "'s budget";
      out.push_back(
          {"budget", "it waits for its budget (since " + b->since + "): it reserves " +
                         b->needs.ToDollars() + " and " + budget + " had " + b->left.ToDollars() +
                         " left beside " + b->held.ToDollars() + " held by " +
                         std::to_string(b->holders) +
                         " running attempt(s) when it began waiting; it starts when they close "
                         "(`trnflow events --kind budget`)"});
      return out;
    }
    char buf[96];
    std::snprintf(buf, sizeof buf, "it is backing off before attempt %d: ready again in %.1fs.",
                  w.attempts + 1, std::max(0.0, w.ready_in_s));
    out.push_back({"backoff", buf + last});
    if (w.last_message.find("budget") != std::string::npos)
      out.push_back({"budget", "its budget holds it back: " + w.last_message});
  } else if (w.state == kReady) {
    if (auto gone = HolderGone(catalog, run_id)) out.push_back({"gone", *gone});
    auto live = WorkersFor(catalog, run_id);
    std::vector<schema::LiveWorker> workers;  // those that serve the stage's project
    std::copy_if(live.begin(), live.end(), std::back_inserter(workers),
                 [&](const schema::LiveWorker& x) { return Serves(x, w.project); });
    std::string none = NoWorkerFor(workers, w.pool, w.instance_count);
    if (!none.empty()) {
      out.push_back({"worker", none + ReservedElsewhere(live, w.pool, w.project)});
    } else {
      int capacity = 0, used = 0;
      for (const auto& wk : workers)
        if (auto it = wk.pools.find(w.pool); it != wk.pools.end()) {
          capacity += it->second;
          auto u = wk.in_use.find(w.pool);
          used += u == wk.in_use.end() ? 0 : u->second;
        }
      out.push_back({"capacity", "it waits for a free slot: the live " + w.pool +
                                     " pools serving " + w.project + " hold " +
                                     std::to_string(used) + " of " + std::to_string(capacity) +
                                     " instances (it needs " + std::to_string(w.instance_count) +
                                     "); about " + std::to_string(w.queued_ahead) +
                                     " ready stage(s) go before it"});
    }
    if (w.share) {
      const auto& s = *w.share;
      char weight[32];
      std::snprintf(weight, sizeof weight, "%g", s.weight);
      out.push_back(
          {"share", "project " + w.project + " holds " + std::to_string(s.running_in_pool) +
                        " of the " + std::to_string(s.pool_running) + " " + w.pool +
                        " instances in use (weight " + weight +
                        "); a free slot goes to the project furthest below its weighted share. "
                        "Before this stage: " +
                        std::to_string(s.ahead_in_project) + " ready stage(s) of " + w.project +
                        " (priority, then age) and about " + std::to_string(s.ahead_elsewhere) +
                        " of the " + std::to_string(s.projects_waiting) +
                        " other project(s) waiting in the pool"});
    }
    if (w.share && w.share->max_running && w.share->running >= *w.share->max_running)
      out.push_back({"cap", "project " + w.project +
                                " is at its cap: " + std::to_string(w.share->running) +
                                " of at most " + std::to_string(*w.share->max_running) +
                                " stages run; the next starts when one ends (`trnflow project "
                                "update " +
                                w.project + " --max-running N` changes it)"});
    if (w.share && w.share->pool_max_running &&
        w.share->running_stages_in_pool >= *w.share->pool_max_running)
      out.push_back({"cap", "project " + w.project + " is at its " + w.pool +
                                " cap: " + std::to_string(w.share->running_stages_in_pool) +
                                " of at most " + std::to_string(*w.share->pool_max_running) + " " +
                                w.pool + " stages run (`trnflow project update " + w.project +
                                " --max-running " + w.pool + "=N` changes it)"});
    for (const auto& b : catalog.ProjectBudgets(w.project))
      if (b.spent >= b.amount)
        out.push_back({"budget", "project " + w.project + "'s " + b.period + " budget of " +
                                     b.amount.ToDollars() + " is spent (" + b.spent.ToDollars() +
                                     "): its attempts end as budget_exceeded"});
    if (w.last_message.find("budget") != std::string::npos)
      out.push_back({"budget", "its last attempt was held back by the budget: " + w.last_message});
  } else if (w.state == kRunning) {
    if (auto gone = HolderGone(catalog, run_id)) out.push_back({"gone", *gone});
    out.push_back({"running", "it is running: attempt " + std::to_string(w.attempts) +
                                  (w.running_on.empty() ? "" : " on " + w.running_on) +
                                  "; `trnflow show " + std::to_string(run_id) +
                                  "` shows its progress"});
  } else {
    out.push_back({"done", "it has ended: " + ToSql(w.state) +
                               (w.last_message.empty() ? "" : " (" + w.last_message + ")")});
  }
  return out;
}

}  // namespace

std::optional<std::string> HolderGone(schema::Catalog& catalog, int64_t run_id) {
  auto h = catalog.HolderOf(run_id);
  if (!h || !h->gone()) return std::nullopt;
  std::string who = h->registered ? "the process running this run (pid " + std::to_string(h->pid) +
                                        " on " + h->host + ")"
                                  : "the `trnflow run` that submitted this run";
  std::string how =
      !h->registered ? "never started executing it"
      : h->stopped   ? "has stopped"
                   : "is gone: silent for " + std::to_string(static_cast<int>(h->heartbeat_age_s)) +
                         "s, past its " + std::to_string(static_cast<int>(h->lease_s)) + "s lease";
  return who + " " + how + "; continue it with `trnflow watch " + std::to_string(run_id) +
         " --execute` (or a `trnflow scheduler` hands it to the worker daemons)";
}

std::vector<std::string> UnrunnableStages(schema::Catalog& catalog, int64_t run_id,
                                          const std::vector<schema::StageRow>& stages) {
  std::vector<std::string> out;
  bool unfinished = false;
  for (const auto& s : stages)
    unfinished = unfinished || s.state == StageState::kReady || s.state == StageState::kRunning ||
                 s.state == StageState::kRetryWait || s.state == StageState::kBlocked;
  if (unfinished)
    if (auto gone = HolderGone(catalog, run_id)) out.push_back(*gone);
  std::map<std::pair<std::string, int>, std::vector<std::string>> ready;  // (pool, count)
  for (const auto& s : stages)
    if (s.state == StageState::kReady)
      ready[{PoolOf(s.instance_type), s.instance_count}].push_back(s.name);
  if (ready.empty()) return out;
  auto workers = WorkersFor(catalog, run_id);
  for (const auto& [key, names] : ready) {
    std::string none = NoWorkerFor(workers, key.first, key.second);
    if (none.empty()) continue;
    std::string list =
        names.front() +
        (names.size() > 1 ? " and " + std::to_string(names.size() - 1) + " more" : "");
    out.push_back(list + " cannot start: " + none);
  }
  return out;
}

std::vector<std::string> ExplainStageLines(schema::Catalog& catalog, int64_t run_id,
                                           const std::string& stage) {
  auto w = catalog.ExplainStage(run_id, stage);
  if (!w) return {};
  std::vector<std::string> out;
  for (const auto& r : Explain(catalog, run_id, *w)) out.push_back(r.message);
  return out;
}

int CmdExplain(const std::string& run_text, const std::string& stage, const std::string& format) {
  int64_t run_id = ParseRunId(run_text);
  auto catalog = OpenCatalog();
  if (!catalog->GetRun(run_id))
    throw UserError("no run " + run_text + "; `trnflow runs` lists them");
  auto w = catalog->ExplainStage(run_id, stage);
  if (!w) {
    std::vector<std::string> names;
    for (const auto& s : catalog->GetStages(run_id)) names.push_back(s.name);
    std::string hint = pipelines::DidYouMean(stage, names);
    throw UserError("run " + run_text + " has no stage '" + stage + "'" +
                    (hint.empty() ? "; `trnflow show " + run_text + "` lists them" : "; " + hint));
  }
  auto reasons = Explain(*catalog, run_id, *w);
  if (format == "json") {
    nlohmann::json js = nlohmann::json::array();
    for (const auto& r : reasons) js.push_back({{"kind", r.kind}, {"message", r.message}});
    nlohmann::json out = {{"run_id", std::to_string(run_id)},
                          {"stage", stage},
                          {"state", ToSql(w->state)},
                          {"pool", w->pool},
                          {"instance_count", w->instance_count},
                          {"attempts", w->attempts},
                          {"reasons", js}};
    std::cout << out.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << "stage " << stage << " of run " << run_id << " (project " << w->project << ", "
            << w->pool << " x" << w->instance_count << "): " << ToSql(w->state) << "\n";
  for (const auto& r : reasons) std::cout << "  - " << r.message << "\n";
  return kExitOk;
}

}  // namespace trnflow::cli
