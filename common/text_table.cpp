#include "common/text_table.h"

#include <algorithm>
#include <cstdio>

namespace trnflow {

std::string Table(const std::vector<std::string>& header,
                  const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size(), 0);
  std::vector<bool> right(header.size(), false);
  std::vector<std::string> head = header;
  for (size_t i = 0; i < head.size(); ++i) {
    if (!head[i].empty() && head[i][0] == '>') right[i] = true, head[i] = head[i].substr(1);
    width[i] = head[i].size();
  }
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size() && i < width.size(); ++i)
      width[i] = std::max(width[i], r[i].size());
  size_t line_width = rows.empty() ? 0 : 1 + 2 * width.size();
  for (size_t w : width) line_width += w;
  std::string out;
  out.reserve(line_width * (rows.size() + 1));
  // One line, appended to `out` in place: a 10,000-row table is built without a string per
  // line or per cell.
  auto line = [&](const std::vector<std::string>& cells) {
    size_t start = out.size();
    for (size_t i = 0; i < width.size(); ++i) {
      static const std::string kEmpty;
      const std::string& c = i < cells.size() ? cells[i] : kEmpty;
      size_t pad = width[i] - std::min(width[i], c.size());
      if (right[i]) {
        out.append(pad, ' ');
        out += c;
      } else {
        out += c;
        if (i + 1 < width.size()) out.append(pad, ' ');
      }
      if (i + 1 < width.size()) out += "  ";
    }
    while (out.size() > start && out.back() == ' ') out.pop_back();
    out += '\n';
  };
  line(head);
  for (const auto& r : rows) line(r);
  return out;
}

std::string Hours(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", seconds / 3600);
  return buf;
}

}  // namespace trnflow
