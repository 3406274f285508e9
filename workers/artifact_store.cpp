#include "workers/artifact_store.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "common/sha256.h"

namespace fs = std::filesystem;

namespace trnflow::workers {

StoredArtifact WriteArtifact(const std::string& home, const std::string& cache_key,
                             const std::string& cache_inputs, double parameters) {
  // A real NEFF holds instructions and weights layout for its shapes; ours is a header, the
  // key's inputs, and filler sized at ~1 byte per 10,000 parameters (4 KiB to 4 MiB).
  std::string neff = "NEFF\x01 simulated\n" + cache_key + "\n" + cache_inputs + "\n";
  size_t size = static_cast<size_t>(std::clamp(parameters / 1e4, 4096.0, 4.0 * (1 << 20)));
  while (neff.size() < size) neff += cache_key;
  neff.resize(size);
  StoredArtifact a;
  a.digest = Sha256Hex(neff);
  a.bytes = static_cast<int64_t>(neff.size());
  fs::path dir = fs::path(home) / "artifacts" / a.digest.substr(0, 2) / a.digest;
  a.path = dir.string();
  if (VerifyArtifact(a.path, a.digest)) return a;  // the same bytes are already there
  fs::create_directories(dir.parent_path());
  fs::path tmp = dir.parent_path() / (".tmp-" + a.digest + "-" + std::to_string(getpid()) + "-" +
                                      std::to_string(reinterpret_cast<uintptr_t>(&a)));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  {
    std::ofstream out(tmp / "model.neff", std::ios::binary);
    out.write(neff.data(), static_cast<std::streamsize>(neff.size()));
    std::ofstream manifest(tmp / "manifest.json");
    manifest << cache_inputs << "\n";
    if (!out || !manifest) throw std::runtime_error("cannot write " + tmp.string());
  }
  std::ofstream(tmp / "done") << a.digest << "\n";
  std::error_code ec;
  fs::remove_all(dir, ec);  // a corrupt or half-written entry of the same digest
  fs::rename(tmp, dir, ec);
  if (ec && !VerifyArtifact(a.path, a.digest))
    throw std::runtime_error("cannot place " + dir.string() + ": " + ec.message());
  fs::remove_all(tmp, ec);
  return a;
}

bool VerifyArtifact(const std::string& path, const std::string& digest) {
  if (path.empty() || digest.empty()) return false;
  fs::path dir(path);
  std::error_code ec;
  if (!fs::exists(dir / "done", ec) || !fs::exists(dir / "model.neff", ec)) return false;
  std::ifstream in(dir / "model.neff", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return Sha256Hex(bytes) == digest;
}

void RemoveArtifact(const std::string& path) {
  std::error_code ec;
  if (!path.empty()) fs::remove_all(path, ec);
}

}  // namespace trnflow::workers
