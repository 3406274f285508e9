// The compile cache key's inputs: the canonical JSON of everything that changes a compiled
// graph, and nothing else (pipeline.h says which). The key is its sha256 (parse_model.cpp).
#include <algorithm>
#include <nlohmann/json.hpp>

#include "pipelines/pipeline.h"

namespace trnflow::pipelines {

std::string CompileCacheInputs(const sim::Workload& w) {
  std::vector<std::string> flags = w.compiler_flags;
  std::sort(flags.begin(), flags.end());
  // The model's architecture as the workload serializes it (its name, size, shape and
  // operators); nlohmann::json objects keep their keys sorted, so the dump is canonical.
  nlohmann::json model = nlohmann::json::parse(sim::ToJson(w)).at("model");
  nlohmann::json j = {{"model", model},
                      {"batch", w.batch},
                      {"seq_len", w.seq_len},
                      {"dtype", w.dtype},
                      {"tp_degree", w.tp_degree},
                      {"target", w.target},
                      {"compiler", kCompilerVersion},
                      {"compiler_flags", flags}};
  return j.dump();
}

}  // namespace trnflow::pipelines
