// trnflow schedule add / ls / pause / resume / rm: cron schedules the leading scheduler fires.
#include <date/date.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>

#include "cli/commands.h"
#include "common/error.h"
#include "scheduler/cron.h"

namespace trnflow::cli {

int CmdScheduleAdd(const ScheduleArgs& a) {
  static const std::regex name("[a-z0-9][a-z0-9_-]{0,62}");
  if (!std::regex_match(a.name, name))
    throw UserError("schedule name '" + a.name + "': use lowercase letters, digits, - and _");
  std::string error;
  if (!scheduler::ParseCron(a.cron, &error)) throw UserError("--cron \"" + a.cron + "\": " + error);
  if (!scheduler::IsTimeZone(a.tz))
    throw UserError("--tz " + a.tz + ": not a time zone; use an IANA name like Europe/Berlin");
  auto params = ParseParams(a.run.params);
  auto pipeline = LoadOrReport(a.run.file, {params, a.run.project});
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
            << "\nthe leading `trnflow scheduler` fires it; workers run it\n";
  return kExitOk;
}

int CmdScheduleList(const std::string& format) {
  auto catalog = OpenCatalog();
  std::vector<std::vector<std::string>> rows;
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& s : catalog->ListSchedules()) {
    std::string error, next;
    auto cron = scheduler::ParseCron(s.cron, &error);
    std::optional<std::chrono::system_clock::time_point> next_slot;
    if (cron && !s.paused) {
      auto last = std::chrono::system_clock::time_point(
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              std::chrono::duration<double>(s.last_slot_epoch)));
      next_slot =
          scheduler::NextSlot(*cron, s.tz, std::max(last, std::chrono::system_clock::now()));
    }
    auto minute = [&](const char* f) {
      return date::format(f, std::chrono::floor<std::chrono::minutes>(*next_slot));
    };
    nlohmann::json params = nlohmann::json::parse(s.params_json, nullptr, false);
    if (params.is_discarded()) params = nlohmann::json::object();
    out.push_back(
        {{"name", s.name},
         {"file", s.file},
         {"project", OrNull(s.project)},
         {"cron", s.cron},
         {"tz", s.tz},
         {"catchup", s.catchup},
         {"state", s.paused ? "paused" : "active"},
         {"next_at", next_slot ? nlohmann::json(minute("%FT%RZ")) : nlohmann::json(nullptr)},
         {"fires", s.fires},
         {"last_run_id", IdOrNull(s.last_run)},
         {"params", params},
         {"speed", s.speed}});
    rows.push_back({s.name, s.file, s.cron, s.tz, s.catchup, s.paused ? "paused" : "active",
                    next_slot ? minute("%F %R") : "-", std::to_string(s.fires),
                    s.last_run ? std::to_string(s.last_run) : "-"});
  }
  if (format == "json") {
    std::cout << out.dump(2) << "\n";
    return kExitOk;
  }
  if (rows.empty()) {
    std::cout << "no schedules; add one with `trnflow schedule add NAME FILE --cron EXPR`\n";
    return kExitOk;
  }
  std::cout << Table(
      {"NAME", "FILE", "CRON", "TZ", "CATCH-UP", "STATE", "NEXT (UTC)", ">FIRED", ">LAST RUN"},
      rows);
  return kExitOk;
}

namespace {
// "no schedule X", with the closest name.
UserError NoSchedule(schema::Catalog& catalog, const std::string& name) {
  std::vector<std::string> names;
  for (const auto& s : catalog.ListSchedules()) names.push_back(s.name);
  return UserError("no schedule " + name +
                   NameHint(name, names, "; `trnflow schedule ls` lists them"));
}
}  // namespace

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
