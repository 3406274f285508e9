#include "common/bytes.h"

#include <map>

namespace trnflow {

std::optional<uint64_t> ParseBytes(const std::string& text) {
  static const std::map<std::string, uint64_t> kUnits = {{"", 1},
                                                         {"B", 1},
                                                         {"K", 1ULL << 10},
                                                         {"KiB", 1ULL << 10},
                                                         {"KB", 1000ULL},
                                                         {"M", 1ULL << 20},
                                                         {"MiB", 1ULL << 20},
                                                         {"MB", 1000ULL * 1000},
                                                         {"G", 1ULL << 30},
                                                         {"GiB", 1ULL << 30},
                                                         {"GB", 1000ULL * 1000 * 1000},
                                                         {"T", 1ULL << 40},
                                                         {"TiB", 1ULL << 40},
                                                         {"TB", 1000ULL * 1000 * 1000 * 1000}};
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0 || digits > 19) return std::nullopt;
  auto unit = kUnits.find(text.substr(digits));
  if (unit == kUnits.end()) return std::nullopt;
  uint64_t n = std::stoull(text.substr(0, digits));
  if (n > UINT64_MAX / unit->second) return std::nullopt;
  return n * unit->second;
}

}  // namespace trnflow
