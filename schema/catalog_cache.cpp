// A stage's outputs: the artifact cache (acquire, finish, release, hits, delete), the inputs
// a stage's cache key was made of, and which projects' cache entries a project trusts. SQL:
// queries/artifacts.sql.
#include <pqxx/pqxx>

#include "common/error.h"
#include "schema/catalog.h"
#include "schema/catalog_impl.h"

namespace trnflow::schema {

namespace {
ArtifactRow ReadArtifact(const pqxx::row& row) {
  ArtifactRow a;
  a.key = row[0].as<std::string>();
  a.state = ArtifactStateFromSql(row[1].as<std::string>());
  a.digest = row[2].as<std::string>();
  a.bytes = row[3].as<int64_t>();
  a.path = row[4].as<std::string>();
  a.failure = row[5].as<std::string>();
  a.hits = row[6].as<int64_t>();
  a.manifest_json = row[7].as<std::string>();
  a.last_used_at = row[8].as<std::string>();
  a.created_at = row[9].as<std::string>();
  a.builder_stage = row[10].as<int64_t>();
  a.producer_cost = Money::FromMicros(row[11].as<int64_t>());
  a.project = row[12].as<std::string>();
  return a;
}
}  // namespace

bool Catalog::AcquireArtifact(const std::string& key, int64_t stage_id, int attempt,
                              const std::string& manifest_json, bool retry_failed,
                              const std::string& corrupt_digest, const std::string& project) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    bool mine = !impl_
                     ->Exec(tx, "AcquireArtifact", key, stage_id, attempt, manifest_json,
                            retry_failed, corrupt_digest, project)
                     .empty();
    tx.commit();
    return mine;
  });
}

std::optional<ArtifactRow> Catalog::GetArtifact(const std::string& key) {
  return impl_->Guard([&]() -> std::optional<ArtifactRow> {
    pqxx::work tx(impl_->C());
    auto r = impl_->Exec(tx, "ListArtifacts", key);
    if (r.empty()) return std::nullopt;
    return ReadArtifact(r[0]);
  });
}

bool Catalog::FinishArtifact(const std::string& key, int64_t stage_id, int attempt,
                             ArtifactState state, const std::string& digest, int64_t bytes,
                             const std::string& path, const std::string& failure) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    bool ok = !impl_
                   ->Exec(tx, "FinishArtifact", key, stage_id, attempt, ToSql(state), digest, bytes,
                          path, failure)
                   .empty();
    tx.commit();
    return ok;
  });
}

void Catalog::ReleaseArtifact(const std::string& key, int64_t stage_id, int attempt) {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    impl_->Exec(tx, "ReleaseArtifact", key, stage_id, attempt);
    tx.commit();
  });
}

void Catalog::RecordArtifactHit(const std::string& key) {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    impl_->Exec(tx, "RecordArtifactHit", key);
    tx.commit();
  });
}

std::vector<ArtifactRow> Catalog::ListArtifacts() {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<ArtifactRow> out;
    for (const auto& row : impl_->Exec(tx, "ListArtifacts", nullptr))
      out.push_back(ReadArtifact(row));
    return out;
  });
}

std::optional<std::string> Catalog::DeleteArtifact(const std::string& key) {
  return impl_->Guard([&]() -> std::optional<std::string> {
    pqxx::work tx(impl_->C());
    auto r = impl_->Exec(tx, "DeleteArtifact", key);
    tx.commit();
    if (r.empty()) return std::nullopt;
    return r[0][0].as<std::string>();
  });
}

std::optional<std::string> Catalog::StageCacheInputs(int64_t run_id, const std::string& stage) {
  return impl_->Guard([&]() -> std::optional<std::string> {
    pqxx::work tx(impl_->C());
    auto r = impl_->Exec(tx, "StageCacheInputs", run_id, stage);
    if (r.empty()) return std::nullopt;
    return r[0][0].as<std::string>();
  });
}

void Catalog::RecordStageCacheInputs(int64_t stage_id, int attempt, const std::string& inputs) {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    impl_->Exec(tx, "RecordStageCacheInputs", stage_id, attempt, inputs);
    tx.commit();
  });
}

std::vector<std::pair<std::string, std::string>> Catalog::StageInputDigests(int64_t stage_id) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& row : impl_->Exec(tx, "StageInputDigests", stage_id))
      out.emplace_back(row[0].as<std::string>(), row[1].as<std::string>());
    return out;
  });
}

std::vector<std::string> Catalog::TrustedProjects(const std::string& project) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<std::string> out;
    for (const auto& row : impl_->Exec(tx, "TrustedProjects", project))
      out.push_back(row[0].as<std::string>());
    return out;
  });
}

bool Catalog::AddCacheTrust(const std::string& project, const std::string& trusts) {
  if (project == trusts)
    throw UserError("project " + project + " always uses its own cache entries; name another");
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    auto r = impl_->Exec(tx, "AddCacheTrust", project, trusts);
    tx.commit();
    for (int i : {0, 1})
      if (!r[0][i].as<bool>())
        throw UserError("there is no project " + (i == 0 ? project : trusts) +
                        "; `trnflow project ls` lists them");
    return r[0][2].as<bool>();
  });
}

bool Catalog::RemoveCacheTrust(const std::string& project, const std::string& trusts) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    bool removed = !impl_->Exec(tx, "RemoveCacheTrust", project, trusts).empty();
    tx.commit();
    return removed;
  });
}

std::vector<std::pair<std::string, std::string>> Catalog::ListCacheTrust() {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& row : impl_->Exec(tx, "ListCacheTrust"))
      out.emplace_back(row[0].as<std::string>(), row[1].as<std::string>());
    return out;
  });
}

}  // namespace trnflow::schema
