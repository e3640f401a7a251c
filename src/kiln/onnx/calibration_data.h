// INT8 calibration data: a directory in the ONNX test-data layout (DIR/test_data_set_*/input_*.pb,
// one TensorProto per model input), loaded as one feed per data set. Reading it is ONNX's
// business; precision/ only computes on the feeds (precision/calibration.h).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/ir/graph.h"
#include "kiln/ir/tensor.h"
#include "kiln/plan/profile.h"

namespace kiln {

// Loads every data set of `dir` and checks each tensor against the graph's inputs (count, dtype,
// static dims, the profile's min..max for dynamic dims): KILN-E3007 names the input, what was
// expected and what was found.
StatusOr<std::vector<std::map<std::string, Tensor>>> LoadCalibrationData(
    const Graph& graph, const OptimizationProfile& profile, const std::string& dir);

}  // namespace kiln
