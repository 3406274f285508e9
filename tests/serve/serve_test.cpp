// Issue 18, `trnflow serve`: the dashboard as people and Prometheus use it. Everything is real
// and started here: a catalog database, the climate example run by the real binary, a worker
// daemon, `trnflow serve` (one with no login on loopback, one behind a "proxy" header),
// headless chromium, promtool and a Prometheus server. Screenshots are kept under
// build/test-artifacts/serve/.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "schema/catalog.h"
#include "schema/catalog_testing.h"
#include "serve/metrics.h"
#include "serve/server.h"
#include "tests/daemon.h"
#include "tests/run_cli.h"
#include "tests/test_db.h"

namespace trnflow {
namespace {

namespace fs = std::filesystem;
using testing::Daemon;
using testing::ReadFile;
using testing::RunTrnflow;
using testing::Sh;
using testing::TestDatabase;
using testing::Query;
using testing::QueryNumber;
using testing::WaitFor;
using testing::WriteTempFile;

[[maybe_unused]] auto* const kDatabase =
    ::testing::AddGlobalTestEnvironment(new TestDatabase("trnflow_serve"));

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

// Each dashboard's secret file (made by the dashboard: its --token-file, or --proxy-secret-file
// with --auth proxy), and the header that presents it, by port.
struct Credential {
  std::string file, secret;
  httplib::Headers headers;
};
std::map<int, Credential>& Credentials() {
  static std::map<int, Credential> c;
  return c;
}

std::string SecretDir() {
  std::string dir = fs::temp_directory_path() / ("trnflow-serve-secrets-" + std::to_string(getpid()));
  fs::create_directories(dir);
  fs::permissions(dir, fs::perms::owner_all);
  return dir;
}

// Starts `trnflow serve ARGS --listen 127.0.0.1:0` with a secret file of its own (made by it)
// and returns the port it prints.
int StartServe(std::unique_ptr<Daemon>& d, const std::string& name,
               std::vector<std::string> args) {
  bool proxy = std::find(args.begin(), args.end(), "proxy") != args.end();
  std::string file = SecretDir() + "/" + name + (proxy ? ".proxy-secret" : ".token");
  fs::remove(file);
  args.insert(args.begin(), {"serve", "--listen", "127.0.0.1:0",
                             proxy ? "--proxy-secret-file" : "--token-file", file});
  d = std::make_unique<Daemon>(name, args,
                               std::vector<std::string>{"TRNFLOW_HOME=" + testing::CliHome()});
  d->Start();
  int port = 0;
  std::regex re(R"(listening on http://127\.0\.0\.1:(\d+)/)");
  WaitFor(
      [&] {
        std::smatch m;
        std::string log = ReadFile(d->log_path());
        if (std::regex_search(log, m, re)) port = std::stoi(m[1]);
        return port > 0;
      },
      30);
  EXPECT_GT(port, 0) << ReadFile(d->log_path());
  Credential c;
  c.file = file;
  c.secret = ReadFile(file);
  while (!c.secret.empty() && c.secret.back() == '\n') c.secret.pop_back();
  EXPECT_GE(c.secret.size(), 32u) << file;
  if (proxy)
    c.headers = {{"X-Trnflow-Proxy-Secret", c.secret}};
  else
    c.headers = {{"Authorization", "Bearer " + c.secret}};
  Credentials()[port] = c;
  return port;
}

// `headers` and, with `authenticate`, the dashboard's credential (what the operator or the
// proxy sends), unless `headers` presents one of its own.
httplib::Headers WithCredential(int port, httplib::Headers headers, bool authenticate) {
  if (!authenticate || headers.count("Authorization") || headers.count("X-Trnflow-Proxy-Secret"))
    return headers;
  if (auto it = Credentials().find(port); it != Credentials().end())
    for (const auto& h : it->second.headers) headers.insert(h);
  return headers;
}

struct Http {
  int status = 0;
  std::string body;
  int64_t change = -1;  // X-Trnflow-Change: the newest change a shared answer shows (-1: none)
  std::string location, set_cookie;
};

Http Get(int port, const std::string& path, const httplib::Headers& headers = {},
         bool authenticate = true) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  auto r = c.Get(path.c_str(), WithCredential(port, headers, authenticate));
  if (!r) return {};
  std::string change = r->get_header_value("X-Trnflow-Change");
  return {r->status, r->body, change.empty() ? -1 : std::stoll(change),
          r->get_header_value("Location"), r->get_header_value("Set-Cookie")};
}

nlohmann::json Json(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << text;
  return j;
}

// Rows of a query as the test database's owner, each a list of text fields.
std::vector<std::vector<std::string>> Rows(const std::string& sql) {
  auto rows = nlohmann::ordered_json::parse(
      Query("SELECT coalesce(json_agg(to_json(x)), '[]')::text FROM (" + sql + ") x"));
  std::vector<std::vector<std::string>> out;
  for (const auto& r : rows) {
    std::vector<std::string> fields;
    for (const auto& v : r) fields.push_back(v.is_string() ? v.get<std::string>() : v.dump());
    out.push_back(std::move(fields));
  }
  return out;
}

nlohmann::json CliJson(const std::string& args) {
  auto r = RunTrnflow(args);
  EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.err;
  return Json(r.out);
}

int64_t RunIdFrom(const std::string& out) {
  std::smatch m;
  EXPECT_TRUE(std::regex_search(out, m, std::regex(R"(run (\d+)[: ])"))) << out;
  return m.empty() ? 0 : std::stoll(m[1]);
}

std::string ArtifactDir() {
  fs::create_directories(TRNFLOW_ARTIFACT_DIR);
  return TRNFLOW_ARTIFACT_DIR;
}

// The operator's browser opens the address with the token once (it becomes a cookie).
std::string WithToken(std::string url) {
  std::smatch m;
  if (std::regex_search(url, m, std::regex(R"(^http://127\.0\.0\.1:(\d+)/)")))
    if (auto it = Credentials().find(std::stoi(m[1])); it != Credentials().end() &&
                                                        it->second.headers.count("Authorization"))
      url += (url.find('?') == std::string::npos ? "?token=" : "&token=") + it->second.secret;
  return url;
}

// A chromium profile of its own each time: chromium started again on a profile it used waits
// on it.
std::string FreshProfile() {
  static int calls = 0;
  std::string p = fs::temp_directory_path() /
                  ("trnflow-chromium-" + std::to_string(getpid()) + "-" + std::to_string(++calls));
  fs::remove_all(p);
  return p;
}

const char* const kChromium =
    "chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run "
    "--window-size=1400,1100 ";

// Headless chromium: the DOM after the page's scripts ran (and, with `screenshot`, a PNG of it
// kept as a test artifact). Chromium runs the page on virtual time for `budget_ms`: timers and
// fetches finish without waiting for the wall clock.
std::string Browse(std::string url, const std::string& screenshot = "", int budget_ms = 8000) {
  url = WithToken(url);
  auto common = [&](const std::string& profile) {
    return std::string("timeout 120 ") + kChromium + "--user-data-dir=" + profile +
           " --virtual-time-budget=" + std::to_string(budget_ms) + " ";
  };
  if (!screenshot.empty()) {
    std::string profile = FreshProfile();
    auto s = Sh(common(profile) + "--hide-scrollbars --screenshot=" + ArtifactDir() + "/" +
                screenshot + " '" + url + "'");
    fs::remove_all(profile);
    EXPECT_EQ(s.exit_code, 0) << s.out;
    EXPECT_TRUE(fs::exists(ArtifactDir() + "/" + screenshot)) << s.out;
  }
  std::string profile = FreshProfile();
  auto s = Sh(common(profile) + "--dump-dom '" + url + "' 2>/dev/null");
  fs::remove_all(profile);
  EXPECT_EQ(s.exit_code, 0) << s.out;
  return s.out;
}

// Headless chromium on the wall clock, for a page that follows a stream (virtual time stands
// still while a request is open, so a budget of it passes only in wall time): the page is
// opened and `ready`, a JavaScript expression, is evaluated every 100 ms; once it is true, or
// after `timeout_s`, the DOM is returned as --dump-dom prints it (document.documentElement's
// outerHTML). Driven over the DevTools protocol on a pipe (--remote-debugging-pipe: chromium
// reads commands from fd 3 and writes replies on fd 4, each a JSON text ended by a NUL).
std::string BrowseUntil(const std::string& address, const std::string& ready, double timeout_s) {
  const std::string url = WithToken(address);
  const std::string profile = FreshProfile();
  int to_chromium[2], from_chromium[2];
  if (::pipe2(to_chromium, O_CLOEXEC) != 0 || ::pipe2(from_chromium, O_CLOEXEC) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return "";
  }
  std::string command = std::string("exec ") + kChromium + "--user-data-dir=" + profile +
                        " --remote-debugging-pipe about:blank 2>/dev/null";
  pid_t pid = ::fork();
  if (pid == 0) {
    // Above 4 first, so that neither dup2 below closes the other's source.
    int in = ::fcntl(to_chromium[0], F_DUPFD, 10), out = ::fcntl(from_chromium[1], F_DUPFD, 10);
    ::dup2(in, 3);
    ::dup2(out, 4);
    ::execl("/bin/sh", "sh", "-c", command.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(to_chromium[0]);
  ::close(from_chromium[1]);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int>(timeout_s * 1000) + 30000);
  std::string pending;  // what chromium wrote after the last whole message
  int next_id = 0;
  // Sends a command and returns its reply's "result" (null when none came before the deadline).
  auto call = [&](const std::string& method, nlohmann::json params,
                  const std::string& session = "") -> nlohmann::json {
    nlohmann::json msg = {{"id", ++next_id}, {"method", method}, {"params", std::move(params)}};
    if (!session.empty()) msg["sessionId"] = session;
    std::string text = msg.dump();
    text.push_back('\0');
    if (::write(to_chromium[1], text.data(), text.size()) != static_cast<ssize_t>(text.size()))
      return nullptr;
    for (;;) {
      for (size_t end; (end = pending.find('\0')) != std::string::npos;) {
        auto reply = nlohmann::json::parse(pending.substr(0, end), nullptr, false);
        pending.erase(0, end + 1);
        if (reply.is_object() && reply.value("id", -1) == next_id)
          return reply.contains("result") ? reply["result"] : nlohmann::json(nullptr);
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now())
                      .count();
      pollfd p = {from_chromium[0], POLLIN, 0};
      if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) return nullptr;
      char buf[65536];
      ssize_t n = ::read(from_chromium[0], buf, sizeof buf);
      if (n <= 0) return nullptr;
      pending.append(buf, static_cast<size_t>(n));
    }
  };
  std::string dom;
  nlohmann::json target = call("Target.createTarget", {{"url", url}});
  nlohmann::json attached =
      target.is_object()
          ? call("Target.attachToTarget", {{"targetId", target["targetId"]}, {"flatten", true}})
          : nlohmann::json(nullptr);
  if (attached.is_object()) {
    const std::string session = attached["sessionId"];
    const std::string expression =
        "(() => { try { return (" + ready + ") ? document.documentElement.outerHTML : ''; } "
        "catch (e) { return ''; } })()";
    auto give_up = std::chrono::steady_clock::now() +
                   std::chrono::milliseconds(static_cast<int>(timeout_s * 1000));
    for (bool last = false; !last;) {
      last = std::chrono::steady_clock::now() >= give_up;
      nlohmann::json r = call("Runtime.evaluate",
                              {{"expression", last ? "document.documentElement.outerHTML"
                                                   : expression},
                               {"returnByValue", true}},
                              session);
      if (!r.is_object()) break;
      dom = r["result"].value("value", "");
      if (!dom.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  EXPECT_TRUE(attached.is_object()) << "chromium did not open " << address << " over DevTools";
  call("Browser.close", nlohmann::json::object());
  ::close(to_chromium[1]);
  ::close(from_chromium[0]);
  int status = 0;
  for (int i = 0; i < 100 && ::waitpid(pid, &status, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (::waitpid(pid, &status, WNOHANG) == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  fs::remove_all(profile);
  return dom;
}

// The amounts ($1.23) on the line of a CLI table that starts with `first`.
std::vector<std::string> Dollars(const std::string& table, const std::string& first) {
  std::istringstream in(table);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(first, 0) != 0) continue;
    std::vector<std::string> out;
    std::regex re(R"(-?\$[0-9,]+\.[0-9]{2})");
    for (auto it = std::sregex_iterator(line.begin(), line.end(), re); it != std::sregex_iterator();
         ++it)
      out.push_back(it->str());
    return out;
  }
  return {};
}

// The text of the element with id `id` in a dumped DOM.
std::string ById(const std::string& dom, const std::string& id) {
  std::smatch m;
  if (!std::regex_search(dom, m, std::regex("id=\"" + id + "\"[^>]*>([^<]*)<"))) return "";
  return m[1];
}

// Events of an SSE stream, read until `enough` says so or `timeout_s` passes.
struct Sse {
  int status = 0;
  std::vector<nlohmann::json> events;
  std::vector<int64_t> ids;
  int heartbeats = 0;
};

// Follows the stream as EventSource does: when the server ends it (--stream-lifetime), it
// reconnects with the last id it saw in Last-Event-ID.
Sse ReadEvents(int port, httplib::Headers headers, const std::function<bool(const Sse&)>& enough,
               double timeout_s, const std::string& path = "/api/events") {
  Sse sse;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::string last_id;
  if (auto it = headers.find("Last-Event-ID"); it != headers.end()) last_id = it->second;
  bool done = false;
  while (!done && std::chrono::steady_clock::now() < deadline) {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(static_cast<time_t>(timeout_s) + 5, 0);
    headers.erase("Last-Event-ID");
    if (!last_id.empty()) headers.emplace("Last-Event-ID", last_id);
    std::string buffer;
    auto r = c.Get(
        path.c_str(), WithCredential(port, headers, true),
        [&](const httplib::Response& res) {
          sse.status = res.status;
          return res.status == 200;
        },
        [&](const char* data, size_t n) {
          buffer.append(data, n);
          size_t end;
          while ((end = buffer.find("\n\n")) != std::string::npos) {
            std::string block = buffer.substr(0, end);
            buffer.erase(0, end + 2);
            if (block.find(": heartbeat") != std::string::npos) ++sse.heartbeats;
            std::smatch m, id;
            bool has_id = std::regex_search(block, id, std::regex(R"(^id: (\d+)$)", std::regex::multiline));
            if (has_id) last_id = id[1];
            if (std::regex_search(block, m, std::regex(R"(^data: (.*)$)", std::regex::multiline))) {
              sse.events.push_back(Json(m[1]));
              if (has_id) sse.ids.push_back(std::stoll(id[1]));
            }
          }
          done = enough(sse);
          return !done && std::chrono::steady_clock::now() < deadline;
        });
    if (r && sse.status == 0) sse.status = r->status;
    if (sse.status != 200) break;
  }
  return sse;
}

constexpr char kOtherLab[] = "pipeline: other-work\nproject: other-lab\nstages:\n"
                             "  hello:\n    run: [\"true\"]\n    instance: c6i.xlarge\n";

// Three run: stages in a chain; the last waits until the test opens GATE (a file), so the
// test decides when the run ends: after the browser watches it.
constexpr char kSlow[] = R"(pipeline: slow-chain
project: climate-lab
stages:
  first:
    run: ["sleep", "1"]
    instance: c6i.xlarge
  second:
    run: ["sleep", "1"]
    instance: c6i.xlarge
    needs: [first]
  third:
    run: ["bash", "-c", "while [ ! -e GATE ]; do sleep 0.2; done"]
    instance: c6i.xlarge
    needs: [second]
)";

const std::vector<std::string> kLocalArgs = {"--heartbeat", "1", "--stream-lifetime", "2"};

class Serve : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Daemons start here, as `trnflow` commands do (paths in the catalog are the same to both).
    fs::current_path(TRNFLOW_SOURCE_DIR);
    // The climate example at its demo spot rate and the default seed: training is interrupted
    // once and resumes (tests/cli_test.cpp, ClimateRunSurvivesASpotInterruption...).
    auto r = RunTrnflow("run examples/climate/pipeline.yaml --speed 200000");
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    climate_run_ = RunIdFrom(r.out);
    // A second project with a member of its own and a run of its own.
    alice_url_ = TestDatabase::NewLogin("alice");
    alice_ = "trnflow_test_" + TestDatabase::database_name() + "_alice";
    auto add = RunTrnflow("project add other-lab --member " + alice_);
    ASSERT_EQ(add.exit_code, 0) << add.err;
    r = RunTrnflow("run " + WriteTempFile("other.yaml", kOtherLab) + " --speed 1000000");
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    other_run_ = RunIdFrom(r.out);
    auto sched = RunTrnflow("schedule add nightly examples/climate/pipeline.yaml --cron '0 2 * * *'");
    ASSERT_EQ(sched.exit_code, 0) << sched.err;
    // Its TRNFLOW_HOME is this test's (the CLI's), not the machine's: logs of run 1 of another
    // test's database must not be found under this run 1.
    worker_ = std::make_unique<Daemon>(
        "serve-worker", std::vector<std::string>{"worker", "--pool", "cpu=2"},
        std::vector<std::string>{"TRNFLOW_HOME=" + testing::CliHome()});
    worker_->Start();
    ASSERT_TRUE(WaitFor([] { return CliJson("workers --format json").size() == 1; }, 30));
    // Event streams of the local dashboard end every 2 s and resume (as browsers do), so headless
    // chromium's virtual time, which waits while a request is open, moves on.
    port_ = StartServe(serve_, "serve-local", kLocalArgs);
    proxy_port_ = StartServe(proxy_, "serve-proxy",
                             {"--auth", "proxy", "--heartbeat", "1", "--max-clients", "4"});
  }
  static void TearDownTestSuite() {
    serve_.reset();
    proxy_.reset();
    worker_.reset();
  }
  // A failed test says whether its dashboards were still running, and how their logs end.
  void TearDown() override {
    if (!HasFailure()) return;
    for (const auto* d : {serve_.get(), proxy_.get()}) {
      if (!d) continue;
      int status = 0;
      pid_t gone = waitpid(d->pid(), &status, WNOHANG);
      std::string log = ReadFile(d->log_path());
      std::cerr << d->log_path() << ": "
                << (gone == d->pid() ? "EXITED, status " + std::to_string(status) : "running")
                << "; its log ends:\n"
                << log.substr(log.size() > 4000 ? log.size() - 4000 : 0) << "\n";
    }
  }

  static std::string LedgerSum(const std::string& project) {
    return Query("SELECT sum(a.cost_usd)::text FROM trnflow.attempts a JOIN trnflow.runs r ON "
                 "r.id = a.run_id WHERE a.outcome IS NOT NULL AND r.project = '" +
                 project + "'");
  }

  static inline int64_t climate_run_ = 0, other_run_ = 0;
  static inline std::string alice_, alice_url_;
  static inline std::unique_ptr<Daemon> worker_, serve_, proxy_;
  static inline int port_ = 0, proxy_port_ = 0;
};

TEST_F(Serve, TheApiAnswersWhatTheCliPrints) {
  std::string run = std::to_string(climate_run_);
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"/api/runs", "runs --format json"},
      {"/api/runs?project=climate-lab&state=succeeded",
       "runs --project climate-lab --state succeeded --format json"},
      {"/api/runs?pipeline=other-work&since=1d", "runs --pipeline other-work --since 1d --format json"},
      {"/api/runs?state=failed", "runs --state failed --format json"},
      {"/api/runs/" + run, "show " + run + " --format json"},
      {"/api/runs/" + run + "?collapse=1", "show " + run + " --collapse --format json"},
      {"/api/spend", "spend --format json"},
      {"/api/spend?by=project,stage", "spend --by project,stage --format json"},
      {"/api/spend?by=day&project=climate-lab", "spend --by day --project climate-lab --format json"},
      {"/api/cache", "cache ls --format json"},
      {"/api/schedules", "schedule ls --format json"},
  };
  for (const auto& [path, args] : pairs) {
    Http h = Get(port_, path);
    ASSERT_EQ(h.status, 200) << path << ": " << h.body;
    EXPECT_EQ(Json(h.body), CliJson(args)) << path << " vs trnflow " << args;
  }
  // Not vacuous: the data is there.
  EXPECT_EQ(Json(Get(port_, "/api/runs").body).size(), 2u);
  EXPECT_EQ(Json(Get(port_, "/api/runs?pipeline=other-work").body).size(), 1u);
  EXPECT_EQ(Json(Get(port_, "/api/runs/" + run).body)["stages"].size(), 10u);
  EXPECT_FALSE(Json(Get(port_, "/api/cache").body).empty());
  EXPECT_EQ(Json(Get(port_, "/api/schedules").body).size(), 1u);
  // Workers: the same, but for the heartbeat's age, which moves between the two reads.
  auto strip = [](nlohmann::json j) {
    for (auto& w : j) w.erase("heartbeat_age_seconds");
    return j;
  };
  auto api_workers = Json(Get(port_, "/api/workers").body);
  ASSERT_EQ(api_workers.size(), 1u);
  EXPECT_EQ(strip(api_workers), strip(CliJson("workers --format json")));
  EXPECT_EQ(api_workers[0]["pools"][0]["pool"], "cpu");
  // Bad input and missing rows are said as such.
  EXPECT_EQ(Get(port_, "/api/runs?state=exploded").status, 400);
  EXPECT_EQ(Get(port_, "/api/spend?by=colour").status, 400);
  EXPECT_EQ(Get(port_, "/api/runs/99999999").status, 404);
  EXPECT_EQ(Get(port_, "/api/runs?project=nope").status, 400);
}

// The run page's reading: each matrix fan-out one entry whose counts, attempts and dollars are
// its expansions' own, and the run's totals those of every attempt; ?expand= unfolds one.
TEST_F(Serve, ARunReadCollapsedSumsItsMatrixStages) {
  std::string run = std::to_string(climate_run_);
  auto whole = Json(Get(port_, "/api/runs/" + run).body);
  auto folded = Json(Get(port_, "/api/runs/" + run + "?collapse=1").body);
  ASSERT_EQ(folded["stages"].size(), 5u) << "prepare, train, compile, serve, evaluate";
  std::map<std::string, int> states, outcomes;
  int attempts = 0, all_attempts = 0, interruptions = 0;
  int64_t cost = 0, wasted = 0, all_wasted = 0;
  auto micros = [](const nlohmann::json& v) { return v.is_null() ? 0 : std::llround(v.get<double>() * 1e6); };
  for (const auto& st : whole["stages"]) {
    for (const auto& a : st["attempts"]) {
      ++all_attempts;
      all_wasted += micros(a["wasted_usd"]);
      interruptions += a["outcome"] == "spot_interruption";
    }
    if (st["name"].get<std::string>().rfind("compile[", 0) != 0) continue;
    ++states[st["state"]];
    cost += micros(st["cost_usd"]);
    for (const auto& a : st["attempts"]) {
      ++attempts;
      ++outcomes[a["outcome"].is_null() ? "running" : a["outcome"].get<std::string>()];
      wasted += micros(a["wasted_usd"]);
    }
  }
  ASSERT_EQ(attempts > 0, true);
  nlohmann::json compile;
  for (const auto& st : folded["stages"])
    if (st["name"] == "compile") compile = st;
  ASSERT_FALSE(compile.is_null()) << folded.dump(1);
  EXPECT_EQ(compile["matrix"]["count"], 6);
  EXPECT_EQ(compile["matrix"]["states"], nlohmann::json(states));
  EXPECT_EQ(compile["matrix"]["outcomes"], nlohmann::json(outcomes));
  EXPECT_EQ(compile["matrix"]["attempts"], attempts);
  EXPECT_EQ(micros(compile["cost_usd"]), cost);
  EXPECT_EQ(micros(compile["matrix"]["wasted_usd"]), wasted);
  EXPECT_TRUE(compile["attempts"].empty());
  // Whoever needed an expansion needs the matrix stage, once.
  for (const auto& st : folded["stages"])
    for (const auto& n : st["needs"]) EXPECT_EQ(n.get<std::string>().find('['), std::string::npos) << st.dump();
  EXPECT_EQ(folded["totals"]["attempts"], all_attempts);
  EXPECT_EQ(micros(folded["totals"]["wasted_usd"]), all_wasted);
  EXPECT_EQ(folded["totals"]["spot_interruptions"], interruptions);
  EXPECT_GT(interruptions, 0) << "the climate example's training is interrupted";
  EXPECT_EQ(Json(Get(port_, "/api/runs/" + run + "?collapse=1&expand=compile").body)["stages"].size(),
            10u);
  EXPECT_EQ(Json(Get(port_, "/api/runs/" + run + "?collapse=1&expand=all").body)["stages"],
            whole["stages"]);
  // The command line prints one line for it.
  auto table = RunTrnflow("show " + run + " --collapse");
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("compile x6"), std::string::npos) << table.out;
  EXPECT_EQ(table.out.find("compile["), std::string::npos) << table.out;
}

// Answers asked for with ?after=ID are shared: each says the newest change it shows, one that
// says it shows a change does, an older one is the previous answer, and one that shows the
// change asked for follows within moments.
TEST_F(Serve, ASharedAnswerSaysWhichChangeItShows) {
  auto newest = [] { return static_cast<int64_t>(QueryNumber("SELECT coalesce(max(id), 0) FROM trnflow.changes")); };
  int64_t before = newest();
  Http first = Get(port_, "/api/runs?after=" + std::to_string(before));
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_GE(first.change, before);
  auto runs_before = Json(first.body);
  EXPECT_EQ(Json(Get(port_, "/api/runs").body), runs_before) << "the same as a fresh read";
  auto submitted = RunTrnflow("submit " + WriteTempFile("later.yaml", "pipeline: later-work\n"
                                                                      "project: other-lab\nstages:\n"
                                                                      "  say:\n    run: [\"true\"]\n"
                                                                      "    instance: c6i.xlarge\n"));
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  int64_t after = newest();
  ASSERT_GT(after, before);
  bool shown = false;
  int older = 0;
  for (int i = 0; i < 200 && !shown; ++i) {
    Http h = Get(port_, "/api/runs?after=" + std::to_string(after));
    ASSERT_EQ(h.status, 200) << h.body;
    auto runs = Json(h.body);
    bool has = runs.size() == runs_before.size() + 1 && runs[0]["pipeline"] == "later-work";
    if (h.change >= after) {
      EXPECT_TRUE(has) << "an answer that says it shows change " << after << " must: " << h.body;
      shown = true;
    } else {
      // Older than the change asked for: its mark is what it surely shows (it may show more).
      EXPECT_TRUE(runs == runs_before || has) << h.body;
      ++older;
      usleep(50000);
    }
  }
  EXPECT_TRUE(shown) << older << " answers, none showing the change";
  // A page opening asks for whatever is newest: it gets it, or is told it did not (and asks
  // again).
  bool opened = false;
  for (int i = 0; i < 200 && !opened; ++i) {
    Http h = Get(port_, "/api/runs?after=latest");
    ASSERT_EQ(h.status, 200) << h.body;
    if (h.change >= after) {
      EXPECT_EQ(Json(h.body)[0]["pipeline"], "later-work");
      opened = true;
    } else {
      usleep(50000);
    }
  }
  EXPECT_TRUE(opened);
  EXPECT_EQ(Get(port_, "/api/runs?after=soon").status, 400);
}

TEST_F(Serve, MetricsPassPromtoolAndAgreeWithTheLedger) {
  Http m = Get(port_, "/metrics");
  ASSERT_EQ(m.status, 200) << m.body << ReadFile(serve_->log_path());
  std::string file = WriteTempFile("metrics.txt", m.body);
  auto check = Sh("promtool check metrics < " + file);
  EXPECT_EQ(check.exit_code, 0) << check.out << "\n" << m.body;
  auto rules = Sh("promtool check rules " TRNFLOW_SOURCE_DIR "/ops/prometheus/alerts.yml");
  EXPECT_EQ(rules.exit_code, 0) << rules.out;
  // The rules' own tests: a budget stop fires TrnflowBudgetExhausted (issue 45).
  auto rule_tests = Sh("promtool test rules " TRNFLOW_SOURCE_DIR "/ops/prometheus/alerts_test.yml");
  EXPECT_EQ(rule_tests.exit_code, 0) << rule_tests.out;
  // Bounded labels only: never a run, an attempt or a worker.
  EXPECT_FALSE(std::regex_search(m.body, std::regex(R"([{,](run|run_id|attempt|worker|worker_id)=)")))
      << m.body;
  auto sample = [&](const std::string& series) {
    std::smatch s;
    std::string escaped = std::regex_replace(series, std::regex(R"([{}\[\]().*+?^$|\\])"), "\\$&");
    EXPECT_TRUE(std::regex_search(m.body, s, std::regex("\n" + escaped + " ([0-9.e+-]+)\n")))
        << series << " not in\n" << m.body;
    return s.empty() ? -1.0 : std::stod(s[1]);
  };
  double ledger = std::stod(LedgerSum("climate-lab"));
  ASSERT_GT(ledger, 0);
  EXPECT_NEAR(sample(R"(trnflow_spend_usd_total{project="climate-lab"})"), ledger, 1e-6);
  EXPECT_NEAR(sample(R"(trnflow_spend_usd_total{project="other-lab"})"),
              std::stod(LedgerSum("other-lab")), 1e-6);
  EXPECT_EQ(sample(R"(trnflow_attempts_total{outcome="spot_interruption"})"),
            std::stod(Query("SELECT count(*) FROM trnflow.attempts WHERE outcome = "
                            "'spot_interruption'")));
  EXPECT_GE(sample(R"(trnflow_spot_interruptions_total{instance_type="trn1.32xlarge"})"), 1);
  EXPECT_EQ(sample(R"(trnflow_runs_finished_total{state="succeeded"})"), 2);
  EXPECT_EQ(sample(R"(trnflow_workers{state="live"})"), 1);
  EXPECT_NE(m.body.find("# TYPE trnflow_spend_usd_total counter"), std::string::npos);
  EXPECT_NE(m.body.find("# TYPE trnflow_queue_ready_stages gauge"), std::string::npos) << m.body;

  // Histograms from the ledger: attempt durations by pool and outcome, queue waits by pool.
  EXPECT_NE(m.body.find("# TYPE trnflow_attempt_duration_seconds histogram"), std::string::npos);
  EXPECT_NE(m.body.find("# TYPE trnflow_queue_wait_seconds histogram"), std::string::npos);
  auto by_pool_outcome = Rows(
      "SELECT s.pool, a.outcome, count(*), "
      "sum(greatest(0, extract(epoch FROM a.finished_at - a.started_at))) "
      "FROM trnflow.attempts a JOIN trnflow.stages s ON s.id = a.stage_id "
      "WHERE a.outcome IS NOT NULL GROUP BY 1, 2");
  ASSERT_GE(by_pool_outcome.size(), 3u) << "several pools and outcomes (an interruption too)\n"
                                         << Query("SELECT string_agg(outcome, ',') FROM trnflow.attempts");
  for (const auto& row : by_pool_outcome) {
    std::string labels = "outcome=\"" + row[1] + "\",pool=\"" + row[0] + "\"";
    double count = sample("trnflow_attempt_duration_seconds_count{" + labels + "}");
    EXPECT_EQ(count, std::stod(row[2])) << labels;
    EXPECT_NEAR(sample("trnflow_attempt_duration_seconds_sum{" + labels + "}"), std::stod(row[3]),
                1e-3);
    EXPECT_EQ(sample("trnflow_attempt_duration_seconds_bucket{" + labels + ",le=\"+Inf\"}"), count);
    // Cumulative: each bucket holds at least the one before it.
    std::regex bucket("\ntrnflow_attempt_duration_seconds_bucket\\{" +
                      std::regex_replace(labels, std::regex(R"([{}\[\]().*+?^$|\\])"), "\\$&") +
                      R"re(,le="([^"]+)"\} ([0-9.e+-]+))re");
    double previous = -1;
    int buckets = 0;
    for (auto it = std::sregex_iterator(m.body.begin(), m.body.end(), bucket);
         it != std::sregex_iterator(); ++it, ++buckets) {
      EXPECT_GE(std::stod((*it)[2]), previous) << labels << " le=" << (*it)[1];
      previous = std::stod((*it)[2]);
    }
    EXPECT_EQ(buckets, 14) << labels;
  }
  double waits = QueryNumber("SELECT count(*) FROM trnflow.attempts WHERE queued_at IS NOT NULL");
  ASSERT_GT(waits, 0) << "claims record when the stage became ready";
  EXPECT_EQ(waits, QueryNumber("SELECT count(*) FROM trnflow.attempts"))
      << "every attempt claimed since 0015 has queued_at";
  double counted = 0;
  for (const auto& row : Rows("SELECT DISTINCT s.pool FROM trnflow.attempts a JOIN trnflow.stages "
                              "s ON s.id = a.stage_id"))
    counted += sample("trnflow_queue_wait_seconds_count{pool=\"" + row[0] + "\"}");
  EXPECT_EQ(counted, waits);
  // Schedule lag: the nightly schedule is on time (its next slot is ahead)...
  EXPECT_EQ(sample(R"(trnflow_schedule_lag_seconds{schedule="nightly"})"), 0);

  // ...until no scheduler fires it: with its last fired slot three days back, the slot after
  // it (2:00 two days ago, at least) is more than a day overdue.
  Query("UPDATE trnflow.schedules SET last_slot = now() - interval '3 days' WHERE name = 'nightly'");
  // A budget: its forecast, band and what running attempts have committed.
  auto set = RunTrnflow("budget set climate-lab 5000");
  ASSERT_EQ(set.exit_code, 0) << set.out << set.err;
  Http later = Get(port_, "/metrics");
  ASSERT_EQ(later.status, 200) << later.body << ReadFile(serve_->log_path());
  std::string later_file = WriteTempFile("metrics-later.txt", later.body);
  auto later_check = Sh("promtool check metrics < " + later_file);
  EXPECT_EQ(later_check.exit_code, 0) << later_check.out << "\n" << later.body;
  auto later_sample = [&](const std::string& series) {
    std::smatch x;
    std::string escaped = std::regex_replace(series, std::regex(R"([{}\[\]().*+?^$|\\])"), "\\$&");
    EXPECT_TRUE(std::regex_search(later.body, x, std::regex("\n" + escaped + " ([0-9.e+-]+)\n")))
        << series << " not in\n" << later.body;
    return x.empty() ? -1.0 : std::stod(x[1]);
  };
  EXPECT_GT(later_sample(R"(trnflow_schedule_lag_seconds{schedule="nightly"})"), 86400);
  // Every project with a budget has a budget-stop counter, its ledger's budget_exceeded count.
  EXPECT_NE(later.body.find("# TYPE trnflow_budget_stops_total counter"), std::string::npos);
  EXPECT_EQ(later_sample(R"(trnflow_budget_stops_total{project="climate-lab"})"),
            std::stod(Query("SELECT count(*) FROM trnflow.attempts a JOIN trnflow.runs r ON "
                            "r.id = a.run_id WHERE r.project = 'climate-lab' AND a.outcome = "
                            "'budget_exceeded'")));
  auto budget = CliJson("budget ls --format json");
  ASSERT_EQ(budget.size(), 1u) << budget.dump();
  const std::string bl = R"({period="month",project="climate-lab"})";
  double forecast = later_sample("trnflow_budget_forecast_usd" + bl);
  EXPECT_GT(forecast, 0);
  EXPECT_NEAR(forecast, budget[0]["forecast_usd"].get<double>(), 0.01 * forecast);
  EXPECT_LE(later_sample("trnflow_budget_forecast_low_usd" + bl), forecast);
  EXPECT_GE(later_sample("trnflow_budget_forecast_high_usd" + bl), forecast);
  EXPECT_GE(later_sample("trnflow_budget_forecast_low_usd" + bl),
            budget[0]["spent_usd"].get<double>() - 1e-6)
      << "the band never goes under what is spent";
  EXPECT_EQ(later_sample("trnflow_budget_committed_usd" + bl), 0) << "nothing runs";

  // The counters are sums over the ledger: a restarted dashboard reports the same figures.
  serve_.reset();
  port_ = StartServe(serve_, "serve-local-again", kLocalArgs);
  Http again = Get(port_, "/metrics");
  std::smatch a, b;
  std::regex spend(R"(trnflow_spend_usd_total\{project="climate-lab"\} ([0-9.e+-]+))");
  ASSERT_TRUE(std::regex_search(m.body, a, spend));
  ASSERT_TRUE(std::regex_search(again.body, b, spend));
  EXPECT_EQ(a[1], b[1]);
}

// /metrics reads counters kept per closed attempt (migration 0025), never the ledger: every
// sample it gives is the one the ledger itself gives (the query /metrics ran before 0025, kept
// in tests/serve/metrics_from_ledger.sql): the same series, the same counts, the same money.
TEST_F(Serve, MetricsFromCountersEqualTheLedger) {
  std::string sql = ReadFile(TRNFLOW_SOURCE_DIR "/tests/serve/metrics_from_ledger.sql");
  sql = sql.substr(0, sql.find_last_of(';'));
  using Key = std::pair<std::string, std::string>;
  auto number = [](const std::string& v) { return v == "null" ? 0.0 : std::stod(v); };
  // A month budget and a total one, so the budgets' spend is compared too (removed at the end:
  // other tests count the budgets).
  ASSERT_EQ(RunTrnflow("budget set other-lab 100").exit_code, 0);
  ASSERT_EQ(RunTrnflow("budget set climate-lab 1000 --period total").exit_code, 0);
  std::map<Key, double> ledger, counters;
  for (const auto& r : Rows(sql)) ledger[{r[0], r[1]}] = number(r[2]);
  schema::Catalog catalog(TestDatabase::url());
  for (const auto& r : catalog.Metrics()) counters[{r.name, r.labels_json}] = r.value;
  ASSERT_GT(ledger.size(), 40u);
  ASSERT_GT(ledger.count({"trnflow_budget_spent_usd", R"({"period": "total", "project": "climate-lab"})"}),
            0u);
  ASSERT_GT(ledger.count({"trnflow_attempts_total", R"({"outcome": "spot_interruption"})"}), 0u)
      << "the climate run's interruption is in the history compared";
  for (const auto& [key, value] : ledger) {
    auto it = counters.find(key);
    if (it == counters.end()) {
      ADD_FAILURE() << key.first << key.second << " is not in /metrics";
      continue;
    }
    // Ages and the running spend move with the clock between the two readings.
    if (key.first.find("age_seconds") != std::string::npos ||
        key.first == "trnflow_running_spend_usd")
      continue;
    EXPECT_NEAR(it->second, value, 1e-6 * std::max(1.0, std::abs(value)))
        << key.first << key.second;
  }
  for (const auto& [key, value] : counters)
    EXPECT_TRUE(ledger.count(key)) << key.first << key.second << " is not in the ledger's";

  // A bulk-loaded ledger (triggers off, then RebuildSpendRollup as the owner) counts the same.
  {
    schema::Catalog owner(TestDatabase::owner_url());
    schema::testing::RebuildSpendRollup(owner);
  }
  std::map<Key, double> rebuilt;
  for (const auto& r : catalog.Metrics()) rebuilt[{r.name, r.labels_json}] = r.value;
  for (const auto& [key, value] : counters) {
    if (key.first.find("age_seconds") != std::string::npos) continue;
    EXPECT_NEAR(rebuilt[key], value, 1e-6 * std::max(1.0, std::abs(value)))
        << key.first << key.second;
  }
  EXPECT_EQ(RunTrnflow("budget rm other-lab").exit_code, 0);
  EXPECT_EQ(RunTrnflow("budget rm climate-lab").exit_code, 0);
}

TEST_F(Serve, APrometheusServerScrapesTheSpendCounter) {
  std::string dir = fs::temp_directory_path() / ("trnflow-prom-" + std::to_string(getpid()));
  fs::create_directories(dir + "/data");
  int prom_port = FreePort();
  // The shipped configuration, pointed at this dashboard and its token file (it sends the
  // dashboard's secret as a bearer token from a file), scraping every second.
  std::string yml = ReadFile(TRNFLOW_SOURCE_DIR "/ops/prometheus/prometheus.yml");
  auto replace = [&](const std::string& from, const std::string& to) {
    size_t at = yml.find(from);
    ASSERT_NE(at, std::string::npos) << from << " in ops/prometheus/prometheus.yml";
    yml.replace(at, from.size(), to);
  };
  replace("scrape_interval: 30s", "scrape_interval: 1s\n  evaluation_interval: 1s");
  replace("- alerts.yml", "- " TRNFLOW_SOURCE_DIR "/ops/prometheus/alerts.yml");
  replace("/etc/prometheus/trnflow-serve.secret", Credentials()[port_].file);
  replace("127.0.0.1:8080", "127.0.0.1:" + std::to_string(port_));
  std::ofstream(dir + "/prometheus.yml") << yml;
  auto check = Sh("promtool check config " + dir + "/prometheus.yml");
  EXPECT_EQ(check.exit_code, 0) << check.out;
  pid_t pid = fork();
  if (pid == 0) {
    std::string log = dir + "/prometheus.log";
    freopen(log.c_str(), "w", stdout);
    freopen(log.c_str(), "a", stderr);
    std::string config = "--config.file=" + dir + "/prometheus.yml";
    std::string data = "--storage.tsdb.path=" + dir + "/data";
    std::string listen = "--web.listen-address=127.0.0.1:" + std::to_string(prom_port);
    execlp("prometheus", "prometheus", config.c_str(), data.c_str(), listen.c_str(), nullptr);
    _exit(127);
  }
  ASSERT_GT(pid, 0);
  double ledger = std::stod(LedgerSum("climate-lab"));
  double seen = -1;
  bool got = WaitFor(
      [&] {
        httplib::Client c("127.0.0.1", prom_port);
        auto r = c.Get("/api/v1/query?query=" +
                       httplib::detail::encode_query_param(
                           R"(trnflow_spend_usd_total{project="climate-lab",job="trnflow"})"));
        if (!r || r->status != 200) return false;
        auto j = nlohmann::json::parse(r->body, nullptr, false);
        if (j.is_discarded() || j["data"]["result"].empty()) return false;
        seen = std::stod(j["data"]["result"][0]["value"][1].get<std::string>());
        return true;
      },
      90);
  std::string target_health;
  {
    httplib::Client c("127.0.0.1", prom_port);
    auto r = c.Get("/api/v1/targets");
    if (r) target_health = r->body;
  }
  kill(pid, SIGTERM);
  waitpid(pid, nullptr, 0);
  ASSERT_TRUE(got) << ReadFile(dir + "/prometheus.log") << target_health;
  EXPECT_NEAR(seen, ledger, 1e-6) << "PromQL and the ledger agree";
  EXPECT_NE(target_health.find("\"health\":\"up\""), std::string::npos) << target_health;
  fs::remove_all(dir);
}

TEST_F(Serve, TheRunPageDrawsTheDagAndTheInterruptedTraining) {
  std::string run = std::to_string(climate_run_);
  std::string dom = Browse("http://127.0.0.1:" + std::to_string(port_) + "/runs/" + run +
                               "?live=0&expand=all",
                           "run-" + run + "-expanded.png");
  auto show = CliJson("show " + run + " --format json");
  ASSERT_EQ(show["stages"].size(), 10u);
  for (const auto& s : show["stages"]) {
    std::string name = s["name"];
    EXPECT_NE(dom.find("class=\"node\" data-stage=\"" + name + "\" data-state=\"" +
                       s["state"].get<std::string>() + "\""),
              std::string::npos)
        << name << " is not drawn with its state:\n" << dom.substr(0, 4000);
  }
  // The timeline: one bar per attempt, the interrupted training attempt marked as such.
  size_t bars = 0;
  for (const auto& s : show["stages"]) bars += s["attempts"].size();
  std::regex bar(R"(<rect class="attempt [^"]*" data-stage=)");
  EXPECT_EQ(static_cast<size_t>(std::distance(
                std::sregex_iterator(dom.begin(), dom.end(), bar), std::sregex_iterator())),
            bars);
  EXPECT_TRUE(std::regex_search(
      dom, std::regex(R"(<rect class="attempt outcome-spot_interruption market-spot" data-stage="train" data-attempt="1" data-outcome="spot_interruption")")))
      << dom.substr(0, 4000);
  EXPECT_NE(dom.find("class=\"interruption\" data-stage=\"train\""), std::string::npos);
  // The run's total on the page is `trnflow show`'s, to the cent.
  auto table = Sh(std::string("cd " TRNFLOW_SOURCE_DIR " && " TRNFLOW_BINARY " show ") + run);
  std::smatch spent;
  ASSERT_TRUE(std::regex_search(table.out, spent, std::regex(R"(spent (\$[0-9.,]+))")))
      << table.out;
  EXPECT_EQ(ById(dom, "run-cost"), spent[1]);
  EXPECT_EQ(ById(dom, "run-interruptions"), "1");

  // Queue wait: one bar per attempt that waited, as long as the ledger says it waited.
  auto waited = Rows("SELECT s.name, a.attempt, extract(epoch FROM a.started_at - a.queued_at) "
                     "FROM trnflow.attempts a JOIN trnflow.stages s ON s.id = a.stage_id "
                     "WHERE a.run_id = " + run + " AND a.started_at > a.queued_at + "
                     "interval '1 millisecond'");
  ASSERT_FALSE(waited.empty()) << "stages wait for the worker at least a moment";
  std::regex wait_bar(R"re(<rect class="wait" data-stage="([^"]+)" data-attempt="(\d+)" data-wait-seconds="([0-9.]+)")re");
  std::map<std::string, double> drawn;
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), wait_bar); it != std::sregex_iterator();
       ++it)
    drawn[(*it)[1].str() + "#" + (*it)[2].str()] = std::stod((*it)[3]);
  EXPECT_EQ(drawn.size(), waited.size()) << dom.substr(dom.find("id=\"timeline\""), 3000);
  for (const auto& w : waited) {
    auto it = drawn.find(w[0] + "#" + w[1]);
    ASSERT_NE(it, drawn.end()) << w[0] << " attempt " << w[1];
    EXPECT_NEAR(it->second, std::stod(w[2]), 0.002) << w[0];
  }
  // Checkpoints: the interrupted training attempt's last one, and the resume from it.
  double checkpoint = QueryNumber(
      "SELECT a.progress_to FROM trnflow.attempts a JOIN trnflow.stages s ON s.id = a.stage_id "
      "WHERE a.run_id = " + run + " AND s.name = 'train' AND a.attempt = 1");
  ASSERT_GT(checkpoint, 0);
  char progress[32];
  std::snprintf(progress, sizeof progress, "%.4f", checkpoint);
  EXPECT_NE(dom.find(std::string(R"re(<line class="checkpoint" data-stage="train" data-attempt="1" data-progress=")re") +
                     progress + "\""),
            std::string::npos)
      << dom.substr(0, 3000);
  EXPECT_NE(dom.find(std::string(R"re(<text class="resume" data-stage="train" data-attempt="2" data-progress=")re") +
                     progress + "\""),
            std::string::npos);

  // Collapsed (the default): the six compile expansions are one node with their counts.
  std::string collapsed = Browse("http://127.0.0.1:" + std::to_string(port_) + "/runs/" + run +
                                     "?live=0",
                                 "run-" + run + ".png");
  std::map<std::string, int> counts;
  for (const auto& st : show["stages"])
    if (st["name"].get<std::string>().rfind("compile[", 0) == 0) ++counts[st["state"]];
  ASSERT_EQ(counts.size() > 0, true);
  std::string want_counts;
  for (const char* k : {"succeeded", "cached", "running", "ready", "retry_wait", "blocked", "failed",
                        "skipped", "cancelled"})
    if (counts.count(k))
      want_counts += (want_counts.empty() ? "" : ",") + std::string(k) + ":" + std::to_string(counts[k]);
  EXPECT_TRUE(std::regex_search(
      collapsed, std::regex(R"re(<g class="node matrix" data-stage="compile" data-state="[a-z_]+" data-count="6" data-counts=")re" +
                            want_counts + "\"")))
      << want_counts << "\n" << collapsed.substr(0, 4000);
  EXPECT_EQ(collapsed.find("<g class=\"node\" data-stage=\"compile["), std::string::npos)
      << "no node of one expansion";
  // Its lane on the timeline: one bar from the first expansion's start to the last's end.
  int compile_attempts = 0;
  for (const auto& st : show["stages"])
    if (st["name"].get<std::string>().rfind("compile[", 0) == 0) compile_attempts += st["attempts"].size();
  EXPECT_TRUE(std::regex_search(collapsed, std::regex(R"re(<rect class="attempt group outcome-[a-z_]+" data-stage="compile" data-attempts=")re" +
                                                      std::to_string(compile_attempts) + "\"")))
      << collapsed.substr(collapsed.find("id=\"timeline\""), 3000);
  EXPECT_EQ(collapsed.find("data-stage=\"compile["), std::string::npos) << "no lane of one expansion";
  EXPECT_NE(dom.find("<button class=\"collapse\" data-stage=\"compile\">collapse compile</button>"),
            std::string::npos)
      << "an unfolded matrix stage can be folded again";
  std::regex nodes(R"(<g class="node)");
  EXPECT_EQ(std::distance(std::sregex_iterator(collapsed.begin(), collapsed.end(), nodes),
                          std::sregex_iterator()),
            5) << "prepare, train, compile ×6, serve, evaluate";
}

// Issue 35: the run page at 1400 px: every colour on the timeline has its key in the legend
// (drawn with the bars' own classes), the attempts table fits (its WHY column wraps), and the
// expanded matrix stages are named in full, not cut.
TEST_F(Serve, TheRunPagesLegendMatchesItsBarsAndItFitsAt1400Pixels) {
  std::string run = std::to_string(climate_run_);
  std::string dom = Browse("http://127.0.0.1:" + std::to_string(port_) + "/runs/" + run +
                               "?live=0&expand=all",
                           "run-" + run + "-1400.png");
  std::set<std::string> outcomes;
  std::regex bar(R"re(<rect class="attempt (outcome-[a-z_]+)[^"]*" data-stage=)re");
  for (auto it = std::sregex_iterator(dom.begin(), dom.end(), bar); it != std::sregex_iterator(); ++it)
    outcomes.insert((*it)[1]);
  ASSERT_GE(outcomes.size(), 2u) << "the climate run has succeeded and interrupted attempts";
  size_t legend = dom.find("id=\"legend\"");
  ASSERT_NE(legend, std::string::npos);
  std::string key = dom.substr(legend, dom.find("</div>", legend) - legend);
  for (const auto& o : outcomes)
    EXPECT_NE(key.find("<rect class=\"attempt " + o + "\""), std::string::npos)
        << o << " is drawn on the timeline but has no key: " << key;
  EXPECT_NE(key.find("<rect class=\"wait\""), std::string::npos) << key;
  EXPECT_NE(key.find("market-spot"), std::string::npos) << key;
  // Nothing runs off the page: the page is no wider than the window.
  std::smatch w;
  ASSERT_TRUE(std::regex_search(dom, w, std::regex(R"re(data-scroll-width="(\d+)" data-window-width="(\d+)")re")))
      << dom.substr(0, 2000);
  EXPECT_EQ(w[2], "1400");
  EXPECT_LE(std::stoi(w[1]), 1400) << "the page is wider than a 1400 px window";
  EXPECT_NE(dom.find("<td class=\"wrap\">spot interruption after"), std::string::npos);
  // Expanded matrix stages: named by the keys that vary (here both), never cut.
  for (const auto& s : CliJson("show " + run + " --format json")["stages"]) {
    std::string name = s["name"];
    if (name.rfind("compile[", 0) != 0) continue;
    EXPECT_NE(dom.find("data-label=\"" + name + "\""), std::string::npos) << name;
    EXPECT_NE(dom.find("data-label=\"" + name + "\"" + std::string(R"( textLength="174" lengthAdjust="spacingAndGlyphs">)") + name + "</text>"),
              std::string::npos)
        << name << " is not shown whole:\n" << dom.substr(dom.find("data-label=\"" + name), 300);
    EXPECT_TRUE(std::regex_search(dom, std::regex("<text class=\"lane-label\" data-stage=\"" +
                                                  std::regex_replace(name, std::regex(R"([\[\]])"), R"(\$&)") +
                                                  "\"[^>]*>" + std::regex_replace(name, std::regex(R"([\[\]])"), R"(\$&)") + "<title>")))
        << name << "'s lane is not named whole";
  }
}

// Expanded matrix stages whose keys do not all vary are named by those that do; the full
// name is the tooltip.
TEST_F(Serve, ExpandedMatrixStagesShowTheirVaryingKeys) {
  auto sub = RunTrnflow("submit " + WriteTempFile("keys.yaml", R"(pipeline: keys
project: climate-lab
stages:
  compile:
    kind: compile
    target: inf2
    instance: trn1.2xlarge
    model: "${{ matrix.model }}"
    seq_len: "${{ matrix.seq_len }}"
    matrix: {batch: [1, 8], model: [llama-3-8b], seq_len: [1024]}
    batch: "${{ matrix.batch }}"
)") + " --format json");
  ASSERT_EQ(sub.exit_code, 0) << sub.out << sub.err;
  std::string run = Json(sub.out)["run_id"];
  std::string dom = Browse("http://127.0.0.1:" + std::to_string(port_) + "/runs/" + run +
                           "?live=0&expand=all");
  for (const char* b : {"1", "8"}) {
    std::string label = std::string("compile[batch=") + b + "]";
    EXPECT_NE(dom.find("data-label=\"" + label + "\">" + label + "</text>"), std::string::npos)
        << label << "\n" << dom.substr(0, 3000);
    EXPECT_TRUE(std::regex_search(
        dom, std::regex(std::string(R"(<title>compile\[[^\]]*batch=)") + b +
                        R"([^\]]*model=llama-3-8b[^\]]*\]: )")))
        << "the tooltip names the whole stage";
  }
  RunTrnflow("cancel " + run);
}

// Issue 35: a running run's page shows what `trnflow show` does: the stage's % and ETA, and
// the running attempt's row costs what it has cost so far (the header's figure), not $0.00.
TEST_F(Serve, ARunningRunsPageShowsProgressEtaAndTheLiveCost) {
  std::string gate = fs::path(testing::JobVisibleDir("serve-progress-gate")) / "gate";
  fs::remove(gate);
  std::string yaml = std::string(R"(pipeline: progressing
project: climate-lab
stages:
  crunch:
    run: ["bash", "-c", "echo '::progress 0.42'; while [ ! -e GATE ]; do sleep 0.2; done"]
    instance: c6i.xlarge
)");
  yaml = std::regex_replace(yaml, std::regex("GATE"), gate);
  auto sub = RunTrnflow("submit " + WriteTempFile("progressing.yaml", yaml) +
                        " --speed 100000 --format json");
  ASSERT_EQ(sub.exit_code, 0) << sub.out << sub.err;
  std::string run = Json(sub.out)["run_id"];
  nlohmann::json stage;
  ASSERT_TRUE(WaitFor(
      [&] {
        auto show = CliJson("show " + run + " --format json");
        stage = show["stages"][0];
        return stage["state"] == "running" && stage["progress"].is_number() &&
               stage["eta_sim_seconds"].is_number() && stage["running_cost_usd"].is_number() &&
               stage["running_cost_usd"].get<double>() >= 0.01;
      },
      60))
      << stage.dump();
  std::string dom = Browse("http://127.0.0.1:" + std::to_string(port_) + "/runs/" + run + "?live=0");
  std::ofstream(gate) << "go\n";
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dom, m, std::regex(R"re(<tspan class="progress" data-progress="0\.4200"> · ([^<]*)</tspan>)re")))
      << dom.substr(0, 4000);
  EXPECT_TRUE(std::regex_match(std::string(m[1]), std::regex(R"(42%, [0-9.]+ sim h left.*)"))) << m[1];
  std::string cost = ById(dom, "attempt-cost-crunch-1");
  EXPECT_NE(cost, "");
  EXPECT_NE(cost, "$0.00") << "the running attempt's row counts what it has cost so far";
  EXPECT_EQ(cost, ById(dom, "run-cost")) << "the same figure as the header's";
  EXPECT_TRUE(std::regex_search(dom, std::regex(R"re(<td class="wrap">42%, [0-9.]+ sim h left)re")))
      << dom.substr(dom.find("id=\"attempts\""), 2000);
  EXPECT_TRUE(WaitFor([&] { return Query("SELECT state FROM trnflow.runs WHERE id = " + run) == "succeeded"; }, 30));
  fs::remove(gate);
}

TEST_F(Serve, TheRunsPageListsAndFiltersFromTheUrl) {
  std::string url = "http://127.0.0.1:" + std::to_string(port_) + "/runs";
  std::string all = Browse(url + "?live=0", "runs.png");
  std::string climate = "<a href=\"/runs/" + std::to_string(climate_run_) + "\">";
  std::string other = "<a href=\"/runs/" + std::to_string(other_run_) + "\">";
  EXPECT_NE(all.find(climate), std::string::npos) << all.substr(0, 3000);
  EXPECT_NE(all.find(other), std::string::npos);
  std::string filtered = Browse(url + "?project=other-lab&state=succeeded&live=0");
  EXPECT_EQ(filtered.find(climate), std::string::npos);
  EXPECT_NE(filtered.find(other), std::string::npos);
  // The total is the runs' costs added in micro-dollars, printed as the CLI prints money.
  int64_t micros = 0;
  for (const auto& r : CliJson("runs --format json"))
    micros += std::llround(r["cost_usd"].get<double>() * 1e6);
  char want[32];
  std::snprintf(want, sizeof want, "$%lld.%02lld", static_cast<long long>((micros + 5000) / 1000000),
                static_cast<long long>(((micros + 5000) / 10000) % 100));
  EXPECT_EQ(ById(all, "runs-total-cost_usd"), want);
}

TEST_F(Serve, TheSpendPageEqualsTrnflowSpendToTheCent) {
  ASSERT_EQ(RunTrnflow("budget set climate-lab 5000").exit_code, 0);
  // The climate example again: its compiles are answered by the cache this time. (Its last
  // stage may fail: the worker daemon, with a TRNFLOW_HOME of its own, may have prepared the
  // data it reads. Spent is spent either way.)
  auto again = RunTrnflow("run examples/climate/pipeline.yaml --speed 200000");
  ASSERT_NE(again.out.find(": cached"), std::string::npos) << again.out << again.err;
  std::string dom = Browse("http://127.0.0.1:" + std::to_string(port_) + "/spend?live=0",
                           "spend.png");
  // The savings, broken down: `trnflow spend --savings`'s total line, to the cent.
  auto savings = RunTrnflow("spend --savings");
  ASSERT_EQ(savings.exit_code, 0) << savings.err;
  auto total = Dollars(savings.out, "total");
  ASSERT_EQ(total.size(), 7u) << savings.out;
  const char* keys[] = {"spot_cost_usd", "spot_on_demand_usd", "spot_saved_usd", "cache_saved_usd",
                        "cost_usd", "gpu_baseline_usd", "gpu_saved_usd"};
  for (size_t i = 0; i < 7; ++i)
    EXPECT_EQ(ById(dom, std::string("savings-total-") + keys[i]), total[i]) << keys[i];
  EXPECT_NE(total[2], "$0.00") << "the spot training saved something";
  EXPECT_NE(total[3], "$0.00") << "the compile cache answered some";
  auto sj = CliJson("spend --savings --format json");
  int64_t hits = 0;
  for (const auto& r : sj) hits += r["cache_hits"].get<int64_t>();
  EXPECT_EQ(ById(dom, "savings-total-cache_hits"), std::to_string(hits));
  EXPECT_EQ(hits, QueryNumber("SELECT count(*) FROM trnflow.attempts WHERE outcome = 'cached'"));
  // The same savings from the API as the CLI prints them.
  EXPECT_EQ(Json(Get(port_, "/api/savings").body), sj);
  // Budgets: spent (running included) and its running part, as `trnflow budget ls`, to the cent;
  // the forecast moves with the clock, so to within a cent.
  auto table = RunTrnflow("budget ls");
  auto cells = Dollars(table.out, "climate-lab");
  ASSERT_GE(cells.size(), 5u) << table.out;
  EXPECT_EQ(ById(dom, "budget-climate-lab-budget_usd"), cells[0]);
  EXPECT_EQ(ById(dom, "budget-climate-lab-spent_usd"), cells[1]);
  EXPECT_EQ(ById(dom, "budget-climate-lab-remaining_usd"), cells[2]);
  EXPECT_EQ(ById(dom, "budget-climate-lab-committed_usd"), cells[3]);
  auto b = CliJson("budget ls --format json");
  ASSERT_EQ(b.size(), 1u);
  std::smatch f;
  std::string forecast = dom;
  ASSERT_TRUE(std::regex_search(forecast, f, std::regex(R"re(id="budget-climate-lab-forecast_usd"><span[^>]*>\$([0-9,.]+)<)re")))
      << dom.substr(0, 3000);
  EXPECT_NEAR(std::stod(std::regex_replace(f[1].str(), std::regex(","), "")),
              b[0]["forecast_usd"].get<double>(), 0.011);
  EXPECT_GT(b[0]["forecast_usd"].get<double>(), b[0]["spent_usd"].get<double>())
      << "the month is not over: more will be spent at this rate";
  EXPECT_LE(b[0]["forecast_low_usd"].get<double>(), b[0]["forecast_usd"].get<double>());
  EXPECT_GE(b[0]["forecast_high_usd"].get<double>(), b[0]["forecast_usd"].get<double>());
  EXPECT_FALSE(ById(dom, "budget-climate-lab-forecast_range").empty());

  for (const std::string by : {"project", "instance", "month"}) {
    auto r = RunTrnflow("spend --by " + by);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto total = Dollars(r.out, "total");
    ASSERT_EQ(total.size(), 3u) << r.out;
    EXPECT_EQ(ById(dom, "spend-" + by + "-total-cost_usd"), total[0]) << by << "\n" << r.out;
    EXPECT_EQ(ById(dom, "spend-" + by + "-total-wasted_usd"), total[1]) << by;
    EXPECT_EQ(ById(dom, "spend-" + by + "-total-saved_usd"), total[2]) << by;
  }
  // Each project's row too.
  auto r = RunTrnflow("spend --by project");
  for (const std::string project : {"climate-lab", "other-lab"}) {
    auto cells = Dollars(r.out, project);
    ASSERT_EQ(cells.size(), 3u) << r.out;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(
        dom, m, std::regex("<td>" + project + R"(</td><td class="num">\d+</td><td class="num">[0-9.]+</td><td class="num">([^<]+)</td>)")))
        << project;
    EXPECT_EQ(m[1], cells[0]) << project;
  }
}

TEST_F(Serve, TheEventStreamFollowsARunResumesAndIsCapped) {
  // Nothing else streams now (the cap test below counts streams).
  ASSERT_TRUE(WaitFor(
      [&] {
        return Get(port_, "/metrics").body.find("\ntrnflow_serve_event_clients 0\n") !=
               std::string::npos;
      },
      30));
  std::atomic<int64_t> run{0};
  Sse live;
  std::thread reader([&] {
    live = ReadEvents(
        port_, {},
        [&](const Sse& s) {
          for (const auto& e : s.events)
            if (run && e["run_id"] == std::to_string(run.load()) && e["stage"].is_null() &&
                e["state"] == "succeeded")
              return true;
          return false;
        },
        90);
  });
  ASSERT_TRUE(WaitFor(
      [&] {
        return Get(port_, "/metrics").body.find("\ntrnflow_serve_event_clients 1\n") !=
               std::string::npos;
      },
      30));
  // Where the job's namespaces show it (its workdir's tree, read-only), made by the test.
  std::string gate = fs::path(testing::JobVisibleDir("serve-gate")) / "gate";
  fs::remove(gate);
  std::string yaml = std::regex_replace(std::string(kSlow), std::regex("GATE"), gate);
  auto sub = RunTrnflow("submit " + WriteTempFile("slow.yaml", yaml) + " --format json");
  ASSERT_EQ(sub.exit_code, 0) << sub.err;
  run = std::stoll(Json(sub.out)["run_id"].get<std::string>());
  std::string id = std::to_string(run.load());

  // The page, opened while the run goes on, follows it without a reload: the last stage ends
  // only once the page is open and following the stream (two streams: it and the reader).
  std::string dom;
  std::thread browser([&] {
    dom = BrowseUntil("http://127.0.0.1:" + std::to_string(port_) + "/runs/" + id,
                      "/class=\"node\" data-stage=\"third\" data-state=\"succeeded\" "
                      "data-live-changes=\"\\d+\"/.test(document.documentElement.outerHTML)",
                      30);
  });
  bool watching = WaitFor(
      [&] {
        return Get(port_, "/metrics").body.find("\ntrnflow_serve_event_clients 2\n") !=
               std::string::npos;
      },
      60);
  std::ofstream(gate) << "go\n";
  browser.join();
  fs::remove(gate);
  EXPECT_TRUE(watching) << "the browser never opened the event stream";
  reader.join();
  ASSERT_EQ(live.status, 200);
  std::vector<std::string> seen;  // "stage:state" of this run, in order
  for (const auto& e : live.events)
    if (e["run_id"] == id) seen.push_back((e["stage"].is_null() ? "" : e["stage"].get<std::string>()) +
                                          ":" + e["state"].get<std::string>());
  std::vector<std::string> order;
  for (const auto& s : seen)
    if (s == "first:running" || s == "first:succeeded" || s == "second:ready" ||
        s == "second:running" || s == "third:succeeded" || s == ":succeeded")
      order.push_back(s);
  EXPECT_EQ(order, (std::vector<std::string>{"first:running", "first:succeeded", "second:ready",
                                             "second:running", "third:succeeded", ":succeeded"}))
      << ::testing::PrintToString(seen);
  EXPECT_TRUE(std::is_sorted(live.ids.begin(), live.ids.end()));
  EXPECT_GE(live.heartbeats, 1) << "an idle stream says it is alive";

  // On screen: the last stage's final state, reached through the stream.
  EXPECT_TRUE(std::regex_search(
      dom, std::regex(R"(class="node" data-stage="third" data-state="succeeded" data-live-changes="\d+")")))
      << dom.substr(0, 3000);

  // Resuming from an id gives exactly what followed it, from the catalog's sequence.
  ASSERT_GE(live.ids.size(), 3u);
  int64_t from = live.ids[0];
  size_t want = live.ids.size() - 1;
  Sse resumed = ReadEvents(port_, {{"Last-Event-ID", std::to_string(from)}},
                           [&](const Sse& s) { return s.ids.size() >= want; }, 20);
  ASSERT_EQ(resumed.status, 200);
  std::vector<int64_t> rest(live.ids.begin() + 1, live.ids.end());
  ASSERT_GE(resumed.ids.size(), want);
  resumed.ids.resize(want);
  EXPECT_EQ(resumed.ids, rest);
  EXPECT_EQ(Get(port_, "/api/events", {{"Last-Event-ID", "yesterday"}}).status, 400);

  // At most --max-clients (4) streams on a dashboard; the fifth is told to poll instead.
  httplib::Headers alice = {{"X-Forwarded-User", alice_}};
  auto clients = [&](int n) {
    return WaitFor(
        [&] {
          return Get(proxy_port_, "/metrics").body.find("\ntrnflow_serve_event_clients " +
                                                        std::to_string(n) + "\n") !=
                 std::string::npos;
        },
        30);
  };
  ASSERT_TRUE(clients(0));
  std::vector<std::thread> holders;
  std::atomic<bool> release{false};
  for (int i = 0; i < 4; ++i)
    holders.emplace_back(
        [&] { ReadEvents(proxy_port_, alice, [&](const Sse&) { return release.load(); }, 60); });
  ASSERT_TRUE(clients(4));
  Http refused = Get(proxy_port_, "/api/events", alice);
  release = true;
  for (auto& t : holders) t.join();
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_NE(refused.body.find("too many event streams"), std::string::npos);
  EXPECT_TRUE(clients(0)) << "closed streams give their place back";
}

// A stream that resumes from far behind (more than the hub keeps and more than one page of
// the catalog) gets every change in order, none skipped between the catalog's pages and the
// hub's newest changes.
TEST_F(Serve, AStreamFarBehindCatchesUpWithoutLosingChanges) {
  // The proxy dashboard's streams last 300 s: one opened now follows the hub alone (no resume
  // from the catalog), so when it has seen the last change, the hub holds it too.
  httplib::Headers alice = {{"X-Forwarded-User", alice_}};
  std::atomic<int64_t> last{0};
  Sse live;
  std::thread follower([&] {
    live = ReadEvents(
        proxy_port_, alice,
        [&](const Sse& x) { return last > 0 && !x.ids.empty() && x.ids.back() >= last; }, 120);
  });
  ASSERT_TRUE(WaitFor(
      [&] {
        return Get(proxy_port_, "/metrics").body.find("\ntrnflow_serve_event_clients 1\n") !=
               std::string::npos;
      },
      30));
  Query("INSERT INTO trnflow.changes (project, run_id, stage, state) SELECT 'other-lab', " +
        std::to_string(other_run_) + ", 'x' || g, 'running' FROM generate_series(1, 30000) g");
  Query("SELECT pg_notify('trnflow_changes', (SELECT max(id) FROM trnflow.changes)::text)");
  last = std::stoll(Query("SELECT max(id) FROM trnflow.changes"));
  follower.join();
  ASSERT_FALSE(live.ids.empty());
  ASSERT_EQ(live.ids.back(), last.load()) << "the hub has read them all";
  // Now from the very beginning: three pages from the catalog and then the hub's newest.
  int64_t total = std::stoll(Query("SELECT count(*) FROM trnflow.changes WHERE project = 'other-lab'"));
  ASSERT_GT(total, 30000);
  httplib::Headers from_start = alice;
  from_start.emplace("Last-Event-ID", "0");
  Sse all = ReadEvents(proxy_port_, from_start,
                       [&](const Sse& x) { return !x.ids.empty() && x.ids.back() >= last; }, 120);
  ASSERT_EQ(all.status, 200);
  ASSERT_FALSE(all.ids.empty());
  EXPECT_EQ(all.ids.back(), last.load());
  EXPECT_TRUE(std::is_sorted(all.ids.begin(), all.ids.end()));
  std::set<int64_t> distinct(all.ids.begin(), all.ids.end());
  EXPECT_EQ(static_cast<int64_t>(distinct.size()), total) << "every change of hers, once";
  EXPECT_EQ(static_cast<int64_t>(all.ids.size()), total);
}

// Change ids are handed out in the order statements run, not the order transactions commit.
// A change whose transaction commits after one with a higher id still reaches a live stream,
// in id order; an id burned by a rolled-back transaction does not hold the stream up.
TEST_F(Serve, ChangesReachAStreamInCommitOrderNoneLost) {
  httplib::Headers alice = {{"X-Forwarded-User", alice_}};
  auto id_of = [](const std::string& stage) {
    std::string v = Query("SELECT id FROM trnflow.changes WHERE stage = '" + stage + "'");
    return v.empty() ? int64_t{0} : std::stoll(v);
  };
  auto insert = [&](const std::string& stage) {
    return "INSERT INTO trnflow.changes (project, run_id, stage, state) VALUES ('other-lab', " +
           std::to_string(other_run_) + ", '" + stage + "', 'running'); ";
  };
  std::atomic<int64_t> want_last{0};
  Sse live;
  // The proxy dashboard's streams last 300 s: this one follows the hub, never the catalog.
  std::thread follower([&] {
    live = ReadEvents(
        proxy_port_, alice,
        [&](const Sse& x) {
          return want_last > 0 && std::find(x.ids.begin(), x.ids.end(), want_last.load()) != x.ids.end();
        },
        60);
  });
  ASSERT_TRUE(WaitFor(
      [&] {
        return Get(proxy_port_, "/metrics").body.find("\ntrnflow_serve_event_clients 1\n") !=
               std::string::npos;
      },
      30));
  auto sequence = [] { return std::stoll(Query("SELECT last_value FROM trnflow.changes_id_seq")); };
  // A transaction takes an id and holds it (open for 4 s); another takes the next and commits.
  int64_t before = sequence();
  std::thread slow([&] {
    Sh("psql '" + TestDatabase::owner_url() + "' -q -v ON_ERROR_STOP=1 -c \"BEGIN; " +
       insert("slow") + "SELECT pg_sleep(4); COMMIT;\" > /dev/null");
  });
  ASSERT_TRUE(WaitFor([&] { return sequence() > before; }, 30));
  Query(insert("fast") + "SELECT pg_notify('trnflow_changes', '0')");
  slow.join();
  int64_t slow_id = id_of("slow"), fast_id = id_of("fast");
  ASSERT_GT(slow_id, 0);
  ASSERT_EQ(fast_id, slow_id + 1) << "the slow one took its id first, committed last";
  // A transaction that began writing after the one that commits first, yet took the lower
  // change id: at the hole, it is newer than every transaction that had ended (the snapshot's
  // xmax), and still running. (The hub once took that xmax for "every transaction that has
  // started" and passed over its change: lost under load, found by bench/serve_bench.)
  before = sequence();
  std::thread first([&] {
    Sh("PGAPPNAME=trnflow-first psql '" + TestDatabase::owner_url() +
       "' -q -v ON_ERROR_STOP=1 -c \"BEGIN; SELECT pg_current_xact_id(); DO \\$\\$ BEGIN WHILE "
       "(SELECT last_value FROM trnflow.changes_id_seq) <= " + std::to_string(before) +
       " LOOP PERFORM pg_sleep(0.05); END LOOP; END \\$\\$; " + insert("first-to-end") +
       "SELECT pg_notify('trnflow_changes', '0'); COMMIT;\" > /dev/null");
  });
  ASSERT_TRUE(WaitFor([&] {
    return Query("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'trnflow-first' "
                 "AND backend_xid IS NOT NULL") == "1";
  }, 30));
  std::thread later([&] {
    Sh("psql '" + TestDatabase::owner_url() + "' -q -v ON_ERROR_STOP=1 -c \"BEGIN; SELECT "
       "pg_current_xact_id(); " + insert("begun-later") + "SELECT pg_sleep(4); COMMIT;\" > /dev/null");
  });
  first.join();
  later.join();
  int64_t later_id = id_of("begun-later"), first_id = id_of("first-to-end");
  ASSERT_GT(later_id, 0);
  ASSERT_EQ(first_id, later_id + 1);
  // And an id taken by a transaction that rolls back, then one more change after it.
  before = sequence();
  Sh("psql '" + TestDatabase::owner_url() + "' -q -c \"BEGIN; " + insert("burned") +
     "ROLLBACK;\" > /dev/null");
  ASSERT_GT(sequence(), before);
  Query(insert("after") + "SELECT pg_notify('trnflow_changes', '0')");
  want_last = id_of("after");
  follower.join();
  ASSERT_EQ(live.status, 200);
  auto at = [&](int64_t id) { return std::find(live.ids.begin(), live.ids.end(), id) - live.ids.begin(); };
  ASSERT_LT(static_cast<size_t>(at(slow_id)), live.ids.size()) << "the change committed late arrived";
  ASSERT_LT(static_cast<size_t>(at(fast_id)), live.ids.size());
  EXPECT_LT(at(slow_id), at(fast_id)) << "in id order";
  ASSERT_LT(static_cast<size_t>(at(later_id)), live.ids.size())
      << "the change of the transaction that began later and ended last arrived";
  EXPECT_LT(at(later_id), at(first_id));
  EXPECT_LT(static_cast<size_t>(at(want_last.load())), live.ids.size())
      << "the rolled-back id did not hold the stream up";
  EXPECT_TRUE(std::is_sorted(live.ids.begin(), live.ids.end()));
}

TEST_F(Serve, AMemberSeesOnlyItsOwnProject) {
  httplib::Headers alice = {{"X-Forwarded-User", alice_}};
  auto runs = Json(Get(proxy_port_, "/api/runs", alice).body);
  ASSERT_EQ(runs.size(), 1u) << runs.dump();
  EXPECT_EQ(runs[0]["project"], "other-lab");
  // What psql shows alice is what the dashboard shows her.
  {
    schema::Catalog as_alice(alice_url_);
    EXPECT_EQ(schema::testing::QueryValue(as_alice, "SELECT count(*) FROM trnflow.runs"), "1");
  }
  EXPECT_EQ(Get(proxy_port_, "/api/runs/" + std::to_string(climate_run_), alice).status, 404);
  EXPECT_EQ(Get(proxy_port_, "/api/runs/" + std::to_string(other_run_), alice).status, 200);
  auto spend = Json(Get(proxy_port_, "/api/spend?by=project", alice).body);
  ASSERT_EQ(spend.size(), 1u) << spend.dump();
  EXPECT_EQ(spend[0]["project"], "other-lab");
  EXPECT_EQ(Get(proxy_port_, "/api/runs?project=climate-lab", alice).status, 400)
      << "a project she cannot see does not exist for her";
  EXPECT_TRUE(Json(Get(proxy_port_, "/api/schedules", alice).body).empty())
      << "the nightly schedule is climate-lab's";
  // Her event stream, from the very first change: her project's only.
  Sse hers = ReadEvents(proxy_port_, {{"X-Forwarded-User", alice_}, {"Last-Event-ID", "0"}},
                        [](const Sse& s) { return s.heartbeats > 0; }, 20);
  ASSERT_EQ(hers.status, 200);
  ASSERT_FALSE(hers.events.empty());
  for (const auto& e : hers.events) EXPECT_EQ(e["project"], "other-lab") << e.dump();
  Sse all = ReadEvents(port_, {{"Last-Event-ID", "0"}},
                       [](const Sse& s) { return s.heartbeats > 0; }, 20);
  std::set<std::string> projects;
  for (const auto& e : all.events) projects.insert(e["project"].get<std::string>());
  EXPECT_TRUE(projects.count("climate-lab")) << "the local (operator's) stream sees every project";
  // Who may not come in.
  EXPECT_EQ(Get(proxy_port_, "/api/runs").status, 401) << "no proxy header";
  EXPECT_EQ(Get(proxy_port_, "/runs").status, 401);
  EXPECT_EQ(Get(proxy_port_, "/api/runs", {{"X-Forwarded-User", "nobody_at_all"}}).status, 403);
  std::string daemon = Query("SELECT trnflow.daemon_role()");
  EXPECT_EQ(Get(proxy_port_, "/api/runs", {{"X-Forwarded-User", daemon}}).status, 403)
      << "never the daemons' own role";
  EXPECT_EQ(Get(proxy_port_, "/api/runs", {{"X-Forwarded-User", "postgres"}}).status, 403);
  // The local dashboard answers loopback names only (a rebinding page names its own host).
  EXPECT_EQ(Get(port_, "/api/runs", {{"Host", "evil.example:" + std::to_string(port_)}}).status,
            403);
  // Her connections go back to the login's own role; alice again still sees only hers.
  EXPECT_EQ(Json(Get(proxy_port_, "/api/runs", alice).body).size(), 1u);
}

TEST_F(Serve, MetricsForAProxyUserCountOnlyWhatTheySee) {
  // No user header: the monitoring system's view, everything (as before).
  Http all = Get(proxy_port_, "/metrics");
  ASSERT_EQ(all.status, 200) << all.body;
  EXPECT_NE(all.body.find(R"(trnflow_spend_usd_total{project="climate-lab"})"), std::string::npos);
  EXPECT_NE(all.body.find(R"(trnflow_spend_usd_total{project="other-lab"})"), std::string::npos);
  // Alice's: computed as her role, so row-level security leaves out climate-lab.
  Http hers = Get(proxy_port_, "/metrics", {{"X-Forwarded-User", alice_}});
  ASSERT_EQ(hers.status, 200) << hers.body;
  std::string file = WriteTempFile("metrics-alice.txt", hers.body);
  auto check = Sh("promtool check metrics < " + file);
  EXPECT_EQ(check.exit_code, 0) << check.out << "\n" << hers.body;
  EXPECT_EQ(hers.body.find("climate-lab"), std::string::npos) << hers.body;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      hers.body, m, std::regex(R"(\ntrnflow_spend_usd_total\{project="other-lab"\} ([0-9.e+-]+)\n)")))
      << hers.body;
  EXPECT_NEAR(std::stod(m[1]), std::stod(LedgerSum("other-lab")), 1e-6);
  // Her attempts only: one run of one stage.
  double attempts = 0;
  std::regex attempts_re(R"(\ntrnflow_attempts_total\{[^}]*\} ([0-9.e+-]+))");
  for (auto it = std::sregex_iterator(hers.body.begin(), hers.body.end(), attempts_re);
       it != std::sregex_iterator(); ++it)
    attempts += std::stod((*it)[1]);
  EXPECT_EQ(attempts, QueryNumber("SELECT count(*) FROM trnflow.attempts a JOIN trnflow.runs r ON "
                                  "r.id = a.run_id WHERE r.project = 'other-lab' AND a.outcome "
                                  "IS NOT NULL"));
  // A header naming someone it may not act as is refused, as for the API.
  EXPECT_EQ(Get(proxy_port_, "/metrics", {{"X-Forwarded-User", "postgres"}}).status, 403);
}

// A run: stage that prints a line, waits for GATE, prints another and ends.
constexpr char kTalky[] = R"(pipeline: talky
project: climate-lab
stages:
  say:
    run: ["bash", "-c", "echo 'line one'; while [ ! -e GATE ]; do sleep 0.2; done; echo 'line two'; [ -e GATE.again ]"]
    instance: c6i.xlarge
)";

TEST_F(Serve, TheLogOfARunStageIsTailedForThoseWhoSeeTheRun) {
  // A finished run: the API gives the log `trnflow logs` prints, whole.
  std::string climate = std::to_string(climate_run_);
  auto cli = CliJson("logs " + climate + " prepare --format json");
  ASSERT_EQ(cli.size(), 1u) << cli.dump();
  ASSERT_TRUE(cli[0]["text"].is_string()) << cli.dump();
  Http whole = Get(port_, "/api/runs/" + climate + "/log?stage=prepare&attempt=1");
  ASSERT_EQ(whole.status, 200) << whole.body;
  auto w = Json(whole.body);
  EXPECT_EQ(w["text"], cli[0]["text"]);
  EXPECT_FALSE(w["text"].get<std::string>().empty());
  EXPECT_EQ(w["complete"], true);
  EXPECT_EQ(w["next_offset"], w["size"]);
  // From an offset: the rest only.
  Http rest = Get(port_, "/api/runs/" + climate + "/log?stage=prepare&attempt=1&offset=5");
  EXPECT_EQ(Json(rest.body)["text"], cli[0]["text"].get<std::string>().substr(5));

  // Nothing but what the catalog names: no such stage, attempt, run; names that try a path.
  EXPECT_EQ(Get(port_, "/api/runs/" + climate + "/log?stage=nope&attempt=1").status, 404);
  EXPECT_EQ(Get(port_, "/api/runs/" + climate + "/log?stage=prepare&attempt=9").status, 404);
  EXPECT_EQ(Get(port_, "/api/runs/99999999/log?stage=prepare&attempt=1").status, 404);
  EXPECT_EQ(Get(port_, "/api/runs/" + climate + "/log?stage=..%2F..%2F..%2Fetc%2Fpasswd&attempt=1")
                .status,
            404);
  EXPECT_EQ(Get(port_, "/api/runs/" + climate + "/log?stage=prepare&attempt=..%2F1").status, 400);
  EXPECT_EQ(Get(port_, "/api/runs/" + climate + "/log?stage=prepare&offset=-1").status, 400);
  EXPECT_EQ(Get(port_, "/api/runs/" + climate + "/log?stage=train&attempt=1").status, 400)
      << "a train: stage writes no log";
  // Only for those who see the run: alice (other-lab) does not see climate-lab's.
  httplib::Headers alice = {{"X-Forwarded-User", alice_}};
  EXPECT_EQ(Get(proxy_port_, "/api/runs/" + climate + "/log?stage=prepare&attempt=1", alice).status,
            404);
  EXPECT_EQ(Get(proxy_port_, "/api/runs/" + climate + "/log?stage=prepare&attempt=1").status, 401);

  // A running stage: read what is there, then only what followed, as it grows.
  std::string gate = fs::path(testing::JobVisibleDir("serve-log-gate")) / "gate";
  fs::remove(gate);
  std::string yaml = std::regex_replace(std::string(kTalky), std::regex("GATE"), gate);
  auto sub = RunTrnflow("submit " + WriteTempFile("talky.yaml", yaml) + " --format json");
  ASSERT_EQ(sub.exit_code, 0) << sub.err;
  std::string run = Json(sub.out)["run_id"];
  std::string path = "/api/runs/" + run + "/log?stage=say&attempt=1";
  nlohmann::json first;
  ASSERT_TRUE(WaitFor(
      [&] {
        Http h = Get(port_, path);
        if (h.status != 200) return false;
        first = Json(h.body);
        return first["text"] == "line one\n";
      },
      30))
      << first.dump();
  EXPECT_EQ(first["outcome"], nullptr);
  EXPECT_EQ(first["complete"], false);
  int64_t offset = first["next_offset"];
  EXPECT_EQ(offset, 9);

  // The page follows it: opened while the stage runs, it shows the second line once written.
  std::string dom;
  std::thread browser([&] {
    dom = BrowseUntil("http://127.0.0.1:" + std::to_string(port_) + "/runs/" + run + "?log=say",
                      "document.querySelector('#log-text[data-stage=\"say\"][data-attempt=\"2\"]"
                      "[data-complete=\"true\"]')?.textContent === 'line one\\nline two\\n'",
                      30);
  });
  bool watching = WaitFor(
      [&] {
        return Get(port_, "/metrics").body.find("\ntrnflow_serve_event_clients 1\n") !=
               std::string::npos;
      },
      60);
  std::ofstream(gate) << "go\n";
  nlohmann::json next;
  EXPECT_TRUE(WaitFor(
      [&] {
        next = Json(Get(port_, path + "&offset=" + std::to_string(offset)).body);
        return next["complete"] == true;
      },
      30))
      << next.dump();
  EXPECT_EQ(next["text"], "line two\n") << "from the offset on: only what followed";
  EXPECT_EQ(next["outcome"], "failed");
  // Tried again (by hand, as on-call does), it writes a second attempt's log: the page that
  // followed the first moves to it.
  std::ofstream(gate + ".again") << "go\n";
  ASSERT_TRUE(WaitFor([&] { return Query("SELECT state FROM trnflow.runs WHERE id = " + run) == "failed"; }, 30));
  auto retried = RunTrnflow("retry " + run + " say");
  ASSERT_EQ(retried.exit_code, 0) << retried.err;
  browser.join();
  fs::remove(gate);
  fs::remove(gate + ".again");
  EXPECT_TRUE(watching);
  EXPECT_EQ(Query("SELECT state FROM trnflow.runs WHERE id = " + run), "succeeded");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dom, m, std::regex(R"(<pre id="log-text" class="log"([^>]*)>([^<]*)</pre>)")))
      << dom.substr(0, 6000);
  EXPECT_NE(std::string(m[1]).find("data-stage=\"say\" data-attempt=\"2\""), std::string::npos) << m[1];
  EXPECT_EQ(m[2], "line one\nline two\n");
  EXPECT_NE(std::string(m[1]).find("data-complete=\"true\""), std::string::npos) << m[1];
  std::smatch reads;
  std::string attributes = m[1];
  ASSERT_TRUE(std::regex_search(attributes, reads, std::regex(R"re(data-reads-all="(\d+)")re")));
  EXPECT_GE(std::stoi(reads[1]), 3) << "it read the first attempt's log more than once (it followed "
                                       "the file), then the second's";
}

Http Post(int port, const std::string& path, const httplib::Headers& headers,
          bool authenticate = true) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  auto r = c.Post(path.c_str(), WithCredential(port, headers, authenticate), "",
                  "application/x-www-form-urlencoded");
  if (!r) return {};
  return {r->status, r->body, -1, r->get_header_value("Location"), r->get_header_value("Set-Cookie")};
}

TEST_F(Serve, WritesNeedAWriterAndTheCsrfToken) {
  std::string bob = "trnflow_test_" + TestDatabase::database_name() + "_bob";
  TestDatabase::NewLogin("bob");
  ASSERT_EQ(RunTrnflow("project grant other-lab " + bob + " --read").exit_code, 0);
  auto sub = RunTrnflow("submit " +
                        WriteTempFile("long.yaml", "pipeline: long-work\nproject: other-lab\n"
                                                   "stages:\n  wait:\n    run: [\"sleep\", \"60\"]\n"
                                                   "    instance: c6i.xlarge\n") +
                        " --format json");
  ASSERT_EQ(sub.exit_code, 0) << sub.err;
  std::string run = Json(sub.out)["run_id"];
  auto state = [&] { return Query("SELECT state FROM trnflow.runs WHERE id = " + run); };
  ASSERT_TRUE(WaitFor([&] {
    return Query("SELECT state FROM trnflow.stages WHERE run_id = " + run) == "running";
  }, 30));
  auto token = [&](const std::string& who) {
    return Json(Get(proxy_port_, "/api/me", {{"X-Forwarded-User", who}}).body)["csrf_token"]
        .get<std::string>();
  };
  std::string cancel = "/api/runs/" + run + "/cancel";
  // No token, a wrong one, another person's: refused, nothing changes.
  EXPECT_EQ(Post(proxy_port_, cancel, {{"X-Forwarded-User", alice_}}).status, 403);
  EXPECT_EQ(Post(proxy_port_, cancel, {{"X-Forwarded-User", alice_}, {"X-CSRF-Token", token(bob)}})
                .status,
            403);
  // A reader of the project may not write.
  Http by_bob = Post(proxy_port_, cancel, {{"X-Forwarded-User", bob}, {"X-CSRF-Token", token(bob)}});
  EXPECT_EQ(by_bob.status, 403) << by_bob.body;
  EXPECT_NE(by_bob.body.find("not write"), std::string::npos) << by_bob.body;
  // Nobody acts on a run they cannot see.
  EXPECT_EQ(Post(proxy_port_, "/api/runs/" + std::to_string(climate_run_) + "/cancel",
                 {{"X-Forwarded-User", alice_}, {"X-CSRF-Token", token(alice_)}})
                .status,
            404);
  EXPECT_EQ(state(), "running");
  // The writer with her token cancels it, and may resume it.
  httplib::Headers alice = {{"X-Forwarded-User", alice_}, {"X-CSRF-Token", token(alice_)}};
  Http ok = Post(proxy_port_, cancel, alice);
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(Json(ok.body)["cancelled"], true);
  EXPECT_TRUE(WaitFor([&] { return state() == "cancelled"; }, 30)) << state();
  ASSERT_TRUE(WaitFor([&] {  // its worker stops the running stage
    return Query("SELECT state FROM trnflow.stages WHERE run_id = " + run) == "cancelled";
  }, 30));
  Http resumed = Post(proxy_port_, "/api/runs/" + run + "/resume", alice);
  ASSERT_EQ(resumed.status, 200) << resumed.body;
  EXPECT_GE(Json(resumed.body)["stages_reset"].get<int>(), 1);
  EXPECT_EQ(state(), "running");
  EXPECT_EQ(Post(proxy_port_, cancel, alice).status, 200);
  // Bad input is 400: resuming a run that is not failed or cancelled (local: the operator).
  std::string local_token = Json(Get(port_, "/api/me").body)["csrf_token"];
  EXPECT_EQ(Post(port_, "/api/runs/" + std::to_string(climate_run_) + "/resume", {}).status, 403);
  EXPECT_EQ(Post(port_, "/api/runs/" + std::to_string(climate_run_) + "/resume",
                 {{"X-CSRF-Token", local_token}})
                .status,
            400);
}

// ---- Issue 32, part 4: the dashboard trusts no position ----------------------------------
//
// Every process on the host (any user, any job) can connect to a loopback port; connecting
// proves nothing. Each test below is an attack that succeeded before (every /api read and a
// cancel without any credential; a forged X-Forwarded-User; Host: 127.attacker.example; slow
// clients holding every thread).

// A run of project other-lab whose one stage sleeps a minute, running on the worker.
std::string StartALongRun(const std::string& name) {
  auto sub = RunTrnflow("submit " +
                        WriteTempFile(name + ".yaml", "pipeline: " + name +
                                                          "\nproject: other-lab\nstages:\n"
                                                          "  wait:\n    run: [\"sleep\", \"60\"]\n"
                                                          "    instance: c6i.xlarge\n") +
                        " --format json");
  EXPECT_EQ(sub.exit_code, 0) << sub.err;
  std::string run = Json(sub.out)["run_id"];
  EXPECT_TRUE(WaitFor([&] {
    return Query("SELECT state FROM trnflow.stages WHERE run_id = " + run) == "running";
  }, 30));
  return run;
}

// A shell command as the user nobody: another local user, or a job's uid.
std::string AsNobody(const std::string& cmd) {
  return "setpriv --reuid=65534 --regid=65534 --clear-groups -- " + cmd;
}

TEST_F(Serve, WithoutTheTokenALocalProcessReadsAndCancelsNothing) {
  const Credential& cred = Credentials()[port_];
  std::string run = StartALongRun("local-victim");
  std::string base = "http://127.0.0.1:" + std::to_string(port_);
  // Another user on the host, with curl: nothing to read.
  auto curl = Sh(AsNobody("curl -s -o /dev/null -w '%{http_code}' " + base + "/api/runs"));
  EXPECT_EQ(curl.out, "401") << curl.out;
  for (const std::string& path : std::vector<std::string>{"/api/runs", "/api/runs/" + run, "/api/spend", "/api/budgets",
                                 "/api/schedules", "/api/workers", "/api/me", "/api/events",
                                 "/metrics", "/runs", "/runs/" + run, "/assets/app.js"})
    EXPECT_EQ(Get(port_, path, {}, false).status, 401) << path;
  // A wrong token, wherever it is put.
  std::string cookie = "trnflow_token_" + std::to_string(port_);
  EXPECT_EQ(Get(port_, "/api/runs", {{"Authorization", "Bearer " + std::string(64, '0')}}, false).status, 401);
  EXPECT_EQ(Get(port_, "/api/runs?token=" + std::string(64, '0'), {}, false).status, 401);
  EXPECT_EQ(Get(port_, "/api/runs", {{"Cookie", cookie + "=" + std::string(64, '0')}}, false).status, 401);
  EXPECT_EQ(Get(port_, "/api/runs", {{"Authorization", "Bearer " + cred.secret.substr(0, 63)}}, false).status,
            401);
  // No cancel: there is no CSRF token to read, and a write without the token is refused first.
  nlohmann::json me = Json(Get(port_, "/api/me", {}, false).body);
  std::string stolen = me.value("csrf_token", "x");
  EXPECT_EQ(Post(port_, "/api/runs/" + run + "/cancel", {{"X-CSRF-Token", stolen}}, false).status, 401);
  auto cancel = Sh(AsNobody("curl -s -o /dev/null -w '%{http_code}' -X POST -H 'X-CSRF-Token: x' " +
                             base + "/api/runs/" + run + "/cancel"));
  EXPECT_EQ(cancel.out, "401") << cancel.out;
  EXPECT_EQ(Post(port_, "/api/runs/" + run + "/cancel", {{"X-CSRF-Token", "x"}}, false).status, 401);
  EXPECT_EQ(Query("SELECT state FROM trnflow.runs WHERE id = " + run), "running");
  // The operator: the address with the token sets a cookie (HttpOnly, this dashboard's own
  // name) and sends the browser on without the token in the address; then the cookie does.
  Http opened = Get(port_, "/runs?live=0&token=" + cred.secret, {}, false);
  EXPECT_EQ(opened.status, 303);
  EXPECT_EQ(opened.location, "/runs?live=0");
  EXPECT_EQ(opened.set_cookie.rfind(cookie + "=" + cred.secret + ";", 0), 0u) << opened.set_cookie;
  EXPECT_NE(opened.set_cookie.find("HttpOnly"), std::string::npos);
  EXPECT_EQ(Get(port_, "/runs?token=" + cred.secret + "&x=//evil.example", {}, false).location,
            "/runs?x=//evil.example");
  EXPECT_EQ(Get(port_, "//evil.example/?token=" + cred.secret, {}, false).location, "/")
      << "never a protocol-relative redirect";
  EXPECT_EQ(Get(port_, "/runs/" + run, {{"Cookie", "a=b; " + cookie + "=" + cred.secret}}, false).status,
            200);
  EXPECT_EQ(Get(port_, "/healthz", {}, false).status, 200) << "health checks need nothing";
  // The dashboard made its token file for its own user: others cannot read it.
  struct stat st {};
  EXPECT_EQ(stat(cred.file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_NE(Sh(AsNobody("cat " + cred.file)).exit_code, 0) << "another user reads the token";
  // ... and may cancel it.
  std::string csrf = Json(Get(port_, "/api/me").body)["csrf_token"];
  Http done = Post(port_, "/api/runs/" + run + "/cancel", {{"X-CSRF-Token", csrf}});
  EXPECT_EQ(done.status, 200) << done.body;
}

TEST_F(Serve, AForgedUserHeaderWithoutTheProxySecretIsRefused) {
  const Credential& cred = Credentials()[proxy_port_];
  std::string run = StartALongRun("proxy-victim");
  std::string base = "http://127.0.0.1:" + std::to_string(proxy_port_);
  // A local process names alice itself, as the proxy would.
  httplib::Headers forged = {{"X-Forwarded-User", alice_}};
  auto curl = Sh(AsNobody("curl -s -o /dev/null -w '%{http_code}' -H 'X-Forwarded-User: " +
                           alice_ + "' " + base + "/api/runs"));
  EXPECT_EQ(curl.out, "401") << curl.out;
  for (const std::string& path :
       std::vector<std::string>{"/api/runs", "/api/runs/" + run, "/api/me", "/api/events", "/runs"})
    EXPECT_EQ(Get(proxy_port_, path, forged, false).status, 401) << path;
  EXPECT_EQ(Get(proxy_port_, "/metrics", {}, false).status, 401)
      << "/metrics without a user header counts every project: not for anyone who connects";
  httplib::Headers wrong = forged;
  wrong.emplace("X-Trnflow-Proxy-Secret", std::string(64, '0'));
  EXPECT_EQ(Get(proxy_port_, "/api/runs", wrong, false).status, 401);
  httplib::Headers bearer = forged;
  bearer.emplace("Authorization", "Bearer " + std::string(64, '0'));
  EXPECT_EQ(Get(proxy_port_, "/api/runs", bearer, false).status, 401);
  // Her cancel, forged (with the CSRF token /api/me would give her): refused, the run goes on.
  httplib::Headers write = forged;
  write.emplace("X-CSRF-Token", Json(Get(proxy_port_, "/api/me", forged, false).body).value("csrf_token", "x"));
  EXPECT_EQ(Post(proxy_port_, "/api/runs/" + run + "/cancel", write, false).status, 401);
  EXPECT_EQ(Query("SELECT state FROM trnflow.runs WHERE id = " + run), "running");
  // Through the proxy (which adds the secret), she is herself; Prometheus sends the secret as a
  // bearer token (authorization: credentials_file).
  struct stat st {};
  EXPECT_EQ(stat(cred.file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(Get(proxy_port_, "/api/runs/" + run, forged).status, 200);
  EXPECT_EQ(Get(proxy_port_, "/metrics", {{"Authorization", "Bearer " + cred.secret}}, false).status, 200);
  std::string csrf = Json(Get(proxy_port_, "/api/me", forged).body)["csrf_token"];
  Http done = Post(proxy_port_, "/api/runs/" + run + "/cancel",
                   {{"X-Forwarded-User", alice_}, {"X-CSRF-Token", csrf}});
  EXPECT_EQ(done.status, 200) << done.body;
}

TEST_F(Serve, OnlyExactHostNamesPass) {
  std::string p = ":" + std::to_string(port_);
  for (const std::string& bad : std::vector<std::string>{"127.attacker.example" + p, "127.0.0.1.attacker.example" + p, "localhost.attacker.example" + p,
        "127.0.0.1.nip.io" + p, "attacker.example" + p, "127.0.0.2" + p, "[::1]" + p, "127.0.0.1:x",
        "127.0.0.1:" + p, "[127.0.0.1" + p, std::string("")})
    EXPECT_EQ(Get(port_, "/api/runs", {{"Host", bad}}).status, 403) << "Host: " << bad;
  for (const std::string& good :
       std::vector<std::string>{"127.0.0.1" + p, "localhost" + p, "LocalHost" + p, "127.0.0.1"})
    EXPECT_EQ(Get(port_, "/api/runs", {{"Host", good}}).status, 200) << "Host: " << good;
  EXPECT_FALSE(serve::IsLoopback("127.attacker.example"));
  EXPECT_FALSE(serve::IsLoopback("127.0.0.1.nip.io"));
  EXPECT_FALSE(serve::IsLoopback("::ffff:10.0.0.1"));
  EXPECT_TRUE(serve::IsLoopback("127.1.2.3"));
  EXPECT_TRUE(serve::IsLoopback("[::1]"));
  auto names = serve::AllowedHosts("0.0.0.0", {"dash.example.org"});
  EXPECT_EQ(names, std::vector<std::string>{"dash.example.org"}) << "never every name";
  EXPECT_TRUE(serve::HostAllowed("Dash.Example.Org:443", names));
  EXPECT_FALSE(serve::HostAllowed("dash.example.org.attacker.example", names));
  EXPECT_EQ(serve::AllowedHosts("::1", {}), (std::vector<std::string>{"[::1]", "localhost"}));
}

// A TCP connection to the dashboard from `source` (another loopback address: another client).
int Connect(int port, const char* source) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source, &from.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0) return close(fd), -1;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) return close(fd), -1;
  return fd;
}

// What the server sent, until it closed the connection; nullopt while it is still open
// (waiting at most `ms`).
std::optional<std::string> ClosedWith(int fd, int ms) {
  std::string got;
  pollfd p{fd, POLLIN, 0};
  while (poll(&p, 1, ms) > 0) {
    char buf[4096];
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0) return got;
    got.append(buf, static_cast<size_t>(n));
  }
  return std::nullopt;
}

TEST_F(Serve, SlowClientsAreDroppedAndCappedWhileOthersAreServed) {
  // 2 event streams: 2 * 2 + 16 = 20 threads serve connections.
  std::unique_ptr<Daemon> d;
  int port = StartServe(d, "serve-slow", {"--max-clients", "2", "--header-timeout", "2",
                                          "--max-pending-per-client", "4"});
  const std::string start = "GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
  // One client sends a byte of its headers every half second, each well within the read
  // timeout (5 s): httplib alone waited for each byte anew, for ever. Dropped at 2 s.
  int slow = Connect(port, "127.0.0.2");
  ASSERT_GE(slow, 0);
  send(slow, start.data(), start.size(), MSG_NOSIGNAL);
  std::optional<std::string> closed;
  int sent = 0;
  for (; sent < 40 && !closed; ++sent) {
    send(slow, "a", 1, MSG_NOSIGNAL);
    closed = ClosedWith(slow, 500);
  }
  close(slow);
  EXPECT_TRUE(closed) << "still open after " << sent << " bytes, 20 s";
  EXPECT_LE(sent, 12) << "dropped after the 2 s header timeout, not the read timeout";
  // A 400, unless the bytes it never read made its close a reset that took the answer along.
  if (closed) {
    EXPECT_TRUE(closed->empty() || closed->rfind("HTTP/1.1 400", 0) == 0) << *closed;
  }
  // Another sends header lines as fast as it likes, for ever: dropped at 2 s as well.
  int endless = Connect(port, "127.0.0.2");
  ASSERT_GE(endless, 0);
  send(endless, start.data(), start.size(), MSG_NOSIGNAL);
  std::optional<std::string> ended;
  int lines = 0;
  for (; lines < 2000 && !ended; ++lines) {
    std::string line = "x\r\nX-More-" + std::to_string(lines) + ": ";
    send(endless, line.data(), line.size(), MSG_NOSIGNAL);
    ended = ClosedWith(endless, 10);
  }
  close(endless);
  EXPECT_TRUE(ended) << "still open after " << lines << " header lines, 20 s";
  EXPECT_LE(lines, 1000) << "dropped after the 2 s header timeout (10 ms a line at least)";
  // Slowloris: 60 connections from one address, each trickling (more than there are threads).
  // That address holds 4 of them; the rest are refused (429) and closed at once, and another
  // client is served all along.
  std::vector<int> fds;
  for (int i = 0; i < 60; ++i) {
    int fd = Connect(port, "127.0.0.3");
    ASSERT_GE(fd, 0);
    send(fd, start.data(), start.size(), MSG_NOSIGNAL);
    fds.push_back(fd);
  }
  std::vector<bool> gone(fds.size());
  auto still_open = [&] {
    int open = 0;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!gone[i] && ClosedWith(fds[i], 0)) gone[i] = true;
      open += gone[i] ? 0 : 1;
    }
    return open;
  };
  EXPECT_TRUE(WaitFor([&] { return still_open() <= 4; }, 10))
      << still_open() << " connections of one address still held";
  int served = 0;
  for (int round = 0; round < 6; ++round) {
    for (size_t i = 0; i < fds.size(); ++i)
      if (!gone[i]) send(fds[i], "a", 1, MSG_NOSIGNAL);
    EXPECT_LE(still_open(), 4);
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(3, 0);
    c.set_read_timeout(3, 0);
    auto r = c.Get("/api/runs", Credentials()[port].headers);
    if (r && r->status == 200) ++served;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  for (int fd : fds) close(fd);
  EXPECT_EQ(served, 6) << "another client was kept waiting";
  EXPECT_TRUE(WaitFor([&] {
    return ReadFile(d->log_path()).find("--max-pending-per-client") != std::string::npos;
  }, 15)) << "the refusals are logged";
}

// --listen unix:PATH: the file system decides who connects (the socket 0600, its directory
// 0700), and the dashboard checks the peer's uid too (SO_PEERCRED): its own user or root.
TEST_F(Serve, AUnixSocketLetsInOnlyItsUserAndRoot) {
  std::string dir = fs::temp_directory_path() / ("trnflow-serve-sock-" + std::to_string(getpid()));
  fs::remove_all(dir);
  std::string path = dir + "/serve.sock";
  Daemon d("serve-unix", {"serve", "--listen", "unix:" + path, "--token-file", SecretDir() + "/unix.token"},
           {"TRNFLOW_HOME=" + testing::CliHome()});
  d.Start();
  ASSERT_TRUE(WaitFor([&] { return ReadFile(d.log_path()).find("listening on unix:") != std::string::npos; },
                      30))
      << ReadFile(d.log_path());
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  auto curl = [&](const std::string& extra) {
    return "curl -s -o /dev/null -w '%{http_code}' --unix-socket " + path + " " + extra +
           " http://localhost/api/runs";
  };
  // Its user (root here) needs no token.
  EXPECT_EQ(Sh(curl("")).out, "200");
  EXPECT_EQ(Sh(curl("-H 'Host: 127.attacker.example'")).out, "403") << "Host is still checked";
  // Another user cannot connect...
  EXPECT_EQ(Sh(AsNobody(curl(""))).out, "000");
  // ... and, were the modes loosened by mistake, is turned away by its uid.
  fs::permissions(dir, fs::perms::owner_all | fs::perms::others_read | fs::perms::others_exec);
  fs::permissions(path, fs::perms::all);
  EXPECT_EQ(Sh(AsNobody(curl(""))).out, "000");
  EXPECT_EQ(Sh(curl("")).out, "200");
  EXPECT_TRUE(WaitFor([&] { return ReadFile(d.log_path()).find("uid 65534") != std::string::npos; }, 10));
  // A proxy reaches the dashboard over TCP, with its secret.
  auto r = RunTrnflow("serve --auth proxy --listen unix:" + dir + "/p.sock --proxy-secret-file " +
                      SecretDir() + "/unix.proxy-secret");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  d.Kill(SIGTERM);
  EXPECT_FALSE(fs::exists(path)) << "a stopped dashboard removes its socket";
  fs::remove_all(dir);
}

TEST_F(Serve, ASecretFileOthersMayReadIsRefused) {
  std::string file = SecretDir() + "/loose.token";
  std::ofstream(file) << std::string(64, 'a') << "\n";
  fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write | fs::perms::others_read);
  auto r = RunTrnflow("serve --listen 127.0.0.1:0 --token-file " + file);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("chmod 600"), std::string::npos) << r.err;
  fs::permissions(file, fs::perms::owner_read | fs::perms::owner_write);
  ASSERT_EQ(chown(file.c_str(), 65534, 65534), 0);
  r = RunTrnflow("serve --listen 127.0.0.1:0 --token-file " + file);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("not this user"), std::string::npos) << r.err;
}

// The text format by itself: HELP and TYPE once per metric, label values escaped, a metric it
// does not know kept (untyped) rather than dropped, numbers that read back exactly.
TEST(ServeMetrics, TheTextFormatIsWellFormed) {
  std::string text = serve::FormatMetrics({
      {"trnflow_spend_usd_total", R"({"project":"a\"b\\c\nd"})", 0.799283},
      {"trnflow_spend_usd_total", R"({"project":"x"})", 2},
      {"trnflow_something_new", "{}", 1.5},
  });
  EXPECT_EQ(text,
            "# HELP trnflow_something_new trnflow metric\n"
            "# TYPE trnflow_something_new untyped\n"
            "trnflow_something_new 1.5\n"
            "# HELP trnflow_spend_usd_total Dollars charged by closed attempts (the ledger).\n"
            "# TYPE trnflow_spend_usd_total counter\n"
            "trnflow_spend_usd_total{project=\"a\\\"b\\\\c\\nd\"} 0.799283\n"
            "trnflow_spend_usd_total{project=\"x\"} 2\n");
  std::string file = WriteTempFile("format.txt", text);
  auto check = Sh("promtool check metrics < " + file);
  EXPECT_EQ(check.exit_code, 0) << check.out;
}

TEST(ServeOptions, ListenAddressesAndLoopback) {
  serve::Options o;
  serve::ParseListen("127.0.0.1:8080", o);
  EXPECT_EQ(o.host, "127.0.0.1");
  EXPECT_EQ(o.port, 8080);
  serve::ParseListen("[::1]:0", o);
  EXPECT_EQ(o.host, "::1");
  EXPECT_EQ(o.port, 0);
  serve::ParseListen(":9000", o);
  EXPECT_EQ(o.host, "0.0.0.0");
  EXPECT_FALSE(serve::IsLoopback(o.host));
  EXPECT_TRUE(serve::IsLoopback("127.0.0.2"));
  EXPECT_TRUE(serve::IsLoopback("localhost"));
  serve::ParseListen("unix:/run/trnflow/serve.sock", o);
  EXPECT_EQ(o.unix_path, "/run/trnflow/serve.sock");
  serve::ParseListen("127.0.0.1:8080", o);
  EXPECT_EQ(o.unix_path, "");
  for (const char* bad : {"8080", "host:99999", "a b:1", "127.0.0.1:", "unix:", "unix:relative.sock"})
    EXPECT_THROW(serve::ParseListen(bad, o), UserError) << bad;
  // And the command refuses to serve everything to the network without a login.
  auto r = RunTrnflow("serve --listen 0.0.0.0:0");
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("loopback addresses only"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace trnflow
