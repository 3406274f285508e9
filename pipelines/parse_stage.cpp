// One stage: its kind (run: or kind:), where it runs (instance, count, market), its policies
// (retry, checkpoint, timeout, cache), env and needs, each field from the stage or from
// `defaults:`; then the run: command (parse_run.cpp) or the simulated work (parse_workload.cpp).
// The stage joins the pipeline unless its kind is unusable; needs are resolved later
// (parse_needs.cpp), once every stage is known.
#include "pipelines/parse_context.h"

namespace trnflow::pipelines::parse {

void Parser::ParseStage(const std::string& name, Loc name_loc, const YamlNode& n,
                        const std::map<std::string, std::string>* matrix) {
  Scope scope{&p_.params, matrix, name};
  Stage st;
  st.spec.name = name;
  st.base_name = name.substr(0, name.find('['));
  st.loc = name_loc;

  // Kind: `run:` makes a command stage; otherwise `kind:` names the simulated work.
  std::optional<StageKind> kind;
  if (n["kind"]) {
    if (auto k = Text(n["kind"], "kind", scope)) {
      kind = ParseStageKind(*k);
      if (!kind || *kind == StageKind::kRun) {
        std::vector<std::string> kinds = {"train", "compile", "deploy", "benchmark"};
        std::string hint = DidYouMean(*k, kinds);
        diags_.Error(At(n["kind"]), "unknown kind '" + *k + "'",
                     hint.empty() ? "kinds: train, compile, deploy, benchmark; or give the "
                                    "stage a run: command"
                                  : hint);
        kind.reset();
      }
    }
    if (kind && n["run"]) {
      diags_.Error(At(n["run"]),
                   "stage '" + st.base_name + "' has both kind: " + std::string(ToString(*kind)) +
                       " and run:",
                   "a stage either runs a command (run:) or simulated work (kind:), not both");
      return;
    }
    if (!kind) return;
  } else if (n["run"]) {
    kind = StageKind::kRun;
  } else {
    diags_.Error(name_loc, "stage '" + st.base_name + "' has neither run: nor kind:",
                 "add run: [command, args...] or kind: train|compile|deploy|benchmark");
    return;
  }
  st.spec.kind = *kind;
  const std::set<std::string> typos =
      CheckMap(n, AcceptedStageKeys(*kind), "stage '" + st.base_name + "'");
  for (auto it = n.begin(); it != n.end(); ++it)
    if (it->first.IsScalar()) st.fields.emplace(it->first.Scalar(), At(it->second, At(it->first)));
  // A required field is missing only if it is not there under a misspelled name either.
  auto missing = [&](const char* key) { return !n[key] && !typos.count(key); };

  // Where it runs.
  YamlNode inst = Field(n, "instance");
  std::string instance = *kind == StageKind::kRun ? "c6i.large" : "";
  if (inst) {
    if (auto v = Text(inst, "instance", scope)) instance = *v;
  } else if (instance.empty() && missing("instance")) {
    diags_.Error(name_loc, "stage '" + st.base_name + "' needs an instance:",
                 "e.g. instance: trn1.32xlarge (see `trnflow instances`)");
  }
  const sim::InstanceType* type = nullptr;
  if (!instance.empty()) {
    type = catalog_.FindInstance(instance);
    if (!type) {
      std::vector<std::string> names;
      for (const auto& t : catalog_.instances()) names.push_back(t.name);
      std::string hint = DidYouMean(instance, names);
      diags_.Error(At(inst, name_loc), "unknown instance type '" + instance + "'",
                   hint.empty() ? "see `trnflow instances` for the catalog" : hint);
    } else {
      st.spec.instance = instance;
      st.pool = type->pool;
    }
  }
  if (YamlNode c = Field(n, "count"))
    if (auto v = Integer(c, "count", scope, 1, 512)) st.spec.count = *v;
  if (YamlNode m = Field(n, "market")) {
    if (auto v = Text(m, "market", scope)) {
      if (auto market = ParseMarket(*v)) {
        st.spec.market = *market;
      } else {
        std::string hint = DidYouMean(*v, {"spot", "on-demand"});
        diags_.Error(At(m), "unknown market '" + *v + "'",
                     hint.empty() ? "market is spot or on-demand" : hint);
      }
    }
  }
  // Policies.
  if (*kind != StageKind::kRun) st.spec.retry.max_attempts = 1;
  if (YamlNode r = Field(n, "retry")) ParseRetry(r, scope, &st.spec.retry);
  if (YamlNode c = Field(n, "checkpoint")) ParseCheckpoint(c, scope, &st.spec.checkpoint);
  if (YamlNode t = Field(n, "timeout"))
    if (auto v = Duration(t, "timeout", scope)) st.spec.timeout_s = *v;
  st.spec.priority = priority_;
  if (const YamlNode& p = n["priority"])
    if (auto v = Integer(p, "priority", scope, -1000, 1000)) st.spec.priority = *v;
  st.spec.cache = *kind == StageKind::kCompile;
  if (YamlNode c = Field(n, "cache"))
    if (auto v = Bool(c, "cache", scope)) st.spec.cache = *v;
  if (YamlNode e = Field(n, "env")) {
    if (ExpectMap(e, "env"))
      for (auto it = e.begin(); it != e.end(); ++it)
        if (auto v = Text(it->second, "env." + it->first.Scalar(), scope))
          st.spec.command.env[it->first.Scalar()] = *v;
  }
  // Needs are resolved once every stage is known (matrix expansions included).
  if (const YamlNode& needs = n["needs"]) {
    auto add = [&](const YamlNode& x) {
      if (auto v = Text(x, "needs entry", scope)) raw_needs_[name].push_back({*v, At(x)});
    };
    if (needs.IsSequence()) {
      for (const auto& x : needs) add(x);
    } else if (needs.IsScalar()) {
      add(needs);
    } else {
      diags_.Error(At(needs), "needs must be a list of stage names", "e.g. needs: [train]");
    }
  }

  if (*kind == StageKind::kRun) {
    ParseCommand(n, name_loc, scope, &st);
    p_.stages.push_back(std::move(st));
    return;
  }

  st.workload = ParseWorkload(n, name_loc, scope, *kind, typos, st);
  p_.stages.push_back(std::move(st));
}

}  // namespace trnflow::pipelines::parse
