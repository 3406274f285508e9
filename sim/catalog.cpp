#include "sim/catalog.h"

#include <yaml-cpp/yaml.h>

#include <stdexcept>

#include "common/embedded.h"

namespace trnflow::sim {
namespace data {
const std::vector<EmbeddedFile>& Files();
}

namespace {

std::string_view Embedded(std::string_view name) {
  for (const auto& f : data::Files())
    if (f.name == name) return f.text;
  throw std::runtime_error("sim catalog: " + std::string(name) + " is not embedded");
}

template <typename T>
T Get(const YAML::Node& n, const char* key, const std::string& entry) {
  if (!n[key]) throw std::runtime_error("sim catalog: " + entry + " lacks '" + key + "'");
  try {
    return n[key].as<T>();
  } catch (const YAML::Exception&) {
    throw std::runtime_error("sim catalog: " + entry + ": '" + key + "' has the wrong type");
  }
}

Money Price(const YAML::Node& n, const char* key, const std::string& entry) {
  Money m;
  if (!Money::Parse(Get<std::string>(n, key, entry), &m))
    throw std::runtime_error("sim catalog: " + entry + ": '" + key + "' is not a price");
  return m;
}

}  // namespace

Catalog::Catalog(std::string_view instances_yaml, std::string_view models_yaml) {
  YAML::Node inst = YAML::Load(std::string(instances_yaml));
  prices_as_of_ = Get<std::string>(inst, "prices_as_of", "instances.yaml");
  for (const auto& n : inst["instances"]) {
    InstanceType t;
    t.name = Get<std::string>(n, "name", "instance");
    const std::string& e = t.name;
    t.family = Get<std::string>(n, "family", e);
    t.pool = Get<std::string>(n, "pool", e);
    t.accelerator = Get<std::string>(n, "accelerator", e);
    t.chips = Get<int>(n, "chips", e);
    t.cores_per_chip = Get<int>(n, "cores_per_chip", e);
    t.hbm_gib_per_chip = Get<double>(n, "hbm_gib_per_chip", e);
    t.hbm_gbps_per_chip = Get<double>(n, "hbm_gbps_per_chip", e);
    t.bf16_tflops_per_chip = Get<double>(n, "bf16_tflops_per_chip", e);
    t.fp8_tflops_per_chip = Get<double>(n, "fp8_tflops_per_chip", e);
    t.physical_cores_per_chip = n["physical_cores_per_chip"]
                                    ? Get<int>(n, "physical_cores_per_chip", e)
                                    : t.cores_per_chip;
    t.lnc = n["lnc"] ? Get<int>(n, "lnc", e) : 1;
    if (n["neuronlink_gbps_per_chip"])
      t.neuronlink_gbps_per_chip = Get<double>(n, "neuronlink_gbps_per_chip", e);
    t.vcpus = Get<int>(n, "vcpus", e);
    t.memory_gib = Get<double>(n, "memory_gib", e);
    t.network_gbps = Get<double>(n, "network_gbps", e);
    t.storage_write_gbps = Get<double>(n, "storage_write_gbps", e);
    t.on_demand_per_hour = Price(n, "on_demand_usd_hour", e);
    t.spot_per_hour = Price(n, "spot_usd_hour", e);
    t.spot_interruption_bucket = Get<std::string>(n, "spot_interruption_bucket", e);
    if (n["sources"])
      for (const auto& s : n["sources"])
        t.sources[s.first.as<std::string>()] = s.second.as<std::string>();
    instances_.push_back(std::move(t));
  }
  YAML::Node mod = YAML::Load(std::string(models_yaml));
  for (const auto& n : mod["models"]) {
    Model m;
    m.name = Get<std::string>(n, "name", "model");
    const std::string& e = m.name;
    m.parameters = Get<double>(n, "parameters", e);
    m.layers = Get<int>(n, "layers", e);
    m.hidden = Get<int>(n, "hidden", e);
    m.heads = Get<int>(n, "heads", e);
    m.kv_heads = Get<int>(n, "kv_heads", e);
    m.ffn = Get<int>(n, "ffn", e);
    m.vocab = Get<int>(n, "vocab", e);
    m.context = Get<int>(n, "context", e);
    m.architecture = Get<std::string>(n, "architecture", e);
    if (n["features"]) m.features = n["features"].as<std::vector<std::string>>();
    if (n["source"]) m.source = n["source"].as<std::string>();
    models_.push_back(std::move(m));
  }
}

double ParametersFromShape(const Model& m) {
  double h = m.hidden;
  double head_dim = m.heads > 0 ? h / m.heads : h;
  double kv = static_cast<double>(m.kv_heads > 0 ? m.kv_heads : m.heads) * head_dim;
  double per_layer = 2 * h * h + 2 * h * kv + 3 * h * m.ffn;
  return m.layers * per_layer + 2.0 * m.vocab * h;
}

const Catalog& Catalog::Builtin() {
  static const Catalog catalog(Embedded("instances.yaml"), Embedded("models.yaml"));
  return catalog;
}

const InstanceType* Catalog::FindInstance(std::string_view name) const {
  for (const auto& t : instances_)
    if (t.name == name) return &t;
  return nullptr;
}

const Model* Catalog::FindModel(std::string_view name) const {
  for (const auto& m : models_)
    if (m.name == name) return &m;
  return nullptr;
}

}  // namespace trnflow::sim
