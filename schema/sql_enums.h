#pragma once
// The one mapping between the catalog's text and the enums: the states and outcomes the
// catalog stores as text (trnflow.runs.state, stages.state, attempts.outcome, artifacts.state,
// ...) are enums everywhere above schema/. Rows are read through the *FromSql functions, which
// throw CatalogTextError on text they do not know (a catalog newer than this binary, or a
// bug); ToSql gives the text back, byte for byte what the catalog holds and what the CLI,
// JSON and /api print. StageState, Outcome, StageKind and Market are common/stage_spec.h's
// (their names there are the catalog's text); RunState and ArtifactState are the catalog's own.
// Pure functions: any thread.
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "common/stage_spec.h"

namespace trnflow::schema {

// trnflow.runs.state.
enum class RunState { kRunning, kSucceeded, kFailed, kCancelled };
// trnflow.artifacts.state: a compiled-artifact cache entry.
enum class ArtifactState { kBuilding, kReady, kFailed };

// Text read from the catalog that no enum value has. what() names the column and the text
// and lists the values this binary knows.
class CatalogTextError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

const std::string& ToSql(RunState);
const std::string& ToSql(ArtifactState);
const std::string& ToSql(StageState);
const std::string& ToSql(Outcome);
const std::string& ToSql(StageKind);
const std::string& ToSql(Market);
// "" for none: the catalog's NULL or '' (an attempt still running, a stage never ended).
const std::string& ToSql(const std::optional<Outcome>&);
const std::string& ToSql(const std::optional<RunState>&);

// Throw CatalogTextError on unknown text.
RunState RunStateFromSql(std::string_view);
ArtifactState ArtifactStateFromSql(std::string_view);
StageState StageStateFromSql(std::string_view);
Outcome OutcomeFromSql(std::string_view);
StageKind StageKindFromSql(std::string_view);
Market MarketFromSql(std::string_view);
// "" is nullopt; other unknown text throws.
std::optional<Outcome> OptionalOutcomeFromSql(std::string_view);
std::optional<RunState> OptionalRunStateFromSql(std::string_view);

// A run state a person typed (`runs --state`, /api/runs?state=): nullopt when unknown.
std::optional<RunState> ParseRunState(std::string_view);

}  // namespace trnflow::schema
