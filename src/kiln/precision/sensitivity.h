// INT8 sensitivity: how far each INT8 candidate layer moves the graph outputs when it alone is
// quantized, measured on the calibration data with the FP32 reference simulating the INT8 kernels;
// and the fallback plan that keeps as many layers INT8 as an end-to-end tolerance allows (what
// TensorRT users do by hand with layer precision constraints, and accuracy-aware quantization
// in ONNX Runtime / NNCF does automatically).
#pragma once

#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/ir/evaluator.h"
#include "kiln/ir/graph.h"
#include "kiln/precision/calibration.h"

namespace kiln::precision {

// The default end-to-end budget: the estimated relative L2 error against FP32 that the INT8 layers
// together may cause. A fifth of the zoo's INT8 bound (1e-1, docs/precision.md): the estimate
// comes from a few calibration batches and inputs never seen in calibration land further out
// (on fresh zoo inputs 0.05 still let efficientnet_tiny reach 0.16; 0.02 keeps every model
// under 0.025; docs/precision.md has the table).
inline constexpr double kDefaultInt8Tolerance = 2e-2;

// The FP8 default: the bar for an FP8 engine, 5e-2. E4M3 keeps 3 mantissa bits, so FP8's
// own error is several times INT8's at a well-chosen scale (the zoo's bert_tiny: 5.7e-2 with every
// product FP8); 2e-2 would keep almost no layer FP8.
inline constexpr double kDefaultFp8Tolerance = 5e-2;

// Which kernels a sensitivity simulates.
enum class QuantScheme { kInt8, kFp8 };

// Parses --int8-tolerance: a relative L2 error > 0, or "off" (+inf: every INT8 layer stays).
StatusOr<double> ParseInt8Tolerance(std::string_view text);
// The same for --fp8-tolerance.
StatusOr<double> ParseFp8Tolerance(std::string_view text);

// Quantize-dequantize as the INT8 kernels do (backends/cpu/int8_common.h's contract):
// activations symmetric with scale amax/127, round to nearest even, saturate to [-127, 127].
Tensor FakeQuantizeActivations(const Tensor& x, float amax);
// Weights (input 1 of an INT8 candidate) per output channel, symmetric absmax/127: Conv's channel
// is dim 0; Gemm/MatMul's are B's columns (rows with transB). nullopt when the weight is not in a
// layout the INT8 kernels take (not f32, or a Gemm/MatMul B that is not 2-D): such a layer is
// not analysed and, having no INT8 kernel, never runs INT8.
std::optional<Tensor> FakeQuantizeWeights(const Node& node, const Tensor& w);
// FP8 weights (backends/fp8_quant.h): per tensor, E4M3 with scale absmax / 448; nullopt unless a
// 2-D f32 matrix (the FP8 kernels' B).
std::optional<Tensor> FakeQuantizeFp8Weights(const Tensor& w);

// ||actual - reference|| / ||reference|| (the absolute L2 norm when the reference is all zero).
double RelativeL2(const Tensor& actual, const Tensor& reference);

struct SensitivityResult {
  std::map<std::string, double> layers;  // node name -> rel-L2 with only that layer INT8
  double all_int8 = 0;                   // with every analysed layer INT8
  int64_t evaluations = 0;               // graph evaluations (partial ones included)
};

// `evaluate`: the FP32 reference (ir/evaluator.h) that re-evaluates the nodes downstream of the
// quantized layers. `activations`: per data set, every value's FP32 tensor by name (what
// calibration computed).
// Each candidate with a calibrated amax is quantized alone, and then all together; only the nodes
// downstream of a quantized layer are evaluated again. rel-L2 is the maximum over data sets and
// float graph outputs. Evaluations: candidates + 1 (per data set).
// `held_out_amax` (optional, one map per data set): the amax to quantize data set d with, by
// value name; Calibrate gives the method's amax computed from every data set but d
// (leave-one-out), so the figure is the error on inputs the scales were not fitted to, which is
// what an engine meets after the build. Missing: the table's amax.
// scheme kFp8 measures the FP8 products instead (IsFp8Candidate layers, input 0 per tensor E4M3
// with the absmax, weights per tensor E4M3; held_out_amax then holds held-out absmaxes).
StatusOr<SensitivityResult> MeasureInt8Sensitivity(
    const Graph& graph, const NodeEvaluator& evaluate,
    std::span<const std::map<std::string, Tensor>> activations, const CalibrationTable& table,
    std::span<const std::map<std::string, double>> held_out_amax = {},
    QuantScheme scheme = QuantScheme::kInt8);

// The same figures from whole-graph runs: `graph_stats` (a device's graph walk, whose values stay
// on the device) runs every data set again for each layer set, with the layers' operands
// quantized (ValueStatsRequest::overrides), and its float graph outputs are compared with
// `reference_outputs` (per data set, by name: the FP32 run's). The partial evaluations above would
// move every activation between the host and a device; this moves only the graph outputs.
// Evaluations: candidates + 1 full runs per data set.
StatusOr<SensitivityResult> MeasureInt8SensitivityByRerun(
    const Graph& graph, const GraphStatsEvaluator& graph_stats,
    std::span<const std::map<std::string, Tensor>> data,
    std::span<const std::map<std::string, Tensor>> reference_outputs, const CalibrationTable& table,
    std::span<const std::map<std::string, double>> held_out_amax = {},
    QuantScheme scheme = QuantScheme::kInt8);

// Which INT8 layers fall back to keep the estimated end-to-end error within `tolerance`.
// Estimate for a set S of INT8 layers: quantization noise of different layers adds in quadrature,
// scaled so that the full set matches the measured all-INT8 figure (and never below the
// quadrature sum): est(S) = c * sqrt(sum_{i in S} s_i^2), c = max(1, all / sqrt(sum_all s_i^2)).
// Layers fall back most sensitive first (ties by name) until est <= tolerance.
struct Int8FallbackPlan {
  struct Entry {
    double sensitivity = 0;  // rel-L2 with the layer alone INT8
    double estimate = 0;     // estimated end-to-end rel-L2 of the INT8 set with this layer in it
  };
  std::map<std::string, Entry> fall_back;  // by node name
  double estimate = 0;                     // estimated rel-L2 of the layers that stay INT8
  double scale = 1;                        // c above
};
Int8FallbackPlan PlanInt8Fallback(const CalibrationTable& table,
                                  const std::vector<std::string>& int8_layers, double tolerance);
// The same over any scheme's figures (the FP8 fallback: table.fp8_sensitivity, fp8_all_rel_l2).
// `benefit` (by layer, > 0), when given, ranks by s^2 / benefit instead of s: the layers that
// cost the most error for what they save go first (a layer without one goes first of all).
Int8FallbackPlan PlanFallback(const std::map<std::string, double>& sensitivities, double all_rel_l2,
                              const std::vector<std::string>& layers, double tolerance,
                              const std::map<std::string, double>& benefit = {});

}  // namespace kiln::precision
