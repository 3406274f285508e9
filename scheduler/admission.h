#pragma once
// The one estimate of what a pipeline will cost, and what budget admission is given of it.
// `trnflow plan` prints the estimate; every submission — `run`, `submit`, a schedule's fire —
// hands it to the catalog, where trnflow.admit_run (migration 0024) admits or refuses the run
// against its budget_usd and its project's budget, the same rule for all, with the same
// refusal (exit 4). A member's own SQL call is held to SQL's floor (a billing minute a stage).
#include <string>

#include "pipelines/plan.h"
#include "schema/scheduler_catalog.h"

namespace trnflow::scheduler {

// The plan of `p` (its project is the one it will be charged to). With a catalog: compile
// stages whose graph is in the cache cost $0, and run: stages without `estimate:` take the
// median of their past runs in the same project and pipeline. With none (`plan` when the
// catalog is unreachable): neither. `speed`: the run's (a command is billed its wall time
// times it); 0: past runs as they ran. Throws CatalogUnavailable if the catalog fails midway.
pipelines::Plan EstimatePlan(const pipelines::Pipeline& p, schema::SchedulerCatalog* catalog,
                             double speed = 0);

// Fills `o`'s admission fields from the plan of `p`, when a budget applies (the run's own
// budget_usd or its project's); returns that plan, or nullopt when no budget applies (nothing
// is estimated then: SQL admits on its floor, which no budget can refuse).
std::optional<pipelines::Plan> PlanForAdmission(schema::SchedulerCatalog& catalog,
                                                const pipelines::Pipeline& p,
                                                schema::SubmitOptions* o);

}  // namespace trnflow::scheduler
