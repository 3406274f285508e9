#include "workers/stage_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/sha256.h"
#include "workers/artifact_store.h"

namespace fs = std::filesystem;

namespace trnflow::workers {
namespace {

// Whether anyone could read `dir`: every directory from / to it lets others search it, and it
// lets them read. The worker runs as root and the workdir is the submitter's choice: a
// command's named files are hashed only where any uid could read them anyway, never inside
// another project's run directory or a root-only tree.
bool OpenToAll(const fs::path& dir) {
  if (!dir.is_absolute()) return false;
  fs::path walk = "/";
  for (const auto& part : dir.lexically_normal()) {
    if (part != "/") walk /= part;
    struct stat st;
    if (::stat(walk.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || !(st.st_mode & S_IXOTH))
      return false;
  }
  struct stat st;
  return ::stat(dir.c_str(), &st) == 0 && (st.st_mode & S_IROTH);
}

// The digest of the file `rel` beneath the open directory `dir`, or "" when it is not a
// regular file everyone may read (opened by the kernel beneath `dir`: no `..` or link out of
// it, no other mount; O_NONBLOCK, so a FIFO planted there cannot stall the worker).
std::string WorldReadableDigest(int dir, const std::string& rel, uintmax_t max_bytes) {
  int fd = OpenBeneath(dir, rel, O_RDONLY | O_NONBLOCK | O_NOFOLLOW);
  if (fd < 0) return "";
  struct stat st;
  std::string digest;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & S_IROTH) &&
      static_cast<uintmax_t>(st.st_size) <= max_bytes) {
    try {
      digest = Sha256FdHex(fd, rel);
    } catch (const std::runtime_error&) {  // unreadable: not a file the command reads
    }
  }
  ::close(fd);
  return digest;
}

// Files the command names (a script, a config) inside its working directory, the only part of
// the host's files a command sees besides the system, by the digest of their contents, so
// editing one is a new key. Words are whitespace-separated, `--opt=path` counts its value;
// paths in the run's directory are left to the upstream digests.
nlohmann::json NamedFiles(const CommandSpec& cmd, const std::string& workdir) {
  constexpr uintmax_t kMaxBytes = 256u << 20;
  nlohmann::json files = nlohmann::json::object();
  if (!OpenToAll(workdir)) return files;
  int dir = ::open(workdir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return files;
  const fs::path root = fs::path(workdir).lexically_normal();
  for (const auto& arg : cmd.argv) {
    std::istringstream words(arg);
    for (std::string w; words >> w;) {
      for (std::string c : {w, w.find('=') == std::string::npos ? "" : w.substr(w.find('=') + 1)}) {
        while (!c.empty() && (c.front() == '"' || c.front() == '\'')) c.erase(0, 1);
        while (!c.empty() && (c.back() == '"' || c.back() == '\'' || c.back() == ';')) c.pop_back();
        if (c.empty() || c.find("${{") != std::string::npos || files.contains(c)) continue;
        fs::path p(c);
        if (p.is_absolute()) p = p.lexically_normal().lexically_relative(root);
        p = p.lexically_normal();
        if (p.empty() || *p.begin() == ".." || p.is_absolute()) continue;
        if (std::string d = WorldReadableDigest(dir, p.string(), kMaxBytes); !d.empty())
          files[c] = d;
      }
    }
  }
  ::close(dir);
  return files;
}

}  // namespace

std::string StageCacheInputs(const StageSpec& spec,
                             const std::vector<std::pair<std::string, std::string>>& consumed,
                             const std::string& workdir, int64_t run_id,
                             const std::string& project) {
  nlohmann::json parameters;
  if (spec.kind == StageKind::kRun) {
    parameters = {{"command", spec.command.argv},
                  {"shell", spec.command.shell},
                  {"env", spec.command.env},
                  {"secrets", spec.command.secrets},  // names: values never reach the catalog
                  {"outputs", spec.command.outputs ? nlohmann::json(*spec.command.outputs)
                                                   : nlohmann::json::array()},
                  {"files", NamedFiles(spec.command, workdir)}};
    auto mentions_run_id = [](const std::string& s) {
      return s.find("${{ run.id }}") != std::string::npos;
    };
    bool per_run = std::any_of(spec.command.argv.begin(), spec.command.argv.end(), mentions_run_id);
    for (const auto& [k, v] : spec.command.env) per_run = per_run || mentions_run_id(v);
    if (per_run) parameters["run_id"] = run_id;
  } else {
    parameters = nlohmann::json::parse(spec.workload_json);
  }
  nlohmann::json inputs = nlohmann::json::object();
  for (const auto& [name, digest] : consumed) inputs[name] = digest;
  nlohmann::json j = {{"kind", ToString(spec.kind)},
                      {"parameters", parameters},
                      {"inputs", inputs},
                      {"project", project}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace trnflow::workers
