// Whose stages they are: projects, their members and grants, and their quotas (how many stages
// a run or a project may queue, the uid their jobs run as). SQL: queries/runs.sql.
#include <pqxx/pqxx>

#include "common/error.h"
#include "schema/catalog.h"
#include "schema/catalog_impl.h"

namespace trnflow::schema {

bool Catalog::ProjectExists(const std::string& project) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    return !impl_->Exec(tx, "ProjectExists", project).empty();
  });
}

std::string Catalog::AddProject(const std::string& name, const std::vector<std::string>& members) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::string role =
        impl_->Exec(tx, "AddProject", name, TextArray(members))[0][0].as<std::string>();
    tx.commit();
    return role;
  });
}

std::string Catalog::GrantProject(const std::string& project, const std::string& role, bool write) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::string group =
        impl_->Exec(tx, "GrantProject", project, role, write)[0][0].as<std::string>();
    tx.commit();
    return group;
  });
}

void Catalog::SetProjectQuotas(const std::string& project, std::optional<int> max_stages_per_run,
                               std::optional<int> max_queued_stages,
                               std::optional<int64_t> job_uid) {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    try {
      impl_->Exec(tx, "SetProjectQuotas", project, max_stages_per_run, max_queued_stages, job_uid);
    } catch (const pqxx::unique_violation&) {
      throw UserError("uid " + std::to_string(job_uid.value_or(0)) +
                      " already runs another project's jobs; each project needs its own");
    }
    tx.commit();
  });
}

std::string Catalog::SetJobUidRange(int64_t lo, int64_t hi) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    auto range = impl_->Exec(tx, "SetJobUidRange", lo, hi)[0][0].as<std::string>();
    tx.commit();
    return range;
  });
}

std::string Catalog::JobUidRange() {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    return impl_->Exec(tx, "JobUidRange")[0][0].as<std::string>();
  });
}

StageRoom Catalog::GetStageRoom(const std::string& project) {
  return impl_->Guard([&] {
    pqxx::read_transaction tx(impl_->C());
    auto row = impl_->Exec(tx, "StageRoom", project)[0];
    return StageRoom{row[0].as<int64_t>(), row[1].as<int64_t>(), row[2].as<int64_t>()};
  });
}

std::vector<ProjectRow> Catalog::ListProjects() {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::vector<ProjectRow> out;
    for (const auto& row : impl_->Exec(tx, "ListProjects")) {
      ProjectRow p;
      p.name = row[0].as<std::string>();
      p.role = row[1].as<std::string>();
      std::string writers = row[2].as<std::string>();
      std::string readers = row[3].as<std::string>();
      if (!writers.empty()) p.members = SplitComma(writers);
      if (!readers.empty()) p.readers = SplitComma(readers);
      p.members.insert(p.members.end(), p.readers.begin(), p.readers.end());
      p.runs = row[4].as<int64_t>();
      out.push_back(std::move(p));
    }
    return out;
  });
}

}  // namespace trnflow::schema
