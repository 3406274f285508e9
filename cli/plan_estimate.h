#pragma once
// The one estimate of what a pipeline will cost: `trnflow plan` prints it and budget
// admission (`run`, `submit`) checks it, so a plan that fits the budget left is admitted and
// one that does not is refused, to the micro-dollar.
#include <string>

#include "pipelines/plan.h"
#include "schema/catalog.h"

namespace trnflow::cli {

// The plan of `p` (its project is the one it will be charged to). With a catalog: compile
// stages whose graph is in the cache cost $0, and run: stages without `estimate:` take the
// median of their past runs in the same project and pipeline. With none (`plan` when the
// catalog is unreachable): neither. Throws CatalogUnavailable if the catalog fails midway.
pipelines::Plan EstimatePlan(const pipelines::Pipeline& p, schema::Catalog* catalog,
                             double speed = 0);

}  // namespace trnflow::cli
