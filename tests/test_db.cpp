#include "tests/test_db.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <random>
#include <vector>

#include "common/env.h"
#include "common/error.h"
#include "schema/catalog.h"
#include "schema/catalog_testing.h"
#include "sim/catalog.h"

namespace trnflow::testing {
namespace {
std::string g_url, g_owner_url, g_name;
}

std::string AdminUrl() {
  // Read once: SetUp then points TRNFLOW_ADMIN_DATABASE_URL at this binary's own database.
  static const std::string admin = [] {
    const char* url = std::getenv("TRNFLOW_TEST_ADMIN_URL");
    return std::string(url && *url ? url : AdminDatabaseUrl());
  }();
  return admin;
}

const std::string& TestDatabase::url() { return g_url; }
const std::string& TestDatabase::owner_url() { return g_owner_url; }
const std::string& TestDatabase::database_name() { return g_name; }

std::string TestDatabase::NewLogin(const std::string& who) {
  schema::Catalog admin(g_owner_url);
  std::string role = "trnflow_test_" + g_name + "_" + who;
  std::string password = schema::RandomSecret();
  schema::testing::QueryValue(admin, "DROP ROLE IF EXISTS " + role + "; CREATE ROLE " + role +
                                         " LOGIN PASSWORD '" + password + "'; COMMENT ON ROLE " +
                                         role + " IS 'trnflow catalog test (" + g_name +
                                         "): member'; SELECT 1");
  return schema::WithLogin(g_url, role, password);
}

// The tablespace ops/postgres.sh test-tablespace makes for the tests' catalogs (on tmpfs: a
// database's ~1,000 files are created in 40 ms there, in 500 ms of kernel time on the disk),
// when it exists and the admin may create in it; else "" (the server's default).
const std::string& TestTablespace() {
  static const std::string name = [] {
    schema::Catalog admin(AdminUrl());
    return schema::testing::QueryValue(
        admin,
        "SELECT spcname FROM pg_tablespace WHERE spcname = 'trnflow_tests' AND "
        "has_tablespace_privilege(oid, 'CREATE')");
  }();
  return name;
}

std::string MigrateNewCatalog(const std::string& name) {
  std::string url = schema::CreateDatabase(AdminUrl(), name, {.tablespace = TestTablespace()});
  schema::Catalog(url).Migrate(sim::Catalog::Builtin());
  return url;
}

std::string CopyCatalog(const std::string& template_name, const std::string& name) {
  static const std::string make_own = [] {
    std::ifstream in(std::string(TRNFLOW_SOURCE_DIR) + "/tests/catalog_copy.sql");
    std::string sql{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (sql.empty()) throw std::runtime_error("cannot read tests/catalog_copy.sql");
    return sql;
  }();
  std::string url;
  // PostgreSQL copies no database anyone is connected to (an autovacuum worker passing by).
  for (int tries = 0;; ++tries) {
    try {
      url = schema::CreateDatabase(AdminUrl(), name,
                                   {.template_name = template_name, .tablespace = TestTablespace()});
      break;
    } catch (const std::exception& e) {
      if (tries >= 100 || !std::strstr(e.what(), "is being accessed by other users")) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  // One DO block: one transaction. Under load it can fail (a deadlock or a concurrent update of
  // the server's shared role catalogs with another copy's): a few tries. A copy that never gets
  // its own roles goes: it holds grants to the template's roles, which nobody could drop then.
  for (int tries = 1;; ++tries) {
    try {
      schema::Catalog own(url);
      schema::testing::RunOutsideTransaction(own, make_own);
      return url;
    } catch (const std::exception& e) {
      if (tries < 5) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200 * tries));
        continue;
      }
      std::string why = e.what();
      try {
        DropCatalog(name);
      } catch (const std::exception& drop) {
        why += "; dropping the copy failed too: " + std::string(drop.what());
      }
      throw std::runtime_error("tests/catalog_copy.sql failed " + std::to_string(tries) +
                               " times in " + name + ": " + why);
    }
  }
}

void MakeCatalogTemplate(const std::string& name) {
  DropCatalog(name);  // left by an interrupted run, with its roles (a migration would refuse them)
  {
    schema::Catalog catalog(MigrateNewCatalog(name));
    // Its job uids from a block of its own, above the test catalogs' (TestDatabase::SetUp) and
    // below schema/current.sh's, so the site's default block stays free while it lives.
    int64_t lo = 2'000'000'000 + static_cast<int64_t>(getpid() % 1'000) * 100'000;
    try {
      catalog.SetJobUidRange(lo, lo + 99'999);
    } catch (const UserError&) {  // claimed by a leftover of a reused pid: keep the default
    }
  }
  // Nobody connects to it again: PostgreSQL copies only a database nobody is connected to, and
  // autovacuum leaves one that refuses connections alone.
  schema::Catalog admin(AdminUrl());
  schema::testing::RunOutsideTransaction(
      admin, "ALTER DATABASE " + name + " WITH ALLOW_CONNECTIONS false");
}

void DropCatalog(const std::string& name) {
  schema::DropDatabase(AdminUrl(), name);
  schema::DropCatalogRoles(AdminUrl(), name);
}

void TestDatabase::SetUp() {
  name_ = g_name = prefix_ + "_" + std::to_string(getpid());
  const char* from = std::getenv("TRNFLOW_TEST_TEMPLATE");
  g_owner_url = from && *from ? CopyCatalog(from, name_) : MigrateNewCatalog(name_);
  {
    schema::Catalog catalog(g_owner_url);
    // Job uids from a block of its own far above the real catalogs' (the default claims the
    // first free block from 200000; a test catalog holding it would push the site's own
    // catalog, migrated meanwhile, to another block).
    // Below 2^31, which the job's namespaces cannot map.
    int64_t lo = 1'000'000'000 + static_cast<int64_t>(getpid() % 10'000) * 100'000;
    try {
      catalog.SetJobUidRange(lo, lo + 99'999);
    } catch (const UserError&) {  // claimed by a test catalog of a reused pid: keep the default
    }
  }
  g_url = schema::EnableDaemonLogin(g_owner_url);
  setenv("TRNFLOW_DATABASE_URL", g_url.c_str(), 1);
  setenv("TRNFLOW_ADMIN_DATABASE_URL", g_owner_url.c_str(), 1);
}

namespace {
// Query's connection, one per thread, kept: tests poll with Query in WaitFor loops, and a
// connection each time was a PostgreSQL backend started and ended each time. TearDown closes
// the main thread's before dropping the database.
thread_local std::unique_ptr<schema::Catalog> query_catalog;
}  // namespace

void TestDatabase::TearDown() {
  query_catalog.reset();  // a session in the database: a plain DROP DATABASE would wait on it
  if (std::getenv("TRNFLOW_TEST_KEEP_DB")) return;
  DropCatalog(name_);
}

std::string Query(const std::string& sql) {
  auto& c = query_catalog;
  thread_local std::string url;
  if (!c || url != TestDatabase::owner_url()) {
    url = TestDatabase::owner_url();
    c = std::make_unique<schema::Catalog>(url);
  }
  try {
    return schema::testing::QueryValue(*c, sql);
  } catch (const CatalogUnavailable&) {  // the kept connection was lost (a server restart)
    c = std::make_unique<schema::Catalog>(url);
    return schema::testing::QueryValue(*c, sql);
  }
}

double QueryNumber(const std::string& sql) {
  std::string v = Query(sql);
  return v.empty() ? -1 : std::stod(v);
}

std::string RunStateText(int64_t run) {
  return Query("SELECT state FROM trnflow.runs WHERE id = " + std::to_string(run));
}

std::string RunStateText(schema::Catalog& c, int64_t run) {
  return schema::ToSql(c.GetRun(run)->state);
}

namespace {
std::mutex g_dirs_mu;
std::vector<std::string>* g_dirs = nullptr;  // never destroyed: the exit handler reads it
}  // namespace

std::string ProcessDir(const std::string& prefix, bool random_suffix) {
  std::string name = prefix + "-" + std::to_string(getpid());
  if (random_suffix) name += "-" + std::to_string(std::random_device()());
  auto path = (std::filesystem::temp_directory_path() / name).string();
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  std::filesystem::create_directories(path);
  std::scoped_lock lock(g_dirs_mu);
  if (!g_dirs) {
    g_dirs = new std::vector<std::string>();
    if (!std::getenv("TRNFLOW_TEST_KEEP_HOME"))
      std::atexit([] {
        std::scoped_lock lock(g_dirs_mu);
        for (const auto& d : *g_dirs) {
          std::error_code ec;
          std::filesystem::remove_all(d, ec);
        }
      });
  }
  g_dirs->push_back(path);
  return path;
}

}  // namespace trnflow::testing
