// `${{ ... }}` expressions in a value: params, matrix values, run.id, run.dir and stage.name.
// Outside shell text a value is pasted in; in shell text (Scope::shell_env set) it becomes a
// quoted environment variable, never code. An unknown name is a located error with its hint.
#include <cctype>

#include "pipelines/parse_context.h"

namespace trnflow::pipelines::parse {
namespace {

// The environment variable a parameter or matrix value reaches a shell command as.
std::string ShellVariable(const std::string& prefix, const std::string& name) {
  std::string v = prefix;
  for (char c : name) v += std::isalnum(static_cast<unsigned char>(c)) ? std::toupper(c) : '_';
  return v;
}

}  // namespace

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

}  // namespace trnflow::pipelines::parse
