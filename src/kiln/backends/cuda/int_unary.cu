// Neg, Abs and Sign on signed integers (i8/i32/i64) on CUDA (the KILN_INT_UNARY_OP rows of
// ops/unary_ops.inc): the shape arithmetic of exported models (the float activations are
// elementwise.cu's). Wrapping as the CPU's (Neg of the minimum value stays the minimum).
#include <cstdint>

#include "kiln/backends/cuda/cuda_launch_more.h"
#include "kiln/backends/cuda/device_util.cuh"

namespace kiln::cuda {
namespace {

template <typename T>
__global__ void IntUnaryKernel(IntUnaryOp op, const T* __restrict__ in, T* __restrict__ y,
                               int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T x_i = in[i];
    switch (op) {
#define KILN_UNARY_OP(Name, formula)
#define KILN_INT_UNARY_OP(Name, formula) \
  case IntUnaryOp::k##Name: {            \
    [[maybe_unused]] const T x = x_i;    \
    y[i] = static_cast<T>(formula);      \
    break;                               \
  }
#include "kiln/ops/unary_ops.inc"
#undef KILN_INT_UNARY_OP
#undef KILN_UNARY_OP
    }
  }
}

}  // namespace

cudaError_t LaunchIntUnary(IntUnaryOp op, Elem t, const void* x, void* y, int64_t n,
                           cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  auto go = [&](auto tag) {
    using T = decltype(tag);
    IntUnaryKernel<T>
        <<<GridFor(n), 256, 0, stream>>>(op, static_cast<const T*>(x), static_cast<T*>(y), n);
    return cudaGetLastError();
  };
  switch (t) {
    case Elem::kI8:
      return go(int8_t{});
    case Elem::kI32:
      return go(int32_t{});
    case Elem::kI64:
      return go(int64_t{});
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kiln::cuda
