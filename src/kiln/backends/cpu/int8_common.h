// INT8 quantization shared by the CPU backend's INT8 tactics (conv_int8.cc, gemm_int8.cc).
//
// The contract with the precision pass: a node carrying the float attribute
// `kiln_int8_input_amax` is an INT8 candidate. Input 0 (activations) is quantized symmetrically
// with scale amax / 127, rounding to nearest and saturating to [-127, 127] (values beyond amax
// clip); input 1 must be a constant weight, quantized here per output channel (symmetric absmax,
// scale absmax / 127). Products accumulate in int32 and are dequantized to float with
// input_scale * weight_scale[channel] before the op's bias, residual and activation. Inputs and
// outputs stay float. Only such nodes get "i8-" tactics, so FP32 builds are unchanged.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/backends/kernel.h"

namespace kiln::cpu {

inline constexpr const char* kInt8InputAmaxAttr = "kiln_int8_input_amax";

// The node's activation amax when it is an INT8 candidate with a usable (finite, positive) one.
std::optional<float> Int8InputAmax(const Node& node);

// Weights quantized per output channel. The matrix is `channels` x `inner` with element
// (c, i) at c * channel_stride + i * inner_stride (so both [M, K] and [K, M] layouts work); `q`
// keeps that layout. A channel of zeros gets scale 1 (its products are zero anyway).
struct Int8Weights {
  std::vector<int8_t> q;
  std::vector<float> scales;  // per channel: absmax / 127
};
Int8Weights QuantizeWeightsPerChannel(const float* w, int64_t channels, int64_t inner,
                                      int64_t channel_stride, int64_t inner_stride);

// q[i] = clamp(round(x[i] * inv_scale), -127, 127) for n elements, on OpenMP's threads (those
// oneDNN runs on; call SetOneDnnThreads first).
void QuantizeActivations(const float* x, int64_t n, float inv_scale, int8_t* q);

}  // namespace kiln::cpu
