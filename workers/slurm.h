#pragma once
// What the Slurm executor reads from Slurm and from its job wrapper, and how it judges an
// attempt from them. Pure: no processes, no clock; tests feed it captured output.
//
// Slurm's state alone cannot tell a preemption from a normal exit, nor a job that died from one
// whose wrapper has not written yet: the wrapper's files (begin, notice, exit, written
// atomically in the attempt's directory) are the truth, and Slurm's state says what happened
// when the wrapper could not write (node lost, time limit, cancelled before it started).
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/stage_spec.h"

namespace trnflow::workers::slurm {

// One job as `squeue -h -t all -o '%i|%T|%r'` or `sacct -P -n -o jobid,state,elapsed,nnodes,
// exitcode` reports it.
struct JobState {
  std::string id;
  std::string state;   // COMPLETED, RUNNING, CANCELLED (without " by N"), ...
  std::string reason;  // squeue's %r ("None", "Resources", "launch failed requeued held")
  int cancelled_by = -1;  // sacct's "CANCELLED by 0": the uid that cancelled, else -1
  double elapsed_s = -1;  // sacct: wall time the job ran; -1 unknown
  int nodes = 0;          // sacct: nodes it ran on; 0 unknown
  int exit_code = -1;     // sacct's ExitCode "2:0" -> 2; -1 unknown
  int exit_signal = 0;    // ... "0:9" -> 9
};

// `squeue -h -t all -j A,B -o '%i|%T|%r'`: one line per job; a reason may hold spaces. Job ids
// missing from the answer are gone (finished longer ago than MinJobAge), not errors.
std::map<std::string, JobState> ParseSqueue(const std::string& out);

// `sacct -P -n -o jobid,state,elapsed,nnodes,exitcode` (or `sacct -c` on jobcomp/filetxt):
// the allocation's line per job; step lines (1.batch, 1.0) are skipped.
std::map<std::string, JobState> ParseSacct(const std::string& out);

// "1-02:03:04", "02:03:04", "03:04", "00:00:01.500" -> seconds; -1 if unreadable.
double ParseSlurmDuration(const std::string& text);

// What the job wrapper left in the attempt's directory.
struct WrapperFiles {
  bool began = false;          // begin: the workload started
  bool noticed = false;        // notice: USR1 came (the 2-minute warning) before it ended
  std::string job;             // begin's SLURM_JOB_ID: an array task's own (raw) job id
  std::optional<int> exit_code;  // exit: the workload's code (128 + N when killed by signal N)
  double began_at = -1, exited_at = -1;  // their Unix times (to the nanosecond), -1 unknown
};

// The files' text: begin is "UNIXTIME [JOBID NODE]", exit is "CODE UNIXTIME".
WrapperFiles ParseWrapperFiles(const std::optional<std::string>& begin, bool notice,
                               const std::optional<std::string>& exit);

// One look at an attempt: Slurm's answer for its job (nullopt: not in squeue's answer, gone)
// and the wrapper's files.
struct Observation {
  std::optional<JobState> job;
  WrapperFiles files;
  bool slurm_reachable = true;  // false: squeue failed; nothing is concluded
  bool spot_partition = false;  // NODE_FAIL there is the market taking the node back
  bool we_cancelled = false;    // this worker asked scancel (cancel, budget stop)
  double gone_for_s = 0;        // how long the job has been finished in Slurm without an exit file
  double pending_for_s = 0;     // how long it has been PENDING
};

struct Verdict {
  bool finished = false;  // false: keep watching (the lease is kept)
  Outcome outcome = Outcome::kSucceeded;
  std::string message;
  bool cancel_job = false;  // scancel it first (held, or pending for good)
};

// Grace for the wrapper's exit file after Slurm says the job ended (shared file systems lag).
inline constexpr double kExitFileGraceSeconds = 30;
// A job pending for a reason that will not change by itself is refused capacity after this.
inline constexpr double kImpossiblePendingSeconds = 60;

Verdict Judge(const Observation& o);

// A job Slurm has not ended yet (pending, running, completing, suspended, ...).
bool ActiveState(const std::string& state);

// What a new attempt does with the job of an earlier attempt whose result no attempt has taken
// (its worker died, or handed the stage back), found in Slurm (`job`; nullopt: Slurm lists it
// no more) and in its wrapper's files:
enum class TakeOver {
  kNone,      // nothing of it ran: submit a job of its own
  kAdopt,     // still in Slurm's hands (or its end not yet written): watch it as its own job
  kHarvest,   // it finished its work: its exit, output and accounting are this attempt's result
  kRunAgain,  // it ended without finishing its work (node lost, preempted, cancelled by
              // someone, gone without an exit record): submit a job of its own
};
// `why` (may be null) gets the judgement's message for a job that ended.
TakeOver DecideTakeOver(const std::optional<JobState>& job, const WrapperFiles& files,
                        bool spot_partition, std::string* why = nullptr);

// True for squeue reasons that waiting cannot fix (the request exceeds what the partition or
// its nodes can ever give).
bool ImpossiblePendingReason(const std::string& reason);

// sbatch's error output: true when trying again may work (the controller did not answer).
bool TransientSubmitError(const std::string& err);

// One Slurm partition as the operator maps it (`trnflow worker --slurm-config FILE`): what
// its nodes are (the instance type whose price bills them) and the devices each node has.
struct Partition {
  std::string name;      // Slurm's partition name
  std::string instance;  // e.g. trn1.32xlarge: stages of this instance type go here
  bool spot = false;     // spot capacity: stages on the spot market go here, a NODE_FAIL is
                         // an interruption
  std::string gres;      // the GRES name of a node's devices ("neuron"); "": none requested
  int devices = 0;       // devices per node (trn1.32xlarge: 16)
  int cores_per_device = 1;  // NeuronCores per device (trn1: 2): a tp degree's devices
};

// How matrix stages go out as job arrays: at most `max_array_size` tasks an array (below the
// cluster's MaxArraySize), and at most `max_submit_jobs` jobs of this worker queued or running
// at once (the site's MaxSubmitJobs; an array task counts as a job; 0: no limit). Attempts
// that ask within `window_s` of a batch's first one join it: a longer window makes fewer,
// larger arrays out of expansions claimed in trickles, at the cost of that much delay.
struct ArrayLimits {
  int max_array_size = 1000;
  int max_submit_jobs = 0;
  double window_s = 1;
};

// What a project's jobs are charged to in Slurm (`sbatch --account`, `--qos`): the site's
// fairshare, QOS limits and `sshare` then see each project as its own. "": not given (Slurm's
// default for the submitting user).
struct SlurmAccount {
  std::string account;
  std::string qos;
};

// The project -> account map of --slurm-config, and the default for projects it does not
// name (`default_account:`/`default_qos:`, else the worker's --account).
struct AccountMap {
  std::map<std::string, SlurmAccount> projects;
  SlurmAccount fallback;
};

// The account and QOS a job of `project` goes in under: the project's entry, else the
// fallback; a project entry without a QOS takes the fallback's.
SlurmAccount AccountFor(const AccountMap& map, const std::string& project);

// The whole --slurm-config file.
struct SlurmConfig {
  std::vector<Partition> partitions;
  ArrayLimits arrays;
  AccountMap accounts;
};

// The --slurm-config file (YAML); every key optional:
//   partitions:
//     NAME: {instance: TYPE, spot: BOOL, gres: NAME, devices: N, cores_per_device: N}
//   max_array_size: N     (default 1000; 1: no arrays)
//   max_submit_jobs: N    (default 0: no limit)
//   array_window: DURATION (default 1s; above 0, at most 10m)
//   accounts:
//     PROJECT: ACCOUNT                      (or)
//     PROJECT: {account: ACCOUNT, qos: QOS}
//   default_account: ACCOUNT  (projects not in `accounts:`; default: --account)
//   default_qos: QOS
// Returns "" or an error as `path:line:col: what; the fix`.
std::string ParseSlurmConfig(const std::string& text, const std::string& path, SlurmConfig* out);

// The partitions and array limits of a --slurm-config file (ParseSlurmConfig's).
std::string ParsePartitions(const std::string& text, const std::string& path,
                            std::vector<Partition>* out, ArrayLimits* limits = nullptr);

// A matrix expansion ("sweep[i=3]"): attempts of these go out as array tasks.
bool IsMatrixExpansion(const std::string& stage_name);

// The partition for a stage of `instance` on `spot` (or not) capacity: the one mapped to that
// instance and market, else the one mapped to the instance; nullptr when none is.
const Partition* PartitionFor(const std::vector<Partition>& parts, const std::string& instance,
                              bool spot);

// The --gres value for a node of `p` running a stage of `nodes` nodes whose tensor-parallel
// degree is `tp` (0: unknown): every device of the node for a multi-node stage or an unknown
// degree, else the devices tp NeuronCores need (at most the node's). "" when `p` maps no GRES.
std::string GresRequest(const Partition& p, int nodes, int tp);

// Where the cluster keeps finished jobs' records, as `scontrol show config` says.
struct AccountingConfig {
  bool known = false;        // false: scontrol did not answer (every source is tried)
  std::string storage_type;  // AccountingStorageType: accounting_storage/slurmdbd, .../none
  std::string jobcomp_type;  // JobCompType: jobcomp/filetxt, jobcomp/mysql, jobcomp/none, ...
};
// `scontrol show config`'s "Key = value" lines; the two keys above.
AccountingConfig ParseAccountingConfig(const std::string& show_config);

// The sacct commands (without -j and -o) that can hold a finished job's record, in the order
// billing asks them: `sacct` (the accounting storage, slurmdbd) when AccountingStorageType is
// not accounting_storage/none, then `sacct -c` when JobCompType is one `sacct -c` reads
// (jobcomp/filetxt, jobcomp/mysql; elasticsearch, kafka, lua and script keep no record it can
// read). Empty: accounting is off, and the wrapper's span is the bill. An unknown config tries
// both.
std::vector<std::vector<std::string>> AccountingSources(const AccountingConfig& c);

// What an attempt is billed for, in wall seconds, and on how many nodes. Slurm's accounting
// (`acct`, from sacct) is the source: its elapsed time (whole seconds) and node count. The
// wrapper's own span (begin to exit, to the nanosecond, `span_s`; < 0 unknown) refines it only
// within accounting's one-second resolution, so a job that rewrote the wrapper's files could
// never move the bill beyond what Slurm measured. Without accounting, the wrapper's span; else
// `watched_s`, what the worker saw.
struct Billed {
  double seconds = 0;
  int nodes = 0;            // 0: unknown (bill the instances asked for)
  bool from_accounting = false;
};
Billed BillFrom(const std::optional<JobState>& acct, double span_s, double watched_s);

}  // namespace trnflow::workers::slurm
