// The one mapping between the catalog's text and the enums (schema/sql_enums.h): every value
// reads back as itself, its text is the text INTERFACES.md and the migrations' CHECKs name, and
// text the binary does not know is an error that says what it got and what it knows.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "schema/sql_enums.h"

namespace trnflow::schema {
namespace {

// Each enum's values in declaration order against the catalog's text for them, and back.
template <typename E, typename Parse>
void ExpectRoundTrip(const std::vector<std::string>& texts, Parse parse) {
  for (size_t i = 0; i < texts.size(); ++i) {
    E value = static_cast<E>(i);
    EXPECT_EQ(ToSql(value), texts[i]);
    EXPECT_EQ(parse(texts[i]), value) << texts[i];
  }
}

TEST(SqlEnums, EveryValueReadsBackAsItself) {
  ExpectRoundTrip<RunState>({"running", "succeeded", "failed", "cancelled"}, RunStateFromSql);
  ExpectRoundTrip<ArtifactState>({"building", "ready", "failed"}, ArtifactStateFromSql);
  ExpectRoundTrip<StageState>({"blocked", "ready", "running", "retry_wait", "succeeded", "cached",
                               "failed", "skipped", "cancelled"},
                              StageStateFromSql);
  ExpectRoundTrip<Outcome>(
      {"succeeded", "cached", "failed", "spot_interruption", "capacity_unavailable", "lost",
       "timeout", "infra_error", "user_error", "cancelled", "budget_exceeded"},
      OutcomeFromSql);
  ExpectRoundTrip<StageKind>({"run", "train", "compile", "deploy", "benchmark"}, StageKindFromSql);
  ExpectRoundTrip<Market>({"on-demand", "spot"}, MarketFromSql);
}

TEST(SqlEnums, UnknownTextThrowsNamingItAndTheKnownValues) {
  try {
    RunStateFromSql("paused");
    FAIL() << "no exception";
  } catch (const CatalogTextError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("unknown run state 'paused'"), std::string::npos) << what;
    EXPECT_NE(what.find("running, succeeded, failed, cancelled"), std::string::npos) << what;
  }
  EXPECT_THROW(StageStateFromSql("Running"), CatalogTextError);  // the text is exact
  EXPECT_THROW(StageStateFromSql(""), CatalogTextError);
  EXPECT_THROW(OutcomeFromSql("preempted"), CatalogTextError);
  EXPECT_THROW(OptionalOutcomeFromSql("preempted"), CatalogTextError);
  EXPECT_THROW(OptionalRunStateFromSql("over budget"), CatalogTextError);
  EXPECT_THROW(ArtifactStateFromSql("corrupt"), CatalogTextError);
  EXPECT_THROW(StageKindFromSql("Train"), CatalogTextError);
  EXPECT_THROW(MarketFromSql("on_demand"), CatalogTextError);
}

TEST(SqlEnums, EmptyTextIsNoneWhereTheCatalogMayHaveNone) {
  EXPECT_EQ(OptionalOutcomeFromSql(""), std::nullopt);
  EXPECT_EQ(OptionalOutcomeFromSql("lost"), Outcome::kLost);
  EXPECT_EQ(OptionalRunStateFromSql(""), std::nullopt);
  EXPECT_EQ(OptionalRunStateFromSql("failed"), RunState::kFailed);
  EXPECT_EQ(ToSql(std::optional<Outcome>()), "");
  EXPECT_EQ(ToSql(std::optional<Outcome>(Outcome::kBudgetExceeded)), "budget_exceeded");
  EXPECT_EQ(ToSql(std::optional<RunState>()), "");
}

TEST(SqlEnums, ARunStateAPersonTypedIsNulloptWhenUnknown) {
  EXPECT_EQ(ParseRunState("cancelled"), RunState::kCancelled);
  EXPECT_EQ(ParseRunState("retry_wait"), std::nullopt);  // a stage's state, not a run's
  EXPECT_EQ(ParseRunState(""), std::nullopt);
}

}  // namespace
}  // namespace trnflow::schema
