// The fused activations' formulas on the device, one per row of ops/activations.inc (the list
// gives each its formula, built on unary_ops.inc's), shared by every CUDA epilogue (cuBLASLt's in
// blas_kernels.cu, cuDNN's in conv_cudnn_epilogue.cu, the depthwise convolution's).
#pragma once

#include "kiln/backends/cuda/blas_kernels.h"
#include "kiln/backends/cuda/unary_formula.cuh"

namespace kiln::cuda {

__device__ __forceinline__ float Activate(BlasAct act, float x, float lo, float hi) {
  switch (act) {
#define KILN_UNARY(Op, v) Unary<UnaryOp::k##Op>(v, UnaryParams{})
#define KILN_UNARY_TANH_GELU(v) Unary<UnaryOp::kGelu>(v, UnaryParams{0.f, 0.f, 0.f, true})
#define KILN_ACTIVATION(Kind, name, source, formula) \
  case BlasAct::k##Kind:                             \
    return formula;
#include "kiln/ops/activations.inc"
#undef KILN_ACTIVATION
#undef KILN_UNARY_TANH_GELU
#undef KILN_UNARY
  }
  return x;
}

// Activate for a result stored as T. For 16-bit storage (FP16, BF16) the sigmoid family takes
// the special-function unit's exponential and an approximate division: their error, a few units
// in FP32's last place, is far below the 16-bit types' spacing (2^-11 and 2^-8 of the value),
// while the accurate expf and IEEE division cost several times the instructions and made these
// passes compute-bound (CLIP's QuickGELU after its fc1 ran at half the memory bandwidth). As x
// falls, exp(-x) overflows to +inf and the sigmoid to 0, its limit. FP32 results keep Activate.
template <typename T>
__device__ __forceinline__ float ActivateFor(BlasAct act, float x, float lo, float hi) {
  if constexpr (sizeof(T) == 2) {
    switch (act) {
      case BlasAct::kSigmoid:
        return __fdividef(1.f, 1.f + __expf(-x));
      case BlasAct::kSilu:
        return x * __fdividef(1.f, 1.f + __expf(-x));
      case BlasAct::kSwish:
        return x * __fdividef(1.f, 1.f + __expf(-lo * x));
      default:
        break;
    }
  }
  return Activate(act, x, lo, hi);
}

}  // namespace kiln::cuda
