#pragma once
// Plain text for people: the tables every command prints (`runs`, `show`, `spend`, ...) and
// the figures in their cells. Pure functions; any thread.
#include <string>
#include <vector>

namespace trnflow {

// A plain text table: header row, then rows; columns padded to their widest cell. Columns
// whose header starts with '>' are right-aligned (the '>' is not printed). Trailing blanks of
// a line are dropped.
std::string Table(const std::vector<std::string>& header,
                  const std::vector<std::vector<std::string>>& rows);
// Seconds as hours with two decimals: 42480 -> "11.80".
std::string Hours(double seconds);

}  // namespace trnflow
