// `params:`: the file's parameters (single values) and the --param overrides, each of which
// must name a declared parameter. Read before any stage, which may use them as
// ${{ params.NAME }}.
#include "pipelines/parse_context.h"

namespace trnflow::pipelines::parse {

void Parser::ParseParams(const YamlNode& n) {
  if (!ExpectMap(n, "params")) return;
  std::set<std::string> seen;
  for (auto it = n.begin(); it != n.end(); ++it) {
    std::string key = it->first.Scalar();
    if (!seen.insert(key).second) {
      diags_.Error(At(it->first), "duplicate parameter '" + key + "'");
      continue;
    }
    if (!it->second.IsScalar()) {
      diags_.Error(At(it->second, At(it->first)),
                   "parameter '" + key + "' must be a single value (number or string)");
      continue;
    }
    p_.params[key] = it->second.Scalar();
  }
  for (const auto& [key, value] : options_.params) {
    if (!p_.params.count(key)) {
      std::vector<std::string> names;
      for (const auto& [k, v] : p_.params) names.push_back(k);
      std::string hint = DidYouMean(key, names);
      diags_.Error({}, "--param " + key + ": the pipeline has no parameter '" + key + "'",
                   hint.empty() ? "its parameters: " + Join(names, ", ") : hint);
      continue;
    }
    p_.params[key] = value;
  }
}

}  // namespace trnflow::pipelines::parse
