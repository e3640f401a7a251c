// The node attributes that make a Conv/Gemm/MatMul (or its fused form) an INT8 layer, written by
// the passes and the precision pass and read by every backend's INT8 kernels (the arithmetic is
// backends/int8_quant.h). One list here, in ops, so that passes, precision and backends share it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/ir/graph.h"

namespace kiln {

// Calibrated INT8 (--int8): the calibrated amax of input 0 (the precision pass sets it).
inline constexpr const char* kInt8InputAmaxAttr = "kiln_int8_input_amax";

// Explicit quantization (a QDQ model; passes/qdq_fusion.cc sets them): the model's own
// QuantizeLinear of input 0 and DequantizeLinear of the constant weight (input 1).
//   kiln_int8_input_scale       float   the activation scale
//   kiln_int8_input_zero_point  int     its zero point in the int8 domain (a uint8 zero point z
//                                       is stored as z - 128: the same integers, shifted)
//   kiln_int8_weight_scales     floats  one scale per output channel (a per-tensor scale repeated);
//                                       the float weight is the model's int8 weight times these
inline constexpr const char* kInt8InputScaleAttr = "kiln_int8_input_scale";
inline constexpr const char* kInt8InputZeroPointAttr = "kiln_int8_input_zero_point";
inline constexpr const char* kInt8WeightScalesAttr = "kiln_int8_weight_scales";
// The model initializers the three came from (input scale, input zero point, weight scale; "" for
// one that was not an initializer), so that refit can refuse new weights that change them.
inline constexpr const char* kInt8ScaleSourcesAttr = "kiln_int8_scale_sources";

// The model's quantization of an INT8 layer from a QDQ model.
struct ModelInt8Scales {
  float input_scale = 1.f;
  int32_t input_zero_point = 0;  // int8 domain, [-128, 127]
  std::vector<float> weight_scales;
  // The model initializers the three came from (kInt8ScaleSourcesAttr; empty when unknown).
  std::vector<std::string> sources;
};

// The node's model scales when it carries all three attributes with usable values (finite positive
// scales, a zero point in [-128, 127], at least one weight scale); nullopt otherwise.
std::optional<ModelInt8Scales> ModelInt8ScalesOf(const Node& node);
// Whether the node carries any of the model-scale attributes (usable or not).
bool HasModelInt8Attrs(const Node& node);
void SetModelInt8Attrs(Node& node, const ModelInt8Scales& scales);
void EraseModelInt8Attrs(Node& node);

// Refit's check: the model's new initializers (by name) must give the INT8 layers of `graph` the
// scales they were built with; an error names the first layer and initializer that differ.
Status CheckModelInt8Sources(const Graph& graph, const std::map<std::string, Tensor>& initializers);

}  // namespace kiln
