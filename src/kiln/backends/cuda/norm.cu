// Row normalisations on CUDA: LayerNormalization and Softmax/LogSoftmax (a warp per row for rows
// up to 1024 elements, LayerNorm keeping the row in registers; a block per row beyond; FP32
// statistics, two-pass variance as the CPU reference does) and inference BatchNormalization (per
// element, channel parameters folded on the fly so the statistics may be run-time inputs).
// LaunchSkipLayerNorm is the faster LayerNorm (and residual Add + LayerNorm): 16-byte loads, the
// row in registers across one or more warps, FP32 two-pass statistics over the registers.
#include <cuda_fp8.h>

#include <climits>
#include <cstdint>

#include "kiln/backends/cuda/device_util.cuh"

namespace kiln::cuda {
namespace {

constexpr int kWarpRowMax = 1024;
constexpr int kBlockThreads = 256;

// Sum over a row by a group: a warp (kWarp) or the whole block.
template <bool kWarp>
__device__ __forceinline__ float GroupSum(float v, float* scratch) {
  if constexpr (kWarp) {
    return WarpSum(v);
  } else {
    return BlockSum(v, scratch);
  }
}
template <bool kWarp>
__device__ __forceinline__ float GroupMax(float v, float* scratch) {
  if constexpr (kWarp) {
    return WarpMax(v);
  } else {
    return BlockMax(v, scratch);
  }
}

// One row per group: a warp per row (rows = blockDim.x / 32 per block) or a block per row.
template <bool kWarp>
__device__ __forceinline__ void RowGeometry(int64_t& row, int& lane, int& width, int64_t& stride) {
  if constexpr (kWarp) {
    int warps = blockDim.x >> 5;
    row = static_cast<int64_t>(blockIdx.x) * warps + (threadIdx.x >> 5);
    lane = threadIdx.x & 31;
    width = 32;
    stride = static_cast<int64_t>(gridDim.x) * warps;
  } else {
    row = blockIdx.x;
    lane = threadIdx.x;
    width = blockDim.x;
    stride = gridDim.x;
  }
}

template <bool kWarp, typename T, typename P>
__global__ void LayerNormKernel(const T* __restrict__ x, const P* __restrict__ scale,
                                const P* __restrict__ bias, T* __restrict__ y,
                                float* __restrict__ mean_out, float* __restrict__ inv_out,
                                int64_t rows, int64_t n, float eps) {
  __shared__ float scratch[33];
  int64_t row, stride;
  int lane, width;
  RowGeometry<kWarp>(row, lane, width, stride);
  // Rows are uniform per group, so the whole group leaves together (no divergent barriers).
  for (; row < rows; row += stride) {
    const T* p = x + row * n;
    T* q = y + row * n;
    float sum = 0.f;
    for (int64_t j = lane; j < n; j += width) sum += Load(p[j]);
    float mean = GroupSum<kWarp>(sum, scratch) / static_cast<float>(n);
    float var = 0.f;
    for (int64_t j = lane; j < n; j += width) {
      float d = Load(p[j]) - mean;
      var += d * d;
    }
    var = GroupSum<kWarp>(var, scratch) / static_cast<float>(n);
    float inv = rsqrtf(var + eps);
    for (int64_t j = lane; j < n; j += width) {
      float v = (Load(p[j]) - mean) * inv;
      if (scale) v *= Load(scale[j]);
      if (bias) v += Load(bias[j]);
      q[j] = Store<T>(v);
    }
    if (lane == 0) {
      if (mean_out) mean_out[row] = mean;
      if (inv_out) inv_out[row] = inv;
    }
  }
}

// Rows of at most 32 * kPer elements: a warp per row keeps the row in registers, so x is read
// from memory once (the transformer case: hidden sizes 128..1024).
template <int kPer, typename T, typename P>
__global__ void LayerNormCachedKernel(const T* __restrict__ x, const P* __restrict__ scale,
                                      const P* __restrict__ bias, T* __restrict__ y,
                                      float* __restrict__ mean_out, float* __restrict__ inv_out,
                                      int64_t rows, int n, float eps) {
  int warps = blockDim.x >> 5, lane = threadIdx.x & 31;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * warps + (threadIdx.x >> 5); row < rows;
       row += static_cast<int64_t>(gridDim.x) * warps) {
    const T* p = x + row * n;
    T* q = y + row * n;
    float v[kPer];
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      int j = lane + 32 * k;
      v[k] = j < n ? Load(p[j]) : 0.f;
      sum += v[k];
    }
    float mean = WarpSum(sum) / static_cast<float>(n);
    float var = 0.f;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      int j = lane + 32 * k;
      float d = j < n ? v[k] - mean : 0.f;
      var += d * d;
    }
    float inv = rsqrtf(WarpSum(var) / static_cast<float>(n) + eps);
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      int j = lane + 32 * k;
      if (j < n) {
        float o = (v[k] - mean) * inv;
        if (scale) o *= Load(scale[j]);
        if (bias) o += Load(bias[j]);
        q[j] = Store<T>(o);
      }
    }
    if (lane == 0) {
      if (mean_out) mean_out[row] = mean;
      if (inv_out) inv_out[row] = inv;
    }
  }
}

template <bool kWarp, typename T>
__global__ void SoftmaxRowKernel(const T* __restrict__ x, T* __restrict__ y, int64_t rows,
                                 int64_t n, bool log) {
  __shared__ float scratch[33];
  int64_t row, stride;
  int lane, width;
  RowGeometry<kWarp>(row, lane, width, stride);
  for (; row < rows; row += stride) {
    const T* p = x + row * n;
    T* q = y + row * n;
    float mx = -INFINITY;
    for (int64_t j = lane; j < n; j += width) mx = fmaxf(mx, Load(p[j]));
    mx = GroupMax<kWarp>(mx, scratch);
    float sum = 0.f;
    for (int64_t j = lane; j < n; j += width) sum += expf(Load(p[j]) - mx);
    sum = GroupSum<kWarp>(sum, scratch);
    if (log) {
      float lse = mx + logf(sum);
      for (int64_t j = lane; j < n; j += width) q[j] = Store<T>(Load(p[j]) - lse);
    } else {
      float inv = 1.f / sum;
      for (int64_t j = lane; j < n; j += width) q[j] = Store<T>(expf(Load(p[j]) - mx) * inv);
    }
  }
}

// Softmax over a strided axis: one thread per (outer, inner) column; neighbouring threads read
// neighbouring inner elements, so every pass over the axis is coalesced.
template <typename T>
__global__ void SoftmaxColumnKernel(const T* __restrict__ x, T* __restrict__ y, int64_t outer,
                                    int64_t n, int64_t inner, bool log) {
  int64_t cols = outer * inner;
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < cols;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off = (t / inner) * n * inner + t % inner;
    const T* p = x + off;
    T* q = y + off;
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) mx = fmaxf(mx, Load(p[j * inner]));
    float sum = 0.f;
    for (int64_t j = 0; j < n; ++j) sum += expf(Load(p[j * inner]) - mx);
    if (log) {
      float lse = mx + logf(sum);
      for (int64_t j = 0; j < n; ++j) q[j * inner] = Store<T>(Load(p[j * inner]) - lse);
    } else {
      float inv = 1.f / sum;
      for (int64_t j = 0; j < n; ++j) {
        q[j * inner] = Store<T>(expf(Load(p[j * inner]) - mx) * inv);
      }
    }
  }
}

template <typename T, typename P>
__global__ void BatchNormKernel(const T* __restrict__ x, const P* __restrict__ scale,
                                const P* __restrict__ bias, const P* __restrict__ mean,
                                const P* __restrict__ var, T* __restrict__ y, int64_t n,
                                int64_t channels, int64_t inner, float eps) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t c = (i / inner) % channels;
    float a = Load(scale[c]) * rsqrtf(Load(var[c]) + eps);
    float b = Load(bias[c]) - Load(mean[c]) * a;
    y[i] = Store<T>(Load(x[i]) * a + b);
  }
}

unsigned RowBlocks(int64_t rows, bool warp) {
  int64_t per_block = warp ? kBlockThreads / 32 : 1;
  int64_t blocks = (rows + per_block - 1) / per_block;
  int64_t cap = 132 * 32;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > cap ? cap : blocks));
}

// ---- LayerNorm of x (+ skip) with the row in registers -----------------------------------------

// kN elements of T moved as one (or two) 16-byte loads.
template <typename T, int kN>
struct alignas(16) Pack {
  T v[kN];
};
// kN bytes stored as one 8- or 4-byte word.
template <int kN>
struct alignas(kN) BytePack {
  uint8_t v[kN];
};

// Sum over the threads of one row: `warps_per_row` consecutive warps of the block (a power of two,
// uniform over the block, so every thread reaches the barriers). partial holds 32 floats.
__device__ __forceinline__ float RowSum(float v, float* partial, int warps_per_row) {
  v = WarpSum(v);
  if (warps_per_row == 1) return v;
  int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) partial[warp] = v;
  __syncthreads();
  int first = warp & ~(warps_per_row - 1);
  float t = 0.f;
  for (int w = 0; w < warps_per_row; ++w) t += partial[first + w];
  __syncthreads();  // partial is written again by the next RowSum
  return t;
}

// y as one byte for an edge or copy (LaunchSkipLayerNorm): int8, or E4M3 with e4m3.
__device__ __forceinline__ uint8_t QuantizeByte(float y, float inv, bool e4m3) {
  if (e4m3)
    return static_cast<uint8_t>(
        __nv_cvt_float_to_fp8(__fmul_rn(y, inv), __NV_SATFINITE, __NV_E4M3));
  return static_cast<uint8_t>(QuantizeInt8Device(y, inv));
}

// One row per group of 32 * warps_per_row threads; thread `tid` of a row holds vectors
// tid, tid + row_threads, ... (kVpt of them, the last ones possibly past the row), so each of the
// row's loads is one coalesced 16-byte access per thread. x, skip, sum and y are read and written
// exactly once; yq (null: none) gets y as int8 or E4M3 (LaunchSkipLayerNorm), y may then be null.
template <typename T, int kVpt, bool kSkip>
__global__ void __launch_bounds__(1024)
    SkipLayerNormVecKernel(const T* __restrict__ x, const T* __restrict__ skip,
                           const T* __restrict__ scale, const T* __restrict__ bias,
                           T* __restrict__ y, T* __restrict__ sum_out, int64_t rows, int n,
                           int warps_per_row, float eps, uint8_t* __restrict__ yq, float q_inv,
                           bool q_e4m3) {
  constexpr int kVec = 16 / sizeof(T);
  using V = Pack<T, kVec>;
  __shared__ float partial[32];
  const int row_threads = warps_per_row * 32;
  const int tid = threadIdx.x & (row_threads - 1);
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * (blockDim.x / row_threads) + threadIdx.x / row_threads;
  const bool active = row < rows;
  const int64_t base = active ? row * n : 0;
  const int vecs = n / kVec;
  const V* px = reinterpret_cast<const V*>(x + base);
  float v[kVpt][kVec];
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < kVpt; ++k) {
    int i = k * row_threads + tid;
    if (active && i < vecs) {
      V a = px[i];
      if constexpr (kSkip) {
        V b = reinterpret_cast<const V*>(skip + base)[i];
#pragma unroll
        for (int e = 0; e < kVec; ++e) v[k][e] = Load(a.v[e]) + Load(b.v[e]);
        if (sum_out) {
          V c;
#pragma unroll
          for (int e = 0; e < kVec; ++e) c.v[e] = Store<T>(v[k][e]);
          reinterpret_cast<V*>(sum_out + base)[i] = c;
        }
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) v[k][e] = Load(a.v[e]);
      }
#pragma unroll
      for (int e = 0; e < kVec; ++e) s += v[k][e];
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) v[k][e] = 0.f;
    }
  }
  const float inv_n = 1.f / static_cast<float>(n);
  const float mean = RowSum(s, partial, warps_per_row) * inv_n;
  float q = 0.f;
#pragma unroll
  for (int k = 0; k < kVpt; ++k) {
    if (active && k * row_threads + tid < vecs) {
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        float d = v[k][e] - mean;
        q += d * d;
      }
    }
  }
  const float inv = rsqrtf(RowSum(q, partial, warps_per_row) * inv_n + eps);
  V* py = reinterpret_cast<V*>(y + base);
#pragma unroll
  for (int k = 0; k < kVpt; ++k) {
    int i = k * row_threads + tid;
    if (active && i < vecs) {
      V g, b, o;
      if (scale) g = reinterpret_cast<const V*>(scale)[i];
      if (bias) b = reinterpret_cast<const V*>(bias)[i];
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        float r = (v[k][e] - mean) * inv;
        if (scale) r *= Load(g.v[e]);
        if (bias) r += Load(b.v[e]);
        o.v[e] = Store<T>(r);
      }
      if (y) py[i] = o;
      if (yq) {
        // kVec bytes (8 or 4), from y as stored: what a consumer quantizing y would read.
        BytePack<kVec> q;
#pragma unroll
        for (int e = 0; e < kVec; ++e) q.v[e] = QuantizeByte(Load(o.v[e]), q_inv, q_e4m3);
        reinterpret_cast<BytePack<kVec>*>(yq + base)[i] = q;
      }
    }
  }
}

// Any row length and alignment: a warp (kWarp) or a block per row, reading x (+ skip) three times
// (sum, variance, output); sum_out is written in the first pass, yq (if any) with y.
template <bool kWarp, typename T, bool kSkip>
__global__ void SkipLayerNormRowKernel(const T* __restrict__ x, const T* __restrict__ skip,
                                       const T* __restrict__ scale, const T* __restrict__ bias,
                                       T* __restrict__ y, T* __restrict__ sum_out, int64_t rows,
                                       int64_t n, float eps, uint8_t* __restrict__ yq, float q_inv,
                                       bool q_e4m3) {
  __shared__ float scratch[33];
  int64_t row, stride;
  int lane, width;
  RowGeometry<kWarp>(row, lane, width, stride);
  auto at = [&](int64_t off) {
    if constexpr (kSkip) {
      return Load(x[off]) + Load(skip[off]);
    } else {
      return Load(x[off]);
    }
  };
  for (; row < rows; row += stride) {
    const int64_t base = row * n;
    float sum = 0.f;
    for (int64_t j = lane; j < n; j += width) {
      float v = at(base + j);
      if constexpr (kSkip) {
        if (sum_out) sum_out[base + j] = Store<T>(v);
      }
      sum += v;
    }
    float mean = GroupSum<kWarp>(sum, scratch) / static_cast<float>(n);
    float var = 0.f;
    for (int64_t j = lane; j < n; j += width) {
      float d = at(base + j) - mean;
      var += d * d;
    }
    float inv = rsqrtf(GroupSum<kWarp>(var, scratch) / static_cast<float>(n) + eps);
    for (int64_t j = lane; j < n; j += width) {
      float v = (at(base + j) - mean) * inv;
      if (scale) v *= Load(scale[j]);
      if (bias) v += Load(bias[j]);
      const T o = Store<T>(v);
      if (y) y[base + j] = o;
      if (yq) yq[base + j] = QuantizeByte(Load(o), q_inv, q_e4m3);
    }
  }
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <typename T, bool kSkip>
cudaError_t LaunchSkipLayerNormT(const T* x, const T* skip, const T* scale, const T* bias, T* y,
                                 T* sum, int64_t rows, int64_t n, float eps, cudaStream_t stream,
                                 uint8_t* yq, float q_inv, bool q_e4m3) {
  constexpr int kVec = 16 / sizeof(T);
  constexpr int kMaxVpt = 4;
  bool vec = n % kVec == 0 && n / kVec <= 32 * 32 * kMaxVpt && Aligned16(x) &&
             (!y || Aligned16(y)) && (!yq || reinterpret_cast<uintptr_t>(yq) % kVec == 0) &&
             (!kSkip || Aligned16(skip)) && (!sum || Aligned16(sum)) &&
             (!scale || Aligned16(scale)) && (!bias || Aligned16(bias));
  if (vec) {
    int vecs = static_cast<int>(n / kVec);
    // The fewest warps per row that hold it with at most kMaxVpt vectors per thread: one warp up
    // to 1024 halves (BERT/GPT-2's 768 in 3 loads per thread), four for 4096.
    int warps = 1;
    while (32 * warps * kMaxVpt < vecs) warps *= 2;
    int vpt = (vecs + 32 * warps - 1) / (32 * warps);
    // Few rows (batch-1 latency): spread each row over more warps, so that about 8 warps per SM
    // of the H200's 132 have loads in flight, rather than a few warps doing all the work.
    constexpr int64_t kTargetWarps = 132 * 8;
    while (vpt > 1 && warps < 32 && rows * warps < kTargetWarps) {
      warps *= 2;
      vpt = (vecs + 32 * warps - 1) / (32 * warps);
    }
    int threads = warps * 32 < 128 ? 128 : warps * 32;
    int64_t rows_per_block = threads / (warps * 32);
    int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
    if (blocks <= INT_MAX) {
      auto launch = [&](auto kernel) {
        kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
            x, skip, scale, bias, y, sum, rows, static_cast<int>(n), warps, eps, yq, q_inv, q_e4m3);
        return cudaGetLastError();
      };
      switch (vpt) {
        case 1:
          return launch(SkipLayerNormVecKernel<T, 1, kSkip>);
        case 2:
          return launch(SkipLayerNormVecKernel<T, 2, kSkip>);
        case 3:
          return launch(SkipLayerNormVecKernel<T, 3, kSkip>);
        default:
          return launch(SkipLayerNormVecKernel<T, 4, kSkip>);
      }
    }
  }
  if (n <= kWarpRowMax) {
    SkipLayerNormRowKernel<true, T, kSkip><<<RowBlocks(rows, true), kBlockThreads, 0, stream>>>(
        x, skip, scale, bias, y, sum, rows, n, eps, yq, q_inv, q_e4m3);
  } else {
    SkipLayerNormRowKernel<false, T, kSkip><<<RowBlocks(rows, false), kBlockThreads, 0, stream>>>(
        x, skip, scale, bias, y, sum, rows, n, eps, yq, q_inv, q_e4m3);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchSkipLayerNorm(Elem t, const void* x, const void* skip, const void* scale,
                                const void* bias, void* y, void* sum, int64_t rows, int64_t n,
                                float epsilon, cudaStream_t stream, void* yq, float yq_inv_scale,
                                bool yq_e4m3) {
  if (rows == 0 || n == 0) return cudaSuccess;
  return DispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    auto* px = static_cast<const T*>(x);
    auto* pk = static_cast<const T*>(skip);
    auto* ps = static_cast<const T*>(scale);
    auto* pb = static_cast<const T*>(bias);
    auto* py = static_cast<T*>(y);
    auto* pu = static_cast<T*>(sum);
    auto* pq = static_cast<uint8_t*>(yq);
    if (skip)
      return LaunchSkipLayerNormT<T, true>(px, pk, ps, pb, py, pu, rows, n, epsilon, stream, pq,
                                           yq_inv_scale, yq_e4m3);
    // Without a residual there is no sum to write.
    return LaunchSkipLayerNormT<T, false>(px, nullptr, ps, pb, py, nullptr, rows, n, epsilon,
                                          stream, pq, yq_inv_scale, yq_e4m3);
  });
}

cudaError_t LaunchLayerNorm(Elem t, Elem param_t, const void* x, const void* scale,
                            const void* bias, void* y, float* mean, float* inv_std, int64_t rows,
                            int64_t n, float epsilon, cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  return DispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    return DispatchFloat(param_t, [&](auto ptag) {
      using P = decltype(ptag);
      auto* px = static_cast<const T*>(x);
      auto* ps = static_cast<const P*>(scale);
      auto* pb = static_cast<const P*>(bias);
      auto* py = static_cast<T*>(y);
      if (n <= 256) {
        LayerNormCachedKernel<8, T, P><<<RowBlocks(rows, true), kBlockThreads, 0, stream>>>(
            px, ps, pb, py, mean, inv_std, rows, static_cast<int>(n), epsilon);
      } else if (n <= kWarpRowMax) {
        LayerNormCachedKernel<32, T, P><<<RowBlocks(rows, true), kBlockThreads, 0, stream>>>(
            px, ps, pb, py, mean, inv_std, rows, static_cast<int>(n), epsilon);
      } else {
        LayerNormKernel<false, T, P><<<RowBlocks(rows, false), kBlockThreads, 0, stream>>>(
            px, ps, pb, py, mean, inv_std, rows, n, epsilon);
      }
      return cudaGetLastError();
    });
  });
}

cudaError_t LaunchSoftmax(Elem t, bool log, const void* x, void* y, int64_t outer, int64_t n,
                          int64_t inner, cudaStream_t stream) {
  if (outer * n * inner == 0) return cudaSuccess;
  return DispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    auto* px = static_cast<const T*>(x);
    auto* py = static_cast<T*>(y);
    if (inner == 1) {
      if (n <= kWarpRowMax) {
        SoftmaxRowKernel<true, T>
            <<<RowBlocks(outer, true), kBlockThreads, 0, stream>>>(px, py, outer, n, log);
      } else {
        SoftmaxRowKernel<false, T>
            <<<RowBlocks(outer, false), kBlockThreads, 0, stream>>>(px, py, outer, n, log);
      }
    } else {
      SoftmaxColumnKernel<T>
          <<<GridFor(outer * inner), kBlockThreads, 0, stream>>>(px, py, outer, n, inner, log);
    }
    return cudaGetLastError();
  });
}

cudaError_t LaunchBatchNorm(Elem t, Elem param_t, const void* x, const void* scale,
                            const void* bias, const void* mean, const void* var, void* y, int64_t n,
                            int64_t channels, int64_t inner, float epsilon, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    return DispatchFloat(param_t, [&](auto ptag) {
      using P = decltype(ptag);
      BatchNormKernel<T, P><<<GridFor(n), kBlockThreads, 0, stream>>>(
          static_cast<const T*>(x), static_cast<const P*>(scale), static_cast<const P*>(bias),
          static_cast<const P*>(mean), static_cast<const P*>(var), static_cast<T*>(y), n, channels,
          inner, epsilon);
      return cudaGetLastError();
    });
  });
}

// ---- RMSNormalization --------------------------------------------------------------------------
namespace {

// kN elements moved as one load of their total size (16 bytes when kN = 16 / sizeof(T)).
template <typename T, int kN>
struct alignas(sizeof(T) * kN) RmsVec {
  T v[kN];
};

// One row per group (a warp, or a block for long rows), kVec elements per load; x is read twice
// (the sum of squares, then the output), the second time mostly from cache. FP32 statistics.
// kSkip: the row is s = x + skip, summed in FP32 both times it is read (the statistics see the
// unrounded sum, as the CPU reference's do); sum_out (may be null) receives s rounded to T.
template <bool kWarp, typename T, int kVec, bool kSkip>
__global__ void RmsNormKernel(const T* __restrict__ x, const T* __restrict__ skip,
                              const T* __restrict__ scale, T* __restrict__ y,
                              T* __restrict__ sum_out, int64_t rows, int64_t n, float eps) {
  using V = RmsVec<T, kVec>;
  __shared__ float scratch[33];
  int64_t row, stride;
  int lane, width;
  RowGeometry<kWarp>(row, lane, width, stride);
  const int64_t vecs = n / kVec;
  const V* g = reinterpret_cast<const V*>(scale);
  // Rows are uniform per group, so the whole group leaves together (no divergent barriers).
  for (; row < rows; row += stride) {
    const V* p = reinterpret_cast<const V*>(x + row * n);
    const V* k = kSkip ? reinterpret_cast<const V*>(skip + row * n) : nullptr;
    V* q = reinterpret_cast<V*>(y + row * n);
    V* u = kSkip && sum_out ? reinterpret_cast<V*>(sum_out + row * n) : nullptr;
    float sq = 0.f;
    for (int64_t j = lane; j < vecs; j += width) {
      V a = p[j], b, t;
      if constexpr (kSkip) b = k[j];
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        float v = Load(a.v[e]);
        if constexpr (kSkip) {
          v += Load(b.v[e]);
          t.v[e] = Store<T>(v);
        }
        sq += v * v;
      }
      if (u) u[j] = t;
    }
    const float inv = rsqrtf(GroupSum<kWarp>(sq, scratch) / static_cast<float>(n) + eps);
    for (int64_t j = lane; j < vecs; j += width) {
      V a = p[j], w = g[j], b, o;
      if constexpr (kSkip) b = k[j];
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        float v = Load(a.v[e]);
        if constexpr (kSkip) v += Load(b.v[e]);
        o.v[e] = Store<T>(v * inv * Load(w.v[e]));
      }
      q[j] = o;
    }
  }
}

// Rows of up to this many loads go to one warp each; longer ones to a block.
constexpr int64_t kRmsWarpLoads = 256;

}  // namespace

cudaError_t LaunchRmsNorm(Elem t, const void* x, const void* skip, const void* scale, void* y,
                          void* sum, int64_t rows, int64_t n, float epsilon, cudaStream_t stream) {
  if (rows == 0 || n == 0) return cudaSuccess;
  return DispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    auto* px = static_cast<const T*>(x);
    auto* pk = static_cast<const T*>(skip);
    auto* ps = static_cast<const T*>(scale);
    auto* py = static_cast<T*>(y);
    auto* pu = static_cast<T*>(sum);
    const bool vec = n % kVec == 0 && Aligned16(x) && Aligned16(y) && Aligned16(scale) &&
                     (!skip || Aligned16(skip)) && (!sum || Aligned16(sum));
    const bool warp = (vec ? n / kVec : n) <= kRmsWarpLoads;
    auto go = [&](auto kernel) {
      kernel<<<RowBlocks(rows, warp), kBlockThreads, 0, stream>>>(px, pk, ps, py, pu, rows, n,
                                                                  epsilon);
      return cudaGetLastError();
    };
    if (skip) {
      if (vec) {
        return warp ? go(RmsNormKernel<true, T, kVec, true>)
                    : go(RmsNormKernel<false, T, kVec, true>);
      }
      return warp ? go(RmsNormKernel<true, T, 1, true>) : go(RmsNormKernel<false, T, 1, true>);
    }
    if (vec) {
      return warp ? go(RmsNormKernel<true, T, kVec, false>)
                  : go(RmsNormKernel<false, T, kVec, false>);
    }
    return warp ? go(RmsNormKernel<true, T, 1, false>) : go(RmsNormKernel<false, T, 1, false>);
  });
}

}  // namespace kiln::cuda
