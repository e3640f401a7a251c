// The INT8 contract every backend's INT8 tactics share (CPU oneDNN, CUDA cuBLASLt), so that one
// engine graph runs the same on either backend.
//
// The precision pass marks a node as an INT8 candidate with the float attribute
// `kiln_int8_input_amax`. Input 0 (activations) is quantized symmetrically with scale amax / 127,
// rounding to nearest even and saturating to [-127, 127] (values beyond amax clip; NaN saturates
// to +127); input 1 must be a constant weight, quantized per output channel (symmetric absmax,
// scale absmax / 127). Products accumulate in int32 and are dequantized to float with
// input_scale * weight_scale[channel] (times the op's alpha) before the op's bias, residual and
// activation. Inputs and outputs stay in the layer's float storage. Only such nodes get "i8-"
// tactics, so builds without --int8 are unchanged.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/ir/graph.h"

namespace kiln {

inline constexpr const char* kInt8InputAmaxAttr = "kiln_int8_input_amax";

// The node's activation amax when it is an INT8 candidate with a usable (finite, positive) one.
std::optional<float> Int8InputAmax(const Node& node);

// The activation scale for amax, and the factor Run multiplies by (both backends compute them
// exactly so, in float, which makes their quantized activations bit-identical).
inline float Int8ActivationScale(float amax) { return amax / 127.f; }
inline float Int8ActivationInvScale(float amax) { return 1.f / Int8ActivationScale(amax); }

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

}  // namespace kiln
