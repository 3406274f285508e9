#pragma once
// Small helpers the benchmark programs share.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/stage_spec.h"
#include "schema/catalog.h"
#include "schema/catalog_testing.h"
#include "sim/catalog.h"

namespace trnflow::bench {

using Clock = std::chrono::steady_clock;

// The server the benchmarks create their databases on (the local one of ops/setup.sh).
inline std::string AdminUrl() {
  const char* url = std::getenv("TRNFLOW_TEST_ADMIN_URL");
  return url && *url ? url : AdminDatabaseUrl();
}

// Drops a benchmark's database and the roles its catalog made (the daemon's, the reader's).
inline void DropBenchDatabase(const std::string& name) {
  schema::DropDatabase(AdminUrl(), name);
  schema::DropCatalogRoles(AdminUrl(), name);
}

// A benchmark's fresh catalog: migrated, with the project `bench` its stages belong to.
inline void PrepareBenchCatalog(schema::Catalog& c) {
  c.Migrate(sim::Catalog::Builtin());
  schema::testing::QueryValue(c,
                              "INSERT INTO trnflow.projects (name) VALUES ('bench') RETURNING 1");
}

// `--name value` pairs from the command line.
class Flags {
 public:
  Flags(int argc, char** argv) {
    for (int i = 1; i + 1 < argc; i += 2) values_[argv[i]] = argv[i + 1];
  }
  std::string Text(const std::string& name, const std::string& fallback) const {
    auto it = values_.find("--" + name);
    return it == values_.end() ? fallback : it->second;
  }
  int64_t Int(const std::string& name, int64_t fallback) const {
    auto it = values_.find("--" + name);
    return it == values_.end() ? fallback : std::stoll(it->second);
  }

 private:
  std::map<std::string, std::string> values_;
};

// When `run` finished (epoch seconds, database clock), polling every 5 ms; nullopt if it has
// not finished within `limit`.
inline std::optional<double> WaitForRunFinish(
    schema::Catalog& c, int64_t run, std::chrono::minutes limit = std::chrono::minutes(15)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    std::string end = schema::testing::QueryValue(c,
                                                  "SELECT extract(epoch FROM finished_at)::text "
                                                  "FROM trnflow.runs WHERE id = " +
                                                      std::to_string(run));
    if (!end.empty()) return std::stod(end);
    usleep(5000);
  }
  return std::nullopt;
}

// Where a workload's time goes: PostgreSQL's execution time in the benchmark's database
// (pg_stat_statements; bench/pg.sh loads it), the server's WAL bytes (pg_stat_wal) and the
// CPU of this process and its waited-for children (the worker processes). Read once before
// and once after; Per() divides the difference by the stages it moved. -1: not available
// (a server without pg_stat_statements).
struct CostSnapshot {
  double pg_ms = -1;
  double wal_bytes = -1;
  double cpu_s = 0;
};

inline CostSnapshot SnapshotCost(const std::string& database) {
  CostSnapshot s;
  rusage self{}, children{};
  getrusage(RUSAGE_SELF, &self);
  getrusage(RUSAGE_CHILDREN, &children);
  auto secs = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  s.cpu_s = secs(self.ru_utime) + secs(self.ru_stime) + secs(children.ru_utime) +
            secs(children.ru_stime);
  try {
    schema::Catalog admin(AdminUrl());
    std::string wal = schema::testing::QueryValue(admin, "SELECT wal_bytes::text FROM pg_stat_wal");
    if (!wal.empty()) s.wal_bytes = std::stod(wal);
    std::string pg = schema::testing::QueryValue(
        admin,
        "SELECT coalesce(sum(total_exec_time), 0)::text FROM pg_stat_statements "
        "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = '" +
            database + "')");
    if (!pg.empty()) s.pg_ms = std::stod(pg);
  } catch (const std::exception& e) {  // no pg_stat_statements here: the figures stay -1
    std::fprintf(stderr, "bench: no server figures: %s\n", e.what());
  }
  return s;
}

// `"pg_us_per_stage":..,"wal_bytes_per_stage":..,"client_cpu_us_per_stage":..` for a JSON line.
inline std::string PerStageJson(const CostSnapshot& a, const CostSnapshot& b, int64_t stages) {
  auto per = [&](double before, double after, double scale) {
    return before < 0 || after < 0 ? std::string("null")
                                   : std::to_string((after - before) * scale / stages);
  };
  return "\"pg_us_per_stage\":" + per(a.pg_ms, b.pg_ms, 1000) +
         ",\"wal_bytes_per_stage\":" + per(a.wal_bytes, b.wal_bytes, 1) +
         ",\"client_cpu_us_per_stage\":" + per(a.cpu_s, b.cpu_s, 1e6);
}

inline double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

// A run of `n` independent no-op stages in `state` (ready, blocked, or finished), inserted in
// one statement as the catalog holds them; returns the run's id.
inline int64_t InsertStages(schema::Catalog& c, int64_t n, const std::string& state,
                            bool with_attempts) {
  const bool open = state == "ready" || state == "blocked";
  std::string run = schema::testing::QueryValue(
      c,
      "WITH p AS (INSERT INTO trnflow.pipelines (name, spec_hash, source) VALUES ('bench', "
      "md5(random()::text), '') RETURNING id) "
      "INSERT INTO trnflow.runs (pipeline_id, project, speed, seed, workdir, state) "
      "SELECT id, 'bench', 1e9, 1, '/', '" +
          std::string(open ? "running" : "succeeded") + "' FROM p RETURNING id");
  StageSpec noop;  // its spec as `submit` writes it
  noop.name = "s";
  noop.instance = "c6i.large";
  noop.command.argv = {"true"};
  const std::string spec = ToJson(noop);
  schema::testing::QueryValue(
      c,
      "INSERT INTO trnflow.stages (run_id, project, name, kind, pool, instance_type, "
      "instance_count, market, state, pending_needs, spec, ready_at, attempts, finished_at) "
      "SELECT " +
          run + ", 'bench', 's' || g, 'run', 'cpu', 'c6i.large', 1, 'on-demand', '" + state +
          "', " + (state == "blocked" ? "1" : "0") + ", '" + spec + "'::jsonb, now(), " +
          (with_attempts ? "1" : "0") + ", " + (open ? "NULL" : "now()") +
          " FROM generate_series(1, " + std::to_string(n) + ") g RETURNING 1");
  if (state == "ready")  // the queue, as submit fills it
    schema::testing::QueryValue(
        c,
        "INSERT INTO trnflow.ready_stages (run_id, stage_id, project, pool, priority, ready_at, "
        "instance_count) SELECT run_id, id, project, pool, priority, ready_at, instance_count "
        "FROM trnflow.stages WHERE run_id = " +
            run + " RETURNING 1");
  if (with_attempts) {
    // History, loaded in one statement: without the rollup's and the metrics' triggers, which
    // would hold every row of it in one transition table (the benchmarks that load history read
    // no report and scrape no /metrics).
    schema::testing::RunOutsideTransaction(
        c, "ALTER TABLE trnflow.attempts DISABLE TRIGGER attempts_roll_up");
    schema::testing::RunOutsideTransaction(
        c, "ALTER TABLE trnflow.attempts DISABLE TRIGGER attempts_count_metrics");
    schema::testing::QueryValue(
        c,
        "INSERT INTO trnflow.attempts (stage_id, run_id, attempt, worker_id, worker_name, "
        "instance_type, instance_count, market, price_usd_hour, finished_at, sim_seconds, "
        "billed_seconds, outcome, cost_usd, wasted_usd, saved_usd, progress_to) "
        "SELECT id, run_id, 1, gen_random_uuid(), 'bench', 'c6i.large', 1, 'on-demand', 0.17, "
        "now(), 60, 60, 'succeeded', 0.002833, 0, 0, 1 FROM trnflow.stages WHERE run_id = " +
            run + " RETURNING 1");
    schema::testing::RunOutsideTransaction(
        c, "ALTER TABLE trnflow.attempts ENABLE TRIGGER attempts_roll_up");
    schema::testing::RunOutsideTransaction(
        c, "ALTER TABLE trnflow.attempts ENABLE TRIGGER attempts_count_metrics");
  }
  return std::stoll(run);
}

}  // namespace trnflow::bench
