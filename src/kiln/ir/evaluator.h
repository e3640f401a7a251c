// Reference evaluation as an interface: a NodeEvaluator runs one node on host tensors, and the
// graph walker below runs a whole graph with one. The layers that need reference values
// (passes' constant folding, precision's calibration and INT8 sensitivity) take a NodeEvaluator
// and never name a backend; backends/cpu implements it (cpu_eval.h) and registers it as the
// reference (backends/reference.h), and the builder hands it in.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/ir/graph.h"
#include "kiln/ir/tensor.h"

namespace kiln {

// Evaluates one node on host tensors (nullptr for omitted optional inputs); returns its outputs
// in order.
using NodeEvaluator =
    std::function<StatusOr<std::vector<Tensor>>(const Node&, std::span<const Tensor* const>)>;

// Runs every node of `graph` in topological order with `evaluate`, starting from `feed` (graph
// inputs by name; KILN-E5000 names a graph input without a value), and returns every value it
// holds afterwards by name: the feed, then each node's outputs. A node's error is returned as the
// evaluator gave it.
StatusOr<std::map<std::string, Tensor>> EvaluateAllValues(const Graph& graph,
                                                          const std::map<std::string, Tensor>& feed,
                                                          const NodeEvaluator& evaluate);

// The same, returning the graph outputs only (constant outputs included), by name.
StatusOr<std::map<std::string, Tensor>> EvaluateGraphOutputs(
    const Graph& graph, const std::map<std::string, Tensor>& inputs, const NodeEvaluator& evaluate);

// Statistics of a graph's values over one run, for calibration, without keeping the values:
// an evaluator that computes on a device reduces them there and downloads only the numbers.
struct ValueStatsRequest {
  std::set<std::string> absmax;  // max |x| (NaN skipped, infinities counted)
  // name -> range: histogram of |x| over [0, range) in `bins` bins (AccumulateAbsHistogram).
  std::map<std::string, double> histograms;
  int bins = 2048;
  std::set<std::string> keep;  // returned as host tensors (graph inputs and outputs included)
  bool keep_all = false;       // every value, as EvaluateAllValues returns them
  // Layers run on quantized operands (the sensitivity's simulation of INT8 and FP8 kernels): input
  // 0 through FakeQuantizeInt8 with `int8_amax` (> 0) or FakeQuantizeE4M3 with `fp8_amax` (> 0),
  // input 1 replaced by `input1` when given (quantized weights of the same type and dims). Keyed
  // by node.
  struct Override {
    float int8_amax = 0;
    float fp8_amax = 0;
    const Tensor* input1 = nullptr;
  };
  std::map<const Node*, Override> overrides;
};
struct ValueStats {
  std::map<std::string, double> absmax;                   // a requested name absent: not computed
  std::map<std::string, std::vector<double>> histograms;  // `bins` counts each
  std::map<std::string, Tensor> kept;
};
// Runs a graph once on a feed and returns the statistics asked for.
using GraphStatsEvaluator = std::function<StatusOr<ValueStats>(
    const Graph&, const std::map<std::string, Tensor>& feed, const ValueStatsRequest&)>;

// The host implementation over a NodeEvaluator: each value is reduced as it is computed and
// dropped after its last reader, unless kept.
StatusOr<ValueStats> EvaluateValueStats(const Graph& graph,
                                        const std::map<std::string, Tensor>& feed,
                                        const NodeEvaluator& evaluate,
                                        const ValueStatsRequest& request);

// The reductions, shared by every implementation (a device one computes the same numbers):
// *absmax = max(*absmax, |x|) over the elements (NaN skipped: std::max keeps the first operand).
void AccumulateAbsMax(const Tensor& t, double* absmax);
// |x| of each finite element falls in bin floor(|x| * (bins / range)) in double arithmetic,
// bins - 1 at and past it; non-finite elements are skipped. range <= 0 (or NaN) puts every
// element, finite or not, in bin 0.
void AccumulateAbsHistogram(std::span<const float> values, double range, std::span<double> counts);
// The same for a float tensor of any float type (converted to float32 first).
void AccumulateAbsHistogram(const Tensor& t, double range, std::span<double> counts);
// Symmetric INT8 quantize-dequantize as the INT8 kernels quantize an activation
// (backends/int8_quant.h): in float, s = x * (1 / (amax / 127)), saturated to [-127, 127] (NaN to
// 127) before rounding half to even, times amax / 127. Any float type, computed in float32.
Tensor FakeQuantizeInt8(const Tensor& x, float amax);
// Per-tensor FP8 E4M3 quantize-dequantize as the FP8 kernels quantize an activation
// (backends/fp8_quant.h): scale = amax / 448, E4M3(x * (1 / scale)) rounded to nearest even and
// saturated to +-448 (NaN stays NaN), times scale. Any float type, computed in float32.
Tensor FakeQuantizeE4M3(const Tensor& x, float amax);

}  // namespace kiln
