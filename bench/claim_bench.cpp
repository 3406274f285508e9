// claim_bench: does history slow the hot path? Claims and completes ready stages in batches
// (the worker's two statements, as a worker runs them) on a fresh catalog, then again after
// loading HISTORY finished stages and their ledger rows, and prints both side by side with
// the claim's query plan. The empty catalog's figures are the mean of one measured before the
// load and one, in a fresh database, after it.
// Usage: claim_bench [HISTORY=1000000] [READY=20000] [BATCH=64]
// Needs the local PostgreSQL of ops/setup.sh (or TRNFLOW_TEST_ADMIN_URL). A fifth argument
// --json sends the report to stderr and one JSON line to stdout.
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
#include "schema/catalog_testing.h"
#include "sim/catalog.h"

using namespace trnflow;
using namespace trnflow::bench;

namespace {

struct Figures {
  double claim_p50, claim_p99, complete_p50, complete_p99, stages_per_s;
  double slowest_ms;      // the slowest claim + complete of one batch
  double first_ms;        // the first batch's
  double slowest_share;   // share of the drain's time spent in its slowest 1% of batches
};

Figures Drain(schema::Catalog& c, int64_t ready, int batch) {
  InsertStages(c, ready, "ready", false);
  schema::testing::QueryValue(c, "ANALYZE trnflow.stages");
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
    done += static_cast<int64_t>(schema::testing::CompleteAttempts(c, results).size());
    completes.push_back(Ms(Clock::now() - t1));
  }
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<double> rounds;  // claim + complete per batch (the last claim found nothing)
  for (size_t i = 0; i < completes.size(); ++i) rounds.push_back(claims[i] + completes[i]);
  double first = rounds.empty() ? 0 : rounds[0];
  std::sort(rounds.rbegin(), rounds.rend());
  double slowest = 0;
  for (size_t i = 0; i < std::max<size_t>(1, rounds.size() / 100) && i < rounds.size(); ++i)
    slowest += rounds[i];
  return {Percentile(claims, 0.5), Percentile(claims, 0.99), Percentile(completes, 0.5),
          Percentile(completes, 0.99), done / seconds, rounds.empty() ? 0 : rounds[0], first,
          slowest / (seconds * 1000)};
}

// The same drain on an empty catalog of its own (created, migrated, drained, dropped).
Figures EmptyCatalog(int64_t ready, int batch) {
  std::string name = "trnflow_bench_claim_empty_" + std::to_string(getpid());
  std::string url = schema::CreateDatabase(AdminUrl(), name);
  Figures f{};
  {
    schema::Catalog c(url);
    PrepareBenchCatalog(c);
    f = Drain(c, ready, batch);
  }
  DropBenchDatabase(name);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t history = argc > 1 ? std::atoll(argv[1]) : 1'000'000;
  int64_t ready = argc > 2 ? std::atoll(argv[2]) : 20'000;
  int batch = argc > 3 ? std::atoi(argv[3]) : 64;
  bool json = argc > 4 && std::string(argv[4]) == "--json";
  FILE* out = json ? stderr : stdout;
  // The empty catalog is measured before the history is loaded and again, in a database of
  // its own, after the history's figures: loading takes minutes, and this machine's speed
  // drifts over minutes, so the history is compared with the mean of the two.
  Figures empty{}, before{}, after{}, full{};
  std::string name = "trnflow_bench_claim_" + std::to_string(getpid());
  std::string url = schema::CreateDatabase(AdminUrl(), name);
  {
    schema::Catalog c(url);
    PrepareBenchCatalog(c);
    std::fprintf(
        out, "claim_bench: %lld ready stages, claimed and completed %d at a time (one worker)\n",
        static_cast<long long>(ready), batch);
    before = Drain(c, ready, batch);
    auto t0 = Clock::now();
    InsertStages(c, history, "succeeded", true);
    // Settle the bulk load (vacuum, visibility map, then a checkpoint: bench/pg.sh lets the
    // bench role take one) so the figures measure the queries, not the load's background writes.
    schema::testing::RunOutsideTransaction(c, "VACUUM ANALYZE trnflow.stages");
    schema::testing::RunOutsideTransaction(c, "VACUUM ANALYZE trnflow.attempts");
    try {
      schema::testing::RunOutsideTransaction(c, "CHECKPOINT");
    } catch (const std::exception& e) {
      std::fprintf(out, "no checkpoint (%s); waiting instead\n", e.what());
      std::this_thread::sleep_for(std::chrono::seconds(30));
    }
    std::fprintf(out, "loaded %lld finished stages with their ledger rows in %.1f s\n",
                 static_cast<long long>(history), Ms(Clock::now() - t0) / 1000);
    full = Drain(c, ready, batch);
    after = EmptyCatalog(ready, batch);
    auto mean = [](double a, double b) { return (a + b) / 2; };
    empty = {mean(before.claim_p50, after.claim_p50),   mean(before.claim_p99, after.claim_p99),
             mean(before.complete_p50, after.complete_p50),
             mean(before.complete_p99, after.complete_p99),
             mean(before.stages_per_s, after.stages_per_s),
             std::max(before.slowest_ms, after.slowest_ms),
             mean(before.first_ms, after.first_ms),
             mean(before.slowest_share, after.slowest_share)};
    std::fprintf(out, "empty catalog, claim p50: %.2f ms before the history, %.2f ms after\n",
                 before.claim_p50, after.claim_p50);
    std::fprintf(out, "\n%-28s %14s %14s\n", "", "empty history", "with history");
    std::fprintf(out, "%-28s %14.2f %14.2f\n", "claim p50 (ms)", empty.claim_p50, full.claim_p50);
    std::fprintf(out, "%-28s %14.2f %14.2f\n", "claim p99 (ms)", empty.claim_p99, full.claim_p99);
    std::fprintf(out, "%-28s %14.2f %14.2f\n", "complete p50 (ms)", empty.complete_p50,
                 full.complete_p50);
    std::fprintf(out, "%-28s %14.2f %14.2f\n", "complete p99 (ms)", empty.complete_p99,
                 full.complete_p99);
    std::fprintf(out, "%-28s %14.0f %14.0f\n", "stages/s (one worker)", empty.stages_per_s,
                 full.stages_per_s);
    std::fprintf(out, "%-28s %14.1f %14.1f\n", "slowest batch (ms)", empty.slowest_ms,
                 full.slowest_ms);
    std::fprintf(out, "%-28s %14.1f %14.1f\n", "first batch (ms)", empty.first_ms,
                 full.first_ms);
    std::fprintf(out, "%-28s %13.0f%% %13.0f%%\n", "time in slowest 1% batches",
                 100 * empty.slowest_share, 100 * full.slowest_share);
    InsertStages(c, 1000, "ready", false);
    schema::testing::QueryValue(c, "ANALYZE trnflow.stages");
    // EXPLAIN returns rows; a session-local function folds them into one value.
    schema::testing::QueryValue(
        c, R"(CREATE FUNCTION pg_temp.explain_claim() RETURNS text LANGUAGE plpgsql AS $$
      DECLARE line text; plan text := '';
      BEGIN
        FOR line IN EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
          SELECT stage_id FROM trnflow.ready_stages
          WHERE pool = 'cpu' AND project = 'bench' AND instance_count <= 64
          ORDER BY priority DESC, ready_at, stage_id LIMIT 64 FOR UPDATE SKIP LOCKED
        LOOP plan := plan || '  ' || line || E'\n'; END LOOP;
        RETURN plan;
      END $$)");
    std::fprintf(out, "\nthe claim's scan, with %lld finished stages in the table:\n%s",
                 static_cast<long long>(history),
                 schema::testing::QueryValue(c, "SELECT pg_temp.explain_claim()").c_str());
  }
  if (std::getenv("TRNFLOW_BENCH_KEEP_DB"))
    std::fprintf(out, "kept database %s\n", name.c_str());
  else
    DropBenchDatabase(name);
  if (json)
    std::printf(
        "{\"system\":\"trnflow\",\"workload\":\"claim_history\",\"history\":%lld,"
        "\"batch\":%d,\"claim_p50_ms_empty\":%.2f,\"claim_p50_ms\":%.2f,"
        "\"claim_p99_ms\":%.2f,\"complete_p50_ms\":%.2f,\"per_s_empty\":%.0f,"
        "\"per_s\":%.0f,\"claim_p50_ms_empty_before\":%.2f,"
        "\"claim_p50_ms_empty_after\":%.2f}\n",
        static_cast<long long>(history), batch, empty.claim_p50, full.claim_p50, full.claim_p99,
        full.complete_p50, empty.stages_per_s, full.stages_per_s, before.claim_p50,
        after.claim_p50);
  return 0;
}
