// Reductions on CUDA (ReduceSum/Mean/Max/Min/Prod/SumSquare/L2/LogSumExp) with FP32
// accumulation. [outer, n, 1] rows: a warp per row; [outer, n, inner]: a thread per column
// (coalesced over inner); any other axis set: a thread per output walking the reduced dims.
#include <cstdint>

#include "kiln/backends/cuda/device_util.cuh"

namespace kiln::cuda {
namespace {

template <ReduceOp kOp>
struct Reducer {
  __device__ __forceinline__ static float Init() {
    if constexpr (kOp == ReduceOp::kMax) return -INFINITY;
    if constexpr (kOp == ReduceOp::kMin) return INFINITY;
    if constexpr (kOp == ReduceOp::kProd) return 1.f;
    return 0.f;
  }
  __device__ __forceinline__ static float Pre(float x) {
    if constexpr (kOp == ReduceOp::kSumSquare || kOp == ReduceOp::kL2) return x * x;
    if constexpr (kOp == ReduceOp::kLogSumExp) return expf(x);
    return x;
  }
  // NaN propagates through Max/Min, as in the CPU reference.
  __device__ __forceinline__ static float Combine(float a, float b) {
    if constexpr (kOp == ReduceOp::kMax) return (a > b || a != a) ? a : b;
    if constexpr (kOp == ReduceOp::kMin) return (a < b || a != a) ? a : b;
    if constexpr (kOp == ReduceOp::kProd) return a * b;
    return a + b;
  }
  __device__ __forceinline__ static float Post(float a, int64_t n) {
    if constexpr (kOp == ReduceOp::kMean) return n ? a / static_cast<float>(n) : NAN;
    if constexpr (kOp == ReduceOp::kL2) return sqrtf(a);
    if constexpr (kOp == ReduceOp::kLogSumExp) return logf(a);
    return a;
  }
  __device__ __forceinline__ static float Warp(float v) {
    for (int o = 16; o > 0; o >>= 1) v = Combine(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
  }
};

template <ReduceOp kOp, typename T>
__global__ void ReduceRowsKernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows,
                                 int64_t n) {
  using R = Reducer<kOp>;
  int warps = blockDim.x >> 5, lane = threadIdx.x & 31;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * warps + (threadIdx.x >> 5); r < rows;
       r += static_cast<int64_t>(gridDim.x) * warps) {
    const T* p = x + r * n;
    float acc = R::Init();
    for (int64_t j = lane; j < n; j += 32) acc = R::Combine(acc, R::Pre(Load(p[j])));
    acc = R::Warp(acc);
    if (lane == 0) y[r] = Store<T>(R::Post(acc, n));
  }
}

template <ReduceOp kOp, typename T>
__global__ void ReduceColumnsKernel(const T* __restrict__ x, T* __restrict__ y, int64_t outer,
                                    int64_t n, int64_t inner) {
  using R = Reducer<kOp>;
  int64_t cols = outer * inner;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < cols;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T* p = x + (t / inner) * n * inner + t % inner;
    float acc = R::Init();
    for (int64_t j = 0; j < n; ++j) acc = R::Combine(acc, R::Pre(Load(p[j * inner])));
    y[t] = Store<T>(R::Post(acc, n));
  }
}

template <ReduceOp kOp, typename T>
__global__ void ReduceStridedKernel(const T* __restrict__ x, T* __restrict__ y, Strided kept,
                                    int64_t outputs, Strided red, int64_t count) {
  using R = Reducer<kOp>;
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < outputs;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t base;
    StridedOffsets<1>(kept, o, &base);
    float acc = R::Init();
    for (int64_t j = 0; j < count; ++j) {
      int64_t off;
      StridedOffsets<1>(red, j, &off);
      acc = R::Combine(acc, R::Pre(Load(x[base + off])));
    }
    y[o] = Store<T>(R::Post(acc, count));
  }
}

template <ReduceOp kOp>
cudaError_t ReduceTyped(Elem t, const void* x, void* y, int64_t outer, int64_t n, int64_t inner,
                        cudaStream_t stream) {
  return DispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    auto* px = static_cast<const T*>(x);
    auto* py = static_cast<T*>(y);
    if (inner == 1) {
      ReduceRowsKernel<kOp, T><<<GridFor(outer * 32), 256, 0, stream>>>(px, py, outer, n);
    } else {
      ReduceColumnsKernel<kOp, T>
          <<<GridFor(outer * inner), 256, 0, stream>>>(px, py, outer, n, inner);
    }
    return cudaGetLastError();
  });
}

template <ReduceOp kOp>
cudaError_t ReduceStridedTyped(Elem t, const void* x, void* y, const Strided& kept, int64_t outputs,
                               const Strided& red, int64_t count, cudaStream_t stream) {
  return DispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    Strided k = kept, r = red;
    EnableFastDivision(k, outputs);
    EnableFastDivision(r, count);
    ReduceStridedKernel<kOp, T><<<GridFor(outputs), 256, 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), k, outputs, r, count);
    return cudaGetLastError();
  });
}

}  // namespace

#define KILN_REDUCE_CASES(CALL) \
  CALL(kSum)                    \
  CALL(kMean)                   \
  CALL(kMax)                    \
  CALL(kMin)                    \
  CALL(kProd)                   \
  CALL(kSumSquare)              \
  CALL(kL2)                     \
  CALL(kLogSumExp)

cudaError_t LaunchReduce(ReduceOp op, Elem t, const void* x, void* y, int64_t outer, int64_t n,
                         int64_t inner, cudaStream_t stream) {
  if (outer * inner == 0) return cudaSuccess;
  switch (op) {
#define KILN_CASE(Name) \
  case ReduceOp::Name:  \
    return ReduceTyped<ReduceOp::Name>(t, x, y, outer, n, inner, stream);
    KILN_REDUCE_CASES(KILN_CASE)
#undef KILN_CASE
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchReduceStrided(ReduceOp op, Elem t, const void* x, void* y, const Strided& kept,
                                int64_t outputs, const Strided& red, int64_t count,
                                cudaStream_t stream) {
  if (outputs == 0) return cudaSuccess;
  switch (op) {
#define KILN_CASE(Name) \
  case ReduceOp::Name:  \
    return ReduceStridedTyped<ReduceOp::Name>(t, x, y, kept, outputs, red, count, stream);
    KILN_REDUCE_CASES(KILN_CASE)
#undef KILN_CASE
  }
  return cudaErrorInvalidValue;
}

}  // namespace kiln::cuda
