// libFuzzer target: the pipeline parser, validator and planner must never crash, leak or
// hang on any input. Built with clang when -DTRNFLOW_FUZZ=ON; ops/fuzz.sh runs it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "pipelines/pipeline.h"
#include "pipelines/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto result = trnflow::pipelines::ParsePipeline(text, "fuzz.yaml", {});
  std::string report = result.diagnostics.Format();
  if (result.pipeline) {
    auto plan = trnflow::pipelines::MakePlan(*result.pipeline);
    report += trnflow::pipelines::PlanToJson(plan);
    report += trnflow::pipelines::PlanToTable(plan);
  }
  return report.empty() && !result.pipeline ? 1 : 0;
}
