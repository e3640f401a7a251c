// Reduce* on integers (i32/i64; bool for ReduceMax/ReduceMin) on CUDA: shape arithmetic and mask
// lengths, small tensors, so one thread per output walks its reduced elements. Accumulates in
// double and truncates the result to the integer type, exactly as the CPU reference does.
#include <cmath>
#include <cstdint>

#include "kiln/backends/cuda/cuda_launch_more.h"
#include "kiln/backends/cuda/device_util.cuh"

namespace kiln::cuda {
namespace {

template <typename T>
__global__ void IntReduceKernel(IntReduceOp op, const T* __restrict__ x, T* __restrict__ y,
                                Strided kept, int64_t outputs, Strided red, int64_t count) {
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < outputs;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t base;
    StridedOffsets<1>(kept, o, &base);
    double acc = op == IntReduceOp::kMax    ? -INFINITY
                 : op == IntReduceOp::kMin  ? INFINITY
                 : op == IntReduceOp::kProd ? 1.0
                                            : 0.0;
    for (int64_t j = 0; j < count; ++j) {
      int64_t off;
      StridedOffsets<1>(red, j, &off);
      double v = static_cast<double>(x[base + off]);
      switch (op) {
        case IntReduceOp::kMax:
          acc = acc > v ? acc : v;
          break;
        case IntReduceOp::kMin:
          acc = acc < v ? acc : v;
          break;
        case IntReduceOp::kProd:
          acc *= v;
          break;
        case IntReduceOp::kSumSquare:
          acc += v * v;
          break;
        default:
          acc += v;
          break;
      }
    }
    if (op == IntReduceOp::kMean) acc = count ? acc / static_cast<double>(count) : 0.0;
    y[o] = static_cast<T>(acc);
  }
}

}  // namespace

cudaError_t LaunchIntReduce(IntReduceOp op, Elem t, const void* x, void* y, const Strided& kept,
                            int64_t outputs, const Strided& red, int64_t count,
                            cudaStream_t stream) {
  if (outputs == 0) return cudaSuccess;
  Strided k = kept, r = red;
  EnableFastDivision(k, outputs);
  EnableFastDivision(r, count);
  auto go = [&](auto tag) {
    using T = decltype(tag);
    IntReduceKernel<T><<<GridFor(outputs), 256, 0, stream>>>(
        op, static_cast<const T*>(x), static_cast<T*>(y), k, outputs, r, count);
    return cudaGetLastError();
  };
  switch (t) {
    case Elem::kI32:
      return go(int32_t{});
    case Elem::kI64:
      return go(int64_t{});
    case Elem::kBool:
      return go(uint8_t{});  // 0/1 bytes, as the CPU's view of bool
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kiln::cuda
