// The catalog's text for each enum (sql_enums.h). StageState, Outcome, StageKind and Market
// take their names from common/stage_spec.cpp, which the stage spec's JSON uses too, so the
// text is written once.
#include "schema/sql_enums.h"

#include <array>
#include <cstddef>

namespace trnflow::schema {
namespace {

// Every value of an enum with its text, in declaration order.
template <typename E, size_t N>
struct Names {
  const char* column;  // for errors: where the text came from
  std::array<std::string, N> text;

  const std::string& Of(E v) const { return text.at(static_cast<size_t>(v)); }
  std::optional<E> Find(std::string_view s) const {
    for (size_t i = 0; i < N; ++i)
      if (text[i] == s) return static_cast<E>(i);
    return std::nullopt;
  }
  E Parse(std::string_view s) const {
    if (auto v = Find(s)) return *v;
    std::string known;
    for (size_t i = 0; i < N; ++i) known += (i ? ", " : "") + text[i];
    throw CatalogTextError(std::string("unknown ") + column + " '" + std::string(s) +
                           "' in the catalog (this binary knows " + known +
                           "); is the catalog newer than this binary?");
  }
};

// The names common/stage_spec.cpp gives the values of E, 0..N-1.
template <typename E, size_t N>
Names<E, N> FromCommon(const char* column) {
  Names<E, N> n{column, {}};
  for (size_t i = 0; i < N; ++i) n.text[i] = std::string(ToString(static_cast<E>(i)));
  return n;
}

const Names<RunState, 4> kRunStates{"run state", {"running", "succeeded", "failed", "cancelled"}};
const Names<ArtifactState, 3> kArtifactStates{"artifact state", {"building", "ready", "failed"}};
const auto kStageStates = FromCommon<StageState, 9>("stage state");
const auto kOutcomes = FromCommon<Outcome, 11>("outcome");
const auto kStageKinds = FromCommon<StageKind, 5>("stage kind");
const auto kMarkets = FromCommon<Market, 2>("market");
const std::string kNone;

}  // namespace

const std::string& ToSql(RunState v) { return kRunStates.Of(v); }
const std::string& ToSql(ArtifactState v) { return kArtifactStates.Of(v); }
const std::string& ToSql(StageState v) { return kStageStates.Of(v); }
const std::string& ToSql(Outcome v) { return kOutcomes.Of(v); }
const std::string& ToSql(StageKind v) { return kStageKinds.Of(v); }
const std::string& ToSql(Market v) { return kMarkets.Of(v); }
const std::string& ToSql(const std::optional<Outcome>& v) { return v ? ToSql(*v) : kNone; }
const std::string& ToSql(const std::optional<RunState>& v) { return v ? ToSql(*v) : kNone; }

RunState RunStateFromSql(std::string_view s) { return kRunStates.Parse(s); }
ArtifactState ArtifactStateFromSql(std::string_view s) { return kArtifactStates.Parse(s); }
StageState StageStateFromSql(std::string_view s) { return kStageStates.Parse(s); }
Outcome OutcomeFromSql(std::string_view s) { return kOutcomes.Parse(s); }
StageKind StageKindFromSql(std::string_view s) { return kStageKinds.Parse(s); }
Market MarketFromSql(std::string_view s) { return kMarkets.Parse(s); }
std::optional<Outcome> OptionalOutcomeFromSql(std::string_view s) {
  if (s.empty()) return std::nullopt;
  return kOutcomes.Parse(s);
}
std::optional<RunState> OptionalRunStateFromSql(std::string_view s) {
  if (s.empty()) return std::nullopt;
  return kRunStates.Parse(s);
}

std::optional<RunState> ParseRunState(std::string_view s) { return kRunStates.Find(s); }

}  // namespace trnflow::schema
