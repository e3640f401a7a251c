// INT8 quantization shared by the CPU backend's INT8 tactics (conv_int8.cc, gemm_int8.cc). The
// contract with the precision pass, and the weight quantization, are every backend's
// (kiln/backends/int8_quant.h); what is here is the CPU's threaded activation quantization.
#pragma once

#include <cstdint>

#include "kiln/backends/int8_quant.h"
#include "kiln/backends/kernel.h"

namespace kiln::cpu {

using ::kiln::Int8InputAmax;
using ::kiln::Int8Weights;
using ::kiln::kInt8InputAmaxAttr;
using ::kiln::QuantizeWeightsPerChannel;

// q[i] = QuantizeInt8(x[i], inv_scale) for n elements, on OpenMP's threads (those oneDNN runs on;
// call SetOneDnnThreads first).
void QuantizeActivations(const float* x, int64_t n, float inv_scale, int8_t* q);

}  // namespace kiln::cpu
