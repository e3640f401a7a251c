// Reads single samples out of Prometheus text exposition, for assertions in tests.
#pragma once

#include <optional>
#include <sstream>
#include <string>

namespace kiln::obs::testing {

// The value of the sample whose name-and-labels part is exactly `series`
// ("kiln_up", "kiln_errors_total{code=\"KILN-E8000\"}"); empty when absent.
inline std::optional<double> SampleValue(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line.size() > series.size() && line.compare(0, series.size(), series) == 0 &&
        line[series.size()] == ' ') {
      return std::stod(line.substr(series.size() + 1));
    }
  }
  return std::nullopt;
}

}  // namespace kiln::obs::testing
