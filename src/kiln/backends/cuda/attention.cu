// kiln's fused attention kernel: Y = softmax(mask(scale * Q K^T)) V in one pass over K and V
// (flash-attention style). A block owns 16 query rows (4 warps x 4 rows); K and V stream through
// shared memory 32 keys at a time, converted to FP32; each warp keeps a running max, sum and
// FP32 output accumulator per row (online softmax), so the [Sq, Sk] scores never exist in memory.
// Lane j scores key j of the tile; the output columns d = lane + 32 i live in lane registers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "kiln/backends/cuda/blas_kernels.h"

namespace kiln::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 4;
constexpr int kRows = kWarps * kRowsPerWarp;  // query rows per block
constexpr int kKeys = 32;                     // keys per tile (one per lane)
constexpr int kMaxD = kAttentionMaxHeadDim;
constexpr int kCols = kMaxD / 32;  // output columns per lane

template <typename T>
__device__ __forceinline__ float ToF(T v);
template <>
__device__ __forceinline__ float ToF<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ float ToF<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float ToF<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <typename T>
__device__ __forceinline__ T FromF(float v);
template <>
__device__ __forceinline__ float FromF<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromF<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromF<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

__device__ __forceinline__ int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t Max64(int64_t a, int64_t b) { return a > b ? a : b; }

__device__ __forceinline__ float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__global__ void __launch_bounds__(kWarps * 32) AttentionKernel(AttentionParams p) {
  __shared__ float q_s[kRows][kMaxD];
  __shared__ float k_s[kKeys][kMaxD + 1];  // +1: lane j reads row j, conflict-free
  __shared__ float v_s[kKeys][kMaxD];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.y;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int d = static_cast<int>(p.d), dv = static_cast<int>(p.dv);

  // Operand offsets of this output batch (numpy broadcasting over the batch dims).
  int64_t qo = 0, ko = 0, vo = 0, mo = 0;
  {
    int64_t rem = b;
    for (int i = p.batch_rank - 1; i >= 0; --i) {
      int64_t c = rem % p.out_batch_dims[i];
      rem /= p.out_batch_dims[i];
      qo += c * p.q_stride[i];
      ko += c * p.k_stride[i];
      vo += c * p.v_stride[i];
      mo += c * p.m_stride[i];
    }
  }
  const T* q = static_cast<const T*>(p.q) + qo;
  const T* k = static_cast<const T*>(p.k) + ko;
  const T* v = static_cast<const T*>(p.v) + vo;
  const int64_t m_row_stride = p.m_stride[p.batch_rank],
                m_col_stride = p.m_stride[p.batch_rank + 1];

  for (int idx = threadIdx.x; idx < kRows * d; idx += blockDim.x) {
    int r = idx / d, c = idx % d;
    int64_t row = row0 + r;
    q_s[r][c] = row < p.sq ? ToF(q[row * p.d + c]) : 0.f;
  }

  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kCols];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[r][c] = 0.f;
  }

  // Causal: no row of this block sees keys past the last row's diagonal.
  int64_t key_end = p.sk;
  if (p.mask_kind == AttnMask::kCausal) {
    int64_t last_row = Min64(row0 + kRows, p.sq) - 1;
    key_end = Min64(p.sk, Max64(0, last_row + (p.sk - p.sq) + 1));
  }

  for (int64_t key0 = 0; key0 < key_end; key0 += kKeys) {
    __syncthreads();  // the previous tile is consumed (and q_s is written, first time)
    for (int idx = threadIdx.x; idx < kKeys * d; idx += blockDim.x) {
      int j = idx / d, c = idx % d;
      int64_t key = key0 + j;
      k_s[j][c] = key < p.sk ? ToF(k[key * p.d + c]) : 0.f;
    }
    for (int idx = threadIdx.x; idx < kKeys * dv; idx += blockDim.x) {
      int j = idx / dv, c = idx % dv;
      int64_t key = key0 + j;
      v_s[j][c] = key < p.sk ? ToF(v[key * p.dv + c]) : 0.f;
    }
    __syncthreads();

    const int64_t key = key0 + lane;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int rl = warp * kRowsPerWarp + r;
      const int64_t row = row0 + rl;
      if (row >= p.sq) break;  // warp-uniform
      float s = -INFINITY;
      if (key < p.sk) {
        float dot = 0.f;
        for (int c = 0; c < d; ++c) dot = fmaf(q_s[rl][c], k_s[lane][c], dot);
        s = dot * p.scale;
        switch (p.mask_kind) {
          case AttnMask::kAdditive:
            s += ToF(static_cast<const T*>(p.mask)[mo + row * m_row_stride + key * m_col_stride]);
            break;
          case AttnMask::kBoolean:
            if (!static_cast<const bool*>(p.mask)[mo + row * m_row_stride + key * m_col_stride]) {
              s = p.mask_fill;
            }
            break;
          case AttnMask::kCausal:
            if (key > row + (p.sk - p.sq)) s = -INFINITY;
            break;
          case AttnMask::kNone:
            break;
        }
      }
      const float m_new = fmaxf(m[r], WarpMax(s));
      // A row with every key so far masked to -inf keeps m = -inf; subtracting 0 then keeps
      // exp() at 0 instead of NaN, and a row masked everywhere ends 0/0 = NaN like the CPU's.
      const float base = m_new == -INFINITY ? 0.f : m_new;
      const float pj = expf(s - base);
      const float corr = expf(m[r] - base);
      l[r] = l[r] * corr + WarpSum(pj);
      m[r] = m_new;
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[r][c] *= corr;
      const int jn = static_cast<int>(Min64(kKeys, p.sk - key0));
      for (int j = 0; j < jn; ++j) {
        const float pb = __shfl_sync(0xffffffffu, pj, j);
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
          const int col = lane + 32 * c;
          if (col < dv) acc[r][c] = fmaf(pb, v_s[j][col], acc[r][c]);
        }
      }
    }
  }

  T* y = static_cast<T*>(p.y) + b * p.sq * p.dv;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t row = row0 + warp * kRowsPerWarp + r;
    if (row >= p.sq) break;
    const float inv = 1.f / l[r];
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int col = lane + 32 * c;
      if (col < dv) y[row * p.dv + col] = FromF<T>(acc[r][c] * inv);
    }
  }
}

}  // namespace

cudaError_t LaunchAttention(const AttentionParams& p, cudaStream_t stream) {
  if (p.d <= 0 || p.d > kMaxD || p.dv <= 0 || p.dv > kMaxD ||
      p.batch_rank > kAttentionMaxBatchDims) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0 || p.sq == 0) return cudaSuccess;
  if (p.batch > 65535) return cudaErrorInvalidValue;  // grid.y limit
  dim3 grid(static_cast<unsigned>((p.sq + kRows - 1) / kRows), static_cast<unsigned>(p.batch));
  switch (p.type) {
    case BlasType::kF32:
      AttentionKernel<float><<<grid, kWarps * 32, 0, stream>>>(p);
      break;
    case BlasType::kF16:
      AttentionKernel<__half><<<grid, kWarps * 32, 0, stream>>>(p);
      break;
    case BlasType::kBF16:
      AttentionKernel<__nv_bfloat16><<<grid, kWarps * 32, 0, stream>>>(p);
      break;
  }
  return cudaGetLastError();
}

}  // namespace kiln::cuda
