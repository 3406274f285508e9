// scale_bench: a year of a busy lab, then every read a person or a scraper makes, at growing
// history. A catalog gets 200 projects, 1,000 schedules, 50 month budgets and 10 total ones,
// 5,000 compile cache entries, 20 live workers and one 10,000-stage run; then its ledger grows
// to each of SIZES attempts (100 per run, spread over the past year) and each read is timed:
// the CLI's (`runs`, `show` of the 10,000-stage run, `spend` by project, stage, day and run,
// `budget ls`, `cache ls`, `workers`: the binary, as a person runs it) and the dashboard's
// (`trnflow serve`: each page, each /api answer the pages read, a /metrics scrape).
//
// The history is the product's own rows: one run of a 100-stage sweep is made by `trnflow run`
// (the write path: submit, claims, completions, a spot interruption, the ledger), then copied
// with generate_series: every column as the write path wrote it, ids renumbered, the project
// one of 200, every timestamp shifted into the past year. Each chunk of copied attempts (2,000
// runs, 200,000 attempts, one statement) goes through the ledger's own statement triggers, so the
// spend rollups and /metrics' counters are kept as closes keep them, chunk by chunk, and a load
// stopped part way leaves them right for what it copied. The runs' and stages' change-feed
// triggers are off while copying (a loader writes no change feed), and the stages are packed
// (fillfactor 100) while copying: the write path's 50 leaves room for updates copied history
// never gets.
//
// Prints a table (p50 ms per read and size, and the growth from the first size to the last) on
// stderr and, with --json, one JSON line per size on stdout. Nothing is asserted about time.
// Usage: scale_bench [--sizes 100000,1000000,10000000] [--reps 5] [--keep 1] [--database NAME]
// Needs TRNFLOW_TEST_ADMIN_URL (bench/scale.sh starts a private PostgreSQL) or the local one.
// --database NAME times the reads of a catalog kept by an earlier `--keep 1` run, loading
// nothing (after migrating it; the migrations' time is printed): a new build's reads over a
// 10M ledger without loading it again. TRNFLOW_SCALE_BINARY runs another trnflow binary than
// the build's (a copy, so that a rebuild during an hour's load does not change it mid-run).
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "sim/catalog.h"

extern char** environ;

using namespace trnflow;
using namespace trnflow::bench;

namespace {

constexpr int kProjects = 200;
constexpr int64_t kAttemptsPerRun = 100;

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  close(fd);
  return port;
}

std::vector<std::string> Env(const std::string& url, const std::string& home) {
  std::vector<std::string> env = {"TRNFLOW_DATABASE_URL=" + url, "TRNFLOW_HOME=" + home};
  for (char** e = environ; *e; ++e)
    if (std::string(*e).rfind("TRNFLOW_", 0) != 0) env.push_back(*e);
  return env;
}

const char* Binary() {
  const char* b = getenv("TRNFLOW_SCALE_BINARY");
  return b && *b ? b : TRNFLOW_BINARY;
}

// Runs the trnflow binary with `args`; its output goes to `log`. Returns its exit code.
pid_t Spawn(const std::vector<std::string>& args, const std::vector<std::string>& env,
            const std::string& log) {
  std::vector<std::string> all = {Binary()};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv, envp;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> e = env;
  for (auto& x : e) envp.push_back(x.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  if (posix_spawn(&pid, Binary(), &fa, nullptr, argv.data(), envp.data()) != 0) pid = 0;
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

int RunCli(const std::vector<std::string>& args, const std::vector<std::string>& env,
           const std::string& log) {
  pid_t pid = Spawn(args, env, log);
  if (pid <= 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The template: the climate example with a 96-cell compile sweep (100 stages), as a lab's
// nightly precompilation and training pipeline.
std::string TemplateYaml() {
  std::string y = Slurp(TRNFLOW_SOURCE_DIR "/examples/climate/pipeline.yaml");
  const std::string from = "matrix: {seq_len: [512, 1024, 2048], batch: [1, 8]}";
  size_t at = y.find(from);
  if (at != std::string::npos)
    y.replace(at, from.size(),
              "matrix: {seq_len: [512, 1024, 2048, 4096], batch: [1, 2, 3, 4, 5, 6, 7, 8, 9, "
              "10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24]}");
  return y;
}

// Columns of a trnflow table, in order, with whether each is a timestamptz.
std::vector<std::pair<std::string, bool>> Columns(schema::Catalog& c, const std::string& table) {
  std::string list = schema::testing::QueryValue(
      c,
      "SELECT string_agg(column_name || ':' || (data_type = 'timestamp with time zone')::text, "
      "',' ORDER BY ordinal_position) FROM information_schema.columns WHERE table_schema = "
      "'trnflow' AND table_name = '" +
          table + "' AND is_generated = 'NEVER'");
  std::vector<std::pair<std::string, bool>> out;
  std::stringstream s(list);
  for (std::string item; std::getline(s, item, ',');) {
    auto colon = item.find(':');
    out.push_back({item.substr(0, colon), item.substr(colon + 1) == "true"});
  }
  return out;
}

// INSERT INTO table (every column) SELECT (each column, or its override, or a timestamp
// shifted by `shift`) FROM `from`.
std::string CloneSql(schema::Catalog& c, const std::string& table,
                     const std::map<std::string, std::string>& overrides,
                     const std::string& shift, const std::string& from) {
  std::string cols, exprs;
  for (const auto& [name, is_time] : Columns(c, table)) {
    cols += (cols.empty() ? "" : ", ") + name;
    std::string e;
    if (auto it = overrides.find(name); it != overrides.end())
      e = it->second;
    else if (is_time)
      e = "t." + name + " + " + shift;
    else
      e = "t." + name;
    exprs += (exprs.empty() ? "" : ", ") + e;
  }
  return "INSERT INTO trnflow." + table + " (" + cols + ") SELECT " + exprs + " FROM " + from;
}

struct Template {
  int64_t run = 0, smin = 0, smax = 0, amin = 0, amax = 0, attempts = 0;
  std::string created;  // the template run's created_at, as text
};

// Copies the template run `n` times: run ids from `run_base` + 1, a project each of 200, its
// timestamps somewhere in the past year (a hash of the run id, so sizes add history all over
// the year, as a busier lab would have).
void CloneRuns(schema::Catalog& c, const Template& t, int64_t n) {
  const int64_t chunk = 2000;
  for (int64_t done = 0; done < n; done += chunk) {
    int64_t k = std::min(chunk, n - done);
    int64_t run_base =
        std::stoll(schema::testing::QueryValue(c, "SELECT coalesce(max(id), 0) FROM trnflow.runs"));
    int64_t stage_base = std::stoll(
        schema::testing::QueryValue(c, "SELECT coalesce(max(id), 0) FROM trnflow.stages"));
    int64_t att_base = std::stoll(
        schema::testing::QueryValue(c, "SELECT coalesce(max(id), 0) FROM trnflow.attempts"));
    const int64_t S = t.smax - t.smin + 1, A = t.amax - t.amin + 1;
    const std::string run_id = "(" + std::to_string(run_base) + " + g)";
    const std::string project =
        "('p' || lpad(((" + run_id + ") % " + std::to_string(kProjects) + ")::text, 3, '0'))";
    const std::string shift = "((now() - ((((" + run_id + ") * 2654435761) % 31536000) * "
                              "interval '1 second')) - '" + t.created + "'::timestamptz)";
    auto stage = [&](const std::string& col) {
      return "(" + std::to_string(stage_base) + " + (g - 1) * " + std::to_string(S) + " + " + col +
             " - " + std::to_string(t.smin) + " + 1)";
    };
    auto attempt = [&](const std::string& col) {
      return "(" + std::to_string(att_base) + " + (g - 1) * " + std::to_string(A) + " + " + col +
             " - " + std::to_string(t.amin) + " + 1)";
    };
    const std::string series = "generate_series(1, " + std::to_string(k) + ") g";
    const std::string of_run = " WHERE t.run_id = " + std::to_string(t.run);
    schema::testing::QueryValue(
        c, CloneSql(c, "runs",
                    {{"id", run_id},
                     {"project", project},
                     {"pipeline_id", "(SELECT min(id) FROM trnflow.pipelines) + g % 5"}},
                    shift, "trnflow.runs t, " + series + " WHERE t.id = " + std::to_string(t.run)) +
               " RETURNING 1");
    schema::testing::QueryValue(
        c, CloneSql(c, "stages",
                    {{"id", stage("t.id")},
                     {"run_id", run_id},
                     {"project", project},
                     {"attempt_id", "CASE WHEN t.attempt_id IS NULL THEN NULL ELSE " +
                                        attempt("t.attempt_id") + " END"}},
                    shift, "trnflow.stages t, " + series + of_run) +
               " RETURNING 1");
    schema::testing::QueryValue(
        c, CloneSql(c, "stage_deps",
                    {{"stage_id", stage("t.stage_id")}, {"needs_id", stage("t.needs_id")}}, shift,
                    "trnflow.stage_deps t JOIN trnflow.stages s ON s.id = t.stage_id, " + series +
                        " WHERE s.run_id = " + std::to_string(t.run)) +
               " RETURNING 1");
    schema::testing::QueryValue(
        c,
        CloneSql(c, "attempts",
                 {{"id", attempt("t.id")}, {"stage_id", stage("t.stage_id")}, {"run_id", run_id}},
                 shift, "trnflow.attempts t, " + series + of_run) +
            " RETURNING 1");
  }
  schema::testing::QueryValue(
      c,
      "SELECT setval('trnflow.runs_id_seq', (SELECT max(id) FROM trnflow.runs)), "
      "setval('trnflow.stages_id_seq', (SELECT max(id) FROM trnflow.stages)), "
      "setval(pg_get_serial_sequence('trnflow.attempts', 'id'), "
      "(SELECT max(id) FROM trnflow.attempts))");
}

// One read: a CLI command or an HTTP GET, timed.
struct Read {
  std::string name;
  std::vector<std::string> cli;  // empty: an HTTP GET of `path`
  std::string path;
};

}  // namespace

int main(int argc, char** argv) {
  Flags flags(argc, argv);
  std::filesystem::current_path(TRNFLOW_SOURCE_DIR);  // the example's commands are relative
  std::vector<int64_t> sizes;
  {
    std::stringstream s(flags.Text("sizes", "100000,1000000,10000000"));
    for (std::string x; std::getline(s, x, ',');) sizes.push_back(std::stoll(x));
  }
  int reps = static_cast<int>(flags.Int("reps", 5));
  bool json = flags.Int("json", 0) != 0;
  const std::string reuse = flags.Text("database", "");
  bool keep = flags.Int("keep", reuse.empty() ? 0 : 1) != 0;  // a kept catalog stays kept
  std::string name = reuse.empty() ? "trnflow_bench_scale_" + std::to_string(getpid()) : reuse;
  std::string url;
  if (reuse.empty()) {
    url = schema::CreateDatabase(AdminUrl(), name);
  } else {
    static const std::regex uri(R"(^(postgres(?:ql)?://[^/?]*)(/[^?]*)?(\?.*)?$)");
    std::smatch m;
    std::string admin = AdminUrl();
    url = std::regex_match(admin, m, uri) ? m[1].str() + "/" + name + m[3].str()
                                          : admin + " dbname=" + name;
  }
  std::string home = "/tmp/trnflow-scale-bench-home-" + std::to_string(getpid());
  std::string log = "/tmp/trnflow-scale-bench-" + std::to_string(getpid()) + ".log";
  std::filesystem::create_directories(home);
  auto env = Env(url, home);
  std::fprintf(stderr, "scale_bench: database %s; logs in %s\n", name.c_str(), log.c_str());

  auto catalog = std::make_unique<schema::Catalog>(url);
  schema::Catalog& c = *catalog;
  if (!reuse.empty()) {  // a load stopped part way leaves them off and the stages packed
    for (const char* table : {"stages", "runs"})
      schema::testing::RunOutsideTransaction(c, std::string("ALTER TABLE trnflow.") + table + " ENABLE TRIGGER USER");
    schema::testing::RunOutsideTransaction(c, "ALTER TABLE trnflow.stages SET (fillfactor = 50)");
  }
  auto m0 = Clock::now();
  c.Migrate(sim::Catalog::Builtin());
  if (!reuse.empty()) {
    std::fprintf(stderr, "scale_bench: %s migrated in %.1f s\n", name.c_str(),
                 Ms(Clock::now() - m0) / 1000);
  }
  auto t0 = Clock::now();
  Template t;
  if (reuse.empty()) {
  // Projects p000..p199; the template run is p000's, made by the write path.
  schema::testing::QueryValue(
      c,
      "INSERT INTO trnflow.projects (name) SELECT 'p' || lpad(g::text, 3, '0') FROM "
      "generate_series(0, " +
          std::to_string(kProjects - 1) + ") g RETURNING 1");
  std::string file = home + "/sweep.yaml";
  std::ofstream(file) << TemplateYaml();
  int code = RunCli({"run", file, "--project", "p000", "--speed", "1000000"}, env, log);
  if (code != 0) {
    std::fprintf(stderr, "scale_bench: the template run failed (exit %d); see %s\n", code,
                 log.c_str());
    return 1;
  }
  t.run = std::stoll(schema::testing::QueryValue(c, "SELECT max(id) FROM trnflow.runs"));
  t.smin = std::stoll(schema::testing::QueryValue(c, "SELECT min(id) FROM trnflow.stages"));
  t.smax = std::stoll(schema::testing::QueryValue(c, "SELECT max(id) FROM trnflow.stages"));
  t.amin = std::stoll(schema::testing::QueryValue(c, "SELECT min(id) FROM trnflow.attempts"));
  t.amax = std::stoll(schema::testing::QueryValue(c, "SELECT max(id) FROM trnflow.attempts"));
  t.attempts = std::stoll(schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.attempts"));
  t.created = schema::testing::QueryValue(
      c, "SELECT created_at::text FROM trnflow.runs WHERE id = " + std::to_string(t.run));
  std::fprintf(stderr, "scale_bench: template run %lld: %s stages, %lld attempts\n",
               static_cast<long long>(t.run),
               schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.stages").c_str(),
               static_cast<long long>(t.attempts));
  // Four more pipelines of the same text (runs are spread over five).
  schema::testing::QueryValue(
      c,
      "INSERT INTO trnflow.pipelines (name, spec_hash, source) SELECT name || '-' || g, "
      "spec_hash, source FROM trnflow.pipelines, generate_series(1, 4) g RETURNING 1");
  // What the rest of a lab's catalog holds: schedules (nightly, staggered), budgets, cache
  // entries (copies of the template's compiled graphs under new keys), live workers.
  schema::testing::QueryValue(
      c,
      "INSERT INTO trnflow.schedules (name, file, source, project, cron, speed, workdir) "
      "SELECT 'nightly-' || g, '" +
          file + "', p.source, 'p' || lpad((g % " + std::to_string(kProjects) +
          ")::text, 3, '0'), (g % 60) || ' ' || (g % 24) || ' * * *', "
          "1000000, '/tmp' FROM generate_series(1, 1000) g, (SELECT source FROM trnflow.pipelines "
          "ORDER BY id LIMIT 1) p RETURNING 1");
  schema::testing::QueryValue(
      c,
      "INSERT INTO trnflow.budgets (project, amount_usd, period) SELECT 'p' || "
      "lpad(g::text, 3, '0'), 10000, CASE WHEN g < 50 THEN 'month' ELSE 'total' END "
      "FROM generate_series(0, 59) g RETURNING 1");
  {
    std::map<std::string, std::string> o = {
        {"id", "(SELECT max(id) FROM trnflow.artifacts) + g"},
        {"cache_key", "t.cache_key || '-' || g"}};
    auto cols = Columns(c, "artifacts");
    if (std::any_of(cols.begin(), cols.end(), [](auto& p) { return p.first == "digest"; }))
      o["digest"] = "CASE WHEN t.digest IS NULL THEN NULL ELSE md5(t.digest || g) END";
    schema::testing::QueryValue(c,
                                CloneSql(c, "artifacts", o, "interval '0'",
                                         "(SELECT * FROM trnflow.artifacts ORDER BY id LIMIT 1) t, "
                                         "generate_series(1, 5000) g") +
                                    " RETURNING 1");
    schema::testing::QueryValue(
        c,
        "SELECT setval(pg_get_serial_sequence('trnflow.artifacts', 'id'), (SELECT "
        "max(id) FROM trnflow.artifacts))");
  }
  schema::testing::QueryValue(
      c,
      "INSERT INTO trnflow.workers (id, host, pid, pools) SELECT gen_random_uuid(), "
      "'host-' || g, g, '{\"trn1\": 8, \"cpu\": 16}' FROM generate_series(1, 20) g "
      "RETURNING 1");
  // The 10,000-stage run `show` reads: the template run's first compile stage, 10,000 times.
  {
    int64_t run_base =
        std::stoll(schema::testing::QueryValue(c, "SELECT max(id) FROM trnflow.runs"));
    int64_t stage_base =
        std::stoll(schema::testing::QueryValue(c, "SELECT max(id) FROM trnflow.stages"));
    int64_t att_base =
        std::stoll(schema::testing::QueryValue(c, "SELECT max(id) FROM trnflow.attempts"));
    std::string one =
        schema::testing::QueryValue(c,
                                    "SELECT min(id) FROM trnflow.stages WHERE kind = 'compile' "
                                    "AND run_id = " +
                                        std::to_string(t.run));
    std::string big = std::to_string(run_base + 1);
    schema::testing::QueryValue(c,
                                CloneSql(c, "runs", {{"id", big}}, "interval '0'",
                                         "trnflow.runs t WHERE t.id = " + std::to_string(t.run)) +
                                    " RETURNING 1");
    schema::testing::QueryValue(
        c, CloneSql(c, "stages",
                    {{"id", std::to_string(stage_base) + " + g"},
                     {"run_id", big},
                     {"name", "'sweep[i=' || g || ']'"},
                     {"attempt_id", "CASE WHEN t.attempt_id IS NULL THEN NULL ELSE " +
                                        std::to_string(att_base) + " + g END"}},
                    "interval '0'",
                    "trnflow.stages t, generate_series(1, 10000) g WHERE t.id = " + one) +
               " RETURNING 1");
    schema::testing::QueryValue(
        c, CloneSql(c, "attempts",
                    {{"id", std::to_string(att_base) + " + g"},
                     {"stage_id", std::to_string(stage_base) + " + g"},
                     {"run_id", big}},
                    "interval '0'",
                    "(SELECT * FROM trnflow.attempts WHERE stage_id = " + one +
                        " ORDER BY attempt DESC LIMIT 1) t, generate_series(1, 10000) g") +
               " RETURNING 1");
  }
  }  // a new catalog
  // The 10,000-stage run: the one after the template run, which is the first.
  const std::string big_run =
      schema::testing::QueryValue(c, "SELECT min(id) + 1 FROM trnflow.runs");
  if (reuse.empty())
    schema::testing::QueryValue(
        c,
        "SELECT setval('trnflow.runs_id_seq', (SELECT max(id) FROM trnflow.runs)), "
        "setval('trnflow.stages_id_seq', (SELECT max(id) FROM trnflow.stages)), "
        "setval(pg_get_serial_sequence('trnflow.attempts', 'id'), "
        "(SELECT max(id) FROM trnflow.attempts))");
  std::fprintf(stderr, "scale_bench: catalog made in %.1f s\n", Ms(Clock::now() - t0) / 1000);

  // The dashboard.
  int port = FreePort();
  std::string token_file = home + "/serve.token";
  std::vector<std::string> serve_env = env;
  pid_t serve = Spawn({"serve", "--listen", "127.0.0.1:" + std::to_string(port), "--token-file",
                       token_file},
                      serve_env, log + ".serve");
  httplib::Client http("127.0.0.1", port);
  http.set_read_timeout(600, 0);
  bool up = false;
  for (int i = 0; i < 300 && !up; ++i) {
    auto r = http.Get("/healthz");
    up = r && r->status == 200;
    if (!up) usleep(100000);
  }
  if (!up) {
    std::fprintf(stderr, "scale_bench: trnflow serve did not come up (%s.serve)\n", log.c_str());
    return 1;
  }
  std::string token;
  std::getline(std::ifstream(token_file), token);
  http.set_bearer_token_auth(token.c_str());

  const std::string proj = "p007";
  std::vector<Read> reads = {
      {"runs", {"runs"}, ""},
      {"runs --project", {"runs", "--project", proj}, ""},
      {"show (10,000 stages)", {"show", big_run}, ""},
      {"spend --by project", {"spend", "--by", "project"}, ""},
      {"spend --by stage --project", {"spend", "--by", "stage", "--project", proj}, ""},
      {"spend --by day", {"spend", "--by", "day"}, ""},
      {"spend --by run --project", {"spend", "--by", "run", "--project", proj}, ""},
      {"budget ls", {"budget", "ls"}, ""},
      {"cache ls", {"cache", "ls"}, ""},
      {"workers", {"workers"}, ""},
      {"page /runs", {}, "/runs"},
      {"/api/runs", {}, "/api/runs"},
      {"/api/runs?project", {}, "/api/runs?project=" + proj},
      {"/api/runs/N (10,000, collapsed)", {}, "/api/runs/" + big_run + "?collapse=1"},
      {"/api/runs/N (10,000, whole)", {}, "/api/runs/" + big_run},
      {"/api/spend?by=project", {}, "/api/spend?by=project"},
      {"/api/spend?by=pipeline", {}, "/api/spend?by=pipeline"},
      {"/api/spend?by=instance", {}, "/api/spend?by=instance"},
      {"/api/spend?by=month", {}, "/api/spend?by=month"},
      {"/api/spend?by=day", {}, "/api/spend?by=day"},
      {"/api/savings", {}, "/api/savings"},
      {"/api/budgets", {}, "/api/budgets"},
      {"/api/cache", {}, "/api/cache"},
      {"/api/schedules", {}, "/api/schedules"},
      {"/api/workers", {}, "/api/workers"},
      {"/metrics", {}, "/metrics"},
  };
  std::map<std::string, std::vector<double>> p50;  // read -> p50 per size
  std::vector<int64_t> measured;
  int64_t have =
      reuse.empty()
          ? t.attempts + 10000
          : std::stoll(schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.attempts"));
  for (int64_t size : sizes) {
    auto g0 = Clock::now();
    int64_t runs = reuse.empty() ? std::max<int64_t>(0, (size - have) / t.attempts) : 0;
    if (runs > 0) {
      // The ledger's triggers fold each chunk into the rollups and counters; the change feed's
      // are off, and the stages packed, while copying.
      for (const char* table : {"stages", "runs"})
        schema::testing::RunOutsideTransaction(c, std::string("ALTER TABLE trnflow.") + table +
                                " DISABLE TRIGGER USER");
      schema::testing::RunOutsideTransaction(c, "ALTER TABLE trnflow.stages SET (fillfactor = 100)");
      CloneRuns(c, t, runs);
      schema::testing::RunOutsideTransaction(c, "ALTER TABLE trnflow.stages SET (fillfactor = 50)");
      for (const char* table : {"stages", "runs"})
        schema::testing::RunOutsideTransaction(c, std::string("ALTER TABLE trnflow.") + table +
                                " ENABLE TRIGGER USER");
      have += runs * t.attempts;
    }
    if (reuse.empty()) {
      schema::testing::RunOutsideTransaction(c, "VACUUM ANALYZE");
    } else {  // a kept catalog of tens of GB: statistics, and the visibility of what reads read
      schema::testing::RunOutsideTransaction(c, "ANALYZE");
      schema::testing::RunOutsideTransaction(
          c,
          "VACUUM ANALYZE trnflow.runs, trnflow.spend_month, "
          "trnflow.spend_month_stage, trnflow.spend_day, trnflow.spend_rollup, "
          "trnflow.attempt_counts, trnflow.budgets, trnflow.workers, "
          "trnflow.artifacts, trnflow.schedules");
    }
    int64_t attempts =
        std::stoll(schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.attempts"));
    std::fprintf(
        stderr,
        "scale_bench: %lld attempts, %s runs, %s stages, %s rollup rows (grown in "
        "%.1f s); timing %zu reads x %d\n",
        static_cast<long long>(attempts),
        schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.runs").c_str(),
        schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.stages").c_str(),
        schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.spend_rollup").c_str(),
        Ms(Clock::now() - g0) / 1000, reads.size(), reps);
    measured.push_back(attempts);
    std::string line = "{\"system\":\"trnflow\",\"workload\":\"scale\",\"attempts\":" +
                       std::to_string(attempts);
    for (const auto& r : reads) {
      std::vector<double> ms;
      int errors = 0;
      for (int i = 0; i <= reps; ++i) {  // the first is a warm-up
        auto s = Clock::now();
        bool ok;
        if (!r.cli.empty()) {
          ok = RunCli(r.cli, env, log + ".read") == 0;
        } else {
          auto res = http.Get(r.path.c_str());
          ok = res && res->status == 200;
        }
        if (!ok) ++errors;
        if (i > 0) ms.push_back(Ms(Clock::now() - s));
      }
      double m = Percentile(ms, 0.5);
      p50[r.name].push_back(m);
      std::fprintf(stderr, "  %-34s %10.1f ms%s\n", r.name.c_str(), m,
                   errors ? "  (errors: see the logs)" : "");
      line += ",\"" + r.name + "\":" + std::to_string(m);
    }
    if (json) std::printf("%s}\n", line.c_str());
    std::fflush(stdout);
  }

  // The table: p50 per size, and the growth from the first size to the last.
  std::fprintf(stderr, "\n| read |");
  for (int64_t a : measured) std::fprintf(stderr, " %lld attempts |", static_cast<long long>(a));
  std::fprintf(stderr, " growth |\n|---|");
  for (size_t i = 0; i <= measured.size(); ++i) std::fprintf(stderr, "---:|");
  std::fprintf(stderr, "\n");
  for (const auto& r : reads) {
    const auto& v = p50[r.name];
    std::fprintf(stderr, "| %s |", r.name.c_str());
    for (double x : v) std::fprintf(stderr, " %.1f ms |", x);
    std::fprintf(stderr, " %.2fx |\n", v.empty() || v.front() <= 0 ? 0 : v.back() / v.front());
  }
  kill(serve, SIGTERM);
  waitpid(serve, nullptr, 0);
  std::filesystem::remove_all(home);
  catalog.reset();
  if (!keep) {
    DropBenchDatabase(name);
  } else {
    std::fprintf(stderr, "scale_bench: kept database %s\n", name.c_str());
  }
  return 0;
}
