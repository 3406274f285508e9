// claim_bench: does history slow the hot path? Claims and completes ready stages in batches
// (the worker's two statements, as a worker runs them) on a fresh catalog, then again after
// loading HISTORY finished stages and their ledger rows, and prints both side by side with
// the claim's query plan. Usage: claim_bench [HISTORY=1000000] [READY=20000] [BATCH=64]
// Needs the local PostgreSQL of ops/setup.sh (or TRNFLOW_TEST_ADMIN_URL).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "common/money.h"
#include "schema/catalog.h"
#include "sim/catalog.h"

using namespace trnflow;
using namespace trnflow::bench;

namespace {

// A run with `n` stages in `state`, inserted in one statement (as the catalog holds them).
void InsertStages(schema::Catalog& c, int64_t n, const std::string& state, bool with_attempts) {
  std::string run = c.QueryValue(
      "WITH p AS (INSERT INTO trnflow.pipelines (name, spec_hash, source) VALUES ('bench', "
      "md5(random()::text), '') RETURNING id) "
      "INSERT INTO trnflow.runs (pipeline_id, project, speed, seed, workdir, state) "
      "SELECT id, 'bench', 1e9, 1, '/', '" +
      std::string(state == "ready" ? "running" : "succeeded") + "' FROM p RETURNING id");
  std::string spec =
      R"({"name":"s","kind":"run","instance":"c6i.large","count":1,"market":"on-demand",)"
      R"("command":{"argv":["true"],"shell":false,"env":{}},"workload":null,)"
      R"("retry":{"max_attempts":1,"on":[],"backoff":{"initial_s":30,"factor":2,"max_s":600},)"
      R"("max_interruptions":6,"then":"on-demand"},"checkpoint":{"every_s":0,"on_notice":false},)"
      R"("timeout_s":0,"cache":false})";
  c.QueryValue(
      "INSERT INTO trnflow.stages (run_id, name, kind, pool, instance_type, instance_count, "
      "market, state, spec, ready_at, attempts, finished_at) "
      "SELECT " +
      run + ", 's' || g, 'run', 'cpu', 'c6i.large', 1, 'on-demand', '" + state + "', '" + spec +
      "'::jsonb, now(), " + (with_attempts ? "1" : "0") + ", " +
      (state == "ready" ? "NULL" : "now()") + " FROM generate_series(1, " + std::to_string(n) +
      ") g RETURNING 1");
  if (with_attempts)
    c.QueryValue(
        "INSERT INTO trnflow.attempts (stage_id, run_id, attempt, worker_id, worker_name, "
        "instance_type, instance_count, market, price_usd_hour, finished_at, sim_seconds, "
        "billed_seconds, outcome, cost_usd, wasted_usd, saved_usd, progress_to) "
        "SELECT id, run_id, 1, gen_random_uuid(), 'bench', 'c6i.large', 1, 'on-demand', 0.17, "
        "now(), 60, 60, 'succeeded', 0.002833, 0, 0, 1 FROM trnflow.stages WHERE run_id = " +
        run + " RETURNING 1");
}

struct Figures {
  double claim_p50, claim_p99, complete_p50, complete_p99, stages_per_s;
};

Figures Drain(schema::Catalog& c, int64_t ready, int batch) {
  InsertStages(c, ready, "ready", false);
  c.QueryValue("ANALYZE trnflow.stages");
  const std::string worker = "00000000-0000-4000-8000-00000000beef";
  std::vector<double> claims, completes;
  int64_t done = 0;
  auto start = Clock::now();
  while (true) {
    auto t0 = Clock::now();
    auto claimed = c.ClaimReadyStages("cpu", batch, worker, "bench", 60);
    claims.push_back(Ms(Clock::now() - t0));
    if (claimed.empty()) break;
    std::vector<schema::AttemptResult> results;
    for (const auto& s : claimed) {
      schema::AttemptResult r;
      r.stage_id = s.stage_id;
      r.attempt = s.attempt;
      r.lease_owner = worker;
      r.outcome = Outcome::kSucceeded;
      r.next_state = StageState::kSucceeded;
      r.next_market = s.market;
      r.sim_seconds = 1;
      r.billed_seconds = 60;
      r.cost = Charge(s.price_per_hour, 1, 1);
      r.progress_to = 1;
      results.push_back(r);
    }
    auto t1 = Clock::now();
    done += static_cast<int64_t>(c.CompleteAttempts(results).size());
    completes.push_back(Ms(Clock::now() - t1));
  }
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return {Percentile(claims, 0.5), Percentile(claims, 0.99), Percentile(completes, 0.5),
          Percentile(completes, 0.99), done / seconds};
}

}  // namespace

int main(int argc, char** argv) {
  int64_t history = argc > 1 ? std::atoll(argv[1]) : 1'000'000;
  int64_t ready = argc > 2 ? std::atoll(argv[2]) : 20'000;
  int batch = argc > 3 ? std::atoi(argv[3]) : 64;
  std::string name = "trnflow_bench_claim_" + std::to_string(getpid());
  std::string url = schema::CreateDatabase(AdminUrl(), name);
  {
    schema::Catalog c(url);
    c.Migrate(sim::Catalog::Builtin());
    c.QueryValue("INSERT INTO trnflow.projects (name) VALUES ('bench') RETURNING 1");
    std::printf("claim_bench: %lld ready stages, claimed and completed %d at a time (one worker)\n",
                static_cast<long long>(ready), batch);
    Figures empty = Drain(c, ready, batch);
    auto t0 = Clock::now();
    InsertStages(c, history, "succeeded", true);
    // Settle the bulk load (vacuum, visibility map, a checkpoint's worth of time) so the
    // figures measure the queries, not the background writes of the load.
    c.RunOutsideTransaction("VACUUM ANALYZE trnflow.stages");
    c.RunOutsideTransaction("VACUUM ANALYZE trnflow.attempts");
    std::this_thread::sleep_for(std::chrono::seconds(5));
    std::printf("loaded %lld finished stages with their ledger rows in %.1f s\n",
                static_cast<long long>(history), Ms(Clock::now() - t0) / 1000);
    Figures full = Drain(c, ready, batch);
    std::printf("\n%-28s %14s %14s\n", "", "empty history", "with history");
    std::printf("%-28s %14.2f %14.2f\n", "claim p50 (ms)", empty.claim_p50, full.claim_p50);
    std::printf("%-28s %14.2f %14.2f\n", "claim p99 (ms)", empty.claim_p99, full.claim_p99);
    std::printf("%-28s %14.2f %14.2f\n", "complete p50 (ms)", empty.complete_p50,
                full.complete_p50);
    std::printf("%-28s %14.2f %14.2f\n", "complete p99 (ms)", empty.complete_p99,
                full.complete_p99);
    std::printf("%-28s %14.0f %14.0f\n", "stages/s (one worker)", empty.stages_per_s,
                full.stages_per_s);
    InsertStages(c, 1000, "ready", false);
    c.QueryValue("ANALYZE trnflow.stages");
    // EXPLAIN returns rows; a session-local function folds them into one value.
    c.QueryValue(R"(CREATE FUNCTION pg_temp.explain_claim() RETURNS text LANGUAGE plpgsql AS $$
      DECLARE line text; plan text := '';
      BEGIN
        FOR line IN EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
          SELECT id FROM trnflow.stages
          WHERE state = 'ready' AND pool = 'cpu' AND instance_count <= 64
          ORDER BY priority DESC, ready_at, id LIMIT 64 FOR UPDATE SKIP LOCKED
        LOOP plan := plan || '  ' || line || E'\n'; END LOOP;
        RETURN plan;
      END $$)");
    std::printf("\nthe claim's scan, with %lld finished stages in the table:\n%s",
                static_cast<long long>(history),
                c.QueryValue("SELECT pg_temp.explain_claim()").c_str());
  }
  if (std::getenv("TRNFLOW_BENCH_KEEP_DB"))
    std::printf("kept database %s\n", name.c_str());
  else
    schema::DropDatabase(AdminUrl(), name);
  return 0;
}
