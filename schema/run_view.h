#pragma once
// RunView: one run as people and scripts read it, built once and rendered as a table or as
// JSON (as DuckDB renders one result set through its box and JSON renderers). Every place
// that prints a run goes through it: `trnflow show` (table and --format json), `run` and
// `watch --format json` when the run ends, the dashboard's /api/runs/ID; and the list of runs:
// `trnflow runs` and /api/runs. The renderers' output is a contract (docs/cli.md): the same
// bytes whoever asks.
//
// A view is read in one transaction (Catalog::ReadRunView: a fixed number of statements, each
// by index on the run, whatever the run's size or the catalog's history), so its run, stages,
// attempts and metrics are one snapshot. What a command adds from outside the run's rows (the
// process holding the run is gone, ready stages no live worker can take, why a stage waits:
// cli/cmd_explain.cpp) it fills in before rendering, only for the renderer that prints it.
// Plain data and pure functions: any thread, no connection kept.
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "schema/catalog.h"

namespace trnflow::schema {

struct RunView {
  RunRow run;
  std::vector<StageRow> stages;      // by id
  std::vector<AttemptRow> attempts;  // by stage id, then attempt; the open ones included
  std::map<int64_t, std::string> metrics;  // stage id -> its latest `metrics` event (JSON text)

  // Filled by the command, not read from the run's rows:
  std::optional<std::string> holder_gone;  // JSON's run.holder_gone, for a running run
  std::vector<std::string> warnings;       // the table's "! " lines under its heading
  std::map<int64_t, std::vector<std::string>> waits;  // table of one stage: why it waits, by id
};

// Whether stage `name` is the one `filter` names: by its name, or for a matrix stage by the
// name in the file ("compile" for every "compile[batch=...]"). An empty filter names all.
bool StageMatches(const std::string& name, const std::string& filter);

// `show --format json`: {"run": {...}, "stages": [...]}, every stage (or those `stage_filter`
// names) with its attempts. With `collapse`, each matrix fan-out is one entry (states, attempts
// and dollars summed under "matrix") but those `collapse` names ("all": none), and "totals" is
// added: the dashboard's run page.
nlohmann::json RunJson(const RunView& view, const std::string& stage_filter = "",
                       const std::optional<std::set<std::string>>& collapse = std::nullopt);

// `show` as a table: the run's heading, the warnings, then a line per stage (with `collapse`,
// a matrix fan-out on one line); with `stage_filter`, each matching stage's waits and a line
// per attempt instead.
std::string RunTable(const RunView& view, const std::string& stage_filter = "",
                     bool collapse = false);

// The table `trnflow run` ends with: a line per stage and the total (closed attempts only).
std::string RunSummaryTable(const std::vector<StageRow>& stages);

// `runs --format json` and /api/runs: one object per run.
nlohmann::json RunListJson(const std::vector<RunRow>& runs);
// `runs` as a table; "no runs" (in project `project`, when given) when there are none.
std::string RunListTable(const std::vector<RunRow>& runs, const std::string& project);

// Cells shared by the run tables and `watch`:
// What a stage has cost: its closed attempts plus the running one so far, the same figure
// `runs`, `budget ls` and `spend` add up; "$1.20*" when a running attempt is in it.
std::string SpentCell(const StageRow& s);
// A running stage's live progress, "42%, 3.1 sim h left (~2s)"; "" when it has not reported.
std::string ProgressCell(const StageRow& s, double speed);
// A run's STATE cell: its state, or "over budget" when the budget guard stopped it.
std::string RunStateCell(const RunRow& r);
// "trn1.32xlarge x4"; the type alone for one instance.
std::string InstanceCell(const std::string& type, int count);

}  // namespace trnflow::schema
