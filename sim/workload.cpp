#include "sim/workload.h"

#include <nlohmann/json.hpp>
#include <stdexcept>

namespace trnflow::sim {

std::string ToJson(const Workload& w) {
  const Model& m = w.model;
  nlohmann::json j = {
      {"kind", ToString(w.kind)},
      {"model",
       {{"name", m.name},
        {"parameters", m.parameters},
        {"layers", m.layers},
        {"hidden", m.hidden},
        {"heads", m.heads},
        {"kv_heads", m.kv_heads},
        {"ffn", m.ffn},
        {"vocab", m.vocab},
        {"context", m.context},
        {"architecture", m.architecture},
        {"features", m.features}}},
      {"tokens", w.tokens},
      {"seq_len", w.seq_len},
      {"tp", w.tp},
      {"pp", w.pp},
      {"target", w.target},
      {"batch", w.batch},
      {"tp_degree", w.tp_degree},
      {"dtype", w.dtype},
      {"compiler_flags", w.compiler_flags},
      {"input_tokens", w.input_tokens},
      {"output_tokens", w.output_tokens},
      {"requests", w.requests},
      {"duration_s", w.duration_s},
      {"replicas", w.replicas},
      {"max_concurrency", w.max_concurrency},
      {"global_batch", w.global_batch},
  };
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Workload WorkloadFromJson(std::string_view text) {
  try {
    auto j = nlohmann::json::parse(text);
    Workload w;
    w.kind = ParseStageKind(j.at("kind").get<std::string>()).value();
    const auto& m = j.at("model");
    w.model.name = m.at("name").get<std::string>();
    w.model.parameters = m.at("parameters").get<double>();
    w.model.layers = m.at("layers").get<int>();
    w.model.hidden = m.at("hidden").get<int>();
    w.model.heads = m.at("heads").get<int>();
    w.model.kv_heads = m.at("kv_heads").get<int>();
    w.model.ffn = m.value("ffn", 0);  // absent in specs written before it existed
    w.model.vocab = m.at("vocab").get<int>();
    w.model.context = m.at("context").get<int>();
    w.model.architecture = m.at("architecture").get<std::string>();
    w.model.features = m.at("features").get<std::vector<std::string>>();
    w.tokens = j.at("tokens").get<double>();
    w.seq_len = j.at("seq_len").get<int>();
    w.tp = j.at("tp").get<int>();
    w.pp = j.at("pp").get<int>();
    w.target = j.at("target").get<std::string>();
    w.batch = j.at("batch").get<int>();
    w.tp_degree = j.at("tp_degree").get<int>();
    w.dtype = j.at("dtype").get<std::string>();
    w.compiler_flags = j.at("compiler_flags").get<std::vector<std::string>>();
    w.input_tokens = j.at("input_tokens").get<int>();
    w.output_tokens = j.at("output_tokens").get<int>();
    w.requests = j.at("requests").get<double>();
    w.duration_s = j.at("duration_s").get<double>();
    // Absent in specs written before they existed.
    w.replicas = j.value("replicas", 0);
    w.max_concurrency = j.value("max_concurrency", 0);
    w.global_batch = j.value("global_batch", 0.0);
    return w;
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("malformed workload: ") + e.what());
  }
}

}  // namespace trnflow::sim
