#pragma once
// Diagnostics collects every problem found in a pipeline file, compiler style, so a user sees
// all of them at once: `FILE:LINE:COL: error: MESSAGE` followed by `  hint: FIX`.
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

namespace trnflow::pipelines {

struct Loc {
  int line = 0;  // 1-based; 0 when the problem has no place in the file
  int col = 0;   // 1-based
};

enum class Severity { kError, kWarning };

struct Diagnostic {
  Severity severity = Severity::kError;
  Loc loc;
  std::string message;
  std::string hint;
};

class Diagnostics {
 public:
  explicit Diagnostics(std::string file) : file_(std::move(file)) {}
  void Error(Loc loc, std::string message, std::string hint = {});
  void Warning(Loc loc, std::string message, std::string hint = {});
  bool has_errors() const { return errors_ > 0; }
  int error_count() const { return errors_; }
  const std::vector<Diagnostic>& all() const { return items_; }
  const std::string& file() const { return file_; }
  // Every diagnostic, sorted by place, one or two lines each.
  std::string Format() const;

 private:
  std::string file_;
  std::vector<Diagnostic> items_;
  // Matrix expansions parse the same node once per combination: each problem is kept once.
  std::set<std::tuple<int, int, std::string>> seen_;
  int errors_ = 0;
};

// The closest of `candidates` to `word` when it is close enough to be a typo, else "".
std::string ClosestMatch(std::string_view word, const std::vector<std::string>& candidates);
// "did you mean 'x'?" or "" when nothing is close.
std::string DidYouMean(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace trnflow::pipelines
