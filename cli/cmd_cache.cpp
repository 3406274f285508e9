// trnflow cache ls / show / rm / verify / gc / why / trust / untrust: the artifact cache
// (compiled graphs and stages with cache: true). Deletion goes through RemoveArtifact, which
// refuses any path the catalog names outside the store: a row is data, not an instruction.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "common/bytes.h"
#include "common/duration.h"
#include "common/env.h"
#include "common/error.h"
#include "common/sha256.h"
#include "workers/artifact_store.h"

namespace trnflow::cli {
namespace {

// "llama-2-7b", "b8 s2048 tp2", "inf2" from a compile's manifest (the key's inputs); for
// another cached stage, its model or program, its kind, and "-".
struct Described {
  std::string model, shapes, target;
};

Described Describe(const std::string& manifest) {
  auto j = nlohmann::json::parse(manifest, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return {"?", "?", "?"};
  if (j.contains("parameters") && j["parameters"].is_object()) {
    const auto& p = j["parameters"];
    std::string what = "?";
    if (p.contains("model") && p["model"].is_object())
      what = p["model"].value("name", "?");
    else if (p.contains("command") && p["command"].is_array() && !p["command"].empty())
      what = p["command"][0].get<std::string>().substr(0, 40);
    return {what, j.value("kind", "?"), "-"};
  }
  return {j["model"].value("name", "?"),
          "b" + std::to_string(j.value("batch", 0)) + " s" + std::to_string(j.value("seq_len", 0)) +
              " tp" + std::to_string(j.value("tp_degree", 0)),
          j.value("target", "?")};
}

// A row whose path is not in the store was not written by a worker: its files are left alone.
std::string OutsideStore(const std::string& key, const std::string& path) {
  return "entry " + key.substr(0, 12) + " names a path outside the store (" + HomeDir() +
         "/artifacts/): " + path + "; removed from the catalog, nothing deleted";
}

std::string Bytes(int64_t b) {
  char buf[32];
  if (b >= (1 << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / 1048576.0);
  else
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024.0);
  return buf;
}

// The one entry whose key starts with `prefix` (at least 6 characters).
// An entry by (a prefix of) its key, or of its digest: run messages name entries by digest
// ("compiled graph 3f2a... from the cache"), `cache ls` by key.
schema::ArtifactRow FindEntry(schema::Catalog& c, const std::string& prefix) {
  if (prefix.size() < 6) throw UserError("give at least 6 characters of the key or digest");
  std::vector<schema::ArtifactRow> found;
  for (auto& a : c.ListArtifacts())
    if (a.key.rfind(prefix, 0) == 0 || (!a.digest.empty() && a.digest.rfind(prefix, 0) == 0))
      found.push_back(std::move(a));
  if (found.empty())
    throw UserError("no cache entry whose key or digest starts with " + prefix +
                    "; `trnflow cache ls` lists them");
  if (found.size() > 1) throw UserError(prefix + " is ambiguous; give more of it");
  return found[0];
}

}  // namespace

int CmdCacheList() {
  auto catalog = OpenCatalog();
  std::vector<std::vector<std::string>> rows;
  int64_t total = 0;
  for (const auto& a : catalog->ListArtifacts()) {
    Described d = Describe(a.manifest_json);
    rows.push_back({a.key.substr(0, 12), d.model, d.shapes, d.target, a.state, Bytes(a.bytes),
                    std::to_string(a.hits), a.last_used_at.substr(0, 19)});
    total += a.bytes;
  }
  if (rows.empty()) {
    std::cout << "the cache is empty\n";
    return kExitOk;
  }
  std::cout << Table({"KEY", "MODEL", "SHAPES", "TARGET", "STATE", ">BYTES", ">HITS", "LAST USE"},
                     rows)
            << "\n"
            << rows.size() << " entries, " << Bytes(total) << "\n";
  return kExitOk;
}

int CmdCacheShow(const std::string& key) {
  auto catalog = OpenCatalog();
  auto a = FindEntry(*catalog, key);
  nlohmann::ordered_json j = {
      {"key", a.key},
      {"state", a.state},
      {"digest", a.digest},
      {"bytes", a.bytes},
      {"path", a.path},
      {"project", a.project.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.project)},
      {"hits", a.hits},
      {"created_at", a.created_at},
      {"last_used_at", a.last_used_at},
      {"inputs", nlohmann::json::parse(a.manifest_json, nullptr, false)}};
  if (!a.failure.empty()) j["failure"] = a.failure;
  std::cout << j.dump(2) << "\n";
  return kExitOk;
}

int CmdCacheRemove(const std::string& key) {
  auto catalog = OpenCatalog();
  auto a = FindEntry(*catalog, key);
  auto path = catalog->DeleteArtifact(a.key);
  if (!path) throw UserError("entry " + key + " is being built; try again when it is done");
  if (!workers::RemoveArtifact(HomeDir(), *path)) {
    std::cerr << OutsideStore(a.key, *path) << "\n";
    return kExitBadInput;
  }
  std::cout << "removed " << a.key << "\n";
  return kExitOk;
}

int CmdCacheVerify() {
  auto catalog = OpenCatalog();
  int ok = 0, dropped = 0, outside = 0;
  for (const auto& a : catalog->ListArtifacts()) {
    if (a.state != "ready") continue;
    if (workers::IsStorePath(HomeDir(), a.path) && workers::VerifyArtifact(a.path, a.digest)) {
      ++ok;
      continue;
    }
    auto path = catalog->DeleteArtifact(a.key);
    if (path && !workers::RemoveArtifact(HomeDir(), *path)) {
      std::cerr << OutsideStore(a.key, *path) << "\n";
      ++outside;
    } else {
      std::cout << "corrupt: " << a.key.substr(0, 12) << " (" << a.path << ") dropped\n";
      ++dropped;
    }
  }
  std::cout << ok << " entries verified, " << dropped << " corrupt entries dropped";
  if (outside > 0)
    std::cout << ", " << outside << " entries outside the store dropped from the catalog";
  std::cout << "\n";
  return kExitOk;
}

int CmdCacheGc(const std::string& max_bytes, const std::string& older_than, bool dry_run) {
  if (max_bytes.empty() == older_than.empty())
    throw UserError("give one of --max-bytes N or --older-than D (e.g. 30d)");
  auto catalog = OpenCatalog();
  std::vector<schema::ArtifactRow> ready;
  int64_t total = 0;
  for (auto& a : catalog->ListArtifacts())
    if (a.state == "ready") total += a.bytes, ready.push_back(std::move(a));
  // Least recently used first; entries being built are never touched.
  std::sort(ready.begin(), ready.end(),
            [](const auto& x, const auto& y) { return x.last_used_at < y.last_used_at; });
  int64_t limit = -1;
  std::string cutoff;
  if (!max_bytes.empty()) {
    auto bytes = ParseBytes(max_bytes);
    if (!bytes || *bytes > static_cast<uint64_t>(INT64_MAX))
      throw UserError("--max-bytes " + max_bytes +
                      ": expected a size like 500000000, 500MB, 1GB or 1GiB (nothing was removed)");
    limit = static_cast<int64_t>(*bytes);
  } else {
    auto age = ParseDuration(older_than);
    if (!age)
      throw UserError("--older-than " + older_than + ": expected a duration like 30d or 12h");
    std::time_t t = std::time(nullptr) - static_cast<std::time_t>(*age);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S.000000Z", std::gmtime(&t));
    cutoff = buf;
  }
  int removed = 0;
  for (const auto& a : ready) {
    bool drop = limit >= 0 ? total > limit : a.last_used_at < cutoff;
    if (!drop) continue;
    if (!workers::IsStorePath(HomeDir(), a.path)) {  // not the store's bytes to reclaim
      std::cerr << "warning: entry " << a.key.substr(0, 12)
                << " names a path outside the store: " << a.path
                << "; skipped (`trnflow cache verify` drops it)\n";
      total -= a.bytes;
      continue;
    }
    if (dry_run) {
      total -= a.bytes;
      ++removed;
      std::cout << "would remove " << a.key.substr(0, 12) << " (" << Bytes(a.bytes)
                << ", last used " << a.last_used_at << ")\n";
      continue;
    }
    if (auto path = catalog->DeleteArtifact(a.key)) {
      workers::RemoveArtifact(HomeDir(), *path);
      total -= a.bytes;
      ++removed;
      std::cout << "removed " << a.key.substr(0, 12) << " (last used " << a.last_used_at << ")\n";
    }
  }
  if (dry_run)
    std::cout << removed << " entries would be removed (dry run: nothing was); the cache would "
              << "hold " << Bytes(total) << "\n";
  else
    std::cout << removed << " entries removed; the cache holds " << Bytes(total) << "\n";
  return kExitOk;
}

int CmdCacheWhy(const std::string& run_text, const std::string& stage) {
  int64_t run_id = ParseRunId(run_text);
  auto catalog = OpenCatalog();
  auto row = catalog->StageCacheInputs(run_id, stage);
  if (!row) throw UserError("run " + run_text + " has no stage '" + stage + "'");
  if (row->empty()) {
    std::cout << "stage " << stage
              << " has no cache key: it has cache: false, or has not run yet (a stage that is "
                 "not a compile gets its key when it runs)\n";
    return kExitOk;
  }
  auto mine = nlohmann::json::parse(*row);
  std::string key = Sha256Hex(*row);
  if (auto a = catalog->GetArtifact(key)) {
    std::cout << "key " << key.substr(0, 12) << " is in the cache (" << a->state << ", " << a->hits
              << " hits)\n";
    return kExitOk;
  }
  // The closest cached key: the fewest differing inputs.
  std::vector<std::string> best_diff;
  std::string best_key;
  for (const auto& a : catalog->ListArtifacts()) {
    auto theirs = nlohmann::json::parse(a.manifest_json, nullptr, false);
    if (theirs.is_discarded()) continue;
    std::vector<std::string> diff;
    auto flat_mine = mine.flatten(), flat_theirs = theirs.flatten();
    for (auto& [k, v] : flat_mine.items())
      if (!flat_theirs.contains(k) || flat_theirs[k] != v)
        diff.push_back(k.substr(1) + ": " + v.dump() + " (cached: " +
                       (flat_theirs.contains(k) ? flat_theirs[k].dump() : "absent") + ")");
    if (best_key.empty() || diff.size() < best_diff.size()) best_key = a.key, best_diff = diff;
  }
  std::cout << "miss: key " << key.substr(0, 12) << " is not in the cache\n";
  if (best_key.empty()) {
    std::cout << "the cache is empty\n";
    return kExitOk;
  }
  std::cout << "closest cached key " << best_key.substr(0, 12) << " differs in:\n";
  for (const auto& d : best_diff) std::cout << "  " << d << "\n";
  return kExitOk;
}

int CmdCacheTrust(const std::string& project, const std::string& trusted, bool trust, bool list) {
  auto catalog = OpenCatalog();
  if (list) {
    auto pairs = catalog->ListCacheTrust();
    if (pairs.empty()) std::cout << "no project trusts another's cache entries\n";
    for (const auto& [p, t] : pairs) std::cout << p << " trusts " << t << "\n";
    return kExitOk;
  }
  if (project.empty() || trusted.empty())
    throw UserError(std::string("give PROJECT and TRUSTED, e.g. `trnflow cache ") +
                    (trust ? "trust" : "untrust") + " team-b team-a`");
  if (trust) {
    bool added = catalog->AddCacheTrust(project, trusted);
    std::cout << project << (added ? " now trusts " : " already trusted ") << trusted
              << ": its cached stages may be served entries " << trusted << " built\n";
  } else if (catalog->RemoveCacheTrust(project, trusted)) {
    std::cout << project << " no longer trusts " << trusted << "\n";
  } else {
    std::cout << project << " did not trust " << trusted << "\n";
  }
  return kExitOk;
}

}  // namespace trnflow::cli
