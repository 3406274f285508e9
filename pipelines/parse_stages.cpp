// `stages:`: the mapping from stage name to stage. Checks the names (unique, well formed, not
// fields that lost their indentation), counts the stages the file makes against the project's
// bound before anything is expanded (parse_stage_bound.cpp), and hands each stage to
// ParseStage (parse_stage.cpp) or, with a matrix:, to ExpandMatrix (parse_matrix.cpp).
#include <regex>
#include <set>

#include "pipelines/parse_context.h"

namespace trnflow::pipelines::parse {
namespace {

const std::regex kStageName("[A-Za-z0-9][A-Za-z0-9_-]{0,62}");

}  // namespace

void Parser::ParseStages(const YamlNode& stages) {
  if (stages.IsSequence()) {
    diags_.Error(At(stages), "stages must be a mapping from stage name to stage, not a list",
                 "write `  train:` with the stage's fields indented under it, not `- train`");
    return;
  }
  if (!ExpectMap(stages, "stages")) return;
  if (stages.size() == 0) {
    diags_.Error(At(stages), "the pipeline has no stages", "add at least one under stages:");
    return;
  }
  std::vector<std::pair<YamlNode, YamlNode>> entries;
  for (auto it = stages.begin(); it != stages.end(); ++it)
    entries.push_back({it->first, it->second});
  if (!WithinStageBound(stages, entries)) return;
  p_.stages.reserve(entries.size());  // a matrix may add more
  std::set<std::string> field_names(kCommonStageKeys.begin(), kCommonStageKeys.end());
  for (const auto& [kind, keys] : kKindKeys) field_names.insert(keys.begin(), keys.end());
  std::set<std::string> seen;
  for (size_t e = 0; e < entries.size(); ++e) {
    const YamlNode& key = entries[e].first;
    Loc name_loc = At(key);
    if (!key.IsScalar()) {
      diags_.Error(name_loc, "a stage name must be a plain name");
      continue;
    }
    std::string name = key.Scalar();
    // `prep:` followed by its fields at the same indentation: YAML reads the fields as more
    // stages. Say so once instead of once per field.
    if (entries[e].second.IsNull() && e + 1 < entries.size() && entries[e + 1].first.IsScalar() &&
        field_names.count(entries[e + 1].first.Scalar())) {
      std::vector<std::string> fields;
      while (e + 1 < entries.size() && entries[e + 1].first.IsScalar() &&
             field_names.count(entries[e + 1].first.Scalar()))
        fields.push_back(entries[++e].first.Scalar());
      diags_.Error(name_loc,
                   "stage '" + name + "' has no fields: " + Join(fields, ", ") +
                       " below it are not indented under it",
                   "indent the fields of '" + name + "' two spaces more than its name");
      continue;
    }
    if (!seen.insert(name).second) {
      diags_.Error(name_loc, "duplicate stage name '" + name + "'",
                   "stage names must be unique; rename one of them");
      continue;
    }
    if (!std::regex_match(name, kStageName)) {
      diags_.Error(name_loc, "invalid stage name '" + name + "'",
                   "use letters, digits, '-' and '_' (at most 63), starting with a letter or "
                   "digit");
      continue;
    }
    const YamlNode node = entries[e].second;
    if (!node.IsMap()) {
      diags_.Error(node.IsNull() ? name_loc : At(node, name_loc),
                   "stage '" + name + "' must be a mapping of its fields",
                   "give it at least run: or kind:");
      continue;
    }
    const YamlNode matrix = node["matrix"];
    if (!matrix) {
      ParseStage(name, name_loc, node, nullptr);
      continue;
    }
    ExpandMatrix(name, name_loc, node, matrix);
  }
}

}  // namespace trnflow::pipelines::parse
