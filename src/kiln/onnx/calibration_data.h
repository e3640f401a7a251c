// INT8 calibration data: a directory in the ONNX test-data layout (DIR/test_data_set_*/input_*.pb,
// one TensorProto per model input), loaded as one feed per data set. Reading it is ONNX's
// business; precision/ only computes on the feeds (precision/calibration.h).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/hash.h"
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

// What the data sets of `dir` hold: the bytes of every file LoadCalibrationData reads, with their
// set and input numbers; other files do not count. nullopt where `dir` holds no data set or a file
// cannot be read. An engine's key names its calibration data by this, not by the path, so that
// ranks that write the same tensors to their own temporary directories agree, and a directory
// whose data changed is a new key.
std::optional<Hash128> CalibrationDataDigest(const std::string& dir);

}  // namespace kiln
