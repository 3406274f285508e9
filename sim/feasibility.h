#pragma once
// Will a workload fit the hardware? The rules of calibration/targets.yaml: bf16 weights take
// 2 bytes per parameter, the KV cache batch x layers x context x hidden x (kv_heads/heads) x
// 2 (k and v) x 2 bytes, training 12 bytes per parameter of fp32 master weights and Adam
// moments sharded across the instances (ZeRO-1; 18 before sharding, with the bf16 copy and
// gradients), and tensor-parallel degrees the Neuron SDK supports per family. Each failed
// check says what would fit. Pure functions.
#include <string>
#include <vector>

#include "sim/catalog.h"
#include "sim/workload.h"

namespace trnflow::sim {

struct Fit {
  bool ok = true;
  std::string message;  // what does not fit, with the numbers
  std::string hint;     // what would
};

// tp degrees the Neuron SDK supports on a family (trn1, trn1n, trn2, inf1, inf2); GPUs and
// others: powers of two up to the devices of the largest instance.
std::vector<int> ValidTpDegrees(const std::string& family);
// The family that runs graphs compiled for an instance family (trn1n runs trn1 graphs,
// trn2u trn2 graphs).
std::string CompileFamily(const std::string& instance_family);
// GiB of device memory per NeuronCore (or per GPU) in a family, from the catalog.
double CoreMemoryGiB(const Catalog& c, const std::string& family);

double WeightBytes(const Model& m);
double KvCacheBytes(const Model& m, int batch, int context_tokens);
double TrainingStateBytes(const Model& m);  // sharded across instances (ZeRO-1)

Fit CheckTpDegree(int tp, const std::string& family);
// A deploy/benchmark workload on `count` instances of `t`.
Fit CheckServe(const Catalog& c, const Workload& w, const InstanceType& t);
// A compile workload for its target family (the graph must fit the target's NeuronCores).
Fit CheckCompile(const Catalog& c, const Workload& w);
Fit CheckTrain(const Workload& w, const InstanceType& t, int count);

// How the Neuron compiler would fail on this workload, run on `host`, if it would: an
// operator the target does not support (NCC_EXTP003, deterministic), a graph over the
// NeuronCore's HBM (NCC_EVRF009), or the host running out of memory. ok when it compiles.
struct CompileOutcome {
  bool ok = true;
  std::string code;  // "NCC_EXTP003", "NCC_EVRF009", "HOST_OOM"
  std::string message;
  std::string hint;
};
CompileOutcome PredictCompile(const Catalog& c, const Workload& w, const InstanceType& host);

}  // namespace trnflow::sim
