#include "tests/test_db.h"

#include <unistd.h>

#include <cstdlib>

#include "schema/catalog.h"
#include "sim/catalog.h"

namespace trnflow::testing {
namespace {
std::string g_url;
}

std::string AdminUrl() {
  const char* url = std::getenv("TRNFLOW_TEST_ADMIN_URL");
  return url && *url ? url : "postgresql://trnflow:trnflow@localhost:5432/postgres";
}

const std::string& TestDatabase::url() { return g_url; }

void TestDatabase::SetUp() {
  name_ = prefix_ + "_" + std::to_string(getpid());
  g_url = schema::CreateDatabase(AdminUrl(), name_);
  setenv("TRNFLOW_DATABASE_URL", g_url.c_str(), 1);
  schema::Catalog catalog(g_url);
  catalog.Migrate(sim::Catalog::Builtin());
}

void TestDatabase::TearDown() {
  if (!std::getenv("TRNFLOW_TEST_KEEP_DB")) schema::DropDatabase(AdminUrl(), name_);
}

}  // namespace trnflow::testing
