// Calibration on the device: max |x| and the histogram of |x| of a float tensor
// (Backend::AccumulateAbsStats), reduced where the value was computed so that calibration
// downloads a few numbers instead of every activation, and the INT8 sensitivity's
// quantize-dequantize, INT8 or FP8 E4M3 (Backend::FakeQuantize). The arithmetic is
// ir/evaluator.h's AccumulateAbsMax/AccumulateAbsHistogram/FakeQuantizeInt8/FakeQuantizeE4M3, so
// host and device agree exactly.
#include <cuda_fp8.h>

#include <cstdint>

#include "kiln/backends/cuda/cuda_launch_more.h"
#include "kiln/backends/cuda/device_util.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;

// |x| of a non-NaN float orders as its bits (sign cleared), infinity last: an unsigned atomicMax
// on the bits is a max on the values.
template <typename T>
__global__ void AbsMaxKernel(const T* __restrict__ x, int64_t n, uint32_t* __restrict__ absmax) {
  uint32_t m = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = fabsf(static_cast<float>(Load(x[i])));
    if (!isnan(v)) m = max(m, __float_as_uint(v));
  }
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0 && m) atomicMax(absmax, m);
}

// Per-block counts in shared memory, added to the global counters once per block.
template <typename T>
__global__ void AbsHistogramKernel(const T* __restrict__ x, int64_t n, int bins, double scale,
                                   unsigned long long* __restrict__ hist) {
  extern __shared__ unsigned int local[];
  for (int b = threadIdx.x; b < bins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const double last = static_cast<double>(bins - 1);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double a = fabs(static_cast<double>(Load(x[i])));
    if (isnan(a) || isinf(a)) continue;
    const double v = a * scale;
    atomicAdd(&local[v >= last ? bins - 1 : static_cast<int>(v)], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < bins; b += blockDim.x) {
    if (local[b]) atomicAdd(&hist[b], static_cast<unsigned long long>(local[b]));
  }
}

template <typename T>
__global__ void FakeQuantizeInt8Kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                                       float scale, float inv) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // The host's order of operations, each rounded to float (no fused multiply-add).
    float s = __fmul_rn(static_cast<float>(Load(x[i])), inv);
    s = s < 127.f ? s : 127.f;
    s = s > -127.f ? s : -127.f;
    y[i] = Store<T>(__fmul_rn(rintf(s), scale));
  }
}

// The FP8 products' own conversion (fp8_gemm.cu): round to nearest even, saturate to +-448.
template <typename T>
__global__ void FakeQuantizeE4M3Kernel(const T* __restrict__ x, T* __restrict__ y, int64_t n,
                                       float scale, float inv) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = static_cast<float>(Load(x[i]));
    if (isnan(v)) {
      y[i] = x[i];
      continue;
    }
    const __nv_fp8_storage_t q =
        __nv_cvt_float_to_fp8(__fmul_rn(v, inv), __NV_SATFINITE, __NV_E4M3);
    const float back = __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3)));
    y[i] = Store<T>(__fmul_rn(back, scale));
  }
}

}  // namespace

cudaError_t LaunchAbsStats(Elem t, const void* x, int64_t n, uint32_t* absmax,
                           unsigned long long* hist, int bins, double range, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  // Shared-memory counters: at most 48 KiB without opting in.
  if (hist && (bins < 1 || bins > 12 * 1024 || !(range > 0))) return cudaErrorInvalidValue;
  return DispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x);
    if (absmax) AbsMaxKernel<T><<<GridFor(n, kThreads), kThreads, 0, stream>>>(px, n, absmax);
    if (hist) {
      const size_t shared = static_cast<size_t>(bins) * sizeof(unsigned int);
      // Few blocks: each adds its non-zero counters to the global ones once, so the flush
      // (bins atomics per block) stays small beside the pass over x.
      AbsHistogramKernel<T><<<GridFor(n, kThreads, 132 * 2), kThreads, shared, stream>>>(
          px, n, bins, static_cast<double>(bins) / range, hist);
    }
    return cudaGetLastError();
  });
}

cudaError_t LaunchFakeQuantize(bool e4m3, Elem t, const void* x, void* y, int64_t n, float amax,
                               cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const float scale = amax / (e4m3 ? 448.f : 127.f);
  const float inv = 1.f / scale;
  return DispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x);
    T* py = static_cast<T*>(y);
    if (e4m3) {
      FakeQuantizeE4M3Kernel<T>
          <<<GridFor(n, kThreads), kThreads, 0, stream>>>(px, py, n, scale, inv);
    } else {
      FakeQuantizeInt8Kernel<T>
          <<<GridFor(n, kThreads), kThreads, 0, stream>>>(px, py, n, scale, inv);
    }
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda
