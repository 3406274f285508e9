// trnflow spend / budget / project: the money and who may see it.
#include <algorithm>
#include <ctime>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "cli/commands.h"
#include "common/duration.h"
#include "common/error.h"
#include "sim/baseline.h"

namespace trnflow::cli {
namespace {

std::vector<std::string> SplitFields(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string f;
  while (std::getline(in, f, ','))
    if (!f.empty()) out.push_back(f);
  return out;
}

std::string Csv(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

double Usd(Money m) { return static_cast<double>(m.micros()) / 1e6; }

}  // namespace

nlohmann::ordered_json SpendJson(schema::Catalog& catalog, const SpendArgs& a) {
  schema::SpendQuery q{a.project, a.pipeline, ReadDateFlag("--since", a.since),
                       ReadDateFlag("--until", a.until), SplitFields(a.by)};
  RequireProject(catalog, a.project);
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& r : catalog.Spend(q)) {
    nlohmann::ordered_json j;
    for (size_t i = 0; i < q.by.size(); ++i) j[q.by[i]] = OrNull(r.keys[i]);
    j["attempts"] = r.attempts;
    j["billed_hours"] = r.billed_hours;
    j["cost_usd"] = Usd(r.cost);
    j["wasted_usd"] = Usd(r.wasted);
    j["saved_usd"] = Usd(r.saved);
    out.push_back(std::move(j));
  }
  return out;
}

nlohmann::ordered_json SavingsJson(schema::Catalog& catalog, const SpendArgs& a) {
  if (!a.by.empty()) throw UserError("--savings is by project; leave out --by");
  schema::SpendQuery q{a.project,
                       a.pipeline,
                       ReadDateFlag("--since", a.since),
                       ReadDateFlag("--until", a.until),
                       {}};
  RequireProject(catalog, a.project);
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& r : catalog.Savings(q))
    out.push_back({{"project", r.project},
                   {"spot_cost_usd", Usd(r.spot_cost)},
                   {"spot_on_demand_usd", Usd(r.spot_on_demand)},
                   {"spot_saved_usd", Usd(r.spot_saved)},
                   {"cache_hits", r.cache_hits},
                   {"cache_saved_usd", Usd(r.cache_saved)},
                   {"cost_usd", Usd(r.cost)},
                   {"gpu_baseline_usd", Usd(r.gpu_baseline)},
                   {"gpu_saved_usd", Usd(r.gpu_saved)}});
  return out;
}

namespace {

// `trnflow spend --savings`: one row per project and their total, each figure from the ledger.
int PrintSavings(schema::Catalog& catalog, const SpendArgs& a) {
  if (a.format == "json") {
    std::cout << SavingsJson(catalog, a).dump(2) << "\n";
    return kExitOk;
  }
  if (!a.by.empty()) throw UserError("--savings is by project; leave out --by");
  schema::SpendQuery q{a.project,
                       a.pipeline,
                       ReadDateFlag("--since", a.since),
                       ReadDateFlag("--until", a.until),
                       {}};
  RequireProject(catalog, a.project);
  auto rows = catalog.Savings(q);
  if (a.format == "csv") {
    std::cout << "project,spot_cost_usd,spot_on_demand_usd,spot_saved_usd,cache_hits,"
                 "cache_saved_usd,cost_usd,gpu_baseline_usd,gpu_saved_usd\n";
    for (const auto& r : rows)
      std::cout << Csv(r.project) << "," << r.spot_cost.ToDecimal() << ","
                << r.spot_on_demand.ToDecimal() << "," << r.spot_saved.ToDecimal() << ","
                << r.cache_hits << "," << r.cache_saved.ToDecimal() << "," << r.cost.ToDecimal()
                << "," << r.gpu_baseline.ToDecimal() << "," << r.gpu_saved.ToDecimal() << "\n";
    return kExitOk;
  }
  if (rows.empty()) {
    std::cout << "no spend" << (a.project.empty() ? "" : " for project " + a.project)
              << " in that period\n";
    return kExitOk;
  }
  std::vector<std::vector<std::string>> table;
  schema::SavingsRow t;
  for (const auto& r : rows) {
    table.push_back({r.project, r.spot_cost.ToDollars(), r.spot_on_demand.ToDollars(),
                     r.spot_saved.ToDollars(), std::to_string(r.cache_hits),
                     r.cache_saved.ToDollars(), r.cost.ToDollars(), r.gpu_baseline.ToDollars(),
                     r.gpu_saved.ToDollars()});
    t.spot_cost += r.spot_cost, t.spot_on_demand += r.spot_on_demand, t.spot_saved += r.spot_saved;
    t.cache_hits += r.cache_hits, t.cache_saved += r.cache_saved;
    t.cost += r.cost, t.gpu_baseline += r.gpu_baseline, t.gpu_saved += r.gpu_saved;
  }
  table.push_back({"total", t.spot_cost.ToDollars(), t.spot_on_demand.ToDollars(),
                   t.spot_saved.ToDollars(), std::to_string(t.cache_hits),
                   t.cache_saved.ToDollars(), t.cost.ToDollars(), t.gpu_baseline.ToDollars(),
                   t.gpu_saved.ToDollars()});
  std::cout << Table({"PROJECT", ">SPOT COST", ">SAME ON-DEMAND", ">SPOT SAVED", ">CACHE HITS",
                      ">CACHE SAVED", ">COST", ">ON GPU (P4D)", ">NEURON SAVED"},
                     table);
  std::cout << "spot: on-demand price for the same billed time, less what spot cost; cache: what "
               "the stages it served would have cost; Neuron: the same work on "
            << sim::kGpuBaseline << ", less its cost (docs/spend.md)\n";
  return kExitOk;
}

}  // namespace

int CmdSpend(const SpendArgs& a) {
  auto catalog = OpenCatalog();
  if (a.savings) return PrintSavings(*catalog, a);
  if (a.format == "json") {
    std::cout << SpendJson(*catalog, a).dump(2) << "\n";
    return kExitOk;
  }
  schema::SpendQuery q{a.project, a.pipeline, ReadDateFlag("--since", a.since),
                       ReadDateFlag("--until", a.until), SplitFields(a.by)};
  RequireProject(*catalog, a.project);
  auto rows = catalog->Spend(q);
  if (a.format == "csv") {
    for (const auto& f : q.by) std::cout << f << ",";
    std::cout << "attempts,billed_hours,cost_usd,wasted_usd,saved_usd\n";
    for (const auto& r : rows) {
      for (const auto& k : r.keys) std::cout << Csv(k) << ",";
      std::cout << r.attempts << "," << r.billed_hours << "," << r.cost.ToDecimal() << ","
                << r.wasted.ToDecimal() << "," << r.saved.ToDecimal() << "\n";
    }
    return kExitOk;
  }
  std::vector<std::string> header;
  for (const auto& f : q.by) {
    std::string h = f;
    for (char& c : h) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    header.push_back(h);
  }
  for (const char* h : {">ATTEMPTS", ">BILLED HOURS", ">COST", ">WASTED", ">SAVED"})
    header.push_back(h);
  std::vector<std::vector<std::string>> table;
  Money cost, wasted, saved;
  for (const auto& r : rows) {
    std::vector<std::string> row = r.keys;
    row.push_back(std::to_string(r.attempts));
    row.push_back(Hours(r.billed_hours * 3600));
    row.push_back(r.cost.ToDollars());
    row.push_back(r.wasted.ToDollars());
    row.push_back(r.saved.ToDollars());
    table.push_back(std::move(row));
    cost += r.cost, wasted += r.wasted, saved += r.saved;
  }
  if (table.empty()) {
    std::cout << "no spend" << (a.project.empty() ? "" : " for project " + a.project)
              << " in that period\n";
    return kExitOk;
  }
  if (!q.by.empty()) {
    std::vector<std::string> total(q.by.size(), "");
    total[0] = "total";
    for (const auto& t :
         {std::string(), std::string(), cost.ToDollars(), wasted.ToDollars(), saved.ToDollars()})
      total.push_back(t);
    table.push_back(total);
  }
  std::cout << Table(header, table);
  // The ledger holds closed attempts; what is running now is added where a total is meant
  // (`runs`, `show`, `budget ls`), and named here.
  if (q.until.empty()) {
    auto [n, running] = catalog->RunningSpend(a.project, a.pipeline);
    if (n > 0)
      std::cout << "\n+ " << running.ToDollars() << " in " << n << " running attempt"
                << (n == 1 ? "" : "s") << " (not in the ledger until they end; `runs`, `show` "
                << "and `budget ls` include it)\n";
  }
  return kExitOk;
}

int CmdEvents(const EventsArgs& a) {
  std::string since = ReadDateFlag("--since", a.since);
  int64_t run_id = a.run.empty() ? 0 : ParseRunId(a.run);
  auto catalog = OpenCatalog();
  auto rows = catalog->EventLog(a.project, run_id, since, a.kind, a.limit);
  if (a.format == "json") {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    auto or_null = [](const std::string& s) {
      return s.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(s);
    };
    for (const auto& e : rows)
      out.push_back({{"at", e.at},
                     {"kind", e.kind},
                     {"project", or_null(e.project)},
                     {"run_id", e.run_id ? nlohmann::ordered_json(std::to_string(e.run_id))
                                         : nlohmann::ordered_json(nullptr)},
                     {"stage", or_null(e.stage)},
                     {"attempt", e.attempt ? nlohmann::ordered_json(e.attempt)
                                           : nlohmann::ordered_json(nullptr)},
                     {"message", e.message},
                     {"data", nlohmann::ordered_json::parse(e.data_json, nullptr, false)}});
    std::cout << out.dump(2) << "\n";
    return kExitOk;
  }
  if (rows.empty()) {
    std::cout << "no events" << (a.project.empty() ? "" : " for project " + a.project) << "\n";
    return kExitOk;
  }
  std::vector<std::vector<std::string>> table;
  for (const auto& e : rows)
    table.push_back({e.at, e.kind, e.project, e.run_id ? std::to_string(e.run_id) : "", e.message});
  std::cout << Table({"AT", "KIND", "PROJECT", ">RUN", "WHAT"}, table);
  return kExitOk;
}

// Budgets are the site's: members read them (`budget ls`) and may not change them, as in
// docs/security.md's table of roles. Said as other refusals say it: what needed whom.
static std::string BudgetRefusal(const std::string& doing, const std::string& project) {
  return "permission denied: " + doing + " project " + project +
         "'s budget needs the daemons' login (operators: as root on a host with "
         "/etc/trnflow/daemon.url, or TRNFLOW_DATABASE_URL set to it) or the catalog owner's; "
         "project members read budgets with `trnflow budget ls` and ask an operator to change "
         "them (docs/security.md, \"Roles\")";
}

int CmdBudgetSet(const std::string& project, const std::string& usd, const std::string& period) {
  Money amount;
  if (!Money::Parse(usd, &amount) || amount.micros() <= 0)
    throw UserError("budget " + usd +
                    ": expected a positive amount in dollars, e.g. 800 or 1250.50");
  RequireProjectName(project);
  auto catalog = OpenCatalog();
  if (!catalog->ProjectExists(project)) {
    std::vector<std::string> names;
    for (const auto& p : catalog->ListProjects()) names.push_back(p.name);
    throw UserError("there is no project '" + project + "' (a budget for it would guard nothing)" +
                    NameHint(project, names,
                             "; `trnflow project ls` lists them, `trnflow project add " + project +
                                 "` makes it"));
  }
  try {
    catalog->SetBudget(project, amount, period);
  } catch (const PermissionDenied&) {
    throw PermissionDenied(BudgetRefusal("setting", project));
  }
  std::cout << "project " << project << ": budget " << amount.ToDollars() << " per "
            << (period == "month" ? "calendar month (UTC)" : "all time") << "\n";
  return kExitOk;
}

int CmdBudgetRemove(const std::string& project, const DeleteArgs& del) {
  auto catalog = OpenCatalog();
  auto budgets = catalog->ProjectBudgets();
  auto it = std::find_if(budgets.begin(), budgets.end(),
                         [&](const auto& b) { return b.project == project; });
  if (it == budgets.end()) {
    std::vector<std::string> names;
    for (const auto& b : budgets) names.push_back(b.project);
    throw UserError("project '" + project + "' has no budget" +
                    NameHint(project, names, "; `trnflow budget ls` lists them"));
  }
  std::string what =
      it->amount.ToDollars() + " per " + (it->period == "month" ? "month" : "all time");
  if (del.dry_run) {
    std::cout << "would remove project " << project << "'s budget (" << what
              << "); dry run: nothing was removed\n";
    return kExitOk;
  }
  if (!Confirm("remove project " + project + "'s budget (" + what + ")?", del.yes))
    return Declined();
  bool removed = false;
  try {
    removed = catalog->RemoveBudget(project);
  } catch (const PermissionDenied&) {
    throw PermissionDenied(BudgetRefusal("removing", project));
  }
  if (!removed)
    throw UserError("project '" + project + "' has no budget; `trnflow budget ls` lists them");
  std::cout << "project " << project << ": budget removed\n";
  return kExitOk;
}

nlohmann::ordered_json BudgetsJson(schema::Catalog& catalog) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& b : catalog.BudgetForecasts())
    out.push_back({{"project", b.project},
                   {"period", b.period},
                   {"budget_usd", Usd(b.amount)},
                   {"spent_usd", Usd(b.spent)},
                   {"remaining_usd", Usd(b.amount - b.spent)},
                   {"committed_usd", Usd(b.committed)},
                   {"forecast_usd", Usd(b.forecast)},
                   {"forecast_low_usd", Usd(b.forecast_low)},
                   {"forecast_high_usd", Usd(b.forecast_high)}});
  return out;
}

int CmdBudgetList(const std::string& format) {
  auto catalog = OpenCatalog();
  if (format == "json") {
    std::cout << BudgetsJson(*catalog).dump(2) << "\n";
    return kExitOk;
  }
  auto budgets = catalog->BudgetForecasts();
  if (budgets.empty()) {
    std::cout << "no budgets; set one with `trnflow budget set PROJECT USD`\n";
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const auto& b : budgets) {
    char pct[16];
    std::snprintf(pct, sizeof pct, "%.0f%%", 100.0 * b.spent.micros() / b.amount.micros());
    rows.push_back({b.project, b.period, b.amount.ToDollars(), b.spent.ToDollars(),
                    (b.amount - b.spent).ToDollars(), pct, b.committed.ToDollars(),
                    b.forecast.ToDollars() + " (" + b.forecast_low.ToDollars() + " to " +
                        b.forecast_high.ToDollars() + ")"});
  }
  std::cout << Table({"PROJECT", "PERIOD", ">BUDGET", ">SPENT", ">REMAINING", ">USED",
                      ">OF WHICH RUNNING", "FORECAST (RANGE)"},
                     rows);
  std::cout << "forecast: the period's end at the rate so far, the range from the spread of "
               "daily spend (docs/serve.md)\n";
  return kExitOk;
}

namespace {

// `--max-running` values: N, none, POOL=N, POOL=none.
schema::ProjectShare ShareFromArgs(const ProjectShareArgs& args) {
  schema::ProjectShare share;
  share.weight = args.weight;
  for (const auto& v : args.max_running) {
    auto eq = v.find('=');
    std::string pool = eq == std::string::npos ? "" : v.substr(0, eq);
    std::string n = eq == std::string::npos ? v : v.substr(eq + 1);
    int cap = -1;
    if (n != "none") {
      size_t used = 0;
      try {
        cap = std::stoi(n, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != n.size() || cap < 0 || cap > 1000000)
        throw UserError("--max-running " + v +
                        ": expected N, POOL=N or none, with N from 0 to 1000000 stages, e.g. "
                        "--max-running 8 or --max-running trn1=4");
    }
    if (pool.empty()) {
      share.max_running = cap;
    } else {
      CheckPoolName(pool, "--max-running " + v);
      share.pool_max_running[pool] = cap;
    }
  }
  return share;
}

// "weight 2, at most 8 running (trn1: 4)".
std::string ShareText(const schema::ProjectRow& p) {
  std::ostringstream out;
  out << "weight " << p.weight;
  if (p.max_running) out << ", at most " << *p.max_running << " running";
  std::string pools;
  for (const auto& [pool, cap] : p.pool_max_running)
    pools += (pools.empty() ? "" : ", ") + pool + ": " + std::to_string(cap);
  if (!pools.empty()) out << (p.max_running ? " (" : ", at most (") << pools << ")";
  return out.str();
}

bool Changes(const ProjectShareArgs& args) {
  return args.weight.has_value() || !args.max_running.empty();
}

}  // namespace

int CmdProjectAdd(const std::string& name, const std::vector<std::string>& members,
                  std::optional<int> max_stages_per_run, std::optional<int> max_queued_stages,
                  std::optional<int64_t> job_uid, const ProjectShareArgs& share_args) {
  RequireProjectName(name);
  schema::ProjectShare share = ShareFromArgs(share_args);
  auto catalog = OpenCatalog(CatalogLogin::kAdmin);
  std::string role = catalog->AddProject(name, members);
  if (max_stages_per_run || max_queued_stages || job_uid)
    catalog->SetProjectQuotas(name, max_stages_per_run, max_queued_stages, job_uid);
  if (Changes(share_args)) catalog->SetProjectShare(name, share);
  std::cout << "project " << name << ": group role " << role;
  if (!members.empty()) {
    std::cout << ", members";
    for (const auto& m : members) std::cout << " " << m;
  }
  std::cout << "\n";
  return kExitOk;
}

int CmdProjectUpdate(const std::string& name, std::optional<int> max_stages_per_run,
                     std::optional<int> max_queued_stages, std::optional<int64_t> job_uid,
                     const ProjectShareArgs& share_args) {
  RequireProjectName(name);
  schema::ProjectShare share = ShareFromArgs(share_args);
  if (!Changes(share_args) && !max_stages_per_run && !max_queued_stages && !job_uid)
    throw UserError("project update " + name +
                    ": nothing to change; say --weight, --max-running, --max-stages-per-run, "
                    "--max-queued-stages or --job-uid");
  auto catalog = OpenCatalog(CatalogLogin::kAdmin);
  // Quotas first: a uid another project has is refused before anything is written, and on a
  // project that does not exist they change nothing while the share then says it is missing.
  if (max_stages_per_run || max_queued_stages || job_uid)
    catalog->SetProjectQuotas(name, max_stages_per_run, max_queued_stages, job_uid);
  catalog->SetProjectShare(name, share);
  for (const auto& p : catalog->ListProjects(/*with_share=*/true))
    if (p.name == name) std::cout << "project " << name << ": " << ShareText(p) << "\n";
  return kExitOk;
}

int CmdProjectGrant(const std::string& project, const std::string& role, bool write) {
  auto catalog = OpenCatalog(CatalogLogin::kAdmin);
  std::string group = catalog->GrantProject(project, role, write);
  std::cout << role << " may now " << (write ? "read and write" : "read") << " project " << project
            << " (through group role " << group << ")\n";
  return kExitOk;
}

int CmdProjectList(const std::string& format) {
  auto catalog = OpenCatalog(CatalogLogin::kAdmin);
  std::vector<std::vector<std::string>> rows;
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& p : catalog->ListProjects(/*with_share=*/true)) {
    std::string members;
    for (const auto& m : p.members) {
      bool reads_only = std::find(p.readers.begin(), p.readers.end(), m) != p.readers.end();
      members += (members.empty() ? "" : ", ") + m + (reads_only ? " (read)" : "");
    }
    rows.push_back({p.name, p.role, members, std::to_string(p.runs), ShareText(p)});
    nlohmann::ordered_json caps = nlohmann::ordered_json::object();
    for (const auto& [pool, cap] : p.pool_max_running) caps[pool] = cap;
    out.push_back({{"project", p.name},
                   {"role", p.role},
                   {"members", p.members},
                   {"readers", p.readers},
                   {"runs", p.runs},
                   {"weight", p.weight},
                   {"max_running", p.max_running ? nlohmann::ordered_json(*p.max_running)
                                                 : nlohmann::ordered_json(nullptr)},
                   {"pool_max_running", caps}});
  }
  if (format == "json") {
    std::cout << out.dump(2) << "\n";
    return kExitOk;
  }
  if (rows.empty()) {
    std::cout << "no projects; add one with `trnflow project add NAME`\n";
    return kExitOk;
  }
  std::cout << Table({"PROJECT", "ROLE", "MEMBERS", ">RUNS", "SHARE"}, rows);
  return kExitOk;
}

}  // namespace trnflow::cli
