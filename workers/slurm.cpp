#include "workers/slurm.h"

#include <cstdlib>
#include <sstream>
#include <vector>

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

}  // namespace

std::map<std::string, JobState> ParseSqueue(const std::string& out) {
  std::map<std::string, JobState> jobs;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    line = Trim(line);
    if (line.empty()) continue;
    auto f = Split(line, '|', 3);
    if (f.size() < 2 || f[0].empty()) continue;
    JobState j;
    j.id = Trim(f[0]);
    j.state = StateWord(f[1], &j.cancelled_by);
    if (f.size() > 2) j.reason = Trim(f[2]);
    jobs[j.id] = j;
  }
  return jobs;
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
  std::map<std::string, JobState> jobs;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    line = Trim(line);
    if (line.empty()) continue;
    auto f = Split(line, '|', 5);
    if (f.size() < 5 || f[0].find('.') != std::string::npos) continue;  // a step
    JobState j;
    j.id = Trim(f[0]);
    j.state = StateWord(f[1], &j.cancelled_by);
    j.elapsed_s = ParseSlurmDuration(f[2]);
    j.nodes = std::atoi(f[3].c_str());
    std::string code = Trim(f[4]);
    if (size_t colon = code.find(':'); colon != std::string::npos) {
      j.exit_code = std::atoi(code.substr(0, colon).c_str());
      j.exit_signal = std::atoi(code.substr(colon + 1).c_str());
    }
    jobs[j.id] = j;
  }
  return jobs;
}

WrapperFiles ParseWrapperFiles(const std::optional<std::string>& begin, bool notice,
                               const std::optional<std::string>& exit) {
  WrapperFiles f;
  f.noticed = notice;
  if (begin) {
    f.began = true;
    char* end = nullptr;
    double t = std::strtod(begin->c_str(), &end);
    if (end != begin->c_str()) f.began_at = t;
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
