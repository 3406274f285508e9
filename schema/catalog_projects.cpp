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

void Catalog::SetProjectShare(const std::string& project, const ProjectShare& share) {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    if (impl_->Exec(tx, "SetProjectShare", project, share.weight, share.max_running).empty())
      throw UserError("there is no project '" + project +
                      "'; `trnflow project ls` lists them, `trnflow project add " + project +
                      "` makes it");
    if (!share.pool_max_running.empty()) {
      std::vector<std::string> pools;
      std::vector<int64_t> caps;
      for (const auto& [pool, cap] : share.pool_max_running) {
        pools.push_back(pool);
        caps.push_back(cap);
      }
      impl_->Exec(tx, "SetProjectPoolCaps", project, TextArray(pools), NumberArray(caps));
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

std::vector<ProjectRow> Catalog::ListProjects(bool with_share) {
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
    if (with_share)
      for (const auto& row : impl_->Exec(tx, "ProjectShares"))
        for (auto& p : out) {
          if (p.name != row[0].as<std::string>()) continue;
          p.weight = row[1].as<double>();
          if (int cap = row[2].as<int>(); cap >= 0) p.max_running = cap;
          for (const auto& item : SplitComma(row[3].as<std::string>()))
            if (auto eq = item.find('='); eq != std::string::npos)
              p.pool_max_running[item.substr(0, eq)] = std::stoi(item.substr(eq + 1));
        }
    return out;
  });
}

}  // namespace trnflow::schema
