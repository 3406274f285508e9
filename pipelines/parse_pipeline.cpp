// The file and its root: size, NUL bytes, UTF-8 and YAML syntax (explained where yaml-cpp's
// place is misleading), one document only; then pipeline:, project:, description:, params:,
// budget_usd:, simulation:, defaults: and stages:, the needs, the cycle check, the models and
// the hardware checks (checks.h), in that order. ParsePipeline and LoadPipelineFile, the
// public entry points, never throw for bad input.
#include <yaml-cpp/exceptions.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>
#include <regex>

#include "common/sha256.h"
#include "pipelines/checks.h"
#include "pipelines/dag.h"
#include "pipelines/parse_context.h"

namespace trnflow::pipelines {
namespace {

constexpr size_t kMaxFileBytes = 8 << 20;

const std::regex kPipelineName("[a-z0-9][a-z0-9-]{0,62}");
// A project's name may also hold '_' (its roles spell '-' as '_'; the catalog refuses a name
// whose roles another project already has, as 'a_b' beside 'a-b').
const std::regex kProjectName("[a-z0-9][a-z0-9_-]{0,62}");

}  // namespace
}  // namespace trnflow::pipelines

namespace trnflow::pipelines::parse {
namespace {

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

}  // namespace

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
                 "invalid project name '" + p_.project + "'", ProjectNameHint(p_.project));
  if (root["budget_usd"])
    if (auto v = Number(root["budget_usd"], "budget_usd", top, 0.01, 1e9))
      p_.budget = Money::FromUsd(*v);
  if (root["priority"])
    if (auto v = Integer(root["priority"], "priority", top, -1000, 1000)) priority_ = *v;
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

}  // namespace trnflow::pipelines::parse

namespace trnflow::pipelines {

const Stage* Pipeline::Find(const std::string& name) const {
  for (const auto& s : stages)
    if (s.spec.name == name) return &s;
  return nullptr;
}

LoadResult ParsePipeline(const std::string& text, const std::string& file,
                         const LoadOptions& options) {
  parse::Parser parser(text, file, options);
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
