// Refit: new weights into an existing engine without a rebuild. The engine's weight program
// (ir/weight_program.h) is replayed on the new initializers with the reference evaluator and the
// weight ops the build ran, and the results replace the engine's constants: same layers, same
// tactics, same memory plan. docs/refit.md has the design.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>

#include "kiln/core/hash.h"
#include "kiln/core/status.h"
#include "kiln/engine/engine_desc.h"
#include "kiln/ir/tensor.h"
#include "kiln/precision/calibration.h"

namespace kiln {

struct RefitReport {
  int64_t initializers = 0;      // in the new weights
  int64_t steps = 0;             // weight steps replayed
  int64_t constants_refit = 0;   // engine constants replaced
  int64_t constants_kept = 0;    // engine constants independent of the weights
  int64_t bytes_refit = 0;       // bytes of the replaced constants
  bool filled_stripped = false;  // the engine was weight-stripped and is full now
  // INT8 layers, and what their activation scales are: "stored" (the build's, with which the
  // kernels re-quantise the new weights) or "recalibrated" (RecalibrateInt8); "" without any.
  int64_t int8_layers = 0;
  std::string int8_scales;
  std::string calibration;    // recalibrated: the method, data sets and directory
  double read_seconds = 0;    // reading the new weights (RefitEngineFile)
  double replay_seconds = 0;  // checking them and replaying the program
  double write_seconds = 0;   // writing the engine (RefitEngineFile)
  // Where the replay went (ir/weight_program.h WeightProgramStats): the checks and the steps
  // (wall), thread-seconds per step op, large elementwise steps split over threads, the longest.
  double check_seconds = 0;
  double steps_seconds = 0;
  std::map<std::string, double> op_seconds;
  int64_t split_steps = 0;
  std::string longest_op;
  double longest_seconds = 0;
  std::string ToText() const;
  std::string ToJson() const;
};

// The new value of every constant the engine's program makes, from `initializers` (by initializer
// name), each checked against the constant it replaces. Changes nothing. KILN-E4007 for an engine
// without a program, KILN-E4009 for one with a non-refittable constant (the first is named, with
// the reason) or a changed initializer the build read, KILN-E4008 for weights that do not match
// (the first mismatch is named).
StatusOr<std::map<std::string, Tensor>> ComputeRefit(
    const EngineDesc& engine, const std::map<std::string, Tensor>& initializers,
    RefitReport* report = nullptr);

// ComputeRefit, then replaces the constants (all of them or, on any error, none) and records
// `model_hash` (the new model's content address) in the header. A weight-stripped engine
// (StripWeights) is filled: it becomes the full engine a build with these weights writes.
Status RefitEngine(EngineDesc& engine, const std::map<std::string, Tensor>& initializers,
                   const Hash128& model_hash, RefitReport* report = nullptr);

// The model without its weights, for a cache keyed by architecture (a hit is refit, not
// rebuilt): the imported graph's structure (inputs, outputs, nodes with their attributes, every
// constant's name, dtype and dims) and the values of what the build may read to shape the engine
// (ONNX Constant nodes, integer initializers, initializers of one element), but not the values
// of the other initializers. Two models with the same hash differ only in those weights.
Hash128 WeightFreeModelHash(const Graph& imported);

// A model's initializers by name (an ONNX file; external data resolved beside it), and the hash
// of the file's bytes a build of it would record.
struct OnnxWeights {
  std::map<std::string, Tensor> initializers;
  Hash128 file_hash;
};
StatusOr<OnnxWeights> ReadOnnxWeights(const std::string& path);
// The same for a model held in memory (no external data); file_hash is HashBytes(bytes), the hash
// a build from these bytes records.
StatusOr<OnnxWeights> ReadOnnxWeightsFromBytes(std::span<const std::byte> bytes);

// The model hash a refit from bare initializers records (there is no model file to hash): every
// initializer's name, dtype, dims and bytes. Two refits with the same weights record the same.
Hash128 InitializersHash(const std::map<std::string, Tensor>& initializers);

// `kiln refit --recalibrate`: INT8 activation scales calibrated again with the new weights.
struct RecalibrateOptions {
  std::string calibration_dir;  // ONNX test-data layout, as `kiln build --calib-dir` takes it
  precision::CalibrationMethod method = precision::CalibrationMethod::kMinMax;
  double percentile = 99.99;  // for kPercentile
};

// After RefitEngine with `model`'s initializers (`model`: the new weights' ONNX model, imported):
// calibrates again as the build did (the build's passes on `model`, then the FP32 reference over
// the calibration data) and gives every INT8 layer its new input scale and precision reason, so
// that the engine is the one a fresh INT8 build of `model` with the same calibration data makes.
// The precision decisions (which layers are INT8, FP16 or FP32) are kept: KILN-E4009 when the new
// calibration leaves an INT8 layer without a usable range. Assumes the engine was built with the
// graph passes on (the default); the INT8 sensitivity fallback is not re-taken.
Status RecalibrateInt8(EngineDesc& engine, std::unique_ptr<Graph> model,
                       const RecalibrateOptions& options, RefitReport* report = nullptr);

// `kiln refit`: loads `engine_path` (any backend: refit runs on the host), refits it with the
// initializers of `onnx_path` and writes the result to `out_path` atomically. `out_path` may be
// `engine_path`: the file is replaced whole, and on any error it is left as it was.
// With `recalibrate`, RecalibrateInt8 follows the refit.
Status RefitEngineFile(const std::string& engine_path, const std::string& onnx_path,
                       const std::string& out_path, RefitReport* report = nullptr,
                       const RecalibrateOptions* recalibrate = nullptr);

}  // namespace kiln
