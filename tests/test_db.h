#pragma once
// A real PostgreSQL database for one test binary: created (and migrated) before the first
// test, dropped after the last. The server is the one ops/setup.sh runs; point elsewhere with
// TRNFLOW_TEST_ADMIN_URL (a URL to any database, as a role that may create databases).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace trnflow::schema {
class Catalog;
}

namespace trnflow::testing {

class TestDatabase : public ::testing::Environment {
 public:
  explicit TestDatabase(std::string prefix) : prefix_(std::move(prefix)) {}
  void SetUp() override;
  void TearDown() override;
  // URL of this binary's database as the daemons log in (least privilege); also exported as
  // TRNFLOW_DATABASE_URL.
  static const std::string& url();
  // The same database as its schema owner (migrations, projects, roles, direct fixes to rows);
  // also exported as TRNFLOW_ADMIN_DATABASE_URL.
  static const std::string& owner_url();
  // The database's name (its catalog's roles are named after it).
  static const std::string& database_name();
  // A login role trnflow_test_<database>_<who> with a fresh random password, dropped with the
  // database (no test role has a password anyone could guess); returns its URL.
  static std::string NewLogin(const std::string& who);

 private:
  std::string prefix_;
  std::string name_;
};

// A role that may create databases and roles on the test server: TRNFLOW_TEST_ADMIN_URL, else
// the schema owner ops/setup.sh made (/etc/trnflow/owner.url).
std::string AdminUrl();

// Catalogs for tests, all as the schema owner; each returns the new catalog's owner URL.
// MigrateNewCatalog: database `name` created and migrated (`trnflow db migrate`).
// CopyCatalog: database `name` copied from `template_name` (a catalog MigrateNewCatalog made
// and nobody is connected to) and made a catalog of its own exactly as a migration would make
// it: its own catalog id, role prefix and roles, and a job uid range claimed for it
// (tests/catalog_copy.sql; tests/template_test.cpp holds it to a freshly migrated one).
// MakeCatalogTemplate: a catalog for CopyCatalog (dropping an older one and its roles first),
// its job uids a block of their own, closed to connections.
// DropCatalog: the database and the roles made for it.
// Under ctest, TRNFLOW_TEST_TEMPLATE names a template migrated once per run (the fixture
// catalog_template in tests/CMakeLists.txt), and TestDatabase copies it instead of migrating.
std::string MigrateNewCatalog(const std::string& name);
std::string CopyCatalog(const std::string& template_name, const std::string& name);
void MakeCatalogTemplate(const std::string& name);
void DropCatalog(const std::string& name);

// How many stages break the queue's bookkeeping (migration 0022), read in one snapshot so it
// holds at any moment, mid-run included: a stage is in ready_stages exactly when it is ready,
// in running_stages exactly when it runs, has pending needs exactly when it is blocked, and a
// retry time exactly when it waits for one.
inline constexpr const char* kQueueMismatchesSql =
    "SELECT count(*) FROM trnflow.stages s WHERE"
    " (s.state = 'ready') <> EXISTS (SELECT 1 FROM trnflow.ready_stages q"
    "                                WHERE q.run_id = s.run_id AND q.stage_id = s.id)"
    " OR (s.state = 'running') <> EXISTS (SELECT 1 FROM trnflow.running_stages q"
    "                                     WHERE q.run_id = s.run_id AND q.stage_id = s.id)"
    " OR (s.state = 'blocked') <> (s.pending_needs > 0)"
    " OR (s.state = 'retry_wait') <> (s.retry_at IS NOT NULL)";

// One value from this binary's database as its schema owner (every project's rows): "" for
// NULL or no row. QueryNumber: the same as a number, -1 for NULL or no row.
std::string Query(const std::string& sql);
double QueryNumber(const std::string& sql);
// A run's state in this binary's catalog ("" for no such run); through `c`, any catalog's.
std::string RunStateText(int64_t run);
std::string RunStateText(schema::Catalog& c, int64_t run);

// A directory of this test process's own under /tmp: PREFIX-<pid> (and a random suffix when
// `random_suffix`), emptied at first use and removed at exit unless TRNFLOW_TEST_KEEP_HOME is
// set. Pids are reused: what an earlier process left under the same name is never read as this
// one's (it once gave a test a stale run directory, and another a stale port).
std::string ProcessDir(const std::string& prefix, bool random_suffix = true);

// Waits until `condition` holds, polling, up to `timeout_s`; returns whether it held. Polls
// every 10 ms at first, backing off to every 100 ms: many conditions start a process (squeue,
// trnflow) or query the catalog, and at 50 polls a second they were much of the suite's CPU.
template <typename F>
bool WaitFor(F&& condition, double timeout_s);

}  // namespace trnflow::testing

#include <algorithm>
#include <chrono>
#include <thread>

template <typename F>
bool trnflow::testing::WaitFor(F&& condition, double timeout_s) {
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                      std::chrono::duration<double>(timeout_s));
  auto pause = std::chrono::milliseconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(100));
  }
  return condition();
}
