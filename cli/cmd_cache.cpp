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

namespace {
nlohmann::ordered_json ArtifactJson(const schema::ArtifactRow& a) {
  Described d = Describe(a.manifest_json);
  return nlohmann::ordered_json(
      {{"key", a.key},
       {"digest", OrNull(a.digest)},
       {"state", schema::ToSql(a.state)},
       {"model", d.model == "?" ? nlohmann::json(nullptr) : nlohmann::json(d.model)},
       {"shapes", d.shapes == "?" ? nlohmann::json(nullptr) : nlohmann::json(d.shapes)},
       {"target",
        d.target == "-" || d.target == "?" ? nlohmann::json(nullptr) : nlohmann::json(d.target)},
       {"project", OrNull(a.project)},
       {"bytes", a.bytes},
       {"hits", a.hits},
       {"created_at", OrNull(a.created_at)},
       {"last_used_at", OrNull(a.last_used_at)}});
}
}  // namespace

nlohmann::ordered_json CacheListJson(schema::Catalog& catalog) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& a : catalog.ListArtifacts()) out.push_back(ArtifactJson(a));
  return out;
}

int CmdCacheList(const std::string& format) {
  auto catalog = OpenCatalog();
  if (format == "json") {
    std::cout << CacheListJson(*catalog).dump(2) << "\n";
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  int64_t total = 0;
  for (const auto& a : catalog->ListArtifacts()) {
    Described d = Describe(a.manifest_json);
    rows.push_back({a.key.substr(0, 12), d.model, d.shapes, d.target, schema::ToSql(a.state),
                    Bytes(a.bytes), std::to_string(a.hits), a.last_used_at.substr(0, 19)});
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

int CmdCacheShow(const std::string& key, const std::string& format) {
  auto catalog = OpenCatalog();
  auto a = FindEntry(*catalog, key);
  auto inputs = nlohmann::json::parse(a.manifest_json, nullptr, false);
  if (inputs.is_discarded()) inputs = nullptr;
  if (format == "json") {
    nlohmann::ordered_json j = {{"key", a.key},
                                {"state", schema::ToSql(a.state)},
                                {"digest", OrNull(a.digest)},
                                {"bytes", a.bytes},
                                {"path", OrNull(a.path)},
                                {"project", OrNull(a.project)},
                                {"hits", a.hits},
                                {"created_at", OrNull(a.created_at)},
                                {"last_used_at", OrNull(a.last_used_at)},
                                {"failure", OrNull(a.failure)},
                                {"inputs", inputs}};
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {
      {"key", a.key},
      {"state", schema::ToSql(a.state)},
      {"digest", a.digest.empty() ? "-" : a.digest},
      {"bytes", std::to_string(a.bytes) + " (" + Bytes(a.bytes) + ")"},
      {"path", a.path.empty() ? "-" : a.path},
      {"project", a.project.empty() ? "- (a compiled graph: every project's)" : a.project},
      {"hits", std::to_string(a.hits)},
      {"created", a.created_at},
      {"last used", a.last_used_at.empty() ? "-" : a.last_used_at}};
  if (!a.failure.empty()) rows.push_back({"failure", a.failure});
  std::cout << Table({"FIELD", "VALUE"}, rows) << "\ninputs of its key:\n";
  std::vector<std::vector<std::string>> in_rows;
  nlohmann::json flat = inputs.is_object() ? inputs.flatten() : nlohmann::json::object();
  for (auto& [k, v] : flat.items()) {
    std::string input = k.substr(1);  // "/model/name" -> "model.name"
    std::replace(input.begin(), input.end(), '/', '.');
    in_rows.push_back({input, v.is_string() ? v.get<std::string>() : v.dump()});
  }
  std::cout << Table({"INPUT", "VALUE"}, in_rows);
  return kExitOk;
}

int CmdCacheRemove(const std::string& key, const DeleteArgs& del) {
  auto catalog = OpenCatalog();
  auto a = FindEntry(*catalog, key);
  if (del.dry_run) {
    std::cout << "would remove " << a.key << " (" << Bytes(a.bytes) << ", "
              << schema::ToSql(a.state) << "); dry run: nothing was removed\n";
    return kExitOk;
  }
  if (!Confirm("remove cache entry " + a.key.substr(0, 12) + " (" + Bytes(a.bytes) + ")?", del.yes))
    return Declined();
  auto path = catalog->DeleteArtifact(a.key);
  if (!path) throw UserError("entry " + key + " is being built; try again when it is done");
  if (!workers::RemoveArtifact(HomeDir(), *path)) {
    std::cerr << OutsideStore(a.key, *path) << "\n";
    return kExitBadInput;
  }
  std::cout << "removed " << a.key << "\n";
  return kExitOk;
}

int CmdCacheVerify(const DeleteArgs& del, const std::string& format) {
  auto catalog = OpenCatalog();
  int ok = 0;
  std::vector<schema::ArtifactRow> corrupt, outside;
  for (auto& a : catalog->ListArtifacts()) {
    if (a.state != schema::ArtifactState::kReady) continue;
    if (!workers::IsStorePath(HomeDir(), a.path))
      outside.push_back(std::move(a));
    else if (workers::VerifyArtifact(a.path, a.digest))
      ++ok;
    else
      corrupt.push_back(std::move(a));
  }
  size_t bad = corrupt.size() + outside.size();
  if (format != "json") {
    for (const auto& a : corrupt)
      std::cout << "corrupt: " << a.key.substr(0, 12) << " (" << a.path << ")\n";
    for (const auto& a : outside)
      std::cerr << "warning: entry " << a.key.substr(0, 12)
                << " names a path outside the store: " << a.path
                << " (its catalog row is dropped; its files are not the store's to delete)\n";
  }
  bool drop = bad > 0 && !del.dry_run;
  if (drop && !Confirm("drop these " + std::to_string(bad) + " entries?", del.yes))
    return Declined();
  nlohmann::ordered_json jcorrupt = nlohmann::ordered_json::array(),
                         joutside = nlohmann::ordered_json::array();
  int dropped = 0, dropped_outside = 0;
  for (const auto& a : corrupt) {
    bool gone = false;
    if (drop) {
      if (auto path = catalog->DeleteArtifact(a.key)) {
        gone = true;
        ++dropped;
        if (!workers::RemoveArtifact(HomeDir(), *path))
          std::cerr << OutsideStore(a.key, *path) << "\n";
      }
    }
    jcorrupt.push_back({{"key", a.key}, {"path", OrNull(a.path)}, {"dropped", gone}});
  }
  for (const auto& a : outside) {
    // Its row goes; the files it names are not the store's to delete.
    bool gone = drop && catalog->DeleteArtifact(a.key).has_value();
    if (gone) ++dropped_outside;
    joutside.push_back({{"key", a.key}, {"path", OrNull(a.path)}, {"dropped", gone}});
  }
  if (format == "json") {
    nlohmann::ordered_json j = {{"dry_run", del.dry_run},
                                {"verified", ok},
                                {"corrupt", jcorrupt},
                                {"outside_store", joutside}};
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  if (del.dry_run) {
    std::cout << ok << " entries verified, " << corrupt.size() << " corrupt, " << outside.size()
              << " outside the store (dry run: nothing was dropped)\n";
    return kExitOk;
  }
  std::cout << ok << " entries verified, " << dropped << " corrupt entries dropped";
  if (dropped_outside > 0)
    std::cout << ", " << dropped_outside << " entries outside the store dropped from the catalog";
  std::cout << "\n";
  return kExitOk;
}

int CmdCacheGc(const std::string& max_bytes, const std::string& older_than, const DeleteArgs& del,
               const std::string& format) {
  if (max_bytes.empty() == older_than.empty())
    throw UserError("give one of --max-bytes N or --older-than D (e.g. 30d)");
  int64_t limit = -1;
  std::string cutoff;
  if (!max_bytes.empty()) {
    auto bytes = ParseBytes(max_bytes);
    if (!bytes || *bytes > static_cast<uint64_t>(INT64_MAX))
      throw UserError("--max-bytes " + max_bytes +
                      ": expected a size like 500000000, 500MB, 1GB or 1GiB (nothing was removed)");
    limit = static_cast<int64_t>(*bytes);
  } else {
    double age = ParseDurationFlag("--older-than", older_than);
    std::time_t t = std::time(nullptr) - static_cast<std::time_t>(age);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S.000000Z", std::gmtime(&t));
    cutoff = buf;
  }
  auto catalog = OpenCatalog();
  std::vector<schema::ArtifactRow> ready;
  int64_t total = 0;
  for (auto& a : catalog->ListArtifacts())
    if (a.state == schema::ArtifactState::kReady) total += a.bytes, ready.push_back(std::move(a));
  // Least recently used first; entries being built are never touched.
  std::sort(ready.begin(), ready.end(),
            [](const auto& x, const auto& y) { return x.last_used_at < y.last_used_at; });
  std::vector<const schema::ArtifactRow*> chosen;
  nlohmann::ordered_json skipped = nlohmann::ordered_json::array();
  for (const auto& a : ready) {
    bool drop = limit >= 0 ? total > limit : a.last_used_at < cutoff;
    if (!drop) continue;
    total -= a.bytes;
    if (!workers::IsStorePath(HomeDir(), a.path)) {  // not the store's bytes to reclaim
      skipped.push_back({{"key", a.key}, {"path", OrNull(a.path)}});
      std::cerr << "warning: entry " << a.key.substr(0, 12)
                << " names a path outside the store: " << a.path
                << "; skipped (`trnflow cache verify` drops it)\n";
      continue;
    }
    chosen.push_back(&a);
  }
  int64_t chosen_bytes = 0;
  for (const auto* a : chosen) chosen_bytes += a->bytes;
  if (!del.dry_run && !chosen.empty() &&
      !Confirm("remove " + std::to_string(chosen.size()) + " cache entries (" +
                   Bytes(chosen_bytes) + ")?",
               del.yes))
    return Declined();
  nlohmann::ordered_json removed = nlohmann::ordered_json::array();
  for (const auto* a : chosen) {
    if (!del.dry_run) {
      auto path = catalog->DeleteArtifact(a->key);
      if (!path) {  // started building again meanwhile: it stays
        total += a->bytes;
        continue;
      }
      workers::RemoveArtifact(HomeDir(), *path);
    }
    removed.push_back(
        {{"key", a->key}, {"bytes", a->bytes}, {"last_used_at", OrNull(a->last_used_at)}});
    if (format != "json")
      std::cout << (del.dry_run ? "would remove " : "removed ") << a->key.substr(0, 12) << " ("
                << Bytes(a->bytes) << ", last used " << a->last_used_at << ")\n";
  }
  if (format == "json") {
    nlohmann::ordered_json j = {{"dry_run", del.dry_run},
                                {"removed", removed},
                                {"skipped_outside_store", skipped},
                                {"bytes_left", total}};
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  if (del.dry_run)
    std::cout << removed.size() << " entries would be removed (dry run: nothing was); the cache "
              << "would hold " << Bytes(total) << "\n";
  else
    std::cout << removed.size() << " entries removed; the cache holds " << Bytes(total) << "\n";
  return kExitOk;
}

int CmdCacheWhy(const std::string& run_text, const std::string& stage, const std::string& format) {
  int64_t run_id = ParseRunId(run_text);
  auto catalog = OpenCatalog();
  auto row = catalog->StageCacheInputs(run_id, stage);
  if (!row) {
    if (!catalog->GetRun(run_id))
      throw UserError("no run " + run_text + "; `trnflow runs` lists them");
    std::vector<std::string> names;
    for (const auto& s : catalog->GetStages(run_id)) names.push_back(s.name);
    throw UserError("run " + run_text + " has no stage '" + stage + "'" +
                    NameHint(stage, names, "; `trnflow show " + run_text + "` lists them"));
  }
  nlohmann::ordered_json j = {{"run_id", std::to_string(run_id)}, {"stage", stage}};
  if (row->empty()) {
    std::string why =
        "it has cache: false, or has not run yet (a stage that is not a compile gets its key "
        "when it runs)";
    if (format == "json") {
      j["key"] = nullptr;
      j["cached"] = false;
      j["reason"] = "no cache key: " + why;
      std::cout << j.dump(2) << "\n";
    } else {
      std::cout << "stage " << stage << " has no cache key: " << why << "\n";
    }
    return kExitOk;
  }
  auto mine = nlohmann::json::parse(*row);
  std::string key = Sha256Hex(*row);
  j["key"] = key;
  if (auto a = catalog->GetArtifact(key)) {
    if (format == "json") {
      j["cached"] = true;
      j["state"] = schema::ToSql(a->state);
      j["hits"] = a->hits;
      std::cout << j.dump(2) << "\n";
    } else {
      std::cout << "key " << key.substr(0, 12) << " is in the cache (" << schema::ToSql(a->state) << ", "
                << a->hits << " hits)\n";
    }
    return kExitOk;
  }
  // The closest cached key: the fewest differing inputs.
  struct Diff {
    std::string input;
    nlohmann::json value, cached;
  };
  std::vector<Diff> best_diff;
  std::string best_key;
  for (const auto& a : catalog->ListArtifacts()) {
    auto theirs = nlohmann::json::parse(a.manifest_json, nullptr, false);
    if (theirs.is_discarded()) continue;
    std::vector<Diff> diff;
    auto flat_mine = mine.flatten(), flat_theirs = theirs.flatten();
    for (auto& [k, v] : flat_mine.items())
      if (!flat_theirs.contains(k) || flat_theirs[k] != v)
        diff.push_back(
            {k.substr(1), v, flat_theirs.contains(k) ? flat_theirs[k] : nlohmann::json(nullptr)});
    if (best_key.empty() || diff.size() < best_diff.size()) best_key = a.key, best_diff = diff;
  }
  if (format == "json") {
    j["cached"] = false;
    j["closest_key"] = OrNull(best_key);
    nlohmann::ordered_json d = nlohmann::ordered_json::array();
    for (const auto& x : best_diff)
      d.push_back({{"input", x.input}, {"value", x.value}, {"cached", x.cached}});
    j["differences"] = d;
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << "miss: key " << key.substr(0, 12) << " is not in the cache\n";
  if (best_key.empty()) {
    std::cout << "the cache is empty\n";
    return kExitOk;
  }
  std::cout << "closest cached key " << best_key.substr(0, 12) << " differs in:\n";
  for (const auto& d : best_diff)
    std::cout << "  " << d.input << ": " << d.value.dump()
              << " (cached: " << (d.cached.is_null() ? "absent" : d.cached.dump()) << ")\n";
  return kExitOk;
}

int CmdCacheTrust(const std::string& project, const std::string& trusted, bool trust, bool list,
                  const std::string& format) {
  auto catalog = OpenCatalog();
  if (list) {
    auto pairs = catalog->ListCacheTrust();
    if (format == "json") {
      nlohmann::ordered_json out = nlohmann::ordered_json::array();
      for (const auto& [p, t] : pairs) out.push_back({{"project", p}, {"trusted", t}});
      std::cout << out.dump(2) << "\n";
      return kExitOk;
    }
    if (pairs.empty()) std::cout << "no project trusts another's cache entries\n";
    for (const auto& [p, t] : pairs) std::cout << p << " trusts " << t << "\n";
    return kExitOk;
  }
  if (project.empty() || trusted.empty())
    throw UserError(std::string("give PROJECT and TRUSTED, e.g. `trnflow cache ") +
                    (trust ? "trust" : "untrust") + " team-b team-a`");
  if (format == "json") {
    bool changed = trust ? catalog->AddCacheTrust(project, trusted)
                         : catalog->RemoveCacheTrust(project, trusted);
    nlohmann::ordered_json j = {
        {"project", project}, {"trusted", trusted}, {"trusts", trust}, {"changed", changed}};
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
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
