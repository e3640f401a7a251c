// Pooling on CUDA: MaxPool/AveragePool (1-D and 2-D windows, direct: one thread per output) and
// GlobalAveragePool/GlobalMaxPool (a warp per plane in NCHW; in NHWC one thread per (image,
// channel) so neighbouring threads read neighbouring channels). Both layouts, FP32 math.
#include <cstdint>

#include "kiln/backends/cuda/device_util.cuh"

namespace kiln::cuda {
namespace {

template <typename T>
__global__ void PoolKernel(const T* __restrict__ x, T* __restrict__ y, PoolDesc d, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t ow, oh, c, n;
    if (d.nhwc) {
      c = i % d.c;
      int64_t r = i / d.c;
      ow = r % d.ow;
      r /= d.ow;
      oh = r % d.oh;
      n = r / d.oh;
    } else {
      ow = i % d.ow;
      int64_t r = i / d.ow;
      oh = r % d.oh;
      r /= d.oh;
      c = r % d.c;
      n = r / d.c;
    }
    int64_t h0 = oh * d.sh - d.ph, w0 = ow * d.sw - d.pw;
    float best = -INFINITY, sum = 0.f;
    int count = 0, padded = 0;
    for (int ky = 0; ky < d.kh; ++ky) {
      int64_t ih = h0 + static_cast<int64_t>(ky) * d.dh;
      bool h_in = ih >= 0 && ih < d.ih;
      bool h_pad = ih >= -d.ph && ih < d.ih + d.peh;
      for (int kx = 0; kx < d.kw; ++kx) {
        int64_t iw = w0 + static_cast<int64_t>(kx) * d.dw;
        if (h_pad && iw >= -d.pw && iw < d.iw + d.pew) ++padded;
        if (!h_in || iw < 0 || iw >= d.iw) continue;
        int64_t off = d.nhwc ? ((n * d.ih + ih) * d.iw + iw) * d.c + c
                             : ((n * d.c + c) * d.ih + ih) * d.iw + iw;
        float v = Load(x[off]);
        best = fmaxf(best, v);
        sum += v;
        ++count;
      }
    }
    float out;
    if (d.is_max) {
      out = best;
    } else {
      // count_include_pad counts positions inside the padded input, as the CPU reference does.
      int div = d.count_include_pad ? padded : count;
      out = div > 0 ? sum / static_cast<float>(div) : 0.f;
    }
    y[i] = Store<T>(out);
  }
}

template <typename T>
__global__ void GlobalPoolPlaneKernel(const T* __restrict__ x, T* __restrict__ y, int64_t planes,
                                      int64_t size, bool is_max) {
  int warps = blockDim.x >> 5;
  int lane = threadIdx.x & 31;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * warps + (threadIdx.x >> 5); p < planes;
       p += static_cast<int64_t>(gridDim.x) * warps) {
    const T* src = x + p * size;
    float acc = is_max ? -INFINITY : 0.f;
    for (int64_t j = lane; j < size; j += 32) {
      float v = Load(src[j]);
      acc = is_max ? fmaxf(acc, v) : acc + v;
    }
    acc = is_max ? WarpMax(acc) : WarpSum(acc);
    if (lane == 0) y[p] = Store<T>(is_max ? acc : acc / static_cast<float>(size));
  }
}

template <typename T>
__global__ void GlobalPoolNhwcKernel(const T* __restrict__ x, T* __restrict__ y, int64_t planes,
                                     int64_t channels, int64_t size, bool is_max) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < planes;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t n = p / channels, c = p % channels;
    const T* src = x + n * size * channels + c;
    float acc = is_max ? -INFINITY : 0.f;
    for (int64_t j = 0; j < size; ++j) {
      float v = Load(src[j * channels]);
      acc = is_max ? fmaxf(acc, v) : acc + v;
    }
    y[p] = Store<T>(is_max ? acc : acc / static_cast<float>(size));
  }
}

}  // namespace

cudaError_t LaunchPool(Elem t, const PoolDesc& d, const void* x, void* y, cudaStream_t stream) {
  int64_t total = d.n * d.c * d.oh * d.ow;
  if (total == 0) return cudaSuccess;
  return DispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    PoolKernel<T><<<GridFor(total), 256, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y),
                                                      d, total);
    return cudaGetLastError();
  });
}

cudaError_t LaunchGlobalPool(Elem t, bool is_max, bool nhwc, const void* x, void* y, int64_t planes,
                             int64_t channels, int64_t size, cudaStream_t stream) {
  if (planes == 0) return cudaSuccess;
  return DispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    auto* px = static_cast<const T*>(x);
    auto* py = static_cast<T*>(y);
    if (nhwc) {
      GlobalPoolNhwcKernel<T>
          <<<GridFor(planes), 256, 0, stream>>>(px, py, planes, channels, size, is_max);
    } else {
      GlobalPoolPlaneKernel<T>
          <<<GridFor(planes * 32), 256, 0, stream>>>(px, py, planes, size, is_max);
    }
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda
