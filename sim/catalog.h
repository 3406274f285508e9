#pragma once
// The simulated hardware and model catalogs, parsed from sim/instances.yaml and
// sim/models.yaml (compiled into the binary). Immutable after construction; safe to share
// between threads. Pure: no I/O.
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/money.h"

namespace trnflow::sim {

struct InstanceType {
  std::string name;         // "trn1.32xlarge"
  std::string family;       // "trn1"
  std::string pool;         // worker pool: trn1 | trn2 | inf1 | inf2 | gpu | cpu
  std::string accelerator;  // trainium | inferentia | gpu | none
  int chips = 0;
  int cores_per_chip = 0;           // logical NeuronCores (trn2: LNC=2, 4 per chip)
  int physical_cores_per_chip = 0;  // trn2: 8 NeuronCore-v3
  int lnc = 1;                      // physical cores per logical core
  double hbm_gib_per_chip = 0;
  double hbm_gbps_per_chip = 0;
  double bf16_tflops_per_chip = 0;
  double fp8_tflops_per_chip = 0;
  double neuronlink_gbps_per_chip = 0;  // GB/s chip-to-chip; 0 = single chip
  int vcpus = 0;
  double memory_gib = 0;
  double network_gbps = 0;
  double storage_write_gbps = 0;
  Money on_demand_per_hour;
  Money spot_per_hour;
  std::string spot_interruption_bucket;  // "<5%", "5-10%", ...
  std::map<std::string, std::string> sources;

  int neuron_cores() const { return chips * cores_per_chip; }
  double hbm_gib() const { return chips * hbm_gib_per_chip; }
  Money price(bool spot) const { return spot ? spot_per_hour : on_demand_per_hour; }
};

struct Model {
  std::string name;
  double parameters = 0;
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int kv_heads = 0;
  int ffn = 0;  // feed-forward (intermediate) size; 0 = unknown
  int vocab = 0;
  int context = 0;
  std::string architecture;  // decoder | encoder | vit | diffusion | climate
  std::vector<std::string> features;
  std::string source;
};

// Parameters of a decoder with this shape: per layer the attention projections (query and
// output hidden x hidden, key and value hidden x kv_heads x head_dim) and a gated MLP
// (3 x hidden x ffn), plus untied input and output embeddings (2 x vocab x hidden).
double ParametersFromShape(const Model& m);

class Catalog {
 public:
  // Throws std::runtime_error naming the entry when the YAML is malformed.
  Catalog(std::string_view instances_yaml, std::string_view models_yaml);
  // The catalog compiled into this binary.
  static const Catalog& Builtin();

  const InstanceType* FindInstance(std::string_view name) const;  // nullptr if unknown
  const Model* FindModel(std::string_view name) const;            // nullptr if unknown
  const std::vector<InstanceType>& instances() const { return instances_; }
  const std::vector<Model>& models() const { return models_; }
  const std::string& prices_as_of() const { return prices_as_of_; }

 private:
  std::vector<InstanceType> instances_;
  std::vector<Model> models_;
  std::string prices_as_of_;
};

}  // namespace trnflow::sim
