// libFuzzer target: the pipeline parser, validator and planner must never crash, leak or
// hang on any input. Built with clang when -DTRNFLOW_FUZZ=ON; ops/fuzz.sh runs it.
//
// It parses under a project quota of 2,000 stages per run, not the default 250,000: 1.9 KB of
// aliased matrices makes 100,000 stages within the default, and planning them writes ~39 MB of
// JSON, past the 5 s a run may take under ASan. With the small quota such files are refused by
// the bound before anything is expanded, and the bound's own counting is fuzzed.
#include <cstddef>
#include <cstdint>
#include <string>

#include "pipelines/pipeline.h"
#include "pipelines/plan.h"

namespace {
constexpr int64_t kFuzzMaxStagesPerRun = 2000;
constexpr int64_t kFuzzMaxQueuedStages = 1000000;  // the projects table's default
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  trnflow::pipelines::LoadOptions options;
  options.stage_bound = [](const std::string& project) {
    return trnflow::pipelines::QuotaStageBound(project, kFuzzMaxStagesPerRun, kFuzzMaxQueuedStages,
                                               0);
  };
  auto result = trnflow::pipelines::ParsePipeline(text, "fuzz.yaml", options);
  std::string report = result.diagnostics.Format();
  if (result.pipeline) {
    auto plan = trnflow::pipelines::MakePlan(*result.pipeline);
    report += trnflow::pipelines::PlanToJson(plan);
    report += trnflow::pipelines::PlanToTable(plan);
  }
  return report.empty() && !result.pipeline ? 1 : 0;
}
