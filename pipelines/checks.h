#pragma once
// The rules a pipeline must meet beyond its structure: Neuron hardware rules (tp degrees,
// memory for weights, KV cache and training state, static shapes, compile target vs serving
// family) as errors, and costly habits (long spot stages without checkpoints, compile stages
// with the cache off, on-demand where spot saves more than half) as warnings.
#include "pipelines/diagnostics.h"
#include "pipelines/pipeline.h"

namespace trnflow::pipelines {

void CheckPipeline(const Pipeline& pipeline, Diagnostics& diagnostics);

// Under a budget (the pipeline's budget_usd, or its project's: `plan` asks the catalog), a
// `run:` stage with neither `timeout:` nor `estimate:` reserves only a billing minute at a
// time: a warning per stage of the file (a matrix once), what the budget cannot plan for.
void CheckBudgetedCommands(const Pipeline& pipeline, const std::string& budget,
                           Diagnostics& diagnostics);

}  // namespace trnflow::pipelines
