// Einsum on CUDA, any equation: one thread per output element walks the summed index space of the
// host-made plan (einsum_ops.cc), the innermost summed dim as a plain strided loop and the outer
// ones decoded from a counter, and accumulates the operands' products in FP32. Correct for every
// equation the CPU runs; matrix-product equations run at naive-GEMM speed here and through cuBLASLt
// in einsum_gemm.cc's tactics.
#include <cstdint>

#include "kiln/backends/cuda/cuda_launch_more.h"
#include "kiln/backends/cuda/device_util.cuh"

namespace kiln::cuda {
namespace {

static_assert(kEinsumMaxOperands == 8, "LaunchEinsum has one case per operand count");

template <typename T, int N>
__global__ void EinsumKernel(EinsumDesc d, T* __restrict__ y, int64_t n) {
  const T* p[N];
#pragma unroll
  for (int i = 0; i < N; ++i) p[i] = static_cast<const T*>(d.ptr[i]);
  // The last summed dim is the inner loop; the others are decoded once per pass over it.
  const int inner_dim = d.red_rank - 1;
  const int64_t inner_n = d.red_rank > 0 ? d.red_dims[inner_dim] : 1;
  const int64_t outer_n = inner_n > 0 ? d.red_size / inner_n : 0;
  int64_t inner_stride[N];
#pragma unroll
  for (int i = 0; i < N; ++i) inner_stride[i] = d.red_rank > 0 ? d.red_strides[i][inner_dim] : 0;

  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < n;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t base[N];
#pragma unroll
    for (int i = 0; i < N; ++i) base[i] = 0;
    int64_t rest = o;
    for (int k = d.out_rank - 1; k >= 0; --k) {
      const int64_t c = rest % d.out_dims[k];
      rest /= d.out_dims[k];
#pragma unroll
      for (int i = 0; i < N; ++i) base[i] += c * d.out_strides[i][k];
    }
    float acc = 0.f;
    for (int64_t r = 0; r < outer_n; ++r) {
      int64_t off[N];
#pragma unroll
      for (int i = 0; i < N; ++i) off[i] = base[i];
      int64_t left = r;
      for (int k = inner_dim - 1; k >= 0; --k) {
        const int64_t c = left % d.red_dims[k];
        left /= d.red_dims[k];
#pragma unroll
        for (int i = 0; i < N; ++i) off[i] += c * d.red_strides[i][k];
      }
      for (int64_t j = 0; j < inner_n; ++j) {
        float prod = static_cast<float>(Load(p[0][off[0]]));
#pragma unroll
        for (int i = 1; i < N; ++i) prod *= static_cast<float>(Load(p[i][off[i]]));
        acc += prod;
#pragma unroll
        for (int i = 0; i < N; ++i) off[i] += inner_stride[i];
      }
    }
    y[o] = Store<T>(acc);
  }
}

template <typename T, int N>
cudaError_t LaunchN(const EinsumDesc& d, void* y, int64_t n, cudaStream_t stream) {
  EinsumKernel<T, N><<<GridFor(n), 256, 0, stream>>>(d, static_cast<T*>(y), n);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchEinsum(Elem t, const EinsumDesc& d, void* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (d.out_rank > kEinsumMaxRank || d.red_rank > kEinsumMaxRank) return cudaErrorInvalidValue;
  return DispatchFloat(t, [&](auto tag) -> cudaError_t {
    using T = decltype(tag);
    switch (d.operands) {
      case 1:
        return LaunchN<T, 1>(d, y, n, stream);
      case 2:
        return LaunchN<T, 2>(d, y, n, stream);
      case 3:
        return LaunchN<T, 3>(d, y, n, stream);
      case 4:
        return LaunchN<T, 4>(d, y, n, stream);
      case 5:
        return LaunchN<T, 5>(d, y, n, stream);
      case 6:
        return LaunchN<T, 6>(d, y, n, stream);
      case 7:
        return LaunchN<T, 7>(d, y, n, stream);
      case 8:
        return LaunchN<T, 8>(d, y, n, stream);
      default:
        return cudaErrorInvalidValue;
    }
  });
}

}  // namespace kiln::cuda
