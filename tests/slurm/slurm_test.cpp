// The Slurm executor against a real Slurm: a one-host cluster (munge, MariaDB, slurmdbd,
// slurmctld, two slurmd) that this test program starts with ops/slurm.sh in a private
// directory on private ports, a real PostgreSQL catalog, and the real binary as `trnflow run`
// or as daemons.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "schema/catalog.h"
#include "tests/daemon.h"
#include "tests/run_cli.h"
#include "tests/test_db.h"

namespace trnflow {
namespace {

namespace fs = std::filesystem;
using testing::CliHome;
using testing::Daemon;
using testing::Query;
using testing::QueryNumber;
using testing::RunStateText;
using testing::RunTrnflow;
using testing::ShOutput;
using testing::TestDatabase;
using testing::WaitFor;
using testing::WriteTempFile;

// The cluster, up for the whole program: ops/slurm.sh in a fresh directory with a block of four
// ports of its own (slurmctld, two slurmd, slurmdbd; MariaDB has a socket only), so test
// programs run in parallel, each with its own cluster, and a developer's cluster on the
// default ports is left alone. A block is N in 0..499, ports 18000 + 4N .. +3, held for the
// program's life by flock on /tmp/trnflow-slurm-ports-N.lock (the kernel drops the lock when
// the program ends, however it ends). The lock files stay: removing one while another program
// has it open and is about to lock it would let two programs hold block N at once.
class SlurmCluster : public ::testing::Environment {
 public:
  static std::string env() {  // prefix for ops/slurm.sh commands
    return "TRNFLOW_SLURM_DIR=" + dir() + " TRNFLOW_SLURM_PORT=" + std::to_string(port()) + " ";
  }
  static std::string dir() { return "/tmp/trnflow-slurm-test-" + std::to_string(getpid()); }
  static int port() { return 18000 + block_ * 4; }
  void SetUp() override {
    TakeAPortBlock();
    fs::remove_all(dir());
    int status = 0;
    std::string out = ShOutput(env() + TRNFLOW_SOURCE_DIR "/ops/slurm.sh up", &status);
    auto at = out.find("export SLURM_CONF=");
    if (status != 0 || at == std::string::npos) {
      // Fail the program: gtest would otherwise mark every test skipped and exit 0.
      std::fprintf(stderr, "ops/slurm.sh up failed (exit %d):\n%s\n", status, out.c_str());
      ShOutput(env() + TRNFLOW_SOURCE_DIR "/ops/slurm.sh kill");
      std::exit(1);
    }
    std::string conf = out.substr(at + 18);
    conf = conf.substr(0, conf.find('\n'));
    ::setenv("SLURM_CONF", conf.c_str(), 1);
  }
  void TearDown() override {
    // Nothing of this cluster is kept: no need for down's orderly stop.
    ShOutput(env() + TRNFLOW_SOURCE_DIR "/ops/slurm.sh kill");
    fs::remove_all(dir());
  }

 private:
  // Can a listening socket take this port (as slurmctld's does, with SO_REUSEADDR)?
  static bool PortFree(int port) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 1) == 0;
    ::close(fd);
    return ok;
  }
  // The first block whose lock this program gets and whose four ports are free; its lock fd
  // stays open (never closed: the lock is the program's until it exits).
  static void TakeAPortBlock() {
    for (int n = 0; n < 500; ++n) {
      std::string lock = "/tmp/trnflow-slurm-ports-" + std::to_string(n) + ".lock";
      int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd < 0) continue;
      if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        ::close(fd);
        continue;
      }
      int first = 18000 + n * 4;
      if (PortFree(first) && PortFree(first + 1) && PortFree(first + 2) && PortFree(first + 3)) {
        block_ = n;
        return;
      }
      ::close(fd);  // in use by something else: try the next block
    }
    std::fprintf(stderr, "no free block of four ports in 18000..19999 (locks /tmp/trnflow-slurm-ports-*.lock)\n");
    std::exit(1);
  }
  static inline int block_ = -1;
};

[[maybe_unused]] auto* const kDatabase =
    ::testing::AddGlobalTestEnvironment(new TestDatabase("trnflow_slurm"));
[[maybe_unused]] auto* const kCluster = ::testing::AddGlobalTestEnvironment(new SlurmCluster);

int64_t Submit(const std::string& yaml, const std::string& name) {
  auto r = RunTrnflow("submit " + WriteTempFile(name + ".yaml", yaml) + " --speed 1 --format json");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return std::stoll(nlohmann::json::parse(r.out)["run_id"].get<std::string>());
}

std::string StageId(int64_t run, const std::string& name) {
  return "(SELECT id FROM trnflow.stages WHERE run_id = " + std::to_string(run) + " AND name = '" +
         name + "')";
}
// A column of an attempt: from the ledger once it closed, from trnflow.open_attempts while it
// runs (outcome and message exist only once it closed).
std::string AttemptCol(int64_t run, const std::string& stage, int attempt, const std::string& col) {
  const std::string where =
      " WHERE stage_id = " + StageId(run, stage) + " AND attempt = " + std::to_string(attempt);
  std::string closed = Query("SELECT " + col + " FROM trnflow.attempts" + where);
  if (!closed.empty() || col == "outcome" || col == "message") return closed;
  return Query("SELECT " + col + " FROM trnflow.open_attempts" + where);
}
// Slurm's own record of a job: squeue while it is known there.
std::string JobState(const std::string& job) {
  return ShOutput("squeue -h -t all -j " + job + " -o %T");
}
// Every job Slurm has recorded for a stage (its completion log, jobcomp/filetxt; slurmdbd has
// them too), by job name.
int JobsOfStage(int64_t run, const std::string& stage) {
  std::string prefix = "trnflow-r" + std::to_string(run) + "-s" + Query("SELECT " + StageId(run, stage)) + "-a";
  std::string out = ShOutput("sacct -c -n -P -S now-1day -o jobid,jobname");
  std::string queued = ShOutput("squeue -h -t all -o '%i|%j'");
  std::set<std::string> ids;
  for (const std::string& text : {out, queued}) {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);)
      if (line.find("|" + prefix) != std::string::npos) ids.insert(line.substr(0, line.find('|')));
  }
  return static_cast<int>(ids.size());
}

// `run --format json` prints the finished run as `show --format json` does.
int64_t RunIdOf(const std::string& json) {
  return std::stoll(nlohmann::json::parse(json)["run"]["run_id"].get<std::string>());
}

std::vector<std::string> DaemonEnv() { return {"TRNFLOW_HOME=" + CliHome()}; }

// A run's directory (${{ run.dir }}), where its jobs write what the test reads.
std::string RunDirOf(int64_t run) { return CliHome() + "/runs/" + std::to_string(run); }

std::unique_ptr<Daemon> SlurmWorker(const std::string& name, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"worker", "--pool", "cpu=4", "--lease", "3s", "--executor",
                                   "slurm"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto w = std::make_unique<Daemon>(name, args, DaemonEnv());
  w->Start();
  return w;
}

// A run: stage, retried quickly when the market or the worker loses it.
std::string OneStage(const std::string& pipeline, const std::string& command,
                     const std::string& extra = "") {
  std::string quoted;  // a YAML single-quoted scalar
  for (char c : command) quoted += c == '\'' ? std::string("''") : std::string(1, c);
  return "pipeline: " + pipeline +
         "\n"
         "project: slurm-lab\n"
         "stages:\n"
         "  work:\n"
         "    run: '" +
         quoted +
         "'\n"
         "    shell: true\n"
         "    retry: {max_attempts: 1, backoff: {initial: 1s}}\n" +
         extra;
}

TEST(Slurm, ACommandAndATwoNodeStageRunAsJobsWithTheirIdsAndCostRecorded) {
  std::string yaml = R"yaml(pipeline: slurm-hello
project: slurm-lab
stages:
  hello:
    run: 'echo "hello from $(hostname)"; echo "::progress 1"'
    shell: true
  wide:
    run: sleep 1
    count: 2
    needs: [hello]
)yaml";
  auto r = RunTrnflow("run " + WriteTempFile("hello.yaml", yaml) +
                      " --speed 1 --executor slurm --format json");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  int64_t run = RunIdOf(r.out);
  EXPECT_EQ(RunStateText(run), "succeeded");
  for (const char* stage : {"hello", "wide"}) {
    SCOPED_TRACE(stage);
    std::string job = AttemptCol(run, stage, 1, "executor_job");
    ASSERT_FALSE(job.empty()) << "the job id was not stored on the attempt";
    // Slurm's accounting knows it under the attempt's name, completed.
    std::string acct = ShOutput("sacct -c -n -P -j " + job + " -o jobname,state,nnodes");
    EXPECT_EQ(acct.substr(0, acct.find('|')),
              "trnflow-r" + std::to_string(run) + "-s" + Query("SELECT " + StageId(run, stage)) + "-a1")
        << acct;
    EXPECT_NE(acct.find("|COMPLETED|"), std::string::npos) << acct;
    // The ledger bills price × instances × max(60 s, what ran).
    double billed = QueryNumber("SELECT billed_seconds FROM trnflow.attempts WHERE stage_id = " +
                                StageId(run, stage));
    EXPECT_GE(billed, 60);
    double expect = QueryNumber(
        "SELECT price_usd_hour * instance_count * billed_seconds / 3600 FROM trnflow.attempts "
        "WHERE stage_id = " + StageId(run, stage));
    EXPECT_NEAR(QueryNumber("SELECT cost_usd FROM trnflow.attempts WHERE stage_id = " +
                            StageId(run, stage)),
                expect, 1e-6);
  }
  // The two-node stage had two nodes in Slurm and is billed for two instances.
  std::string wide = AttemptCol(run, "wide", 1, "executor_job");
  EXPECT_EQ(ShOutput("sacct -c -n -P -j " + wide + " -o nnodes"), "2");
  EXPECT_EQ(AttemptCol(run, "wide", 1, "instance_count"), "2");
  // What the job printed is the attempt's log.
  auto logs = RunTrnflow("logs " + std::to_string(run) + " hello");
  EXPECT_NE(logs.out.find("hello from"), std::string::npos) << logs.out << logs.err;
}

// The job knows it is in Slurm: its allocation's variables reach the command, and only
// Slurm's (beside trnflow's own and the rendezvous).
TEST(Slurm, ARunStageSeesItsSlurmJobAndNodelist) {
  auto r = RunTrnflow(
      "run " +
      WriteTempFile("env.yaml",
                    OneStage("slurm-env",
                             "echo \"job=$SLURM_JOB_ID nodes=$SLURM_JOB_NODELIST n=$SLURM_NNODES "
                             "rank=$RANK world=$WORLD_SIZE\"; env | cut -d= -f1 | sort | tr '\\n' ' '")) +
      " --speed 1 --executor slurm --format json");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  int64_t run = RunIdOf(r.out);
  std::string job = AttemptCol(run, "work", 1, "executor_job");
  std::string node = ShOutput("sacct -c -n -P -j " + job + " -o nodelist");
  ASSERT_TRUE(node == "node1" || node == "node2") << node;
  auto logs = RunTrnflow("logs " + std::to_string(run) + " work");
  EXPECT_NE(logs.out.find("job=" + job + " nodes=" + node + " n=1 rank=0 world=1"),
            std::string::npos)
      << logs.out;
  // Every variable is trnflow's, the job's sandbox's, Slurm's or the rendezvous: the worker's
  // own environment (SLURM_CONF aside, Slurm's word for where its config is) stays out.
  std::istringstream names(logs.out.substr(logs.out.rfind('\n', logs.out.find(" PATH ")) + 1));
  std::set<std::string> other;
  for (std::string n; names >> n;)
    if (n.rfind("SLURM", 0) != 0 && n.rfind("TRNFLOW_", 0) != 0) other.insert(n);
  for (const char* expected : {"HOME", "PATH", "TMPDIR", "LANG", "MASTER_ADDR", "MASTER_PORT",
                               "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                               "NODE_RANK", "PWD", "SHLVL", "_"})
    other.erase(expected);
  EXPECT_TRUE(other.empty()) << "unexpected variables: " << ::testing::PrintToString(other)
                             << "\n" << logs.out;
}

// A two-node stage runs its command once on each node (srun, one task per node), in the same
// namespaces as a one-node job, and the ranks meet: each writes its node, rank and rendezvous
// where both can read, and each reads the other's.
TEST(Slurm, ATwoNodeStageRunsOneTaskPerNodeAndTheRanksMeet) {
  const std::string command =
      "d=$TRNFLOW_RUN_DIR/rendezvous; mkdir -p $d; "
      "echo \"$SLURMD_NODENAME rank=$RANK/$WORLD_SIZE node_rank=$NODE_RANK "
      "local=$LOCAL_RANK/$LOCAL_WORLD_SIZE master=$MASTER_ADDR:$MASTER_PORT host=$(hostname) "
      "uid=$(id -u)\" > $d/.$RANK && mv $d/.$RANK $d/$RANK; "
      "o=$((1 - RANK)); for i in $(seq 1 400); do [ -f $d/$o ] && break; sleep 0.05; done; "
      "echo \"rank $RANK read: $(cat $d/$o)\"";
  auto r = RunTrnflow("run " + WriteTempFile("ranks.yaml",
                                             OneStage("slurm-ranks", command, "    count: 2\n")) +
                      " --speed 1 --executor slurm --format json");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  int64_t run = RunIdOf(r.out);
  std::string job = AttemptCol(run, "work", 1, "executor_job");
  // Slurm ran a step of two tasks on the two nodes.
  EXPECT_EQ(ShOutput("sacct -c -n -P -j " + job + " -o nnodes"), "2");
  auto logs = RunTrnflow("logs " + std::to_string(run) + " work");
  std::string port = std::to_string(29500 + std::stoll(job) % 10000);
  std::string uid = Query("SELECT job_uid FROM trnflow.projects WHERE name = 'slurm-lab'");
  // Each rank read the other's line: the same master, the other's node and rank.
  EXPECT_NE(logs.out.find("rank 0 read: node2 rank=1/2 node_rank=1 local=0/1 master=127.0.0.1:" +
                          port + " host=trnflow-job uid=" + uid),
            std::string::npos)
      << logs.out;
  EXPECT_NE(logs.out.find("rank 1 read: node1 rank=0/2 node_rank=0 local=0/1 master=127.0.0.1:" +
                          port + " host=trnflow-job uid=" + uid),
            std::string::npos)
      << logs.out;
}

// The operator's partition map: a stage of a mapped instance type goes to its partition with
// --gres for its devices, and the bill is Slurm's accounting at the instance's price.
TEST(Slurm, APartitionMapRequestsDevicesAndTheBillComesFromAccounting) {
  std::string bad = WriteTempFile("bad-partitions.yaml",
                                  "partitions:\n  batch: {instance: trn1.32xlarge, gres: neuron}\n");
  auto refused = RunTrnflow("run " + WriteTempFile("x.yaml", OneStage("slurm-x", "true")) +
                            " --executor slurm --slurm-config " + bad);
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_NE(refused.err.find(bad + ":2:3: partition batch has `gres: neuron` but no `devices:`"),
            std::string::npos)
      << refused.err;

  std::string config = WriteTempFile(
      "partitions.yaml",
      "partitions:\n"
      "  batch: {instance: trn1.32xlarge, gres: neuron, devices: 2, cores_per_device: 2}\n");
  auto r = RunTrnflow("run " +
                      WriteTempFile("gres.yaml", OneStage("slurm-gres", "sleep 2",
                                                          "    instance: trn1.32xlarge\n")) +
                          " --speed 60 --executor slurm --slurm-config " + config + " --format json",
                      "TRNFLOW_LOG=info");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  int64_t run = RunIdOf(r.out);
  std::string job = AttemptCol(run, "work", 1, "executor_job");
  std::string shown = ShOutput("scontrol show job " + job);
  EXPECT_NE(shown.find("TresPerNode=gres:neuron:2"), std::string::npos) << shown;
  EXPECT_NE(shown.find("Partition=batch"), std::string::npos) << shown;
  // Billed: what Slurm accounted (whole seconds; the wrapper's span refines it within one),
  // at the run's speed, at trn1.32xlarge's price. The record: slurmdbd's (plain sacct, -X: the
  // allocation, not its steps).
  double elapsed = -1;
  ASSERT_TRUE(WaitFor([&] {
    std::string e = ShOutput("sacct -X -n -P -j " + job + " -o elapsed");
    if (e.size() < 8) return false;
    elapsed = std::stoi(e.substr(0, 2)) * 3600 + std::stoi(e.substr(3, 2)) * 60 + std::stoi(e.substr(6, 2));
    return true;
  }, 10));
  double billed = QueryNumber("SELECT billed_seconds FROM trnflow.attempts WHERE stage_id = " +
                              StageId(run, "work"));
  EXPECT_GE(elapsed, 2);
  EXPECT_NEAR(billed / 60, elapsed, 1.0) << "billed " << billed << " s, accounted " << elapsed;
  // From the source the cluster's own config names (scontrol show config), not an assumption:
  // this cluster has slurmdbd (accounting_storage/slurmdbd) and a completion log too
  // (jobcomp/filetxt, `sacct -c`), both with the job; the bill is slurmdbd's.
  std::string acct_config =
      ShOutput("scontrol show config | grep -E '^(AccountingStorageType|JobCompType) '");
  ASSERT_NE(acct_config.find("accounting_storage/slurmdbd"), std::string::npos) << acct_config;
  ASSERT_NE(acct_config.find("jobcomp/filetxt"), std::string::npos) << acct_config;
  EXPECT_EQ(ShOutput("sacct -c -n -P -j " + job + " -o state"), "COMPLETED");
  EXPECT_NE(r.err.find("AccountingStorageType=accounting_storage/slurmdbd, "
                       "JobCompType=jobcomp/filetxt: billing from `sacct`, then `sacct -c`, else "
                       "the wrapper's span"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("Slurm job " + job + " accounted"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("node(s) (sacct)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("(sacct -c)"), std::string::npos) << r.err;
  EXPECT_EQ(Query("SELECT instance_type FROM trnflow.attempts WHERE stage_id = " +
                  StageId(run, "work")),
            "trn1.32xlarge");
}

// A 200-expansion matrix goes out as job arrays: batches of at most max_array_size tasks,
// never more than max_submit_jobs of them in Slurm at once, each attempt one array task. One
// task is cancelled from outside (lost, then retried as a job of its own) and one fails with
// code 75 (retried); the other 198 are not touched by either; every attempt is billed.
TEST(Slurm, A200ExpansionMatrixGoesOutAsArraysOneTaskPerAttempt) {
  Daemon scheduler("array-scheduler", {"scheduler"}, DaemonEnv());
  scheduler.Start();
  std::string config = WriteTempFile("arrays.yaml",
                                     "partitions: {}\nmax_array_size: 64\nmax_submit_jobs: 120\n"
                                     "array_window: 2s\n");
  Daemon worker("array-worker",
                {"worker", "--pool", "cpu=200", "--lease", "5s", "--executor", "slurm",
                 "--slurm-config", config},
                DaemonEnv());
  worker.Start();
  std::string values;
  for (int i = 0; i < 200; ++i) values += (i ? ", " : "") + std::to_string(i);
  std::string yaml =
      "pipeline: slurm-sweep\n"
      "project: slurm-lab\n"
      "stages:\n"
      "  sweep:\n"
      "    matrix: {i: [" + values + "]}\n"
      "    shell: true\n"
      "    run: 'i=${{ matrix.i }}; if [ $TRNFLOW_ATTEMPT = 1 ] && [ $i = 7 ]; then exit 75; fi; "
      "if [ $TRNFLOW_ATTEMPT = 1 ] && [ $i = 9 ]; then echo started; sleep 300; fi; "
      "echo \"task $i of array ${SLURM_ARRAY_JOB_ID:-none} index ${SLURM_ARRAY_TASK_ID:-none}\"'\n"
      "    retry: {max_attempts: 2, backoff: {initial: 1s}}\n";
  int64_t run = Submit(yaml, "sweep");
  auto in_slurm = [] {
    std::string out = ShOutput("squeue -h -r -t pending,running,configuring,completing -o %i");
    return out.empty() ? 0 : static_cast<int>(std::count(out.begin(), out.end(), '\n')) + 1;
  };
  int most = 0;
  // Task 9's first attempt, once its command runs, is cancelled by someone else.
  ASSERT_TRUE(WaitFor([&] {
    most = std::max(most, in_slurm());
    return RunTrnflow("logs " + std::to_string(run) + " 'sweep[i=9]'").out.find("started") !=
           std::string::npos;
  }, 120)) << AttemptCol(run, "sweep[i=9]", 1, "executor_job");
  ASSERT_EQ(JobState(AttemptCol(run, "sweep[i=9]", 1, "executor_job")), "RUNNING");
  std::string cancelled = AttemptCol(run, "sweep[i=9]", 1, "executor_job");
  ShOutput("scancel " + cancelled);
  ASSERT_TRUE(WaitFor(
      [&] {
        most = std::max(most, in_slurm());
        return RunStateText(run) == "succeeded" || RunStateText(run) == "failed";
      },
      240))
      << RunStateText(run);
  ASSERT_EQ(RunStateText(run), "succeeded");
  EXPECT_LE(most, 120) << "more jobs in Slurm at once than max_submit_jobs";

  // Every first attempt was a task ARRAY_INDEX; arrays of at most 64; no task ran two attempts.
  std::map<std::string, int> arrays;
  std::set<std::string> tasks;
  int attempts = 0;
  std::istringstream rows(Query(
      "SELECT string_agg(a.executor_job || ' ' || a.attempt || ' ' || a.outcome || ' ' || "
      "s.name, E'\\n' ORDER BY s.name, a.attempt) FROM trnflow.attempts a JOIN trnflow.stages s "
      "ON s.id = a.stage_id WHERE s.run_id = " + std::to_string(run)));
  for (std::string job, attempt, outcome, name; rows >> job >> attempt >> outcome >> name;) {
    ++attempts;
    EXPECT_TRUE(tasks.insert(job).second) << job << " ran two attempts";
    if (attempt != "1") continue;
    auto us = job.find('_');
    ASSERT_NE(us, std::string::npos) << name << ": " << job << " is not an array task";
    ++arrays[job.substr(0, us)];
    if (name != "sweep[i=7]" && name != "sweep[i=9]") {
      EXPECT_EQ(outcome, "succeeded") << name;
    }
  }
  EXPECT_EQ(attempts, 202);
  EXPECT_GE(arrays.size(), 4u);  // 200 / 64
  EXPECT_LE(arrays.size(), 40u) << "not batched: " << arrays.size() << " submissions";
  for (const auto& [array, n] : arrays) EXPECT_LE(n, 64) << "array " << array;

  // The cancelled task: lost, then a second attempt of its own; its array's others completed.
  EXPECT_EQ(AttemptCol(run, "sweep[i=9]", 1, "outcome"), "lost");
  EXPECT_NE(AttemptCol(run, "sweep[i=9]", 1, "message").find("cancelled outside trnflow"),
            std::string::npos)
      << AttemptCol(run, "sweep[i=9]", 1, "message");
  EXPECT_EQ(AttemptCol(run, "sweep[i=9]", 2, "outcome"), "succeeded");
  EXPECT_EQ(JobState(cancelled), "CANCELLED");
  std::string array = cancelled.substr(0, cancelled.find('_'));
  std::string states = ShOutput("squeue -h -r -t all -j " + array + " -o %T | sort | uniq -c");
  EXPECT_EQ(ShOutput("squeue -h -r -t all -j " + array + " -o %T | grep -c CANCELLED"), "1") << states;
  EXPECT_NE(states.find("COMPLETED"), std::string::npos) << states;
  // The failing task: infra_error (75), retried.
  EXPECT_EQ(AttemptCol(run, "sweep[i=7]", 1, "outcome"), "infra_error");
  EXPECT_EQ(AttemptCol(run, "sweep[i=7]", 2, "outcome"), "succeeded");
  // A task's output is its attempt's log, and it ran as that task of that array.
  std::string job3 = AttemptCol(run, "sweep[i=3]", 1, "executor_job");
  auto logs = RunTrnflow("logs " + std::to_string(run) + " 'sweep[i=3]'");
  EXPECT_NE(logs.out.find("task 3 of array " + job3.substr(0, job3.find('_')) + " index " +
                          job3.substr(job3.find('_') + 1)),
            std::string::npos)
      << logs.out << logs.err;
  // Billed per task: every attempt that ran has its cost.
  EXPECT_EQ(Query("SELECT string_agg(s.name || ' ' || a.attempt || ' ' || a.outcome || ' ' || "
                  "coalesce(a.billed_seconds::text, '-') || ' ' || a.cost_usd, ', ') FROM "
                  "trnflow.attempts a JOIN trnflow.stages s ON s.id = a.stage_id WHERE s.run_id = " +
                  std::to_string(run) + " AND NOT (a.billed_seconds >= 60 AND a.cost_usd > 0)"),
            "");
}

// Array tasks have what single jobs have: a worker killed mid-array is replaced and its
// tasks adopted by the next attempts (found by the array's name and index, never submitted
// again), and cancelling a run cancels its tasks in Slurm, each alone.
TEST(Slurm, ArrayTasksAreAdoptedAfterAWorkerDiesAndCancelledWithTheirRun) {
  Daemon scheduler("array-adopt-scheduler", {"scheduler"}, DaemonEnv());
  scheduler.Start();
  std::string config = WriteTempFile("adopt-arrays.yaml",
                                     "partitions: {}\nmax_array_size: 10\narray_window: 3s\n");
  auto first = SlurmWorker("array-adopt-worker-1", {"--slurm-config", config});
  auto matrix = [](const std::string& pipeline, const std::string& command) {
    return "pipeline: " + pipeline +
           "\n"
           "project: slurm-lab\n"
           "stages:\n"
           "  sweep:\n"
           "    matrix: {i: [0, 1, 2]}\n"
           "    shell: true\n"
           "    run: '" + command + "'\n"
           "    retry: {max_attempts: 2, backoff: {initial: 1s}}\n";
  };
  const std::vector<std::string> names = {"sweep[i=0]", "sweep[i=1]", "sweep[i=2]"};
  int64_t run = Submit(matrix("slurm-array-adopt", "sleep 20; echo \"task ${{ matrix.i }} done\""),
                       "array-adopt");
  std::map<std::string, std::string> tasks;
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& n : names) {
      std::string job = AttemptCol(run, n, 1, "executor_job");
      if (job.empty() || JobState(job) != "RUNNING") return false;
      tasks[n] = job;
    }
    return true;
  }, 60)) << ShOutput("squeue -h -r -t all -o '%i %j %T'");
  for (const auto& [n, job] : tasks)
    EXPECT_NE(job.find('_'), std::string::npos) << n << ": " << job << " is not an array task";
  first->Kill(SIGKILL);
  auto second = SlurmWorker("array-adopt-worker-2", {"--slurm-config", config});
  ASSERT_TRUE(WaitFor([&] { return RunStateText(run) == "succeeded"; }, 120))
      << RunStateText(run) << " " << AttemptCol(run, names[0], 2, "message");
  for (const auto& n : names) {
    SCOPED_TRACE(n);
    EXPECT_EQ(AttemptCol(run, n, 1, "outcome"), "lost");
    EXPECT_EQ(AttemptCol(run, n, 2, "outcome"), "succeeded");
    EXPECT_EQ(AttemptCol(run, n, 2, "executor_job"), tasks[n]) << "attempt 2 did not adopt the task";
    EXPECT_EQ(AttemptCol(run, n, 3, "attempt"), "");
  }
  // Slurm ran each task once: the arrays of the first attempts hold three tasks, all
  // completed, and no other job was submitted for them.
  std::set<std::string> arrays;
  for (const auto& [n, job] : tasks) arrays.insert(job.substr(0, job.find('_')));
  std::string ids;
  for (const auto& a : arrays) ids += (ids.empty() ? "" : ",") + a;
  EXPECT_EQ(ShOutput("squeue -h -r -t all -j " + ids + " -o %T | sort | uniq -c | tr -s ' '"),
            " 3 COMPLETED");
  auto logs = RunTrnflow("logs " + std::to_string(run) + " 'sweep[i=1]'");
  EXPECT_NE(logs.out.find("task 1 done"), std::string::npos) << logs.out << logs.err;

  // Cancelled with its run: every task, running, in Slurm; every attempt cancelled.
  int64_t doomed = Submit(matrix("slurm-array-cancel", "sleep 300"), "array-cancel");
  std::map<std::string, std::string> doomed_tasks;
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& n : names) {
      std::string job = AttemptCol(doomed, n, 1, "executor_job");
      if (job.empty() || JobState(job) != "RUNNING") return false;
      doomed_tasks[n] = job;
    }
    return true;
  }, 60)) << ShOutput("squeue -h -r -t all -o '%i %j %T'");
  EXPECT_EQ(RunTrnflow("cancel " + std::to_string(doomed)).exit_code, 0);
  for (const auto& n : names) {
    SCOPED_TRACE(n);
    EXPECT_TRUE(WaitFor([&] { return JobState(doomed_tasks[n]) == "CANCELLED"; }, 30))
        << JobState(doomed_tasks[n]);
    EXPECT_TRUE(WaitFor([&] { return AttemptCol(doomed, n, 1, "outcome") == "cancelled"; }, 30))
        << AttemptCol(doomed, n, 1, "outcome") << " " << AttemptCol(doomed, n, 1, "message");
  }
}

// The wrapper runs as root on the node. It used to write its bookkeeping (begin, exit: what
// billing reads) into a directory the job owned, so a link the job planted there made root
// overwrite any file. Now the attempt's directory is root's, only work/ is the job's, and the
// job (in its namespaces) does not even see the shared directory.
TEST(Slurm, TheWrapperWritesOnlyWhereTheJobCannotAndTheJobSeesNoneOfIt) {
  std::string shared = CliHome() + "/slurm";
  std::string canary = "/tmp/trnflow-slurm-canary-" + std::to_string(getpid());
  fs::remove(canary);
  std::string command = "ls " + shared + " 2>&1; for d in " + shared +
                        "/*/run-*/*; do ln -sf " + canary +
                        " \"$d/exit\" 2>&1 && echo LEAK-planted; done; id -u; echo done";
  auto r = RunTrnflow("run " + WriteTempFile("planter.yaml", OneStage("slurm-planter", command)) +
                      " --speed 1 --executor slurm --format json");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  int64_t run = RunIdOf(r.out);
  auto logs = RunTrnflow("logs " + std::to_string(run) + " work");
  EXPECT_NE(logs.out.find("done"), std::string::npos) << logs.out;
  EXPECT_NE(logs.out.find("No such file or directory"), std::string::npos) << logs.out;
  EXPECT_EQ(logs.out.find("LEAK"), std::string::npos) << logs.out;
  EXPECT_FALSE(fs::exists(canary));
  std::string uid = Query("SELECT job_uid FROM trnflow.projects WHERE name = 'slurm-lab'");
  fs::path attempt = fs::path(shared) / ("uid-" + uid) / ("run-" + std::to_string(run)) /
                     "work.attempt-1";
  struct stat st;
  ASSERT_EQ(::stat(attempt.c_str(), &st), 0) << attempt;
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  EXPECT_EQ(std::to_string(st.st_gid), uid);
  ASSERT_EQ(::stat((attempt / "work").c_str(), &st), 0);
  EXPECT_EQ(std::to_string(st.st_uid), uid);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  for (const char* f : {"exit", "begin", "output.log"}) {
    ASSERT_EQ(::lstat((attempt / f).c_str(), &st), 0) << f;
    EXPECT_TRUE(S_ISREG(st.st_mode)) << f;
    EXPECT_EQ(st.st_uid, 0u) << f;
    EXPECT_EQ(st.st_mode & 077, 0u) << f << ": others may read it";
  }
  ASSERT_EQ(::stat((fs::path(shared) / ("uid-" + uid)).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0710u);
}

// The README's two commands: the climate example end to end on the cluster, simulated stages
// through `trnflow exec-stage` in their jobs, with the figures it has on one host.
TEST(Slurm, TheClimateExampleRunsOnTheClusterWithItsOneHostFigures) {
  std::string file = std::string(TRNFLOW_SOURCE_DIR) + "/examples/climate/pipeline.yaml";
  auto local = RunTrnflow("run " + file + " --project slurm-local --format json");
  ASSERT_EQ(local.exit_code, 0) << local.err;
  auto r = RunTrnflow("run " + file + " --project slurm-climate --executor slurm --format json");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  int64_t run = RunIdOf(r.out);
  auto stages = nlohmann::json::parse(r.out)["stages"];
  auto local_stages = nlohmann::json::parse(local.out)["stages"];
  ASSERT_EQ(stages.size(), local_stages.size());
  for (size_t i = 0; i < stages.size(); ++i) {
    std::string name = stages[i]["name"].get<std::string>();
    SCOPED_TRACE(name);
    // Training and serving cost what they cost on one host (same seed, same simulator); the
    // train stage's spot interruption and resume happen in Slurm jobs. (The compiles are
    // cache hits the second time: compiled graphs serve every project.)
    if (stages[i]["kind"] == "train" || stages[i]["kind"] == "deploy") {
      EXPECT_NEAR(stages[i]["cost_usd"].get<double>(), local_stages[i]["cost_usd"].get<double>(),
                  0.01);
    }
    EXPECT_EQ(stages[i]["attempts"].size(), local_stages[i]["attempts"].size());
    if (stages[i]["state"] == "succeeded") {
      EXPECT_FALSE(AttemptCol(run, name, 1, "executor_job").empty()) << "not run as a Slurm job";
    }
  }
  EXPECT_EQ(AttemptCol(run, "train", 1, "outcome"), "spot_interruption");
  EXPECT_NE(AttemptCol(run, "train", 1, "executor_job"), AttemptCol(run, "train", 2, "executor_job"));
}

// sbatch's reply is lost ("Socket timed out") after Slurm took the job: the attempt finds the
// job by name instead of submitting a second one. The real sbatch, behind a wrapper that
// loses its answer.
TEST(Slurm, ALostSubmitReplyDoesNotSubmitTwice) {
  fs::path bin = fs::temp_directory_path() / ("trnflow-lossy-sbatch-" + std::to_string(getpid()));
  fs::create_directories(bin);
  std::ofstream(bin / "sbatch")
      << "#!/bin/sh\n/usr/bin/sbatch \"$@\" > /dev/null\n"
         "echo 'sbatch: error: Batch job submission failed: Socket timed out on send/recv "
         "operation' >&2\nexit 1\n";
  fs::permissions(bin / "sbatch", fs::perms::owner_all);
  auto r = RunTrnflow("run " + WriteTempFile("lossy.yaml", OneStage("slurm-lossy", "echo once")) +
                          " --speed 1 --executor slurm --format json",
                      "PATH=" + bin.string() + ":$PATH");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  int64_t run = RunIdOf(r.out);
  EXPECT_EQ(AttemptCol(run, "work", 1, "outcome"), "succeeded");
  EXPECT_EQ(JobsOfStage(run, "work"), 1) << "the lost reply made a second job";
  EXPECT_NE(r.err.find("but Slurm has job"), std::string::npos) << "the reply was not lost?\n"
                                                                 << r.err;
  fs::remove_all(bin);
}

TEST(Slurm, AFailingCommandFailsWithItsCodeAndLastLine) {
  auto r = RunTrnflow("run " +
                      WriteTempFile("fail.yaml", OneStage("slurm-fail",
                                                          "echo 'boom: disk full' >&2; exit 3")) +
                      " --speed 1 --executor slurm --format json");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  int64_t run = RunIdOf(r.out);
  EXPECT_EQ(AttemptCol(run, "work", 1, "outcome"), "failed");
  std::string message = AttemptCol(run, "work", 1, "message");
  EXPECT_NE(message.find("exited with code 3"), std::string::npos) << message;
  EXPECT_NE(message.find("boom: disk full"), std::string::npos) << message;
  EXPECT_NE(message.find("Slurm job " + AttemptCol(run, "work", 1, "executor_job")),
            std::string::npos)
      << message;
}

TEST(Slurm, CancellingARunCancelsItsRunningAndPendingJobs) {
  Daemon scheduler("cancel-scheduler", {"scheduler"}, DaemonEnv());
  scheduler.Start();
  auto worker = SlurmWorker("cancel-worker");
  // Running.
  int64_t running = Submit(OneStage("slurm-cancel-running", "sleep 300"), "running");
  ASSERT_TRUE(WaitFor([&] { return !AttemptCol(running, "work", 1, "executor_job").empty(); }, 30));
  std::string job = AttemptCol(running, "work", 1, "executor_job");
  ASSERT_TRUE(WaitFor([&] { return JobState(job) == "RUNNING"; }, 30)) << JobState(job);
  EXPECT_EQ(RunTrnflow("cancel " + std::to_string(running)).exit_code, 0);
  EXPECT_TRUE(WaitFor([&] { return JobState(job) == "CANCELLED"; }, 30)) << JobState(job);
  EXPECT_TRUE(WaitFor([&] { return AttemptCol(running, "work", 1, "outcome") == "cancelled"; }, 30))
      << AttemptCol(running, "work", 1, "outcome");

  // Pending: every node is taken by a job of someone else's.
  std::string blocker = ShOutput("sbatch --parsable -N2 --exclusive -o /dev/null --wrap 'sleep 300'");
  ASSERT_TRUE(WaitFor([&] { return JobState(blocker) == "RUNNING"; }, 30)) << JobState(blocker);
  int64_t pending = Submit(OneStage("slurm-cancel-pending", "true"), "pending");
  ASSERT_TRUE(WaitFor([&] { return !AttemptCol(pending, "work", 1, "executor_job").empty(); }, 30));
  std::string pjob = AttemptCol(pending, "work", 1, "executor_job");
  EXPECT_EQ(JobState(pjob), "PENDING");
  EXPECT_EQ(RunTrnflow("cancel " + std::to_string(pending)).exit_code, 0);
  EXPECT_TRUE(WaitFor([&] { return JobState(pjob) == "CANCELLED"; }, 30)) << JobState(pjob);
  EXPECT_TRUE(WaitFor([&] { return !AttemptCol(pending, "work", 1, "outcome").empty(); }, 30));
  EXPECT_EQ(AttemptCol(pending, "work", 1, "outcome"), "cancelled");
  ShOutput("scancel " + blocker);
}

TEST(Slurm, ANoticeThenAKillIsASpotInterruptionAndTheNextAttemptResumes) {
  Daemon scheduler("notice-scheduler", {"scheduler"}, DaemonEnv());
  scheduler.Start();
  auto worker = SlurmWorker("notice-worker");
  std::string job_sh = std::string(TRNFLOW_SOURCE_DIR) + "/tests/jobs/checkpointing_job.sh";
  int64_t run = Submit(OneStage("slurm-notice", job_sh, "    env: {STEPS: \"120\", EVERY: \"5\"}\n"),
                       "notice");
  // Once a checkpoint has reached the catalog: the 2-minute notice, then the node goes.
  ASSERT_TRUE(WaitFor([&] {
    return QueryNumber("SELECT progress FROM trnflow.stages WHERE id = " + StageId(run, "work")) >= 0.2;
  }, 60)) << "no checkpoint reached the catalog";
  std::string job = AttemptCol(run, "work", 1, "executor_job");
  ASSERT_FALSE(job.empty());
  ShOutput("scancel --batch --signal=USR1 " + job);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  ShOutput("scancel " + job);
  ASSERT_TRUE(WaitFor([&] { return RunStateText(run) == "succeeded"; }, 90))
      << RunStateText(run) << " " << AttemptCol(run, "work", 1, "message");
  EXPECT_EQ(AttemptCol(run, "work", 1, "outcome"), "spot_interruption")
      << AttemptCol(run, "work", 1, "message");
  EXPECT_EQ(AttemptCol(run, "work", 2, "outcome"), "succeeded");
  // The second attempt is a job of its own and started from the first one's checkpoint.
  EXPECT_NE(AttemptCol(run, "work", 2, "executor_job"), job);
  std::ifstream steps(CliHome() + "/runs/" + std::to_string(run) + "/steps.log");
  std::stringstream text;
  text << steps.rdbuf();
  auto at = text.str().find("attempt 2 starts at step ");
  ASSERT_NE(at, std::string::npos) << text.str();
  EXPECT_GT(std::stoi(text.str().substr(at + 25)), 0) << text.str();
  EXPECT_LT(QueryNumber("SELECT wasted_usd / cost_usd FROM trnflow.attempts WHERE stage_id = " +
                        StageId(run, "work") + " AND attempt = 1"),
            1)
      << "the checkpointed part of the lost attempt is not waste";
}

TEST(Slurm, ANodeLostMidJobOnASpotPartitionIsAnInterruption) {
  Daemon scheduler("node-scheduler", {"scheduler"}, DaemonEnv());
  scheduler.Start();
  auto worker = SlurmWorker("node-worker", {"--partition", "spot", "--spot-partition"});
  int64_t run = Submit(
      OneStage("slurm-node", "if [ \"$TRNFLOW_ATTEMPT\" = 1 ]; then sleep 300; fi; echo done"),
      "node");
  ASSERT_TRUE(WaitFor([&] { return !AttemptCol(run, "work", 1, "executor_job").empty(); }, 30));
  std::string job = AttemptCol(run, "work", 1, "executor_job");
  ASSERT_TRUE(WaitFor([&] { return JobState(job) == "RUNNING"; }, 30));
  // RUNNING in squeue is the allocation; the batch script starts a moment later (seconds on
  // a loaded host). A node set down before that never launches the job, and Slurm holds the
  // node's CPUs for the job it never started: wait for the wrapper's begin.
  std::string uid = Query("SELECT job_uid FROM trnflow.projects WHERE name = 'slurm-lab'");
  fs::path begin = fs::path(CliHome()) / "slurm" / ("uid-" + uid) /
                   ("run-" + std::to_string(run)) / "work.attempt-1" / "begin";
  ASSERT_TRUE(WaitFor([&] { return fs::exists(begin); }, 30)) << begin;
  std::string node = ShOutput("squeue -h -j " + job + " -o %N");
  ShOutput("scontrol update nodename=" + node + " state=down reason=trnflow-test");
  EXPECT_TRUE(WaitFor([&] { return RunStateText(run) == "succeeded"; }, 60)) << RunStateText(run);
  EXPECT_EQ(AttemptCol(run, "work", 1, "outcome"), "spot_interruption")
      << AttemptCol(run, "work", 1, "message");
  EXPECT_NE(AttemptCol(run, "work", 1, "message").find("NODE_FAIL"), std::string::npos);
  ShOutput("scontrol update nodename=" + node + " state=resume");
  std::string seen;  // the states seen, for the failure message
  EXPECT_TRUE(WaitFor([&] {
    // The controller's own record of the node, not `sinfo -n NODE`: with one node name sinfo
    // asks for that node alone (REQUEST_NODE_INFO_SINGLE), and slurmctld (22.05,
    // _slurm_rpc_dump_node_single in proc_req.c) answers it without refreshing the nodes'
    // allocated-CPU counts (select_g_select_nodeinfo_set_all is `#if 0`'d there as too slow);
    // sinfo then shows MIXED from the count of the last full node query, taken while the job
    // ran, until something asks for all nodes (an unfiltered sinfo, or scontrol show node,
    // which loads every node and filters itself). So `sinfo -n` printed mix for a node that
    // was idle, for as long as nobody else asked. Reproduced on ops/slurm.sh's cluster: a
    // one-CPU job on node1, a plain `sinfo -N` while it runs (node1 mix), the job ends:
    // `sinfo -h -N -n node1 -o %t` says mix, `scontrol show node node1` IDLE, and after that
    // (a full query) `sinfo -n node1` says idle too.
    std::string st = ShOutput("scontrol show node " + node + " | grep -o 'State=[A-Z+_]*'");
    if (seen.size() < 400) seen += st + " ";
    return st == "State=IDLE";
  }, 30)) << seen << "\n"
      << ShOutput("sinfo -N -o '%N %t %E'") << "\n" << ShOutput("squeue -t all -w " + node);
}

TEST(Slurm, APreemptedJobIsASpotInterruptionAndRunsAgain) {
  Daemon scheduler("preempt-scheduler", {"scheduler"}, DaemonEnv());
  scheduler.Start();
  auto worker = SlurmWorker("preempt-worker", {"--partition", "spot"});
  int64_t run = Submit(
      OneStage("slurm-preempt", "if [ \"$TRNFLOW_ATTEMPT\" = 1 ]; then sleep 300; fi; echo done"),
      "preempt");
  ASSERT_TRUE(WaitFor([&] { return !AttemptCol(run, "work", 1, "executor_job").empty(); }, 30));
  std::string job = AttemptCol(run, "work", 1, "executor_job");
  ASSERT_TRUE(WaitFor([&] { return JobState(job) == "RUNNING"; }, 30));
  // Someone's job in a higher priority tier needs every node: Slurm cancels ours for it.
  std::string urgent = ShOutput("sbatch --parsable -p urgent -N2 --exclusive -o /dev/null --wrap 'sleep 1'");
  EXPECT_TRUE(WaitFor([&] { return JobState(job) == "PREEMPTED"; }, 60)) << JobState(job);
  ASSERT_TRUE(WaitFor([&] { return RunStateText(run) == "succeeded"; }, 90)) << RunStateText(run);
  EXPECT_EQ(AttemptCol(run, "work", 1, "outcome"), "spot_interruption")
      << AttemptCol(run, "work", 1, "message");
  EXPECT_NE(AttemptCol(run, "work", 1, "message").find("preempted"), std::string::npos);
  EXPECT_EQ(AttemptCol(run, "work", 2, "outcome"), "succeeded");
}

TEST(Slurm, AStageThatOverrunsItsTimeoutIsCancelledAsATimeout) {
  auto r = RunTrnflow("run " +
                      WriteTempFile("timeout.yaml",
                                    OneStage("slurm-timeout", "sleep 120", "    timeout: 3s\n")) +
                      " --speed 1 --executor slurm --format json");
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  int64_t run = RunIdOf(r.out);
  EXPECT_EQ(AttemptCol(run, "work", 1, "outcome"), "timeout") << AttemptCol(run, "work", 1, "message");
  // The attempt ends when the workload has exited (the wrapper's exit file): Slurm may still be
  // completing the cancelled job then (COMPLETING, its step's cleanup), longer under load.
  // Slurm's last word on it, once it has one:
  std::string job = AttemptCol(run, "work", 1, "executor_job"), state;
  EXPECT_TRUE(WaitFor([&] { return (state = JobState(job)) != "COMPLETING"; }, 30)) << state;
  EXPECT_EQ(state, "CANCELLED");
  // Slurm's limit, the backstop, leaves its two-minute notice (--signal=B:USR1@120) after
  // trnflow's own timeout and grace: with a limit of two minutes the "notice" could come at
  // once, and the attempt was judged a spot interruption.
  std::string shown = ShOutput("scontrol show job " + job);
  EXPECT_NE(shown.find("TimeLimit=00:04:00"), std::string::npos) << shown;
}

TEST(Slurm, SlurmctldDownFor30sKeepsTheLeaseAndConcludesNothing) {
  Daemon scheduler("ctld-scheduler", {"scheduler"}, DaemonEnv());
  scheduler.Start();
  auto worker = SlurmWorker("ctld-worker");
  int64_t run = Submit(OneStage("slurm-ctld", "sleep 40; echo survived"), "ctld");
  ASSERT_TRUE(WaitFor([&] { return !AttemptCol(run, "work", 1, "executor_job").empty(); }, 30));
  std::string job = AttemptCol(run, "work", 1, "executor_job");
  ASSERT_TRUE(WaitFor([&] { return JobState(job) == "RUNNING"; }, 30));
  std::string pid = ShOutput("cat " + SlurmCluster::dir() + "/slurmctld.pid");
  ASSERT_EQ(::kill(std::stoi(pid), SIGTERM), 0);
  ASSERT_TRUE(WaitFor([&] { return ::kill(std::stoi(pid), 0) != 0; }, 15));
  for (int i = 0; i < 6; ++i) {  // 30 s without a controller: the lease holds, no outcome
    std::this_thread::sleep_for(std::chrono::seconds(5));
    EXPECT_EQ(Query("SELECT state FROM trnflow.stages WHERE id = " + StageId(run, "work")),
              "running");
    EXPECT_EQ(AttemptCol(run, "work", 1, "outcome"), "");
  }
  int status = 0;
  std::string up = ShOutput(SlurmCluster::env() + TRNFLOW_SOURCE_DIR "/ops/slurm.sh up", &status);
  ASSERT_EQ(status, 0) << up;
  EXPECT_TRUE(WaitFor([&] { return RunStateText(run) == "succeeded"; }, 60))
      << RunStateText(run) << " " << AttemptCol(run, "work", 1, "message");
  EXPECT_EQ(AttemptCol(run, "work", 1, "outcome"), "succeeded");
  EXPECT_EQ(JobsOfStage(run, "work"), 1);
}

TEST(Slurm, AWorkerKilledMidJobIsReplacedAndTheJobAdoptedNotRunTwice) {
  Daemon scheduler("adopt-scheduler", {"scheduler"}, DaemonEnv());
  scheduler.Start();
  auto first = SlurmWorker("adopt-worker-1");
  int64_t run = Submit(OneStage("slurm-adopt", "sleep 12; echo finished by its first job"),
                       "adopt");
  ASSERT_TRUE(WaitFor([&] { return !AttemptCol(run, "work", 1, "executor_job").empty(); }, 30));
  std::string job = AttemptCol(run, "work", 1, "executor_job");
  ASSERT_TRUE(WaitFor([&] { return JobState(job) == "RUNNING"; }, 30));
  first->Kill(SIGKILL);
  auto second = SlurmWorker("adopt-worker-2");
  ASSERT_TRUE(WaitFor([&] { return RunStateText(run) == "succeeded"; }, 90))
      << RunStateText(run) << " " << AttemptCol(run, "work", 2, "message");
  EXPECT_EQ(AttemptCol(run, "work", 1, "outcome"), "lost");
  EXPECT_EQ(AttemptCol(run, "work", 2, "outcome"), "succeeded");
  EXPECT_EQ(AttemptCol(run, "work", 2, "executor_job"), job) << "attempt 2 did not adopt the job";
  EXPECT_EQ(JobsOfStage(run, "work"), 1) << "Slurm ran the stage more than once";
}

// The site's fairness sees each project: --slurm-config's `accounts:` puts a project's jobs
// under its own Slurm account and QOS (single jobs and array tasks alike), a project it does not
// name under the default. The test cluster enforces associations (ops/slurm.sh), so Slurm would
// refuse a job under an account it does not know; the worker refuses such a map at start.
TEST(Slurm, EachProjectsJobsGoInUnderItsOwnAccountAndQos) {
  std::string config = WriteTempFile("accounts.yaml",
                                     "max_array_size: 10\n"
                                     "accounts:\n"
                                     "  slurm-vision: {account: vision, qos: high}\n"
                                     "  slurm-nlp: nlp\n"
                                     "default_account: lab\n");
  auto account_of = [](const std::string& job) {
    std::string shown = ShOutput("scontrol show job " + job);
    auto field = [&](const std::string& key) {
      auto at = shown.find(" " + key + "=");
      if (at == std::string::npos) return std::string("?");
      at += key.size() + 2;
      return shown.substr(at, shown.find_first_of(" \n", at) - at);
    };
    return field("Account") + "/" + field("QOS");
  };
  auto run = [&](const std::string& project, const std::string& yaml_extra = "") {
    std::string yaml = "pipeline: slurm-account-" + project + "\nproject: " + project +
                       "\nstages:\n  work:\n    run: echo charged\n" + yaml_extra;
    auto r = RunTrnflow("run " + WriteTempFile(project + ".yaml", yaml) +
                        " --speed 1 --executor slurm --slurm-config " + config + " --format json");
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return r.exit_code == 0 ? RunIdOf(r.out) : int64_t{0};
  };
  int64_t vision = run("slurm-vision"), nlp = run("slurm-nlp"), other = run("slurm-other");
  ASSERT_TRUE(vision && nlp && other);
  std::string job = AttemptCol(vision, "work", 1, "executor_job");
  EXPECT_EQ(account_of(job), "vision/high");
  // slurmdbd has it under the project's account too: what fairshare and sshare count.
  EXPECT_TRUE(WaitFor(
      [&] { return ShOutput("sacct -X -n -P -j " + job + " -o account,qos") == "vision|high"; },
      10))
      << ShOutput("sacct -X -n -P -j " + job + " -o account,qos");
  EXPECT_EQ(account_of(AttemptCol(nlp, "work", 1, "executor_job")), "nlp/normal");
  // A project the map does not name: the default account.
  EXPECT_EQ(account_of(AttemptCol(other, "work", 1, "executor_job")), "lab/normal");

  // Array tasks carry their project's account as single jobs do.
  int64_t sweep = run("slurm-vision", "    matrix: {i: [0, 1, 2]}\n");
  ASSERT_TRUE(sweep);
  for (const char* n : {"work[i=0]", "work[i=1]", "work[i=2]"}) {
    std::string task = AttemptCol(sweep, n, 1, "executor_job");
    EXPECT_NE(task.find('_'), std::string::npos) << n << ": " << task << " is not an array task";
    EXPECT_EQ(account_of(task), "vision/high") << n;
  }

  // Without default_account, the worker's --account is the default; both, different, are
  // refused.
  std::string only_vision =
      WriteTempFile("accounts-vision.yaml", "accounts: {slurm-vision: vision}\n");
  auto flagged = RunTrnflow("run " + WriteTempFile("flag.yaml", OneStage("slurm-flag", "true")) +
                            " --speed 1 --executor slurm --account nlp --slurm-config " +
                            only_vision + " --format json");
  ASSERT_EQ(flagged.exit_code, 0) << flagged.err;
  EXPECT_EQ(account_of(AttemptCol(RunIdOf(flagged.out), "work", 1, "executor_job")), "nlp/normal");
  auto both = RunTrnflow("run " + WriteTempFile("x.yaml", OneStage("slurm-x", "true")) +
                         " --executor slurm --account nlp --slurm-config " + config);
  EXPECT_EQ(both.exit_code, 2) << both.err;
  EXPECT_NE(both.err.find("disagree"), std::string::npos) << both.err;

  // An account or QOS Slurm does not have is the operator's error at start (exit 2), with the
  // closest name; a bad key, with its place in the file.
  std::string typo = WriteTempFile("accounts-typo.yaml", "accounts:\n  slurm-vision: visoin\n");
  auto refused = RunTrnflow("run " + WriteTempFile("x.yaml", OneStage("slurm-x", "true")) +
                            " --executor slurm --slurm-config " + typo);
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_NE(refused.err.find(typo + ": project slurm-vision's account visoin: Slurm has no such "
                                    "account; did you mean 'vision'"),
            std::string::npos)
      << refused.err;
  std::string bad = WriteTempFile("accounts-bad.yaml", "accounts:\n  slurm-vision: {qos: high}\n");
  refused = RunTrnflow("run " + WriteTempFile("x.yaml", OneStage("slurm-x", "true")) +
                       " --executor slurm --slurm-config " + bad);
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_NE(refused.err.find(bad + ":2:3: project slurm-vision has no `account:`"),
            std::string::npos)
      << refused.err;
}

// A worker is killed -9 while its stages' jobs run; the jobs finish while no worker watches,
// and the scheduler closes the attempts as lost. The next worker's attempts take the finished
// jobs' results (exit, output, accounting) instead of running the work again, each job's
// once: `ok` succeeds from its job; `bad`'s job exited 75 (an infra error, retried), which its
// second attempt takes, and its third attempt runs a job of its own rather than take that
// result a second time.
TEST(Slurm, AJobThatFinishedWhileItsWorkerWasDeadIsHarvestedOnceNotRunAgain) {
  Daemon scheduler("harvest-scheduler", {"scheduler"}, DaemonEnv());
  scheduler.Start();
  auto first = SlurmWorker("harvest-worker-1");
  std::string yaml = R"yaml(pipeline: slurm-harvest
project: slurm-lab
stages:
  ok:
    shell: true
    run: 'echo "ran $TRNFLOW_ATTEMPT" >> $TRNFLOW_RUN_DIR/ok.count; sleep 8; echo "ok finished by attempt $TRNFLOW_ATTEMPT"'
    retry: {max_attempts: 3, backoff: {initial: 1s}}
  bad:
    shell: true
    run: 'echo "ran $TRNFLOW_ATTEMPT" >> $TRNFLOW_RUN_DIR/bad.count; sleep 8; if [ $TRNFLOW_ATTEMPT = 1 ]; then exit 75; fi; echo recovered'
    retry: {max_attempts: 3, backoff: {initial: 1s}}
)yaml";
  int64_t run = Submit(yaml, "harvest");
  std::string uid = Query("SELECT job_uid FROM trnflow.projects WHERE name = 'slurm-lab'");
  fs::path attempts =
      fs::path(CliHome()) / "slurm" / ("uid-" + uid) / ("run-" + std::to_string(run));
  std::map<std::string, std::string> jobs;
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const char* n : {"ok", "bad"}) {
          jobs[n] = AttemptCol(run, n, 1, "executor_job");
          if (jobs[n].empty() || !fs::exists(attempts / (std::string(n) + ".attempt-1") / "begin"))
            return false;
        }
        return true;
      },
      60))
      << ShOutput("squeue -h -t all -o '%i %j %T'");
  first->Kill(SIGKILL);
  // Both jobs end in Slurm and both attempts are closed as lost before any worker looks again.
  for (const char* n : {"ok", "bad"}) {
    SCOPED_TRACE(n);
    std::string state;
    EXPECT_TRUE(WaitFor(
        [&] {
          state = JobState(jobs[n]);
          return state == "COMPLETED" || state == "FAILED";
        },
        60))
        << state;
    EXPECT_TRUE(WaitFor([&] { return AttemptCol(run, n, 1, "outcome") == "lost"; }, 60))
        << AttemptCol(run, n, 1, "outcome");
  }
  auto second = SlurmWorker("harvest-worker-2");
  ASSERT_TRUE(WaitFor([&] { return RunStateText(run) == "succeeded"; }, 90))
      << RunStateText(run) << " " << AttemptCol(run, "ok", 2, "message") << " | "
      << AttemptCol(run, "bad", 2, "message") << " | " << AttemptCol(run, "bad", 3, "message");

  // ok: its job's success is attempt 2's; Slurm ran it once, its command ran once.
  EXPECT_EQ(AttemptCol(run, "ok", 2, "outcome"), "succeeded");
  EXPECT_EQ(AttemptCol(run, "ok", 2, "executor_job"), jobs["ok"]);
  EXPECT_NE(AttemptCol(run, "ok", 2, "message").find("harvested from attempt 1"), std::string::npos)
      << AttemptCol(run, "ok", 2, "message");
  EXPECT_EQ(AttemptCol(run, "ok", 3, "attempt"), "");
  EXPECT_EQ(JobsOfStage(run, "ok"), 1) << "Slurm ran the stage more than once";
  EXPECT_EQ(testing::ReadFile(RunDirOf(run) + "/ok.count"), "ran 1\n");
  auto logs = RunTrnflow("logs " + std::to_string(run) + " ok");
  EXPECT_NE(logs.out.find("ok finished by attempt 1"), std::string::npos) << logs.out << logs.err;
  // Billed once: the lost attempt to its last heartbeat, the harvest the rest of what
  // slurmdbd accounted for the job (to within its one-second resolution), not all of it again.
  double elapsed = -1;
  ASSERT_TRUE(WaitFor(
      [&] {
        std::string e = ShOutput("sacct -X -n -P -j " + jobs["ok"] + " -o elapsed");
        if (e.size() < 8) return false;
        elapsed = std::stoi(e.substr(0, 2)) * 3600 + std::stoi(e.substr(3, 2)) * 60 +
                  std::stoi(e.substr(6, 2));
        return true;
      },
      10));
  double first_billed = QueryNumber("SELECT sim_seconds FROM trnflow.attempts WHERE stage_id = " +
                                    StageId(run, "ok") + " AND attempt = 1");
  double harvest_billed = QueryNumber("SELECT sim_seconds FROM trnflow.attempts WHERE stage_id = " +
                                      StageId(run, "ok") + " AND attempt = 2");
  EXPECT_GE(elapsed, 8);
  EXPECT_NEAR(first_billed + harvest_billed, elapsed, 1.5)
      << "attempt 1 " << first_billed << " s, attempt 2 " << harvest_billed << " s, job "
      << elapsed;
  EXPECT_GT(harvest_billed, 0);

  // bad: attempt 2 took its job's exit 75 (once); attempt 3 ran a job of its own.
  EXPECT_EQ(AttemptCol(run, "bad", 2, "outcome"), "infra_error");
  EXPECT_EQ(AttemptCol(run, "bad", 2, "executor_job"), jobs["bad"]);
  EXPECT_NE(AttemptCol(run, "bad", 2, "message").find("harvested from attempt 1"),
            std::string::npos)
      << AttemptCol(run, "bad", 2, "message");
  EXPECT_EQ(AttemptCol(run, "bad", 3, "outcome"), "succeeded");
  EXPECT_NE(AttemptCol(run, "bad", 3, "executor_job"), jobs["bad"]);
  EXPECT_EQ(AttemptCol(run, "bad", 3, "message").find("harvested"), std::string::npos);
  EXPECT_EQ(JobsOfStage(run, "bad"), 2);
  EXPECT_EQ(testing::ReadFile(RunDirOf(run) + "/bad.count"), "ran 1\nran 3\n");
}

}  // namespace
}  // namespace trnflow
