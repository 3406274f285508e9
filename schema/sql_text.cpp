#include "schema/sql_text.h"

#include <map>
#include <sstream>
#include <stdexcept>

#include "common/embedded.h"

namespace trnflow::schema {
namespace migrations {
const std::vector<EmbeddedFile>& Files();
}
namespace queries {
const std::vector<EmbeddedFile>& Files();
}

const std::vector<Migration>& Migrations() {
  static const std::vector<Migration> all = [] {
    std::vector<Migration> out;
    for (const auto& f : migrations::Files())
      out.push_back(
          {std::stoi(std::string(f.name.substr(0, 4))), std::string(f.name), std::string(f.text)});
    return out;  // embedded sorted by file name, so in version order
  }();
  return all;
}

const std::string& Query(const std::string& name) {
  static const std::map<std::string, std::string> all = [] {
    std::map<std::string, std::string> out;
    for (const auto& f : queries::Files()) {
      std::istringstream in{std::string(f.text)};
      std::string line, current, body;
      auto flush = [&] {
        if (current.empty()) return;
        while (!body.empty() && (body.back() == '\n' || body.back() == ';' || body.back() == ' '))
          body.pop_back();
        if (!out.emplace(current, body).second)
          throw std::logic_error("query " + current + " is defined twice");
      };
      while (std::getline(in, line)) {
        if (line.rfind("-- name: ", 0) == 0) {
          flush();
          current = line.substr(9);
          body.clear();
        } else if (!current.empty()) {
          body += line + "\n";
        }
      }
      flush();
    }
    return out;
  }();
  auto it = all.find(name);
  if (it == all.end()) throw std::logic_error("no query named " + name + " in schema/queries");
  return it->second;
}

}  // namespace trnflow::schema
