// The bound on a file's stage count: counted from the matrix lists' sizes alone, aliases
// included, before anything is expanded, and refused past the project's quota
// (LoadOptions::stage_bound); QuotaStageBound words a project's quotas as that bound.
#include <algorithm>

#include "pipelines/parse_context.h"

namespace trnflow::pipelines::parse {

// Stage counts multiply before anything is expanded: a stage makes the product of its matrix
// lists' lengths, and an alias (`s2: *s1`) is one more entry of the same product, so 1.9 KB of
// YAML can name a million stages. They are counted here from the lists' sizes alone (no
// combination is made, nothing is allocated per stage) and refused past the project's bound
// before the first expansion. Malformed matrices count as one stage; the loop reports them.
bool Parser::WithinStageBound(const YamlNode& stages,
                              const std::vector<std::pair<YamlNode, YamlNode>>& entries) {
  constexpr int64_t kSaturated = int64_t{1} << 62;
  int64_t total = 0, largest = 0;
  size_t with_matrix = 0;
  std::string largest_name;
  Loc largest_loc;
  for (const auto& [key, node] : entries) {
    if (!node.IsMap()) continue;
    int64_t n = 1;
    if (const YamlNode matrix = node["matrix"]; matrix && matrix.IsMap()) {
      ++with_matrix;
      for (auto m = matrix.begin(); m != matrix.end(); ++m)
        if (m->second.IsSequence() && m->second.size() > 0) {
          // A list holds at most the file's 8 MiB of items: the product saturates, never wraps.
          auto len = static_cast<int64_t>(m->second.size());
          n = n > kSaturated / len ? kSaturated : n * len;
        }
    }
    total = std::min(kSaturated, total + n);
    if (n > largest) largest = n, largest_name = key.Scalar(), largest_loc = At(key);
  }
  StageBound bound = options_.stage_bound ? options_.stage_bound(p_.project) : StageBound{};
  if (size_t at = bound.hint.find("PROJECT"); at != std::string::npos && !p_.project.empty())
    bound.hint.replace(at, 7, p_.project);
  if (total <= bound.max_stages) return true;
  std::string count = total >= kSaturated ? "more than 4611686018427387904" : std::to_string(total);
  std::string detail =
      largest > 1 ? " (" + std::to_string(with_matrix) + " of its " +
                        std::to_string(entries.size()) + " stages have a matrix; '" + largest_name +
                        "' at " + std::to_string(largest_loc.line) + ":" +
                        std::to_string(largest_loc.col) + " alone makes " +
                        std::to_string(largest) + ")"
                  : "";
  diags_.Error(At(stages), "the pipeline's stages expand to " + count + " stages" + detail +
                               "; " + bound.why,
               bound.hint);
  return false;
}

}  // namespace trnflow::pipelines::parse

namespace trnflow::pipelines {

StageBound QuotaStageBound(const std::string& project, int64_t max_stages_per_run,
                           int64_t max_queued_stages, int64_t unfinished) {
  StageBound b;
  int64_t left = std::max<int64_t>(0, max_queued_stages - unfinished);
  if (left < max_stages_per_run) {
    b.max_stages = left;
    b.why = "project \"" + project + "\" has " + std::to_string(unfinished) +
            " unfinished stages, room for " + std::to_string(left) + " more under its quota of " +
            std::to_string(max_queued_stages);
    b.hint = "wait for running work to finish, split the sweep, or an administrator raises it: "
             "trnflow project add " + project + " --max-queued-stages N";
  } else {
    b.max_stages = max_stages_per_run;
    b.why = "project \"" + project + "\" allows at most " +
            std::to_string(max_stages_per_run) + " per run";
    b.hint = "split the sweep into several runs, or an administrator raises the quota: "
             "trnflow project add " + project + " --max-stages-per-run N";
  }
  return b;
}

}  // namespace trnflow::pipelines
