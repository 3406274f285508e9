// trnflow db archive: one past UTC month of the ledger to a pg_dump file, checked, then its
// partition detached and dropped (migration 0031; docs/operations.md, "Retention").
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "common/env.h"
#include "common/error.h"
#include "schema/catalog.h"

namespace trnflow::cli {
namespace {

struct ToolResult {
  int status = -1;     // the exit status, -1 when it could not run or was killed
  std::string output;  // stdout and stderr together
};

// The URL without its password, and the password: a password on a command line is readable by
// every local user (/proc/PID/cmdline), so the client tool gets it in PGPASSWORD instead.
std::pair<std::string, std::string> SplitPassword(const std::string& url) {
  static const std::regex uri(R"(^(postgres(?:ql)?://[^:@/?]*):([^@/?]*)@(.*)$)");
  static const std::regex keyword(R"((^|\s)password\s*=\s*('(?:[^'\\]|\\.)*'|\S+))");
  std::smatch m;
  if (std::regex_match(url, m, uri)) {
    std::string pw, enc = m[2].str();
    for (size_t i = 0; i < enc.size(); ++i) {  // percent-decoded, as libpq reads it
      if (enc[i] == '%' && i + 2 < enc.size() &&
          std::isxdigit(static_cast<unsigned char>(enc[i + 1])) &&
          std::isxdigit(static_cast<unsigned char>(enc[i + 2]))) {
        pw += static_cast<char>(std::stoi(enc.substr(i + 1, 2), nullptr, 16));
        i += 2;
      } else {
        pw += enc[i];
      }
    }
    return {m[1].str() + "@" + m[3].str(), pw};
  }
  if (std::regex_search(url, m, keyword)) {
    std::string pw = m[2].str();
    if (pw.size() >= 2 && pw.front() == '\'') {
      std::string unq;
      for (size_t i = 1; i + 1 < pw.size(); ++i) {
        if (pw[i] == '\\' && i + 2 < pw.size()) ++i;
        unq += pw[i];
      }
      pw = unq;
    }
    return {m.prefix().str() + m[1].str() + m.suffix().str(), pw};
  }
  return {url, ""};
}

// Runs a PostgreSQL client tool (pg_dump, pg_restore) with these arguments, no shell between;
// `password` (if any) in its environment only. What it writes is for the owner alone (umask 077:
// a dump holds every project's ledger).
ToolResult RunTool(const std::vector<std::string>& args, const std::string& password = "") {
  ToolResult r;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return r;
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return r;
  }
  if (pid == 0) {
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::umask(077);
    if (!password.empty()) ::setenv("PGPASSWORD", password.c_str(), 1);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    std::fprintf(stderr, "cannot run %s: not installed or not on PATH\n", argv[0]);
    ::_exit(127);
  }
  ::close(fds[1]);
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) r.output.append(buf, n);
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  while (!r.output.empty() && r.output.back() == '\n') r.output.pop_back();
  return r;
}

}  // namespace

int CmdDbArchive(const ArchiveArgs& args) {
  std::string url = CheckedAdminUrl("db archive");
  schema::ArchivePlan plan = schema::PlanArchive(url, args.month);
  std::string file = args.file.empty() ? "trnflow-attempts-" + plan.month + ".dump" : args.file;
  std::error_code ec;
  if (std::filesystem::exists(file, ec))
    throw UserError("--file " + file +
                    ": the file exists; archive to another (--file F) or move "
                    "it away first (an archive is never overwritten)");
  std::string table = "trnflow." + plan.partition;
  std::string what = std::to_string(plan.attempts) + " attempts of " + plan.month + " (" + table +
                     " of database " + plan.database + ")";
  if (args.del.dry_run) {
    std::cout << "would dump " << what << " to " << file << " (pg_dump --format=custom), check it "
              << "with pg_restore --list, then "
              << (args.keep ? "keep the partition (--keep)" : "detach and drop the partition")
              << "\ndry run: nothing was written or dropped\n";
    return kExitOk;
  }
  if (!args.keep &&
      !Confirm("archive " + what + " to " + file + " and then drop it from the catalog? The " +
                   "spend reports and /metrics keep its sums",
               args.del.yes))
    return Declined();

  std::string tmp = file + ".partial";
  std::filesystem::remove(tmp, ec);
  auto [url_without_password, password] = SplitPassword(url);
  ToolResult dump = RunTool({"pg_dump", "--format=custom", "--table=" + table, "--file=" + tmp,
                             "--dbname=" + url_without_password},
                            password);
  if (dump.status != 0) {
    std::filesystem::remove(tmp, ec);
    throw UserError("pg_dump of " + table + " failed (exit " + std::to_string(dump.status) +
                    "): " + RedactSecrets(dump.output, url) +
                    "\nnothing was dropped; pg_dump must be installed and of this server's "
                    "major version or newer");
  }
  ToolResult list = RunTool({"pg_restore", "--list", tmp});
  std::string data_entry = "TABLE DATA trnflow " + plan.partition + " ";
  if (list.status != 0 || list.output.find(data_entry) == std::string::npos) {
    std::filesystem::remove(tmp, ec);
    throw UserError("pg_restore --list of the dump of " + table + " " +
                    (list.status != 0 ? "failed: " + list.output
                                      : std::string("does not list the table's data")) +
                    "\nnothing was dropped; the dump was removed");
  }
  std::filesystem::rename(tmp, file, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw UserError("--file " + file + ": " + ec.message() + "; nothing was dropped");
  }
  std::cout << "dumped " << what << " to " << file << " (" << std::filesystem::file_size(file, ec)
            << " bytes; pg_restore --list reads it)\n";
  if (args.keep) {
    std::cout << "kept " << table << " (--keep)\n";
    return kExitOk;
  }
  schema::DropArchivedPartition(url, plan);
  std::cout << "detached and dropped " << table << "; restore it with pg_restore (docs/"
            << "operations.md, \"Retention\")\n";
  return kExitOk;
}

}  // namespace trnflow::cli
