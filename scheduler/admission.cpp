#include "scheduler/admission.h"

#include <map>
#include <vector>

namespace trnflow::scheduler {

pipelines::Plan EstimatePlan(const pipelines::Pipeline& p, schema::SchedulerCatalog* catalog,
                             double speed) {
  if (!catalog) {
    pipelines::PlanInputs none;
    none.speed = speed;
    return pipelines::MakePlan(p, none);
  }
  std::vector<std::string> unestimated;
  for (const auto& s : p.stages)
    if (s.spec.kind == StageKind::kRun && !s.estimate_s) unestimated.push_back(s.spec.name);
  std::map<std::string, schema::StageHistoryRow> past =
      catalog->StageHistory(p.project, p.name, unestimated);
  pipelines::PlanInputs in;
  in.is_cached = [catalog](const std::string& key) {
    auto a = catalog->GetArtifact(key);
    return a && a->state == schema::ArtifactState::kReady;
  };
  in.history = [&past](const std::string& stage) -> std::optional<pipelines::StageHistory> {
    auto it = past.find(stage);
    if (it == past.end()) return std::nullopt;
    return pipelines::StageHistory{it->second.median_seconds, it->second.runs,
                                   it->second.median_wall_seconds};
  };
  in.speed = speed;
  return pipelines::MakePlan(p, in);
}

std::optional<pipelines::Plan> PlanForAdmission(schema::SchedulerCatalog& catalog,
                                                const pipelines::Pipeline& p,
                                                schema::SubmitOptions* o) {
  if (o->force) return std::nullopt;
  const std::string& project = o->project.empty() ? p.project : o->project;
  if (!p.budget && catalog.ProjectBudgets(project).empty()) return std::nullopt;
  pipelines::Plan plan = EstimatePlan(p, &catalog, o->speed);  // at the run's own speed
  o->planned_cost = plan.total_cost;
  o->unknown_stages = static_cast<int>(plan.unknown_stages.size());
  return plan;
}

}  // namespace trnflow::scheduler
