// YAML -> Pipeline. Every value is read through a helper that knows its place in the file, so
// each problem becomes a located diagnostic; parsing goes on after an error to report all.
#include <yaml-cpp/exceptions.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "common/duration.h"
#include "common/sha256.h"
#include "pipelines/checks.h"
#include "pipelines/dag.h"
#include "pipelines/pipeline.h"
#include "pipelines/yaml_tree.h"
#include "sim/catalog.h"

namespace trnflow::pipelines {
namespace {

constexpr size_t kMaxFileBytes = 8 << 20;
constexpr const char* kInvalidModel = "<invalid>";

Loc At(const YamlNode& n, Loc fallback = {}) {
  const YAML::Mark m = n.Mark();
  if (m.is_null() || m.line < 0) return fallback;
  return {m.line + 1, m.column + 1};
}

const std::regex kPipelineName("[a-z0-9][a-z0-9-]{0,62}");
// A project's name may also hold '_' (its roles spell '-' as '_'; the catalog refuses a name
// whose roles another project already has, as 'a_b' beside 'a-b').
const std::regex kProjectName("[a-z0-9][a-z0-9_-]{0,62}");
const std::regex kStageName("[A-Za-z0-9][A-Za-z0-9_-]{0,62}");

std::string Join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// Word splitting for a string command without a shell: whitespace separates, single and
// double quotes group, nothing is expanded.
std::optional<std::vector<std::string>> SplitWords(const std::string& s) {
  std::vector<std::string> words;
  std::string cur;
  bool in_word = false;
  char quote = 0;
  for (char c : s) {
    if (quote) {
      if (c == quote)
        quote = 0;
      else
        cur += c;
    } else if (c == '\'' || c == '"') {
      quote = c, in_word = true;
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      if (in_word) words.push_back(cur), cur.clear(), in_word = false;
    } else {
      cur += c, in_word = true;
    }
  }
  if (quote) return std::nullopt;
  if (in_word) words.push_back(cur);
  return words;
}

struct Scope {
  const std::map<std::string, std::string>* params = nullptr;
  const std::map<std::string, std::string>* matrix = nullptr;  // null outside matrix stages
  std::string stage;
  // Set for shell text: parameters and matrix values are never pasted into it; each becomes
  // "${TRNFLOW_PARAM_NAME}" (or TRNFLOW_MATRIX_NAME), its value recorded here for the job's
  // environment.
  std::map<std::string, std::string>* shell_env = nullptr;
};

// Word splitting must not split `${{ params.NAME }}` at its spaces: each expression is
// replaced by a spaceless marker (\x01 N \x01) and put back into the word it landed in.
const std::regex& ExpressionPattern() {
  static const std::regex e(R"(\$\{\{[^}]*\}\})");
  return e;
}
std::string HideExpressions(const std::string& text) {
  std::string out;
  int n = 0;
  auto begin = std::sregex_iterator(text.begin(), text.end(), ExpressionPattern());
  size_t pos = 0;
  for (auto it = begin; it != std::sregex_iterator(); ++it, ++n) {
    out += text.substr(pos, it->position() - pos) + "\x01" + std::to_string(n) + "\x01";
    pos = it->position() + it->length();
  }
  return out + text.substr(pos);
}
std::string ShowExpressions(const std::string& word, const std::string& text) {
  std::vector<std::string> exprs;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), ExpressionPattern());
       it != std::sregex_iterator(); ++it)
    exprs.push_back(it->str());
  std::string out;
  for (size_t i = 0; i < word.size(); ++i) {
    size_t end = word[i] == '\x01' ? word.find('\x01', i + 1) : std::string::npos;
    std::string digits = end == std::string::npos ? "" : word.substr(i + 1, end - i - 1);
    if (digits.empty() || digits.size() > 9 ||
        digits.find_first_not_of("0123456789") != std::string::npos ||
        std::stoul(digits) >= exprs.size()) {
      out += word[i];  // not a marker of ours: the text's own character
      continue;
    }
    out += exprs[std::stoul(digits)];
    i = end;
  }
  return out;
}

// The environment variable a parameter or matrix value reaches a shell command as.
std::string ShellVariable(const std::string& prefix, const std::string& name) {
  std::string v = prefix;
  for (char c : name) v += std::isalnum(static_cast<unsigned char>(c)) ? std::toupper(c) : '_';
  return v;
}

const std::vector<std::string> kRootKeys = {"pipeline",   "project",    "description", "params",
                                            "budget_usd", "simulation", "defaults",    "stages"};
const std::vector<std::string> kCommonStageKeys = {"kind",   "needs", "instance",   "count",
                                                   "market", "retry", "checkpoint", "timeout",
                                                   "cache",  "env",   "matrix",     "description"};
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

class Parser {
 public:
  Parser(const std::string& text, const std::string& file, const LoadOptions& options)
      : text_(text), options_(options), diags_(file), catalog_(sim::Catalog::Builtin()) {}

  LoadResult Run();

 private:
  // --- reading values -------------------------------------------------------------------
  // Reports duplicate and unknown keys; returns the fields the unknown keys look like typos
  // of, so a missing required field that was merely misspelled is reported once.
  std::set<std::string> CheckMap(const YamlNode& map, const std::vector<std::string>& allowed,
                                 const std::string& what);
  bool ExpectMap(const YamlNode& n, const std::string& what);
  std::optional<std::string> Text(const YamlNode& n, const std::string& what, const Scope& scope);
  // A finite number in [min, max]; with `scaled`, a count may carry a suffix: 20B, 1.5T, 100K.
  std::optional<double> Number(const YamlNode& n, const std::string& what, const Scope& scope,
                               double min, double max, bool scaled = false);
  std::optional<int> Integer(const YamlNode& n, const std::string& what, const Scope& scope,
                             int min, int max);
  std::optional<bool> Bool(const YamlNode& n, const std::string& what, const Scope& scope);
  std::optional<double> Duration(const YamlNode& n, const std::string& what, const Scope& scope);
  std::optional<std::string> Interpolate(const std::string& text, Loc loc, const Scope& scope);

  // --- sections ---------------------------------------------------------------------------
  void ParseParams(const YamlNode& n);
  void ParseStages(const YamlNode& stages);
  bool WithinStageBound(const YamlNode& stages,
                        const std::vector<std::pair<YamlNode, YamlNode>>& entries);
  void ParseStage(const std::string& name, Loc name_loc, const YamlNode& n,
                  const std::map<std::string, std::string>* matrix);
  std::optional<sim::Model> ParseModel(const YamlNode& n, const Scope& scope);
  void ParseRetry(const YamlNode& n, const Scope& scope, RetryPolicy* out);
  void ParseCheckpoint(const YamlNode& n, const Scope& scope, CheckpointPolicy* out);
  void ParseOutputs(const YamlNode& n, Loc name_loc, const Scope& scope, Stage* st);
  void ParseSecrets(const YamlNode& n, Stage* st);
  void ResolveNeeds();
  void InheritModels();

  // A stage field, or the same field from `defaults:`.
  YamlNode Field(const YamlNode& stage, const char* key) const {
    if (YamlNode v = stage[key]) return v;
    return defaults_[key];
  }

  const std::string& text_;
  const LoadOptions& options_;
  Diagnostics diags_;
  const sim::Catalog& catalog_;
  Pipeline p_;
  YamlDoc doc_;  // the file's YAML; every YamlNode below points into it
  YamlNode defaults_;
  std::map<std::string, std::vector<std::string>> expansions_;  // base name -> expanded names
  std::map<std::string, std::vector<std::pair<std::string, Loc>>> raw_needs_;  // expanded name
};

bool Parser::ExpectMap(const YamlNode& n, const std::string& what) {
  if (n.IsMap()) return true;
  diags_.Error(At(n), what + " must be a mapping of key: value",
               "indent the fields of " + what + " under it");
  return false;
}

std::set<std::string> Parser::CheckMap(const YamlNode& map,
                                       const std::vector<std::string>& allowed,
                                       const std::string& what) {
  std::set<std::string> seen, typo_of;
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (!it->first.IsScalar()) {
      diags_.Error(At(it->first), "a key in " + what + " must be a plain name");
      continue;
    }
    std::string key = it->first.Scalar();
    if (!seen.insert(key).second) {
      diags_.Error(At(it->first), "duplicate key '" + key + "' in " + what,
                   "each key may appear once; remove or rename one of them");
      continue;
    }
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      std::string close = ClosestMatch(key, allowed);
      if (size_t colon = key.find(':'); colon != std::string::npos) {
        // `instance:c6i.xlarge` is one plain scalar in YAML: the space is what makes a key.
        std::string field = key.substr(0, colon);
        if (std::find(allowed.begin(), allowed.end(), field) != allowed.end()) {
          typo_of.insert(field);
          diags_.Error(
              At(it->first), "unknown field '" + key + "' in " + what,
              "put a space after the colon: `" + field + ": " + key.substr(colon + 1) + "`");
          continue;
        }
      }
      if (!close.empty()) typo_of.insert(close);
      diags_.Error(
          At(it->first), "unknown field '" + key + "' in " + what,
          close.empty() ? "allowed here: " + Join(allowed, ", ") : "did you mean '" + close + "'?");
    }
  }
  return typo_of;
}

std::optional<std::string> Parser::Interpolate(const std::string& text, Loc loc,
                                               const Scope& scope) {
  std::string out;
  size_t pos = 0;
  bool ok = true;
  while (true) {
    size_t open = text.find("${{", pos);
    if (open == std::string::npos) {
      out += text.substr(pos);
      break;
    }
    out += text.substr(pos, open - pos);
    Loc at{loc.line, loc.col + static_cast<int>(open)};
    size_t close = text.find("}}", open + 3);
    if (close == std::string::npos) {
      diags_.Error(at, "unterminated expression '" + text.substr(open) + "'",
                   "close it with '}}', as in ${{ params.NAME }}");
      return std::nullopt;
    }
    std::string expr = text.substr(open + 3, close - open - 3);
    expr.erase(0, expr.find_first_not_of(" \t"));
    expr.erase(expr.find_last_not_of(" \t") + 1);
    size_t dot = expr.find('.');
    std::string ns = expr.substr(0, dot);
    std::string name = dot == std::string::npos ? "" : expr.substr(dot + 1);
    if (ns == "params" && scope.params) {
      auto it = scope.params->find(name);
      if (it == scope.params->end()) {
        std::vector<std::string> names;
        for (const auto& [k, v] : *scope.params) names.push_back(k);
        std::string hint = DidYouMean(name, names);
        diags_.Error(at, "unknown parameter '" + name + "' in ${{ " + expr + " }}",
                     hint.empty() ? "declare it under params: at the top of the file" : hint);
        ok = false;
      } else if (scope.shell_env) {
        std::string var = ShellVariable("TRNFLOW_PARAM_", name);
        (*scope.shell_env)[var] = it->second;
        out += "\"${" + var + "}\"";
      } else {
        out += it->second;
      }
    } else if (ns == "matrix") {
      if (!scope.matrix) {
        diags_.Error(at, "${{ " + expr + " }} is used outside a matrix stage",
                     "add a matrix: to this stage, or use ${{ params.NAME }}");
        ok = false;
      } else if (auto it = scope.matrix->find(name); it == scope.matrix->end()) {
        std::vector<std::string> names;
        for (const auto& [k, v] : *scope.matrix) names.push_back(k);
        std::string hint = DidYouMean(name, names);
        diags_.Error(at, "unknown matrix key '" + name + "'",
                     hint.empty() ? "the matrix has: " + Join(names, ", ") : hint);
        ok = false;
      } else if (scope.shell_env) {
        std::string var = ShellVariable("TRNFLOW_MATRIX_", name);
        (*scope.shell_env)[var] = it->second;
        out += "\"${" + var + "}\"";
      } else {
        out += it->second;
      }
    } else if (ns == "run" && (name == "id" || name == "dir")) {
      out += "${{ run." + name + " }}";  // known only when the run exists
    } else if (ns == "stage" && name == "name" && !scope.stage.empty()) {
      out += scope.stage;
    } else {
      diags_.Error(at, "unknown expression '${{ " + expr + " }}'",
                   "expressions are ${{ params.NAME }}, ${{ matrix.NAME }}, ${{ run.id }}, "
                   "${{ run.dir }} and ${{ stage.name }}");
      ok = false;
    }
    pos = close + 2;
  }
  if (!ok) return std::nullopt;
  return out;
}

std::optional<std::string> Parser::Text(const YamlNode& n, const std::string& what,
                                        const Scope& scope) {
  if (!n.IsScalar()) {
    diags_.Error(At(n), what + " must be a single value, not a " +
                            (n.IsMap()        ? "mapping"
                             : n.IsSequence() ? "list"
                                              : "null"));
    return std::nullopt;
  }
  Loc loc = At(n);
  // A quoted scalar's mark is its opening quote; its text starts one column later.
  const YAML::Mark m = n.Mark();
  if (!m.is_null() && m.pos >= 0 && static_cast<size_t>(m.pos) < text_.size() &&
      (text_[m.pos] == '"' || text_[m.pos] == '\''))
    loc.col += 1;
  return Interpolate(n.Scalar(), loc, scope);
}

std::optional<double> Parser::Number(const YamlNode& n, const std::string& what,
                                     const Scope& scope, double min, double max, bool scaled) {
  auto text = Text(n, what, scope);
  if (!text) return std::nullopt;
  std::string s = *text;
  double scale = 1;
  if (scaled && s.size() > 1) {
    switch (s.back()) {
      case 'K':
        scale = 1e3;
        break;
      case 'M':
        scale = 1e6;
        break;
      case 'B':
      case 'G':
        scale = 1e9;
        break;
      case 'T':
        scale = 1e12;
        break;
      default:
        break;
    }
    if (scale != 1) s.pop_back();
  }
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  bool numeric =
      !s.empty() && end == s.c_str() + s.size() && s.find_first_of("xXpP") == std::string::npos;
  std::string lower = s;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  if (lower.find("nan") != std::string::npos || lower.find("inf") != std::string::npos ||
      (numeric && !std::isfinite(v)) || errno == ERANGE) {
    diags_.Error(At(n), what + " must be a finite number, not '" + *text + "'");
    return std::nullopt;
  }
  if (!numeric) {
    diags_.Error(At(n), what + " must be a number, not '" + *text + "'",
                 scaled ? "write 2048, 2.0e10 or 20B (K, M, B, T)"
                        : "write plain or scientific notation, e.g. 2048 or 2.0e10");
    return std::nullopt;
  }
  v *= scale;
  if (v < min || v > max) {
    std::ostringstream range;
    range << what << " must be between " << min << " and " << max << ", not " << *text;
    diags_.Error(At(n), range.str());
    return std::nullopt;
  }
  return v;
}

std::optional<int> Parser::Integer(const YamlNode& n, const std::string& what, const Scope& scope,
                                   int min, int max) {
  auto v = Number(n, what, scope, min, max);
  if (!v) return std::nullopt;
  if (*v != std::floor(*v)) {
    diags_.Error(At(n), what + " must be a whole number, not " + n.Scalar());
    return std::nullopt;
  }
  return static_cast<int>(*v);
}

std::optional<bool> Parser::Bool(const YamlNode& n, const std::string& what, const Scope& scope) {
  auto text = Text(n, what, scope);
  if (!text) return std::nullopt;
  if (*text == "true") return true;
  if (*text == "false") return false;
  diags_.Error(At(n), what + " must be true or false, not '" + *text + "'");
  return std::nullopt;
}

std::optional<double> Parser::Duration(const YamlNode& n, const std::string& what,
                                       const Scope& scope) {
  auto text = Text(n, what, scope);
  if (!text) return std::nullopt;
  auto d = ParseDuration(*text);
  if (!d) {
    static const std::regex zero(R"(^(0+(\.0*)?[dhms]?)+$)");
    if (std::regex_match(*text, zero))
      diags_.Error(At(n), what + " must be longer than zero, not '" + *text + "'",
                   "give it a positive duration like 30s, 10m or 2h, or leave it out");
    else
      diags_.Error(At(n), what + " must be a duration, not '" + *text + "'",
                   "write it like 30s, 10m, 2h or 1h30m");
    return std::nullopt;
  }
  if (*d > 365.0 * 86400) {
    diags_.Error(At(n), what + " of " + *text + " is longer than a year",
                 "durations are capped at 365d");
    return std::nullopt;
  }
  return d;
}

void Parser::ParseParams(const YamlNode& n) {
  if (!ExpectMap(n, "params")) return;
  std::set<std::string> seen;
  for (auto it = n.begin(); it != n.end(); ++it) {
    std::string key = it->first.Scalar();
    if (!seen.insert(key).second) {
      diags_.Error(At(it->first), "duplicate parameter '" + key + "'");
      continue;
    }
    if (!it->second.IsScalar()) {
      diags_.Error(At(it->second, At(it->first)),
                   "parameter '" + key + "' must be a single value (number or string)");
      continue;
    }
    p_.params[key] = it->second.Scalar();
  }
  for (const auto& [key, value] : options_.params) {
    if (!p_.params.count(key)) {
      std::vector<std::string> names;
      for (const auto& [k, v] : p_.params) names.push_back(k);
      std::string hint = DidYouMean(key, names);
      diags_.Error({}, "--param " + key + ": the pipeline has no parameter '" + key + "'",
                   hint.empty() ? "its parameters: " + Join(names, ", ") : hint);
      continue;
    }
    p_.params[key] = value;
  }
}

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

// outputs: the paths a run: stage writes, each under ${{ run.dir }}/ (kept relative to it). A
// cached stage that writes into the run's directory must say what it writes: a hit has to
// restore it, and a key over the command alone cannot tell one run's files from another's.
// `secrets: [NAME, ...]`: names only, resolved by the worker. An env: value under a name that
// looks like a credential is stored in the catalog for every project member to read: warn.
void Parser::ParseSecrets(const YamlNode& n, Stage* st) {
  static const std::regex name(R"([A-Z_][A-Z0-9_]{0,127})");
  static const std::regex looks_secret(
      R"((^|_)(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIALS?)($|_))");
  if (const YamlNode& e = n["env"]; e && e.IsMap())
    for (auto it = e.begin(); it != e.end(); ++it) {
      std::string key = it->first.Scalar();
      std::string upper = key;
      for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      if (std::regex_search(upper, looks_secret) && it->second.IsScalar() &&
          !it->second.Scalar().empty())
        diags_.Warning(At(it->first),
                       "env." + key +
                           " looks like a credential; env: values are stored in the "
                           "catalog and shown to the project's members",
                       "declare it as a secret instead: secrets: [" + key +
                           "] (resolved on the worker host, never stored)");
    }
  const YamlNode& sec = n["secrets"];
  if (!sec) return;
  if (!sec.IsSequence()) {
    diags_.Error(At(sec), "secrets must be a list of names", "e.g. secrets: [HF_TOKEN]");
    return;
  }
  for (const auto& x : sec) {
    if (!x.IsScalar() || !std::regex_match(x.Scalar(), name)) {
      diags_.Error(At(x), "a secret is named like an environment variable: A-Z, 0-9 and _",
                   "e.g. secrets: [HF_TOKEN]; its value comes from the worker host");
      continue;
    }
    if (st->spec.command.env.count(x.Scalar()))
      diags_.Error(At(x), "'" + x.Scalar() + "' is both in env: and in secrets:",
                   "keep it in secrets: only");
    st->spec.command.secrets.push_back(x.Scalar());
  }
}

void Parser::ParseOutputs(const YamlNode& n, Loc name_loc, const Scope& scope, Stage* st) {
  const std::string prefix = "${{ run.dir }}/";
  if (const YamlNode& o = n["outputs"]) {
    if (!o.IsSequence()) {
      diags_.Error(At(o), "outputs must be a list of paths under ${{ run.dir }}",
                   "e.g. outputs: [\"${{ run.dir }}/data\"]");
      return;
    }
    std::vector<std::string> rels;
    for (const auto& x : o) {
      auto v = Text(x, "outputs entry", scope);
      if (!v) continue;
      std::string rel = v->rfind(prefix, 0) == 0 ? v->substr(prefix.size()) : "";
      bool escapes = ("/" + rel + "/").find("/../") != std::string::npos ||
                     rel.find("${{") != std::string::npos;
      if (rel.empty() || rel[0] == '/' || escapes)
        diags_.Error(At(x), "output '" + *v + "' is not a path inside ${{ run.dir }}",
                     "name what the stage writes as \"${{ run.dir }}/<path>\"");
      else
        rels.push_back(rel);
    }
    st->spec.command.outputs = rels;
    return;
  }
  if (!st->spec.cache) return;
  for (const auto& a : st->spec.command.argv)
    if (a.find("${{ run.dir }}") != std::string::npos) {
      YamlNode c = Field(n, "cache");
      diags_.Error(At(c, name_loc),
                   "stage '" + st->base_name +
                       "' is cached but writes into ${{ run.dir }} without saying what",
                   "list what it writes in outputs: (a cache hit restores them), write "
                   "outputs: [] if it only reads, or set cache: false");
      return;
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

// Stage counts multiply before anything is expanded: a stage makes the product of its matrix
// lists' lengths, and an alias (`s2: *s1`) is one more entry of the same product, so 1.9 KB of
// YAML can name a million stages. They are counted here from the lists' sizes alone (no
// combination is made, nothing is allocated per stage) and refused past the project's bound
// before the first expansion. Malformed matrices count as one stage; the loop reports them.
bool Parser::WithinStageBound(const YamlNode& stages,
                              const std::vector<std::pair<YamlNode, YamlNode>>& entries) {
  constexpr int64_t kSaturated = int64_t{1} << 62;
  int64_t total = 0, largest = 0;
  size_t with_matrix = 0;
  std::string largest_name;
  Loc largest_loc;
  for (const auto& [key, node] : entries) {
    if (!node.IsMap()) continue;
    int64_t n = 1;
    if (const YamlNode matrix = node["matrix"]; matrix && matrix.IsMap()) {
      ++with_matrix;
      for (auto m = matrix.begin(); m != matrix.end(); ++m)
        if (m->second.IsSequence() && m->second.size() > 0) {
          // A list holds at most the file's 8 MiB of items: the product saturates, never wraps.
          auto len = static_cast<int64_t>(m->second.size());
          n = n > kSaturated / len ? kSaturated : n * len;
        }
    }
    total = std::min(kSaturated, total + n);
    if (n > largest) largest = n, largest_name = key.Scalar(), largest_loc = At(key);
  }
  StageBound bound = options_.stage_bound ? options_.stage_bound(p_.project) : StageBound{};
  if (size_t at = bound.hint.find("PROJECT"); at != std::string::npos && !p_.project.empty())
    bound.hint.replace(at, 7, p_.project);
  if (total <= bound.max_stages) return true;
  std::string count = total >= kSaturated ? "more than 4611686018427387904" : std::to_string(total);
  std::string detail =
      largest > 1 ? " (" + std::to_string(with_matrix) + " of its " +
                        std::to_string(entries.size()) + " stages have a matrix; '" + largest_name +
                        "' at " + std::to_string(largest_loc.line) + ":" +
                        std::to_string(largest_loc.col) + " alone makes " +
                        std::to_string(largest) + ")"
                  : "";
  diags_.Error(At(stages), "the pipeline's stages expand to " + count + " stages" + detail +
                               "; " + bound.why,
               bound.hint);
  return false;
}

void Parser::ParseStages(const YamlNode& stages) {
  if (stages.IsSequence()) {
    diags_.Error(At(stages), "stages must be a mapping from stage name to stage, not a list",
                 "write `  train:` with the stage's fields indented under it, not `- train`");
    return;
  }
  if (!ExpectMap(stages, "stages")) return;
  if (stages.size() == 0) {
    diags_.Error(At(stages), "the pipeline has no stages", "add at least one under stages:");
    return;
  }
  std::vector<std::pair<YamlNode, YamlNode>> entries;
  for (auto it = stages.begin(); it != stages.end(); ++it)
    entries.push_back({it->first, it->second});
  if (!WithinStageBound(stages, entries)) return;
  p_.stages.reserve(entries.size());  // a matrix may add more
  std::set<std::string> field_names(kCommonStageKeys.begin(), kCommonStageKeys.end());
  for (const auto& [kind, keys] : kKindKeys) field_names.insert(keys.begin(), keys.end());
  std::set<std::string> seen;
  for (size_t e = 0; e < entries.size(); ++e) {
    const YamlNode& key = entries[e].first;
    Loc name_loc = At(key);
    if (!key.IsScalar()) {
      diags_.Error(name_loc, "a stage name must be a plain name");
      continue;
    }
    std::string name = key.Scalar();
    // `prep:` followed by its fields at the same indentation: YAML reads the fields as more
    // stages. Say so once instead of once per field.
    if (entries[e].second.IsNull() && e + 1 < entries.size() && entries[e + 1].first.IsScalar() &&
        field_names.count(entries[e + 1].first.Scalar())) {
      std::vector<std::string> fields;
      while (e + 1 < entries.size() && entries[e + 1].first.IsScalar() &&
             field_names.count(entries[e + 1].first.Scalar()))
        fields.push_back(entries[++e].first.Scalar());
      diags_.Error(name_loc,
                   "stage '" + name + "' has no fields: " + Join(fields, ", ") +
                       " below it are not indented under it",
                   "indent the fields of '" + name + "' two spaces more than its name");
      continue;
    }
    if (!seen.insert(name).second) {
      diags_.Error(name_loc, "duplicate stage name '" + name + "'",
                   "stage names must be unique; rename one of them");
      continue;
    }
    if (!std::regex_match(name, kStageName)) {
      diags_.Error(name_loc, "invalid stage name '" + name + "'",
                   "use letters, digits, '-' and '_' (at most 63), starting with a letter or "
                   "digit");
      continue;
    }
    const YamlNode node = entries[e].second;
    if (!node.IsMap()) {
      diags_.Error(node.IsNull() ? name_loc : At(node, name_loc),
                   "stage '" + name + "' must be a mapping of its fields",
                   "give it at least run: or kind:");
      continue;
    }
    const YamlNode matrix = node["matrix"];
    if (!matrix) {
      ParseStage(name, name_loc, node, nullptr);
      continue;
    }
    // Expand the matrix: one stage per combination, keys sorted, values as listed.
    if (!matrix.IsMap() || matrix.size() == 0) {
      diags_.Error(At(matrix, name_loc), "matrix of stage '" + name + "' is empty or not a mapping",
                   "write matrix: {key: [value, ...]}");
      continue;
    }
    std::map<std::string, std::vector<std::string>> axes;
    bool ok = true;
    for (auto m = matrix.begin(); m != matrix.end(); ++m) {
      std::string key = m->first.Scalar();
      if (axes.count(key)) {
        diags_.Error(At(m->first), "duplicate matrix key '" + key + "'");
        ok = false;
        continue;
      }
      if (!m->second.IsSequence() || m->second.size() == 0) {
        diags_.Error(At(m->second, At(m->first)),
                     "matrix key '" + key + "' must be a non-empty list of values");
        ok = false;
        continue;
      }
      std::set<std::string> values;
      const YamlNode list = m->second;  // a copy: the iterator's value is a temporary
      for (const auto& v : list) {
        if (!v.IsScalar()) {
          diags_.Error(At(v), "matrix values must be single values");
          ok = false;
        } else if (v.Scalar().find_first_of(std::string("/\x7f\0", 3)) != std::string::npos ||
                   std::any_of(v.Scalar().begin(), v.Scalar().end(),
                               [](char c) { return static_cast<unsigned char>(c) < 0x20; })) {
          // The value becomes part of the stage's name, which names its files on the workers.
          diags_.Error(At(v), "matrix value '" + v.Scalar() + "' of key '" + key +
                                  "' holds '/' or a control character",
                       "a matrix value is part of the stage's name: use a plain word, and pass "
                       "paths as params");
          ok = false;
        } else if (!values.insert(v.Scalar()).second) {
          diags_.Error(At(v), "duplicate value '" + v.Scalar() + "' in matrix key '" + key + "'");
          ok = false;
        } else {
          axes[key].push_back(v.Scalar());
        }
      }
    }
    if (!ok) continue;
    size_t combos = 1;
    for (const auto& [k, v] : axes) combos *= v.size();
    if (combos > 10'000) {
      diags_.Error(
          At(matrix),
          "matrix of stage '" + name + "' expands to " + std::to_string(combos) + " stages",
          "at most 10000 combinations per stage");
      continue;
    }
    std::vector<size_t> idx(axes.size(), 0);
    for (size_t c = 0; c < combos; ++c) {
      std::map<std::string, std::string> values;
      std::string expanded = name + "[";
      size_t k = 0;
      for (const auto& [key, vals] : axes) {
        values[key] = vals[idx[k]];
        expanded += (k ? "," : "") + key + "=" + vals[idx[k]];
        ++k;
      }
      expanded += "]";
      if (expanded.size() > 255) {
        diags_.Error(At(matrix), "matrix of stage '" + name + "' makes the stage name '" +
                                     expanded.substr(0, 80) + "...' longer than 255 bytes",
                     "use shorter matrix keys and values");
        break;
      }
      expansions_[name].push_back(expanded);
      ParseStage(expanded, name_loc, node, &values);
      for (size_t d = axes.size(); d-- > 0;) {  // odometer, last key fastest
        if (++idx[d] < std::next(axes.begin(), d)->second.size()) break;
        idx[d] = 0;
      }
    }
  }
}

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
    const YamlNode& run = n["run"];
    bool shell = false;
    if (n["shell"])
      if (auto v = Bool(n["shell"], "shell", scope)) shell = *v;
    if (run.IsSequence()) {
      if (shell)
        diags_.Error(At(n["shell"]), "shell: true takes a string command, not a list",
                     "write run: \"cmd arg | other\" or drop shell: true");
      for (const auto& a : run)
        if (auto v = Text(a, "run argument", scope)) st.spec.command.argv.push_back(*v);
      if (run.size() == 0)
        diags_.Error(At(run), "run: is an empty list", "name the program to run");
    } else if (run.IsScalar()) {
      // A parameter's value is data, never code: in shell text it is a quoted variable, and a
      // command without a shell is split into words before values are put into them.
      if (shell) {
        Scope quoted = scope;
        std::map<std::string, std::string> values;
        quoted.shell_env = &values;
        if (auto v = Text(run, "run", quoted)) {
          st.spec.command.argv = {*v};
          st.spec.command.shell = true;
          for (auto& [k, val] : values) st.spec.command.env.emplace(k, val);
        }
      } else if (run.Scalar().find_first_of(std::string("\x01\r\n\0", 4)) !=
                 std::string::npos) {
        diags_.Error(At(run), "run: holds a control character or a line break",
                     "write one command on one line, or use shell: true for a script");
      } else if (!Text(run, "run", scope)) {
        // the expression's error is reported; nothing to split
      } else if (auto words = SplitWords(HideExpressions(run.Scalar())); !words) {
        diags_.Error(At(run), "unbalanced quote in run: command");
      } else if (words->empty()) {
        diags_.Error(At(run), "run: is empty", "name the program to run");
      } else if (std::string bare =
                     std::regex_replace(run.Scalar(), std::regex(R"(\$\{\{[^}]*\}\})"), "");
                 bare.find_first_of("|&;<>`$*?") != std::string::npos) {
        char c = bare[bare.find_first_of("|&;<>`$*?")];
        diags_.Error(
            At(run),
            std::string("run: uses the shell character '") + c + "' but runs without a shell",
            "add shell: true to run it under /bin/sh, or write the command as a list");
      } else {
        for (const auto& w : *words)
          if (auto v = Interpolate(ShowExpressions(w, run.Scalar()), At(run), scope))
            st.spec.command.argv.push_back(*v);
      }
    } else {
      diags_.Error(At(run, name_loc), "run: must be a command: a list of arguments or a string",
                   "e.g. run: [\"bash\", \"script.sh\"]");
    }
    ParseOutputs(n, name_loc, scope, &st);
    ParseSecrets(n, &st);
    // `network: host`: the command shares the worker's network, where the operator allows it;
    // `none` (the default): a network namespace with loopback only.
    if (const YamlNode& net = n["network"])
      if (auto v = Text(net, "network", scope)) {
        if (*v != "host" && *v != "none")
          diags_.Error(At(net), "network must be none or host, not '" + *v + "'",
                       "network: host, for a stage that downloads (the worker must allow it: "
                       "trnflow worker --allow-network)");
        st.spec.command.network = *v == "host";
      }
    // How long the command runs, for `plan` and budget admission; the engine cannot know.
    if (const YamlNode& e = n["estimate"])
      if (auto v = Duration(e, "estimate", scope)) st.estimate_s = *v;
    p_.stages.push_back(std::move(st));
    return;
  }

  // Simulated work.
  sim::Workload w;
  w.kind = *kind;
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
  switch (*kind) {
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
  st.workload = w;
  p_.stages.push_back(std::move(st));
}

void Parser::ResolveNeeds() {
  std::vector<std::string> names;
  std::set<std::string> all;
  for (const auto& s : p_.stages) {
    all.insert(s.spec.name);
    if (names.empty() || names.back() != s.base_name) names.push_back(s.base_name);
  }
  for (auto& s : p_.stages) {
    std::set<std::string> seen, added;
    for (const auto& [need, loc] : raw_needs_[s.spec.name]) {
      std::vector<std::string> targets;
      if (auto e = expansions_.find(need); e != expansions_.end()) {
        targets = e->second;
      } else if (all.count(need)) {
        targets = {need};
      } else {
        std::vector<std::string> others;
        for (const auto& n : names)
          if (n != s.base_name) others.push_back(n);
        std::string hint = DidYouMean(need, others);
        if (need.find(',') != std::string::npos) hint = "needs takes a list: needs: [" + need + "]";
        diags_.Error(loc, "stage '" + s.base_name + "' needs unknown stage '" + need + "'",
                     hint.empty() ? "stages: " + Join(others, ", ") : hint);
        continue;
      }
      if (!seen.insert(need).second) {
        diags_.Warning(loc, "stage '" + s.base_name + "' lists '" + need + "' in needs twice",
                       "remove the repeat");
        continue;
      }
      if (need == s.base_name || need == s.spec.name) {
        diags_.Error(loc, "stage '" + s.base_name + "' needs itself",
                     "remove '" + need + "' from its needs");
        continue;
      }
      for (const auto& t : targets)
        if (added.insert(t).second) s.needs.push_back(t);
    }
  }
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

// The offset of the first byte that is not valid UTF-8, or npos. YAML files are UTF-8 text;
// anything else would travel into the catalog as JSON that cannot be written.
size_t InvalidUtf8(const std::string& text) {
  size_t i = 0, n = text.size();
  while (i < n) {
    auto c = static_cast<unsigned char>(text[i]);
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xE  ? 3
                 : (c >> 3) == 0x1E ? 4
                                    : 0;
    if (len == 0 || i + len > n || (len == 2 && c < 0xC2)) return i;
    for (size_t k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(text[i + k]) >> 6) != 0x2) return i;
    i += len;
  }
  return std::string::npos;
}

Loc LocOfOffset(const std::string& text, size_t offset) {
  Loc loc{1, 1};
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n')
      loc.line++, loc.col = 1;
    else
      loc.col++;
  }
  return loc;
}

// yaml-cpp reports where it gave up, often a line or more past the real mistake. After a
// syntax error, look for the usual culprits before the place it names: a tab in the
// indentation, a flow list or mapping never closed, a quoted string never closed.
std::optional<Diagnostic> ExplainSyntaxError(const std::string& text, size_t error_offset) {
  size_t limit = std::min(error_offset, text.size());
  size_t line_start = 0;
  int line = 1;
  std::vector<std::pair<char, Loc>> open;  // unclosed '[' and '{'
  std::optional<Loc> open_quote;
  while (line_start <= limit && line_start < text.size()) {
    size_t end = text.find('\n', line_start);
    if (end == std::string::npos) end = text.size();
    std::string l = text.substr(line_start, end - line_start);
    size_t indent = l.find_first_not_of(' ');
    if (indent != std::string::npos && l[indent] == '\t')
      return Diagnostic{Severity::kError,
                        {line, static_cast<int>(indent) + 1},
                        "a tab indents this line; YAML indentation must be spaces",
                        "replace the tab with spaces"};
    char quote = 0;
    Loc quote_at;
    for (size_t i = 0; i < l.size(); ++i) {
      char c = l[i];
      if (quote) {
        if (c == '\\' && quote == '"')
          ++i;
        else if (c == quote)
          quote = 0;
        continue;
      }
      if (c == '#' && (i == 0 || l[i - 1] == ' ')) break;
      if ((c == '"' || c == '\'') && (i == 0 || std::strchr(" [{,:", l[i - 1]))) {
        quote = c;
        quote_at = {line, static_cast<int>(i) + 1};
      } else if (c == '[' || c == '{') {
        open.push_back({c, {line, static_cast<int>(i) + 1}});
      } else if ((c == ']' || c == '}') && !open.empty()) {
        open.pop_back();
      }
    }
    if (quote && !open_quote) open_quote = quote_at;
    line_start = end + 1;
    ++line;
  }
  if (open_quote)
    return Diagnostic{Severity::kError, *open_quote, "this quoted string is never closed",
                      "add the closing quote on the same line"};
  if (!open.empty()) {
    char c = open.back().first;
    return Diagnostic{Severity::kError, open.back().second,
                      std::string("this '") + c + "' is never closed",
                      std::string("close it with '") + (c == '[' ? ']' : '}') +
                          "' (a flow list or mapping must be closed)"};
  }
  return std::nullopt;
}

LoadResult Parser::Run() {
  auto done = [&]() {
    LoadResult r{std::nullopt, std::move(diags_)};
    if (!r.diagnostics.has_errors()) r.pipeline = std::move(p_);
    return r;
  };
  if (text_.size() > kMaxFileBytes) {
    diags_.Error({}, "the file is larger than 8 MiB, the limit for pipeline files",
                 "is this the right file? generate large pipelines with fewer, matrix stages");
    return done();
  }
  if (text_.find('\0') != std::string::npos) {
    diags_.Error({}, "the file contains NUL bytes: it is not a YAML text file",
                 "check the path: trnflow expects a pipeline YAML file");
    return done();
  }
  if (size_t bad = InvalidUtf8(text_); bad != std::string::npos) {
    diags_.Error(LocOfOffset(text_, bad), "the file is not valid UTF-8 text",
                 "save it as UTF-8 (iconv -f latin1 -t utf-8 FILE)");
    return done();
  }
  try {
    doc_.Load(text_);
  } catch (const YAML::ParserException& e) {
    size_t offset = e.mark.pos >= 0 ? static_cast<size_t>(e.mark.pos) : text_.size();
    if (auto why = ExplainSyntaxError(text_, offset)) {
      diags_.Error(why->loc, "invalid YAML: " + why->message, why->hint);
    } else {
      diags_.Error({e.mark.line + 1, e.mark.column + 1}, "invalid YAML: " + e.msg,
                   "check the indentation and quoting around this place");
    }
    return done();
  } catch (const YAML::Exception& e) {
    diags_.Error({}, std::string("invalid YAML: ") + e.what());
    return done();
  }
  // A stray `---` starts a second document that YAML::Load would silently drop.
  for (size_t pos = text_.find("---"); pos != std::string::npos; pos = text_.find("---", pos + 3)) {
    bool line_start = pos == 0 || text_[pos - 1] == '\n';
    bool alone =
        pos + 3 >= text_.size() || std::isspace(static_cast<unsigned char>(text_[pos + 3]));
    if (!line_start || !alone) continue;
    if (text_.find_first_not_of(" \t\r\n", 0) == pos) continue;  // a leading marker is fine
    if (text_.substr(0, pos).find_first_not_of(" \t\r\n") == std::string::npos) continue;
    bool only_comments = true;
    for (size_t l = 0; l < pos;) {
      size_t e = text_.find('\n', l);
      std::string line = text_.substr(l, (e == std::string::npos ? pos : e) - l);
      size_t first = line.find_first_not_of(" \t\r");
      if (first != std::string::npos && line[first] != '#' && line.rfind("%", 0) != 0)
        only_comments = false;
      l = e == std::string::npos ? pos : e + 1;
    }
    if (only_comments) continue;
    diags_.Error(LocOfOffset(text_, pos), "a second YAML document starts here ('---')",
                 "a pipeline file holds one document: remove the '---' line");
    return done();
  }
  const YamlNode root = doc_.Root();
  if (!root.IsMap()) {
    diags_.Error(At(root, {1, 1}), "a pipeline file must be a mapping with pipeline: and stages:",
                 "start the file with `pipeline: NAME` and a `stages:` section");
    return done();
  }
  CheckMap(root, kRootKeys, "the pipeline");
  Scope top{&p_.params, nullptr, ""};
  if (!root["pipeline"]) {
    diags_.Error(At(root, {1, 1}), "missing required field 'pipeline'",
                 "add `pipeline: my-pipeline`");
  } else if (auto v = Text(root["pipeline"], "pipeline", top)) {
    if (!std::regex_match(*v, kPipelineName))
      diags_.Error(At(root["pipeline"]), "invalid pipeline name '" + *v + "'",
                   "use lowercase letters, digits and '-', starting with a letter or digit");
    p_.name = *v;
  }
  if (root["params"])
    ParseParams(root["params"]);
  else if (!options_.params.empty())
    for (const auto& [k, v] : options_.params)
      diags_.Error({}, "--param " + k + ": the pipeline declares no params",
                   "add a params: section with its default");
  if (root["description"])
    if (auto v = Text(root["description"], "description", top)) p_.description = *v;
  if (!options_.project.empty()) {
    p_.project = options_.project;
  } else if (root["project"]) {
    if (auto v = Text(root["project"], "project", top)) p_.project = *v;
  } else {
    diags_.Error(At(root, {1, 1}), "missing field 'project'",
                 "add `project: NAME` to the file or pass --project NAME");
  }
  if (!p_.project.empty() && !std::regex_match(p_.project, kProjectName))
    diags_.Error(root["project"] && options_.project.empty() ? At(root["project"]) : Loc{},
                 "invalid project name '" + p_.project + "'",
                 ProjectNameHint(p_.project));
  if (root["budget_usd"])
    if (auto v = Number(root["budget_usd"], "budget_usd", top, 0.01, 1e9))
      p_.budget = Money::FromUsd(*v);
  if (const YamlNode& sim = root["simulation"]) {
    if (ExpectMap(sim, "simulation")) {
      CheckMap(sim, NestedKeys("simulation"), "simulation");
      if (sim["spot_rate_multiplier"])
        if (auto v =
                Number(sim["spot_rate_multiplier"], "simulation.spot_rate_multiplier", top, 0, 1e6))
          p_.spot_rate_multiplier = *v;
    }
  }
  if (const YamlNode d = root["defaults"]) {
    if (ExpectMap(d, "defaults")) {
      CheckMap(d, kDefaultsKeys, "defaults");
      defaults_ = d;
    }
  }
  if (!root["stages"]) {
    diags_.Error(At(root, {1, 1}), "missing required field 'stages'",
                 "add a stages: mapping of stage name to stage");
    return done();
  }
  ParseStages(root["stages"]);
  ResolveNeeds();
  if (auto cycle = FindCycle(p_.stages)) {
    const Stage* first = p_.Find(cycle->front());
    diags_.Error(first ? first->loc : Loc{}, "dependency cycle: " + Join(*cycle, " -> "),
                 "remove one of these needs to break the cycle");
    return done();
  }
  InheritModels();
  // Hardware rules need a well-formed pipeline; they run once the structure is sound.
  if (!diags_.has_errors()) CheckPipeline(p_, diags_);
  p_.source = text_;
  p_.spec_hash = Sha256Hex(text_);
  return done();
}

}  // namespace

const Stage* Pipeline::Find(const std::string& name) const {
  for (const auto& s : stages)
    if (s.spec.name == name) return &s;
  return nullptr;
}

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

StageBound QuotaStageBound(const std::string& project, int64_t max_stages_per_run,
                           int64_t max_queued_stages, int64_t unfinished) {
  StageBound b;
  int64_t left = std::max<int64_t>(0, max_queued_stages - unfinished);
  if (left < max_stages_per_run) {
    b.max_stages = left;
    b.why = "project \"" + project + "\" has " + std::to_string(unfinished) +
            " unfinished stages, room for " + std::to_string(left) + " more under its quota of " +
            std::to_string(max_queued_stages);
    b.hint = "wait for running work to finish, split the sweep, or an administrator raises it: "
             "trnflow project add " + project + " --max-queued-stages N";
  } else {
    b.max_stages = max_stages_per_run;
    b.why = "project \"" + project + "\" allows at most " +
            std::to_string(max_stages_per_run) + " per run";
    b.hint = "split the sweep into several runs, or an administrator raises the quota: "
             "trnflow project add " + project + " --max-stages-per-run N";
  }
  return b;
}

LoadResult ParsePipeline(const std::string& text, const std::string& file,
                         const LoadOptions& options) {
  Parser parser(text, file, options);
  LoadResult r = parser.Run();
  if (r.pipeline) r.pipeline->file = file;
  return r;
}

LoadResult LoadPipelineFile(const std::string& path, const LoadOptions& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    Diagnostics d(path);
    d.Error({}, "cannot read the file", "check the path and its permissions");
    return {std::nullopt, std::move(d)};
  }
  std::string text;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, in.gcount());
    if (text.size() > kMaxFileBytes) break;  // Run() reports the size
  }
  return ParsePipeline(text, path, options);
}

std::string CompileCacheInputs(const sim::Workload& w) {
  std::vector<std::string> flags = w.compiler_flags;
  std::sort(flags.begin(), flags.end());
  // The model's architecture as the workload serializes it (its name, size, shape and
  // operators); nlohmann::json objects keep their keys sorted, so the dump is canonical.
  nlohmann::json model = nlohmann::json::parse(sim::ToJson(w)).at("model");
  nlohmann::json j = {{"model", model},
                      {"batch", w.batch},
                      {"seq_len", w.seq_len},
                      {"dtype", w.dtype},
                      {"tp_degree", w.tp_degree},
                      {"target", w.target},
                      {"compiler", kCompilerVersion},
                      {"compiler_flags", flags}};
  return j.dump();
}

// The rule for a project's name, said when one is refused.
std::string ProjectNameHint(const std::string& name) {
  std::string hint =
      "use lowercase letters, digits, '-' and '_', starting with a letter or digit, at most 63";
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower != name && std::regex_match(lower, kProjectName)) hint += "; write '" + lower + "'";
  return hint;
}

}  // namespace trnflow::pipelines
