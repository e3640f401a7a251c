// The INT8 contract every backend's INT8 tactics share (CPU oneDNN, CUDA cuBLASLt), so that one
// engine graph runs the same on either backend. The attributes are listed in ops/int8_layer.h.
//
// Calibrated (--int8): the precision pass marks a node with the float attribute
// `kiln_int8_input_amax`. Input 0 (activations) is quantized symmetrically with scale amax / 127,
// rounding to nearest even and saturating to [-127, 127] (values beyond amax clip; NaN saturates
// to +127); input 1 must be a constant weight, quantized per output channel (symmetric absmax,
// scale absmax / 127).
//
// From the model (a QDQ model, passes/qdq_fusion.cc): the node carries the model's activation scale
// and zero point and its weight scales. Input 0 is quantized as the model's QuantizeLinear does
// (x / scale rounded half to even, plus the zero point, saturated to [-128, 127]; NaN becomes the
// zero point) and the products use q - zero_point; the weights are the model's own integers,
// recovered exactly from the dequantized float weight (w / scale, an integer up to float
// rounding) and scaled by the model's per-channel scales.
//
// Either way products accumulate in int32 and are dequantized to float with
// input_scale * weight_scale[channel] (times the op's alpha) before the op's bias, residual and
// activation. Inputs and outputs stay in the layer's float storage. Only such nodes get "i8-"
// tactics, so builds of float models without --int8 are unchanged.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/ir/graph.h"
#include "kiln/ops/int8_layer.h"

namespace kiln {

// The node's activation amax when it is an INT8 candidate with a usable (finite, positive) one.
std::optional<float> Int8InputAmax(const Node& node);

// The activation scale for amax, and the factor Run multiplies by (both backends compute them
// exactly so, in float, which makes their quantized activations bit-identical).
inline float Int8ActivationScale(float amax) { return amax / 127.f; }
inline float Int8ActivationInvScale(float amax) { return 1.f / Int8ActivationScale(amax); }

// How an INT8 layer quantizes input 0: the calibrated contract (scale amax / 127, zero point 0,
// QuantizeInt8) or the model's QuantizeLinear (QuantizeInt8Model).
struct Int8Activation {
  float scale = 1.f;
  int32_t zero_point = 0;  // int8 domain; 0 when calibrated
  bool from_model = false;
};
// The node's activation quantization: the model's scales when it carries them (ModelInt8ScalesOf),
// else the calibrated amax's; nullopt when it is no INT8 layer.
std::optional<Int8Activation> Int8ActivationOf(const Node& node);

// One activation quantized as ONNX's QuantizeLinear to int8 does (and kiln's CPU QuantizeLinear):
// x / scale in float, rounded half to even, NaN to 0, plus the zero point, saturated.
inline int8_t QuantizeInt8Model(float x, float scale, float zero_point) {
  float v = std::nearbyint(x / scale);
  v = v == v ? v + zero_point : zero_point;
  v = v < 127.f ? v : 127.f;
  v = v > -128.f ? v : -128.f;
  return static_cast<int8_t>(static_cast<int32_t>(v));
}

// One activation quantized: clamp before converting (an out-of-range float -> int conversion is
// undefined), written so that NaN saturates to +127 instead of reaching the conversion.
inline int8_t QuantizeInt8(float x, float inv_scale) {
  float v = x * inv_scale;
  v = v < 127.f ? v : 127.f;
  v = v > -127.f ? v : -127.f;
  return static_cast<int8_t>(static_cast<int32_t>(std::nearbyint(v)));
}

// Weights quantized per output channel. The matrix is `channels` x `inner` with element
// (c, i) at c * channel_stride + i * inner_stride (so both [M, K] and [K, M] layouts work); `q`
// keeps that layout. A channel of zeros gets scale 1 (its products are zero anyway).
struct Int8Weights {
  std::vector<int8_t> q;
  std::vector<float> scales;  // per channel: absmax / 127
};
Int8Weights QuantizeWeightsPerChannel(const float* w, int64_t channels, int64_t inner,
                                      int64_t channel_stride, int64_t inner_stride);

// Where the output channels of an INT8 layer's constant weight lie (channels x inner, element
// (c, i) at c * channel_stride + i * inner_stride): Conv's [M, C/g, kH, kW] (also channels-last:
// M stays first), Gemm's B [K, N] or [N, K] under transB, MatMul's B [K, N]. nullopt for another
// op or rank.
struct Int8WeightLayout {
  int64_t channels = 0, inner = 0, channel_stride = 0, inner_stride = 0;
};
std::optional<Int8WeightLayout> Int8WeightLayoutOf(const Node& node,
                                                   const std::vector<int64_t>& weight_dims);

// The model's integer weights from the dequantized float weight w (= q * scale[channel]): q is
// w / scale rounded, which must be within 1e-3 of an integer in [-128, 127]; the scales are the
// model's. An error names the first element that is not (a pass changed the weight after the
// model's quantization, or the scales do not belong to it).
StatusOr<Int8Weights> ModelInt8Weights(const float* w, std::span<const float> scales,
                                       const Int8WeightLayout& layout);

// The weights an INT8 kernel uses for `node`: the model's (ModelInt8Weights) when the node carries
// the model's scales, else quantized per channel (QuantizeWeightsPerChannel). `w` is float32.
StatusOr<Int8Weights> Int8WeightsFor(const Node& node, const Tensor& w);

}  // namespace kiln
