// fair_share_bench: who waits when three groups share one pool (issue 45). The scenario of
// docs/operations.md, "Sharing the fleet": `vision` submits a sweep of 300 one-instance stages
// of ~15 s into 16 slots; 20 s later `nlp` and `climate` submit 10 stages each. Time is
// simulated (stages take 12 to 18 s, so slots free one at a time); every free is one claim of
// one slot through the catalog's real claim (ClaimReadyStages on a fresh catalog, no worker:
// the noop of this bench is that a claimed stage "runs" until its simulated end). Printed per
// project: queue wait p50, p90 and max in simulated seconds, beside a first-come-first-served
// claim of the same scenario (the oldest ready stage takes each free slot: what one-slot claims
// did before migration 0032), and each project's last start.
// Usage: fair_share_bench [--sweep 300] [--small 10] [--slots 16] [--json 1]
// Needs the local PostgreSQL of ops/setup.sh (or TRNFLOW_TEST_ADMIN_URL).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <queue>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "pipelines/pipeline.h"
#include "schema/catalog.h"
#include "schema/catalog_testing.h"

using namespace trnflow;
using namespace trnflow::bench;

namespace {

struct Group {
  std::string project;
  int stages;
  double submitted_s;  // simulated
};

// Stage `i` of a group runs 12 to 18 simulated seconds (a golden-ratio spread: no two frees
// fall together).
double Duration(int i, int group) {
  double f = std::fmod((i + 1) * 0.6180339887 + group * 0.31, 1.0);
  return 12 + 6 * f;
}

struct Waits {
  std::map<std::string, std::vector<double>> wait;
  std::map<std::string, double> last_start;
};

// Runs the scenario: `pick(now)` claims one slot and returns (project, index within the group,
// group number), or an empty project when nothing is ready.
struct Picked {
  std::string project;
  int index = -1, group = -1;
  int64_t stage_id = 0;
};

template <typename Submit, typename Pick, typename Finish>
Waits Simulate(const std::vector<Group>& groups, int slots, Submit submit, Pick pick,
               Finish finish) {
  Waits out;
  using Event = std::pair<double, int64_t>;  // end time, stage id
  std::priority_queue<Event, std::vector<Event>, std::greater<>> ends;
  std::vector<bool> submitted(groups.size(), false);
  double now = 0;
  int free = slots;
  auto fill = [&] {
    while (free > 0) {
      Picked p = pick();
      if (p.project.empty()) return;
      --free;
      out.wait[p.project].push_back(now - groups[p.group].submitted_s);
      out.last_start[p.project] = now;
      ends.push({now + Duration(p.index, p.group), p.stage_id});
    }
  };
  while (true) {
    // Next event: a submission or a stage's end.
    double next_submit = 1e18;
    for (size_t g = 0; g < groups.size(); ++g)
      if (!submitted[g]) next_submit = std::min(next_submit, groups[g].submitted_s);
    double next_end = ends.empty() ? 1e18 : ends.top().first;
    if (next_submit == 1e18 && ends.empty()) break;
    if (next_submit <= next_end) {
      now = next_submit;
      for (size_t g = 0; g < groups.size(); ++g)
        if (!submitted[g] && groups[g].submitted_s <= now) {
          submitted[g] = true;
          submit(static_cast<int>(g));
        }
    } else {
      now = next_end;
      finish(ends.top().second);
      ends.pop();
      ++free;
    }
    fill();
  }
  return out;
}

std::string Pipeline(const Group& g) {
  std::string y = "pipeline: " + g.project + "-work\nproject: " + g.project +
                  "\nstages:\n  s:\n    run: [\"true\"]\n    instance: c6i.large\n"
                  "    matrix: {i: [";
  for (int i = 0; i < g.stages; ++i) y += (i ? "," : "") + std::to_string(i);
  return y + "]}\n";
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags(argc, argv);
  int sweep = static_cast<int>(flags.Int("sweep", 300));
  int small = static_cast<int>(flags.Int("small", 10));
  int slots = static_cast<int>(flags.Int("slots", 16));
  bool json = flags.Int("json", 0) != 0;
  std::vector<Group> groups = {{"vision", sweep, 0}, {"nlp", small, 20}, {"climate", small, 20}};

  // First come, first served: the oldest ready stage takes each free slot.
  std::vector<std::pair<double, std::pair<int, int>>> fifo_queue;  // ready at, (group, index)
  std::map<int64_t, int> fifo_ids;
  size_t fifo_next = 0;
  int64_t fifo_id = 0;
  Waits fifo = Simulate(
      groups, slots,
      [&](int g) {
        for (int i = 0; i < groups[g].stages; ++i)
          fifo_queue.push_back({groups[g].submitted_s, {g, i}});
      },
      [&]() -> Picked {
        if (fifo_next >= fifo_queue.size()) return {};
        auto [g, i] = fifo_queue[fifo_next++].second;
        return {groups[g].project, i, g, ++fifo_id};
      },
      [&](int64_t) {});

  // The catalog's claim, one slot per free.
  std::string name = "trnflow_bench_fair_share_" + std::to_string(getpid());
  std::string url = schema::CreateDatabase(AdminUrl(), name);
  Waits shared;
  double wall_s = 0;
  {
    schema::Catalog c(url);
    c.Migrate(sim::Catalog::Builtin());
    const std::string worker = "00000000-0000-4000-8000-00000000fa17";
    std::map<int64_t, int> group_of_run;
    std::map<int64_t, schema::ClaimedStage> running;
    std::map<std::string, int> next_index;
    auto t0 = Clock::now();
    shared = Simulate(
        groups, slots,
        [&](int g) {
          auto parsed = pipelines::ParsePipeline(Pipeline(groups[g]), "bench.yaml", {});
          schema::SubmitOptions o;
          o.speed = 1e6;
          group_of_run[c.SubmitRun(*parsed.pipeline, o)] = g;
        },
        [&]() -> Picked {
          auto got = c.ClaimReadyStages("cpu", 1, worker, "bench", 3600);
          if (got.empty()) return {};
          const auto& s = got[0];
          running[s.stage_id] = s;
          int g = group_of_run[s.run_id];
          return {s.project, next_index[s.project]++, g, s.stage_id};
        },
        [&](int64_t stage_id) {
          schema::testing::CompleteAttempts(
              c, {schema::testing::Succeeded(running.at(stage_id), worker)});
          running.erase(stage_id);
        });
    wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  DropBenchDatabase(name);

  FILE* out = json ? stderr : stdout;
  std::fprintf(out,
               "fair_share_bench: %d slots; vision submits %d stages at 0 s, nlp and climate %d "
               "each at 20 s; stages run 12-18 s (simulated); one claim per freed slot\n\n",
               slots, sweep, small);
  std::fprintf(out, "%-8s | %-36s | %-36s\n", "", "fair share (ClaimReadyStages)",
               "first come, first served");
  std::fprintf(out, "%-8s | %8s %8s %8s %9s | %8s %8s %8s %9s\n", "project", "wait p50", "p90",
               "max", "last start", "wait p50", "p90", "max", "last start");
  std::string line = "{\"bench\":\"fair_share\",\"slots\":" + std::to_string(slots) +
                     ",\"sweep\":" + std::to_string(sweep) + ",\"small\":" + std::to_string(small) +
                     ",\"claim_wall_s\":" + std::to_string(wall_s);
  for (const auto& g : groups) {
    auto& a = shared.wait[g.project];
    auto& b = fifo.wait[g.project];
    std::fprintf(out, "%-8s | %7.0fs %7.0fs %7.0fs %8.0fs | %7.0fs %7.0fs %7.0fs %8.0fs\n",
                 g.project.c_str(), Percentile(a, 0.5), Percentile(a, 0.9), Percentile(a, 1.0),
                 shared.last_start[g.project], Percentile(b, 0.5), Percentile(b, 0.9),
                 Percentile(b, 1.0), fifo.last_start[g.project]);
    line += ",\"" + g.project + "\":{\"p50_s\":" + std::to_string(Percentile(a, 0.5)) +
            ",\"p90_s\":" + std::to_string(Percentile(a, 0.9)) +
            ",\"max_s\":" + std::to_string(Percentile(a, 1.0)) +
            ",\"fifo_p50_s\":" + std::to_string(Percentile(b, 0.5)) +
            ",\"fifo_max_s\":" + std::to_string(Percentile(b, 1.0)) + "}";
  }
  std::fprintf(out, "\n%zu claims through the catalog in %.1f s of wall time\n",
               static_cast<size_t>(sweep + 2 * small), wall_s);
  if (json) std::printf("%s}\n", line.c_str());
  return 0;
}
