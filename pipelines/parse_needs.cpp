// `needs:`: each stage's dependencies, resolved once every stage is known. A matrix stage's base
// name stands for all its expansions; unknown names, repeats and a stage needing itself are
// reported. Cycles are found afterwards (dag.h), by Run().
#include <set>

#include "pipelines/parse_context.h"

namespace trnflow::pipelines::parse {

void Parser::ResolveNeeds() {
  std::vector<std::string> names;
  std::set<std::string> all;
  for (const auto& s : p_.stages) {
    all.insert(s.spec.name);
    if (names.empty() || names.back() != s.base_name) names.push_back(s.base_name);
  }
  for (auto& s : p_.stages) {
    std::set<std::string> seen, added;
    for (const auto& [need, loc] : raw_needs_[s.spec.name]) {
      std::vector<std::string> targets;
      if (auto e = expansions_.find(need); e != expansions_.end()) {
        targets = e->second;
      } else if (all.count(need)) {
        targets = {need};
      } else {
        std::vector<std::string> others;
        for (const auto& n : names)
          if (n != s.base_name) others.push_back(n);
        std::string hint = DidYouMean(need, others);
        if (need.find(',') != std::string::npos) hint = "needs takes a list: needs: [" + need + "]";
        diags_.Error(loc, "stage '" + s.base_name + "' needs unknown stage '" + need + "'",
                     hint.empty() ? "stages: " + Join(others, ", ") : hint);
        continue;
      }
      if (!seen.insert(need).second) {
        diags_.Warning(loc, "stage '" + s.base_name + "' lists '" + need + "' in needs twice",
                       "remove the repeat");
        continue;
      }
      if (need == s.base_name || need == s.spec.name) {
        diags_.Error(loc, "stage '" + s.base_name + "' needs itself",
                     "remove '" + need + "' from its needs");
        continue;
      }
      for (const auto& t : targets)
        if (added.insert(t).second) s.needs.push_back(t);
    }
  }
}

}  // namespace trnflow::pipelines::parse
