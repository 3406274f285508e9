#pragma once
// The stage graph of a pipeline: topological order and cycle detection.
#include <optional>
#include <string>
#include <vector>

#include "pipelines/pipeline.h"

namespace trnflow::pipelines {

// A cycle as the list of stage names along it, first name repeated at the end
// (a -> b -> a), or nullopt when the graph is acyclic. Unknown needs are ignored.
std::optional<std::vector<std::string>> FindCycle(const std::vector<Stage>& stages);

// Stage indexes with every stage after the stages it needs. Requires an acyclic graph.
std::vector<size_t> TopologicalOrder(const std::vector<Stage>& stages);

}  // namespace trnflow::pipelines
