#pragma once
// Workload is what a simulated stage computes: the model and the shapes that decide how long
// it takes on a given instance. pipelines/ builds it; it travels as JSON inside StageSpec.
#include <string>
#include <string_view>
#include <vector>

#include "common/stage_spec.h"
#include "sim/catalog.h"

namespace trnflow::sim {

struct Workload {
  StageKind kind = StageKind::kTrain;
  Model model;
  // train
  double tokens = 0;
  int seq_len = 0;
  int tp = 1;
  int pp = 1;
  // compile / deploy / benchmark
  std::string target;  // compile: inf2 | trn1 | trn2 | inf1
  int batch = 1;
  int tp_degree = 1;
  std::string dtype = "bf16";
  std::vector<std::string> compiler_flags;
  int input_tokens = 0;
  int output_tokens = 0;
  double requests = 0;
  double duration_s = 0;  // deploy/benchmark: serve for this long instead of a request count
  // deploy/benchmark (issue 38): replicas of tp_degree NeuronCores per instance (0: as many
  // as fit, cores / tp_degree); max_concurrency > 0 is a continuous-batching server (vLLM)
  // that keeps at most that many requests in flight per replica on a graph compiled for
  // `batch` sequences (0: a static batch, every replica decodes full batches).
  int replicas = 0;
  int max_concurrency = 0;
  // train: sequences per optimizer step (0: the model's default, 4 Mi tokens).
  double global_batch = 0;
};

std::string ToJson(const Workload&);
// Throws std::runtime_error on malformed JSON.
Workload WorkloadFromJson(std::string_view json);

}  // namespace trnflow::sim
