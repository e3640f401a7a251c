// BuilderConfig: everything that decides what engine a build produces. Its hash is part of the
// engine's content address (dist) and header.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kiln/backends/kernel.h"
#include "kiln/core/hash.h"
#include "kiln/engine/engine_desc.h"
#include "kiln/precision/calibration.h"
#include "kiln/precision/sensitivity.h"

namespace kiln {

// The memory budget: absolute bytes, or a fraction of the device's free memory shared among the
// ranks on that device.
struct MemoryBudget {
  std::optional<int64_t> bytes;
  std::optional<double> fraction;
  int ranks_per_device = 1;
  bool unlimited() const { return !bytes && !fraction; }
  // Parses "512M", "8G", "1073741824", "0.5" (a fraction when < 1 and has a point).
  static StatusOr<MemoryBudget> Parse(const std::string& text);
  std::string ToString() const;
};

// Progress reported to a callback; returning false cancels the build (like TensorRT's
// IProgressMonitor). Cancelling in the tactic phase still yields the best engine so far.
struct BuildProgress {
  std::string phase;  // "import", "passes", "precision", "tactics", "plan", "serialize"
  int64_t done = 0;
  int64_t total = 0;
  double elapsed_s = 0;
  std::string detail;  // e.g. the layer being timed, best-so-far latency
};
using ProgressCallback = std::function<bool(const BuildProgress&)>;

inline constexpr int kMinOptLevel = 0, kMaxOptLevel = 5, kDefaultOptLevel = 2;
// Tactics taken per provider at an optimisation level (0: all of them).
int TacticsPerProvider(int opt_level);

struct BuilderConfig {
  BackendKind backend = BackendKind::kCpu;
  // What layers may use besides FP32 (TensorRT's kFP16/kBF16/kINT8); each layer's choice is
  // made by the precision pass (src/kiln/precision) and reported with its reason.
  bool fp16 = false;
  bool bf16 = false;
  bool int8 = false;  // INT8 where calibrated and a kernel exists; FP16 fallback, then FP32
  // FP8 E4M3 (per-tensor scales) where calibrated and a kernel exists (cuBLASLt on sm_89+), for
  // the INT8 candidates not made INT8; FP16 fallback, then FP32.
  bool fp8 = false;
  // FP8 builds: an FP8 product whose only consumer is another FP8 product writes E4M3 for it
  // (builder/quant_edges.h); false (`kiln build --no-fp8-edges`) keeps FP16 between them.
  bool fp8_edges = true;
  // INT8 builds: the same between two INT8 products whose kernels can (kiln's own CUDA INT8
  // product): the producer writes int8 for its consumer; false (`--no-int8-edges`) keeps floats.
  bool int8_edges = true;
  // INT8/FP8 layers (calibrated, not a QDQ model's) with a tactic search: their quantized tactics
  // race the same layer's float ones, and a layer whose fastest tactic is float runs float, as
  // TensorRT picks among the precisions allowed (the reason says so). nullopt: on for a device
  // backend (CUDA), off for the CPU, whose INT8 kernels are the contract's reference;
  // `kiln build --quantized-if-faster on|off` sets it.
  std::optional<bool> quantized_if_faster;
  // INT8 calibration: inputs in the ONNX test-data layout (DIR/test_data_set_*/input_*.pb), run
  // through the FP32 reference. With --fp16 alone they also feed the FP16 activation range guard.
  std::string calibration_dir;
  precision::CalibrationMethod calibration_method = precision::CalibrationMethod::kMinMax;
  double calibration_percentile = 99.99;  // for the percentile method
  std::string calibration_cache_path;     // reused when valid (no calibration run), else written
  // Calibration and INT8 sensitivity run on the build's backend when it is a device (CUDA:
  // backends/device_eval.h keeps activations and kernels on the GPU between batches); false, or
  // a CPU build: the CPU reference. `kiln build --calib-on-cpu` sets it false.
  bool calibrate_on_backend = true;
  // INT8 layers fall back to FP16, most sensitive first, until the estimated relative L2 error
  // against FP32 on the calibration data is within this (+inf: none falls back).
  double int8_tolerance = precision::kDefaultInt8Tolerance;
  // The same for the FP8 layers (--fp8-tolerance): they fall back to FP16/BF16.
  double fp8_tolerance = precision::kDefaultFp8Tolerance;
  // The profile; its shape_values name shape inputs and the values to build for (an input no
  // shape rule reads is not a shape input: its values are dropped from the engine's profile).
  OptimizationProfile profile;
  // Engines with shape inputs: the activation arena a context allocates and re-plans in for
  // other values (at least the plan's arena for the build's values; 0: just that). Part of the
  // peak checked against the memory budget.
  int64_t shape_arena_bytes = 0;
  MemoryBudget memory_budget;
  // Bounded build: at the deadline the best engine so far is kept (never an error).
  std::optional<std::chrono::milliseconds> deadline;
  std::optional<double> max_kernel_time_ms;
  std::string timing_cache_path;
  bool optimize = true;  // graph passes
  // Graph passes to skip, by name (passes::DefaultPassNames(); `kiln build --disable-pass`): a
  // way around a rewrite that misbehaves on a model. Names outside that list are refused.
  std::vector<std::string> disabled_passes;
  // Whether the passes move few-channel stems' blocks into channels (stem_space_to_depth); unset:
  // KILN_STEM_SPACE_TO_DEPTH, else for an INT8 build on CUDA with the quantized tactics on
  // (builder.cc). Recalibration sets it from the engine it renews, whatever the environment.
  std::optional<bool> stem_space_to_depth;
  // false: every layer keeps its heuristic (first) tactic and nothing is timed; the baseline
  // that bench/build compares the tactic search against.
  bool search_tactics = true;
  // How widely the tactic search looks (like TensorRT's builder optimization level), 0..5:
  // 0 keeps each layer's heuristic tactic (nothing timed); 1-4 take the first 1, 2, 4, 8 tactics
  // of each provider (of each kernel family of a provider: TacticConfig::family) in its
  // heuristic order (a provider that finalises plans to list them, like
  // cuDNN, finalises only those) and stop timing a candidate once it is clearly slower than the
  // best; 5 takes every tactic and times each fully. Default 2.
  int opt_level = kDefaultOptLevel;
  // Bound of the threads that set up tactic candidates (0: KILN_BUILD_SETUP_THREADS, else one per
  // hardware thread up to 16). Not in the hash: it changes how fast an engine is found.
  int setup_threads = 0;
  ProgressCallback progress;

  // Everything that changes the engine's bytes (not progress or the timing cache path; the
  // calibration directory and cache are in, as they decide the INT8 scales and the FP16 guard).
  Hash128 Hash() const;
};

// Parses "shape:2,-1" (a shape input and the values to build for) into `profile`.
Status ParseShapeValuesSpec(const std::string& spec, OptimizationProfile* profile);
// Parses "input:1x3x224x224,8x3x224x224,32x3x224x224" (min,opt,max) into `profile`.
Status ParseProfileSpec(const std::string& spec, OptimizationProfile* profile);
// Parses --calib-method: "minmax", "entropy", "percentile" or "percentile=P" (P overrides
// `percentile`), and checks the percentile is in (0, 100].
Status ParseCalibrationMethodSpec(const std::string& text, double percentile,
                                  BuilderConfig* config);
// Parses "60s", "1500ms", "5m", "1h" (a bare number is seconds).
StatusOr<std::chrono::milliseconds> ParseDuration(const std::string& text);

}  // namespace kiln
