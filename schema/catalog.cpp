// The catalog itself, before any stage: opening and guarding the connection, migrating the
// schema (and loading the instance catalog: queries/instances.sql), checking its version,
// opening it through a door (OpenWorkerCatalog, ...), and creating or dropping a catalog
// database and its roles. What only tests call is in catalog_testing.cpp.
#include "schema/catalog.h"

#include <libpq-fe.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>
#include <regex>

#include "common/env.h"
#include "common/error.h"
#include "schema/catalog_impl.h"
#include "schema/sql_text.h"
#include "sim/catalog.h"

namespace trnflow::schema {

std::unique_ptr<pqxx::connection> Catalog::Impl::Open() {
  auto c = std::make_unique<pqxx::connection>(url);
  // Operators (and tests) can tell trnflow processes apart in pg_stat_activity. JIT off:
  // once the catalog holds a million rows, estimated costs cross jit_above_cost and every
  // short statement would pay ~10 ms of LLVM compilation (claim_bench measured it).
  pqxx::nontransaction nt(*c);
  nt.exec("SET application_name = 'trnflow:" + std::to_string(getpid()) + "'; SET jit = off");
  return c;
}

void Catalog::Impl::Drop() {
  receiver.reset();
  cancel_receiver.reset();
  changes_receiver.reset();
  prepared.clear();
  leader_tx.reset();
  leader_conn.reset();
  conn.reset();
}

void Catalog::Impl::Connect() {
  Drop();
  try {
    conn = Open();
  } catch (const std::exception& e) {
    std::string why = e.what();
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
    why = RedactSecrets(std::regex_replace(why, std::regex("\n"), " "), url);
    // The server answered: say what it refused, not "is it running?".
    static const std::regex no_role(R"re(role "([^"]+)" does not exist)re");
    static const std::regex no_db(R"re(database "([^"]+)" does not exist)re");
    std::smatch m;
    std::string hint;
    if (why.find("does not have CONNECT privilege") != std::string::npos)
      // Only a catalog's own roles connect to its database (migration 0024).
      throw PermissionDenied(
          "this login may not connect to the catalog at " + RedactUrl(url) +
          ": only the catalog's own roles may (its daemons, its reader, the members of its "
          "projects); an administrator adds a person with `trnflow project grant PROJECT "
          "LOGIN` (docs/security.md)");
    if (std::regex_search(why, m, no_role)) {
      hint = ". PostgreSQL is running and has no role \"" + m[1].str() +
             "\" (the login this connection used): a person needs a login of their own, "
             "made by an administrator (CREATE ROLE " + m[1].str() +
             " LOGIN; trnflow project grant PROJECT " + m[1].str() +
             "; docs/security.md, \"How a lab adds a person\"), or set TRNFLOW_DATABASE_URL "
             "to a login you have.";
    } else if (why.find("authentication failed") != std::string::npos ||
               why.find("no pg_hba.conf entry") != std::string::npos) {
      hint = ". PostgreSQL is running and refused this login: check the user and password in "
             "TRNFLOW_DATABASE_URL (a person uses their own login; docs/security.md).";
    } else if (std::regex_search(why, m, no_db)) {
      hint = ". PostgreSQL is running and has no database \"" + m[1].str() +
             "\": set TRNFLOW_DATABASE_URL to the catalog's database, or create it "
             "(docs/operations.md, \"Install\").";
    } else {
      hint = ". Is PostgreSQL running (ops/setup.sh starts it)? Set TRNFLOW_DATABASE_URL to "
             "point elsewhere.";
    }
    throw CatalogUnavailable("cannot reach the catalog at " + RedactUrl(url) + ": " + why + hint);
  }
}

Catalog::Catalog(const std::string& url) : impl_(std::make_unique<Impl>()) {
  impl_->url = url;
  impl_->Connect();
}

Catalog::~Catalog() = default;

const std::string& Catalog::url() const { return impl_->url; }

void Catalog::Reconnect() { impl_->Connect(); }

namespace {
// The newest migration compiled into this binary.
int BinarySchemaVersion() {
  int latest = 0;
  for (const auto& m : Migrations()) latest = std::max(latest, m.version);
  return latest;
}
}  // namespace

std::unique_ptr<WorkerCatalog> OpenWorkerCatalog(const std::string& url) {
  return std::make_unique<Catalog>(url);
}
std::unique_ptr<SchedulerCatalog> OpenSchedulerCatalog(const std::string& url) {
  return std::make_unique<Catalog>(url);
}
std::unique_ptr<ServeCatalog> OpenServeCatalog(const std::string& url) {
  return std::make_unique<Catalog>(url);
}

MigrateReport Catalog::Migrate(const sim::Catalog& hw, int up_to) {
  return impl_->Guard([&] {
    MigrateReport report;
    pqxx::connection& c = impl_->C();
    // Migrations run one at a time under an EXCLUSIVE lock on trnflow.migration_lock, held by
    // a transaction on a second connection. Only the schema owner may lock it (members cannot,
    // as they could take an advisory lock). Two first-time migrators may race to create it.
    for (int tries = 0;; ++tries) {
      try {
        pqxx::work tx(c);
        tx.exec(
            "CREATE SCHEMA IF NOT EXISTS trnflow;"
            "CREATE TABLE IF NOT EXISTS trnflow.migration_lock ();"
            "CREATE TABLE IF NOT EXISTS trnflow.schema_migrations ("
            "  version int PRIMARY KEY, name text NOT NULL,"
            "  applied_at timestamptz NOT NULL DEFAULT now())");
        tx.commit();
        break;
      } catch (const pqxx::unique_violation&) {
        if (tries >= 3) throw;
      }
    }
    auto lock_conn = impl_->Open();
    pqxx::work lock(*lock_conn);
    lock.exec("LOCK TABLE trnflow.migration_lock IN EXCLUSIVE MODE");
    {
      pqxx::work tx(c);
      report.from_version =
          tx.exec("SELECT coalesce(max(version), 0) FROM trnflow.schema_migrations")[0][0]
              .as<int>();
    }
    if (report.from_version > BinarySchemaVersion())
      throw CatalogUnavailable("the catalog at " + RedactUrl(impl_->url) + " has schema version " +
                               std::to_string(report.from_version) + ", newer than this trnflow (" +
                               std::to_string(BinarySchemaVersion()) +
                               "); refusing to touch it. Upgrade trnflow.");
    for (const auto& m : Migrations()) {
      if (m.version <= report.from_version || (up_to > 0 && m.version > up_to)) continue;
      pqxx::work tx(c);
      tx.exec(m.sql);
      tx.exec_params("INSERT INTO trnflow.schema_migrations (version, name) VALUES ($1, $2)",
                     m.version, m.name);
      tx.commit();
      report.applied.push_back(m.name);
    }
    int target = up_to > 0 ? std::min(up_to, BinarySchemaVersion()) : BinarySchemaVersion();
    report.to_version = std::max(report.from_version, target);
    // The hardware catalog ships with the binary; prices get a new row only when they change.
    pqxx::work tx(c);
    for (const auto& t : hw.instances()) {
      nlohmann::json sources(t.sources);
      impl_->Exec(tx, "UpsertInstanceType", t.name, t.family, t.pool, t.accelerator, t.chips,
                  t.cores_per_chip, t.hbm_gib_per_chip, t.hbm_gbps_per_chip, t.bf16_tflops_per_chip,
                  t.fp8_tflops_per_chip, t.vcpus, t.memory_gib, t.network_gbps,
                  t.spot_interruption_bucket, sources.dump());
      impl_->Exec(tx, "InsertPriceIfChanged", t.name, hw.prices_as_of(),
                  t.on_demand_per_hour.ToDecimal(), t.spot_per_hour.ToDecimal());
    }
    tx.commit();
    return report;
  });
}

void Catalog::RequireCurrentSchema() {
  impl_->Guard([&] {
    pqxx::work tx(impl_->C());
    auto exists =
        tx.exec("SELECT to_regclass('trnflow.schema_migrations') IS NOT NULL")[0][0].as<bool>();
    int version = exists ? tx.exec(
                                 "SELECT coalesce(max(version), 0) FROM "
                                 "trnflow.schema_migrations")[0][0]
                               .as<int>()
                         : 0;
    if (version < BinarySchemaVersion())
      throw CatalogUnavailable("the catalog at " + RedactUrl(impl_->url) +
                               " is at schema version " + std::to_string(version) +
                               "; this trnflow needs " + std::to_string(BinarySchemaVersion()) +
                               ". Run `trnflow db migrate`.");
    if (version > BinarySchemaVersion())
      throw CatalogUnavailable("the catalog at " + RedactUrl(impl_->url) +
                               " is at schema version " + std::to_string(version) +
                               ", newer than this trnflow (" +
                               std::to_string(BinarySchemaVersion()) + "). Upgrade trnflow.");
  });
}

namespace {
std::string WithDatabase(const std::string& url, const std::string& name) {
  static const std::regex uri(R"(^(postgres(?:ql)?://[^/?]*)(/[^?]*)?(\?.*)?$)");
  std::smatch m;
  if (std::regex_match(url, m, uri)) return m[1].str() + "/" + name + m[3].str();
  return url + " dbname=" + name;
}
}  // namespace

std::string CreateDatabase(const std::string& admin_url, const std::string& name,
                           const NewDatabase& how) {
  try {
    pqxx::connection c(admin_url);
    pqxx::nontransaction nt(c);
    nt.exec("DROP DATABASE IF EXISTS " + nt.quote_name(name) + " WITH (FORCE)");
    std::string sql = "CREATE DATABASE " + nt.quote_name(name);
    if (!how.template_name.empty()) sql += " TEMPLATE " + nt.quote_name(how.template_name);
    if (!how.tablespace.empty()) sql += " TABLESPACE " + nt.quote_name(how.tablespace);
    nt.exec(sql);
  } catch (const pqxx::broken_connection& e) {
    throw CatalogUnavailable("cannot reach " + RedactUrl(admin_url) + ": " + e.what());
  }
  return WithDatabase(admin_url, name);
}

void DropDatabase(const std::string& admin_url, const std::string& name) {
  pqxx::connection c(admin_url);
  std::string db = c.quote_name(name);
  try {
    pqxx::nontransaction(c).exec("DROP DATABASE IF EXISTS " + db + " WITH (FORCE)");
  } catch (const pqxx::insufficient_privilege&) {
    // FORCE may not end a superuser's session, such as an autovacuum worker busy in the
    // database after a benchmark; a plain DROP cancels autovacuum and waits for the rest.
    pqxx::nontransaction(c).exec("DROP DATABASE IF EXISTS " + db);
  }
}

std::string RandomSecret() {
  std::ifstream random("/dev/urandom", std::ios::binary);
  unsigned char bytes[16] = {};
  random.read(reinterpret_cast<char*>(bytes), sizeof bytes);
  if (!random) throw std::runtime_error("cannot read /dev/urandom");
  std::string out;
  char hex[3];
  for (unsigned char b : bytes) {
    std::snprintf(hex, sizeof hex, "%02x", b);
    out += hex;
  }
  return out;
}

std::string CatalogAddress(const std::string& url) {
  char* error = nullptr;
  PQconninfoOption* options = PQconninfoParse(url.c_str(), &error);
  if (!options) {
    if (error) PQfreemem(error);
    return "";
  }
  std::string host, port, dbname, user;
  for (PQconninfoOption* o = options; o->keyword; ++o) {
    std::string key = o->keyword, value = o->val ? o->val : "";
    if (value.empty() && o->envvar) {
      const char* env = std::getenv(o->envvar);
      if (env) value = env;
    }
    if (key == "host" || (key == "hostaddr" && host.empty())) host = value;
    if (key == "port") port = value;
    if (key == "dbname") dbname = value;
    if (key == "user") user = value;
  }
  PQconninfoFree(options);
  if (host.empty() || host[0] == '/' || host == "localhost" || host == "127.0.0.1" ||
      host == "::1")
    host = "local";
  if (port.empty()) port = "5432";
  if (user.empty())
    if (const passwd* pw = ::getpwuid(::geteuid())) user = pw->pw_name;
  if (dbname.empty()) dbname = user;
  return host + ":" + port + "/" + dbname;
}

std::string WithLogin(const std::string& url, const std::string& user,
                      const std::string& password) {
  static const std::regex uri(R"(^(postgres(?:ql)?://)(?:[^@/]*@)?(.*)$)");
  std::smatch m;
  if (std::regex_match(url, m, uri)) return m[1].str() + user + ":" + password + "@" + m[2].str();
  return url + " user=" + user + " password=" + password;
}

std::string EnableDaemonLogin(const std::string& owner_url) {
  pqxx::connection c(owner_url);
  pqxx::nontransaction nt(c);
  std::string role = nt.exec("SELECT trnflow.daemon_role()")[0][0].as<std::string>();
  std::string password = RandomSecret();
  nt.exec("ALTER ROLE " + nt.quote_name(role) + " LOGIN PASSWORD " + nt.quote(password));
  return WithLogin(owner_url, role, password);
}

CatalogDropPlan PlanCatalogDrop(const std::string& owner_url) {
  CatalogDropPlan plan;
  try {
    pqxx::connection c(owner_url);
    pqxx::nontransaction nt(c);
    plan.database = nt.exec("SELECT current_database()")[0][0].as<std::string>();
    if (nt.exec("SELECT to_regclass('trnflow.settings') IS NULL")[0][0].as<bool>())
      throw UserError("database " + plan.database + " holds no trnflow catalog (no schema "
                      "trnflow): `db drop` drops only a catalog; drop other databases with "
                      "DROP DATABASE yourself");
    plan.catalog_id = nt.exec("SELECT coalesce((SELECT value FROM trnflow.settings WHERE key = "
                              "'catalog_id'), '')")[0][0]
                          .as<std::string>();
    if (plan.catalog_id.empty())
      throw UserError("database " + plan.database + " has a trnflow schema without a catalog "
                      "id (older than migration 0008): run `trnflow db migrate` first, so its "
                      "roles can be told from other catalogs'");
    // The comment ensure_catalog_role writes: "trnflow catalog <id> (<database>): <what>".
    // Compared as a prefix, not with LIKE: '_' in a name is no wildcard here.
    std::string prefix = "trnflow catalog " + plan.catalog_id + " (";
    for (const auto& row : nt.exec_params(
             "SELECT r.rolname FROM pg_roles r JOIN pg_shdescription d ON d.objoid = r.oid "
             "AND d.classoid = 'pg_authid'::regclass "
             "WHERE left(d.description, length($1)) = $1 ORDER BY r.rolname DESC",
             prefix))
      plan.roles.push_back(row[0].as<std::string>());
    plan.runs = nt.exec("SELECT count(*) FROM trnflow.runs")[0][0].as<int64_t>();
    plan.other_sessions = nt.exec("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                                  "current_database() AND pid <> pg_backend_pid()")[0][0]
                              .as<int64_t>();
  } catch (const pqxx::broken_connection& e) {
    throw CatalogUnavailable("cannot reach the catalog at " + RedactUrl(owner_url) + ": " +
                             RedactSecrets(e.what(), owner_url));
  }
  return plan;
}

std::vector<std::string> DropCatalog(const std::string& owner_url, const CatalogDropPlan& plan) {
  pqxx::connection c(WithDatabase(owner_url, "postgres"));
  std::string db = c.quote_name(plan.database);
  try {
    pqxx::nontransaction(c).exec("DROP DATABASE IF EXISTS " + db + " WITH (FORCE)");
  } catch (const pqxx::insufficient_privilege&) {
    // FORCE ends only the sessions this login may end; the daemons' are not the owner's.
    try {
      pqxx::nontransaction(c).exec("DROP DATABASE IF EXISTS " + db);
    } catch (const pqxx::sql_error& e) {
      std::string why = e.what();
      why = why.substr(0, why.find('\n'));
      throw Refused("cannot drop database " + plan.database + ": " + why +
                    "; stop the daemons (scheduler, workers, serve) and close other sessions on "
                    "it, then run `trnflow db drop` again; nothing was dropped");
    }
  }
  std::vector<std::string> kept;
  for (const auto& role : plan.roles) {
    try {
      pqxx::nontransaction(c).exec("DROP ROLE IF EXISTS " + c.quote_name(role));
    } catch (const pqxx::sql_error& e) {  // still granted or owning something elsewhere
      kept.push_back(role + " (" + std::string(e.what()).substr(0, 200) + ")");
    }
  }
  return kept;
}

void DropCatalogRoles(const std::string& admin_url, const std::string& name) {
  pqxx::connection c(admin_url);
  pqxx::nontransaction nt(c);
  pqxx::result roles = nt.exec_params(
      "SELECT r.rolname FROM pg_roles r JOIN pg_shdescription d ON d.objoid = r.oid "
      "AND d.classoid = 'pg_authid'::regclass "
      "WHERE d.description LIKE 'trnflow catalog %' "
      "AND position(' (' || $1 || '): ' IN d.description) > 0 ORDER BY r.rolname DESC",
      name);
  for (const auto& row : roles) {
    try {
      nt.exec("DROP ROLE IF EXISTS " + nt.quote_name(row[0].as<std::string>()));
    } catch (const pqxx::sql_error&) {  // still granted somewhere else: leave it
    }
  }
}

}  // namespace trnflow::schema
