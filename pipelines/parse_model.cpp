// `model:`: a catalog model by name, or one described inline (its parameters may follow from
// its shape); and after the DAG is known, inheritance: a compile or deploy stage without a model
// takes the model of a stage it needs, in dependency order. Then each simulated stage's
// workload JSON and, for cached compile stages, its cache key (parse_cache.cpp).
#include <algorithm>

#include "common/sha256.h"
#include "pipelines/dag.h"
#include "pipelines/parse_context.h"

namespace trnflow::pipelines::parse {

std::optional<sim::Model> Parser::ParseModel(const YamlNode& n, const Scope& scope) {
  if (n.IsScalar()) {
    auto name = Text(n, "model", scope);
    if (!name) return std::nullopt;
    if (const sim::Model* m = catalog_.FindModel(*name)) return *m;
    std::vector<std::string> names;
    for (const auto& m : catalog_.models()) names.push_back(m.name);
    std::string hint = DidYouMean(*name, names);
    diags_.Error(At(n), "unknown model '" + *name + "'",
                 hint.empty() ? "known models: " + Join(names, ", ") +
                                    "; or describe it inline: {name, parameters, layers, hidden}"
                              : hint);
    return std::nullopt;
  }
  if (!ExpectMap(n, "model")) return std::nullopt;
  const auto typos = CheckMap(n, NestedKeys("model"), "model");
  sim::Model m;
  bool ok = true;
  // parameters may be left out when ffn is given: it follows from the shape.
  const bool derive = !n["parameters"] && n["ffn"];
  for (const char* key : {"name", "parameters", "layers", "hidden"})
    if (derive && std::string(key) == "parameters") {
      continue;
    } else if (!n[key] && typos.count(key)) {
      ok = false;  // reported as the typo it is
    } else if (!n[key]) {
      diags_.Error(At(n), std::string("inline model lacks '") + key + "'",
                   "an inline model needs name, parameters, layers and hidden (parameters may "
                   "be left out when ffn is given)");
      ok = false;
    }
  if (!ok) return std::nullopt;
  auto name = Text(n["name"], "model.name", scope);
  std::optional<double> params = 0.0;
  if (!derive) params = Number(n["parameters"], "model.parameters", scope, 1e3, 1e13, true);
  auto layers = Integer(n["layers"], "model.layers", scope, 1, 1000);
  auto hidden = Integer(n["hidden"], "model.hidden", scope, 1, 1 << 20);
  if (!name || !params || !layers || !hidden) return std::nullopt;
  m.name = *name;
  m.parameters = *params;
  m.layers = *layers;
  m.hidden = *hidden;
  m.heads = std::max(1, m.hidden / 128);
  if (n["heads"])
    if (auto v = Integer(n["heads"], "model.heads", scope, 1, 4096)) m.heads = *v;
  m.kv_heads = m.heads;
  if (n["kv_heads"])
    if (auto v = Integer(n["kv_heads"], "model.kv_heads", scope, 1, 4096)) m.kv_heads = *v;
  if (m.kv_heads > m.heads || m.heads % m.kv_heads != 0)
    diags_.Error(At(n["kv_heads"] ? n["kv_heads"] : n),
                 "model.kv_heads " + std::to_string(m.kv_heads) + " does not divide heads " +
                     std::to_string(m.heads),
                 "grouped-query attention shares each key/value head among heads / kv_heads "
                 "query heads: use a divisor of " + std::to_string(m.heads));
  if (n["ffn"])
    if (auto v = Integer(n["ffn"], "model.ffn", scope, 1, 1 << 22)) m.ffn = *v;
  m.vocab = 32000;
  if (n["vocab"])
    if (auto v = Integer(n["vocab"], "model.vocab", scope, 0, 10'000'000)) m.vocab = *v;
  m.context = 4096;
  if (n["context"])
    if (auto v = Integer(n["context"], "model.context", scope, 1, 10'000'000)) m.context = *v;
  m.architecture = "decoder";
  if (n["architecture"])
    if (auto v = Text(n["architecture"], "model.architecture", scope)) m.architecture = *v;
  if (derive) {
    if (m.ffn <= 0) return std::nullopt;  // reported by Integer
    m.parameters = sim::ParametersFromShape(m);
  }
  return m;
}

void Parser::InheritModels() {
  // Compile and deploy stages without a model use the model of a stage they need. Walk in
  // dependency order so a deploy inherits through its compile stage from the train stage.
  for (size_t i : TopologicalOrder(p_.stages)) {
    Stage& s = p_.stages[i];
    if (!s.workload || !s.workload->model.name.empty()) continue;
    for (const auto& need : s.needs) {
      const Stage* from = p_.Find(need);
      if (from && from->workload && !from->workload->model.name.empty()) {
        s.workload->model = from->workload->model;
        break;
      }
    }
    if (s.workload->model.name.empty() && s.spec.kind != StageKind::kTrain)
      diags_.Error(s.loc,
                   std::string(ToString(s.spec.kind)) + " stage '" + s.base_name + "' has no model",
                   "name one with model:, or add the train or compile stage it builds on to "
                   "its needs");
  }
  for (auto& s : p_.stages) {
    if (!s.workload) continue;
    if (s.workload->seq_len == 0) s.workload->seq_len = s.workload->model.context;
    s.spec.workload_json = sim::ToJson(*s.workload);
    if (s.spec.kind == StageKind::kCompile && s.spec.cache) {
      s.spec.cache_inputs = CompileCacheInputs(*s.workload);
      s.spec.cache_key = Sha256Hex(s.spec.cache_inputs);
    }
  }
}

}  // namespace trnflow::pipelines::parse
