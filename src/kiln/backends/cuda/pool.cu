// Pooling on CUDA: MaxPool/AveragePool (1-D and 2-D windows, direct: one thread per output) and
// GlobalAveragePool/GlobalMaxPool (a warp per plane in NCHW; in NHWC blocks of channel vectors
// over row splits, then a fold of the splits: see GlobalPoolNhwcPartial). Both layouts, FP32 math.
#include <algorithm>
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

// Channels-last windows with kVec channels (16 bytes) per thread: every tap is one 16-byte load
// that neighbouring threads extend along the channels, and the index arithmetic is paid once per
// kVec outputs (the kernel above pays it per output, with 2-byte loads: ResNet-50's 3x3 stride-2
// max pool took 0.24 ms on an H100 at batch 32). 32-bit indices (the caller checks the sizes).
template <typename T, int kVec>
__global__ void PoolNhwcVecKernel(const T* __restrict__ x, T* __restrict__ y, PoolDesc d,
                                  int32_t total) {
  struct alignas(16) V {
    T v[kVec];
  };
  const int32_t cv = static_cast<int32_t>(d.c / kVec);
  const int32_t ow_n = static_cast<int32_t>(d.ow), oh_n = static_cast<int32_t>(d.oh);
  const int32_t ih_n = static_cast<int32_t>(d.ih), iw_n = static_cast<int32_t>(d.iw);
  // The loop counter is 64-bit so that its last step past `total` cannot wrap; inside, i < 2^31.
  for (int64_t next = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; next < total;
       next += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t i = static_cast<int32_t>(next);
    const int32_t cg = i % cv;
    int32_t r = i / cv;
    const int32_t ow = r % ow_n;
    r /= ow_n;
    const int32_t oh = r % oh_n;
    const int32_t n = r / oh_n;
    const int32_t h0 = oh * d.sh - d.ph, w0 = ow * d.sw - d.pw;
    float best[kVec], sum[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      best[e] = -INFINITY;
      sum[e] = 0.f;
    }
    int count = 0, padded = 0;
    for (int ky = 0; ky < d.kh; ++ky) {
      const int32_t ih = h0 + ky * d.dh;
      const bool h_in = ih >= 0 && ih < ih_n;
      const bool h_pad = ih >= -d.ph && ih < ih_n + d.peh;
      for (int kx = 0; kx < d.kw; ++kx) {
        const int32_t iw = w0 + kx * d.dw;
        if (h_pad && iw >= -d.pw && iw < iw_n + d.pew) ++padded;
        if (!h_in || iw < 0 || iw >= iw_n) continue;
        const V v = *reinterpret_cast<const V*>(
            x + ((static_cast<int64_t>(n) * ih_n + ih) * iw_n + iw) * d.c + cg * kVec);
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const float f = Load(v.v[e]);
          best[e] = fmaxf(best[e], f);
          sum[e] += f;
        }
        ++count;
      }
    }
    const int div = d.count_include_pad ? padded : count;
    V out;
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      out.v[e] = Store<T>(d.is_max ? best[e] : (div > 0 ? sum[e] / static_cast<float>(div) : 0.f));
    }
    *reinterpret_cast<V*>(y + static_cast<int64_t>(i) * kVec) = out;
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

// NHWC global pooling, in two passes so that every SM has work even when N*C is small (an
// EfficientNet stage-1 squeeze-excite pool is 32 images x 32 channels over 112x112 rows).
// Pass 1: block (32, 8) of grid (channel tiles, N, splits) reduces rows [split * rows_per_split,
// ...) of one image for 32 channel vectors of V elements each (16-byte loads when V > 1): the 8
// row phases stride through the rows, then fold through shared memory. With one split it writes
// the output; otherwise it writes FP32 partials [split][n][c] to the workspace and pass 2 folds
// the splits of each (n, c). Deterministic: no atomics.
constexpr int kNhwcVectors = 32;  // channel vectors per block (threadIdx.x)
constexpr int kNhwcPhases = 8;    // row phases per block (threadIdx.y)

template <typename T, int V>
__global__ void GlobalPoolNhwcPartial(const T* __restrict__ x, T* __restrict__ y,
                                      float* __restrict__ partial, int64_t channels, int64_t rows,
                                      int64_t rows_per_split, bool is_max) {
  __shared__ float fold[kNhwcPhases][kNhwcVectors][V];
  const int64_t n = blockIdx.y, split = blockIdx.z;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * kNhwcVectors + threadIdx.x) * V;
  const bool active = c0 < channels;
  float acc[V];
#pragma unroll
  for (int k = 0; k < V; ++k) acc[k] = is_max ? -INFINITY : 0.f;
  const int64_t begin = split * rows_per_split;
  const int64_t end = begin + rows_per_split < rows ? begin + rows_per_split : rows;
  if (active) {
    const T* src = x + n * rows * channels + c0;
    for (int64_t r = begin + threadIdx.y; r < end; r += kNhwcPhases) {
      T v[V];
      if constexpr (V > 1) {
        *reinterpret_cast<uint4*>(v) = *reinterpret_cast<const uint4*>(src + r * channels);
      } else {
        v[0] = src[r * channels];
      }
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float f = Load(v[k]);
        acc[k] = is_max ? fmaxf(acc[k], f) : acc[k] + f;
      }
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) fold[threadIdx.y][threadIdx.x][k] = acc[k];
  __syncthreads();
  if (threadIdx.y != 0 || !active) return;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    float a = fold[0][threadIdx.x][k];
    for (int p = 1; p < kNhwcPhases; ++p) {
      a = is_max ? fmaxf(a, fold[p][threadIdx.x][k]) : a + fold[p][threadIdx.x][k];
    }
    if (partial) {
      partial[(split * gridDim.y + n) * channels + c0 + k] = a;
    } else {
      y[n * channels + c0 + k] = Store<T>(is_max ? a : a / static_cast<float>(rows));
    }
  }
}

template <typename T>
__global__ void GlobalPoolNhwcFold(const float* __restrict__ partial, T* __restrict__ y,
                                   int64_t planes, int64_t splits, int64_t rows, bool is_max) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < planes;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float a = partial[p];
    for (int64_t s = 1; s < splits; ++s) {
      a = is_max ? fmaxf(a, partial[s * planes + p]) : a + partial[s * planes + p];
    }
    y[p] = Store<T>(is_max ? a : a / static_cast<float>(rows));
  }
}

}  // namespace

cudaError_t LaunchPool(Elem t, const PoolDesc& d, const void* x, void* y, cudaStream_t stream) {
  int64_t total = d.n * d.c * d.oh * d.ow;
  if (total == 0) return cudaSuccess;
  return DispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    const int64_t vectors = total / kVec;
    const bool fits = d.ih * d.iw < (int64_t{1} << 30) && vectors < (int64_t{1} << 31) - 1 &&
                      d.n * d.ih * d.iw <= (int64_t{1} << 31) - 1;
    if (d.nhwc && d.c % kVec == 0 && fits && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
        reinterpret_cast<uintptr_t>(y) % 16 == 0) {
      PoolNhwcVecKernel<T, kVec><<<GridFor(vectors, 256, 132 * 64), 256, 0, stream>>>(
          static_cast<const T*>(x), static_cast<T*>(y), d, static_cast<int32_t>(vectors));
      return cudaGetLastError();
    }
    PoolKernel<T><<<GridFor(total), 256, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y),
                                                      d, total);
    return cudaGetLastError();
  });
}

int64_t GlobalPoolNhwcSplits(int64_t n, int64_t channels, int64_t rows) {
  // About four blocks per SM of an H100/H200 (132 SMs), each split keeping >= 32 rows.
  constexpr int64_t kTargetBlocks = 4 * 132;
  const int64_t tiles = (channels + kNhwcVectors - 1) / kNhwcVectors;  // V = 1 bounds it above
  const int64_t blocks = std::max<int64_t>(1, tiles * n);
  const int64_t by_blocks = (kTargetBlocks + blocks - 1) / blocks;
  const int64_t by_rows = std::max<int64_t>(1, rows / 32);
  return std::max<int64_t>(1, std::min({by_blocks, by_rows, int64_t{65535}}));
}

size_t GlobalPoolNhwcWorkspace(int64_t n, int64_t channels, int64_t rows) {
  const int64_t splits = GlobalPoolNhwcSplits(n, channels, rows);
  return splits > 1 ? static_cast<size_t>(splits * n * channels) * sizeof(float) : 0;
}

cudaError_t LaunchGlobalPool(Elem t, bool is_max, bool nhwc, const void* x, void* y, int64_t planes,
                             int64_t channels, int64_t size, void* workspace,
                             size_t workspace_bytes, cudaStream_t stream) {
  if (planes == 0) return cudaSuccess;
  return DispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    auto* px = static_cast<const T*>(x);
    auto* py = static_cast<T*>(y);
    if (!nhwc) {
      GlobalPoolPlaneKernel<T>
          <<<GridFor(planes * 32), 256, 0, stream>>>(px, py, planes, size, is_max);
      return cudaGetLastError();
    }
    const int64_t n = planes / channels;
    if (n > 65535) return cudaErrorInvalidConfiguration;  // grid.y
    int64_t splits = GlobalPoolNhwcSplits(n, channels, size);
    // Fewer splits when the workspace given is smaller than planned (shapes below the max).
    const int64_t fit = static_cast<int64_t>(workspace_bytes / sizeof(float)) / planes;
    if (splits > 1 && fit < splits) splits = fit >= 2 ? fit : 1;
    if (size == 0) splits = 1;
    const int64_t rows_per_split = (size + splits - 1) / std::max<int64_t>(1, splits);
    float* partial = splits > 1 ? static_cast<float*>(workspace) : nullptr;
    constexpr int kV = 16 / sizeof(T);
    const bool vec = channels % kV == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
    const int v = vec ? kV : 1;
    const int64_t vectors = channels / v + (channels % v != 0);
    dim3 grid(static_cast<unsigned>((vectors + kNhwcVectors - 1) / kNhwcVectors),
              static_cast<unsigned>(n), static_cast<unsigned>(splits));
    dim3 block(kNhwcVectors, kNhwcPhases);
    if (vec) {
      GlobalPoolNhwcPartial<T, kV>
          <<<grid, block, 0, stream>>>(px, py, partial, channels, size, rows_per_split, is_max);
    } else {
      GlobalPoolNhwcPartial<T, 1>
          <<<grid, block, 0, stream>>>(px, py, partial, channels, size, rows_per_split, is_max);
    }
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess || !partial) return e;
    GlobalPoolNhwcFold<T>
        <<<GridFor(planes), 256, 0, stream>>>(partial, py, planes, splits, size, is_max);
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda
