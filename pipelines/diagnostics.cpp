#include "pipelines/diagnostics.h"

#include <algorithm>
#include <tuple>

namespace trnflow::pipelines {

void Diagnostics::Error(Loc loc, std::string message, std::string hint) {
  if (!seen_.insert({loc.line, loc.col, message}).second) return;
  items_.push_back({Severity::kError, loc, std::move(message), std::move(hint)});
  ++errors_;
}

void Diagnostics::Warning(Loc loc, std::string message, std::string hint) {
  if (!seen_.insert({loc.line, loc.col, message}).second) return;
  items_.push_back({Severity::kWarning, loc, std::move(message), std::move(hint)});
}

std::string Diagnostics::Format() const {
  std::vector<const Diagnostic*> sorted;
  for (const auto& d : items_) sorted.push_back(&d);
  std::stable_sort(sorted.begin(), sorted.end(), [](const Diagnostic* a, const Diagnostic* b) {
    return std::tie(a->loc.line, a->loc.col) < std::tie(b->loc.line, b->loc.col);
  });
  std::string out;
  for (const Diagnostic* d : sorted) {
    out += file_;
    if (d->loc.line > 0)
      out += ":" + std::to_string(d->loc.line) + ":" + std::to_string(d->loc.col);
    out += d->severity == Severity::kError ? ": error: " : ": warning: ";
    out += d->message + "\n";
    if (!d->hint.empty()) out += "  hint: " + d->hint + "\n";
  }
  return out;
}

namespace {
// Edits between two words, an adjacent swap counting as one ("trian" is one edit from
// "train", "rnus" one from "runs"): the optimal string alignment distance.
size_t Distance(std::string_view a, std::string_view b) {
  std::vector<size_t> before(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        cur[j] = std::min(cur[j], before[j - 2] + 1);
    }
    std::swap(before, prev);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}
}  // namespace

std::string ClosestMatch(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    size_t d = Distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

std::string DidYouMean(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best = ClosestMatch(word, candidates);
  return best.empty() ? "" : "did you mean '" + best + "'?";
}

}  // namespace trnflow::pipelines
