#include "workers/artifact_store.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>

#include "common/sha256.h"

namespace fs = std::filesystem;

namespace trnflow::workers {

namespace {

// Moves a filled temporary directory into the store as the entry of `a.digest`.
void PlaceEntry(const fs::path& tmp, StoredArtifact& a, const std::string& home,
                const std::string& cache_inputs) {
  fs::path dir = fs::path(home) / "artifacts" / a.digest.substr(0, 2) / a.digest;
  a.path = dir.string();
  {
    std::ofstream manifest(tmp / "manifest.json");
    manifest << cache_inputs << "\n";
    if (!manifest) throw std::runtime_error("cannot write " + tmp.string());
  }
  std::ofstream(tmp / "done") << a.digest << "\n";
  std::error_code ec;
  if (VerifyArtifact(a.path, a.digest)) {  // the same contents are already there
    fs::remove_all(tmp, ec);
    return;
  }
  fs::create_directories(dir.parent_path());
  fs::remove_all(dir, ec);  // a corrupt or half-written entry of the same digest
  fs::rename(tmp, dir, ec);
  if (ec && !VerifyArtifact(a.path, a.digest))
    throw std::runtime_error("cannot place " + dir.string() + ": " + ec.message());
  fs::remove_all(tmp, ec);
}

fs::path NewTemp(const std::string& home, const void* salt) {
  fs::path tmp = fs::path(home) / "artifacts" /
                 (".tmp-" + std::to_string(getpid()) + "-" +
                  std::to_string(reinterpret_cast<uintptr_t>(salt)) + "-" +
                  std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  return tmp;
}

}  // namespace

std::string OutputsDigest(const std::string& root, const std::vector<std::string>& rels) {
  std::map<std::string, std::string> files;  // relative path -> sha256, in path order
  fs::path base(root);
  auto add = [&](const fs::path& p) {
    files[fs::relative(p, base).generic_string()] = Sha256FileHex(p.string());
  };
  for (const auto& rel : rels) {
    fs::path p = base / rel;
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) {
      add(p);
    } else if (fs::is_directory(p, ec)) {
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file()) add(e.path());
    } else {
      throw std::runtime_error("declared output ${{ run.dir }}/" + rel + " was not written");
    }
  }
  std::string text;
  for (const auto& [path, sha] : files) text += path + '\0' + sha + '\n';
  return Sha256Hex(text);
}

StoredArtifact StoreOutputs(const std::string& home, const std::string& cache_inputs,
                            const std::string& root, const std::vector<std::string>& rels) {
  StoredArtifact a;
  fs::path tmp = NewTemp(home, &a);
  try {
    fs::create_directories(tmp / "outputs");
    for (const auto& rel : rels) {
      fs::path from = fs::path(root) / rel, to = tmp / "outputs" / rel;
      if (!fs::exists(from))
        throw std::runtime_error("declared output ${{ run.dir }}/" + rel + " was not written");
      fs::create_directories(to.parent_path());
      fs::copy(from, to, fs::copy_options::recursive);
    }
    // The digest is of the copies: what is stored is what was hashed.
    a.digest = OutputsDigest((tmp / "outputs").string(), {"."});
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
    throw;
  }
  for (const auto& e : fs::recursive_directory_iterator(tmp / "outputs"))
    if (e.is_regular_file()) a.bytes += static_cast<int64_t>(e.file_size());
  PlaceEntry(tmp, a, home, cache_inputs);
  return a;
}

void RestoreOutputs(const std::string& path, const std::string& root) {
  fs::path from = fs::path(path) / "outputs";
  fs::create_directories(root);
  for (const auto& e : fs::directory_iterator(from)) {
    fs::path to = fs::path(root) / e.path().filename();
    fs::remove_all(to);
    fs::copy(e.path(), to, fs::copy_options::recursive);
  }
}

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
  fs::path tmp = NewTemp(home, &a);
  {
    std::ofstream out(tmp / "model.neff", std::ios::binary);
    out.write(neff.data(), static_cast<std::streamsize>(neff.size()));
    if (!out) throw std::runtime_error("cannot write " + tmp.string());
  }
  PlaceEntry(tmp, a, home, cache_inputs);
  return a;
}

bool VerifyArtifact(const std::string& path, const std::string& digest) {
  if (path.empty() || digest.empty()) return false;
  fs::path dir(path);
  std::error_code ec;
  if (!fs::exists(dir / "done", ec)) return false;
  try {
    if (fs::exists(dir / "model.neff", ec))
      return Sha256FileHex((dir / "model.neff").string()) == digest;
    if (fs::is_directory(dir / "outputs", ec))
      return OutputsDigest((dir / "outputs").string(), {"."}) == digest;
  } catch (const std::exception&) {
  }
  return false;
}

void RemoveArtifact(const std::string& path) {
  std::error_code ec;
  if (!path.empty()) fs::remove_all(path, ec);
}

}  // namespace trnflow::workers
