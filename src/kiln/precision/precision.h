// Per-layer precision assignment (TensorRT's BuilderFlag::kFP16/kBF16/kINT8): which layers may
// run reduced, decided per layer from the op's support table, the target backend's kernels and the
// FP16 range guard; then the graph is rewritten: reduced activations, converted weights and Cast
// nodes at precision boundaries only.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/backends/kernel.h"
#include "kiln/core/status.h"
#include "kiln/ir/graph.h"
#include "kiln/ops/int8_layer.h"
#include "kiln/ops/op_schema.h"
#include "kiln/ops/quant_edge.h"
#include "kiln/precision/calibration.h"
#include "kiln/precision/sensitivity.h"

namespace kiln::precision {

// The node attribute that marks a layer INT8 (a contract with the INT8 kernels): the calibrated
// absmax of input 0. The kernel quantizes input 0 symmetrically with scale amax/127 and its
// constant weights (input 1) per output channel; its inputs and outputs stay float.
inline constexpr std::string_view kInt8InputAmaxAttr = "kiln_int8_input_amax";
// INT8 tactics' names start with this (STYLE.md rule 5: "i8-conv-cpu-...").
inline constexpr std::string_view kInt8TacticPrefix = "i8-";
// The FP8 counterpart (--fp8): the calibrated absmax of input 0. The kernel quantizes input 0 to
// FP8 E4M3 per tensor with scale amax/448 and its constant weights (input 1) per tensor with
// absmax/448 (backends/fp8_quant.h); inputs and outputs stay float except on the FP8 edges the
// builder joins later. The attribute's name is kiln::kFp8InputAmaxAttr (ops/quant_edge.h, which
// the type rules and the kernels read too). FP8 tactics are "f8-...".
inline constexpr std::string_view kFp8TacticPrefix = "f8-";

// What the op allows, independent of kernels.
enum class OpPrecision : uint8_t {
  kReducible,  // may run in FP16/BF16 (the kernel accumulates in FP32)
  kKeepFp32,   // runs reduced too inaccurately or overflows; stays FP32 (reason in the table)
  kUntouched,  // integer/shape/bool op or an explicit Cast: its types are the model's
};
struct OpPrecisionRule {
  OpPrecision kind = OpPrecision::kUntouched;
  std::string_view reason;  // for kKeepFp32 / kUntouched
  // Float inputs that are not of the op's data type (Resize's roi and scales) keep their dtype.
  std::vector<int> fixed_inputs;
  // Takes its input in any storage, so no Cast is inserted for it: Shape and Size read only the
  // shape; Cast converts from whatever it is given.
  bool any_input_storage = false;
};
OpPrecisionRule LookupOpPrecision(OpType op);
OpPrecisionRule LookupOpPrecision(std::string_view op_type);

// Conv/FusedConv/Gemm/FusedGemm/MatMul/FusedMatMul whose input 1 is a constant weight.
bool IsInt8Candidate(const Node& node);
// The FP8 candidates: the INT8 ones but convolutions (FP8 kernels are matrix products only).
bool IsFp8Candidate(const Node& node);
// Whether the graph has layers with a QDQ model's INT8 scales (passes/qdq_fusion.cc): they are
// INT8 without --int8 or calibration, so the builder asks the backend's kernels about them.
bool HasModelInt8Layers(const Graph& graph);

// A QDQ model's INT8 layer's precision reason: where its scales come from.
std::string ModelInt8LayerReason(std::string_view input, const ModelInt8Scales& scales);

// An INT8 layer's precision reason (before any sensitivity note): its input, the calibrated amax,
// the method and the layer's float storage. Written once here: refit's recalibration rewrites it.
std::string Int8LayerReason(std::string_view input, double amax, CalibrationMethod method,
                            DataType storage);

// The FP16 range guard: a tensor whose |x| exceeds kFp16Max / kFp16GuardMargin keeps its layer in
// FP32 (the margin leaves room for the layer's own arithmetic on the way to the limit).
inline constexpr double kFp16Max = 65504.0;
inline constexpr double kFp16GuardMargin = 2.0;

struct PrecisionOptions {
  bool fp16 = false;
  bool bf16 = false;
  bool int8 = false;  // implies FP16 as the fallback
  // FP8 E4M3 for the INT8 candidates (those not made INT8 when both are asked for); implies FP16
  // as the fallback. Needs calibration data, like INT8.
  bool fp8 = false;
  BackendKind backend = BackendKind::kCpu;
  const CalibrationTable* calibration = nullptr;  // activation ranges (absmax, amax); optional
  // INT8 layers fall back to FP16 (most sensitive first, PlanInt8Fallback) until the estimated
  // end-to-end relative L2 error against FP32 on the calibration data is within this; +inf keeps
  // every INT8 layer. Needs the calibration's sensitivity figures.
  double int8_tolerance = kDefaultInt8Tolerance;
  // The same for the FP8 layers (the table's fp8_sensitivity); +inf keeps every FP8 layer.
  double fp8_tolerance = kDefaultFp8Tolerance;
  // The kernel request for a node of the graph as it is (shapes at the profile's max).
  std::function<KernelRequest(const Node&)> make_request;
};

struct LayerPrecision {
  DataType dtype = DataType::kFloat32;  // the layer's float storage (inputs/outputs)
  bool int8 = false;  // computes in INT8 (kInt8InputAmaxAttr, or the model's scales, is set)
  bool int8_from_model =
      false;         // INT8 with a QDQ model's scales (ops/int8_layer.h), not calibrated
  bool fp8 = false;  // computes in FP8 E4M3 (kFp8InputAmaxAttr is set)
  std::string reason;
  std::string label() const;  // "i8", "f8", "f16", "bf16", "f32"
};

struct PrecisionResult {
  std::map<std::string, LayerPrecision> layers;  // by node name (Cast nodes inserted included)
  // Layers of a QDQ model that compute in INT8 with the model's scales (counted in int8_layers
  // too), and those that could not and compute in float between their Q/DQ instead.
  int64_t int8_model_layers = 0;
  int64_t int8_model_fallbacks = 0;
  int64_t casts_inserted = 0;
  int64_t weights_converted = 0;
  int64_t int8_layers = 0;           // layers computing in INT8 after the sensitivity fallback
  int64_t int8_fallbacks = 0;        // INT8-capable layers sent back to FP16/FP32 by it
  double int8_estimated_rel_l2 = 0;  // the fallback plan's estimate for the INT8 layers kept
  int64_t fp8_layers = 0;            // layers computing in FP8 after the FP8 fallback
  int64_t fp8_fallbacks = 0;         // FP8-capable layers sent back to FP16/BF16 by it
  double fp8_estimated_rel_l2 = 0;   // its plan's estimate for the FP8 layers kept
  // Seconds spent asking the backend's providers which precisions have kernels (for a GPU
  // backend: cuDNN/cuBLASLt queries and plan finalisation), for the build report's breakdown.
  double kernel_query_seconds = 0;
};

// Decides every layer's precision and rewrites the graph accordingly. Graph inputs and outputs
// keep their ONNX dtypes. Shapes must be inferred; they are inferred again at the end.
StatusOr<PrecisionResult> AssignPrecision(Graph& graph, const PrecisionOptions& options);

// The tactic phase's fallback for a layer given FP16/BF16 from the backend's static capability
// (KernelProvider::Supports) whose reduced kernel then could not be built: it computes in FP32
// from here on. Its reduced activations get a Cast to FP32 in front, its reduced weights are
// widened back (keeping their reduced rounding), its outputs become FP32 with a Cast back to the
// reduced type for the consumers; result.layers records `reason`. Shapes are inferred again.
Status DemoteToFp32(Graph& graph, Node& node, const std::string& reason, PrecisionResult& result);

}  // namespace kiln::precision
