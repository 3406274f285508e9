// The job sandbox against hostile jobs: real processes, real files, no catalog. Each job is a
// bash script run by ProcessExecutor exactly as a worker runs a `run:` stage; the test plays
// the worker (root) and checks what the job could see and do. Needs root (skips otherwise).
#include "workers/sandbox.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "tests/run_cli.h"
#include "tests/test_db.h"
#include "workers/executor.h"
#include "workers/job_cgroup.h"

namespace fs = std::filesystem;
using namespace trnflow;
using namespace trnflow::workers;

namespace {

constexpr uid_t kProjectA = 200001, kProjectB = 200002;

using trnflow::testing::ReadFile;

// Host pids of the processes running as `uid` whose command line contains `needle`.
// A file of /proc/PID, or "" once the process is gone (reading a vanished process's file
// fails with ESRCH, which the stream reports by throwing).
std::string ProcFile(const fs::path& path) {
  try {
    return ReadFile(path.string());
  } catch (const std::exception&) {
    return "";
  }
}

std::vector<pid_t> ProcessesOf(uid_t uid, const std::string& needle) {
  std::vector<pid_t> found;
  std::error_code ec;  // processes come and go while the directory is read
  for (fs::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    // The real uid from status: /proc/PID itself is root's for a process that is not dumpable.
    std::string status = ProcFile(it->path() / "status");
    auto at = status.find("\nUid:\t");
    if (at == std::string::npos || std::stoul(status.substr(at + 6)) != uid) continue;
    std::string cmdline = ProcFile(it->path() / "cmdline");
    for (char& c : cmdline)
      if (c == '\0') c = ' ';
    bool bwrap = cmdline.find("bwrap ") < cmdline.find(' ') + 1;  // its argv holds the job's
    if (!bwrap && cmdline.find(needle) != std::string::npos) found.push_back(std::stoi(name));
  }
  return found;
}

std::string PidNamespace(const std::string& pid) {
  std::error_code ec;
  return fs::read_symlink("/proc/" + pid + "/ns/pid", ec).string();
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
    ctx.namespaces.enabled = true;  // as a worker with the sandbox on runs every command
    ctx.namespaces.bwrap = FindBwrap();
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
                 "readlink /proc/self/ns/pid; "
                 "test -w \"$TRNFLOW_RUN_DIR\" && echo run-dir-writable; "
                 "test -w \"$TRNFLOW_CHECKPOINT_DIR\" && echo checkpoint-writable; "
                 "test -w \"$TMPDIR\" && echo tmp-writable");
  ExecResult r = Run(ctx);
  ASSERT_EQ(r.outcome, Outcome::kSucceeded) << r.message;
  std::istringstream log(ReadFile(ctx.log_path));
  std::string uid, gid, groups, sid, pid, pid_ns;
  log >> uid >> gid >> groups >> sid >> pid >> pid_ns;
  EXPECT_EQ(uid, "200001");
  EXPECT_EQ(gid, "200001");
  EXPECT_EQ(groups, "200001");  // no supplementary groups of the worker's
  // A PID namespace of its own, whose first process (bwrap's reaper) leads the session.
  EXPECT_NE(pid_ns, PidNamespace("self"));
  EXPECT_EQ(sid, "1");
  EXPECT_EQ(pid, "2");
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
  auto b2 = Job("sleeper", kProjectB, 10, "exec sleep 60.25");
  b2.secrets = {{"HF_TOKEN", "b-token-value"}};
  b2.stop = &stop_b;
  ExecResult b2_result;
  std::thread b([&] { b2_result = Run(b2); });
  pid_t b_pid = 0;  // as the host numbers it
  ASSERT_TRUE(trnflow::testing::WaitFor(
      [&] {
        auto pids = ProcessesOf(kProjectB, "sleep 60.25");
        if (pids.size() == 1) b_pid = pids[0];
        return b_pid > 0;
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
                       "ls $H/runs | grep -v '^11$' && echo LEAK-list-runs\n"
                       "ls $H/logs && echo LEAK-list-logs\n"
                       "touch $H/logs/x && echo LEAK-write-logs\n"
                       "touch $H/cache/x && echo LEAK-write-cache\n"
                       "touch $H/artifacts/x && echo LEAK-write-artifacts\n"
                       "touch $H/x\n"  // the namespace's own /tmp: checked below
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
  // Refused, not vacuous: none of it exists in the job's namespaces.
  EXPECT_NE(log.find("No such file or directory"), std::string::npos) << log;
  EXPECT_NE(log.find("No such process"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists(home_ + "/x"));
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

TEST_F(SandboxTest, TheWorkdirIsReadOnlyAndARelativeCommandStartsThere) {
  fs::path repo = fs::path(home_ + "-repo");
  fs::create_directories(repo);
  fs::permissions(repo, fs::perms(0755));
  std::ofstream(repo / "job.sh") << "id -u; pwd; touch written 2>&1 || true\n";
  auto ctx = Job("relative", kProjectA, 7, "");
  ctx.spec.command.argv = {"bash", "job.sh"};
  ctx.workdir = repo.string();
  ExecResult r = Run(ctx);
  std::string log = ReadFile(ctx.log_path);
  bool written = fs::exists(repo / "written");
  fs::remove_all(repo);
  ASSERT_EQ(r.outcome, Outcome::kSucceeded) << r.message << "\n" << log;
  EXPECT_EQ(log.substr(0, log.find("touch")), "200001\n" + ctx.workdir + "\n");
  EXPECT_NE(log.find("Read-only file system"), std::string::npos) << log;
  EXPECT_FALSE(written);
}

// A member chooses the workdir (the directory `trnflow submit` ran in). The worker used to
// enter it as root, which let a job start inside root-only trees. Now the job's own uid must
// reach it, and the attempt says so when it cannot.
TEST_F(SandboxTest, AWorkdirTheJobCannotReadIsAUserErrorNotRootsHelp) {
  for (std::string workdir : {home_ + "/cache", home_ + "-private/repo", std::string("/root"),
                              std::string("/nonexistent/trnflow-workdir")}) {
    if (workdir.find("-private") != std::string::npos) {
      fs::create_directories(workdir);
      fs::permissions(fs::path(workdir).parent_path(), fs::perms::owner_all);
    }
    auto ctx = Job("nowhere", kProjectA, 8, "echo ran; ls");
    ctx.workdir = workdir;
    ExecResult r = Run(ctx);
    EXPECT_EQ(r.outcome, Outcome::kUserError) << workdir << ": " << r.message;
    EXPECT_NE(r.message.find("uid 200001, which must be able to read " + workdir),
              std::string::npos)
        << r.message;
    EXPECT_EQ(ReadFile(ctx.log_path).find("ran"), std::string::npos);
  }
  fs::remove_all(home_ + "-private");
}

TEST_F(SandboxTest, SetupFailureIsAnInfraErrorThatSaysWhy) {
  auto ctx = Job("nowhere", kProjectA, 8, "echo ran");
  ctx.namespaces.enabled = false;  // the setup before bwrap: the rlimits, the uid switch
  ctx.workdir = "/nonexistent/trnflow-workdir";
  ExecResult r = Run(ctx);
  EXPECT_EQ(r.outcome, Outcome::kInfraError);
  EXPECT_NE(r.message.find("chdir(/nonexistent/trnflow-workdir)"), std::string::npos) << r.message;
  EXPECT_EQ(ReadFile(ctx.log_path).find("ran"), std::string::npos);

  auto broken = Job("nobwrap", kProjectA, 8, "echo ran");
  broken.namespaces.bwrap = "/nonexistent/bwrap";
  r = Run(broken);
  EXPECT_EQ(r.outcome, Outcome::kInfraError);
  EXPECT_NE(r.message.find("sandbox"), std::string::npos) << r.message;
  EXPECT_EQ(ReadFile(broken.log_path).find("ran"), std::string::npos);
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

// A job that daemonizes (setsid, a double fork, nohup) used to outlive its attempt, its run's
// cancel and its budget, unbilled, and one that kept the output pipe open pinned a worker slot.
TEST_F(SandboxTest, NothingTheJobStartsOutlivesTheAttempt) {
  auto ctx = Job("escape", kProjectA, 20,
                 "setsid sleep 300.5 & (sleep 300.6 &); nohup sleep 300.7 >/dev/null 2>&1 &\n"
                 "setsid bash -c 'trap \"\" TERM HUP; sleep 300.8' &\n"
                 "echo started");
  ExecResult r = Run(ctx);
  ASSERT_EQ(r.outcome, Outcome::kSucceeded) << r.message;
  EXPECT_NE(ReadFile(ctx.log_path).find("started"), std::string::npos);
  EXPECT_EQ(ProcessesOf(kProjectA, "sleep 300."), std::vector<pid_t>{});

  // Cancelled while its daemons run: they go with it.
  std::atomic<int> stop{0};
  auto cancelled = Job("escape2", kProjectA, 20,
                       "setsid sleep 301.5 & (trap '' TERM; sleep 301.6 &); exec sleep 301");
  cancelled.stop = &stop;
  std::thread canceller([&] {
    trnflow::testing::WaitFor([&] { return ProcessesOf(kProjectA, "sleep 301").size() == 3; }, 10);
    stop = static_cast<int>(StopReason::kCancelled);
  });
  r = Run(cancelled);
  canceller.join();
  EXPECT_EQ(r.outcome, Outcome::kCancelled) << r.message;
  EXPECT_EQ(ProcessesOf(kProjectA, "sleep 301"), std::vector<pid_t>{});
}

// /proc showed every process of the host (other projects' command lines carry their params),
// and loopback reached the catalog's port and the dashboard.
TEST_F(SandboxTest, AJobSeesNoOtherProcessAndNoNetworkUnlessAllowed) {
  std::atomic<int> stop_b{0};
  auto b = Job("params", kProjectB, 21, "sleep 60.75; : canary-param-b");
  b.stop = &stop_b;
  std::thread tb([&] { Run(b); });
  ASSERT_TRUE(trnflow::testing::WaitFor(
      [&] { return !ProcessesOf(kProjectB, "sleep 60.75").empty(); }, 10));

  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 8), 0);
  socklen_t len = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  std::string port = std::to_string(ntohs(addr.sin_port));

  std::string script = "grep -l canary-param-\"\"b /proc/[0-9]*/cmdline && echo LEAK-cmdline\n"
                       "echo procs $(ls /proc | grep -c '^[0-9]')\n"
                       "(exec 3<>/dev/tcp/127.0.0.1/" + port + ") 2>/dev/null && echo connected\n"
                       "echo interfaces $(tail -n +3 /proc/net/dev | cut -d: -f1)\n"
                       "echo done\n";
  auto a = Job("look", kProjectA, 22, script);
  ExecResult r = Run(a);
  std::string log = ReadFile(a.log_path);
  ASSERT_EQ(r.outcome, Outcome::kSucceeded) << r.message << "\n" << log;
  EXPECT_NE(log.find("done"), std::string::npos) << log;
  EXPECT_EQ(log.find("LEAK"), std::string::npos) << log;
  EXPECT_EQ(log.find("connected"), std::string::npos) << log;
  EXPECT_NE(log.find("interfaces lo\n"), std::string::npos) << log;
  int procs = std::stoi(log.substr(log.find("procs ") + 6));
  EXPECT_LE(procs, 6) << log;  // bwrap's reaper, bash, its subshells

  // `network: host` on a worker that does not allow it: refused, nothing ran.
  auto asks = Job("download", kProjectA, 22, script);
  asks.spec.command.network = true;
  r = Run(asks);
  EXPECT_EQ(r.outcome, Outcome::kUserError);
  EXPECT_NE(r.message.find("--allow-network"), std::string::npos) << r.message;
  EXPECT_EQ(ReadFile(asks.log_path).find("done"), std::string::npos);

  // Allowed by the operator: the same script reaches the listener (so the test can fail).
  asks.namespaces.allow_network = true;
  asks.attempt = 2;
  asks.log_path += ".2";
  r = Run(asks);
  log = ReadFile(asks.log_path);
  ASSERT_EQ(r.outcome, Outcome::kSucceeded) << r.message << "\n" << log;
  EXPECT_NE(log.find("connected"), std::string::npos) << log;
  ::close(listener);

  stop_b = static_cast<int>(StopReason::kCancelled);
  tb.join();
}

// /tmp and /dev/shm were the host's, shared by every job, and jobs wrote with umask 022.
TEST_F(SandboxTest, TmpAndShmArePrivateAndWhatAJobWritesIsItsOwn) {
  std::string tag = std::to_string(getpid());
  auto a = Job("writer", kProjectA, 23,
               "echo a > /tmp/canary-" + tag + "; echo a > /dev/shm/canary-" + tag + "\n"
               "echo x > \"$TRNFLOW_RUN_DIR/out\"; mkdir \"$TRNFLOW_RUN_DIR/d\"\n"
               "stat -c %a \"$TRNFLOW_RUN_DIR/out\" \"$TRNFLOW_RUN_DIR/d\"\n"
               "touch /usr/canary 2>&1; touch /etc/canary 2>&1; true");
  ExecResult r = Run(a);
  std::string log = ReadFile(a.log_path);
  ASSERT_EQ(r.outcome, Outcome::kSucceeded) << r.message << "\n" << log;
  EXPECT_NE(log.find("600\n700\n"), std::string::npos) << log;
  EXPECT_NE(log.find("Read-only file system"), std::string::npos) << log;
  EXPECT_FALSE(fs::exists("/tmp/canary-" + tag));
  EXPECT_FALSE(fs::exists("/dev/shm/canary-" + tag));
  EXPECT_FALSE(fs::exists("/usr/canary"));
  EXPECT_FALSE(fs::exists("/etc/canary"));
}

// Nothing of the host's files but the system, read-only: not the worker's configuration (the
// catalog's URLs, every project's secrets), not other homes, not the rest of TRNFLOW_HOME.
TEST_F(SandboxTest, TheHostsFilesAreNotThereBeyondTheSystem) {
  fs::path config = home_ + "-config";
  fs::create_directories(config);
  fs::permissions(config, fs::perms(0755));
  std::ofstream(config / "daemon.url") << "postgresql://trnflow_daemon:canary-url@db/trnflow\n";
  fs::permissions(config / "daemon.url", fs::perms(0644));  // even readable by mistake
  auto a = Job("snoop", kProjectA, 24,
               "cat " + config.string() + "/daemon.url; ls /root /home " + home_ +
                   "/logs; test -r /etc/passwd && echo system-readable; true");
  a.namespaces.hidden = {config.string()};
  ExecResult r = Run(a);
  std::string log = ReadFile(a.log_path);
  fs::remove_all(config);
  ASSERT_EQ(r.outcome, Outcome::kSucceeded) << r.message << "\n" << log;
  EXPECT_EQ(log.find("canary-url"), std::string::npos) << log;
  EXPECT_NE(log.find("system-readable"), std::string::npos) << log;
  EXPECT_NE(log.find("cannot access '/root'"), std::string::npos) << log;
  EXPECT_NE(log.find("cannot access '" + home_ + "/logs'"), std::string::npos) << log;
}

TEST(SandboxNames, AStageNameIsAlwaysOneComponentBelowItsParent) {
  EXPECT_EQ(SafeName(".."), "_..");
  EXPECT_EQ(SafeName("."), "_.");
  EXPECT_EQ(SafeName(""), "_");
  EXPECT_EQ(SafeName("a/../b"), "a_.._b");
  EXPECT_EQ(SafeName(std::string("a\nb\x7f", 4)), "a_b_");
  EXPECT_EQ(SafeName("compile[batch=1,seq_len=512]"), "compile[batch=1,seq_len=512]");
}

// The attempt's cgroup (workers/job_cgroup.h): its memory and process count over all its
// processes, and a kill that reaches what escaped its process group. These machines have cgroup
// v1 (memory and pids); a v2 host gets the same through its delegated cgroup.
TEST_F(SandboxTest, AnAttemptPastItsMemoryIsKilledInsideItsCgroupAndToldSo) {
  const CgroupHost& host = CgroupHost::ForThisProcess();
  ASSERT_TRUE(host.memory) << host.Describe();
  auto ctx = Job("hungry", kProjectA, 30,
                 "echo before; exec python3 -c \"b = b'x' * (400 << 20); print(len(b))\"");
  ctx.limits.memory = 64ULL << 20;
  ExecResult r = Run(ctx);
  EXPECT_EQ(r.outcome, Outcome::kFailed) << r.message;
  EXPECT_NE(r.message.find("out of memory"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("64 MiB"), std::string::npos) << r.message;
  // The same job with room runs: it was the limit, not the job.
  auto roomy = Job("roomy", kProjectA, 30, "exec python3 -c \"b = b'x' * (40 << 20); print(len(b))\"");
  roomy.limits.memory = 256ULL << 20;
  r = Run(roomy);
  EXPECT_EQ(r.outcome, Outcome::kSucceeded) << r.message;
  EXPECT_NE(ReadFile(roomy.log_path).find("41943040"), std::string::npos);
}

TEST_F(SandboxTest, AnAttemptsProcessCountIsCappedByItsCgroup) {
  const CgroupHost& host = CgroupHost::ForThisProcess();
  ASSERT_TRUE(host.tasks) << host.Describe();
  // dash: no retry loop on a failed fork; it says "Cannot fork" and exits 2.
  auto ctx = Job("forker", kProjectA, 31, "");
  ctx.spec.command.argv = {"sh", "-c",
                           "i=0; while [ $i -lt 60 ]; do echo $i > \"$TRNFLOW_RUN_DIR/started\"; "
                           "sleep 31.25 & i=$((i+1)); done"};
  ctx.limits.tasks = 24;
  ExecResult r = Run(ctx);
  std::string log = ReadFile(ctx.log_path);
  EXPECT_EQ(r.outcome, Outcome::kFailed) << r.message << log;
  EXPECT_NE(log.find("Cannot fork"), std::string::npos) << log;
  // bwrap's reaper, the shell and its sleeps: never more than the cgroup allows.
  int started = std::stoi("0" + ReadFile(ctx.run_dir + "/started"));
  EXPECT_LT(started, 24) << log;
  EXPECT_GE(started, 10) << log;
  // 31.25 s: no other test's job sleeps that long ("sleep 30" also matched the "sleep 300.5"
  // of NothingTheJobStartsOutlivesTheAttempt, the same uid, when ctest ran both at once).
  EXPECT_EQ(ProcessesOf(kProjectA, "sleep 31.25"), std::vector<pid_t>{});
}

// Without namespaces (a worker whose bwrap is missing would refuse; this is --no-sandbox's
// path and Slurm's wrapper-less one), a setsid daemon leaves the job's process group: the
// cgroup still takes it down with the attempt.
TEST_F(SandboxTest, WithoutNamespacesTheCgroupStillEndsEverythingTheJobStarted) {
  ASSERT_NE(CgroupHost::ForThisProcess().version, CgroupHost::Version::kNone)
      << CgroupHost::ForThisProcess().Describe();
  auto ctx = Job("escape-plain", kProjectA, 32,
                 "setsid sleep 302.5 >/dev/null 2>&1 </dev/null & "
                 "(setsid sleep 302.6 </dev/null >/dev/null 2>&1 &); echo started");
  ctx.namespaces.enabled = false;
  ExecResult r = Run(ctx);
  ASSERT_EQ(r.outcome, Outcome::kSucceeded) << r.message;
  EXPECT_EQ(ProcessesOf(kProjectA, "sleep 302."), std::vector<pid_t>{});
}

// cgroup v2, as a delegated host has it: made, joined, killed whole and removed. The v2
// hierarchy here has no memory or pids controller (v1 holds them), so this checks the
// mechanics; where the controllers are there, their limits too.
TEST(JobCgroupV2, AnAttemptIsMadeJoinedKilledWholeAndRemoved) {
  if (::geteuid() != 0) GTEST_SKIP() << "cgroups need root";
  std::string mount;
  {
    std::ifstream in("/proc/self/mountinfo");
    std::string line;
    while (mount.empty() && std::getline(in, line))
      if (line.find(" - cgroup2 ") != std::string::npos) {
        std::stringstream f(line);
        std::string id, parent, dev, root;
        f >> id >> parent >> dev >> root >> mount;
        if (root != "/") mount.clear();
      }
  }
  std::string mounted_here;
  if (mount.empty()) {
    mounted_here = fs::temp_directory_path() / ("trnflow-cg2-" + std::to_string(getpid()));
    fs::create_directories(mounted_here);
    ASSERT_EQ(::system(("mount -t cgroup2 none " + mounted_here).c_str()), 0);
    mount = mounted_here;
  }
  CgroupHost host = CgroupHost::Detect(mount, mount);
  ASSERT_EQ(host.version, CgroupHost::Version::kV2) << host.Describe();
  EXPECT_NE(host.Describe().find("v2 under " + mount + "/trnflow"), std::string::npos)
      << host.Describe();
  std::string error;
  auto g = AttemptCgroup::Make(host, "test", {64ULL << 20, 16}, &error);
  ASSERT_TRUE(g) << error;
  ASSERT_EQ(g->dirs().size(), 1u);
  std::string dir = g->dirs()[0];
  if (host.memory) {
    EXPECT_EQ(ReadFile(dir + "/memory.max"), std::to_string(64ULL << 20) + "\n");
  }
  if (host.tasks) {
    EXPECT_EQ(ReadFile(dir + "/pids.max"), "16\n");
  }
  // A child that joins, then leaves a daemon of its own behind and exits.
  pid_t child = ::fork();
  if (child == 0) {
    if (::write(g->join_fds()[0], "0", 1) != 1) ::_exit(3);
    if (::fork() == 0) {
      ::setsid();
      ::execlp("sleep", "sleep", "303.5", nullptr);
      ::_exit(4);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_TRUE(trnflow::testing::WaitFor([&] { return !g->Empty(); }, 5));
  g->Kill();
  EXPECT_TRUE(g->Empty());
  EXPECT_EQ(ProcessesOf(0, "sleep 303.5"), std::vector<pid_t>{});
  EXPECT_FALSE(g->OutOfMemory());
  g.reset();
  EXPECT_FALSE(fs::exists(dir)) << "the attempt's cgroup was not removed";
  ::rmdir(host.parents[0].c_str());
  if (!mounted_here.empty()) {
    ::system(("umount " + mounted_here).c_str());
    fs::remove(mounted_here);
  }
}

TEST(JobCgroupV2, AnUndelegatedCgroupIsNotUsedAndOffIsOff) {
  EXPECT_EQ(CgroupHost::Detect("/sys/fs/cgroup", "off").version, CgroupHost::Version::kNone);
  EXPECT_NE(CgroupHost::Detect("/sys/fs/cgroup", "off").Describe().find("rlimits only"),
            std::string::npos);
  // A named directory that is not a cgroup v2 one is refused, not written to.
  CgroupHost h = CgroupHost::Detect("/sys/fs/cgroup", "/tmp");
  EXPECT_EQ(h.version, CgroupHost::Version::kNone);
  EXPECT_NE(h.why_none.find("not a cgroup v2 directory"), std::string::npos) << h.why_none;
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
  EXPECT_EQ(ParseJobLimits("mem=1G,tasks=200", l), "");
  EXPECT_EQ(l.memory, 1ULL << 30);
  EXPECT_EQ(l.tasks, 200u);
  EXPECT_NE(ParseJobLimits("ram=1G", l).find("ram=1G"), std::string::npos);
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
