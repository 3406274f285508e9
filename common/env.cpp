#include "common/env.h"

#include <unistd.h>

#include <cstdlib>
#include <regex>

namespace trnflow {

std::string DatabaseUrl() {
  const char* url = std::getenv("TRNFLOW_DATABASE_URL");
  if (url && *url) return url;
  return "postgresql://trnflow:trnflow@localhost:5432/trnflow";
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

}  // namespace trnflow
