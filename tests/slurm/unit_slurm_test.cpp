// What the Slurm executor reads from Slurm (captured squeue and sacct output from Slurm 22.05)
// and how it judges an attempt from that and its wrapper's files. Pure: no cluster needed.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "workers/slurm.h"

namespace trnflow::workers::slurm {
namespace {

TEST(SlurmParse, SqueueKeepsReasonsWithSpacesAndSkipsNothing) {
  // squeue -h -t all -j 5,6,7,8 -o '%i|%T|%r'
  auto jobs = ParseSqueue(
      "5|COMPLETED|None\n"
      "6|PENDING|launch failed requeued held\n"
      "7|PENDING|PartitionNodeLimit\n"
      "8|CANCELLED|Priority\n");
  ASSERT_EQ(jobs.size(), 4u);
  EXPECT_EQ(jobs["5"].state, "COMPLETED");
  EXPECT_EQ(jobs["6"].reason, "launch failed requeued held");
  EXPECT_EQ(jobs["7"].reason, "PartitionNodeLimit");
  EXPECT_EQ(jobs["8"].state, "CANCELLED");
  EXPECT_TRUE(ParseSqueue("").empty());  // every id gone: an empty answer, not an error
}

TEST(SlurmParse, SacctSkipsStepsAndReadsCancelledBy) {
  // sacct -n -P -o jobid,state,elapsed,nnodes,exitcode
  auto jobs = ParseSacct(
      "12|COMPLETED|00:00:07|2|0:0\n"
      "12.batch|COMPLETED|00:00:07|1|0:0\n"
      "12.0|COMPLETED|00:00:06|2|0:0\n"
      "13|CANCELLED by 0|1-02:03:04|1|0:15\n"
      "14|FAILED|00:01:00|1|3:0\n"
      "15|TIMEOUT|00:02:00|1|0:0\n");
  ASSERT_EQ(jobs.size(), 4u);
  EXPECT_EQ(jobs["12"].nodes, 2);
  EXPECT_DOUBLE_EQ(jobs["12"].elapsed_s, 7);
  EXPECT_EQ(jobs["13"].state, "CANCELLED");
  EXPECT_EQ(jobs["13"].cancelled_by, 0);
  EXPECT_DOUBLE_EQ(jobs["13"].elapsed_s, 86400 + 2 * 3600 + 3 * 60 + 4);
  EXPECT_EQ(jobs["13"].exit_signal, 15);
  EXPECT_EQ(jobs["14"].exit_code, 3);
  EXPECT_EQ(jobs["15"].state, "TIMEOUT");
}

TEST(SlurmParse, Durations) {
  EXPECT_DOUBLE_EQ(ParseSlurmDuration("00:00:01"), 1);
  EXPECT_DOUBLE_EQ(ParseSlurmDuration("03:04"), 184);
  EXPECT_DOUBLE_EQ(ParseSlurmDuration("2-00:00:00"), 172800);
  EXPECT_DOUBLE_EQ(ParseSlurmDuration("00:00:01.500"), 1.5);
  EXPECT_LT(ParseSlurmDuration("Unknown"), 0);
  EXPECT_LT(ParseSlurmDuration(""), 0);
}

TEST(SlurmParse, WrapperFiles) {
  auto f = ParseWrapperFiles(std::string("1790000000.250000000 12 node1\n"), false,
                             std::string("143 1790000010.750000000\n"));
  EXPECT_TRUE(f.began);
  EXPECT_DOUBLE_EQ(f.exited_at - f.began_at, 10.5);
  ASSERT_TRUE(f.exit_code);
  EXPECT_EQ(*f.exit_code, 143);
  auto none = ParseWrapperFiles(std::nullopt, false, std::nullopt);
  EXPECT_FALSE(none.began);
  EXPECT_FALSE(none.exit_code);
}

Observation With(const std::string& state, std::optional<int> exit, bool noticed = false,
                 const std::string& reason = "None") {
  Observation o;
  if (!state.empty()) o.job = JobState{"7", state, reason};
  o.files.began = true;
  o.files.exit_code = exit;
  o.files.noticed = noticed;
  return o;
}

TEST(SlurmJudge, TheWrappersExitIsTheTruth) {
  auto v = Judge(With("COMPLETED", 0));
  EXPECT_TRUE(v.finished);
  EXPECT_EQ(v.outcome, Outcome::kSucceeded);
  v = Judge(With("FAILED", 3));
  EXPECT_EQ(v.outcome, Outcome::kFailed);
  EXPECT_NE(v.message.find("code 3"), std::string::npos);
  // A notice before the end: the market took it, however the workload exited (even 0).
  v = Judge(With("COMPLETED", 0, /*noticed=*/true));
  EXPECT_EQ(v.outcome, Outcome::kSpotInterruption);
  v = Judge(With("CANCELLED", 143, true));
  EXPECT_EQ(v.outcome, Outcome::kSpotInterruption);
  v = Judge(With("TIMEOUT", 143));
  EXPECT_EQ(v.outcome, Outcome::kTimeout);
  v = Judge(With("OUT_OF_MEMORY", 137));
  EXPECT_EQ(v.outcome, Outcome::kFailed);
  EXPECT_NE(v.message.find("memory"), std::string::npos);
  v = Judge(With("COMPLETED", 75));
  EXPECT_EQ(v.outcome, Outcome::kInfraError);
  // Slurm still says RUNNING (it lags the wrapper): the exit file decides.
  v = Judge(With("RUNNING", 0));
  EXPECT_TRUE(v.finished);
  EXPECT_EQ(v.outcome, Outcome::kSucceeded);
}

TEST(SlurmJudge, AWorkloadKilledByASignalWaitsForSlurmsWordOnWhy) {
  // The wrapper saw SIGTERM's 143 while Slurm still says RUNNING: preemption, time limit or a
  // node failure look the same from inside; Slurm's final state tells them apart.
  EXPECT_FALSE(Judge(With("RUNNING", 143)).finished);
  EXPECT_FALSE(Judge(With("COMPLETING", 143)).finished);
  EXPECT_EQ(Judge(With("PREEMPTED", 143)).outcome, Outcome::kSpotInterruption);
  EXPECT_EQ(Judge(With("TIMEOUT", 143)).outcome, Outcome::kTimeout);
  auto node = With("NODE_FAIL", 137);
  node.spot_partition = true;
  EXPECT_EQ(Judge(node).outcome, Outcome::kSpotInterruption);
  // Gone from squeue by now: the code is all there is.
  EXPECT_EQ(Judge(With("", 137)).outcome, Outcome::kInfraError);
  EXPECT_EQ(Judge(With("FAILED", 137)).outcome, Outcome::kInfraError);
}

TEST(SlurmJudge, WithoutAnExitFileSlurmsStateSaysWhatHappened) {
  EXPECT_FALSE(Judge(With("RUNNING", std::nullopt)).finished);
  EXPECT_FALSE(Judge(With("PENDING", std::nullopt, false, "Resources")).finished);
  auto v = Judge(With("PREEMPTED", std::nullopt));
  EXPECT_EQ(v.outcome, Outcome::kSpotInterruption);
  auto node = With("NODE_FAIL", std::nullopt);
  EXPECT_EQ(Judge(node).outcome, Outcome::kLost);
  node.spot_partition = true;
  EXPECT_EQ(Judge(node).outcome, Outcome::kSpotInterruption);
  EXPECT_EQ(Judge(With("BOOT_FAIL", std::nullopt)).outcome, Outcome::kCapacityUnavailable);
  EXPECT_EQ(Judge(With("TIMEOUT", std::nullopt)).outcome, Outcome::kTimeout);
  EXPECT_EQ(Judge(With("DEADLINE", std::nullopt)).outcome, Outcome::kTimeout);
  // Held by Slurm after a failed launch: lost, and the job is cancelled.
  v = Judge(With("PENDING", std::nullopt, false, "launch failed requeued held"));
  EXPECT_EQ(v.outcome, Outcome::kLost);
  EXPECT_TRUE(v.cancel_job);
}

TEST(SlurmJudge, CancelledIsOursOnlyIfWeAsked) {
  auto o = With("CANCELLED", std::nullopt);
  o.job->cancelled_by = 0;
  o.gone_for_s = 1;
  auto v = Judge(o);
  EXPECT_EQ(v.outcome, Outcome::kLost);
  EXPECT_NE(v.message.find("by uid 0"), std::string::npos) << v.message;
  o.we_cancelled = true;
  EXPECT_EQ(Judge(o).outcome, Outcome::kCancelled);
  // The wrapper saw the kill (TERM's 143) and Slurm says CANCELLED: someone else's cancel is
  // still lost (retried), not the workload's infra_error; ours is cancelled.
  auto killed = With("CANCELLED", 143);
  v = Judge(killed);
  EXPECT_EQ(v.outcome, Outcome::kLost);
  EXPECT_NE(v.message.find("cancelled outside trnflow"), std::string::npos) << v.message;
  killed.we_cancelled = true;
  EXPECT_EQ(Judge(killed).outcome, Outcome::kCancelled);
}

TEST(SlurmJudge, ImpossiblePendingBecomesCapacityAfterALimit) {
  auto o = With("PENDING", std::nullopt, false, "PartitionNodeLimit");
  o.pending_for_s = 5;
  EXPECT_FALSE(Judge(o).finished);
  o.pending_for_s = kImpossiblePendingSeconds;
  auto v = Judge(o);
  EXPECT_EQ(v.outcome, Outcome::kCapacityUnavailable);
  EXPECT_TRUE(v.cancel_job);
  // Waiting for resources that exist is not impossible, however long.
  o = With("PENDING", std::nullopt, false, "Resources");
  o.pending_for_s = 3600;
  EXPECT_FALSE(Judge(o).finished);
}

TEST(SlurmJudge, GoneWithoutAnExitFileIsLostOnlyAfterAGrace) {
  Observation o;  // not in squeue's answer: gone
  o.files.began = true;
  o.gone_for_s = 1;
  EXPECT_FALSE(Judge(o).finished);  // the exit file may be on its way (shared file system)
  o.gone_for_s = kExitFileGraceSeconds;
  EXPECT_EQ(Judge(o).outcome, Outcome::kLost);
  // A state this code does not know is never success.
  auto odd = With("SPECIAL_EXIT", std::nullopt);
  odd.gone_for_s = 1;
  EXPECT_FALSE(Judge(odd).finished);
  odd.gone_for_s = kExitFileGraceSeconds;
  EXPECT_EQ(Judge(odd).outcome, Outcome::kLost);
}

TEST(SlurmJudge, SlurmUnreachableConcludesNothing) {
  Observation o;
  o.slurm_reachable = false;
  o.gone_for_s = 3600;
  EXPECT_FALSE(Judge(o).finished);
}

TEST(SlurmSubmit, TransientErrorsAreRetriedOthersAreNot) {
  EXPECT_TRUE(TransientSubmitError(
      "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation"));
  EXPECT_TRUE(TransientSubmitError("sbatch: error: Unable to contact slurm controller (connect failure)"));
  EXPECT_FALSE(TransientSubmitError(
      "sbatch: error: Batch job submission failed: Invalid partition name specified"));
}

// The operator's partition map: AWS ParallelCluster's usual layout, and bad files named with
// file:line:col and the fix.
TEST(SlurmPartitions, TheSampleLayoutMapsInstancesMarketsAndDevices) {
  std::vector<Partition> parts;
  ASSERT_EQ(ParsePartitions("partitions:\n"
                            "  trn1: {instance: trn1.32xlarge, gres: neuron, devices: 16, cores_per_device: 2}\n"
                            "  trn1-spot: {instance: trn1.32xlarge, spot: true, gres: neuron, devices: 16, cores_per_device: 2}\n"
                            "  cpu: {instance: c6i.large}\n",
                            "pc.yaml", &parts),
            "");
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(PartitionFor(parts, "trn1.32xlarge", false)->name, "trn1");
  EXPECT_EQ(PartitionFor(parts, "trn1.32xlarge", true)->name, "trn1-spot");
  EXPECT_EQ(PartitionFor(parts, "c6i.large", true)->name, "cpu");  // no spot one: the instance's
  EXPECT_EQ(PartitionFor(parts, "inf2.xlarge", false), nullptr);
  const Partition& trn1 = *PartitionFor(parts, "trn1.32xlarge", false);
  EXPECT_EQ(GresRequest(trn1, 2, 8), "neuron:16");  // multi-node: whole nodes
  EXPECT_EQ(GresRequest(trn1, 1, 0), "neuron:16");  // degree unknown: the whole node
  EXPECT_EQ(GresRequest(trn1, 1, 8), "neuron:4");   // tp 8 on 2 cores per device
  EXPECT_EQ(GresRequest(trn1, 1, 3), "neuron:2");
  EXPECT_EQ(GresRequest(trn1, 1, 64), "neuron:16");  // never more than the node has
  EXPECT_EQ(GresRequest(*PartitionFor(parts, "c6i.large", false), 1, 8), "");
}

// The sample shipped for AWS ParallelCluster's layout parses and maps trn1 as docs say.
TEST(SlurmPartitions, TheParallelClusterSampleMapsTrn1ToSixteenDevices) {
  std::string path = TRNFLOW_SOURCE_DIR "/ops/slurm-partitions.parallelcluster.yaml";
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::vector<Partition> parts;
  ASSERT_EQ(ParsePartitions(text.str(), path, &parts), "");
  const Partition* trn1 = PartitionFor(parts, "trn1.32xlarge", false);
  ASSERT_NE(trn1, nullptr);
  EXPECT_EQ(trn1->name, "compute1");
  EXPECT_EQ(GresRequest(*trn1, 2, 0), "neuron:16");
  EXPECT_EQ(GresRequest(*trn1, 1, 8), "neuron:4");
  EXPECT_EQ(PartitionFor(parts, "trn1.32xlarge", true)->name, "compute1-spot");
  EXPECT_EQ(GresRequest(*PartitionFor(parts, "trn2.48xlarge", false), 1, 64), "neuron:16");
}

TEST(SlurmPartitions, BadFilesAreNamedWithTheirPlaceAndTheFix) {
  std::vector<Partition> parts;
  EXPECT_EQ(ParsePartitions("partitions:\n  trn1: {gres: neuron, devices: 16}\n", "p.yaml", &parts),
            "p.yaml:2:3: partition trn1 has no `instance:`; name the instance type of its nodes "
            "(e.g. trn1.32xlarge)");
  EXPECT_EQ(ParsePartitions("partitions:\n  trn1: {instance: trn1.32xlarge, devices: many}\n",
                            "p.yaml", &parts),
            "p.yaml:2:44: `devices` of partition trn1: expected a whole number (devices 0..1024, "
            "cores 1..1024)");
  EXPECT_EQ(ParsePartitions("partitions:\n  trn1: {instance: trn1.32xlarge, gress: neuron}\n",
                            "p.yaml", &parts),
            "p.yaml:2:35: unknown key `gress`; a partition has instance, spot, gres, devices, "
            "cores_per_device");
  EXPECT_EQ(ParsePartitions("partitions:\n  trn1: {instance: trn1.32xlarge, gres: neuron}\n",
                            "p.yaml", &parts),
            "p.yaml:2:3: partition trn1 has `gres: neuron` but no `devices:`; say how many each "
            "node has (trn1.32xlarge: 16)");
  EXPECT_EQ(ParsePartitions("queues: {}\n", "p.yaml", &parts).substr(0, 11), "p.yaml:1:1:");
  EXPECT_TRUE(parts.empty());
}

// The array limits and the window beside `partitions:`, with their defaults and bad values.
TEST(SlurmPartitions, ArrayLimitsAndTheWindowAreConfigured) {
  std::vector<Partition> parts;
  ArrayLimits lim;
  ASSERT_EQ(ParsePartitions("partitions: {}\n", "a.yaml", &parts, &lim), "");
  EXPECT_EQ(lim.max_array_size, 1000);
  EXPECT_EQ(lim.max_submit_jobs, 0);
  EXPECT_DOUBLE_EQ(lim.window_s, 1);
  ASSERT_EQ(ParsePartitions("partitions: {}\nmax_array_size: 64\nmax_submit_jobs: 120\n"
                            "array_window: 2.5s\n",
                            "a.yaml", &parts, &lim),
            "");
  EXPECT_EQ(lim.max_array_size, 64);
  EXPECT_EQ(lim.max_submit_jobs, 120);
  EXPECT_DOUBLE_EQ(lim.window_s, 2.5);
  EXPECT_EQ(ParsePartitions("partitions: {}\narray_window: 1h\n", "a.yaml", &parts, &lim),
            "a.yaml:2:15: `array_window`: expected a duration above 0 and at most 10m (e.g. 2s): "
            "how long a batch of matrix expansions gathers before its sbatch");
  EXPECT_EQ(ParsePartitions("partitions: {}\narray_window: soon\n", "a.yaml", &parts, &lim)
                .substr(0, 14),
            "a.yaml:2:15: `");
  EXPECT_EQ(ParsePartitions("partitions: {}\nmax_array_size: 0\n", "a.yaml", &parts, &lim),
            "a.yaml:2:17: `max_array_size`: expected a whole number from 1 to 1000000 (below the "
            "cluster's MaxArraySize; 1: no arrays)");
  EXPECT_EQ(ParsePartitions("partitions: {}\narray_windw: 2s\n", "a.yaml", &parts, &lim),
            "a.yaml:2:1: unknown key `array_windw`; the file has `partitions:`, `max_array_size:`, "
            "`max_submit_jobs:`, `array_window:`, `accounts:`, `default_account:` and "
            "`default_qos:`");
}

// The project -> Slurm account (and QOS) map beside the partitions, with its default, and bad
// entries named with file:line:col and the fix.
TEST(SlurmAccounts, EachProjectHasItsAccountAndTheRestTheDefault) {
  SlurmConfig c;
  ASSERT_EQ(ParseSlurmConfig("accounts:\n"
                             "  vision: vision-lab\n"
                             "  nlp: {account: nlp, qos: high}\n"
                             "default_account: lab\n"
                             "default_qos: normal\n",
                             "s.yaml", &c),
            "");
  EXPECT_TRUE(c.partitions.empty());  // a file of accounts alone is a whole file
  EXPECT_EQ(AccountFor(c.accounts, "vision").account, "vision-lab");
  EXPECT_EQ(AccountFor(c.accounts, "vision").qos, "normal");  // the default QOS
  EXPECT_EQ(AccountFor(c.accounts, "nlp").account, "nlp");
  EXPECT_EQ(AccountFor(c.accounts, "nlp").qos, "high");
  EXPECT_EQ(AccountFor(c.accounts, "climate").account, "lab");
  EXPECT_EQ(AccountFor(c.accounts, "climate").qos, "normal");
  // No default: nothing given (the worker's --account, else Slurm's default for the user).
  ASSERT_EQ(ParseSlurmConfig("partitions: {}\naccounts: {vision: v}\n", "s.yaml", &c), "");
  EXPECT_EQ(AccountFor(c.accounts, "nlp").account, "");
  EXPECT_EQ(AccountFor(c.accounts, "nlp").qos, "");

  EXPECT_EQ(ParseSlurmConfig("accounts:\n  vision: {acount: v}\n", "s.yaml", &c),
            "s.yaml:2:12: unknown key `acount`; a project's entry has `account:` and `qos:`");
  EXPECT_EQ(ParseSlurmConfig("accounts:\n  vision: {qos: high}\n", "s.yaml", &c),
            "s.yaml:2:3: project vision has no `account:`; name the Slurm account its jobs are "
            "charged to");
  EXPECT_EQ(ParseSlurmConfig("accounts:\n  vision: 'a b'\n", "s.yaml", &c),
            "s.yaml:2:11: the account of project vision: expected a Slurm account name "
            "(letters, digits, `_`, `-`, `.`), as `sacctmgr show account` lists it");
  EXPECT_EQ(ParseSlurmConfig("accounts:\n  vision: {account: v, qos: [a]}\n", "s.yaml", &c),
            "s.yaml:2:29: `qos` of project vision: expected a Slurm QOS name (letters, digits, "
            "`_`, `-`, `.`), as `sacctmgr show qos` lists it");
  EXPECT_EQ(ParseSlurmConfig("accounts: [vision]\n", "s.yaml", &c).substr(0, 24),
            "s.yaml:1:11: `accounts`:");
  EXPECT_EQ(ParseSlurmConfig("default_acount: lab\n", "s.yaml", &c),
            "s.yaml:1:1: unknown key `default_acount`; the file has `partitions:`, "
            "`max_array_size:`, `max_submit_jobs:`, `array_window:`, `accounts:`, "
            "`default_account:` and `default_qos:`");
  EXPECT_EQ(ParseSlurmConfig("default_qos: {}\n", "s.yaml", &c).substr(0, 27),
            "s.yaml:1:14: `default_qos`:");
}

// What a new attempt does with an earlier attempt's job that no attempt took the result of:
// alive, adopted; finished its work, harvested; ended without finishing it, run again.
TEST(SlurmTakeOver, ALiveJobIsAdoptedAFinishedOneHarvestedALostOneRunAgain) {
  auto state = [](const std::string& s) {
    JobState j;
    j.id = "41";
    j.state = s;
    return std::optional<JobState>(j);
  };
  WrapperFiles none, began = ParseWrapperFiles("1.0 41 node1", false, std::nullopt);
  auto exited = [](int code) {
    return ParseWrapperFiles("1.0 41 node1", false, std::to_string(code) + " 46.0");
  };
  EXPECT_EQ(DecideTakeOver(state("RUNNING"), began, false), TakeOver::kAdopt);
  EXPECT_EQ(DecideTakeOver(state("PENDING"), none, false), TakeOver::kAdopt);
  // Finished, while no worker watched: its end is the attempt's result, whatever it was.
  std::string why;
  EXPECT_EQ(DecideTakeOver(state("COMPLETED"), exited(0), false, &why), TakeOver::kHarvest);
  EXPECT_EQ(DecideTakeOver(std::nullopt, exited(0), false), TakeOver::kHarvest);  // past MinJobAge
  EXPECT_EQ(DecideTakeOver(state("FAILED"), exited(3), false, &why), TakeOver::kHarvest);
  EXPECT_EQ(why, "exited with code 3");
  EXPECT_EQ(DecideTakeOver(state("TIMEOUT"), began, false), TakeOver::kHarvest);
  EXPECT_EQ(DecideTakeOver(state("COMPLETED"), exited(75), false), TakeOver::kHarvest);
  // Ended in Slurm, its exit record not written yet: watched until it comes (or its grace ends).
  EXPECT_EQ(DecideTakeOver(state("COMPLETED"), began, false), TakeOver::kAdopt);
  // Its work not done: a job of its own.
  EXPECT_EQ(DecideTakeOver(state("NODE_FAIL"), began, false, &why), TakeOver::kRunAgain);
  EXPECT_NE(why.find("NODE_FAIL"), std::string::npos);
  EXPECT_EQ(DecideTakeOver(state("PREEMPTED"), exited(143), false), TakeOver::kRunAgain);
  EXPECT_EQ(DecideTakeOver(state("CANCELLED"), exited(143), false), TakeOver::kRunAgain);
  EXPECT_EQ(DecideTakeOver(state("CANCELLED"), none, false), TakeOver::kRunAgain);
  EXPECT_EQ(DecideTakeOver(std::nullopt, began, false), TakeOver::kRunAgain);
  EXPECT_EQ(DecideTakeOver(std::nullopt, none, false), TakeOver::kNone);
  // A notice before the end: an interruption, resumed by a job of its own.
  EXPECT_EQ(DecideTakeOver(state("COMPLETED"),
                           ParseWrapperFiles("1.0 41 node1", true, std::string("0 46.0")), false),
            TakeOver::kRunAgain);
}

// Where billing reads a finished job, from `scontrol show config`: the accounting storage
// (slurmdbd) first, then the completion log sacct -c reads, then none. The first two texts are
// captured from ops/slurm.sh's cluster (Slurm 22.05), with slurmdbd and, before it had one,
// without; the others are written in the same "Key = value" form. (The real-cluster billing
// test shows the slurmdbd path end to end.)
TEST(SlurmBilling, TheSourcesFollowTheClustersAccountingConfig) {
  using Sources = std::vector<std::vector<std::string>>;
  const std::string test_cluster =
      "AccountingStorageBackupHost = (null)\n"
      "AccountingStorageEnforce = none\n"
      "AccountingStorageHost   = localhost\n"
      "AccountingStorageExternalHost = (null)\n"
      "AccountingStorageParameters = (null)\n"
      "AccountingStoragePort   = 19503\n"
      "AccountingStorageTRES   = cpu,mem,energy,node,billing,fs/disk,vmem,pages\n"
      "AccountingStorageType   = accounting_storage/slurmdbd\n"
      "AccountingStorageUser   = N/A\n"
      "JobCompHost             = localhost\n"
      "JobCompLoc              = /var/tmp/trnflow-slurm/log/jobcomp.txt\n"
      "JobCompPort             = 0\n"
      "JobCompType             = jobcomp/filetxt\n"
      "JobCompUser             = root\n";
  AccountingConfig c = ParseAccountingConfig(test_cluster);
  EXPECT_TRUE(c.known);
  EXPECT_EQ(c.storage_type, "accounting_storage/slurmdbd");
  EXPECT_EQ(c.jobcomp_type, "jobcomp/filetxt");
  // Both: slurmdbd first, the completion log when slurmdbd has no record (yet).
  EXPECT_EQ(AccountingSources(c), (Sources{{"sacct"}, {"sacct", "-c"}}));
  // No slurmdbd, a completion log only: sacct -c.
  const std::string jobcomp_only =
      "Configuration data as of 2026-11-27T18:17:41\n"
      "AccountingStorageBackupHost = (null)\n"
      "AccountingStorageEnforce = none\n"
      "AccountingStorageHost   = localhost\n"
      "AccountingStorageTRES   = cpu,mem,energy,node,billing,fs/disk,vmem,pages\n"
      "AccountingStorageType   = accounting_storage/none\n"
      "JobCompHost             = localhost\n"
      "JobCompLoc              = /var/tmp/trnflow-slurm/log/jobcomp.txt\n"
      "JobCompType             = jobcomp/filetxt\n";
  c = ParseAccountingConfig(jobcomp_only);
  EXPECT_TRUE(c.known);
  EXPECT_EQ(c.storage_type, "accounting_storage/none");
  EXPECT_EQ(c.jobcomp_type, "jobcomp/filetxt");
  EXPECT_EQ(AccountingSources(c), (Sources{{"sacct", "-c"}}));
  // A ParallelCluster head node: slurmdbd, no completion log: plain sacct only.
  c = ParseAccountingConfig(
      "AccountingStorageType   = accounting_storage/slurmdbd\nJobCompType             = (null)\n");
  EXPECT_EQ(AccountingSources(c), (Sources{{"sacct"}}));
  // slurmdbd and a completion log in MySQL: the same order.
  c = ParseAccountingConfig(
      "AccountingStorageType = accounting_storage/slurmdbd\nJobCompType = jobcomp/mysql\n");
  EXPECT_EQ(AccountingSources(c), (Sources{{"sacct"}, {"sacct", "-c"}}));
  // Accounting off (or a completion plugin sacct -c cannot read): nothing to ask; the span.
  EXPECT_EQ(AccountingSources(ParseAccountingConfig(
                "AccountingStorageType = accounting_storage/none\nJobCompType = jobcomp/none\n")),
            Sources{});
  EXPECT_EQ(AccountingSources(ParseAccountingConfig(
                "AccountingStorageType = accounting_storage/none\n"
                "JobCompType = jobcomp/elasticsearch\n")),
            Sources{});
  // scontrol did not answer: try both, in that order.
  EXPECT_FALSE(ParseAccountingConfig("").known);
  EXPECT_EQ(AccountingSources(ParseAccountingConfig("")), (Sources{{"sacct"}, {"sacct", "-c"}}));
}

// The bill: Slurm's accounting; the wrapper's finer span only within its one second.
TEST(SlurmBilling, AccountingIsTheSourceAndTheSpanOnlyRefinesIt) {
  JobState acct;
  acct.elapsed_s = 7;
  acct.nodes = 2;
  Billed b = BillFrom(acct, 6.4, 9);
  EXPECT_TRUE(b.from_accounting);
  EXPECT_DOUBLE_EQ(b.seconds, 6.4);  // same measurement, to the nanosecond
  EXPECT_EQ(b.nodes, 2);
  // A span far from what Slurm measured (rewritten, or the job waited in its prolog) is not
  // the bill: accounting is.
  EXPECT_DOUBLE_EQ(BillFrom(acct, 1.0, 9).seconds, 7);
  EXPECT_DOUBLE_EQ(BillFrom(acct, 3600, 9).seconds, 7);
  EXPECT_DOUBLE_EQ(BillFrom(acct, -1, 9).seconds, 7);
  // Accounting off: the wrapper's span, else what the worker watched.
  EXPECT_FALSE(BillFrom(std::nullopt, 6.4, 9).from_accounting);
  EXPECT_DOUBLE_EQ(BillFrom(std::nullopt, 6.4, 9).seconds, 6.4);
  EXPECT_DOUBLE_EQ(BillFrom(std::nullopt, -1, 9).seconds, 9);
  EXPECT_EQ(BillFrom(std::nullopt, 6.4, 9).nodes, 0);
}

}  // namespace
}  // namespace trnflow::workers::slurm
