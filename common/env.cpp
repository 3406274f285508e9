#include "common/env.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <regex>

namespace trnflow {

namespace {
// The first line of a credentials file ops/setup.sh wrote, or "" when this user cannot read it
// (its mode is 0600: only the daemons' own user can).
std::string UrlFromFile(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  return line;
}
}  // namespace

std::string ConfigDir() {
  const char* dir = std::getenv("TRNFLOW_CONFIG_DIR");
  return dir && *dir ? dir : "/etc/trnflow";
}

std::string DatabaseUrl() {
  const char* url = std::getenv("TRNFLOW_DATABASE_URL");
  if (url && *url) return url;
  if (std::string daemon = UrlFromFile(ConfigDir() + "/daemon.url"); !daemon.empty()) return daemon;
  // A person's own login over the local socket (peer authentication: the OS user's role).
  return "postgresql:///trnflow";
}

std::string AdminDatabaseUrl() {
  const char* url = std::getenv("TRNFLOW_ADMIN_DATABASE_URL");
  if (url && *url) return url;
  if (std::string owner = UrlFromFile(ConfigDir() + "/owner.url"); !owner.empty()) return owner;
  return DatabaseUrl();
}

std::string HomeDir() {
  const char* home = std::getenv("TRNFLOW_HOME");
  if (home && *home) return home;
  // Root is a worker serving tenants: a system directory, not /root, whose 0700 would keep
  // every job's uid out of its own run dir.
  if (::geteuid() == 0) return "/var/lib/trnflow";
  const char* user_home = std::getenv("HOME");
  return std::string(user_home && *user_home ? user_home : "/tmp") + "/.local/share/trnflow";
}

std::string RedactUrl(const std::string& url) {
  // URI form: scheme://user:password@host
  static const std::regex uri(R"(^([a-z]+://[^:/@]*):[^@]*@)");
  // key=value form: password=secret or password='se cret'
  static const std::regex kv(R"(password\s*=\s*('[^']*'|\S+))");
  std::string out = std::regex_replace(url, uri, "$1:***@");
  return std::regex_replace(out, kv, "password=***");
}

std::string RedactSecrets(std::string text, const std::string& url) {
  static const std::regex any_uri(R"(([a-z]+://[^:/@\s]*):[^@\s]*@)");
  static const std::regex kv(R"(password\s*=\s*('[^']*'|\S+))");
  text = std::regex_replace(std::regex_replace(text, any_uri, "$1:***@"), kv, "password=***");
  // The password itself, wherever a driver's message repeats it (a malformed URL is echoed).
  static const std::regex uri_password(R"(^[a-z]+://[^:/@]*:([^@]*)@)");
  static const std::regex kv_password(R"(password\s*=\s*'?([^'\s]+))");
  std::smatch m;
  std::string password;
  if (std::regex_search(url, m, uri_password) || std::regex_search(url, m, kv_password))
    password = m[1];
  if (password.size() >= 3)
    for (size_t at; (at = text.find(password)) != std::string::npos;)
      text.replace(at, password.size(), "***");
  return text;
}

}  // namespace trnflow
