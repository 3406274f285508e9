#include "sim/feasibility.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace trnflow::sim {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;
constexpr double kTrainBytesPerParameter = 12;  // fp32 master weights + Adam m and v

std::string GiB(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / kGiB);
  return buf;
}

std::string JoinInts(const std::vector<int>& v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out;
}

// The smallest instance of `family` with at least `cores` NeuronCores (or GPUs), or "".
std::string SmallestWith(const Catalog& c, const std::string& family, int cores) {
  const InstanceType* best = nullptr;
  for (const auto& t : c.instances()) {
    if (CompileFamily(t.family) != family) continue;
    int have = t.cores_per_chip > 0 ? t.chips * t.cores_per_chip : t.chips;
    if (have >= cores && (!best || t.on_demand_per_hour < best->on_demand_per_hour)) best = &t;
  }
  return best ? best->name : "";
}

int Cores(const InstanceType& t) {
  return t.cores_per_chip > 0 ? t.chips * t.cores_per_chip : t.chips;
}

}  // namespace

std::vector<int> ValidTpDegrees(const std::string& family) {
  std::string f = CompileFamily(family);
  if (f == "trn1") return {1, 2, 8, 32};
  if (f == "inf2") return {1, 2, 4, 8, 12, 24};
  if (f == "trn2") return {1, 2, 4, 8, 16, 32, 64};
  if (f == "inf1") return {1, 2, 4, 8, 16};
  return {1, 2, 4, 8};
}

std::string CompileFamily(const std::string& instance_family) {
  if (instance_family == "trn1n") return "trn1";
  if (instance_family == "trn2u") return "trn2";  // an UltraServer's instances run trn2 graphs
  return instance_family;
}

double CoreMemoryGiB(const Catalog& c, const std::string& family) {
  for (const auto& t : c.instances())
    if (CompileFamily(t.family) == CompileFamily(family))
      return t.cores_per_chip > 0 ? t.hbm_gib_per_chip / t.cores_per_chip : t.hbm_gib_per_chip;
  return 0;
}

double WeightBytes(const Model& m) { return 2.0 * m.parameters; }

double KvCacheBytes(const Model& m, int batch, int context_tokens) {
  double kv_share = m.heads > 0 ? static_cast<double>(m.kv_heads) / m.heads : 1.0;
  return static_cast<double>(batch) * m.layers * context_tokens * m.hidden * kv_share * 2 * 2;
}

double TrainingStateBytes(const Model& m) { return kTrainBytesPerParameter * m.parameters; }

Fit CheckTpDegree(int tp, const std::string& family) {
  auto valid = ValidTpDegrees(family);
  if (std::find(valid.begin(), valid.end(), tp) != valid.end()) return {};
  return {false,
          "tp_degree " + std::to_string(tp) + " is not supported on " + CompileFamily(family),
          "valid tp_degree on " + CompileFamily(family) + ": " + JoinInts(valid)};
}

namespace {
// Weights and KV cache of one replica over `tp` cores of `core_gib` each.
Fit CheckReplica(const Catalog& c, const Workload& w, const std::string& family, int tp,
                 int context) {
  double core_gib = CoreMemoryGiB(c, family);
  double need = WeightBytes(w.model) + KvCacheBytes(w.model, std::max(1, w.batch), context);
  if (core_gib <= 0 || need / tp <= core_gib * kGiB) return {};
  std::string msg = w.model.name + " needs " + GiB(WeightBytes(w.model)) + " of weights + " +
                    GiB(KvCacheBytes(w.model, std::max(1, w.batch), context)) +
                    " of KV cache (batch " + std::to_string(std::max(1, w.batch)) + ", " +
                    std::to_string(context) + " tokens): " + GiB(need / tp) +
                    " per NeuronCore at tp_degree " + std::to_string(tp) + ", but each " +
                    CompileFamily(family) + " NeuronCore has " + GiB(core_gib * kGiB);
  for (int v : ValidTpDegrees(family)) {
    if (need / v > core_gib * kGiB) continue;
    std::string inst = SmallestWith(c, CompileFamily(family), v);
    return {false, msg,
            "use tp_degree " + std::to_string(v) +
                (inst.empty() ? "" : " (" + std::to_string(v) + " NeuronCores: " + inst + ")") +
                (w.batch > 1 ? ", or a smaller batch" : "")};
  }
  return {false, msg,
          "no tp_degree on " + CompileFamily(family) + " holds it: pick a larger family"};
}
}  // namespace

namespace {
Fit CheckContext(const Workload& w, int tokens, const char* what) {
  if (w.model.context <= 0 || tokens <= w.model.context) return {};
  return {false,
          std::string(what) + " " + std::to_string(tokens) + " is longer than " + w.model.name +
              "'s context (" + std::to_string(w.model.context) + " tokens)",
          "keep it within " + std::to_string(w.model.context) + " tokens"};
}
}  // namespace

Fit CheckServe(const Catalog& c, const Workload& w, const InstanceType& t) {
  if (t.accelerator == "none")
    return {false, t.name + " has no accelerator to serve a model on",
            "serve on inf2 (e.g. inf2.xlarge) or another accelerator instance"};
  int tp = std::max(1, w.tp_degree);
  if (Fit f = CheckTpDegree(tp, t.family); !f.ok) return f;
  if (tp > Cores(t)) {
    std::string inst = SmallestWith(c, CompileFamily(t.family), tp);
    return {false,
            "tp_degree " + std::to_string(tp) + " needs " + std::to_string(tp) +
                " NeuronCores, but " + t.name + " has " + std::to_string(Cores(t)),
            inst.empty() ? "lower tp_degree" : "use " + inst + ", or lower tp_degree"};
  }
  if (w.replicas > 0 && w.replicas * tp > Cores(t)) {
    int fit = Cores(t) / tp;
    std::string inst = SmallestWith(c, CompileFamily(t.family), w.replicas * tp);
    return {false,
            "replicas " + std::to_string(w.replicas) + " x tp_degree " + std::to_string(tp) +
                " needs " + std::to_string(w.replicas * tp) + " NeuronCores, but " + t.name +
                " has " + std::to_string(Cores(t)),
            "set replicas: " + std::to_string(fit) + " (as many as fit)" +
                (inst.empty() ? std::string(", or lower tp_degree")
                              : ", or use " + inst + " for " + std::to_string(w.replicas) + " replicas")};
  }
  int context = w.input_tokens + w.output_tokens;
  if (Fit f = CheckContext(w, context, "input_tokens + output_tokens ="); !f.ok) return f;
  return CheckReplica(c, w, t.family, tp, context > 0 ? context : w.seq_len);
}

Fit CheckCompile(const Catalog& c, const Workload& w) {
  int tp = std::max(1, w.tp_degree);
  if (Fit f = CheckTpDegree(tp, w.target); !f.ok) return f;
  if (Fit f = CheckContext(w, w.seq_len, "seq_len"); !f.ok) return f;
  return CheckReplica(c, w, w.target, tp, w.seq_len);
}

Fit CheckTrain(const Workload& w, const InstanceType& t, int count) {
  if (t.accelerator != "trainium" && t.accelerator != "gpu")
    return {false, "train stages run on Trainium (trn1, trn2) or GPU instances, not " + t.name,
            "use trn1.32xlarge (or trn1.2xlarge for small models)"};
  int cores = Cores(t);
  if (w.tp > cores)
    return {false,
            "parallelism.tp " + std::to_string(w.tp) + " exceeds the " + std::to_string(cores) +
                " NeuronCores of " + t.name,
            "use tp ≤ " + std::to_string(cores) + " or a larger instance"};
  if (t.accelerator == "trainium")
    if (Fit f = CheckTpDegree(w.tp, t.family); !f.ok)
      return {false, "parallelism.tp: " + f.message, f.hint};
  if (w.tp * w.pp > cores * count) {
    int instances = (w.tp * w.pp + cores - 1) / cores;
    return {false,
            "parallelism tp " + std::to_string(w.tp) + " x pp " + std::to_string(w.pp) + " needs " +
                std::to_string(w.tp * w.pp) + " NeuronCores; " + std::to_string(count) + " x " +
                t.name + " has " + std::to_string(cores * count),
            "set count: " + std::to_string(instances) + ", or lower pp"};
  }
  if (Fit f = CheckContext(w, w.seq_len, "seq_len"); !f.ok) return f;
  double need = TrainingStateBytes(w.model);
  double have = t.hbm_gib() * kGiB * count;
  if (need <= have) return {};
  int instances = static_cast<int>(std::ceil(need / (t.hbm_gib() * kGiB)));
  return {false,
          w.model.name + " training needs " + GiB(need) +
              " of weights and optimizer state (12 bytes per parameter, sharded); " +
              std::to_string(count) + " x " + t.name + " has " + GiB(have),
          "set count: " + std::to_string(instances) + " (or more)"};
}

CompileOutcome PredictCompile(const Catalog& c, const Workload& w, const InstanceType& host) {
  // NeuronCore-v1 (inf1) predates these operators; custom ops need a registered kernel.
  static const std::vector<std::string> kInf1Unsupported = {
      "rotary", "gqa", "swiglu", "sliding_window", "cross_attention", "groupnorm", "rmsnorm"};
  for (const auto& f : w.model.features) {
    bool unsupported =
        f == "custom_op" ||
        (w.target == "inf1" &&
         std::find(kInf1Unsupported.begin(), kInf1Unsupported.end(), f) != kInf1Unsupported.end());
    if (unsupported)
      return {false, "NCC_EXTP003",
              "NCC_EXTP003: operator '" + f + "' of " + w.model.name + " is not supported on " +
                  w.target,
              w.target == "inf1" ? "compile for inf2 (NeuronCore-v2 supports it)"
                                 : "register a custom kernel or change the model"};
  }
  if (Fit f = CheckCompile(c, w); !f.ok)
    return {false, "NCC_EVRF009", "NCC_EVRF009: " + f.message, f.hint};
  double need_gib = 1.2 * WeightBytes(w.model) / kGiB / std::max(1, w.tp_degree) + 4;
  if (host.memory_gib > 0 && need_gib > host.memory_gib)
    return {false, "HOST_OOM",
            "the compiler needs about " + GiB(need_gib * kGiB) + " of host memory; " + host.name +
                " has " + GiB(host.memory_gib * kGiB),
            "compile on an instance with more memory (e.g. trn1.32xlarge), or raise tp_degree"};
  return {};
}

}  // namespace trnflow::sim
