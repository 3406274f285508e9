// The keys a pipeline file may hold, one table per place (the root, `defaults:`, a stage, its
// kind, the mappings nested in them), and their listing: AcceptedKeys() and
// AcceptedStageKeys() are built from the same tables CheckMap() rejects unknown keys with.
#include <set>

#include "pipelines/parse_context.h"

namespace trnflow::pipelines::parse {

const std::vector<std::string> kRootKeys = {"pipeline",   "project",    "description",
                                            "params",     "budget_usd", "priority",
                                            "simulation", "defaults",   "stages"};
const std::vector<std::string> kCommonStageKeys = {
    "kind",    "needs", "instance", "count",  "market",      "retry",   "checkpoint",
    "timeout", "cache", "env",      "matrix", "description", "priority"};
const std::vector<std::string> kDefaultsKeys = {"instance",   "count",   "market", "retry",
                                                "checkpoint", "timeout", "cache",  "env"};
// The fields of the mappings nested in a pipeline, by the key that holds them (in the root,
// `defaults:` or a stage). The parser rejects any other key with these tables, and
// AcceptedKeys() lists them, so the reference (docs/pipeline-format.md) cannot drift.
const std::map<std::string, std::vector<std::string>> kNestedKeys = {
    {"simulation", {"spot_rate_multiplier"}},
    {"retry", {"max_attempts", "on", "backoff", "spot"}},
    {"backoff", {"initial", "factor", "max"}},
    {"spot", {"max_interruptions", "then"}},
    {"checkpoint", {"every", "on_notice"}},
    {"model",
     {"name", "parameters", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "context",
      "architecture"}},
    {"parallelism", {"tp", "pp"}},
};
const std::vector<std::string>& NestedKeys(const std::string& parent) {
  return kNestedKeys.at(parent);
}
// Mappings whose keys the user chooses: listed in AcceptedKeys() under a placeholder.
const std::map<std::string, std::string> kFreeKeys = {
    {"params", "<name>"}, {"env", "<NAME>"}, {"matrix", "<key>"}};
const std::map<StageKind, std::vector<std::string>> kKindKeys = {
    {StageKind::kRun, {"run", "shell", "outputs", "secrets", "estimate", "network"}},
    {StageKind::kTrain, {"model", "tokens", "seq_len", "parallelism"}},
    {StageKind::kCompile,
     {"model", "target", "tp_degree", "batch", "seq_len", "dtype", "compiler_flags"}},
    {StageKind::kDeploy,
     {"model", "tp_degree", "batch", "input_tokens", "output_tokens", "requests", "duration",
      "seq_len", "replicas", "max_concurrency"}},
    {StageKind::kBenchmark,
     {"model", "tp_degree", "batch", "input_tokens", "output_tokens", "requests", "duration",
      "seq_len", "replicas", "max_concurrency"}},
};

}  // namespace trnflow::pipelines::parse

namespace trnflow::pipelines {

using parse::kCommonStageKeys;
using parse::kDefaultsKeys;
using parse::kFreeKeys;
using parse::kKindKeys;
using parse::kNestedKeys;
using parse::kRootKeys;

namespace {
// `prefix` + `key`, and every key nested under it.
void AddKey(std::vector<std::string>& out, const std::string& prefix, const std::string& key) {
  out.push_back(prefix + key);
  if (auto it = kNestedKeys.find(key); it != kNestedKeys.end())
    for (const auto& sub : it->second) AddKey(out, prefix + key + ".", sub);
  if (auto it = kFreeKeys.find(key); it != kFreeKeys.end())
    out.push_back(prefix + key + "." + it->second);
}
}  // namespace

std::vector<std::string> AcceptedKeys() {
  std::vector<std::string> out;
  for (const auto& k : kRootKeys)
    if (k != "defaults" && k != "stages") AddKey(out, "", k);
  out.push_back("defaults");
  for (const auto& k : kDefaultsKeys) AddKey(out, "defaults.", k);
  out.push_back("stages");
  out.push_back("stages.<name>");
  std::set<std::string> stage_keys(kCommonStageKeys.begin(), kCommonStageKeys.end());
  for (const auto& [kind, keys] : kKindKeys) stage_keys.insert(keys.begin(), keys.end());
  for (const auto& k : stage_keys) AddKey(out, "stages.<name>.", k);
  return out;
}

std::vector<std::string> AcceptedStageKeys(StageKind kind) {
  std::vector<std::string> out = kCommonStageKeys;
  const auto& extra = kKindKeys.at(kind);
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

}  // namespace trnflow::pipelines
