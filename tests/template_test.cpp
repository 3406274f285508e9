// A catalog copied from a template (tests/catalog_copy.sql, what every test process under ctest
// gets) is the catalog `trnflow db migrate` makes: the same schema, grants and policies (the
// normalised dump of schema/current.sh), roles of its own named, commented and flagged as a
// migration makes them, its own catalog id and job uid range, and nothing of the template's
// roles or of another copy's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "common/error.h"
#include "schema/catalog.h"
#include "schema/catalog_testing.h"
#include "tests/run_cli.h"
#include "tests/test_db.h"

namespace trnflow {
namespace {

using testing::CopyCatalog;
using testing::DropCatalog;
using testing::MigrateNewCatalog;

std::string Value(const std::string& url, const std::string& sql) {
  schema::Catalog c(url);
  return schema::testing::QueryValue(c, sql);
}

// The catalog's own roles (those whose comment names its catalog id and database), its prefix
// read P and the job uid claim's range R: name, flags and what the comment says each is.
constexpr const char* kRolesSql = R"(
  WITH me AS (SELECT (SELECT value FROM trnflow.settings WHERE key = 'role_prefix') AS prefix,
                     'trnflow catalog ' || (SELECT value FROM trnflow.settings WHERE key = 'catalog_id')
                       || ' (' || current_database() || '): ' AS mark,
                     (SELECT value FROM trnflow.settings WHERE key = 'job_uid_range') AS range)
  SELECT string_agg(format('%s inherit=%s login=%s: %s',
                           replace(replace(r.rolname, me.prefix, 'P'), split_part(me.range, '-', 1), 'R'),
                           r.rolinherit, r.rolcanlogin,
                           replace(substr(d.description, length(me.mark) + 1), me.range, 'R')),
                    E'\n' ORDER BY r.rolname LIKE 'trnflow\_job\_uids\_%', r.rolname)
  FROM me, pg_roles r
  JOIN pg_shdescription d ON d.objoid = r.oid AND d.classoid = 'pg_authid'::regclass
  WHERE left(d.description, length(me.mark)) = me.mark)";

// What in the catalog depends on its roles, by kind: grants per catalog (pg_class holds
// tables' and columns'), policies.
constexpr const char* kDependentsSql = R"(
  SELECT string_agg(line, E'\n' ORDER BY line)
  FROM (SELECT format('%s %s %s: %s', s.classid::regclass, s.deptype,
                      replace(r.rolname, (SELECT value FROM trnflow.settings
                                          WHERE key = 'role_prefix'), 'P'), s.n) AS line
        FROM (SELECT classid, deptype, refobjid, count(*) AS n FROM pg_shdepend
              WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
              GROUP BY 1, 2, 3) s
        JOIN pg_roles r ON r.oid = s.refobjid) x)";

// Settings of the catalog's database (ALTER DATABASE/ROLE ... SET), which a copy does not
// inherit from its template.
constexpr const char* kDatabaseSettingsSql = R"(
  SELECT coalesce(string_agg(line, E'\n' ORDER BY line), 'none')
  FROM (SELECT format('%s: %s',
                      replace(s.setrole::regrole::text, (SELECT value FROM trnflow.settings
                                                         WHERE key = 'role_prefix'), 'P'),
                      array_to_string(s.setconfig, ', ')) AS line
        FROM pg_db_role_setting s
        WHERE s.setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())) x)";

std::string Dump(const std::string& url, const std::string& file) {
  auto r = testing::RunShell(std::string(TRNFLOW_SOURCE_DIR) + "/schema/current.sh --dump '" + url +
                             "' > " + file);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return file;
}

TEST(CatalogTemplate, ACopyIsTheCatalogAMigrationMakes) {
  std::string pid = std::to_string(getpid());
  const char* run_template = std::getenv("TRNFLOW_TEST_TEMPLATE");
  bool own_template = !run_template || !*run_template;  // outside ctest
  std::string from = own_template ? "trnflow_ttmpl_" + pid : run_template;
  std::string fresh_name = "trnflow_tfresh_" + pid, copy_name = "trnflow_tcopy_" + pid,
              other_name = "trnflow_tother_" + pid;
  // Dropped however the test ends, copies before the template whose roles they might name.
  struct Drop {
    std::vector<std::string> names;
    ~Drop() {
      for (const auto& n : names) DropCatalog(n);
    }
  } drop{{other_name, copy_name, fresh_name}};
  if (own_template) drop.names.push_back(from), testing::MakeCatalogTemplate(from);
  std::string fresh = MigrateNewCatalog(fresh_name);
  std::string copy = CopyCatalog(from, copy_name);
  std::string other = CopyCatalog(from, other_name);

  std::string dir = testing::ProcessDir("trnflow-template");
  auto diff = testing::RunShell("diff -u " + Dump(fresh, dir + "/fresh.sql") + " " +
                                Dump(copy, dir + "/copy.sql") + " | head -n 80");
  EXPECT_EQ(diff.out, "") << "the copy's schema is not the migrated one's";

  std::string roles = Value(fresh, kRolesSql);
  EXPECT_EQ(roles,
            "P_daemon inherit=f login=f: daemon\n"
            "P_reader inherit=t login=f: reader\n"
            "trnflow_job_uids_R inherit=t login=f: job uids R");
  EXPECT_EQ(Value(copy, kRolesSql), roles);
  EXPECT_EQ(Value(other, kRolesSql), roles);
  EXPECT_EQ(Value(copy, kDependentsSql), Value(fresh, kDependentsSql));
  EXPECT_EQ(Value(copy, kDependentsSql), Value(other, kDependentsSql));
  EXPECT_EQ(Value(copy, kDatabaseSettingsSql), Value(fresh, kDatabaseSettingsSql));

  // Its own identity: prefix, catalog id, job uid range.
  const std::string setting = "SELECT value FROM trnflow.settings WHERE key = ";
  EXPECT_EQ(Value(copy, setting + "'role_prefix'"), copy_name);
  EXPECT_EQ(Value(copy, "SELECT trnflow.daemon_role()"), copy_name + "_daemon");
  EXPECT_NE(Value(copy, setting + "'catalog_id'"), Value(other, setting + "'catalog_id'"));
  EXPECT_NE(Value(copy, setting + "'job_uid_range'"), Value(other, setting + "'job_uid_range'"));
  // Every role the copy's grants and policies name is its own (the template's would be
  // another catalog's); the owner owns its objects, as in every catalog.
  EXPECT_EQ(Value(copy,
                  "SELECT count(*) FROM pg_shdepend s JOIN pg_roles r ON r.oid = s.refobjid"
                  " WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
                  "   AND s.deptype <> 'o' AND r.rolname NOT LIKE '" + copy_name + "\\_%'"),
            "0");

  // One copy's daemons reach nothing of another's.
  std::string daemon = schema::EnableDaemonLogin(copy);
  EXPECT_EQ(Value(daemon, "SELECT count(*) FROM trnflow.stages"), "0");
  std::string daemon_in_other = daemon;
  daemon_in_other.replace(daemon.rfind("/" + copy_name), copy_name.size() + 1, "/" + other_name);
  EXPECT_THROW(Value(daemon_in_other, "SELECT count(*) FROM trnflow.stages"), PermissionDenied);

}

}  // namespace
}  // namespace trnflow
