// Day one: a newcomer reads docs/ and copies from it. The reference must list every field the
// parser accepts (and no field it refuses), its examples must validate, the architecture page
// must name every table and view the migrations leave, and no page may point outside the
// repository (a clone has nothing else).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "pipelines/pipeline.h"
#include "tests/run_cli.h"

namespace trnflow {
namespace {

namespace fs = std::filesystem;
const fs::path kRoot = TRNFLOW_SOURCE_DIR;

std::string Read(const fs::path& p) {
  std::ifstream in(p);
  EXPECT_TRUE(in) << "cannot read " << p;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The lines of `text` from the heading `## title` up to the next `## ` heading.
std::string Section(const std::string& text, const std::string& title) {
  size_t start = text.find("\n## " + title + "\n");
  if (start == std::string::npos) return "";
  size_t end = text.find("\n## ", start + 1);
  return text.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

// The first cells of the reference table's rows: "| `stages.<name>.retry.on` | ..." gives
// "stages.<name>.retry.on".
std::vector<std::string> ReferenceKeys(const std::string& section) {
  std::vector<std::string> keys;
  static const std::regex row(R"(^\| `([^`]+)` \|)");
  std::istringstream in(section);
  std::string line;
  std::smatch m;
  while (std::getline(in, line))
    if (std::regex_search(line, m, row)) keys.push_back(m[1]);
  return keys;
}

const std::string& FormatDoc() {
  static const std::string text = Read(kRoot / "docs/pipeline-format.md");
  return text;
}

TEST(Docs, EveryKeyTheParserAcceptsIsInTheReference) {
  std::string reference = Section(FormatDoc(), "Every field");
  ASSERT_FALSE(reference.empty()) << "docs/pipeline-format.md has no '## Every field' section";
  std::vector<std::string> documented = ReferenceKeys(reference);
  std::vector<std::string> accepted = pipelines::AcceptedKeys();
  ASSERT_GT(accepted.size(), 60u) << "the parser's tables are the source of this list";
  for (const auto& key : accepted)
    EXPECT_NE(std::find(documented.begin(), documented.end(), key), documented.end())
        << "the parser accepts `" << key << "` but docs/pipeline-format.md's reference "
        << "(## Every field) has no row `| `" << key << "` | type | default | meaning |`";
}

TEST(Docs, EveryKeyInTheReferenceIsAccepted) {
  std::vector<std::string> documented = ReferenceKeys(Section(FormatDoc(), "Every field"));
  std::vector<std::string> accepted = pipelines::AcceptedKeys();
  std::set<std::string> seen;
  for (const auto& key : documented) {
    EXPECT_NE(std::find(accepted.begin(), accepted.end(), key), accepted.end())
        << "docs/pipeline-format.md documents `" << key << "`, which the parser refuses";
    EXPECT_TRUE(seen.insert(key).second) << "`" << key << "` is documented twice";
  }
}

// The keys the parser accepts really are accepted, and one it does not is refused: the list
// is the parser's, not a copy that could say anything.
TEST(Docs, TheAcceptedKeysAreWhatTheParserAccepts) {
  const std::string base =
      "pipeline: p\nproject: q\nstages:\n  s:\n    kind: train\n"
      "    instance: trn1.32xlarge\n    model: llama-2-7b\n"
      "    tokens: 1e9\n";
  for (const char* extra : {"    retry: {backoff: {initial: 30s}}\n", "    parallelism: {tp: 8}\n",
                            "    checkpoint: {on_notice: true}\n"}) {
    auto r = pipelines::ParsePipeline(base + extra, "x.yaml", {});
    EXPECT_FALSE(r.diagnostics.has_errors()) << extra << r.diagnostics.Format();
  }
  auto bad = pipelines::ParsePipeline(base + "    retry: {backof: {initial: 30s}}\n", "x.yaml", {});
  EXPECT_TRUE(bad.diagnostics.has_errors());
  auto keys = pipelines::AcceptedKeys();
  for (const char* k : {"stages.<name>.retry.backoff.initial", "stages.<name>.parallelism.tp",
                        "defaults.retry.spot.then", "stages.<name>.model.kv_heads",
                        "simulation.spot_rate_multiplier", "params.<name>",
                        "stages.<name>.env.<NAME>", "stages.<name>.matrix.<key>"})
    EXPECT_NE(std::find(keys.begin(), keys.end(), k), keys.end()) << k;
  EXPECT_EQ(std::find(keys.begin(), keys.end(), "stages.<name>.retry.backof"), keys.end());
}

// Every ```yaml block that is a whole pipeline validates, as a reader would paste it.
TEST(Docs, TheWholePipelinesInTheFormatReferenceValidate) {
  static const std::regex block("```yaml\n([\\s\\S]*?)```");
  static const std::regex whole("(^|\n)pipeline: ");
  int checked = 0;
  const std::string& doc = FormatDoc();
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), block); it != std::sregex_iterator();
       ++it) {
    std::string yaml = (*it)[1];
    if (!std::regex_search(yaml, whole) || yaml.find("\nstages:") == std::string::npos) continue;
    std::string file =
        testing::WriteTempFile("doc-example-" + std::to_string(checked) + ".yaml", yaml);
    testing::CliResult r = testing::RunTrnflow("validate " + file);
    EXPECT_EQ(r.exit_code, 0) << "this example in docs/pipeline-format.md does not validate:\n"
                              << yaml << "\n"
                              << r.err;
    fs::remove(file);
    ++checked;
  }
  EXPECT_GE(checked, 4) << "the reference should show whole pipelines, not only fragments";
}

// Links in README.md and docs/*.md lead to files of the repository, never out of it.
TEST(Docs, LinksLeadOnlyIntoTheRepository) {
  std::vector<fs::path> pages = {kRoot / "README.md"};
  for (const auto& e : fs::directory_iterator(kRoot / "docs"))
    if (e.path().extension() == ".md") pages.push_back(e.path());
  for (const char* required : {"pipeline-format.md", "architecture.md", "operations.md", "cli.md"})
    EXPECT_TRUE(fs::exists(kRoot / "docs" / required)) << "docs/" << required;
  static const std::regex link(R"(\]\(([^)\s]+)\))");
  const fs::path root = fs::weakly_canonical(kRoot);
  int links = 0;
  for (const auto& page : pages) {
    std::string text = Read(page);
    EXPECT_EQ(text.find("../shared"), std::string::npos) << page << " points at ../shared";
    EXPECT_EQ(text.find("DESIGN.md"), std::string::npos) << page << " names a file not in the repo";
    for (auto it = std::sregex_iterator(text.begin(), text.end(), link);
         it != std::sregex_iterator(); ++it) {
      std::string target = (*it)[1];
      if (target.rfind("http://", 0) == 0 || target.rfind("https://", 0) == 0 ||
          target.rfind("mailto:", 0) == 0 || target[0] == '#')
        continue;
      target = target.substr(0, target.find('#'));
      fs::path resolved = fs::weakly_canonical(page.parent_path() / target);
      auto rel = resolved.lexically_relative(root);
      EXPECT_FALSE(rel.empty() || *rel.begin() == "..")
          << page.filename() << " links out of the repository: " << target;
      EXPECT_TRUE(fs::exists(resolved))
          << page.filename() << " links to a missing file: " << target;
      ++links;
    }
  }
  EXPECT_GT(links, 10);
}

// The architecture page names every table and view the migrations leave behind, so a new
// table without a line there fails here.
TEST(Docs, TheArchitectureNamesEveryTableAndView) {
  std::set<std::string> objects;
  static const std::regex create(R"(CREATE (?:TABLE|VIEW|OR REPLACE VIEW) trnflow\.(\w+))");
  static const std::regex drop(R"(DROP (?:TABLE|VIEW) (?:IF EXISTS )?trnflow\.(\w+))");
  std::vector<fs::path> migrations;
  for (const auto& e : fs::directory_iterator(kRoot / "schema/migrations"))
    migrations.push_back(e.path());
  std::sort(migrations.begin(), migrations.end());
  for (const auto& m : migrations) {
    std::string sql = Read(m);
    for (auto it = std::sregex_iterator(sql.begin(), sql.end(), create);
         it != std::sregex_iterator(); ++it)
      objects.insert((*it)[1]);
    for (auto it = std::sregex_iterator(sql.begin(), sql.end(), drop); it != std::sregex_iterator();
         ++it)
      objects.erase((*it)[1]);
  }
  ASSERT_GT(objects.size(), 20u);
  std::string doc = Read(kRoot / "docs/architecture.md");
  for (const auto& o : objects)
    EXPECT_NE(doc.find("`" + o + "`"), std::string::npos)
        << "docs/architecture.md does not name `" << o << "` (a table or view of the catalog)";
  for (const char* state : {"blocked", "ready", "running", "retry_wait", "succeeded", "cached",
                            "failed", "skipped", "cancelled"})
    EXPECT_NE(doc.find("`" + std::string(state) + "`"), std::string::npos) << state;
}

// The operations guide covers what ops/ ships: every systemd unit (by the name it is installed
// under: ops/systemd/NAME.in), the install script, the files set-up writes.
TEST(Docs, TheOperationsGuideCoversOps) {
  std::string doc = Read(kRoot / "docs/operations.md");
  for (const auto& e : fs::directory_iterator(kRoot / "ops/systemd"))
    EXPECT_NE(doc.find(e.path().stem().string()), std::string::npos) << e.path().filename();
  for (const char* s :
       {"ops/install.sh", "/etc/trnflow/owner.url", "/etc/trnflow/daemon.url", "trnflow db migrate", "pg_dump",
        "pg_restore", "pg_dumpall --roles-only", "TRNFLOW_SECRETS_DIR", "\n## Many hosts\n"})
    EXPECT_NE(doc.find(s), std::string::npos) << s;
}

}  // namespace
}  // namespace trnflow
