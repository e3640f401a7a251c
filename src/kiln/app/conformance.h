// Conformance: runs directories in the ONNX backend-test layout (model.onnx +
// test_data_set_N/{input,output}_i.pb) through the whole engine path (import -> build ->
// serialize -> load -> execute) and compares with the reference outputs.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/backends/kernel.h"
#include "kiln/core/status.h"
#include "kiln/precision/calibration.h"
#include "kiln/precision/sensitivity.h"

namespace kiln::app {

struct ConformanceOptions {
  BackendKind backend = BackendKind::kCpu;
  bool fp16 = false;
  bool bf16 = false;
  // INT8 (with FP16 fallback), calibrated on the case's own test_data_set_* inputs.
  bool int8 = false;
  precision::CalibrationMethod calibration_method = precision::CalibrationMethod::kMinMax;
  double int8_tolerance = precision::kDefaultInt8Tolerance;  // see BuilderConfig
  bool optimize = true;
  // Graph passes not to run (BuilderConfig::disabled_passes), e.g. qdq_fusion to run a QDQ model's
  // Q/DQ ops literally.
  std::vector<std::string> disabled_passes;
  // Element-wise |a-e| <= atol + rtol*|e| (the ONNX backend tests' default: 1e-3, 1e-7) ...
  double rtol = 1e-3;
  double atol = 1e-7;
  // ... or, when set, relative L2 error of each output (the zoo: 1e-4 at FP32).
  std::optional<double> max_rel_l2;
};

struct CaseResult {
  std::string name;
  bool passed = false;
  std::string stage;  // where it stopped: import, build, load, run, compare, ok
  std::string error;  // catalog error or comparison summary
  std::string error_code;
  int data_sets = 0;
  double max_abs = 0, max_rel = 0, rel_l2 = 0;
  double seconds = 0;
};

CaseResult RunConformanceCase(const std::string& dir, const ConformanceOptions& options);

// Every immediate subdirectory of `root` holding a model.onnx (or `root` itself), sorted.
std::vector<std::string> FindConformanceCases(const std::string& root);

}  // namespace kiln::app
