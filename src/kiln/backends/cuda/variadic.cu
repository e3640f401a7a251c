// Variadic Sum, Mean, and the variadic rows of ops/binary_ops.inc (Max, Min) on CUDA: one thread
// per output element folds all inputs (up to kMaxVariadicInputs, numpy broadcasting) in input
// order, as the CPU reference does. f16/bf16 accumulate in FP32; f32 and the integer types in their
// own type.
#include <cstdint>

#include "kiln/backends/cuda/binary_formula.cuh"
#include "kiln/backends/cuda/cuda_launch_more.h"
#include "kiln/backends/cuda/device_util.cuh"

namespace kiln::cuda {
namespace {

// The fold: a sum for Sum and Mean, else the row's formula (binary_formula.cuh).
template <typename C>
__device__ __forceinline__ C Combine(VariadicOp op, C a, C b) {
  switch (op) {
#define KILN_BINARY_OP(Name, Types, formula)
#define KILN_VARIADIC_OP(Name, Types, formula) \
  case VariadicOp::k##Name:                    \
    return Binary<BinaryOp::k##Name>(a, b, BinaryParams{});
#include "kiln/ops/binary_ops.inc"
#undef KILN_VARIADIC_OP
#undef KILN_BINARY_OP
    default:
      return static_cast<C>(a + b);
  }
}

template <typename T>
__global__ void VariadicKernel(VariadicOp op, VariadicDesc d, T* __restrict__ y, int64_t n) {
  using C = typename Compute<T>::type;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[kMaxVariadicInputs];
    if (d.dense) {
      for (int k = 0; k < d.count; ++k) off[k] = i;
    } else {
      for (int k = 0; k < d.count; ++k) off[k] = 0;
      int64_t r = i;
      for (int a = d.rank - 1; a >= 0; --a) {
        int64_t c = r % d.dims[a];
        r /= d.dims[a];
        for (int k = 0; k < d.count; ++k) off[k] += c * d.strides[k][a];
      }
    }
    C acc = Load(static_cast<const T*>(d.ptr[0])[off[0]]);
    for (int k = 1; k < d.count; ++k) {
      acc = Combine<C>(op, acc, Load(static_cast<const T*>(d.ptr[k])[off[k]]));
    }
    if (op == VariadicOp::kMean) acc = static_cast<C>(acc / static_cast<C>(d.count));
    y[i] = Store<T>(acc);
  }
}

}  // namespace

cudaError_t LaunchVariadic(VariadicOp op, Elem t, const VariadicDesc& d, void* y, int64_t n,
                           cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (d.count < 1 || d.count > kMaxVariadicInputs || d.rank > kMaxRank) {
    return cudaErrorInvalidValue;
  }
  auto go = [&](auto tag) {
    using T = decltype(tag);
    VariadicKernel<T><<<GridFor(n), 256, 0, stream>>>(op, d, static_cast<T*>(y), n);
    return cudaGetLastError();
  };
  switch (t) {
    case Elem::kI8:
      return go(int8_t{});
    case Elem::kU8:
      return go(uint8_t{});
    default:
      return DispatchNumeric(t, go);
  }
}

}  // namespace kiln::cuda
