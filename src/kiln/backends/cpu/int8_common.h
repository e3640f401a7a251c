// INT8 quantization shared by the CPU backend's INT8 tactics (conv_int8.cc, gemm_int8.cc). The
// contract with the precision pass, and the weight quantization, are every backend's
// (kiln/backends/int8_quant.h); what is here is the CPU's threaded activation quantization.
#pragma once

#include <cstdint>

#include "kiln/backends/int8_quant.h"
#include "kiln/backends/kernel.h"

namespace kiln::cpu {

using ::kiln::Int8Activation;
using ::kiln::Int8ActivationOf;
using ::kiln::Int8InputAmax;
using ::kiln::Int8Weights;
using ::kiln::Int8WeightsFor;
using ::kiln::kInt8InputAmaxAttr;
using ::kiln::QuantizeWeightsPerChannel;

// q[i] = QuantizeInt8(x[i], inv_scale) for n elements, on OpenMP's threads (those oneDNN runs on;
// call SetOneDnnThreads first).
void QuantizeActivations(const float* x, int64_t n, float inv_scale, int8_t* q);
// The same for a layer with the model's scales: q[i] = QuantizeInt8Model(x[i], scale, zero_point).
void QuantizeActivationsModel(const float* x, int64_t n, float scale, int32_t zero_point,
                              int8_t* q);
// Either, as `a` says.
inline void QuantizeActivations(const float* x, int64_t n, const Int8Activation& a, int8_t* q) {
  if (a.from_model) {
    QuantizeActivationsModel(x, n, a.scale, a.zero_point, q);
  } else {
    QuantizeActivations(x, n, 1.f / a.scale, q);
  }
}

// The f32 form of the same integers (onednn_common.h, Int8ComputeType): q[i] = the quantized
// activation minus the zero point, as a float.
void QuantizeActivations(const float* x, int64_t n, const Int8Activation& a, float* q);

}  // namespace kiln::cpu
