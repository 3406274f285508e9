// serve_bench: the dashboard under load. A real `trnflow serve` (the binary) on a fresh
// catalog; STREAMS browsers open the run's page while a STAGES-stage run executes on WORKERS
// no-op worker processes: each follows the event stream (/api/events) and, as the page does,
// re-reads the run (collapsed, ?after= the newest change it was told of) when changes come,
// at most every 500 ms. Meanwhile one more client reads the page, the run's whole JSON (the
// CLI's `show --format json`) and a fresh collapsed reading over and over. The latencies are
// printed (p50, p99, max). Nothing is asserted about time: it prints figures
// (bench/README.md).
// Usage: serve_bench [--stages 10000] [--streams 50] [--workers 2] [--capacity 128]
//                    [--shape fan|chains] [--keep 1]  (keep: leave the database, to study)
// Prints a table on stderr and one JSON line on stdout; needs TRNFLOW_TEST_ADMIN_URL or the
// local PostgreSQL of ops/setup.sh.
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "bench/dag_gen.h"
#include "bench/worker_procs.h"
#include "pipelines/pipeline.h"
#include "sim/catalog.h"

extern char** environ;

using namespace trnflow;
using namespace trnflow::bench;

namespace {

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

// The token `trnflow serve` makes for this run (it is removed at the end).
std::string TokenFile() { return "/tmp/trnflow-serve-bench-" + std::to_string(getpid()) + ".token"; }

// `trnflow serve` on `port`, acting on the catalog at `url`. Every page connects from
// 127.0.0.1 at once: the cap on unauthenticated connections per address is raised to match.
pid_t StartServe(const std::string& url, int port, int max_clients, const std::string& home) {
  std::vector<std::string> env = {"TRNFLOW_DATABASE_URL=" + url, "TRNFLOW_HOME=" + home};
  for (char** e = environ; *e; ++e)
    if (std::string(*e).rfind("TRNFLOW_", 0) != 0 || std::string(*e).rfind("TRNFLOW_LOG=", 0) == 0)
      env.push_back(*e);
  std::vector<std::string> args = {TRNFLOW_BINARY, "serve", "--listen",
                                   "127.0.0.1:" + std::to_string(port), "--max-clients",
                                   std::to_string(max_clients), "--token-file", TokenFile(),
                                   "--max-pending-per-client", std::to_string(2 * max_clients + 16)};
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  std::string log = "/tmp/trnflow-serve-bench-" + std::to_string(getpid()) + ".log";
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  if (posix_spawn(&pid, TRNFLOW_BINARY, &fa, nullptr, argv.data(), envp.data()) != 0) pid = 0;
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

struct Latencies {
  std::vector<double> ms;
  size_t bytes = 0;
  int errors = 0;
};

void Row(const char* what, const Latencies& l) {
  std::fprintf(stderr, "%-28s %8zu %10.1f %10.1f %10.1f %8zd %8d\n", what, l.ms.size(),
               Percentile(l.ms, 0.5), Percentile(l.ms, 0.99),
               l.ms.empty() ? 0.0 : *std::max_element(l.ms.begin(), l.ms.end()),
               std::count_if(l.ms.begin(), l.ms.end(), [](double ms) { return ms > 200; }),
               l.errors);
}

std::string Json(const char* name, const Latencies& l) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "\"%s\":{\"requests\":%zu,\"p50_ms\":%.2f,\"p99_ms\":%.2f,\"errors\":%d}", name,
                l.ms.size(), Percentile(l.ms, 0.5), Percentile(l.ms, 0.99), l.errors);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags(argc, argv);
  int stages = static_cast<int>(flags.Int("stages", 10000));
  int streams = static_cast<int>(flags.Int("streams", 50));
  int workers = static_cast<int>(flags.Int("workers", 2));
  int capacity = static_cast<int>(flags.Int("capacity", 128));
  std::string shape = flags.Text("shape", "fan");
  std::string name = "trnflow_bench_serve_" + std::to_string(getpid());
  std::string url = schema::CreateDatabase(AdminUrl(), name);
  std::string home = "/tmp/trnflow-serve-bench-home-" + std::to_string(getpid());
  std::string file = "/tmp/trnflow-serve-bench-" + std::to_string(getpid()) + ".yaml";
  std::ofstream(file) << DagYaml(shape, stages);
  {
    schema::Catalog c(url);
    PrepareBenchCatalog(c);
  }
  Latencies page, api, fresh, browsers, opens;
  std::mutex browsers_mu;
  std::atomic<int64_t> run_id{0};
  std::atomic<int64_t> events{0};
  std::vector<int64_t> per_stream;  // change events each stream received
  std::atomic<int> open_streams{0}, refused{0};
  double run_s = 0, drain_s = 0;
  int64_t run = 0, changes = 0;
  {
    // Workers fork first, idle and listening, before this process has threads.
    WorkerProcesses procs(url, workers, capacity);
    int port = FreePort();
    pid_t serve = StartServe(url, port, streams + 8, home);
    if (serve <= 0) {
      std::fprintf(stderr, "serve_bench: cannot start %s\n", TRNFLOW_BINARY);
      return 1;
    }
    httplib::Client probe("127.0.0.1", port);
    bool up = false;
    for (int i = 0; i < 300 && !up; ++i) {
      auto r = probe.Get("/healthz");
      up = r && r->status == 200;
      if (!up) usleep(100000);
    }
    if (!up) {
      std::fprintf(stderr, "serve_bench: trnflow serve did not come up (see /tmp/trnflow-serve-bench-%d.log)\n",
                   getpid());
      kill(serve, SIGTERM);
      return 1;
    }
    std::string token;
    std::getline(std::ifstream(TokenFile()), token);
    // STREAMS event streams, each counting the changes it receives, until told to stop.
    std::atomic<bool> stop{false};
    std::vector<std::thread> readers;
    per_stream.assign(streams, 0);
    for (int i = 0; i < streams; ++i)
      readers.emplace_back([&, i] {
        std::string last;
        // The page's reading of the run, as app.js makes it (throttle(load, 500)).
        httplib::Client page_client("127.0.0.1", port);
        page_client.set_read_timeout(60, 0);
        page_client.set_bearer_token_auth(token.c_str());
        auto next_read = Clock::now();
        bool opened = false;
        auto read_run = [&] {
          if (run_id == 0 || last.empty() || Clock::now() < next_read) return;
          if (!opened) {
            // The page opens (?after=latest, as app.js asks), somewhere in the run's first second.
            opened = true;
            usleep(static_cast<useconds_t>(20000 * (i % 50)));
            auto t0 = Clock::now();
            auto r = page_client.Get(
                ("/api/runs/" + std::to_string(run_id.load()) + "?collapse=1&after=latest").c_str());
            double ms = Ms(Clock::now() - t0);
            std::scoped_lock lock(browsers_mu);
            if (!r || r->status != 200) ++opens.errors;
            else opens.ms.push_back(ms);
            return;
          }
          auto t0 = Clock::now();
          auto r = page_client.Get(("/api/runs/" + std::to_string(run_id.load()) +
                                    "?collapse=1&after=" + last).c_str());
          double ms = Ms(Clock::now() - t0);
          next_read = t0 + std::chrono::milliseconds(std::max(500, static_cast<int>(2 * ms)));
          std::scoped_lock lock(browsers_mu);
          if (!r || r->status != 200) ++browsers.errors;
          else browsers.ms.push_back(ms), browsers.bytes = r->body.size();
        };
        while (!stop) {
          httplib::Client c("127.0.0.1", port);
          c.set_read_timeout(30, 0);
          c.set_bearer_token_auth(token.c_str());
          httplib::Headers h;
          if (!last.empty()) h.emplace("Last-Event-ID", last);
          std::string buffer;
          bool counted = false;
          auto r = c.Get(
              "/api/events", h,
              [&](const httplib::Response& res) {
                if (res.status != 200) ++refused;
                else counted = true, ++open_streams;
                return res.status == 200;
              },
              [&](const char* data, size_t n) {
                // Blocks end with a blank line; a chunk may hold thousands of them (read in
                // one pass, the rest kept for the next chunk).
                buffer.append(data, n);
                size_t from = 0, end;
                int64_t seen = 0;
                while ((end = buffer.find("\n\n", from)) != std::string::npos) {
                  std::string_view block(buffer.data() + from, end - from);
                  if (block.find("event: change") != std::string_view::npos) ++seen;
                  if (block.rfind("id: ", 0) == 0)
                    last = std::string(block.substr(4, block.find('\n') - 4));
                  from = end + 2;
                }
                buffer.erase(0, from);
                events += seen;
                per_stream[i] += seen;
                if (seen > 0) read_run();
                return !stop.load();
              });
          (void)r;
          if (counted) --open_streams;
          if (!stop) usleep(200000);
        }
      });
    for (int i = 0; i < 600 && open_streams < streams; ++i) usleep(50000);
    std::fprintf(stderr, "serve_bench: %d event streams open, %d refused\n", open_streams.load(),
                 refused.load());

    schema::Catalog c(url);
    auto loaded = pipelines::LoadPipelineFile(file, {});
    if (!loaded.pipeline) {
      std::fprintf(stderr, "serve_bench: the generated pipeline does not validate\n");
      return 1;
    }
    schema::SubmitOptions opts;
    opts.speed = 1e9;
    opts.workdir = "/tmp";
    double start =
        std::stod(schema::testing::QueryValue(c, "SELECT extract(epoch FROM clock_timestamp())"));
    run = c.SubmitRun(*loaded.pipeline, opts);
    run_id = run;
    std::string id = std::to_string(run);
    std::fprintf(stderr, "serve_bench: run %s, %d stages (%s), %d worker process(es) x %d\n",
                 id.c_str(), stages, shape.c_str(), workers, capacity);
    // While it runs: the run's page and its JSON, one after the other, as fast as they come.
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(60, 0);
    client.set_bearer_token_auth(token.c_str());
    auto timed = [&](const std::string& path, Latencies& l) {
      auto t0 = Clock::now();
      auto r = client.Get(path.c_str());
      double ms = Ms(Clock::now() - t0);
      if (!r || r->status != 200) {
        ++l.errors;
        return;
      }
      l.ms.push_back(ms);
      l.bytes = r->body.size();
    };
    auto finished = [&] {
      return schema::testing::QueryValue(c, "SELECT state FROM trnflow.runs WHERE id = " + id) !=
             "running";
    };
    while (!finished()) {
      timed("/runs/" + id, page);
      timed("/api/runs/" + id, api);
      timed("/api/runs/" + id + "?collapse=1", fresh);
    }
    run_s = std::stod(schema::testing::QueryValue(
                c,
                "SELECT extract(epoch FROM finished_at) FROM trnflow.runs "
                "WHERE id = " +
                    id)) -
            start;
    // Let the streams take in the last changes (at most a minute), then close them.
    changes = std::stoll(schema::testing::QueryValue(c, "SELECT count(*) FROM trnflow.changes"));
    auto drain_start = Clock::now();
    for (int i = 0; i < 1200 && events < changes * streams; ++i) usleep(50000);
    drain_s = Ms(Clock::now() - drain_start) / 1000;
    run_id = 0;  // the browsers stop reading the run
    stop = true;
    kill(serve, SIGTERM);  // ends the streams; the readers see their connections close
    for (auto& t : readers) t.join();
    waitpid(serve, nullptr, 0);
    std::remove(TokenFile().c_str());
    procs.Stop();
  }
  if (flags.Int("keep", 0)) std::fprintf(stderr, "serve_bench: kept %s\n", url.c_str());
  else DropBenchDatabase(name);
  std::filesystem::remove_all(home);
  std::filesystem::remove(file);
  std::fprintf(stderr, "\nwhile the run executed (%.1f s), %d event streams open:\n", run_s,
               streams);
  std::fprintf(stderr, "%-28s %8s %10s %10s %10s %8s %8s\n", "", "requests", "p50 ms", "p99 ms",
               "max ms", ">200 ms", "errors");
  Row("GET /runs/ID", page);
  Row("GET /api/runs/ID (whole)", api);
  Row("  ?collapse=1 (fresh)", fresh);
  Row("  ?collapse=1 (pages open)", opens);
  Row("  ?collapse=1&after= (pages)", browsers);
  std::fprintf(stderr,
               "bodies: whole %zu bytes, collapsed %zu bytes; change events received by all "
               "streams: %lld (%lld changes x %d streams = %lld)\n",
               api.bytes, fresh.bytes, static_cast<long long>(events.load()),
               static_cast<long long>(changes), streams,
               static_cast<long long>(changes * streams));
  int64_t fewest = per_stream.empty() ? 0 : *std::min_element(per_stream.begin(), per_stream.end());
  int64_t most = per_stream.empty() ? 0 : *std::max_element(per_stream.begin(), per_stream.end());
  std::fprintf(stderr, "per stream: %lld to %lld of %lld changes; %s %.1f s after the run finished\n",
               static_cast<long long>(fewest), static_cast<long long>(most),
               static_cast<long long>(changes),
               events == changes * streams ? "all delivered" : "stopped waiting", drain_s);
  std::printf("{\"system\":\"trnflow\",\"workload\":\"serve\",\"stages\":%d,\"streams\":%d,"
              "\"run_s\":%.3f,%s,%s,%s,%s,%s,\"api_bytes\":%zu,\"events\":%lld,\"changes\":%lld,"
              "\"drain_s\":%.2f,\"per_stream_min\":%lld,\"per_stream_max\":%lld,"
              "\"refused\":%d}\n",
              stages, streams, run_s, Json("page", page).c_str(), Json("api", api).c_str(),
              Json("collapsed_fresh", fresh).c_str(), Json("collapsed_opens", opens).c_str(),
              Json("collapsed_pages", browsers).c_str(),
              api.bytes, static_cast<long long>(events.load()), static_cast<long long>(changes),
              drain_s, static_cast<long long>(fewest), static_cast<long long>(most), refused.load());
  return 0;
}
