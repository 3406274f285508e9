#pragma once
// The parser's shared state, private to the parse_*.cpp files (nothing else includes it). One
// Parser reads one file, once: parse_pipeline.cpp's Run() reads the root and hands each section
// to its construct's file; every construct reports into the same Diagnostics and fills the same
// Pipeline. Every value is read through a helper that knows its place in the file
// (parse_values.cpp), so each problem becomes a located diagnostic; parsing goes on after an
// error to report all. Not thread-safe; a Parser lives for one ParsePipeline call.
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "pipelines/pipeline.h"
#include "pipelines/yaml_tree.h"
#include "sim/catalog.h"

namespace trnflow::pipelines::parse {

inline Loc At(const YamlNode& n, Loc fallback = {}) {
  const YAML::Mark m = n.Mark();
  if (m.is_null() || m.line < 0) return fallback;
  return {m.line + 1, m.column + 1};
}

inline std::string Join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

struct Scope {
  const std::map<std::string, std::string>* params = nullptr;
  const std::map<std::string, std::string>* matrix = nullptr;  // null outside matrix stages
  std::string stage;
  // Set for shell text: parameters and matrix values are never pasted into it; each becomes
  // "${TRNFLOW_PARAM_NAME}" (or TRNFLOW_MATRIX_NAME), its value recorded here for the job's
  // environment.
  std::map<std::string, std::string>* shell_env = nullptr;
};

// The keys a pipeline file may hold, by place (parse_keys.cpp).
extern const std::vector<std::string> kRootKeys;
extern const std::vector<std::string> kCommonStageKeys;
extern const std::vector<std::string> kDefaultsKeys;
extern const std::map<std::string, std::vector<std::string>> kNestedKeys;
const std::vector<std::string>& NestedKeys(const std::string& parent);
extern const std::map<std::string, std::string> kFreeKeys;
extern const std::map<StageKind, std::vector<std::string>> kKindKeys;

class Parser {
 public:
  Parser(const std::string& text, const std::string& file, const LoadOptions& options)
      : text_(text), options_(options), diags_(file), catalog_(sim::Catalog::Builtin()) {}

  LoadResult Run();

 private:
  // --- reading values (parse_values.cpp, parse_expressions.cpp) ----------------------------
  // Reports duplicate and unknown keys; returns the fields the unknown keys look like typos
  // of, so a missing required field that was merely misspelled is reported once.
  std::set<std::string> CheckMap(const YamlNode& map, const std::vector<std::string>& allowed,
                                 const std::string& what);
  bool ExpectMap(const YamlNode& n, const std::string& what);
  std::optional<std::string> Text(const YamlNode& n, const std::string& what, const Scope& scope);
  // A finite number in [min, max]; with `scaled`, a count may carry a suffix: 20B, 1.5T, 100K.
  std::optional<double> Number(const YamlNode& n, const std::string& what, const Scope& scope,
                               double min, double max, bool scaled = false);
  std::optional<int> Integer(const YamlNode& n, const std::string& what, const Scope& scope,
                             int min, int max);
  std::optional<bool> Bool(const YamlNode& n, const std::string& what, const Scope& scope);
  std::optional<double> Duration(const YamlNode& n, const std::string& what, const Scope& scope);
  std::optional<std::string> Interpolate(const std::string& text, Loc loc, const Scope& scope);

  // --- sections, each in its parse_*.cpp ----------------------------------------------------
  void ParseParams(const YamlNode& n);           // parse_params.cpp
  void ParseStages(const YamlNode& stages);      // parse_stages.cpp
  bool WithinStageBound(const YamlNode& stages,  // parse_stage_bound.cpp
                        const std::vector<std::pair<YamlNode, YamlNode>>& entries);
  void ExpandMatrix(const std::string& name, Loc name_loc,  // parse_matrix.cpp
                    const YamlNode& node, const YamlNode& matrix);
  void ParseStage(const std::string& name, Loc name_loc,  // parse_stage.cpp
                  const YamlNode& n, const std::map<std::string, std::string>* matrix);
  // parse_run.cpp: a run: stage's command and its run-only fields.
  void ParseCommand(const YamlNode& n, Loc name_loc, const Scope& scope, Stage* st);
  void ParseOutputs(const YamlNode& n, Loc name_loc, const Scope& scope, Stage* st);
  void ParseSecrets(const YamlNode& n, Stage* st);
  // parse_workload.cpp: a simulated stage's work; `typos` as CheckMap returned them.
  sim::Workload ParseWorkload(const YamlNode& n, Loc name_loc, const Scope& scope, StageKind kind,
                              const std::set<std::string>& typos, const Stage& st);
  std::optional<sim::Model> ParseModel(const YamlNode& n, const Scope& scope);  // parse_model.cpp
  void ParseRetry(const YamlNode& n, const Scope& scope, RetryPolicy* out);     // parse_retry.cpp
  void ParseCheckpoint(const YamlNode& n, const Scope& scope, CheckpointPolicy* out);
  void ResolveNeeds();   // parse_needs.cpp
  void InheritModels();  // parse_model.cpp

  // A stage field, or the same field from `defaults:`.
  YamlNode Field(const YamlNode& stage, const char* key) const {
    if (YamlNode v = stage[key]) return v;
    return defaults_[key];
  }

  const std::string& text_;
  const LoadOptions& options_;
  Diagnostics diags_;
  const sim::Catalog& catalog_;
  Pipeline p_;
  YamlDoc doc_;  // the file's YAML; every YamlNode below points into it
  YamlNode defaults_;
  int priority_ = 0;  // the pipeline's `priority:`, every stage's unless it says its own
  std::map<std::string, std::vector<std::string>> expansions_;  // base name -> expanded names
  std::map<std::string, std::vector<std::pair<std::string, Loc>>> raw_needs_;  // expanded name
};

}  // namespace trnflow::pipelines::parse
