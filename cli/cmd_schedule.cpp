// trnflow schedule add / ls / pause / resume / rm: cron schedules the leading scheduler fires.
#include <date/date.h>

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

int CmdScheduleList() {
  auto catalog = OpenCatalog();
  std::vector<std::vector<std::string>> rows;
  for (const auto& s : catalog->ListSchedules()) {
    std::string error, next = "-";
    auto cron = scheduler::ParseCron(s.cron, &error);
    if (cron && !s.paused) {
      auto last = std::chrono::system_clock::time_point(
          std::chrono::duration_cast<std::chrono::system_clock::duration>(
              std::chrono::duration<double>(s.last_slot_epoch)));
      if (auto n =
              scheduler::NextSlot(*cron, s.tz, std::max(last, std::chrono::system_clock::now())))
        next = date::format("%F %R", std::chrono::floor<std::chrono::minutes>(*n));
    }
    rows.push_back({s.name, s.file, s.cron, s.tz, s.catchup, s.paused ? "paused" : "active", next,
                    std::to_string(s.fires), s.last_run ? std::to_string(s.last_run) : "-"});
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

int CmdSchedulePause(const std::string& name, bool paused) {
  auto catalog = OpenCatalog();
  if (!catalog->SetSchedulePaused(name, paused))
    throw UserError("no schedule " + name + "; `trnflow schedule ls` lists them");
  std::cout << "schedule " << name << (paused ? " paused" : " resumed (from now on)") << "\n";
  return kExitOk;
}

int CmdScheduleRemove(const std::string& name) {
  auto catalog = OpenCatalog();
  if (!catalog->RemoveSchedule(name))
    throw UserError("no schedule " + name + "; `trnflow schedule ls` lists them");
  std::cout << "schedule " << name << " removed\n";
  return kExitOk;
}

}  // namespace trnflow::cli
