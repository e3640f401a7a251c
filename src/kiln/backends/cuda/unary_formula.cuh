// The device formula of every row of ops/unary_ops.inc, shared by the elementwise kernels
// (elementwise.cu) and the fused activation epilogues (activation.cuh).
#pragma once

#include "kiln/backends/cuda/cuda_launch.h"

namespace kiln::cuda {

// The math the shared formulas (ops/unary_ops.inc) call, as single-precision device functions.
namespace m {
__device__ __forceinline__ float exp(float x) { return expf(x); }
__device__ __forceinline__ float tanh(float x) { return tanhf(x); }
__device__ __forceinline__ float erf(float x) { return erff(x); }
__device__ __forceinline__ float log(float x) { return logf(x); }
__device__ __forceinline__ float sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ float fabs(float x) { return fabsf(x); }
__device__ __forceinline__ float floor(float x) { return floorf(x); }
__device__ __forceinline__ float ceil(float x) { return ceilf(x); }
__device__ __forceinline__ float nearbyint(float x) { return nearbyintf(x); }
__device__ __forceinline__ float sin(float x) { return sinf(x); }
__device__ __forceinline__ float cos(float x) { return cosf(x); }
__device__ __forceinline__ float tan(float x) { return tanf(x); }
__device__ __forceinline__ float asin(float x) { return asinf(x); }
__device__ __forceinline__ float acos(float x) { return acosf(x); }
__device__ __forceinline__ float atan(float x) { return atanf(x); }
__device__ __forceinline__ float sinh(float x) { return sinhf(x); }
__device__ __forceinline__ float cosh(float x) { return coshf(x); }
__device__ __forceinline__ float asinh(float x) { return asinhf(x); }
__device__ __forceinline__ float acosh(float x) { return acoshf(x); }
__device__ __forceinline__ float atanh(float x) { return atanhf(x); }
__device__ __forceinline__ float log1p(float x) { return log1pf(x); }
__device__ __forceinline__ float expm1(float x) { return expm1f(x); }
__device__ __forceinline__ float max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ float min(float a, float b) { return fminf(a, b); }
__device__ __forceinline__ float clamp(float v, float lo, float hi) {
  return fminf(fmaxf(v, lo), hi);
}
__device__ __forceinline__ float fast_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ float fast_erf(float x) { return erff(x); }
}  // namespace m

// op(x), FP32.
template <UnaryOp kOp>
__device__ __forceinline__ float Unary(float x, const UnaryParams& p) {
#define KILN_UNARY_OP(Name, formula) \
  if constexpr (kOp == UnaryOp::k##Name) return formula;
#define KILN_INT_UNARY_OP(Name, formula)
#include "kiln/ops/unary_ops.inc"
#undef KILN_INT_UNARY_OP
#undef KILN_UNARY_OP
  return x;
}

}  // namespace kiln::cuda
