#pragma once
// A text file compiled into the binary by cmake/embed.cmake (SQL, catalog data).
#include <string_view>
#include <vector>

namespace trnflow {
struct EmbeddedFile {
  std::string_view name;  // file name without directory, e.g. "0001_init.sql"
  std::string_view text;
};
}  // namespace trnflow
