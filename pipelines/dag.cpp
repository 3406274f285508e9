#include "pipelines/dag.h"

#include <algorithm>
#include <functional>
#include <unordered_map>

namespace trnflow::pipelines {
namespace {
std::unordered_map<std::string, size_t> IndexByName(const std::vector<Stage>& stages) {
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < stages.size(); ++i) index.emplace(stages[i].spec.name, i);
  return index;
}
}  // namespace

std::optional<std::vector<std::string>> FindCycle(const std::vector<Stage>& stages) {
  auto index = IndexByName(stages);
  enum Color { kWhite, kGrey, kBlack };
  std::vector<Color> color(stages.size(), kWhite);
  std::vector<size_t> path;
  // Iterative DFS so a 100,000-stage chain cannot overflow the stack.
  for (size_t root = 0; root < stages.size(); ++root) {
    if (color[root] != kWhite) continue;
    std::vector<std::pair<size_t, size_t>> stack = {{root, 0}};
    color[root] = kGrey;
    path = {root};
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      const auto& needs = stages[node].needs;
      if (next == needs.size()) {
        color[node] = kBlack;
        stack.pop_back();
        path.pop_back();
        continue;
      }
      auto it = index.find(needs[next++]);
      if (it == index.end()) continue;
      size_t child = it->second;
      if (color[child] == kGrey) {
        std::vector<std::string> cycle;
        auto start = std::find(path.begin(), path.end(), child);
        for (auto p = start; p != path.end(); ++p) cycle.push_back(stages[*p].spec.name);
        cycle.push_back(stages[child].spec.name);
        // The path follows needs (child depends on parent); print in dependency order.
        std::reverse(cycle.begin(), cycle.end());
        return cycle;
      }
      if (color[child] == kWhite) {
        color[child] = kGrey;
        path.push_back(child);
        stack.push_back({child, 0});
      }
    }
  }
  return std::nullopt;
}

std::vector<size_t> TopologicalOrder(const std::vector<Stage>& stages) {
  auto index = IndexByName(stages);
  std::vector<int> pending(stages.size(), 0);
  std::vector<std::vector<size_t>> dependents(stages.size());
  for (size_t i = 0; i < stages.size(); ++i)
    for (const auto& n : stages[i].needs)
      if (auto it = index.find(n); it != index.end()) {
        ++pending[i];
        dependents[it->second].push_back(i);
      }
  std::vector<size_t> order;
  for (size_t i = 0; i < stages.size(); ++i)
    if (pending[i] == 0) order.push_back(i);
  for (size_t k = 0; k < order.size(); ++k)
    for (size_t d : dependents[order[k]])
      if (--pending[d] == 0) order.push_back(d);
  return order;
}

}  // namespace trnflow::pipelines
