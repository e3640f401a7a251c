// kiln's tensor-core attention (Attention variants 2 and 3): flash-attention-2 style with
// mma.sync.m16n8k16 (FP16/BF16 in, FP32 accumulate). Each warp owns 16 query rows; their Q
// fragments, the scores S = Q K^T of the current key tile, the running max/sum and the output
// accumulator O all stay in registers. K and V tiles of 64 keys are staged in shared memory
// (rows padded by 16 bytes so ldmatrix is conflict-free) and read with ldmatrix (.trans for V).
// P is rounded to the storage type straight from S's accumulator registers, whose layout is the
// A-fragment layout of the P V product: nothing round-trips through shared memory, unlike the
// wmma variant (whose accumulator layout is opaque). Softmax runs in FP32 with exp2 and the
// scale folded into log2(e).
//
// Pipelined variants (4 and 5) double-buffer the K/V tiles with cp.async: the copy of tile j + 1
// runs while the warps compute on tile j, so the loop waits on global memory once, not per tile.
// Variant 5 has 8 warps (128 query rows per block): each K/V tile is read once for twice the rows.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .f16/.bf16): lane = 4 * g + t;
//   A (16x16, row): a0 (g, 2t..2t+1) a1 (g+8, 2t..) a2 (g, 2t+8..) a3 (g+8, 2t+8..)
//   B (16x8, col):  b0 (k 2t..2t+1, n g)  b1 (k 2t+8.., n g)
//   C (16x8, f32):  c0 c1 (g, 2t..2t+1)   c2 c3 (g+8, 2t..2t+1)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kiln/backends/cuda/attention_common.cuh"
#include "kiln/backends/cuda/blas_kernels.h"
#include "kiln/backends/cuda/device_util.cuh"
#include "kiln/backends/cuda/mma_util.cuh"
#include "kiln/backends/cuda/smem_opt_in.cuh"

namespace kiln::cuda {
namespace {

constexpr int kKeys = 64;  // keys per tile
constexpr int kPad = 8;    // elements of padding per shared-memory row (16 bytes)

template <typename T>
struct MmaType;
template <>
struct MmaType<__half> {
  using Pair = __half2;
  static __device__ __forceinline__ uint32_t Pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ void Mma(float* c, const uint32_t* a, const uint32_t* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};
template <>
struct MmaType<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t Pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
  static __device__ __forceinline__ void Mma(float* c, const uint32_t* a, const uint32_t* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

// An explicit mask (additive or boolean) applied to this lane's pair of scores x0, x1 (log2
// units) at keys `key` and key + 1 of one row, whose mask elements start at `row` (the row's own
// offset applied, hoisted out of the key loop). Keys at or past sk are left alone (the caller
// sets them to -inf). `pair` (uniform): the mask runs along keys with stride 1 and every row's
// pair is aligned for one load, so the two elements come in one 4-byte (additive) or 2-byte
// (boolean) load rather than two with 64-bit index math each.
template <typename T>
__device__ __forceinline__ void MaskPair(const AttentionParams& p, const unsigned char* row,
                                         int64_t key, int64_t m_key, bool pair, float& x0,
                                         float& x1) {
  constexpr float kLog2e = 1.4426950408889634f;  // scores are in log2 units
  if (p.mask_kind == AttnMask::kAdditive) {
    const T* r = reinterpret_cast<const T*>(row);
    if (pair && key + 1 < p.sk) {
      const uint32_t w = *reinterpret_cast<const uint32_t*>(r + key);
      const T* e = reinterpret_cast<const T*>(&w);
      x0 += static_cast<float>(e[0]) * kLog2e;
      x1 += static_cast<float>(e[1]) * kLog2e;
      return;
    }
    if (key < p.sk) x0 += static_cast<float>(r[key * m_key]) * kLog2e;
    if (key + 1 < p.sk) x1 += static_cast<float>(r[(key + 1) * m_key]) * kLog2e;
    return;
  }
  // Boolean: false replaces the score by the fill. -inf stays -inf (a row masked whole gives
  // zeros, as on the CPU); a finite fill stays finite: the lowest float times log2(e) must not
  // become -inf, or a row masked everywhere would give zeros instead of the CPU's uniform row.
  const float fill = p.mask_fill == -INFINITY ? -INFINITY : fmaxf(p.mask_fill * kLog2e, -3.0e38f);
  const bool* r = reinterpret_cast<const bool*>(row);
  bool k0, k1;
  if (pair && key + 1 < p.sk) {
    const uint16_t w = *reinterpret_cast<const uint16_t*>(r + key);
    k0 = (w & 0xffu) != 0;
    k1 = (w >> 8) != 0;
  } else {
    k0 = key < p.sk ? r[key * m_key] : true;
    k1 = key + 1 < p.sk ? r[(key + 1) * m_key] : true;
  }
  if (!k0) x0 = fill;
  if (!k1) x1 = fill;
}

// Copies rows [row0, row0 + rows) of a [S, D] operand (row stride `ld` elements) into shared
// memory [rows][D + kPad] with 16-byte accesses; rows past `limit` become zeros (0 * garbage
// could be NaN in P V).
template <typename T, int D>
__device__ __forceinline__ void LoadTile(T* dst, const T* src, int64_t row0, int rows,
                                         int64_t limit, int64_t ld, int tid, int threads) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int idx = tid; idx < rows * kChunks; idx += threads) {
    int r = idx / kChunks, c = idx % kChunks;
    int64_t row = row0 + r;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < limit) v = *reinterpret_cast<const uint4*>(src + row * ld + c * 8);
    *reinterpret_cast<uint4*>(dst + r * (D + kPad) + c * 8) = v;
  }
}

// LoadTile's asynchronous form (cp.async, 16 bytes per thread and step, L2 only): rows past
// `limit` are zero-filled by a source size of 0 (the address stays in bounds all the same).
// Completes at the next CpAsyncWait covering the group it is committed in.
template <typename T, int D>
__device__ __forceinline__ void LoadTileAsync(T* dst, const T* src, int64_t row0, int rows,
                                              int64_t limit, int64_t ld, int tid, int threads) {
  constexpr int kChunks = D / 8;
  for (int idx = tid; idx < rows * kChunks; idx += threads) {
    int r = idx / kChunks, c = idx % kChunks;
    int64_t row = row0 + r;
    const bool valid = row < limit;
    CpAsync16(dst + r * (D + kPad) + c * 8, src + (valid ? row * ld + c * 8 : 0), valid);
  }
}

// 2^x on the special-function unit, denormal results flushed to zero (a probability below
// 2^-126 adds nothing to a row sum that holds at least one 1).
__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// kStages 1: each K/V tile copied with cp.async into one buffer and waited for; 2: double-buffered,
// the next tile's copy in flight during this tile's products.
// kMT: 16-row m-tiles per warp. With 2, each K and V fragment read from shared memory feeds two
// tensor-core products (half the shared-memory traffic per FLOP), at twice the registers for S
// and O (head dims up to 64).
// kCapped: at most 128 registers a thread, so an SM holds 512 threads of the kernel at once.
// Left alone, ptxas gives the D = 64 kernels about 160 (Q's fragments, S and O take 80 of them):
// one 8-warp block an SM, whose blocks wait on memory more than they compute. Capped, the kernel
// spills some 50 bytes a thread (row indices and mask pointers, read once a key tile) and the
// 8-warp pipelined kernel ran 16-24% faster at BERT's, GPT-2's, ViT's and Whisper's shapes (H100,
// session 37); the 4-warp kernel, three blocks an SM uncapped, ran 3-6% slower capped, so it is
// not.
template <int kWarps, bool kCapped>
constexpr int AttentionMinBlocks() {
  return kCapped ? 512 / (kWarps * 32) : 1;
}

template <typename T, int D, int kWarps, int kStages, int kMT, bool kCapped = false>
__global__ void __launch_bounds__(kWarps * 32, (AttentionMinBlocks<kWarps, kCapped>()))
    AttentionMmaKernel(AttentionParams p) {
  constexpr int kWarpRows = 16 * kMT;
  constexpr int kRows = kWarpRows * kWarps;
  constexpr int kLd = D + kPad;
  extern __shared__ __align__(16) unsigned char smem_raw[];  // dynamic: D = 128 needs > 48 KiB
  T* q_s = reinterpret_cast<T*>(smem_raw);
  T* k_buf = q_s + kRows * kLd;              // [kStages][kKeys][kLd]
  T* v_buf = k_buf + kStages * kKeys * kLd;  // [kStages][kKeys][kLd]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t b = blockIdx.y;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows;

  int64_t qo, ko, vo, mo, yo;
  AttentionBatchOffsets(p, b, qo, ko, vo, mo, yo);
  const T* q = static_cast<const T*>(p.q) + qo;
  const T* k = static_cast<const T*>(p.k) + ko;
  const T* v = static_cast<const T*>(p.v) + vo;

  // The keys past the block's last row's last one are masked for every row (causal masks).
  int64_t key_end = p.sk;
  if (p.mask_kind == AttnMask::kCausal) {
    int64_t last = (row0 + kRows < p.sq ? row0 + kRows : p.sq) - 1;
    int64_t e = last + (p.sk - p.sq) + 1;
    key_end = e < 0 ? 0 : (e < p.sk ? e : p.sk);
  }

  if (kStages > 1) {
    // Measured: Q through registers, then the first K/V tile in flight while its fragments load,
    // ran 2-5% faster than Q and that tile in one cp.async group (H100, BERT/GPT-2/ViT/Whisper).
    LoadTile<T, D>(q_s, q, row0, kRows, p.sq, p.q_row, threadIdx.x, kWarps * 32);
  } else {
    // One buffer: every copy in flight at once (cp.async), where loads through registers wait on
    // each other (ViT's 197 tokens: 64 -> 49 us with 2 warps, 52 -> 45 with 4; H100). The first
    // K/V tile's copy goes out with Q's, in a group of its own, so the block waits on global
    // memory once before its first tile rather than twice.
    LoadTileAsync<T, D>(q_s, q, row0, kRows, p.sq, p.q_row, threadIdx.x, kWarps * 32);
    CpAsyncCommit();
    if (key_end > 0) {
      LoadTileAsync<T, D>(k_buf, k, 0, kKeys, p.sk, p.k_row, threadIdx.x, kWarps * 32);
      LoadTileAsync<T, D>(v_buf, v, 0, kKeys, p.sk, p.v_row, threadIdx.x, kWarps * 32);
    }
    CpAsyncCommit();   // (an empty group when there are no keys: complete at once)
    CpAsyncWait<1>();  // Q's group
  }
  __syncthreads();

  // This warp's Q fragments: per m-tile, D/16 k-steps of a 16x16 A tile.
  uint32_t qf[kMT][D / 16][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    const T* base = q_s + (warp * kWarpRows + mt * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kLd +
                    (lane / 16) * 8;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) LdMatrixX4(qf[mt][kk], base + kk * 16);
  }

  float o[kMT][D / 8][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
  }
  // Per m-tile, rows g (h = 0) and g + 8 (h = 1) of this lane: running max (log2 units) and sum.
  float m_run[kMT][2], l_run[kMT][2];
  int64_t my_row[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_run[mt][h] = -INFINITY;
      l_run[mt][h] = 0.f;
      my_row[mt][h] = row0 + warp * kWarpRows + mt * 16 + g + 8 * h;
    }
  }
  const float scale_log2 = p.scale * 1.4426950408889634f;
  // An explicit mask's rows: each lane's start, its key stride, and whether pairs of keys load
  // at once (see MaskPair), all once per block.
  const bool explicit_mask =
      p.mask_kind == AttnMask::kAdditive || p.mask_kind == AttnMask::kBoolean;
  const size_t m_elem = p.mask_kind == AttnMask::kAdditive ? sizeof(T) : sizeof(bool);
  int64_t m_row = 0, m_key = 0;
  bool m_pair = false;
  const unsigned char* m_rows[kMT][2] = {};
  if (explicit_mask) {
    m_row = p.m_stride[p.batch_rank];
    m_key = p.m_stride[p.batch_rank + 1];
    const unsigned char* base = static_cast<const unsigned char*>(p.mask) + mo * m_elem;
    m_pair = m_key == 1 && (m_row * m_elem) % (2 * m_elem) == 0 &&
             reinterpret_cast<uintptr_t>(base) % (2 * m_elem) == 0;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) m_rows[mt][h] = base + my_row[mt][h] * m_row * m_elem;
    }
  }

  // Tiles that need no per-score work but the scale: all keys in range, no mask, and a positive
  // scale (the max of the raw scores is then the max of the scaled ones).
  const bool plain_kind = p.mask_kind == AttnMask::kNone && scale_log2 > 0.f;

  if (kStages > 1 && key_end > 0) {  // tile 0 in flight before the loop
    LoadTileAsync<T, D>(k_buf, k, 0, kKeys, p.sk, p.k_row, threadIdx.x, kWarps * 32);
    LoadTileAsync<T, D>(v_buf, v, 0, kKeys, p.sk, p.v_row, threadIdx.x, kWarps * 32);
    CpAsyncCommit();
  }
  for (int64_t key0 = 0, tile = 0; key0 < key_end; key0 += kKeys, ++tile) {
    // Every warp is done with the buffer the next load overwrites (the previous tile's).
    __syncthreads();
    const int stage = kStages > 1 ? static_cast<int>(tile % kStages) : 0;
    T* k_s = k_buf + stage * kKeys * kLd;
    T* v_s = v_buf + stage * kKeys * kLd;
    if (kStages > 1) {
      if (key0 + kKeys < key_end) {
        const int next = (stage + 1) % kStages;
        LoadTileAsync<T, D>(k_buf + next * kKeys * kLd, k, key0 + kKeys, kKeys, p.sk, p.k_row,
                            threadIdx.x, kWarps * 32);
        LoadTileAsync<T, D>(v_buf + next * kKeys * kLd, v, key0 + kKeys, kKeys, p.sk, p.v_row,
                            threadIdx.x, kWarps * 32);
        CpAsyncCommit();
        CpAsyncWait<1>();  // this tile's group is done; the next one may still be in flight
      } else {
        CpAsyncWait<0>();
      }
    } else {
      if (tile > 0) {  // tile 0's copy went out with Q's
        LoadTileAsync<T, D>(k_s, k, key0, kKeys, p.sk, p.k_row, threadIdx.x, kWarps * 32);
        LoadTileAsync<T, D>(v_s, v, key0, kKeys, p.sk, p.v_row, threadIdx.x, kWarps * 32);
        CpAsyncCommit();
      }
      CpAsyncWait<0>();
    }
    __syncthreads();

    // S = Q K^T for 16 rows per m-tile x 64 keys: 8 n-blocks of 8 keys. Each K fragment serves
    // every m-tile.
    float s[kMT][kKeys / 8][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n)
        s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
    }
#pragma unroll
    for (int np = 0; np < kKeys / 16; ++np) {  // pairs of n-blocks (16 keys)
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        // x4: (keys +0..7, d +0..7) (keys +0..7, d +8..15) (keys +8..15, d +0..7) (+8.., +8..)
        uint32_t kf[4];
        const T* addr =
            k_s + (np * 16 + (lane % 8) + (lane / 16) * 8) * kLd + kk * 16 + ((lane / 8) % 2) * 8;
        LdMatrixX4(kf, addr);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          MmaType<T>::Mma(s[mt][2 * np], qf[mt][kk], kf);
          MmaType<T>::Mma(s[mt][2 * np + 1], qf[mt][kk], kf + 2);
        }
      }
    }

    const bool plain = plain_kind && key0 + kKeys <= p.sk;
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      // The tile's row max (log2 units): on the raw scores of a plain tile (scaled once per
      // row), else scale, mask and bounds per score.
      float tile_max[2] = {-INFINITY, -INFINITY};
      if (plain) {
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n) {
          tile_max[0] = fmaxf(tile_max[0], fmaxf(s[mt][n][0], s[mt][n][1]));
          tile_max[1] = fmaxf(tile_max[1], fmaxf(s[mt][n][2], s[mt][n][3]));
        }
      } else {
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n) {
          const int64_t key = key0 + n * 8 + 2 * t;  // this lane's pair: key, key + 1
#pragma unroll
          for (int h = 0; h < 2; ++h) {  // 0: row g, 1: row g + 8
            float x0 = s[mt][n][2 * h] * scale_log2, x1 = s[mt][n][2 * h + 1] * scale_log2;
            if (my_row[mt][h] < p.sq) {
              if (explicit_mask) {
                MaskPair<T>(p, m_rows[mt][h], key, m_key, m_pair, x0, x1);
              } else if (p.mask_kind == AttnMask::kCausal) {
                const int64_t last = my_row[mt][h] + (p.sk - p.sq);  // the row's last key
                if (key > last) x0 = -INFINITY;
                if (key + 1 > last) x1 = -INFINITY;
              }
            }
            if (key >= p.sk) x0 = -INFINITY;
            if (key + 1 >= p.sk) x1 = -INFINITY;
            s[mt][n][2 * h] = x0;
            s[mt][n][2 * h + 1] = x1;
            tile_max[h] = fmaxf(tile_max[h], fmaxf(x0, x1));
          }
        }
      }
      // A plain tile's scores are still raw: exp2(s * scale - m), one FMA per score.
      const float mul = plain ? scale_log2 : 1.f;
      float corr[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // The four lanes of a quad hold one row's 64 scores between them.
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 1));
        tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(0xffffffffu, tile_max[h], 2));
        const float m_new = fmaxf(m_run[mt][h], tile_max[h] * mul);
        // A row masked everywhere so far keeps m = -inf: exp2 against 0 keeps P at 0 (not NaN),
        // and a row masked everywhere ends with l = 0: zeros, like the CPU reference.
        const float base = m_new == -INFINITY ? 0.f : m_new;
        corr[h] = Exp2(m_run[mt][h] - base);
        m_run[mt][h] = m_new;
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n) {
          s[mt][n][2 * h] = Exp2(fmaf(s[mt][n][2 * h], mul, -base));
          s[mt][n][2 * h + 1] = Exp2(fmaf(s[mt][n][2 * h + 1], mul, -base));
          sum += s[mt][n][2 * h] + s[mt][n][2 * h + 1];
        }
        l_run[mt][h] = l_run[mt][h] * corr[h] + sum;  // per-lane partial; quad-reduced at the end
      }
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        o[mt][n][0] *= corr[0];
        o[mt][n][1] *= corr[0];
        o[mt][n][2] *= corr[1];
        o[mt][n][3] *= corr[1];
      }
    }

    // O += P V: P's A fragments come from S's registers (two n-blocks make one 16-key k-step);
    // each V fragment serves every m-tile.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      uint32_t pf[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        pf[mt][0] = MmaType<T>::Pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pf[mt][1] = MmaType<T>::Pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pf[mt][2] = MmaType<T>::Pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pf[mt][3] = MmaType<T>::Pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        // x4.trans: (keys +0..7, dv +0..7) (keys +8..15, dv +0..7) (keys +0..7, dv +8..15) (..)
        uint32_t vf[4];
        const T* addr =
            v_s + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * kLd + np * 16 + (lane / 16) * 8;
        LdMatrixX4Trans(vf, addr);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          MmaType<T>::Mma(o[mt][2 * np], pf[mt], vf);
          MmaType<T>::Mma(o[mt][2 * np + 1], pf[mt], vf + 2);
        }
      }
    }
  }

  // Normalise and store: lane holds columns n*8 + 2t, +1 of rows g and g + 8 of each m-tile.
  // (An E4M3 or int8 Y takes the same pairs, rounded to T first, as two bytes.)
  T* y = p.y_e4m3 || p.y_i8 ? nullptr : static_cast<T*>(p.y) + yo;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = l_run[mt][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      if (my_row[mt][h] >= p.sq) continue;
      const float inv = l > 0.f ? 1.f / l : 0.f;  // a row masked whole gives zeros, not NaN
      if (p.y_e4m3) {
        uint8_t* qr = p.y_e4m3 + yo + my_row[mt][h] * p.y_row;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          uint32_t packed = MmaType<T>::Pack(o[mt][n][2 * h] * inv, o[mt][n][2 * h + 1] * inv);
          const T* e = reinterpret_cast<const T*>(&packed);
          const auto lo = static_cast<uint16_t>(__nv_cvt_float_to_fp8(
              __fmul_rn(static_cast<float>(e[0]), p.y_inv_scale), __NV_SATFINITE, __NV_E4M3));
          const auto hi = static_cast<uint16_t>(__nv_cvt_float_to_fp8(
              __fmul_rn(static_cast<float>(e[1]), p.y_inv_scale), __NV_SATFINITE, __NV_E4M3));
          *reinterpret_cast<uint16_t*>(qr + n * 8 + 2 * t) = static_cast<uint16_t>(lo | (hi << 8));
        }
        continue;
      }
      if (p.y_i8) {
        int8_t* qr = p.y_i8 + yo + my_row[mt][h] * p.y_row;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          uint32_t packed = MmaType<T>::Pack(o[mt][n][2 * h] * inv, o[mt][n][2 * h + 1] * inv);
          const T* e = reinterpret_cast<const T*>(&packed);
          const auto lo =
              static_cast<uint8_t>(QuantizeInt8Device(static_cast<float>(e[0]), p.y_inv_scale));
          const auto hi =
              static_cast<uint8_t>(QuantizeInt8Device(static_cast<float>(e[1]), p.y_inv_scale));
          *reinterpret_cast<uint16_t*>(qr + n * 8 + 2 * t) = static_cast<uint16_t>(lo | (hi << 8));
        }
        continue;
      }
      T* yr = y + my_row[mt][h] * p.y_row;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        uint32_t packed = MmaType<T>::Pack(o[mt][n][2 * h] * inv, o[mt][n][2 * h + 1] * inv);
        *reinterpret_cast<uint32_t*>(yr + n * 8 + 2 * t) = packed;
      }
    }
  }
}

constexpr size_t SmemBytes(int d, int rows, int stages, size_t elem) {
  return elem * static_cast<size_t>(rows + 2 * stages * kKeys) * static_cast<size_t>(d + kPad);
}

template <typename T, int D, int kWarps, int kStages, int kMT, bool kCapped = false>
cudaError_t LaunchDW(const AttentionParams& p, cudaStream_t stream) {
  constexpr int kRows = 16 * kMT * kWarps;
  constexpr size_t kSmem = SmemBytes(D, kRows, kStages, sizeof(T));
  // Above 48 KiB a kernel must opt in; once per instantiation (host-side, capture-safe). A GPU
  // with less shared memory per block (sm_86/89 for D = 128 with 8 warps) refuses: the tactic
  // fails and the builder times the others.
  static SharedMemoryOptIn opt_in;
  if (kSmem > 48 * 1024) {
    if (cudaError_t e = opt_in.For(AttentionMmaKernel<T, D, kWarps, kStages, kMT, kCapped>,
                                   static_cast<int>(kSmem));
        e != cudaSuccess) {
      return e;
    }
  }
  dim3 grid(static_cast<unsigned>((p.sq + kRows - 1) / kRows), static_cast<unsigned>(p.batch));
  AttentionMmaKernel<T, D, kWarps, kStages, kMT, kCapped><<<grid, kWarps * 32, kSmem, stream>>>(p);
  return cudaGetLastError();
}

template <typename T, int D>
cudaError_t LaunchD(const AttentionParams& p, int warps, bool pipelined, int m_tiles,
                    cudaStream_t stream) {
  if (m_tiles == 2) {  // pipelined, 4 warps; head dims up to 64 (S and O in registers twice)
    if constexpr (D <= 64) return LaunchDW<T, D, 4, 2, 2>(p, stream);
    return cudaErrorInvalidValue;
  }
  if (pipelined) {
    // 8 warps capped at 128 registers up to head dims of 64 (AttentionMinBlocks).
    return warps == 8 ? LaunchDW<T, D, 8, 2, 1, D <= 64>(p, stream)
                      : LaunchDW<T, D, 4, 2, 1>(p, stream);
  }
  return warps == 4 ? LaunchDW<T, D, 4, 1, 1>(p, stream) : LaunchDW<T, D, 2, 1, 1>(p, stream);
}

template <typename T>
cudaError_t LaunchT(const AttentionParams& p, int warps, bool pipelined, int m_tiles,
                    cudaStream_t stream) {
  switch (p.d) {
    case 16:
      return LaunchD<T, 16>(p, warps, pipelined, m_tiles, stream);
    case 32:
      return LaunchD<T, 32>(p, warps, pipelined, m_tiles, stream);
    case 64:
      return LaunchD<T, 64>(p, warps, pipelined, m_tiles, stream);
    case 128:
      return LaunchD<T, 128>(p, warps, pipelined, m_tiles, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

bool Aligned16(int64_t elems) { return elems % 8 == 0; }  // 8 x 16-bit elements = 16 bytes

}  // namespace

bool AttentionMmaSupports(const AttentionParams& p) {
  if (p.type != BlasType::kF16 && p.type != BlasType::kBF16) return false;
  if (p.d != p.dv || (p.d != 16 && p.d != 32 && p.d != 64 && p.d != 128)) return false;
  if (!Aligned16(p.q_row) || !Aligned16(p.k_row) || !Aligned16(p.v_row)) return false;
  if (p.y_row % 2 != 0) return false;  // packed pairs on store
  for (int i = 0; i < p.batch_rank; ++i) {
    if (!Aligned16(p.q_stride[i]) || !Aligned16(p.k_stride[i]) || !Aligned16(p.v_stride[i]) ||
        p.y_stride[i] % 2 != 0) {
      return false;
    }
  }
  return true;
}

cudaError_t LaunchAttentionMma(const AttentionParams& p, int warps, bool pipelined, int m_tiles,
                               cudaStream_t stream) {
  const bool shape_ok = m_tiles == 2 ? pipelined && warps == 4 && p.d <= 64
                        : m_tiles == 1
                            ? (pipelined ? (warps == 4 || warps == 8) : (warps == 2 || warps == 4))
                            : false;
  if (!AttentionMmaSupports(p) || !shape_ok) return cudaErrorInvalidValue;
  auto misaligned = [](const void* ptr, uintptr_t a) {
    return reinterpret_cast<uintptr_t>(ptr) % a != 0;
  };
  if (misaligned(p.q, 16) || misaligned(p.k, 16) || misaligned(p.v, 16) ||
      (p.y_e4m3 ? misaligned(p.y_e4m3, 2)
       : p.y_i8 ? misaligned(p.y_i8, 2)
                : misaligned(p.y, 4))) {
    return cudaErrorMisalignedAddress;
  }
  if (p.type == BlasType::kF16) return LaunchT<__half>(p, warps, pipelined, m_tiles, stream);
  return LaunchT<__nv_bfloat16>(p, warps, pipelined, m_tiles, stream);
}

}  // namespace kiln::cuda
