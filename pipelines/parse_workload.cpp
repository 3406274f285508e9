// The simulated work of a train, compile, deploy or benchmark stage: its model (parse_model.cpp),
// its kind's own fields and the fields each kind requires.
#include <algorithm>

#include "pipelines/parse_context.h"

namespace trnflow::pipelines::parse {
namespace {

constexpr const char* kInvalidModel = "<invalid>";

}  // namespace

sim::Workload Parser::ParseWorkload(const YamlNode& n, Loc name_loc, const Scope& scope,
                                    StageKind kind, const std::set<std::string>& typos,
                                    const Stage& st) {
  // A required field is missing only if it is not there under a misspelled name either.
  auto missing = [&](const char* key) { return !n[key] && !typos.count(key); };
  sim::Workload w;
  w.kind = kind;
  w.model.name.clear();
  if (n["model"]) {
    if (auto m = ParseModel(n["model"], scope))
      w.model = *m;
    else
      w.model.name = kInvalidModel;  // reported already; keeps dependents from repeating it
  }
  auto int_field = [&](const char* key, int min, int max, int* out) {
    if (n[key])
      if (auto v = Integer(n[key], key, scope, min, max)) *out = *v;
  };
  switch (kind) {
    case StageKind::kTrain: {
      if (missing("model"))
        diags_.Error(name_loc, "train stage '" + st.base_name + "' needs a model:",
                     "name a catalog model (e.g. llama-2-7b) or describe one inline");
      if (n["tokens"]) {
        if (auto v = Number(n["tokens"], "tokens", scope, 1, 1e16, true)) w.tokens = *v;
      } else if (missing("tokens")) {
        diags_.Error(name_loc, "train stage '" + st.base_name + "' needs tokens:",
                     "the number of training tokens, e.g. tokens: 2.0e10");
      }
      int_field("seq_len", 1, 1 << 22, &w.seq_len);
      if (const YamlNode& par = n["parallelism"]; par && ExpectMap(par, "parallelism")) {
        CheckMap(par, NestedKeys("parallelism"), "parallelism");
        if (par["tp"])
          if (auto v = Integer(par["tp"], "parallelism.tp", scope, 1, 1024)) w.tp = *v;
        if (par["pp"])
          if (auto v = Integer(par["pp"], "parallelism.pp", scope, 1, 1024)) w.pp = *v;
      }
      break;
    }
    case StageKind::kCompile: {
      if (!n["target"]) {
        if (missing("target"))
          diags_.Error(name_loc, "compile stage '" + st.base_name + "' needs a target:",
                       "the family that will run the graph: inf2, trn1, trn2 or inf1");
      } else if (auto v = Text(n["target"], "target", scope)) {
        const std::vector<std::string> targets = {"inf2", "trn1", "trn2", "inf1"};
        if (std::find(targets.begin(), targets.end(), *v) == targets.end()) {
          std::string hint = DidYouMean(*v, targets);
          diags_.Error(At(n["target"]), "unknown compile target '" + *v + "'",
                       hint.empty() ? "targets: inf2, trn1, trn2, inf1" : hint);
        }
        w.target = *v;
      }
      int_field("tp_degree", 1, 128, &w.tp_degree);
      int_field("batch", 1, 4096, &w.batch);
      int_field("seq_len", 1, 1 << 22, &w.seq_len);
      if (n["dtype"])
        if (auto v = Text(n["dtype"], "dtype", scope)) {
          const std::vector<std::string> dtypes = {"bf16", "fp16", "fp32", "fp8"};
          if (std::find(dtypes.begin(), dtypes.end(), *v) == dtypes.end())
            diags_.Error(At(n["dtype"]), "unknown dtype '" + *v + "'",
                         DidYouMean(*v, dtypes).empty() ? "dtypes: bf16, fp16, fp32, fp8"
                                                        : DidYouMean(*v, dtypes));
          w.dtype = *v;
        }
      if (const YamlNode& f = n["compiler_flags"]) {
        if (!f.IsSequence())
          diags_.Error(At(f), "compiler_flags must be a list of strings");
        else
          for (const auto& x : f)
            if (auto v = Text(x, "compiler flag", scope)) w.compiler_flags.push_back(*v);
      }
      break;
    }
    case StageKind::kDeploy:
    case StageKind::kBenchmark: {
      int_field("tp_degree", 1, 128, &w.tp_degree);
      int_field("batch", 1, 4096, &w.batch);
      int_field("seq_len", 1, 1 << 22, &w.seq_len);
      int_field("input_tokens", 1, 1 << 22, &w.input_tokens);
      int_field("output_tokens", 1, 1 << 22, &w.output_tokens);
      // How the instance is shared (issue 38): replicas of tp_degree NeuronCores (checked
      // against the instance's cores in checks.cpp), and a continuous-batching server's
      // requests in flight per replica, at most the compiled batch.
      int_field("replicas", 1, 1024, &w.replicas);
      int_field("max_concurrency", 1, 4096, &w.max_concurrency);
      if (w.max_concurrency > 0 && w.max_concurrency > w.batch)
        diags_.Error(At(n["max_concurrency"]),
                     "max_concurrency " + std::to_string(w.max_concurrency) +
                         " is more than the compiled batch (" + std::to_string(w.batch) +
                         "): a replica holds at most batch sequences at once",
                     "set batch: " + std::to_string(w.max_concurrency) +
                         " (the sequences the graph is compiled for), or max_concurrency: " +
                         std::to_string(w.batch));
      for (const char* key : {"input_tokens", "output_tokens"})
        if (missing(key))
          diags_.Error(name_loc, "stage '" + st.base_name + "' needs " + key + ":",
                       "the shape of one request, e.g. input_tokens: 512, output_tokens: 256");
      if (n["requests"] && n["duration"]) {
        diags_.Error(At(n["duration"]), "give requests: or duration:, not both");
      } else if (n["requests"]) {
        if (auto v = Number(n["requests"], "requests", scope, 1, 1e12, true)) w.requests = *v;
      } else if (n["duration"]) {
        if (auto v = Duration(n["duration"], "duration", scope)) w.duration_s = *v;
      } else if (missing("requests") && missing("duration")) {
        diags_.Error(name_loc, "stage '" + st.base_name + "' needs requests: or duration:",
                     "how much to serve, e.g. requests: 100000 or duration: 2h");
      }
      break;
    }
    case StageKind::kRun:
      break;
  }
  return w;
}

}  // namespace trnflow::pipelines::parse
