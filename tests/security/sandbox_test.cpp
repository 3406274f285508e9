// The job sandbox against hostile jobs: real processes, real files, no catalog. Each job is a
// bash script run by ProcessExecutor exactly as a worker runs a `run:` stage; the test plays
// the worker (root) and checks what the job could see and do. Needs root (skips otherwise).
#include "workers/sandbox.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "tests/test_db.h"
#include "workers/executor.h"

namespace fs = std::filesystem;
using namespace trnflow;
using namespace trnflow::workers;

namespace {

constexpr uid_t kProjectA = 200001, kProjectB = 200002;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

long RssKiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

class SandboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "the sandbox switches uids: run as root";
    home_ =
        (fs::temp_directory_path() / ("trnflow-sandbox-test-" + std::to_string(getpid()))).string();
    ASSERT_EQ(PrepareHome(home_, true), "");
  }
  void TearDown() override {
    std::error_code ec;
    if (!home_.empty()) fs::remove_all(home_, ec);
  }

  // A job of the project whose uid is `uid`, in run `run_id`, running `script` under bash.
  ExecContext Job(const std::string& stage, uid_t uid, int64_t run_id, const std::string& script) {
    ExecContext ctx;
    ctx.spec.name = stage;
    ctx.spec.kind = StageKind::kRun;
    ctx.spec.command.argv = {"bash", "-c", script};
    ctx.run_id = run_id;
    ctx.workdir = TRNFLOW_SOURCE_DIR;
    std::string tag = "run-" + std::to_string(run_id);
    ctx.run_dir = home_ + "/runs/" + std::to_string(run_id);
    ctx.log_path = home_ + "/logs/" + tag + "/" + stage + ".attempt-1.log";
    ctx.checkpoint_dir = home_ + "/checkpoints/" + tag + "/" + stage;
    ctx.identity = {true, uid, uid};
    return ctx;
  }
  ExecResult Run(const ExecContext& ctx) { return ProcessExecutor().Run(ctx); }

  std::string home_;
};

TEST_F(SandboxTest, JobGetsACleanEnvironmentAndNothingOfTheWorkers) {
  setenv("TRNFLOW_DATABASE_URL", "postgresql://trnflow:canarypw@localhost/trnflow", 1);
  setenv("PGPASSWORD", "canarypw2", 1);
  setenv("WORKER_ONLY_CANARY", "canary3", 1);
  auto ctx = Job("env", kProjectA, 1,
                 "env; echo ---; tr '\\0' '\\n' < /proc/self/environ; echo ---; "
                 "tr '\\0' '\\n' < /proc/$PPID/environ 2>&1; true");
  ctx.spec.command.env = {{"DECLARED", "yes"}, {"WHERE", "${{ run.dir }}/x"}};
  ExecResult r = Run(ctx);
  unsetenv("PGPASSWORD");
  unsetenv("WORKER_ONLY_CANARY");
  ASSERT_EQ(r.outcome, Outcome::kSucceeded) << r.message;
  std::string log = ReadFile(ctx.log_path);
  for (const char* leak : {"canarypw", "canary3", "PGPASSWORD", "TRNFLOW_DATABASE_URL",
                           "WORKER_ONLY_CANARY", "TRNFLOW_HOME="})
    EXPECT_EQ(log.find(leak), std::string::npos) << leak << " reached the job:\n" << log;
  EXPECT_NE(log.find("PATH=/usr/local/bin:/usr/bin:/bin\n"), std::string::npos) << log;
  EXPECT_NE(log.find("LANG=C.UTF-8\n"), std::string::npos);
  EXPECT_NE(log.find("HOME=" + ctx.run_dir + "/.home/env.attempt-1\n"), std::string::npos) << log;
  EXPECT_NE(log.find("TMPDIR=" + ctx.run_dir + "/.home/env.attempt-1/tmp\n"), std::string::npos);
  EXPECT_NE(log.find("DECLARED=yes\n"), std::string::npos);
  EXPECT_NE(log.find("WHERE=" + ctx.run_dir + "/x\n"), std::string::npos);
  for (const char* v : {"TRNFLOW_RUN_ID=1\n", "TRNFLOW_STAGE=env\n", "TRNFLOW_ATTEMPT=1\n",
                        "TRNFLOW_RESUME=0\n", "TRNFLOW_CHECKPOINT_DIR=", "TRNFLOW_RUN_DIR="})
    EXPECT_NE(log.find(v), std::string::npos) << v;
  // Nothing beyond the documented set: count the variables of `env`.
  std::istringstream lines(log.substr(0, log.find("---")));
  std::string line;
  std::vector<std::string> names;
  while (std::getline(lines, line)) names.push_back(line.substr(0, line.find('=')));
  std::set<std::string> allowed = {"PATH",
                                   "LANG",
                                   "HOME",
                                   "TMPDIR",
                                   "DECLARED",
                                   "WHERE",
                                   "TRNFLOW_RUN_ID",
                                   "TRNFLOW_STAGE",
                                   "TRNFLOW_ATTEMPT",
                                   "TRNFLOW_RESUME",
                                   "TRNFLOW_RUN_DIR",
                                   "TRNFLOW_CHECKPOINT_DIR",
                                   "PWD",
                                   "SHLVL",
                                   "_"};  // bash's own
  for (const auto& n : names) EXPECT_TRUE(allowed.count(n)) << "unexpected variable " << n;
}

TEST_F(SandboxTest, JobRunsAsItsProjectsUidInASessionOfItsOwn) {
  auto ctx = Job("id", kProjectA, 2,
                 "id -u; id -g; id -G; awk '{print $6}' /proc/$$/stat; echo $$; "
                 "test -w \"$TRNFLOW_RUN_DIR\" && echo run-dir-writable; "
                 "test -w \"$TRNFLOW_CHECKPOINT_DIR\" && echo checkpoint-writable; "
                 "test -w \"$TMPDIR\" && echo tmp-writable");
  ExecResult r = Run(ctx);
  ASSERT_EQ(r.outcome, Outcome::kSucceeded) << r.message;
  std::istringstream log(ReadFile(ctx.log_path));
  std::string uid, gid, groups, sid, pid;
  log >> uid >> gid >> groups >> sid >> pid;
  EXPECT_EQ(uid, "200001");
  EXPECT_EQ(gid, "200001");
  EXPECT_EQ(groups, "200001");  // no supplementary groups of the worker's
  EXPECT_EQ(sid, pid);          // a session leader: setsid()
  std::string rest = ReadFile(ctx.log_path);
  EXPECT_NE(rest.find("run-dir-writable"), std::string::npos) << rest;
  EXPECT_NE(rest.find("checkpoint-writable"), std::string::npos) << rest;
  EXPECT_NE(rest.find("tmp-writable"), std::string::npos) << rest;
  struct stat st;
  ASSERT_EQ(::stat(ctx.run_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kProjectA);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  ASSERT_EQ(::stat(ctx.checkpoint_dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kProjectA);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
}

// Project B leaves files behind and keeps a job running; project A tries everything it should
// not be able to do to them, and to the worker.
TEST_F(SandboxTest, ProjectsCannotReachEachOther) {
  auto b1 = Job("write", kProjectB, 10,
                "echo b-private > \"$TRNFLOW_RUN_DIR/secret.txt\"; "
                "echo state > \"$TRNFLOW_CHECKPOINT_DIR/state\"");
  ASSERT_EQ(Run(b1).outcome, Outcome::kSucceeded);

  std::atomic<int> stop_b{0};
  auto b2 = Job("sleeper", kProjectB, 10, "echo $$ > \"$TRNFLOW_RUN_DIR/pid\"; exec sleep 60");
  b2.secrets = {{"HF_TOKEN", "b-token-value"}};
  b2.stop = &stop_b;
  ExecResult b2_result;
  std::thread b([&] { b2_result = Run(b2); });
  pid_t b_pid = 0;
  ASSERT_TRUE(trnflow::testing::WaitFor(
      [&] {
        std::ifstream in(b2.run_dir + "/pid");
        return static_cast<bool>(in >> b_pid) && b_pid > 0;
      },
      10));
  ASSERT_EQ(::kill(b_pid, 0), 0);

  std::string script = "B=" + b1.run_dir + "; BC=" + b1.checkpoint_dir + "; H=" + home_ +
                       "; P=" + std::to_string(b_pid) + "; W=" + std::to_string(getpid()) +
                       "\n"
                       "cat $B/secret.txt && echo LEAK-read-run-dir\n"
                       "ls $B && echo LEAK-list-run-dir\n"
                       "ls $BC && echo LEAK-list-checkpoints\n"
                       "cat $BC/state && echo LEAK-read-checkpoint\n"
                       "ls $H/runs && echo LEAK-list-runs\n"
                       "ls $H/logs && echo LEAK-list-logs\n"
                       "touch $H/logs/x && echo LEAK-write-logs\n"
                       "touch $H/cache/x && echo LEAK-write-cache\n"
                       "touch $H/artifacts/x && echo LEAK-write-artifacts\n"
                       "touch $H/x && echo LEAK-write-home\n"
                       "kill -0 $P && echo LEAK-kill0-job\n"
                       "kill -TERM $P && echo LEAK-kill-job\n"
                       "kill -TERM -$P && echo LEAK-kill-group\n"
                       "cat /proc/$P/environ && echo LEAK-environ\n"
                       "kill -0 $W && echo LEAK-kill0-worker\n"
                       "kill -TERM $W && echo LEAK-kill-worker\n"
                       "echo done\n";
  auto a = Job("attack", kProjectA, 11, script);
  ExecResult ar = Run(a);
  std::string log = ReadFile(a.log_path);
  EXPECT_EQ(ar.outcome, Outcome::kSucceeded) << ar.message << "\n" << log;
  EXPECT_NE(log.find("done"), std::string::npos) << log;
  EXPECT_EQ(log.find("LEAK"), std::string::npos) << log;
  // Refused, not vacuous: the kernel said no.
  EXPECT_NE(log.find("Permission denied"), std::string::npos) << log;
  EXPECT_NE(log.find("Operation not permitted"), std::string::npos) << log;
  EXPECT_EQ(log.find("b-private"), std::string::npos) << log;
  EXPECT_EQ(log.find("b-token-value"), std::string::npos) << log;
  EXPECT_EQ(::kill(b_pid, 0), 0) << "project B's job was killed";

  stop_b = static_cast<int>(StopReason::kCancelled);
  b.join();
  EXPECT_EQ(b2_result.outcome, Outcome::kCancelled);
}

TEST_F(SandboxTest, LimitsAreInEffect) {
  auto ctx = Job("limits", kProjectA, 3, "ulimit -u; ulimit -v; ulimit -f; ulimit -n; ulimit -c");
  ExecResult r = Run(ctx);
  ASSERT_EQ(r.outcome, Outcome::kSucceeded) << r.message;
  // bash prints -v and -f in KiB.
  EXPECT_EQ(ReadFile(ctx.log_path), "1024\n16777216\n67108864\n4096\n0\n");

  auto custom = Job("limits2", kProjectA, 3, "ulimit -u; ulimit -v; ulimit -f; ulimit -n");
  ASSERT_EQ(ParseJobLimits("nproc=256,as=8G,fsize=1G,nofile=1024", custom.limits), "");
  r = Run(custom);
  ASSERT_EQ(r.outcome, Outcome::kSucceeded) << r.message;
  EXPECT_EQ(ReadFile(custom.log_path), "256\n8388608\n1048576\n1024\n");

  // RLIMIT_FSIZE stops a job that writes past it.
  auto big = Job("fsize", kProjectA, 3,
                 "head -c 2000000 /dev/zero > \"$TMPDIR/big\"; echo exit=$?; "
                 "stat -c %s \"$TMPDIR/big\"");
  big.limits.file_size = 1 << 20;
  r = Run(big);
  std::string log = ReadFile(big.log_path);
  EXPECT_NE(log.find("1048576"), std::string::npos) << log;
  EXPECT_EQ(log.find("exit=0"), std::string::npos) << log;
}

TEST_F(SandboxTest, SecretsReachTheJobAndNeverTheLog) {
  auto ctx = Job("secrets", kProjectA, 4,
                 "[ \"$HF_TOKEN\" = s3cr3t-value ] && echo has-token\n"
                 "echo \"token=$HF_TOKEN\"\n"
                 "printf 's3cr3t'; sleep 0.3; printf -- '-value|split\\n'\n"  // across two reads
                 "echo \"short=$PIN\"\n"
                 "echo \"$HF_TOKEN$HF_TOKEN\"\n"
                 "printf 's3cr3t-val'\n");  // a prefix at the very end stays as it was
  ctx.secrets = {{"HF_TOKEN", "s3cr3t-value"}, {"PIN", "abc"}};
  ExecResult r = Run(ctx);
  ASSERT_EQ(r.outcome, Outcome::kSucceeded) << r.message;
  std::string log = ReadFile(ctx.log_path);
  EXPECT_EQ(log, "has-token\ntoken=***\n***|split\nshort=abc\n******\ns3cr3t-val") << log;
}

TEST_F(SandboxTest, GigabyteWithoutNewlineStreamsWithBoundedMemory) {
  auto ctx = Job("flood", kProjectA, 5,
                 "echo ::progress 0.25; echo ::checkpoint here\n"
                 "head -c 1000000000 /dev/zero | tr '\\0' x\n"
                 "echo; echo ::progress 0.5\n");
  ctx.limits.output = 8 << 20;
  long before = RssKiB();
  auto t0 = std::chrono::steady_clock::now();
  ExecResult r = Run(ctx);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  long after = RssKiB();
  ASSERT_EQ(r.outcome, Outcome::kSucceeded) << r.message;
  std::cout << "1 GB without a newline: " << seconds << " s, RSS " << before << " -> " << after
            << " KiB\n";
  EXPECT_LT(after - before, 200 * 1024) << "the reader held the output in memory";
  std::string marker = "[trnflow: output beyond 8388608 bytes dropped]\n";
  EXPECT_EQ(fs::file_size(ctx.log_path), (8u << 20) + 1 + marker.size());  // +1: the newline
  std::ifstream in(ctx.log_path);
  in.seekg(-static_cast<std::streamoff>(marker.size() + 1), std::ios::end);
  std::string tail((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(tail, "\n" + marker);
}

TEST_F(SandboxTest, ProtocolLinesSurviveLongLinesAndOnlyShortOnesCount) {
  // A 100 KB line starting like a progress line is not one; the lines around it still count.
  auto ctx = Job("protocol", kProjectA, 6,
                 "echo ::progress 0.5; echo ::checkpoint here\n"
                 "printf '::progress 0.9'; head -c 100000 /dev/zero | tr '\\0' 7; echo\n"
                 "echo ::checkpoint there; exit 1\n");
  ExecResult r = Run(ctx);
  EXPECT_EQ(r.outcome, Outcome::kFailed);
  EXPECT_DOUBLE_EQ(r.progress_to, 0.5);
}

TEST_F(SandboxTest, WorkdirUnderAPrivateParentWorksWithARelativeCommand) {
  fs::path parent = fs::path(home_ + "-private");
  fs::create_directories(parent / "repo");
  fs::permissions(parent, fs::perms::owner_all);
  fs::permissions(parent / "repo", fs::perms(0755));
  std::ofstream(parent / "repo" / "job.sh") << "id -u; pwd\n";
  auto ctx = Job("relative", kProjectA, 7, "");
  ctx.spec.command.argv = {"bash", "job.sh"};
  ctx.workdir = (parent / "repo").string();
  ExecResult r = Run(ctx);
  std::string log = ReadFile(ctx.log_path);
  fs::remove_all(parent);
  ASSERT_EQ(r.outcome, Outcome::kSucceeded) << r.message << "\n" << log;
  EXPECT_EQ(log, "200001\n" + ctx.workdir + "\n");
}

TEST_F(SandboxTest, SetupFailureIsAnInfraErrorThatSaysWhy) {
  auto ctx = Job("nowhere", kProjectA, 8, "echo ran");
  ctx.workdir = "/nonexistent/trnflow-workdir";
  ctx.spec.command.argv = {"bash", "-c", "echo ran"};
  ExecResult r = Run(ctx);
  EXPECT_EQ(r.outcome, Outcome::kInfraError);
  EXPECT_NE(r.message.find("chdir(/nonexistent/trnflow-workdir)"), std::string::npos) << r.message;
  EXPECT_EQ(ReadFile(ctx.log_path).find("ran"), std::string::npos);
}

TEST_F(SandboxTest, LinksPlantedInTheRunDirDoNotRedirectTheWorker) {
  // Attempt 1 plants links where the worker will create and chown things for attempt 2.
  auto ctx = Job("plant", kProjectA, 9,
                 "cd \"$TRNFLOW_RUN_DIR\"; ln -s /etc/passwd passwd-link; "
                 "mv .home .home-old; ln -s /etc .home; exit 75");
  ExecResult r = Run(ctx);
  EXPECT_EQ(r.outcome, Outcome::kInfraError);  // exit 75: retry
  ctx.attempt = 2;
  r = Run(ctx);
  EXPECT_EQ(r.outcome, Outcome::kInfraError);
  EXPECT_NE(r.message.find(".home"), std::string::npos) << r.message;
  struct stat st;
  ASSERT_EQ(::stat("/etc/passwd", &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_FALSE(fs::exists("/etc/plant.attempt-2"));
}

// The parts that need no processes.

TEST(SandboxDecision, RefusesWithoutTheRightToSwitchUsersUnlessTurnedOff) {
  auto d = DecideSandbox(/*requested=*/true, /*can_switch_user=*/false);
  EXPECT_FALSE(d.enabled);
  EXPECT_NE(d.error.find("--no-sandbox"), std::string::npos) << d.error;
  EXPECT_NE(d.error.find("root"), std::string::npos);

  d = DecideSandbox(false, false);
  EXPECT_FALSE(d.enabled);
  EXPECT_TRUE(d.error.empty());
  EXPECT_NE(d.warning.find("SANDBOX OFF"), std::string::npos);

  d = DecideSandbox(false, true);  // root may turn it off too, loudly
  EXPECT_FALSE(d.enabled);
  EXPECT_FALSE(d.warning.empty());

  d = DecideSandbox(true, true);
  EXPECT_TRUE(d.enabled);
  EXPECT_TRUE(d.error.empty());
  EXPECT_TRUE(d.warning.empty());
}

TEST(SandboxDecision, EnvironmentTurnsItOff) {
  unsetenv("TRNFLOW_SANDBOX");
  EXPECT_TRUE(SandboxRequestedByEnvironment());
  setenv("TRNFLOW_SANDBOX", "off", 1);
  EXPECT_FALSE(SandboxRequestedByEnvironment());
  setenv("TRNFLOW_SANDBOX", "on", 1);
  EXPECT_TRUE(SandboxRequestedByEnvironment());
  unsetenv("TRNFLOW_SANDBOX");
}

TEST(SandboxHome, RefusesAHomeJobsCannotReach) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root";
  fs::path locked = fs::temp_directory_path() / ("trnflow-locked-" + std::to_string(getpid()));
  fs::create_directories(locked);
  fs::permissions(locked, fs::perms::owner_all);
  std::string e = PrepareHome((locked / "home").string(), true);
  EXPECT_NE(e.find(locked.string() + " is not searchable"), std::string::npos) << e;
  EXPECT_NE(e.find("TRNFLOW_HOME"), std::string::npos) << e;
  EXPECT_EQ(PrepareHome((locked / "home2").string(), false), "");  // off: no uid to reach it
  fs::remove_all(locked);
}

TEST(JobLimits, ParsesSizesAndNamesTheBadItem) {
  JobLimits l;
  EXPECT_EQ(ParseJobLimits("as=2G,nproc=64,fsize=512M,nofile=100,output=1K", l), "");
  EXPECT_EQ(l.address_space, 2ULL << 30);
  EXPECT_EQ(l.processes, 64u);
  EXPECT_EQ(l.file_size, 512ULL << 20);
  EXPECT_EQ(l.open_files, 100u);
  EXPECT_EQ(l.output, 1024u);
  EXPECT_NE(ParseJobLimits("mem=1G", l).find("mem=1G"), std::string::npos);
  EXPECT_NE(ParseJobLimits("as=lots", l).find("as=lots"), std::string::npos);
  EXPECT_NE(ParseJobLimits("as=0", l), "");
  EXPECT_NE(ParseJobLimits("nproc=-1", l), "");
}

TEST(OutputCapture, MasksAcrossEveryChunkBoundaryAndCaps) {
  std::string path =
      (fs::temp_directory_path() / ("trnflow-capture-" + std::to_string(getpid()))).string();
  std::string text = "a secret-value b secret-valu secret-value\n::progress 0.5\nend";
  for (size_t chunk = 1; chunk <= text.size(); ++chunk) {
    fs::remove(path);
    std::vector<std::string> lines;
    {
      OutputCapture c(path, 1 << 20, {{"S", "secret-value"}},
                      [&](const std::string& l) { lines.push_back(l); });
      for (size_t i = 0; i < text.size(); i += chunk)
        c.Write(text.data() + i, std::min(chunk, text.size() - i));
    }
    EXPECT_EQ(ReadFile(path), "a *** b secret-valu ***\n::progress 0.5\nend") << chunk;
    EXPECT_EQ(lines, (std::vector<std::string>{"a secret-value b secret-valu secret-value",
                                               "::progress 0.5", "end"}));
  }
  fs::remove(path);
  {
    OutputCapture c(path, 10, {}, nullptr);
    c.Write("0123456789abc\n", 14);
    c.Write("more\n", 5);
    EXPECT_EQ(c.logged(), 10u);
    EXPECT_EQ(c.dropped(), 9u);
  }
  EXPECT_EQ(ReadFile(path), "0123456789\n[trnflow: output beyond 10 bytes dropped]\n");
  fs::remove(path);
}

}  // namespace
