// `matrix:`: one stage per combination of the lists' values, keys sorted, values as listed,
// named `stage[key=value,...]`. Refuses duplicate keys and values, values that cannot be part
// of a name ('/', control characters), more than 10000 combinations and names past 255 bytes.
#include <algorithm>
#include <iterator>
#include <set>

#include "pipelines/parse_context.h"

namespace trnflow::pipelines::parse {

void Parser::ExpandMatrix(const std::string& name, Loc name_loc, const YamlNode& node,
                          const YamlNode& matrix) {
  // Expand the matrix: one stage per combination, keys sorted, values as listed.
  if (!matrix.IsMap() || matrix.size() == 0) {
    diags_.Error(At(matrix, name_loc), "matrix of stage '" + name + "' is empty or not a mapping",
                 "write matrix: {key: [value, ...]}");
    return;
  }
  std::map<std::string, std::vector<std::string>> axes;
  bool ok = true;
  for (auto m = matrix.begin(); m != matrix.end(); ++m) {
    std::string key = m->first.Scalar();
    if (axes.count(key)) {
      diags_.Error(At(m->first), "duplicate matrix key '" + key + "'");
      ok = false;
      continue;
    }
    if (!m->second.IsSequence() || m->second.size() == 0) {
      diags_.Error(At(m->second, At(m->first)),
                   "matrix key '" + key + "' must be a non-empty list of values");
      ok = false;
      continue;
    }
    std::set<std::string> values;
    const YamlNode list = m->second;  // a copy: the iterator's value is a temporary
    for (const auto& v : list) {
      if (!v.IsScalar()) {
        diags_.Error(At(v), "matrix values must be single values");
        ok = false;
      } else if (v.Scalar().find_first_of(std::string("/\x7f\0", 3)) != std::string::npos ||
                 std::any_of(v.Scalar().begin(), v.Scalar().end(),
                             [](char c) { return static_cast<unsigned char>(c) < 0x20; })) {
        // The value becomes part of the stage's name, which names its files on the workers.
        diags_.Error(At(v), "matrix value '" + v.Scalar() + "' of key '" + key +
                                "' holds '/' or a control character",
                     "a matrix value is part of the stage's name: use a plain word, and pass "
                     "paths as params");
        ok = false;
      } else if (!values.insert(v.Scalar()).second) {
        diags_.Error(At(v), "duplicate value '" + v.Scalar() + "' in matrix key '" + key + "'");
        ok = false;
      } else {
        axes[key].push_back(v.Scalar());
      }
    }
  }
  if (!ok) return;
  size_t combos = 1;
  for (const auto& [k, v] : axes) combos *= v.size();
  if (combos > 10'000) {
    diags_.Error(
        At(matrix),
        "matrix of stage '" + name + "' expands to " + std::to_string(combos) + " stages",
        "at most 10000 combinations per stage");
    return;
  }
  std::vector<size_t> idx(axes.size(), 0);
  for (size_t c = 0; c < combos; ++c) {
    std::map<std::string, std::string> values;
    std::string expanded = name + "[";
    size_t k = 0;
    for (const auto& [key, vals] : axes) {
      values[key] = vals[idx[k]];
      expanded += (k ? "," : "") + key + "=" + vals[idx[k]];
      ++k;
    }
    expanded += "]";
    if (expanded.size() > 255) {
      diags_.Error(At(matrix), "matrix of stage '" + name + "' makes the stage name '" +
                                   expanded.substr(0, 80) + "...' longer than 255 bytes",
                   "use shorter matrix keys and values");
      break;
    }
    expansions_[name].push_back(expanded);
    ParseStage(expanded, name_loc, node, &values);
    for (size_t d = axes.size(); d-- > 0;) {  // odometer, last key fastest
      if (++idx[d] < std::next(axes.begin(), d)->second.size()) break;
      idx[d] = 0;
    }
  }
}

}  // namespace trnflow::pipelines::parse
