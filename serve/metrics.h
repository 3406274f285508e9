#pragma once
// /metrics in the Prometheus text exposition format (version 0.0.4), written directly: every
// metric the catalog reports (schema/queries/serve.sql, `Metrics`) with its HELP and TYPE, plus
// the dashboard's own gauges. Pure functions; no I/O.
#include <string>
#include <vector>

#include "schema/catalog_rows.h"

namespace trnflow::serve {

// Formats `rows` (any order) grouped by metric name, each with HELP and TYPE lines. A metric
// this file does not know is written as an untyped gauge with a generic HELP, never dropped.
std::string FormatMetrics(const std::vector<schema::MetricRow>& rows);

// A label value escaped for the text format (backslash, double quote, newline).
std::string EscapeLabelValue(const std::string& value);

}  // namespace trnflow::serve
