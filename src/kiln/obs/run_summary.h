// The four figures of the report's "Metrics Validation" (engine build time, max kernel time,
// NCCL init latency, peak GPU memory) for one run, as a table for people and JSON for machines,
// and a before/after comparison of two runs. A figure not measured prints as "not measured".
#pragma once

#include <string>
#include <string_view>

#include "kiln/core/status.h"
#include "kiln/obs/metrics.h"

namespace kiln::obs {

struct RunSummary {
  RunFigures figures;

  static RunSummary FromMetrics(const KilnMetrics& metrics = Metrics());
  std::string ToTable() const;
  // {"engine_build_seconds": 12.5, "kernel_max_seconds": null, ...}: null when not measured.
  std::string ToJson() const;
  static StatusOr<RunSummary> FromJson(std::string_view json);
  // Rows of both runs and the after/before ratio, e.g. for a fix's verification.
  static std::string CompareTable(const RunSummary& before, const RunSummary& after);
};

}  // namespace kiln::obs
