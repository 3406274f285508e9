// Reading one value: a mapping's keys (duplicates, unknown keys and the typos they are),
// text, numbers, whole numbers, booleans and durations, each with its range. Every reader
// reports a located diagnostic and returns nullopt on a bad value; none throws.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <regex>
#include <sstream>

#include "common/duration.h"
#include "pipelines/parse_context.h"

namespace trnflow::pipelines::parse {

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

}  // namespace trnflow::pipelines::parse
