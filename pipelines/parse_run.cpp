// A run: stage's command: a list of arguments, a string split into words without a shell, or
// shell text (shell: true) where values reach the script as quoted variables; its outputs:,
// secrets: (and env: values that look like credentials), network: and estimate:.
#include <cctype>
#include <regex>

#include "pipelines/parse_context.h"

namespace trnflow::pipelines::parse {
namespace {

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

}  // namespace

void Parser::ParseCommand(const YamlNode& n, Loc name_loc, const Scope& scope, Stage* st) {
  const YamlNode& run = n["run"];
  bool shell = false;
  if (n["shell"])
    if (auto v = Bool(n["shell"], "shell", scope)) shell = *v;
  if (run.IsSequence()) {
    if (shell)
      diags_.Error(At(n["shell"]), "shell: true takes a string command, not a list",
                   "write run: \"cmd arg | other\" or drop shell: true");
    for (const auto& a : run)
      if (auto v = Text(a, "run argument", scope)) st->spec.command.argv.push_back(*v);
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
        st->spec.command.argv = {*v};
        st->spec.command.shell = true;
        for (auto& [k, val] : values) st->spec.command.env.emplace(k, val);
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
          st->spec.command.argv.push_back(*v);
    }
  } else {
    diags_.Error(At(run, name_loc), "run: must be a command: a list of arguments or a string",
                 "e.g. run: [\"bash\", \"script.sh\"]");
  }
  ParseOutputs(n, name_loc, scope, st);
  ParseSecrets(n, st);
  // `network: host`: the command shares the worker's network, where the operator allows it;
  // `none` (the default): a network namespace with loopback only.
  if (const YamlNode& net = n["network"])
    if (auto v = Text(net, "network", scope)) {
      if (*v != "host" && *v != "none")
        diags_.Error(At(net), "network must be none or host, not '" + *v + "'",
                     "network: host, for a stage that downloads (the worker must allow it: "
                     "trnflow worker --allow-network)");
      st->spec.command.network = *v == "host";
    }
  // How long the command runs, for `plan` and budget admission; the engine cannot know.
  if (const YamlNode& e = n["estimate"])
    if (auto v = Duration(e, "estimate", scope)) {
      st->estimate_s = *v;
      st->spec.estimate_s = *v;  // the worker's first budget reservation, without a timeout
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

}  // namespace trnflow::pipelines::parse
