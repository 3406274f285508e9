#include "workers/slurm.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <vector>

#include "common/duration.h"

namespace trnflow::workers::slurm {
namespace {

std::vector<std::string> Split(const std::string& line, char sep, size_t max_fields) {
  std::vector<std::string> f;
  size_t at = 0;
  while (f.size() + 1 < max_fields) {
    size_t next = line.find(sep, at);
    if (next == std::string::npos) break;
    f.push_back(line.substr(at, next - at));
    at = next + 1;
  }
  f.push_back(line.substr(at));  // the last field keeps any further separators
  return f;
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == ' ' || s.back() == '\n')) s.pop_back();
  size_t b = s.find_first_not_of(' ');
  return b == std::string::npos ? "" : s.substr(b);
}

// "CANCELLED by 0" -> CANCELLED, by = 0; "COMPLETED" -> COMPLETED.
std::string StateWord(const std::string& field, int* by) {
  std::string s = Trim(field);
  size_t sp = s.find(' ');
  if (sp == std::string::npos) return s;
  std::string rest = s.substr(sp + 1);
  if (rest.rfind("by ", 0) == 0 && by) *by = std::atoi(rest.c_str() + 3);
  return s.substr(0, sp);
}

// The jobs of `out`, one per '|'-separated line of at most `fields` fields: `fill` reads a line's
// fields into its job (id and state already read) or refuses the line (false).
template <typename Fill>
std::map<std::string, JobState> ParseJobLines(const std::string& out, size_t fields, Fill fill) {
  std::map<std::string, JobState> jobs;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    line = Trim(line);
    if (line.empty()) continue;
    auto f = Split(line, '|', fields);
    if (f.size() < 2 || f[0].empty()) continue;
    JobState j;
    j.id = Trim(f[0]);
    j.state = StateWord(f[1], &j.cancelled_by);
    if (fill(f, j)) jobs[j.id] = j;
  }
  return jobs;
}

}  // namespace

std::map<std::string, JobState> ParseSqueue(const std::string& out) {
  return ParseJobLines(out, 3, [](const std::vector<std::string>& f, JobState& j) {
    if (f.size() > 2) j.reason = Trim(f[2]);
    return true;
  });
}

double ParseSlurmDuration(const std::string& text) {
  std::string t = Trim(text);
  if (t.empty()) return -1;
  double days = 0;
  if (size_t dash = t.find('-'); dash != std::string::npos) {
    days = std::atof(t.substr(0, dash).c_str());
    t = t.substr(dash + 1);
  }
  std::vector<double> parts;
  for (const auto& p : Split(t, ':', 4)) {
    char* end = nullptr;
    double v = std::strtod(p.c_str(), &end);
    if (p.empty() || end != p.c_str() + p.size()) return -1;
    parts.push_back(v);
  }
  if (parts.empty() || parts.size() > 3) return -1;
  double s = 0;
  for (double v : parts) s = s * 60 + v;  // [[h:]m:]s
  return days * 86400 + s;
}

std::map<std::string, JobState> ParseSacct(const std::string& out) {
  return ParseJobLines(out, 5, [](const std::vector<std::string>& f, JobState& j) {
    if (f.size() < 5 || f[0].find('.') != std::string::npos) return false;  // a step
    j.elapsed_s = ParseSlurmDuration(f[2]);
    j.nodes = std::atoi(f[3].c_str());
    std::string code = Trim(f[4]);
    if (size_t colon = code.find(':'); colon != std::string::npos) {
      j.exit_code = std::atoi(code.substr(0, colon).c_str());
      j.exit_signal = std::atoi(code.substr(colon + 1).c_str());
    }
    return true;
  });
}

WrapperFiles ParseWrapperFiles(const std::optional<std::string>& begin, bool notice,
                               const std::optional<std::string>& exit) {
  WrapperFiles f;
  f.noticed = notice;
  if (begin) {
    f.began = true;
    std::istringstream in(*begin);
    std::string t;
    if (in >> t) {
      char* end = nullptr;
      double v = std::strtod(t.c_str(), &end);
      if (end != t.c_str()) f.began_at = v;
    }
    in >> f.job;
  }
  if (exit) {
    std::istringstream in(*exit);
    int code;
    double t;
    if (in >> code) {
      f.exit_code = code;
      if (in >> t) f.exited_at = t;
    }
  }
  return f;
}

bool ImpossiblePendingReason(const std::string& reason) {
  for (const char* r : {"PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints",
                        "ReqNodeNotAvail", "PartitionDown", "PartitionInactive",
                        "InvalidAccount", "InvalidQOS", "AccountNotAllowed", "QOSMaxNodePerJobLimit",
                        "QOSMaxCpuPerJobLimit", "NodeDown"})
    if (reason.rfind(r, 0) == 0) return true;
  return false;
}

bool TransientSubmitError(const std::string& err) {
  for (const char* s : {"Socket timed out", "Unable to contact", "Connection refused",
                        "Zero Bytes were transmitted", "Slurm temporarily unable",
                        "Resource temporarily unavailable", "Communication connection failure"})
    if (err.find(s) != std::string::npos) return true;
  return false;
}

bool IsMatrixExpansion(const std::string& stage_name) {
  return stage_name.size() > 2 && stage_name.back() == ']' &&
         stage_name.find('[') != std::string::npos;
}

namespace {

// An account or QOS name as sbatch takes it: letters, digits, `_`, `-`, `.`.
bool SlurmName(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.')
      return false;
  return true;
}

}  // namespace

SlurmAccount AccountFor(const AccountMap& map, const std::string& project) {
  auto it = map.projects.find(project);
  if (it == map.projects.end()) return map.fallback;
  SlurmAccount a = it->second;
  if (a.qos.empty()) a.qos = map.fallback.qos;
  return a;
}

std::string ParsePartitions(const std::string& text, const std::string& path,
                            std::vector<Partition>* out, ArrayLimits* limits) {
  SlurmConfig c;
  std::string e = ParseSlurmConfig(text, path, &c);
  if (!e.empty()) return e;
  out->insert(out->end(), c.partitions.begin(), c.partitions.end());
  if (limits) *limits = c.arrays;
  return "";
}

std::string ParseSlurmConfig(const std::string& text, const std::string& path, SlurmConfig* out) {
  auto at = [&](const YAML::Node& n) {
    const YAML::Mark m = n.Mark();
    return path + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1) + ": ";
  };
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return path + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1) +
           ": not YAML (" + e.msg + ")";
  }
  if (!root.IsMap())
    return path +
           ":1:1: expected a mapping: `partitions:` (each Slurm partition to "
           "{instance: TYPE, ...}) and/or `accounts:` (each project to its Slurm "
           "account); see docs/executors.md";
  SlurmConfig cfg;
  ArrayLimits& lim = cfg.arrays;
  // A name-valued key (`default_account: lab`): "" or the error.
  auto name_of = [&](const YAML::Node& v, const std::string& what, std::string* into) {
    if (v.IsScalar() && SlurmName(v.Scalar())) {
      *into = v.Scalar();
      return std::string();
    }
    return at(v) + what + ": expected a Slurm " +
           (what.find("qos") != std::string::npos ? "QOS" : "account") +
           " name (letters, digits, `_`, `-`, `.`), as `sacctmgr show " +
           (what.find("qos") != std::string::npos ? "qos" : "account") + "` lists it";
  };
  for (const auto& kv : root) {
    std::string key = kv.first.as<std::string>();
    if (key == "max_array_size" || key == "max_submit_jobs") {
      int v = -1;
      try {
        v = kv.second.as<int>();
      } catch (const YAML::Exception&) {
      }
      int low = key == "max_array_size" ? 1 : 0;
      if (v < low || v > 1000000)
        return at(kv.second) + "`" + key + "`: expected a whole number from " +
               std::to_string(low) + " to 1000000" +
               (key == "max_array_size" ? " (below the cluster's MaxArraySize; 1: no arrays)"
                                        : " (the site's MaxSubmitJobs; 0: no limit)");
      (key == "max_array_size" ? lim.max_array_size : lim.max_submit_jobs) = v;
    } else if (key == "array_window") {
      std::optional<double> d;
      if (kv.second.IsScalar()) d = ParseDuration(kv.second.Scalar());
      if (!d || *d > 600)
        return at(kv.second) + "`array_window`: expected a duration above 0 and at most 10m (e.g. 2s): "
                               "how long a batch of matrix expansions gathers before its sbatch";
      lim.window_s = *d;
    } else if (key == "default_account") {
      if (auto e = name_of(kv.second, "`default_account`", &cfg.accounts.fallback.account);
          !e.empty())
        return e;
    } else if (key == "default_qos") {
      if (auto e = name_of(kv.second, "`default_qos`", &cfg.accounts.fallback.qos); !e.empty())
        return e;
    } else if (key == "accounts") {
      if (!kv.second.IsMap())
        return at(kv.second) +
               "`accounts`: expected each project mapped to its Slurm account "
               "(`vision: vision-lab`, or `vision: {account: vision-lab, qos: "
               "high}`)";
      for (const auto& p : kv.second) {
        std::string project = p.first.IsScalar() ? p.first.Scalar() : "";
        if (project.empty())
          return at(p.first) + "`accounts`: expected a project's name as the key";
        SlurmAccount a;
        const YAML::Node& v = p.second;
        if (v.IsScalar()) {
          if (auto e = name_of(v, "the account of project " + project, &a.account); !e.empty())
            return e;
        } else if (v.IsMap()) {
          for (const auto& f : v) {
            std::string k = f.first.as<std::string>();
            if (k == "account") {
              if (auto e = name_of(f.second, "`account` of project " + project, &a.account);
                  !e.empty())
                return e;
            } else if (k == "qos") {
              if (auto e = name_of(f.second, "`qos` of project " + project, &a.qos); !e.empty())
                return e;
            } else {
              return at(f.first) + "unknown key `" + k +
                     "`; a project's entry has `account:` and `qos:`";
            }
          }
          if (a.account.empty())
            return at(p.first) + "project " + project +
                   " has no `account:`; name the Slurm "
                   "account its jobs are charged to";
        } else {
          return at(v) + "project " + project +
                 ": expected ACCOUNT or {account: ACCOUNT, qos: QOS}";
        }
        if (!cfg.accounts.projects.emplace(project, a).second)
          return at(p.first) + "project " + project + " is mapped twice";
      }
    } else if (key != "partitions") {
      return at(kv.first) + "unknown key `" + key +
             "`; the file has `partitions:`, `max_array_size:`, `max_submit_jobs:`, "
             "`array_window:`, `accounts:`, `default_account:` and `default_qos:`";
    }
  }
  const YAML::Node partitions = static_cast<const YAML::Node&>(root)["partitions"];
  if (partitions && !partitions.IsMap())
    return at(partitions) +
           "`partitions`: expected each Slurm partition mapped to "
           "{instance: TYPE, ...}; see docs/executors.md";
  std::vector<Partition>* parts = &cfg.partitions;
  for (const auto& kv : partitions) {
    Partition p;
    p.name = kv.first.as<std::string>();
    const YAML::Node& v = kv.second;
    if (!v.IsMap()) return at(v) + "partition " + p.name + ": expected {instance: TYPE, ...}";
    for (const auto& f : v) {
      std::string k = f.first.as<std::string>();
      try {
        if (k == "instance") {
          p.instance = f.second.as<std::string>();
        } else if (k == "spot") {
          p.spot = f.second.as<bool>();
        } else if (k == "gres") {
          p.gres = f.second.as<std::string>();
        } else if (k == "devices") {
          p.devices = f.second.as<int>();
          if (p.devices < 0 || p.devices > 1024) throw YAML::Exception(f.second.Mark(), "");
        } else if (k == "cores_per_device") {
          p.cores_per_device = f.second.as<int>();
          if (p.cores_per_device < 1 || p.cores_per_device > 1024)
            throw YAML::Exception(f.second.Mark(), "");
        } else {
          return at(f.first) + "unknown key `" + k +
                 "`; a partition has instance, spot, gres, devices, cores_per_device";
        }
      } catch (const YAML::Exception&) {
        return at(f.second) + "`" + k + "` of partition " + p.name +
               ": expected " +
               (k == "spot" ? "true or false"
                            : k == "devices" || k == "cores_per_device" ? "a whole number (devices "
                                                                          "0..1024, cores 1..1024)"
                                                                        : "a name");
      }
    }
    if (p.instance.empty())
      return at(kv.first) + "partition " + p.name + " has no `instance:`; name the instance "
                                                    "type of its nodes (e.g. trn1.32xlarge)";
    if (!p.gres.empty() && p.devices == 0)
      return at(kv.first) + "partition " + p.name + " has `gres: " + p.gres +
             "` but no `devices:`; say how many each node has (trn1.32xlarge: 16)";
    parts->push_back(p);
  }
  *out = std::move(cfg);
  return "";
}

const Partition* PartitionFor(const std::vector<Partition>& parts, const std::string& instance,
                              bool spot) {
  for (const auto& p : parts)
    if (p.instance == instance && p.spot == spot) return &p;
  for (const auto& p : parts)
    if (p.instance == instance) return &p;
  return nullptr;
}

std::string GresRequest(const Partition& p, int nodes, int tp) {
  if (p.gres.empty() || p.devices <= 0) return "";
  int n = p.devices;
  if (nodes <= 1 && tp > 0)
    n = std::clamp((tp + p.cores_per_device - 1) / p.cores_per_device, 1, p.devices);
  return p.gres + ":" + std::to_string(n);
}

AccountingConfig ParseAccountingConfig(const std::string& show_config) {
  AccountingConfig c;
  std::istringstream in(show_config);
  for (std::string line; std::getline(in, line);) {
    size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string key = Trim(line.substr(0, eq)), value = Trim(line.substr(eq + 1));
    if (key == "AccountingStorageType") {
      c.storage_type = value;
      c.known = true;
    } else if (key == "JobCompType") {
      c.jobcomp_type = value;
    }
  }
  return c;
}

std::vector<std::vector<std::string>> AccountingSources(const AccountingConfig& c) {
  std::vector<std::vector<std::string>> out;
  if (!c.known || (c.storage_type != "accounting_storage/none" && !c.storage_type.empty() &&
                   c.storage_type != "(null)"))
    out.push_back({"sacct"});
  if (!c.known || c.jobcomp_type == "jobcomp/filetxt" || c.jobcomp_type == "jobcomp/mysql")
    out.push_back({"sacct", "-c"});
  return out;
}

Billed BillFrom(const std::optional<JobState>& acct, double span_s, double watched_s) {
  Billed b;
  if (acct && acct->elapsed_s >= 0) {
    b.from_accounting = true;
    b.nodes = acct->nodes;
    b.seconds = acct->elapsed_s;
    // sacct truncates to the second: a span within [elapsed - 1, elapsed + 1] is the same
    // measurement, finer.
    if (span_s >= 0 && std::fabs(span_s - acct->elapsed_s) <= 1) b.seconds = span_s;
    return b;
  }
  b.seconds = span_s >= 0 ? span_s : std::max(0.0, watched_s);
  return b;
}

namespace {

bool Active(const std::string& s) {
  for (const char* a : {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED",
                        "REQUEUED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"})
    if (s == a) return true;
  return false;
}

Verdict Done(Outcome o, std::string message) {
  Verdict v;
  v.finished = true;
  v.outcome = o;
  v.message = std::move(message);
  return v;
}

}  // namespace

bool ActiveState(const std::string& state) { return Active(state); }

TakeOver DecideTakeOver(const std::optional<JobState>& job, const WrapperFiles& files,
                        bool spot_partition, std::string* why) {
  if (job && Active(job->state)) return TakeOver::kAdopt;
  // Slurm lists it no more and its wrapper never wrote an exit: nothing says how it ended.
  if (!job && !files.exit_code) return files.began ? TakeOver::kRunAgain : TakeOver::kNone;
  Observation o;
  o.job = job;
  o.files = files;
  o.spot_partition = spot_partition;
  Verdict v = Judge(o);  // gone_for_s 0: an exit record on its way is waited for
  if (!v.finished) return TakeOver::kAdopt;
  if (why) *why = v.message;
  switch (v.outcome) {
    case Outcome::kSucceeded:
    case Outcome::kFailed:
    case Outcome::kTimeout:
    case Outcome::kInfraError:
    case Outcome::kUserError:
      return TakeOver::kHarvest;  // the workload's own end (or Slurm's limit): its result
    default:
      return TakeOver::kRunAgain;  // lost, preempted, cancelled: its work is not done
  }
}

Verdict Judge(const Observation& o) {
  const std::string state = o.job ? o.job->state : "";
  const std::string id = o.job ? "job " + o.job->id : "the job";
  // The wrapper's word first: it saw the workload end.
  if (o.files.exit_code) {
    int code = *o.files.exit_code;
    if (o.we_cancelled) return Done(Outcome::kCancelled, "cancelled (scancel)");
    // Killed by a signal while Slurm still has the job: Slurm's final word (PREEMPTED,
    // TIMEOUT, NODE_FAIL) is on its way and says why; wait for it.
    if (code > 128 && !o.files.noticed && o.job && Active(state) &&
        o.gone_for_s < kExitFileGraceSeconds)
      return {};
    if (state == "PREEMPTED") return Done(Outcome::kSpotInterruption, "Slurm preempted " + id);
    if (state == "NODE_FAIL")
      return Done(o.spot_partition ? Outcome::kSpotInterruption : Outcome::kLost,
                  "the node of " + id + " failed (NODE_FAIL)" +
                      (o.spot_partition ? " on a spot partition" : ""));
    if (o.files.noticed)
      return Done(Outcome::kSpotInterruption,
                  "spot interruption: Slurm's notice (USR1) came; the workload exited with code " +
                      std::to_string(code));
    if (state == "TIMEOUT" || state == "DEADLINE")
      return Done(Outcome::kTimeout, "Slurm ended " + id + " at its time limit (" + state + ")");
    if (state == "OUT_OF_MEMORY")
      return Done(Outcome::kFailed, "out of memory: Slurm killed " + id + " (OUT_OF_MEMORY)");
    // Killed because someone else cancelled the job (scancel, an operator): not the workload's
    // error, the same as a cancel before the wrapper could record anything.
    if (state == "CANCELLED" && code > 128)
      return Done(Outcome::kLost, id + " was cancelled outside trnflow" +
                                      (o.job->cancelled_by >= 0
                                           ? " (by uid " + std::to_string(o.job->cancelled_by) + ")"
                                           : ""));
    if (code == 0) return Done(Outcome::kSucceeded, "");
    if (code == 75) return Done(Outcome::kInfraError, "exited with code 75 (retry)");
    if (code > 128)
      return Done(Outcome::kInfraError, "killed by signal " + std::to_string(code - 128));
    return Done(Outcome::kFailed, "exited with code " + std::to_string(code));
  }
  if (!o.slurm_reachable) return {};  // unknown: keep the lease, conclude nothing
  if (o.job && Active(state)) {
    if (state == "PENDING") {
      if (o.job->reason.find("held") != std::string::npos) {
        Verdict v = Done(Outcome::kLost, "Slurm held " + id + " (" + o.job->reason + ")");
        v.cancel_job = true;
        return v;
      }
      if (ImpossiblePendingReason(o.job->reason) && o.pending_for_s >= kImpossiblePendingSeconds) {
        Verdict v = Done(Outcome::kCapacityUnavailable,
                         "Slurm cannot place " + id + ": pending with reason " + o.job->reason);
        v.cancel_job = true;
        return v;
      }
    }
    return {};
  }
  // Ended in Slurm (or gone from squeue) without the wrapper's exit file.
  if (state == "PREEMPTED") return Done(Outcome::kSpotInterruption, "Slurm preempted " + id);
  if (state == "NODE_FAIL")
    return Done(o.spot_partition ? Outcome::kSpotInterruption : Outcome::kLost,
                "the node of " + id + " failed (NODE_FAIL)" +
                    (o.spot_partition ? " on a spot partition" : ""));
  if (state == "BOOT_FAIL")
    return Done(Outcome::kCapacityUnavailable, "the node of " + id + " failed to boot");
  if (state == "TIMEOUT" || state == "DEADLINE")
    return Done(Outcome::kTimeout, "Slurm ended " + id + " at its time limit (" + state + ")");
  if (state == "OUT_OF_MEMORY")
    return Done(Outcome::kFailed, "out of memory: Slurm killed " + id + " (OUT_OF_MEMORY)");
  if (state == "CANCELLED") {
    if (o.we_cancelled) return Done(Outcome::kCancelled, "cancelled (scancel)");
    if (o.files.noticed)
      return Done(Outcome::kSpotInterruption, "spot interruption: notice, then " + id +
                                                  " was cancelled");
    return Done(Outcome::kLost, id + " was cancelled outside trnflow" +
                                    (o.job && o.job->cancelled_by >= 0
                                         ? " (by uid " + std::to_string(o.job->cancelled_by) + ")"
                                         : ""));
  }
  if (o.files.noticed && o.gone_for_s >= 0)
    return Done(Outcome::kSpotInterruption,
                "spot interruption: notice, then " + id + " ended (" +
                    (state.empty() ? "gone" : state) + ")");
  if (o.job && !state.empty() && state != "COMPLETED" && state != "FAILED") {
    // A state this code does not know: never taken for success; wait, the caller logs it.
    if (o.gone_for_s < kExitFileGraceSeconds) return {};
    return Done(Outcome::kLost, id + " ended in Slurm state " + state + " without an exit record");
  }
  if (o.gone_for_s < kExitFileGraceSeconds) return {};  // the exit file may still be on its way
  return Done(Outcome::kLost, id + (state.empty() ? " is gone from Slurm" : " ended (" + state + ")") +
                                  " without its wrapper's exit record");
}

}  // namespace trnflow::workers::slurm
