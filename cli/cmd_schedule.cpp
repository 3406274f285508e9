// trnflow schedule add / ls / show / update / pause / resume / rm: cron schedules the leading
// scheduler fires.
//
// A schedule fires a snapshot of its pipeline, the text `add` (or `update`) validated, never
// the file: the scheduler that fires it may run on another host, where the file is missing or
// another version. So editing the file changes nothing until `schedule update`; `ls` and
// `show` say when the file here differs from the snapshot.
#include <date/date.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <map>
#include <regex>
#include <string_view>
#include <vector>

#include "cli/commands.h"
#include "common/error.h"
#include "common/sha256.h"
#include "scheduler/cron.h"
#include "scheduler/scheduler.h"

namespace trnflow::cli {
namespace {

using SysTime = std::chrono::system_clock::time_point;

// How the file a schedule was taken from compares with its snapshot, read from here.
struct FileCheck {
  enum class State { kUnchanged, kChanged, kUnreadable } state = State::kUnreadable;
  std::string path;  // where it was looked for
  int first_line = 0;  // kChanged: the first line that differs (1-based)
  std::string snapshot_line, file_line;
};

std::string_view ToString(FileCheck::State s) {
  switch (s) {
    case FileCheck::State::kUnchanged:
      return "unchanged";
    case FileCheck::State::kChanged:
      return "changed";
    case FileCheck::State::kUnreadable:
      return "unreadable";
  }
  return "unreadable";
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    out.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  return out;
}

// The schedule's file as a path from here: as added when absolute, else from its workdir.
std::string FilePath(const schema::ScheduleRow& s) {
  std::filesystem::path f(s.file);
  return f.is_absolute() ? f.string() : (std::filesystem::path(s.workdir) / f).string();
}

FileCheck CheckFile(const schema::ScheduleRow& s) {
  FileCheck c;
  c.path = FilePath(s);
  std::ifstream in(c.path, std::ios::binary);
  if (!in) return c;
  std::string text;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, in.gcount());
    if (text.size() > 2 * s.source.size() + 65536) break;  // differs; enough to say where
  }
  if (in.bad()) return c;
  if (text == s.source) {
    c.state = FileCheck::State::kUnchanged;
    return c;
  }
  c.state = FileCheck::State::kChanged;
  auto a = Lines(s.source), b = Lines(text);
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  c.first_line = static_cast<int>(i + 1);
  c.snapshot_line = i < a.size() ? a[i] : "(end of file)";
  c.file_line = i < b.size() ? b[i] : "(end of file)";
  return c;
}

std::map<std::string, std::string> StoredParams(const schema::ScheduleRow& s) {
  std::map<std::string, std::string> out;
  nlohmann::json j = nlohmann::json::parse(s.params_json, nullptr, false);
  if (j.is_object())
    for (auto& [k, v] : j.items()) out[k] = v.is_string() ? v.get<std::string>() : v.dump();
  return out;
}

// The next `n` slots after the later of the last slot and now (none when paused).
std::vector<SysTime> NextSlots(const schema::ScheduleRow& s, int n) {
  std::vector<SysTime> out;
  std::string error;
  auto cron = scheduler::ParseCron(s.cron, &error);
  if (!cron || s.paused || !scheduler::IsTimeZone(s.tz)) return out;
  SysTime t = std::max(SysTime(std::chrono::duration_cast<SysTime::duration>(
                           std::chrono::duration<double>(s.last_slot_epoch))),
                       std::chrono::system_clock::now());
  while (static_cast<int>(out.size()) < n) {
    auto next = scheduler::NextSlot(*cron, s.tz, t);
    if (!next) break;
    out.push_back(t = *next);
  }
  return out;
}

std::string Minute(SysTime t) {
  return date::format("%F %R UTC", std::chrono::floor<std::chrono::minutes>(t));
}

void CheckCronAndZone(const std::string& cron, const std::string& tz) {
  std::string error;
  if (!scheduler::ParseCron(cron, &error)) throw UserError("--cron \"" + cron + "\": " + error);
  if (!scheduler::IsTimeZone(tz))
    throw UserError("--tz " + tz + ": not a time zone; use an IANA name like Europe/Berlin");
}

// "no schedule X", with the closest name.
UserError NoSchedule(schema::Catalog& catalog, const std::string& name) {
  std::vector<std::string> names;
  for (const auto& s : catalog.ListSchedules()) names.push_back(s.name);
  return UserError("no schedule " + name +
                   NameHint(name, names, "; `trnflow schedule ls` lists them"));
}

schema::ScheduleRow RequireSchedule(schema::Catalog& catalog, const std::string& name) {
  auto s = catalog.GetSchedule(name);
  if (!s) throw NoSchedule(catalog, name);
  return *s;
}

}  // namespace

int CmdScheduleAdd(const ScheduleArgs& a) {
  static const std::regex name("[a-z0-9][a-z0-9_-]{0,62}");
  if (!std::regex_match(a.name, name))
    throw UserError("schedule name '" + a.name + "': use lowercase letters, digits, - and _");
  CheckCronAndZone(a.cron, a.tz);
  std::string error;
  auto params = ParseParams(a.run.params);
  auto pipeline = LoadOrReport(a.run.file, {params, a.run.project, CatalogStageBound()});
  if (!pipeline) return kExitBadInput;
  if (!(a.run.speed > 0)) throw UserError("--speed must be a positive number");
  schema::ScheduleRow r;
  r.name = a.name;
  r.file = a.run.file;
  r.source = pipeline->source;
  r.params_json = nlohmann::json(params).dump();
  r.project = a.run.project;
  r.cron = a.cron;
  r.tz = a.tz;
  r.catchup = a.catchup;
  r.speed = a.run.speed;
  r.workdir = std::filesystem::current_path().string();
  auto catalog = OpenCatalog();
  if (!catalog->AddSchedule(r))
    throw UserError("a schedule named " + a.name + " exists; `trnflow schedule rm " + a.name +
                    "` first to replace it");
  auto next = scheduler::NextSlot(*scheduler::ParseCron(a.cron, &error), a.tz,
                                  std::chrono::system_clock::now());
  std::cout << "schedule " << a.name << ": " << pipeline->name << " at \"" << a.cron << "\" ("
            << a.tz << "), catch-up " << a.catchup << "; next run "
            << (next ? date::format("%F %R UTC", std::chrono::floor<std::chrono::minutes>(*next))
                     : std::string("never"))
            << "\nthe leading `trnflow scheduler` fires it; workers run it\n"
            << "it fires a copy of " << a.run.file
            << " as it is now: edits to the file change nothing until `trnflow schedule update "
            << a.name << "`\n";
  return kExitOk;
}

nlohmann::ordered_json ScheduleListJson(schema::Catalog& catalog) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& s : catalog.ListSchedules()) {
    auto n = NextSlots(s, 1);
    FileCheck f = CheckFile(s);
    out.push_back({{"name", s.name},
                   {"file", s.file},
                   {"file_state", std::string(ToString(f.state))},
                   {"project", OrNull(s.project)},
                   {"cron", s.cron},
                   {"tz", s.tz},
                   {"catchup", s.catchup},
                   {"state", s.paused ? "paused" : "active"},
                   {"next_at", n.empty() ? nlohmann::json(nullptr)
                                         : nlohmann::json(date::format(
                                               "%FT%RZ", std::chrono::floor<std::chrono::minutes>(
                                                             n[0])))},
                   {"fires", s.fires},
                   {"last_run_id", IdOrNull(s.last_run)},
                   {"params", StoredParams(s)},
                   {"speed", s.speed}});
  }
  return out;
}

int CmdScheduleList(const std::string& format) {
  auto catalog = OpenCatalog();
  if (format == "json") {
    std::cout << ScheduleListJson(*catalog).dump(2) << "\n";
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> changed;
  for (const auto& s : catalog->ListSchedules()) {
    auto n = NextSlots(s, 1);
    auto minute = [&](const char* f) {
      return date::format(f, std::chrono::floor<std::chrono::minutes>(n[0]));
    };
    FileCheck f = CheckFile(s);
    std::string snapshot = f.state == FileCheck::State::kUnchanged ? "= file"
                           : f.state == FileCheck::State::kChanged ? "file changed"
                                                                   : "file not here";
    if (f.state == FileCheck::State::kChanged) changed.push_back(s.name);
    rows.push_back({s.name, s.file, snapshot, s.cron, s.tz, s.catchup,
                    s.paused ? "paused" : "active", n.empty() ? "-" : minute("%F %R"),
                    std::to_string(s.fires), s.last_run ? std::to_string(s.last_run) : "-"});
  }
  if (rows.empty()) {
    std::cout << "no schedules; add one with `trnflow schedule add NAME FILE --cron EXPR`\n";
    return kExitOk;
  }
  std::cout << Table({"NAME", "FILE", "SNAPSHOT", "CRON", "TZ", "CATCH-UP", "STATE", "NEXT (UTC)",
                      ">FIRED", ">LAST RUN"},
                     rows);
  if (!changed.empty()) {
    std::string names;
    for (const auto& n : changed) names += (names.empty() ? "" : ", ") + n;
    std::cout << "\nfile changed since the snapshot: " << names
              << ". Schedules fire the copy taken when they were added or updated; `trnflow "
                 "schedule show NAME` shows the difference, `trnflow schedule update NAME` "
                 "takes the file as it is now.\n";
  }
  return kExitOk;
}

int CmdScheduleShow(const std::string& name, const std::string& format) {
  auto catalog = OpenCatalog();
  schema::ScheduleRow s = RequireSchedule(*catalog, name);
  FileCheck f = CheckFile(s);
  auto params = StoredParams(s);
  auto next = NextSlots(s, 3);
  // The snapshot as the scheduler reads it: does it still validate with this trnflow?
  auto loaded = pipelines::ParsePipeline(
      s.source, s.file, {params, s.project, [&](const std::string& project) {
                           auto room = catalog->GetStageRoom(project);
                           return pipelines::QuotaStageBound(project, room.max_stages_per_run,
                                                             room.max_queued_stages,
                                                             room.unfinished);
                         }});
  std::string pipeline = loaded.pipeline ? loaded.pipeline->name : "";
  std::string project = !s.project.empty() ? s.project
                        : loaded.pipeline  ? loaded.pipeline->project
                                           : "";
  std::string sha = Sha256Hex(s.source);
  if (format == "json") {
    nlohmann::ordered_json j;
    j["name"] = s.name;
    j["pipeline"] = OrNull(pipeline);
    j["project"] = OrNull(project);
    j["state"] = s.paused ? "paused" : "active";
    j["cron"] = s.cron;
    j["tz"] = s.tz;
    j["catchup"] = s.catchup;
    j["speed"] = s.speed;
    j["params"] = params;
    j["file"] = s.file;
    j["workdir"] = s.workdir;
    j["file_state"] = std::string(ToString(f.state));
    if (f.state == FileCheck::State::kChanged)
      j["first_difference"] = {
          {"line", f.first_line}, {"snapshot", f.snapshot_line}, {"file", f.file_line}};
    j["snapshot_sha256"] = sha;
    j["snapshot_taken_at"] = OrNull(s.updated_at);
    j["snapshot_valid"] = loaded.pipeline.has_value();
    if (!loaded.pipeline) j["snapshot_errors"] = loaded.diagnostics.Format();
    j["created_at"] = s.created_at;
    nlohmann::ordered_json slots = nlohmann::ordered_json::array();
    for (auto t : next)
      slots.push_back(date::format("%FT%TZ", std::chrono::floor<std::chrono::seconds>(t)));
    j["next_slots"] = slots;
    j["fires"] = s.fires;
    if (s.last_slot_fired.empty())
      j["last_fire"] = nullptr;
    else
      j["last_fire"] = {
          {"slot", s.last_slot_fired},
          {"fired_at", s.last_fired_at},
          {"run_id", s.last_run ? nlohmann::ordered_json(std::to_string(s.last_run))
                                : nlohmann::ordered_json(nullptr)},
          {"run_state", s.last_run_state ? nlohmann::ordered_json(schema::ToSql(*s.last_run_state))
                                         : nlohmann::ordered_json(nullptr)}};
    j["snapshot"] = s.source;
    std::cout << j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    return kExitOk;
  }
  std::string ps;
  for (const auto& [k, v] : params) ps += (ps.empty() ? "" : ", ") + k + "=" + v;
  std::string nexts;
  for (auto t : next) nexts += (nexts.empty() ? "" : ", ") + Minute(t);
  std::cout << "schedule " << s.name << " (" << (s.paused ? "paused" : "active") << ")\n"
            << "  pipeline   " << (pipeline.empty() ? "?" : pipeline) << ", project "
            << (project.empty() ? "?" : project) << "\n"
            << "  cron       " << s.cron << " (" << s.tz << "), catch-up " << s.catchup
            << ", speed " << Number(s.speed) << "\n"
            << "  params     " << (ps.empty() ? "-" : ps) << "\n"
            << "  next       "
            << (s.paused ? "- (paused)" : nexts.empty() ? std::string("never") : nexts) << "\n"
            << "  last fire  ";
  if (s.last_slot_fired.empty())
    std::cout << "never\n";
  else
    std::cout << "slot " << s.last_slot_fired << ", fired " << s.last_fired_at << ", run "
              << (s.last_run
                      ? std::to_string(s.last_run) + " (" + schema::ToSql(s.last_run_state) + ")"
                      : std::string("- (removed)"))
              << "; " << s.fires << (s.fires == 1 ? " fire" : " fires") << " in all\n";
  std::cout << "  snapshot   taken " << s.updated_at << " (added " << s.created_at << "), sha256 "
            << sha.substr(0, 12) << "\n"
            << "  file       " << s.file << " (from " << s.workdir << "): ";
  switch (f.state) {
    case FileCheck::State::kUnchanged:
      std::cout << "the same as the snapshot\n";
      break;
    case FileCheck::State::kChanged:
      std::cout << "CHANGED since the snapshot; the schedule still fires the snapshot.\n"
                << "             first difference, line " << f.first_line << ":\n"
                << "               snapshot: " << f.snapshot_line << "\n"
                << "               file:     " << f.file_line << "\n"
                << "             `trnflow schedule update " << s.name
                << "` takes the file as it is now\n";
      break;
    case FileCheck::State::kUnreadable:
      std::cout << "not readable here (" << f.path
                << "); the schedule fires its snapshot, whatever the file holds elsewhere\n";
      break;
  }
  if (!loaded.pipeline)
    std::cout << "  warning    the snapshot no longer validates; the scheduler skips its slots:\n"
              << loaded.diagnostics.Format();
  std::cout << "\n--- snapshot (what fires) ---\n" << s.source;
  if (!s.source.empty() && s.source.back() != '\n') std::cout << "\n";
  return kExitOk;
}

int CmdScheduleUpdate(const ScheduleUpdateArgs& a) {
  auto catalog = OpenCatalog();
  schema::ScheduleRow s = RequireSchedule(*catalog, a.name);
  schema::ScheduleRow u = s;
  // A new file is named from here, like `add`; the stored one from where it was added.
  std::string path = FilePath(s);
  if (!a.file.empty()) {
    u.file = a.file;
    u.workdir = std::filesystem::current_path().string();
    path = a.file;
  }
  auto params = a.reset_params ? std::map<std::string, std::string>{} : StoredParams(s);
  for (const auto& [k, v] : ParseParams(a.params)) params[k] = v;
  if (!a.cron.empty()) u.cron = a.cron;
  if (!a.tz.empty()) u.tz = a.tz;
  CheckCronAndZone(u.cron, u.tz);
  // Validated as `add` validates it; on any error nothing is written.
  auto pipeline = LoadOrReport(path, {params, s.project, CatalogStageBound()});
  if (!pipeline) return kExitBadInput;
  u.source = pipeline->source;
  u.params_json = nlohmann::json(params).dump();
  if (!catalog->UpdateSchedule(u))
    throw UserError("no schedule " + a.name + "; `trnflow schedule ls` lists them");
  std::vector<std::string> what;
  if (u.source != s.source) {
    auto before = Lines(s.source), after = Lines(u.source);
    size_t i = 0;
    while (i < before.size() && i < after.size() && before[i] == after[i]) ++i;
    what.push_back("new snapshot of " + u.file + " (first difference at line " +
                   std::to_string(i + 1) + ")");
  } else {
    what.push_back("the snapshot already matched " + u.file);
  }
  if (u.params_json != s.params_json) what.push_back("params " + u.params_json);
  if (u.cron != s.cron || u.tz != s.tz)
    what.push_back("cron \"" + u.cron + "\" (" + u.tz + "), counting from now");
  if (u.workdir != s.workdir) what.push_back("workdir " + u.workdir);
  std::cout << "schedule " << a.name << " updated: ";
  for (size_t i = 0; i < what.size(); ++i) std::cout << (i ? "; " : "") << what[i];
  std::cout << "\n";
  u.paused = s.paused;
  u.last_slot_epoch = u.cron != s.cron || u.tz != s.tz
                          ? std::chrono::duration<double>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count()
                          : s.last_slot_epoch;
  if (auto n = NextSlots(u, 1); !n.empty())
    std::cout << pipeline->name << " fires next at " << Minute(n[0]) << "\n";
  return kExitOk;
}

int CmdScheduleRun(const std::string& name, const std::string& format) {
  auto catalog = OpenCatalog();
  auto s = catalog->GetSchedule(name);
  if (!s) throw NoSchedule(*catalog, name);
  int64_t run = 0;
  try {
    run = scheduler::FireScheduleNow(*catalog, name);
  } catch (const PermissionDenied&) {
    // Schedules are the site's, as `schedule add` is (docs/security.md, "Roles").
    throw PermissionDenied("permission denied: firing schedule " + name +
                           " needs the daemons' login (operators: as root on a host with "
                           "/etc/trnflow/daemon.url, or TRNFLOW_DATABASE_URL set to it); a "
                           "project member submits the same pipeline with `trnflow submit`");
  }
  auto next = NextSlots(*s, 1);
  std::string next_text =
      next.empty() ? ""
                   : date::format("%F %R", std::chrono::floor<std::chrono::minutes>(next[0]));
  if (format == "json") {
    nlohmann::ordered_json out = {{"schedule", name}, {"run_id", std::to_string(run)}, {"manual", true},
                                  {"next_slot", next_text.empty() ? nlohmann::ordered_json()
                                                                  : nlohmann::ordered_json(
                                                                        next_text + "Z")}};
    std::cout << out.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << "schedule " << name << " fired now (manual): run " << run
            << "; its cron slots are unchanged"
            << (next_text.empty() ? "" : " (next " + next_text + " UTC)") << ". Follow it with "
            << "`trnflow watch " << run << "`; the site's workers run it.\n";
  return kExitOk;
}

int CmdSchedulePause(const std::string& name, bool paused) {
  auto catalog = OpenCatalog();
  if (!catalog->SetSchedulePaused(name, paused)) throw NoSchedule(*catalog, name);
  std::cout << "schedule " << name << (paused ? " paused" : " resumed (from now on)") << "\n";
  return kExitOk;
}

int CmdScheduleRemove(const std::string& name, const DeleteArgs& del) {
  auto catalog = OpenCatalog();
  auto all = catalog->ListSchedules();
  auto it = std::find_if(all.begin(), all.end(), [&](const auto& s) { return s.name == name; });
  if (it == all.end()) throw NoSchedule(*catalog, name);
  if (del.dry_run) {
    std::cout << "would remove schedule " << name << " (" << it->file << " at \"" << it->cron
              << "\", fired " << it->fires << " times); dry run: nothing was removed\n";
    return kExitOk;
  }
  if (!Confirm("remove schedule " + name + " (" + it->file + " at \"" + it->cron + "\")?", del.yes))
    return Declined();
  if (!catalog->RemoveSchedule(name)) throw NoSchedule(*catalog, name);
  std::cout << "schedule " << name << " removed\n";
  return kExitOk;
}

}  // namespace trnflow::cli
