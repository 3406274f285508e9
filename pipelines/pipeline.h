#pragma once
// Pipeline is a validated pipeline file: every stage resolved to a StageSpec (expressions
// substituted, matrix expanded, defaults applied, models inherited) with the DAG between
// them. It knows nothing of threads or SQL; the catalog stores it, workers run its specs.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/money.h"
#include "common/sha256.h"
#include "common/stage_spec.h"
#include "pipelines/diagnostics.h"
#include "sim/workload.h"

namespace trnflow::pipelines {

struct Stage {
  StageSpec spec;                  // spec.name is the expanded name: "compile[batch=1,seq_len=128]"
  std::string base_name;           // the name in the file: "compile"
  std::vector<std::string> needs;  // expanded stage names
  std::optional<sim::Workload> workload;  // sim stages
  std::string pool;                       // worker pool of the instance type
  Loc loc;                                // where the stage is defined
  std::map<std::string, Loc> fields;      // where each of its fields' values is
  // run: stages: `estimate:`, the simulated seconds the command is expected to run (planning
  // only; the command runs as long as it runs).
  std::optional<double> estimate_s;
  // The place of a field's value, or of the stage when the field is absent.
  Loc At(const std::string& field) const {
    auto it = fields.find(field);
    return it == fields.end() ? loc : it->second;
  }
};

struct Pipeline {
  std::string file;
  std::string name;
  std::string project;
  std::string description;
  std::optional<Money> budget;
  double spot_rate_multiplier = 1;
  std::map<std::string, std::string> params;  // resolved values, as YAML scalar text
  std::vector<Stage> stages;                  // in file order, matrix expansions in name order
  std::string source;                         // the file's text
  std::string spec_hash;                      // sha256 of the source text

  const Stage* Find(const std::string& name) const;
};

// The default quota of stages per run (the projects table's max_stages_per_run default).
inline constexpr int64_t kDefaultMaxStagesPerRun = 250000;

// How many stages one run of the file may have: the least of the project's quotas (stages per
// run; unfinished stages over its runs, less those already queued). The parser counts the
// stages the file makes (each stage entry's matrix product, aliases included) before it
// expands anything, and refuses past `max_stages` with `why` and `hint`.
struct StageBound {
  int64_t max_stages = kDefaultMaxStagesPerRun;
  std::string why = "at most 250000 stages per run (the default quota)";
  std::string hint =
      "split the sweep into several runs (or an administrator raises the project's quota: "
      "trnflow project add PROJECT --max-stages-per-run N)";
};

// The bound of `project` from its quotas: the least of its stages per run and what its
// unfinished stages leave of its queue, with the figures and the fix.
StageBound QuotaStageBound(const std::string& project, int64_t max_stages_per_run,
                           int64_t max_queued_stages, int64_t unfinished);

struct LoadOptions {
  std::map<std::string, std::string> params;  // --param key=value overrides
  std::string project;                        // --project
  // The bound for the pipeline's project, asked once the project is known; unset: the default
  // quota. The catalog's quotas come through here (cli/, scheduler/); submit_run checks them
  // again under the project's lock.
  std::function<StageBound(const std::string& project)> stage_bound;
};

struct LoadResult {
  std::optional<Pipeline> pipeline;  // set only when there are no errors
  Diagnostics diagnostics;
};

// Reads and validates a pipeline file. Never throws for bad input: every problem is a
// diagnostic with its place. Files over 8 MiB or with NUL bytes are refused.
LoadResult LoadPipelineFile(const std::string& path, const LoadOptions& options);
LoadResult ParsePipeline(const std::string& text, const std::string& file,
                         const LoadOptions& options);

// Every key a pipeline file may hold, as dotted paths from the root: "pipeline",
// "defaults.retry.backoff.initial", "stages.<name>.retry.max_attempts". Keys the user chooses
// appear as placeholders: "params.<name>", "stages.<name>.env.<NAME>",
// "stages.<name>.matrix.<key>". Built from the same tables the parser rejects unknown keys
// with, so a field cannot be accepted without being listed (docs/pipeline-format.md is
// checked against this list).
std::vector<std::string> AcceptedKeys();
// The rule for a project's name (lowercase letters, digits, '-' and '_', starting with a letter
// or digit, at most 63), and for one in capitals, the name to write instead. The catalog also
// refuses a name whose PostgreSQL roles another project has ('a_b' beside 'a-b').
std::string ProjectNameHint(const std::string& name);
// The fields a stage of `kind` may have (the common ones and its kind's own).
std::vector<std::string> AcceptedStageKeys(StageKind kind);

// The version of the (simulated) Neuron compiler; part of every compile cache key.
inline constexpr const char* kCompilerVersion = "neuronx-cc 2.15.128 (simulated)";
// The canonical JSON of everything that changes a compiled graph, and nothing else: the
// model's architecture (not its weights: graphs take weights as inputs at load time, so
// retraining does not invalidate them), batch, seq_len bucket, dtype, tp_degree, target,
// compiler version and flags (sorted).
std::string CompileCacheInputs(const sim::Workload& w);

}  // namespace trnflow::pipelines
