// Every pipeline in tests/broken has exactly one mistake, named on its first line as
// `# expect: TEXT`: the validator must reject it with located errors whose text includes TEXT.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "pipelines/pipeline.h"

namespace trnflow::pipelines {

class BrokenPipeline : public ::testing::TestWithParam<std::string> {};

TEST_P(BrokenPipeline, IsRejectedWithALocatedError) {
  const std::string path = GetParam();
  std::ifstream in(path);
  std::string first;
  std::getline(in, first);
  ASSERT_EQ(first.rfind("# expect: ", 0), 0u) << path << " must start with '# expect: '";
  const std::string expect = first.substr(10);
  auto r = LoadPipelineFile(path, {});
  EXPECT_FALSE(r.pipeline.has_value()) << path;
  ASSERT_TRUE(r.diagnostics.has_errors()) << path;
  std::string text;
  for (const auto& d : r.diagnostics.all()) {
    if (d.severity != Severity::kError) continue;
    EXPECT_GT(d.loc.line, 0) << path << ": error without a place in the file: " << d.message;
    text += d.message + "\n" + d.hint + "\n";
  }
  EXPECT_NE(text.find(expect), std::string::npos) << path << "\nexpected: " << expect << "\ngot:\n"
                                                  << r.diagnostics.Format();
}

std::vector<std::string> BrokenFiles() {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(TRNFLOW_SOURCE_DIR "/tests/broken"))
    if (e.path().extension() == ".yaml") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

INSTANTIATE_TEST_SUITE_P(Corpus, BrokenPipeline, ::testing::ValuesIn(BrokenFiles()),
                         [](const auto& info) {
                           std::string n = std::filesystem::path(info.param).stem().string();
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

TEST(BrokenCorpus, HasAtLeastThirtyFiles) { EXPECT_GE(BrokenFiles().size(), 30u); }

}  // namespace trnflow::pipelines
