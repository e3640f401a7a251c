// kiln's fused attention kernel: Y = softmax(mask(scale * Q K^T)) V in one pass over K and V
// (flash-attention style). A block owns 16 query rows (4 warps x 4 rows); K and V stream through
// shared memory 32 keys at a time, converted to FP32; each warp keeps a running max, sum and
// FP32 output accumulator per row (online softmax), so the [Sq, Sk] scores never exist in memory.
// Lane j scores key j of the tile; the output columns d = lane + 32 i live in lane registers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cmath>

#include "kiln/backends/cuda/attention_common.cuh"
#include "kiln/backends/cuda/blas_kernels.h"
#include "kiln/backends/cuda/device_util.cuh"
#include "kiln/backends/cuda/smem_opt_in.cuh"

namespace kiln::cuda {

cudaError_t LaunchAttentionMma(const AttentionParams& p, int warps, bool pipelined, int m_tiles,
                               cudaStream_t stream);

namespace {

constexpr int kWarps = 4;
constexpr int kRowsPerWarp = 4;
constexpr int kRows = kWarps * kRowsPerWarp;  // query rows per block
constexpr int kKeys = 32;                     // keys per tile (one per lane)
constexpr int kMaxD = kAttentionMaxHeadDim;
constexpr int kCols = kMaxD / 32;  // output columns per lane

__device__ __forceinline__ int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t Max64(int64_t a, int64_t b) { return a > b ? a : b; }

// The scaled score of (row, key) after the mask; `mi` is the mask element's index.
template <typename T>
__device__ __forceinline__ float MaskScore(const AttentionParams& p, float s, int64_t row,
                                           int64_t key, int64_t mi) {
  switch (p.mask_kind) {
    case AttnMask::kAdditive:
      return s + Load(static_cast<const T*>(p.mask)[mi]);
    case AttnMask::kBoolean:
      return static_cast<const bool*>(p.mask)[mi] ? s : p.mask_fill;
    case AttnMask::kCausal:
      return key > row + (p.sk - p.sq) ? -INFINITY : s;
    case AttnMask::kNone:
      break;
  }
  return s;
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

  int64_t qo, ko, vo, mo, yo;
  AttentionBatchOffsets(p, b, qo, ko, vo, mo, yo);
  const T* q = static_cast<const T*>(p.q) + qo;
  const T* k = static_cast<const T*>(p.k) + ko;
  const T* v = static_cast<const T*>(p.v) + vo;
  const int64_t m_row_stride = p.m_stride[p.batch_rank],
                m_col_stride = p.m_stride[p.batch_rank + 1];

  for (int idx = threadIdx.x; idx < kRows * d; idx += blockDim.x) {
    int r = idx / d, c = idx % d;
    int64_t row = row0 + r;
    q_s[r][c] = row < p.sq ? Load(q[row * p.q_row + c]) : 0.f;
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
      k_s[j][c] = key < p.sk ? Load(k[key * p.k_row + c]) : 0.f;
    }
    for (int idx = threadIdx.x; idx < kKeys * dv; idx += blockDim.x) {
      int j = idx / dv, c = idx % dv;
      int64_t key = key0 + j;
      v_s[j][c] = key < p.sk ? Load(v[key * p.v_row + c]) : 0.f;
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
        s = MaskScore<T>(p, dot * p.scale, row, key, mo + row * m_row_stride + key * m_col_stride);
      }
      const float m_new = fmaxf(m[r], WarpMax(s));
      // A row with every key so far masked to -inf keeps m = -inf; subtracting 0 then keeps
      // exp() at 0 instead of NaN, and a row masked everywhere ends with l = 0 (zeros below).
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

  T* y = static_cast<T*>(p.y) + yo;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t row = row0 + warp * kRowsPerWarp + r;
    if (row >= p.sq) break;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;  // a row masked whole gives zeros, not NaN
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      const int col = lane + 32 * c;
      if (col < dv) y[row * p.y_row + col] = Store<T>(acc[r][c] * inv);
    }
  }
}

// ---- Tensor-core variant (f16/bf16, head dims multiples of 16): a block owns 64 query rows
// (4 warps x 16); K and V tiles of 64 keys sit in shared memory in their storage type. Each warp
// computes S = Q K^T for its 16 rows with wmma (FP32 accumulation), updates the online softmax in
// FP32 (two lanes per row), rounds P to the storage type and adds P V into its FP32 output block
// (kept in shared memory, since wmma's accumulator layout is opaque and rows must be rescaled).
constexpr int kTcWarps = 4;
constexpr int kTcRows = 16 * kTcWarps;
constexpr int kTcKeys = 64;

size_t TcSmemBytes(int64_t d, int64_t dv, size_t elem) {
  return elem * (kTcRows * d + kTcKeys * d + kTcKeys * dv) +  // Q, K, V tiles
         sizeof(float) * kTcWarps * 16 * kTcKeys +            // S per warp
         elem * kTcWarps * 16 * kTcKeys +                     // P per warp
         sizeof(float) * kTcWarps * 16 * dv;                  // O per warp
}

template <typename T>
__global__ void __launch_bounds__(kTcWarps * 32) AttentionTcKernel(AttentionParams p) {
  using namespace nvcuda;
  extern __shared__ __align__(128) unsigned char smem[];
  const int d = static_cast<int>(p.d), dv = static_cast<int>(p.dv);
  T* q_s = reinterpret_cast<T*>(smem);
  T* k_s = q_s + kTcRows * d;
  T* v_s = k_s + kTcKeys * d;
  float* s_all = reinterpret_cast<float*>(v_s + kTcKeys * dv);
  T* p_all = reinterpret_cast<T*>(s_all + kTcWarps * 16 * kTcKeys);
  float* o_all = reinterpret_cast<float*>(p_all + kTcWarps * 16 * kTcKeys);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* s_w = s_all + warp * 16 * kTcKeys;
  T* p_w = p_all + warp * 16 * kTcKeys;
  float* o_w = o_all + warp * 16 * dv;
  const int64_t b = blockIdx.y;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kTcRows;
  int64_t qo, ko, vo, mo, yo;
  AttentionBatchOffsets(p, b, qo, ko, vo, mo, yo);
  const T* q = static_cast<const T*>(p.q) + qo;
  const T* k = static_cast<const T*>(p.k) + ko;
  const T* v = static_cast<const T*>(p.v) + vo;
  const T zero = Store<T>(0.f);

  for (int idx = threadIdx.x; idx < kTcRows * d; idx += blockDim.x) {
    int r = idx / d, c = idx % d;
    int64_t row = row0 + r;
    q_s[idx] = row < p.sq ? q[row * p.q_row + c] : zero;
  }
  for (int idx = lane; idx < 16 * dv; idx += 32) o_w[idx] = 0.f;

  // Two lanes per row: lane 2r and 2r+1 own row r's columns [0,32) and [32,64) of a tile.
  const int my_row = lane / 2, half = lane % 2;
  const int64_t row = row0 + warp * 16 + my_row;
  float m = -INFINITY, l = 0.f;

  int64_t key_end = p.sk;
  if (p.mask_kind == AttnMask::kCausal) {
    int64_t last_row = Min64(row0 + kTcRows, p.sq) - 1;
    key_end = Min64(p.sk, Max64(0, last_row + (p.sk - p.sq) + 1));
  }
  const int64_t m_row_stride = p.m_stride[p.batch_rank];
  const int64_t m_col_stride = p.m_stride[p.batch_rank + 1];

  for (int64_t key0 = 0; key0 < key_end; key0 += kTcKeys) {
    __syncthreads();
    for (int idx = threadIdx.x; idx < kTcKeys * d; idx += blockDim.x) {
      int j = idx / d, c = idx % d;
      int64_t key = key0 + j;
      k_s[idx] = key < p.sk ? k[key * p.k_row + c] : zero;
    }
    for (int idx = threadIdx.x; idx < kTcKeys * dv; idx += blockDim.x) {
      int j = idx / dv, c = idx % dv;
      int64_t key = key0 + j;
      v_s[idx] = key < p.sk ? v[key * p.v_row + c] : zero;  // zeros: 0 * garbage could be NaN
    }
    __syncthreads();

    // S = Q_w K^T: K stored [key][d] row-major is K^T column-major with ld d.
    for (int nb = 0; nb < kTcKeys / 16; ++nb) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
      for (int kk = 0; kk < d; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
        wmma::load_matrix_sync(fa, q_s + warp * 16 * d + kk, d);
        wmma::load_matrix_sync(fb, k_s + nb * 16 * d + kk, d);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(s_w + nb * 16, acc, kTcKeys, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax for this lane's half row.
    float sv[32];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int col = half * 32 + j;
      const int64_t key = key0 + col;
      float x = -INFINITY;
      if (key < p.sk && row < p.sq) {
        x = MaskScore<T>(p, s_w[my_row * kTcKeys + col] * p.scale, row, key,
                         mo + row * m_row_stride + key * m_col_stride);
      }
      sv[j] = x;
      mx = fmaxf(mx, x);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, mx);
    const float base = m_new == -INFINITY ? 0.f : m_new;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const float e = expf(sv[j] - base);
      sum += e;
      p_w[my_row * kTcKeys + half * 32 + j] = Store<T>(e);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    const float corr = expf(m - base);
    l = l * corr + sum;
    m = m_new;
    for (int c = half; c < dv; c += 2) o_w[my_row * dv + c] *= corr;
    __syncwarp();

    // O_w += P_w V.
    for (int cb = 0; cb < dv / 16; ++cb) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, o_w + cb * 16, dv, wmma::mem_row_major);
      for (int kk = 0; kk < kTcKeys; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, p_w + kk, kTcKeys);
        wmma::load_matrix_sync(fb, v_s + kk * dv + cb * 16, dv);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(o_w + cb * 16, acc, dv, wmma::mem_row_major);
    }
    __syncwarp();
  }

  __syncwarp();  // o_w's zeros are visible even when no tile ran
  if (row < p.sq) {
    T* y = static_cast<T*>(p.y) + yo;
    const float inv = l > 0.f ? 1.f / l : 0.f;  // a row masked whole gives zeros, not NaN
    for (int c = half; c < dv; c += 2) y[row * p.y_row + c] = Store<T>(o_w[my_row * dv + c] * inv);
  }
}

template <typename T>
cudaError_t LaunchTc(const AttentionParams& p, cudaStream_t stream) {
  size_t smem = TcSmemBytes(p.d, p.dv, sizeof(T));
  // Above 48 KiB a kernel must opt in; done once per instantiation and device (host-side,
  // capture-safe).
  static SharedMemoryOptIn opt_in;
  if (cudaError_t e =
          opt_in.For(AttentionTcKernel<T>, static_cast<int>(TcSmemBytes(kMaxD, kMaxD, sizeof(T))));
      e != cudaSuccess) {
    return e;
  }
  dim3 grid(static_cast<unsigned>((p.sq + kTcRows - 1) / kTcRows), static_cast<unsigned>(p.batch));
  AttentionTcKernel<T><<<grid, kTcWarps * 32, smem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchAttention(const AttentionParams& p, int variant, cudaStream_t stream) {
  if (p.d <= 0 || p.d > kMaxD || p.dv <= 0 || p.dv > kMaxD ||
      p.batch_rank > kAttentionMaxBatchDims) {
    return cudaErrorInvalidValue;
  }
  if (p.batch == 0 || p.sq == 0) return cudaSuccess;
  if (p.batch > 65535) return cudaErrorInvalidValue;  // grid.y limit
  // An E4M3 or int8 Y: the mma kernels only.
  if ((p.y_e4m3 || p.y_i8) && variant < 2) return cudaErrorInvalidValue;
  if (variant == 2 || variant == 3) {
    return LaunchAttentionMma(p, variant == 2 ? 4 : 2, /*pipelined=*/false, /*m_tiles=*/1, stream);
  }
  if (variant == 4 || variant == 5) {
    return LaunchAttentionMma(p, variant == 4 ? 4 : 8, /*pipelined=*/true, /*m_tiles=*/1, stream);
  }
  if (variant == 6) return LaunchAttentionMma(p, 4, /*pipelined=*/true, /*m_tiles=*/2, stream);
  if (variant == 1) {
    if (p.d % 16 != 0 || p.dv % 16 != 0) return cudaErrorInvalidValue;
    if (p.type == BlasType::kF16) return LaunchTc<__half>(p, stream);
    if (p.type == BlasType::kBF16) return LaunchTc<__nv_bfloat16>(p, stream);
    return cudaErrorInvalidValue;
  }
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
