// The FP8 contract every backend's FP8 tactics share (today: CUDA cuBLASLt on sm_89+), next to
// INT8's (int8_quant.h).
//
// The precision pass marks an FP8 candidate with the float attribute `kiln_fp8_input_amax` (the
// calibrated absmax of input 0). Input 0 is quantized per tensor to FP8 E4M3 with scale
// amax / 448 (E4M3's largest finite value): q = E4M3(x * (1 / scale)), rounding to nearest even
// and saturating to +-448 (NaN stays NaN); input 1 must be a constant weight, quantized the same
// way per tensor with its own absmax / 448. Products accumulate in FP32 and are multiplied by
// alpha * input_scale * weight_scale before the op's bias/C and activation. Inputs and outputs
// stay in the layer's float storage, except on an FP8 edge (ops/quant_edge.h): there the producer
// rounds its result to the storage type and quantizes it as the consumer would (E4M3(y * 448 /
// consumer amax)), and the consumer reads those E4M3 values as its quantized input 0. Only such
// nodes get "f8-" tactics.
#pragma once

#include <cstdint>
#include <optional>

#include "kiln/ir/graph.h"
#include "kiln/ops/quant_edge.h"  // kFp8InputAmaxAttr, kFp8OutputAmaxAttr

namespace kiln {

inline constexpr float kFp8E4M3Max = 448.f;

// The node's activation amax when it is an FP8 candidate with a usable (finite, positive) one.
std::optional<float> Fp8InputAmax(const Node& node);
// The amax of the FP8 consumer a node writes E4M3 for (ops/quant_edge.h), when usable.
std::optional<float> Fp8OutputAmax(const Node& node);

inline float Fp8Scale(float amax) { return amax / kFp8E4M3Max; }
inline float Fp8InvScale(float amax) { return 1.f / Fp8Scale(amax); }

// x to E4M3 bits (sign, 4 exponent bits with bias 7, 3 mantissa bits): round to nearest even,
// saturate to +-448, NaN to 0x7f (CUDA's __nv_cvt_float_to_fp8 with __NV_SATFINITE, __NV_E4M3).
uint8_t ToE4M3(float x);
float FromE4M3(uint8_t bits);

}  // namespace kiln
