#pragma once
// The SQL compiled into the binary: migrations in order, and named queries
// (`-- name: ClaimReadyStages` blocks in schema/queries/*.sql).
#include <string>
#include <vector>

namespace trnflow::schema {

struct Migration {
  int version = 0;   // from the file name: 0001_init.sql -> 1
  std::string name;  // the file name
  std::string sql;
};

const std::vector<Migration>& Migrations();
// The text of a named query; throws std::logic_error for a name no file defines.
const std::string& Query(const std::string& name);

}  // namespace trnflow::schema
