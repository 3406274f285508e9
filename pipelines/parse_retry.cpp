// `retry:` (attempts, the outcomes retried, backoff, the spot policy) and `checkpoint:`: what
// the engine does when an attempt ends early. Missing fields keep the policy's defaults.
#include <algorithm>

#include "pipelines/parse_context.h"

namespace trnflow::pipelines::parse {

void Parser::ParseRetry(const YamlNode& n, const Scope& scope, RetryPolicy* out) {
  if (!ExpectMap(n, "retry")) return;
  CheckMap(n, NestedKeys("retry"), "retry");
  if (n["max_attempts"])
    if (auto v = Integer(n["max_attempts"], "retry.max_attempts", scope, 1, 100))
      out->max_attempts = *v;
  if (n["on"]) {
    if (!n["on"].IsSequence()) {
      diags_.Error(At(n["on"]), "retry.on must be a list of outcomes",
                   "e.g. on: [spot_interruption, infra_error]");
    } else {
      out->on.clear();
      const std::vector<std::string> retryable = {"spot_interruption", "capacity_unavailable",
                                                  "lost", "timeout", "infra_error"};
      for (const auto& o : n["on"]) {
        auto name = Text(o, "retry.on entry", scope);
        if (!name) continue;
        if (std::find(retryable.begin(), retryable.end(), *name) == retryable.end()) {
          std::string hint = DidYouMean(*name, retryable);
          diags_.Error(At(o), "'" + *name + "' cannot be retried",
                       hint.empty() ? "retryable outcomes: " + Join(retryable, ", ") : hint);
          continue;
        }
        out->on.push_back(*ParseOutcome(*name));
      }
    }
  }
  if (const auto& b = n["backoff"]) {
    if (ExpectMap(b, "retry.backoff")) {
      CheckMap(b, NestedKeys("backoff"), "retry.backoff");
      if (b["initial"])
        if (auto v = Duration(b["initial"], "retry.backoff.initial", scope))
          out->backoff.initial_s = *v;
      if (b["factor"])
        if (auto v = Number(b["factor"], "retry.backoff.factor", scope, 1, 100))
          out->backoff.factor = *v;
      if (b["max"])
        if (auto v = Duration(b["max"], "retry.backoff.max", scope)) out->backoff.max_s = *v;
    }
  }
  if (const auto& s = n["spot"]) {
    if (ExpectMap(s, "retry.spot")) {
      CheckMap(s, NestedKeys("spot"), "retry.spot");
      if (s["max_interruptions"])
        if (auto v =
                Integer(s["max_interruptions"], "retry.spot.max_interruptions", scope, 0, 1000))
          out->max_interruptions = *v;
      if (s["then"])
        if (auto v = Text(s["then"], "retry.spot.then", scope)) {
          if (*v != "on-demand" && *v != "fail")
            diags_.Error(At(s["then"]),
                         "retry.spot.then must be on-demand or fail, not '" + *v + "'");
          else
            out->then_market = *v;
        }
    }
  }
}

void Parser::ParseCheckpoint(const YamlNode& n, const Scope& scope, CheckpointPolicy* out) {
  if (!ExpectMap(n, "checkpoint")) return;
  CheckMap(n, NestedKeys("checkpoint"), "checkpoint");
  if (n["every"])
    if (auto v = Duration(n["every"], "checkpoint.every", scope)) out->every_s = *v;
  if (n["on_notice"])
    if (auto v = Bool(n["on_notice"], "checkpoint.on_notice", scope)) out->on_notice = *v;
}

}  // namespace trnflow::pipelines::parse
