// Before and at a stage's birth: what past runs say a stage takes (plan and budget admission,
// queries/plans.sql), and submitting a pipeline as a run with its stages and their needs
// (SubmitRun in queries/runs.sql).
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <unordered_map>

#include "pipelines/pipeline.h"
#include "schema/catalog.h"
#include "schema/catalog_impl.h"

namespace trnflow::schema {

std::map<std::string, StageHistoryRow> Catalog::StageHistory(
    const std::string& project, const std::string& pipeline,
    const std::vector<std::string>& stages) {
  if (stages.empty()) return {};
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    std::map<std::string, StageHistoryRow> out;
    for (const auto& row : impl_->Exec(tx, "StageHistory", project, pipeline, TextArray(stages)))
      out[row[0].as<std::string>()] = {row[1].as<double>(), row[2].as<int>(),
                                       row[3].as<double>()};
    return out;
  });
}

int64_t Catalog::Impl::Submit(pqxx::work& tx, const pipelines::Pipeline& p,
                              const SubmitOptions& o) {
  std::string project = o.project.empty() ? p.project : o.project;
  nlohmann::json params(p.params);
  std::vector<std::string> names, kinds, pools, types, markets, specs;
  std::vector<int> counts, pending, dep_from, dep_to;
  std::unordered_map<std::string, int> position;
  for (const auto& s : p.stages) {
    position[s.spec.name] = static_cast<int>(names.size()) + 1;
    names.push_back(s.spec.name);
    kinds.emplace_back(ToString(s.spec.kind));
    pools.push_back(s.pool);
    types.push_back(s.spec.instance);
    counts.push_back(s.spec.count);
    markets.emplace_back(ToString(s.spec.market));
    pending.push_back(static_cast<int>(s.needs.size()));
    specs.push_back(ToJson(s.spec));
  }
  for (const auto& s : p.stages)
    for (const auto& n : s.needs) {
      dep_from.push_back(position.at(s.spec.name));
      dep_to.push_back(position.at(n));
    }
  int64_t run_id = Exec(tx, "SubmitRun", project, p.name, p.spec_hash, p.source, params.dump(), o.speed,
              o.seed, p.spot_rate_multiplier,
              p.budget ? std::optional<std::string>(p.budget->ToDecimal()) : std::nullopt,
              o.workdir, o.retry_failed_compilation, TextArray(names), TextArray(kinds),
              TextArray(pools), TextArray(types), NumberArray(counts), TextArray(markets),
              NumberArray(pending), TextArray(specs), NumberArray(dep_from),
              NumberArray(dep_to),
              o.planned_cost ? std::optional<std::string>(o.planned_cost->ToDecimal())
                             : std::nullopt,
              o.unknown_stages, o.force)[0][0]
      .as<int64_t>();
  if (o.hold) Exec(tx, "HoldRun", run_id);
  return run_id;
}

int64_t Catalog::SubmitRun(const pipelines::Pipeline& p, const SubmitOptions& o) {
  return impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    int64_t run_id = impl_->Submit(tx, p, o);
    tx.commit();
    return run_id;
  });
}

}  // namespace trnflow::schema
