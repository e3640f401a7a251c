// INT8 post-training calibration: per-tensor ranges collected by running the FP32 reference
// evaluator over calibration inputs, reduced to one clipping threshold (amax) per tensor by
// min-max, entropy (KL divergence, TensorRT-style) or percentile; and the calibration cache that
// lets a later build skip all of it.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/hash.h"
#include "kiln/core/status.h"
#include "kiln/ir/evaluator.h"
#include "kiln/ir/graph.h"

namespace kiln::precision {

enum class CalibrationMethod : uint8_t { kMinMax, kEntropy, kPercentile };
std::string_view ToString(CalibrationMethod method);  // "minmax", "entropy", "percentile"
StatusOr<CalibrationMethod> ParseCalibrationMethod(std::string_view text);

struct CalibrationOptions {
  // Min-max, not TensorRT's entropy default: on the zoo, entropy's clipping ruins every CNN and
  // min-max is as good or better on all 8 models (docs/precision.md has the figures).
  CalibrationMethod method = CalibrationMethod::kMinMax;
  double percentile = 99.99;  // for kPercentile: the share of |x| kept unclipped, in (0, 100]
  std::string data_dir;       // ONNX test-data layout: DIR/test_data_set_*/input_*.pb
  std::string cache_path;     // read when valid, written after calibrating
};

// One tensor's calibrated range.
struct TensorRange {
  double absmax = 0;  // largest |x| seen (the FP16 range guard reads this)
  double amax = 0;    // the method's clipping threshold (the INT8 scale is amax / 127)
};

struct CalibrationTable {
  CalibrationMethod method = CalibrationMethod::kMinMax;
  double percentile = 99.99;
  int64_t data_sets = 0;
  bool from_cache = false;
  std::map<std::string, TensorRange> ranges;  // by value name in the optimized graph
  // INT8 sensitivity (sensitivity.h), measured with these ranges on the calibration data: node
  // name -> relative L2 error of the graph outputs against FP32 with only that layer INT8, and
  // with every analysed layer INT8 (< 0: not measured; then nothing falls back for it).
  std::map<std::string, double> int8_sensitivity;
  double int8_all_rel_l2 = -1;
  // The same for the FP8 products (sensitivity.h's QuantScheme::kFp8), when measured.
  std::map<std::string, double> fp8_sensitivity;
  double fp8_all_rel_l2 = -1;
  const TensorRange* Find(const std::string& value) const {
    auto it = ranges.find(value);
    return it == ranges.end() ? nullptr : &it->second;
  }
};

// Histogram of |x| over [0, range) with a fixed bin count; values >= range land in the last bin.
struct AbsHistogram {
  static constexpr int kBins = 2048;  // TensorRT's entropy calibrator uses 2048 bins
  double range = 0;
  std::vector<double> counts = std::vector<double>(kBins, 0.0);
  void Add(std::span<const float> values);
  double bin_width() const { return range / kBins; }
};

// The clipping threshold from a histogram. kMinMax gives the histogram's range (the absmax).
double AmaxFromHistogram(const AbsHistogram& hist, CalibrationMethod method, double percentile);
// Convenience for a single array (tests, tools): histogram over [0, absmax] then the method.
double ComputeAmax(std::span<const float> values, CalibrationMethod method, double percentile);

// Runs `evaluate` (the FP32 reference) on one feed (by graph-input name) and returns every value
// it computed, inputs included, by name. KILN-E3007 names a model input the feed lacks; a node's
// error gains "while calibrating layer '...'".
StatusOr<std::map<std::string, Tensor>> EvaluateCalibrationBatch(
    const Graph& graph, const std::map<std::string, Tensor>& feed, const NodeEvaluator& evaluate);

// Runs the FP32 reference (`evaluate`: the builder hands in backends/reference.h's) over the
// data (onnx/calibration_data.h loads it) and reduces every float tensor's statistics.
// Two passes: the first finds each tensor's absmax (the histogram range), the second fills the
// histograms. Then, when the graph has INT8 candidates, their sensitivity is measured on the first
// pass's activations (candidates + 1 partial evaluations per data set; sensitivity.h).
// int8_sensitivity false skips that measurement and keeps no activations (int8_sensitivity stays
// empty, int8_all_rel_l2 -1): for builds that never read it (FP8 alone, --int8-tolerance off),
// where it was most of the node runs and every activation of every data set held in memory.
// graph_stats, when given, runs the two passes instead (a device evaluator's, which reduces each
// value where it computed it and downloads only the numbers), and the sensitivity as whole-graph
// reruns (MeasureInt8SensitivityByRerun), so that no activation is held on the host. It must
// compute what EvaluateValueStats over `evaluate` would. fp8_sensitivity measures the FP8
// products' sensitivity too (fp8_sensitivity, fp8_all_rel_l2; the --fp8 fallback), leave one out
// on the absmax as FP8 scales by it.
StatusOr<CalibrationTable> Calibrate(const Graph& graph, const NodeEvaluator& evaluate,
                                     std::span<const std::map<std::string, Tensor>> data,
                                     CalibrationMethod method, double percentile,
                                     bool int8_sensitivity = true,
                                     const GraphStatsEvaluator& graph_stats = {},
                                     bool fp8_sensitivity = false);

// How many times Calibrate ran a data set through the reference in this process (tests check that
// a cached build runs none).
int64_t CalibrationBatchesRun();

// The cache key: the model's hash, the optimized graph's structure (value names and shapes) and
// the method; a cache with another key is foreign.
std::string CalibrationCacheKey(const std::string& model_hash, const Graph& graph,
                                CalibrationMethod method, double percentile);
// Reads a cache; KILN-E3006 when it is unreadable, corrupt, of another version or another key.
StatusOr<CalibrationTable> LoadCalibrationCache(const std::string& path, const std::string& key);
// Writes atomically (temporary file + rename).
Status SaveCalibrationCache(const std::string& path, const std::string& key,
                            const CalibrationTable& table);

}  // namespace kiln::precision
