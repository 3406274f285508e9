// The first week, platform engineer: installing the daemons. ops/install.sh (cmake --install
// underneath) must put the binary where the systemd units' ExecStart looks for it, create the
// user the scheduler's unit runs as, and the files the units read. Run for real, as root, into
// a DESTDIR that holds a copy of this host's /etc, so the host itself is left alone.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "tests/run_cli.h"

namespace trnflow {
namespace {

namespace fs = std::filesystem;

using testing::ReadFile;
using testing::RunShell;
using testing::Sh;

// A fresh root with a copy of the files useradd reads and writes.
fs::path FreshRoot(const std::string& name) {
  fs::path root = fs::temp_directory_path() / ("trnflow-install-" + name + "-" +
                                               std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "etc/default");
  for (const char* f : {"passwd", "group", "shadow", "gshadow", "login.defs", "default/useradd"}) {
    if (fs::exists(fs::path("/etc") / f))
      fs::copy_file(fs::path("/etc") / f, root / "etc" / f);
  }
  return root;
}

std::string Install(const fs::path& root, const std::string& args = "") {
  std::string build = fs::path(TRNFLOW_BINARY).parent_path().string();
  return "DESTDIR=" + root.string() + " " + TRNFLOW_SOURCE_DIR + "/ops/install.sh --build " +
         build + " " + args;
}

// Key=value lines of a unit file (the last one wins, as in systemd for these keys).
std::map<std::string, std::string> UnitKeys(const fs::path& unit) {
  std::map<std::string, std::string> keys;
  std::istringstream in(ReadFile(unit));
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#' || line[0] == '[') continue;
    auto eq = line.find('=');
    if (eq != std::string::npos) keys[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return keys;
}

std::string PasswdLine(const fs::path& root, const std::string& user) {
  std::istringstream in(ReadFile(root / "etc/passwd"));
  std::string found;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(user + ":", 0) == 0) {
      EXPECT_TRUE(found.empty()) << "two passwd lines for " << user;
      found = line;
    }
  }
  return found;
}

TEST(Install, BinaryUnitsUserAndConfigAreWhereTheUnitsExpectThem) {
  ASSERT_EQ(geteuid(), 0u) << "ops/install.sh creates a system user: the suite runs as root";
  fs::path root = FreshRoot("default");
  testing::CliResult r = Sh(Install(root));
  ASSERT_EQ(r.exit_code, 0) << r.out;

  fs::path units = root / "etc/systemd/system";
  for (const char* name :
       {"trnflow-scheduler.service", "trnflow-worker@.service", "trnflow-serve.service"}) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(fs::exists(units / name)) << r.out;
    std::string text = ReadFile(units / name);
    EXPECT_EQ(text.find('@' + std::string("TRNFLOW_")), std::string::npos) << "unfilled: " << text;
    auto keys = UnitKeys(units / name);
    std::string exec = keys["ExecStart"].substr(0, keys["ExecStart"].find(' '));
    EXPECT_EQ(exec, "/opt/trnflow/bin/trnflow");
    fs::path installed = root / fs::path(exec).relative_path();
    ASSERT_TRUE(fs::exists(installed)) << exec << " is not installed under " << root;
    EXPECT_EQ(Sh(installed.string() + " --help").exit_code, 0);
    // Every file the unit reads exists (systemd refuses to start without a non-optional one),
    // except the worker's per-instance pools file, which the admin writes.
    std::string env_file = keys["EnvironmentFile"];
    if (env_file.find("%i") == std::string::npos) {
      EXPECT_TRUE(fs::exists(root / fs::path(env_file).relative_path())) << env_file;
    }
    // The user the unit runs as exists.
    EXPECT_FALSE(PasswdLine(root, keys["User"]).empty()) << "no user " << keys["User"];
  }

  // The scheduler's user is a system account that cannot log in.
  std::string line = PasswdLine(root, "trnflow");
  ASSERT_FALSE(line.empty()) << ReadFile(root / "etc/passwd");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(line, m, std::regex(R"(trnflow:[^:]*:(\d+):\d+:[^:]*:[^:]*:(.*))")))
      << line;
  EXPECT_LT(std::stoi(m[1]), 1000) << "not a system uid: " << line;
  EXPECT_EQ(m[2], "/usr/sbin/nologin");
  EXPECT_TRUE(fs::exists(root / "var/lib/trnflow"));

  // The env file may hold the daemons' password: root's, 0600.
  struct stat st {};
  ASSERT_EQ(stat((root / "etc/trnflow/env").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_uid, 0u);

  // The dashboard's proxy secret: the trnflow user's, 0600 (the unit's --proxy-secret-file);
  // the nginx line that sends it: root's, 0600.
  ASSERT_EQ(stat((root / "etc/trnflow/serve-proxy.secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(std::to_string(st.st_uid), m[1].str());
  std::string secret = ReadFile(root / "etc/trnflow/serve-proxy.secret");
  EXPECT_TRUE(std::regex_match(secret, std::regex("[0-9a-f]{64}\n"))) << secret;
  ASSERT_EQ(stat((root / "etc/trnflow/serve-proxy.nginx.conf").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_NE(ReadFile(root / "etc/trnflow/serve-proxy.nginx.conf").find(secret.substr(0, 64)),
            std::string::npos);
  EXPECT_NE(UnitKeys(units / "trnflow-serve.service")["ExecStart"].find(
                "--proxy-secret-file /etc/trnflow/serve-proxy.secret"),
            std::string::npos);

  // Again: nothing changes, nothing is duplicated.
  std::string env_before = ReadFile(root / "etc/trnflow/env");
  r = Sh(Install(root));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("trnflow exists"), std::string::npos) << r.out;
  EXPECT_FALSE(PasswdLine(root, "trnflow").empty());
  EXPECT_EQ(ReadFile(root / "etc/trnflow/env"), env_before);
  EXPECT_EQ(ReadFile(root / "etc/trnflow/serve-proxy.secret"), secret) << "the proxy keeps working";
  fs::remove_all(root);
}

TEST(Install, UnitsFollowThePrefixTheBinaryWentTo) {
  fs::path root = FreshRoot("prefix");
  testing::CliResult r = Sh(Install(root, "--prefix /srv/tools/trnflow"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(fs::exists(root / "srv/tools/trnflow/bin/trnflow")) << r.out;
  auto keys = UnitKeys(root / "etc/systemd/system/trnflow-scheduler.service");
  EXPECT_EQ(keys["ExecStart"], "/srv/tools/trnflow/bin/trnflow scheduler");
  fs::remove_all(root);
}

TEST(Install, RefusesWithoutABuild) {
  fs::path root = FreshRoot("nobuild");
  testing::CliResult r = Sh("DESTDIR=" + root.string() + " " + TRNFLOW_SOURCE_DIR +
               "/ops/install.sh --build /nonexistent-build");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("ops/setup.sh"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(root / "opt")) << "wrote something although it refused";
  fs::remove_all(root);
}

}  // namespace
}  // namespace trnflow
