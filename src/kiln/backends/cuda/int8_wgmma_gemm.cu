// kiln's INT8 matrix product on Hopper's warpgroup tensor cores (wgmma.mma_async, int8 x int8 ->
// int32), with int8_mma_gemm.cu's fused epilogue (int8_tile_epilogue.cuh); and on the same
// kernels the FP8 product (E4M3 x E4M3 -> FP32, LaunchFp8WgmmaGemm), the only differences being
// the instruction and the accumulators' type. cuBLASLt's INT8
// kernels on an H100 are mma.sync (IMMA) kernels, no faster than its FP16 ones
// (bench/results/h100_session28); wgmma is what doubles the rate of FP16 on this GPU. Same
// operands and contract as int8_mma_gemm.cu: A quantized [M, Kp], B packed [Np, Kp], each row's K
// bytes contiguous, which is the K-major layout wgmma requires of 8-bit operands.
//
// A block of two warpgroups (256 threads) computes a 128 kMi x kBn tile of Y, each warpgroup
// 64 kMi rows with kMi m64n{kBn}k32 instructions per 32 bytes of K, both operands read from
// shared memory through matrix descriptors. K advances 128 bytes per stage: every operand row of a
// stage is one 128-byte row in the 128-byte swizzle wgmma reads (16-byte chunk c of row r stored at
// chunk c ^ (r % 8); stages 1024-byte aligned), filled with cp.async by all threads, kStages in the
// ring. The stage loaded next is the one the wgmma group kDrain + 1 iterations back read: each
// iteration waits until at most kDrain of its warpgroup's wgmma groups are in flight before the
// block's barrier, so that group is done in both warpgroups before any thread overwrites it.
// kDrain 1 keeps the tensor cores busy across the barrier (one block per SM); kDrain 0 with
// fewer stages lets two blocks share an SM, one's epilogue under the other's products.
// cp.async writes through the generic proxy and wgmma reads through the async proxy: each thread
// fences its completed copies (fence.proxy.async) before the barrier.
//
// The instructions exist only in sm_90a machine code (KILN_CUDA_ARCHS' 90a-real); other code of
// this file is an empty kernel, and Int8WgmmaAvailable() asks the device which one it loaded.
#include <cuda.h>  // CUtensorMap and its enums; the encoder comes through the runtime
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <vector>

#include "kiln/backends/cuda/implicit_gemm_conv.h"
#include "kiln/backends/cuda/implicit_gemm_loader.cuh"
#include "kiln/backends/cuda/int8_kernels.h"
#include "kiln/backends/cuda/int8_tile_epilogue.cuh"
#include "kiln/backends/cuda/mma_util.cuh"
#include "kiln/backends/cuda/smem_opt_in.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KILN_WGMMA 1
#endif

namespace kiln::cuda {
namespace {

constexpr int kBk = 128;  // bytes of K per stage: one swizzled 128-byte row per operand row
constexpr int kThreads = 256;
constexpr int kSmemAlign = 1024;  // the swizzle pattern repeats every 8 rows of 128 bytes
// A Hopper (compute capability 9.0) block's largest dynamic shared memory, and an SM's.
constexpr int kSmemPerBlock = 227 * 1024, kSmemPerSm = 228 * 1024;

#ifdef KILN_WGMMA
// A shared-memory matrix descriptor for a K-major operand in the 128-byte swizzle: start address
// (>> 4), leading byte offset unused with this swizzle (1), stride byte offset 1024 (>> 4) between
// groups of 8 rows, swizzle mode 1 (128 bytes) in bits 62-63. The base offset (bits 49-51) is 0:
// every stage starts 1024-byte aligned. Advancing K by 32 bytes inside the row adds 2.
__device__ __forceinline__ uint64_t SmemDesc(const void* p) {
  return static_cast<uint64_t>((SmemAddr(p) & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving accesses to an accumulator register across the asynchronous
// instructions that own it.
template <int kN>
__device__ __forceinline__ void FenceAccumulators(int (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
template <int kN>
__device__ __forceinline__ void FenceAccumulators(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// The warpgroup products on 8-bit K-major operands in shared memory, overloaded on the
// accumulators: int32 (s8 x s8) or FP32 (E4M3 x E4M3), 64 x N with N / 2 accumulators a thread
// (N 64, 96, 128, 192 or 256), D += A[64 x 32 bytes] * B[N x 32 bytes]^T. The predicate operand p
// (always true: the accumulators start at zero) keeps D; E4M3's two immediates leave A and B
// unnegated. The operand lists: %0.. the accumulators, then the two descriptors, then the
// predicate's source.
#define KILN_WGMMA_D4(c, i) c(d[i]), c(d[i + 1]), c(d[i + 2]), c(d[i + 3])
#define KILN_WGMMA_D16(c, i) \
  KILN_WGMMA_D4(c, i), KILN_WGMMA_D4(c, i + 4), KILN_WGMMA_D4(c, i + 8), KILN_WGMMA_D4(c, i + 12)
#define KILN_WGMMA_D64(c, i)                                                  \
  KILN_WGMMA_D16(c, i), KILN_WGMMA_D16(c, i + 16), KILN_WGMMA_D16(c, i + 32), \
      KILN_WGMMA_D16(c, i + 48)
#define KILN_WGMMA_D48(c, i) \
  KILN_WGMMA_D16(c, i), KILN_WGMMA_D16(c, i + 16), KILN_WGMMA_D16(c, i + 32)
#define KILN_WGMMA_D32(c, i) KILN_WGMMA_D16(c, i), KILN_WGMMA_D16(c, i + 16)
// clang-format off
#define KILN_WGMMA_R16(a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, q)                             \
  "%" #a ", %" #b ", %" #c ", %" #d ", %" #e ", %" #f ", %" #g ", %" #h ", %" #i ", %" #j ", %" #k \
  ", %" #l ", %" #m ", %" #n ", %" #o ", %" #q
#define KILN_WGMMA_REGS32                                                                   \
  KILN_WGMMA_R16(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15) ", "                 \
  KILN_WGMMA_R16(16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31)
#define KILN_WGMMA_REGS48                                                                   \
  KILN_WGMMA_REGS32 ", "                                                                    \
  KILN_WGMMA_R16(32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47)
#define KILN_WGMMA_REGS64                                                                   \
  KILN_WGMMA_REGS48 ", "                                                                    \
  KILN_WGMMA_R16(48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63)
#define KILN_WGMMA_REGS96                                                                   \
  KILN_WGMMA_REGS64 ", "                                                                    \
  KILN_WGMMA_R16(64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79) ", "       \
  KILN_WGMMA_R16(80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95)
#define KILN_WGMMA_REGS128                                                                  \
  KILN_WGMMA_REGS96 ", "                                                                    \
  KILN_WGMMA_R16(96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110,     \
                 111) ", "                                                                  \
  KILN_WGMMA_R16(112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, \
                 127)
// clang-format on

// One overload: Acc (&d)[kN] accumulators, the instruction (shape and types), its register list
// and operand lists, the operand numbers of the two descriptors and of the predicate's source,
// and what follows the predicate (E4M3's two immediates).
#define KILN_WGMMA_OVERLOAD(Acc, kN, instruction, regs, desc_a, desc_b, pred, tail, ...)   \
  __device__ __forceinline__ void Wgmma(Acc(&d)[kN], uint64_t da, uint64_t db) {           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #pred ", 0;\n" instruction " {" regs \
                 "}, %" #desc_a ", %" #desc_b ", p" tail ";\n}\n"                          \
                 : __VA_ARGS__                                                             \
                 : "l"(da), "l"(db), "r"(1));                                              \
  }
// Both overloads of one N (kN = N / 2 accumulators a thread): s8 into int32 and E4M3 into FP32;
// acc(c) lists the accumulators with the constraint c.
#define KILN_WGMMA_N(kN, shape, regs, a, b, p, acc)                                               \
  KILN_WGMMA_OVERLOAD(int, kN, "wgmma.mma_async.sync.aligned." shape ".s32.s8.s8", regs, a, b, p, \
                      "", acc("+r"))                                                              \
  KILN_WGMMA_OVERLOAD(float, kN, "wgmma.mma_async.sync.aligned." shape ".f32.e4m3.e4m3", regs, a, \
                      b, p, ", 1, 1", acc("+f"))
#define KILN_WGMMA_ACC32(c) KILN_WGMMA_D32(c, 0)
#define KILN_WGMMA_ACC48(c) KILN_WGMMA_D48(c, 0)
#define KILN_WGMMA_ACC64(c) KILN_WGMMA_D64(c, 0)
#define KILN_WGMMA_ACC96(c) KILN_WGMMA_D48(c, 0), KILN_WGMMA_D48(c, 48)
#define KILN_WGMMA_ACC128(c) KILN_WGMMA_D64(c, 0), KILN_WGMMA_D64(c, 64)
KILN_WGMMA_N(32, "m64n64k32", KILN_WGMMA_REGS32, 32, 33, 34, KILN_WGMMA_ACC32)
KILN_WGMMA_N(48, "m64n96k32", KILN_WGMMA_REGS48, 48, 49, 50, KILN_WGMMA_ACC48)
KILN_WGMMA_N(64, "m64n128k32", KILN_WGMMA_REGS64, 64, 65, 66, KILN_WGMMA_ACC64)
KILN_WGMMA_N(96, "m64n192k32", KILN_WGMMA_REGS96, 96, 97, 98, KILN_WGMMA_ACC96)
KILN_WGMMA_N(128, "m64n256k32", KILN_WGMMA_REGS128, 128, 129, 130, KILN_WGMMA_ACC128)
#undef KILN_WGMMA_ACC128
#undef KILN_WGMMA_ACC96
#undef KILN_WGMMA_ACC64
#undef KILN_WGMMA_ACC48
#undef KILN_WGMMA_ACC32
#undef KILN_WGMMA_N
#undef KILN_WGMMA_OVERLOAD
#undef KILN_WGMMA_REGS128
#undef KILN_WGMMA_REGS96
#undef KILN_WGMMA_REGS64
#undef KILN_WGMMA_REGS48
#undef KILN_WGMMA_REGS32
#undef KILN_WGMMA_R16
#undef KILN_WGMMA_D64
#undef KILN_WGMMA_D48
#undef KILN_WGMMA_D32
#undef KILN_WGMMA_D16
#undef KILN_WGMMA_D4

// Where chunk c of tile row r of an 8-bit operand goes in a stage: row r's 128 bytes in the
// 128-byte swizzle wgmma reads (chunk c at c ^ (r % 8)).
struct SwizzledChunk {
  __device__ __forceinline__ int operator()(int r, int c) const {
    return r * kBk + ((c ^ (r & 7)) << 4);
  }
};

// Rows [row0, row0 + kRows) x bytes [k0, k0 + kBk) of a [rows, ld] 8-bit operand into one
// stage, swizzled; zeros past its rows or depth.
template <int kRows>
__device__ __forceinline__ void LoadStage(uint8_t* dst, const int8_t* src, int64_t ld, int64_t row0,
                                          int64_t rows, int64_t k0, int64_t depth, int tid) {
  constexpr int kChunks = kRows * (kBk / 16);
  static_assert(kChunks % kThreads == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int it = 0; it < kChunks / kThreads; ++it) {
    const int i = tid + it * kThreads;
    const int r = i >> 3, c = i & 7;
    const int64_t gr = row0 + r, gk = k0 + c * 16;
    const bool valid = gr < rows && gk < depth;
    CpAsync16(dst + SwizzledChunk{}(r, c), valid ? src + gr * ld + gk : src, valid);
  }
}

// The mbarriers of the TMA kernel: init with an arrival count; arrive; arrive announcing the bytes
// the tensor copies will complete on it; wait for the completion of the phase of a parity.
__device__ __forceinline__ void MbarInit(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SmemAddr(bar)), "r"(count)
               : "memory");
}
__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(SmemAddr(bar)) : "memory");
}
__device__ __forceinline__ void MbarExpectTx(uint64_t* bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SmemAddr(bar)),
               "r"(bytes)
               : "memory");
}
// One try at the phase of a parity (the instruction itself may suspend the thread a while).
__device__ __forceinline__ bool MbarTryWait(uint64_t* bar, int parity) {
  uint32_t done = 0;
  asm volatile(
      "{\n.reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(SmemAddr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t ns = 0;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(ns));
  return ns;
}
// Every wait has a bound: a phase that does not complete within timeout_ns (a tensor copy that
// never lands: a bad map, a fault) traps, and the launch's stream reports cudaErrorLaunchFailure
// instead of the GPU spinning until the job's own timeout. The clock is read only after a try
// has failed, every 256 tries.
constexpr uint64_t kMbarTimeoutNs = 10ull * 1000 * 1000 * 1000;  // 10 s; a stage takes microseconds
__device__ __forceinline__ void MbarWait(uint64_t* bar, int parity,
                                         uint64_t timeout_ns = kMbarTimeoutNs) {
  if (MbarTryWait(bar, parity)) return;
  const uint64_t start = GlobalTimerNs();
  for (uint32_t tries = 1;; ++tries) {
    if (MbarTryWait(bar, parity)) return;
    if ((tries & 255) == 0 && GlobalTimerNs() - start > timeout_ns) __trap();
  }
}
// A box of a 2-D tensor map (columns x0.., rows y0..) into shared memory, completing on bar.
__device__ __forceinline__ void TmaLoad2d(void* dst, const CUtensorMap* map, int x0, int y0,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3}], [%4];\n" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x0), "r"(y0), "r"(SmemAddr(bar))
      : "memory");
}

// TmaLoad2d's box written at the same offset in the shared memory of every block of the cluster
// in cta_mask, each completing the bytes it receives on its own barrier at bar's offset.
__device__ __forceinline__ void TmaLoad2dMulticast(void* dst, const CUtensorMap* map, int x0,
                                                   int y0, uint64_t* bar, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::"
      "cluster [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x0), "r"(y0), "r"(SmemAddr(bar)), "h"(cta_mask)
      : "memory");
}
// An arrival on the barrier at bar's offset in block `rank` of the cluster (this block's own
// included), with the default release at CTA scope: what it orders is this thread's completed
// reads of its own stage (wgmma.wait_group) before the peer's copies into it, as CUTLASS's
// cluster pipelines do. (A cluster-scope release here stalled every stage.)
__device__ __forceinline__ void MbarArriveCluster(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(SmemAddr(bar)),
      "r"(rank)
      : "memory");
}
__device__ __forceinline__ uint32_t ClusterRank() {
  uint32_t r = 0;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every block of the cluster (barrier.cluster's arrive and wait).
__device__ __forceinline__ void ClusterSync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
}

// Warp w of a warpgroup holds rows 16w..16w+15 of each of its 64-row tiles; lane (g, t) of it,
// for each 8 columns j, rows g and g + 8 at columns 8j + 2t and 8j + 2t + 1 (acc[i][4j..4j+3]),
// as mma.sync's m16n8. Into the [128 kMi][kBn + kAccPad] tile of Acc the epilogue reads.
template <int kMi, int kBn, typename Acc>
__device__ __forceinline__ void StageAccumulators(Acc* tile, const Acc (&acc)[kMi][kBn / 2], int wg,
                                                  int tid) {
  const int lane = tid & 31, w = (tid >> 5) & 3;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < kMi; ++i) {
#pragma unroll
    for (int j = 0; j < kBn / 8; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = (wg * kMi + i) * 64 + w * 16 + g + h * 8, col = j * 8 + 2 * t;
        Acc* dst = tile + r * (kBn + int8_tile::kAccPad) + col;
        if constexpr (std::is_same_v<Acc, int>) {
          *reinterpret_cast<int2*>(dst) =
              make_int2(acc[i][4 * j + 2 * h], acc[i][4 * j + 2 * h + 1]);
        } else {
          *reinterpret_cast<float2*>(dst) =
              make_float2(acc[i][4 * j + 2 * h], acc[i][4 * j + 2 * h + 1]);
        }
      }
    }
  }
}

// Issues the warpgroup's products for one stage: kMi 64-row tiles x 4 steps of 32 bytes of K.
// The warpgroup's rows of A start at da, B's at db (descriptors); 64 rows of 128 bytes are 512
// in the descriptor's units of 16 bytes, 32 bytes of K are 2.
template <int kMi, int kBn, typename Acc>
__device__ __forceinline__ void StageProducts(Acc (&acc)[kMi][kBn / 2], uint64_t da, uint64_t db) {
  WgmmaFence();
#pragma unroll
  for (int i = 0; i < kMi; ++i) FenceAccumulators(acc[i]);
#pragma unroll
  for (int ks = 0; ks < kBk / 32; ++ks) {
#pragma unroll
    for (int i = 0; i < kMi; ++i) Wgmma(acc[i], da + i * (64 * kBk >> 4) + 2 * ks, db + 2 * ks);
  }
  WgmmaCommit();
#pragma unroll
  for (int i = 0; i < kMi; ++i) FenceAccumulators(acc[i]);
}
#endif  // KILN_WGMMA

// The stages, and the accumulator tile the epilogue reads in their place.
template <int kBm, int kBn, int kStages>
constexpr int StageBytes() {
  constexpr int stages = kStages * (kBm + kBn) * kBk;
  constexpr int acc = kBm * (kBn + int8_tile::kAccPad) * 4;
  return stages > acc ? stages : acc;
}
// With the slack to align the dynamic base and the TMA kernel's 2 kStages mbarriers after it.
template <int kBm, int kBn, int kStages>
constexpr int SmemBytes() {
  return StageBytes<kBm, kBn, kStages>() + 2 * kSmemAlign;
}

// kMi: 64-row instructions per warpgroup and K step (the block has 128 * kMi rows of Y). Acc: int
// for INT8 operands, float for E4M3 ones. kConv: A is the implicit-GEMM view `conv` of the NHWC
// input p.a (LaunchInt8WgmmaConv), not a matrix.
template <typename Acc, typename T, typename Y, int kMi, int kBn, int kStages, int kDrain,
          int kMinBlocks, bool kConv>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    Int8WgmmaGemmKernel(Int8MmaGemmParams p, int8_tile::Vectors vectors, ImplicitGemmConv conv) {
#ifdef KILN_WGMMA
  constexpr int kBm = 2 * 64 * kMi;
  constexpr int kAhead = kStages - 1 - kDrain;  // stages loaded ahead of the one multiplied
  static_assert(kAhead >= 1, "at least one stage in flight");
  constexpr int kAStage = kBm * kBk, kBStage = kBn * kBk;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      smem_raw + ((kSmemAlign - (SmemAddr(smem_raw) & (kSmemAlign - 1))) & (kSmemAlign - 1));
  uint8_t* sa = smem;
  uint8_t* sb = smem + kStages * kAStage;
  const int tid = threadIdx.x, wg = tid >> 7;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBm;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBn;
  const int ktiles = static_cast<int>((p.depth + kBk - 1) / kBk);

  Acc acc[kMi][kBn / 2];
#pragma unroll
  for (int i = 0; i < kMi; ++i) {
#pragma unroll
    for (int j = 0; j < kBn / 2; ++j) acc[i][j] = 0;
  }

  // kConv: the stages are loaded in order, kt = 0, 1, ...
  ImplicitGemmStageLoader<kBm, kBk / 16, kThreads> conv_a;
  if constexpr (kConv) conv_a.Init(conv, m0, tid);
  auto load = [&](int kt, int slot) {
    const int64_t k0 = static_cast<int64_t>(kt) * kBk;
    if constexpr (kConv) {
      conv_a.Load(sa + slot * kAStage, p.a, conv, tid, SwizzledChunk{});
    } else {
      LoadStage<kBm>(sa + slot * kAStage, p.a, p.lda, m0, p.epi.rows, k0, p.depth, tid);
    }
    LoadStage<kBn>(sb + slot * kBStage, p.b, p.ldb, n0, p.np, k0, p.depth, tid);
  };
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < ktiles) load(s, s);
    CpAsyncCommit();
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    CpAsyncWait<kAhead - 1>();  // this thread's copies of stage kt are in
    FenceProxyAsync();          // and visible to the tensor cores' reads
    __syncthreads();            // everyone's are; the slot loaded next is free in both warpgroups
    const int next = kt + kAhead;
    if (next < ktiles) load(next, next % kStages);
    CpAsyncCommit();
    const int slot = kt % kStages;
    const uint64_t da = SmemDesc(sa + slot * kAStage + wg * kMi * 64 * kBk);
    const uint64_t db = SmemDesc(sb + slot * kBStage);
    StageProducts<kMi, kBn>(acc, da, db);
    WgmmaWait<kDrain>();
  }
  WgmmaWait<0>();
#pragma unroll
  for (int i = 0; i < kMi; ++i) FenceAccumulators(acc[i]);
  CpAsyncWait<0>();
  __syncthreads();  // every warpgroup is done with the stages: the accumulators take their place

  Acc* tile = reinterpret_cast<Acc*>(smem);
  StageAccumulators<kMi, kBn>(tile, acc, wg, tid);
  __syncthreads();
  int8_tile::FinishTile<T, Y, kBm, kBn, kThreads>(p, tile, m0, n0, tid, vectors);
#endif  // KILN_WGMMA
}

// The same product with the operands brought in by the Tensor Memory Accelerator: warpgroup 0's
// first thread issues each stage's two box copies (the tensor maps describe A [M, depth] and
// B [Np, depth] with the 128-byte swizzle, rows past the end and K past depth read as zeros) and
// waits for a slot's `empty` barrier before refilling it; warpgroups 1 and 2 wait for a stage's
// `full` barrier (its bytes arrived), multiply, and once the next stage's products are issued
// and this one's are done (wgmma.wait_group 1), release its slot. No thread of the consumers
// copies anything, and the loads run kStages - 1 stages ahead without a block-wide barrier.
// kCluster 2: blocks in clusters of two along M (the grid's row blocks rounded up to even; a
// block past Y reads zeros and writes nothing), each producer loading half of the B rows the
// two share and multicasting them into both blocks; a slot is refilled once all four consumer
// warpgroups released it (each arrives on both blocks' `empty` barrier). Slower than kCluster 1
// at BERT-base's shapes on an H100 (session 35): offered last.
// kMinBlocks 2: two blocks an SM (their stages and staged tile in half the SM's shared memory), so
// that one block's pipeline fill and epilogue run under the other's products. The producer is one
// warp after the consumers (288 threads, 112 registers each; a producer warpgroup would leave 80,
// too few for wgmma's 64 accumulators and its operands). kWideEpilogue: the producer warpgroup,
// idle once its copies are issued, finishes the tile with the consumers (384 threads, not 256).
template <int kMinBlocks>
constexpr int TmaProducerThreads() {
  return kMinBlocks == 2 ? 32 : 128;
}
template <typename Acc, typename T, typename Y, int kMi, int kBn, int kStages, int kCluster,
          int kMinBlocks = 1, bool kWideEpilogue = false>
__global__ void __launch_bounds__(kThreads + TmaProducerThreads<kMinBlocks>(), kMinBlocks)
    Int8WgmmaTmaKernel(const __grid_constant__ CUtensorMap map_a,
                       const __grid_constant__ CUtensorMap map_b, Int8MmaGemmParams p,
                       int8_tile::Vectors vectors) {
#ifdef KILN_WGMMA
  constexpr int kBm = 2 * 64 * kMi;
  constexpr int kAStage = kBm * kBk, kBStage = kBn * kBk;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      smem_raw + ((kSmemAlign - (SmemAddr(smem_raw) & (kSmemAlign - 1))) & (kSmemAlign - 1));
  uint8_t* sa = smem;
  uint8_t* sb = smem + kStages * kAStage;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + StageBytes<kBm, kBn, kStages>());
  uint64_t* empty = full + kStages;
  const int tid = threadIdx.x;
  const uint32_t rank = kCluster == 1 ? 0 : ClusterRank();
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBm;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBn;
  const int ktiles = static_cast<int>((p.depth + kBk - 1) / kBk);
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(&full[s], 1);
      MbarInit(&empty[s], 2 * kCluster);  // each consumer warpgroup of each block
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if constexpr (kCluster > 1) {
    ClusterSync();  // no block multicasts or arrives before its peer's barriers exist
  } else {
    __syncthreads();
  }
  static_assert(kMinBlocks == 1 || (kMinBlocks == 2 && kMi == 1 && kBn <= 128 && kCluster == 1),
                "two blocks an SM hold 64 accumulators a consumer thread at most");
  static_assert(!kWideEpilogue || (kCluster == 1 && kMinBlocks == 1),
                "the wide epilogue: no cluster barrier, the producer's registers");
  constexpr int kEpilogueThreads = kWideEpilogue ? kThreads + 128 : kThreads;
  // The producer: warpgroup 0, or (two blocks an SM) the warp after the consumers' two
  // warpgroups, which must start at warps 0 and 4. One thread issues every copy.
  constexpr bool kLastWarp = kMinBlocks == 2;
  if (kLastWarp ? tid >= kThreads : tid < 128) {
    if (tid == (kLastWarp ? kThreads : 0)) {
      constexpr int kBPart = kBn / kCluster;  // B rows this block loads for the cluster
      for (int kt = 0; kt < ktiles; ++kt) {
        const int slot = kt % kStages, use = kt / kStages;
        if (use > 0) MbarWait(&empty[slot], (use - 1) & 1);
        MbarExpectTx(&full[slot], kAStage + kBStage);
        TmaLoad2d(sa + slot * kAStage, &map_a, kt * kBk, static_cast<int>(m0), &full[slot]);
        if constexpr (kCluster == 1) {
          TmaLoad2d(sb + slot * kBStage, &map_b, kt * kBk, static_cast<int>(n0), &full[slot]);
        } else {
          TmaLoad2dMulticast(sb + slot * kBStage + rank * kBPart * kBk, &map_b, kt * kBk,
                             static_cast<int>(n0 + rank * kBPart), &full[slot],
                             static_cast<uint16_t>((1u << kCluster) - 1));
        }
      }
    }
    if constexpr (kCluster > 1) ClusterSync();  // the consumers' last arrivals, below
    if constexpr (kWideEpilogue) {
      __syncwarp();  // warp 0 whole again after its first thread's copies
      // The consumers' staged tile (named barrier 1 twice, as they pass it below).
      asm volatile("bar.sync 1, %0;\n" ::"n"(kEpilogueThreads) : "memory");
      asm volatile("bar.sync 1, %0;\n" ::"n"(kEpilogueThreads) : "memory");
      int8_tile::FinishTile<T, Y, kBm, kBn, kEpilogueThreads>(p, reinterpret_cast<const Acc*>(smem),
                                                              m0, n0, kThreads + tid, vectors);
    }
    return;
  }
  const int ctid = kLastWarp ? tid : tid - 128, wg = ctid >> 7;
  Acc acc[kMi][kBn / 2];
#pragma unroll
  for (int i = 0; i < kMi; ++i) {
#pragma unroll
    for (int j = 0; j < kBn / 2; ++j) acc[i][j] = 0;
  }
  for (int kt = 0; kt < ktiles; ++kt) {
    const int slot = kt % kStages;
    MbarWait(&full[slot], (kt / kStages) & 1);
    const uint64_t da = SmemDesc(sa + slot * kAStage + wg * kMi * 64 * kBk);
    const uint64_t db = SmemDesc(sb + slot * kBStage);
    StageProducts<kMi, kBn>(acc, da, db);
    WgmmaWait<1>();
    if (kt > 0 && (ctid & 127) == 0) {
      if constexpr (kCluster == 1) {
        MbarArrive(&empty[(kt - 1) % kStages]);
      } else {
        // The slot is refilled in both blocks by both producers: both must see it free.
#pragma unroll
        for (uint32_t r = 0; r < kCluster; ++r) MbarArriveCluster(&empty[(kt - 1) % kStages], r);
      }
    }
  }
  WgmmaWait<0>();
#pragma unroll
  for (int i = 0; i < kMi; ++i) FenceAccumulators(acc[i]);
  // Both consumer warpgroups are done with every stage (named barrier 1: the producer has left,
  // or, for the wide epilogue, waits there too).
  asm volatile("bar.sync 1, %0;\n" ::"n"(kEpilogueThreads) : "memory");
  Acc* tile = reinterpret_cast<Acc*>(smem);
  StageAccumulators<kMi, kBn>(tile, acc, wg, ctid);
  asm volatile("bar.sync 1, %0;\n" ::"n"(kEpilogueThreads) : "memory");
  int8_tile::FinishTile<T, Y, kBm, kBn, kEpilogueThreads>(p, tile, m0, n0, ctid, vectors);
  // The peer's multicasts into this block and its arrivals on this block's barriers have landed
  // (every stage's products here waited for its bytes) before either block leaves.
  if constexpr (kCluster > 1) ClusterSync();
#endif  // KILN_WGMMA
}

// The ping-pong form of the TMA kernel (CUTLASS's "warp-specialized ping-pong" design): a
// persistent block per SM (the grid is the SM count, or the tile count where smaller) walks the
// 128 x 128 tiles blockIdx.x, blockIdx.x + gridDim.x, ...; warpgroup 0 is the producer, whose
// first thread issues every stage of every tile of the block in order; consumer warpgroups 1 and
// 2 take the block's tiles in turn, each a whole tile (two 64-row instructions per K step, 128
// accumulators a thread). Their main loops take turns too (two named barriers pass the turn once
// a consumer has issued its tile's last products), so one consumer's epilogue runs under the
// other's products, where the one-block-per-tile kernels leave the tensor cores idle through
// every epilogue and pipeline fill. The turns also keep each stage's wait within one phase of its
// barrier: a consumer starts waiting for its tile's stages only after the other has seen every
// stage before them land. Each consumer finishes its tile through its own buffer, kChunk columns
// at a time (FinishTile's rolled loop), since the stages belong to the next tiles' copies.
template <int kStages, int kChunk>
struct PingPongLayout {
  static constexpr int kBm = 128, kBn = 128, kMi = 2;
  static constexpr int kAStage = kBm * kBk, kBStage = kBn * kBk;
  static constexpr int kStageBytes = kStages * (kAStage + kBStage);
  static constexpr int kChunkBytes = kBm * (kChunk + int8_tile::kAccPad) * 4;
  static constexpr int kBarriers = kStageBytes + 2 * kChunkBytes;  // full[kStages], empty[kStages]
  static constexpr int kSmem = kBarriers + 2 * kStages * 8 + kSmemAlign;
  static_assert(kBn % kChunk == 0 && kChunk % 8 == 0, "whole chunks of 8-column groups");
  static_assert(kSmem <= kSmemPerBlock, "a Hopper block's shared memory");
};
constexpr int kPingPongThreads = 384;  // the producer warpgroup, then two consumer ones
// Registers per thread after the roles split (setmaxnreg): each of an SM's four quarters holds
// one producer warp and two consumer warps in its 16 K registers, 32 * (40 + 2 * 232) = 16128.
// The launch gives every thread 168; a consumer's 128 accumulators and its epilogue need more.
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
static_assert(32 * (kProducerRegisters + 2 * kConsumerRegisters) <= 16384, "one block per SM");

#ifdef KILN_WGMMA
// Columns [chunk * kChunk, (chunk + 1) * kChunk) of a consumer's accumulators (wgmma's layout:
// warp w, lane (g, t) holds rows 64i + 16w + g and + 8 at columns 8j + 2t and + 1) into buf,
// [64 kMi][kChunk + kAccPad]. chunk must be a constant where this is inlined.
template <int kMi, int kBn, int kChunk, typename Acc>
__device__ __forceinline__ void StageChunk(Acc* buf, const Acc (&acc)[kMi][kBn / 2], int chunk,
                                           int ltid) {
  const int lane = ltid & 31, w = ltid >> 5;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < kMi; ++i) {
#pragma unroll
    for (int jj = 0; jj < kChunk / 8; ++jj) {
      const int j = chunk * (kChunk / 8) + jj;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = i * 64 + w * 16 + g + h * 8, col = jj * 8 + 2 * t;
        Acc* dst = buf + r * (kChunk + int8_tile::kAccPad) + col;
        if constexpr (std::is_same_v<Acc, int>) {
          *reinterpret_cast<int2*>(dst) =
              make_int2(acc[i][4 * j + 2 * h], acc[i][4 * j + 2 * h + 1]);
        } else {
          *reinterpret_cast<float2*>(dst) =
              make_float2(acc[i][4 * j + 2 * h], acc[i][4 * j + 2 * h + 1]);
        }
      }
    }
  }
}

// A consumer warpgroup's own barrier (ids 1 and 2; 0 is __syncthreads').
__device__ __forceinline__ void WarpgroupBarrier(int wg) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
}
// The main loops' turns: named barriers 3 (consumer 0's turn) and 4 (consumer 1's), each
// completed by one consumer's 128 threads waiting and the other's 128 arriving. The wait has the
// bound of MbarWait: the other consumer arrives unless it is stuck on a stage, which traps.
__device__ __forceinline__ void WaitTurn(int wg) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(3 + wg) : "memory");
}
__device__ __forceinline__ void PassTurn(int wg) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(3 + (1 - wg)) : "memory");
}
#endif  // KILN_WGMMA

// kCluster 2: the blocks run in clusters of two along M, on the two 128-row halves of a 256 x 128
// tile pair, and each block's producer loads its own A rows and half of the pair's B rows,
// multicast into both blocks: the pair reads B from L2 once (128 x 128 tiles alone read 113 MB
// for BERT-base's QKV; halving B's share changed little there on an H100, session 35, so L2 is
// not what bounds these products). A slot is refilled only once both blocks' consumers of its
// stage released it (each arrives on both blocks' `empty` barrier), and both blocks stay until
// the last multicast and arrival have landed.
template <typename Acc, typename T, typename Y, int kStages, int kChunk, int kCluster>
__global__ void __launch_bounds__(kPingPongThreads, 1)
    Int8WgmmaPingPongKernel(const __grid_constant__ CUtensorMap map_a,
                            const __grid_constant__ CUtensorMap map_b, Int8MmaGemmParams p,
                            int8_tile::Vectors vectors) {
#ifdef KILN_WGMMA
  static_assert(kCluster == 1 || kCluster == 2, "pairs along M at most");
  using L = PingPongLayout<kStages, kChunk>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem =
      smem_raw + ((kSmemAlign - (SmemAddr(smem_raw) & (kSmemAlign - 1))) & (kSmemAlign - 1));
  uint8_t* sa = smem;
  uint8_t* sb = smem + kStages * L::kAStage;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L::kBarriers);
  uint64_t* empty = full + kStages;
  const int tid = threadIdx.x;
  const uint32_t rank = kCluster == 1 ? 0 : ClusterRank();
  // Tiles of kCluster * 128 rows x 128 columns, each cluster's block `rank` on its rank's rows.
  const int64_t tiles_n = (p.epi.cols + L::kBn - 1) / L::kBn;
  const int64_t tiles = (p.epi.rows + kCluster * L::kBm - 1) / (kCluster * L::kBm) * tiles_n;
  const int64_t first = blockIdx.x / kCluster, step = gridDim.x / kCluster;
  const int ktiles = static_cast<int>((p.depth + kBk - 1) / kBk);
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(&full[s], 1);
      MbarInit(&empty[s], kCluster);  // the stage's consumer in each block of the cluster
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if constexpr (kCluster > 1) {
    ClusterSync();  // no block multicasts or arrives before its peer's barriers exist
  } else {
    __syncthreads();
  }
  if (tid < 128) {  // the producer warpgroup: its first thread issues every copy
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    if (tid == 0) {
      constexpr int kBPart = L::kBn / kCluster;  // B rows this block loads for the cluster
      int64_t stage = 0;                         // stages issued, over all of this block's tiles
      for (int64_t tile = first; tile < tiles; tile += step) {
        const int m0 = static_cast<int>((tile / tiles_n * kCluster + rank) * L::kBm);
        const int n0 = static_cast<int>(tile % tiles_n * L::kBn);
        for (int kt = 0; kt < ktiles; ++kt, ++stage) {
          const int slot = static_cast<int>(stage % kStages);
          const int64_t use = stage / kStages;
          if (use > 0) MbarWait(&empty[slot], static_cast<int>((use - 1) & 1));
          MbarExpectTx(&full[slot], L::kAStage + L::kBStage);
          TmaLoad2d(sa + slot * L::kAStage, &map_a, kt * kBk, m0, &full[slot]);
          if constexpr (kCluster == 1) {
            TmaLoad2d(sb + slot * L::kBStage, &map_b, kt * kBk, n0, &full[slot]);
          } else {
            TmaLoad2dMulticast(sb + slot * L::kBStage + rank * kBPart * kBk, &map_b, kt * kBk,
                               n0 + static_cast<int>(rank) * kBPart, &full[slot],
                               static_cast<uint16_t>((1u << kCluster) - 1));
          }
        }
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
    const int wg = (tid >> 7) - 1, ltid = tid & 127;
    Acc* chunk_buf = reinterpret_cast<Acc*>(smem + L::kStageBytes + wg * L::kChunkBytes);
    // A stage's slot is free once its products are done, in every block of the cluster.
    auto release = [&](int64_t stage) {
      if (ltid != 0) return;
      uint64_t* bar = &empty[stage % kStages];
      if constexpr (kCluster == 1) {
        MbarArrive(bar);
      } else {
#pragma unroll
        for (uint32_t r = 0; r < kCluster; ++r) MbarArriveCluster(bar, r);
      }
    };
    if (wg == 1) PassTurn(wg);  // consumer 0 has the first turn
    Acc acc[L::kMi][L::kBn / 2];
    // The block's j-th tile is consumer j % 2's, and its stages are j * ktiles onwards.
    int64_t j = wg;
    for (int64_t tile = first + wg * step; tile < tiles; tile += 2 * step, j += 2) {
      const int64_t m0 = (tile / tiles_n * kCluster + rank) * L::kBm, n0 = tile % tiles_n * L::kBn;
#pragma unroll
      for (int i = 0; i < L::kMi; ++i) {
#pragma unroll
        for (int k = 0; k < L::kBn / 2; ++k) acc[i][k] = 0;
      }
      WaitTurn(wg);
      int64_t stage = j * ktiles;
      for (int kt = 0; kt < ktiles; ++kt, ++stage) {
        const int slot = static_cast<int>(stage % kStages);
        MbarWait(&full[slot], static_cast<int>((stage / kStages) & 1));
        const uint64_t da = SmemDesc(sa + slot * L::kAStage);
        const uint64_t db = SmemDesc(sb + slot * L::kBStage);
        StageProducts<L::kMi, L::kBn>(acc, da, db);
        WgmmaWait<1>();  // the previous stage's products are done: its slot is free
        if (kt > 0) release(stage - 1);
      }
      PassTurn(wg);  // every product of the tile is issued: the other consumer's main loop may run
      WgmmaWait<0>();
#pragma unroll
      for (int i = 0; i < L::kMi; ++i) FenceAccumulators(acc[i]);
      if (ktiles > 0) release(stage - 1);  // the tile's last
#pragma unroll 1
      // One copy of FinishTile (its loop is not unrolled); the staging, which must name
      // registers, picks its constant chunk.
      for (int chunk = 0; chunk < L::kBn / kChunk; ++chunk) {
#pragma unroll
        for (int k = 0; k < L::kBn / kChunk; ++k) {
          if (k == chunk) StageChunk<L::kMi, L::kBn, kChunk>(chunk_buf, acc, k, ltid);
        }
        WarpgroupBarrier(wg);
        int8_tile::FinishTile<T, Y, L::kBm, kChunk, 128>(p, chunk_buf, m0, n0 + chunk * kChunk,
                                                         ltid, vectors);
        WarpgroupBarrier(wg);  // read before the next chunk is staged
      }
    }
  }
  // The peer's last multicast into this block and its last arrivals on this block's barriers
  // land before either block leaves.
  if constexpr (kCluster > 1) ClusterSync();
#endif  // KILN_WGMMA
}

// Records whether the code the device loaded for this file has the wgmma instructions.
__global__ void WgmmaProbeKernel(int* out) {
#ifdef KILN_WGMMA
  *out = 1;
#else
  *out = 0;
#endif
}

// A phase that never completes: one thread waits on a barrier nobody arrives at, for
// LaunchMbarWaitTimeoutProbe.
__global__ void MbarTimeoutProbeKernel(uint64_t timeout_ns) {
#ifdef KILN_WGMMA
  __shared__ uint64_t bar;
  MbarInit(&bar, 1);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  MbarWait(&bar, 0, timeout_ns);
#endif
}

struct TileConfig {
  const char* name;
  int rows;  // kBm = 2 * 64 * kMi of LaunchTiled's case
  int cols;  // kBn
  // Int8WgmmaTileOrder's shape model moves it: the TMA tiles of one block a tile, one block an
  // SM, at least 128 x 192 (one kernel, alike in their work per output, so their waves are what
  // sets them apart). Not the 128 x 128 tiles (a third more operand bytes per output than 128 x
  // 256, which a model of waves alone does not see), the cp.async tiles, the persistent ones or the
  // cluster one.
  bool waves;
  bool gpu_tested;  // Int8WgmmaTileGpuTested
};
// Index = Int8MmaGemmParams::tile.
constexpr TileConfig kTiles[] = {{"128x128", 128, 128, false, true},
                                 {"128x256", 128, 256, false, true},
                                 {"128x128x2", 128, 128, false, true},
                                 {"256x128", 256, 128, false, true},
                                 {"tma-128x128", 128, 128, false, true},
                                 {"tma-128x256", 128, 256, true, true},
                                 {"tma-256x128", 256, 128, true, true},
                                 {"pp-128x128", 128, 128, false, true},
                                 {"ppc2-128x128", 128, 128, false, true},
                                 {"tmac2-128x256", 128, 256, false, true},
                                 // Session 38's, first run in session 39 (H100).
                                 {"tma-256x96", 256, 96, true, true},
                                 {"tma-128x192", 128, 192, true, true},
                                 {"128x64x2", 128, 64, false, true},
                                 // Session 40's, not yet run on a GPU.
                                 {"tma2-128x128", 128, 128, false, false},
                                 {"tmae-128x192", 128, 192, false, false},
                                 {"tmae-256x128", 256, 128, false, false}};

constexpr int kNarrowTile = 12;  // 128x64x2: the only tile of 64 columns
static_assert(kTiles[kNarrowTile].cols == 64);

// cuTensorMapEncodeTiled, a driver function, through the runtime's entry point (kiln links the
// runtime only).
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiledFn EncodeTiled() {
  static const EncodeTiledFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return EncodeTiledFn{nullptr};
    }
    return reinterpret_cast<EncodeTiledFn>(f);
  }();
  return fn;
}

// A [rows, depth] int8 operand (row stride ld bytes) in boxes of box_rows x kBk bytes, in the
// 128-byte swizzle; reads past either end fill zeros.
cudaError_t MakeOperandMap(CUtensorMap* map, const int8_t* base, int64_t rows, int64_t depth,
                           int64_t ld, int box_rows) {
  const EncodeTiledFn encode = EncodeTiled();
  if (!encode) return cudaErrorNotSupported;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(depth), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld)};
  const cuuint32_t box[2] = {kBk, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<int8_t*>(base), dims, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// The two operand maps of a TMA kernel, A in boxes of a_rows rows and B of b_rows; an error where
// the copies' 32-bit coordinates could overflow (a cluster's last block may start a tile past Y).
cudaError_t MakeOperandMaps(const Int8MmaGemmParams& p, int a_rows, int b_rows, CUtensorMap* map_a,
                            CUtensorMap* map_b) {
  if (p.epi.rows > 2147483647 - a_rows || p.np > 2147483647 || p.depth > 2147483647) {
    return cudaErrorInvalidConfiguration;
  }
  cudaError_t e = MakeOperandMap(map_a, p.a, p.epi.rows, p.depth, p.lda, a_rows);
  if (e == cudaSuccess) e = MakeOperandMap(map_b, p.b, p.np, p.depth, p.ldb, b_rows);
  return e;
}

// Launches a TMA kernel (arguments: the operand maps, p and the epilogue's vectors) with `smem`
// bytes of dynamic shared memory, in clusters of `cluster` blocks.
template <typename Y, typename... Args>
cudaError_t LaunchTmaKernel(void (*kernel)(Args...), dim3 grid, int threads, int smem, dim3 cluster,
                            const CUtensorMap& map_a, const CUtensorMap& map_b,
                            const Int8MmaGemmParams& p, cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = cluster.x;
  attr.val.clusterDim.y = cluster.y;
  attr.val.clusterDim.z = cluster.z;
  config.attrs = &attr;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, map_a, map_b, p, int8_tile::VectorsFor<Y>(p));
}

template <typename Acc, typename T, typename Y, int kMi, int kBn, int kStages, int kCluster = 1,
          int kMinBlocks = 1, bool kWideEpilogue = false>
cudaError_t LaunchTmaTile(const Int8MmaGemmParams& p, cudaStream_t stream) {
  constexpr int kBm = 2 * 64 * kMi;
  constexpr int kSmem = SmemBytes<kBm, kBn, kStages>();
  static_assert(kSmem <= kSmemPerBlock, "a Hopper block's shared memory");
  static_assert(kMinBlocks * (kSmem + 1024) <= kSmemPerSm, "kMinBlocks blocks' shared memory");
  auto* kernel =
      Int8WgmmaTmaKernel<Acc, T, Y, kMi, kBn, kStages, kCluster, kMinBlocks, kWideEpilogue>;
  static SharedMemoryOptIn opt_in;
  if (cudaError_t e = opt_in.For(kernel, kSmem); e != cudaSuccess) return e;
  dim3 grid;
  CUtensorMap map_a, map_b;
  cudaError_t e = int8_tile::TileGrid(p, kBm, kBn, &grid);
  if (e == cudaSuccess) e = MakeOperandMaps(p, kBm, kBn / kCluster, &map_a, &map_b);
  if (e != cudaSuccess) return e;
  grid.y = (grid.y + kCluster - 1) / kCluster * kCluster;  // whole clusters along M
  if (grid.y > kInt8MaxRowBlocks) return cudaErrorInvalidConfiguration;
  return LaunchTmaKernel<Y>(kernel, grid, kThreads + TmaProducerThreads<kMinBlocks>(), kSmem,
                            dim3(1, kCluster, 1), map_a, map_b, p, stream);
}

// The device's SM count, once per device.
int SmCount() {
  static std::array<std::atomic<int>, 64> known{};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 ||
      device >= static_cast<int>(known.size())) {
    return 0;
  }
  int n = known[device].load(std::memory_order_relaxed);
  if (n == 0 && cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) == cudaSuccess) {
    known[device].store(n, std::memory_order_relaxed);
  }
  return n;
}

template <typename Acc, typename T, typename Y, int kStages, int kChunk, int kCluster>
cudaError_t LaunchPingPongTile(const Int8MmaGemmParams& p, cudaStream_t stream) {
  using L = PingPongLayout<kStages, kChunk>;
  auto* kernel = Int8WgmmaPingPongKernel<Acc, T, Y, kStages, kChunk, kCluster>;
  static SharedMemoryOptIn opt_in;
  if (cudaError_t e = opt_in.For(kernel, L::kSmem); e != cudaSuccess) return e;
  const int64_t tiles = (p.epi.rows + kCluster * L::kBm - 1) / (kCluster * L::kBm) *
                        ((p.epi.cols + L::kBn - 1) / L::kBn);
  const int sms = SmCount();
  if (sms < kCluster) return cudaErrorInvalidDevice;
  CUtensorMap map_a, map_b;
  if (cudaError_t e = MakeOperandMaps(p, L::kBm, L::kBn / kCluster, &map_a, &map_b);
      e != cudaSuccess) {
    return e;
  }
  const int64_t clusters = tiles < sms / kCluster ? tiles : sms / kCluster;
  return LaunchTmaKernel<Y>(kernel, dim3(static_cast<unsigned>(clusters * kCluster)),
                            kPingPongThreads, L::kSmem, dim3(kCluster, 1, 1), map_a, map_b, p,
                            stream);
}

template <typename Acc, typename T, typename Y, int kMi, int kBn, int kStages, int kDrain,
          int kMinBlocks, bool kConv = false>
cudaError_t LaunchTile(const Int8MmaGemmParams& p, cudaStream_t stream,
                       const ImplicitGemmConv& conv = {}) {
  constexpr int kBm = 2 * 64 * kMi;
  constexpr int kSmem = SmemBytes<kBm, kBn, kStages>();
  // kMinBlocks blocks an SM, each with the 1 KB the runtime reserves a block.
  static_assert(kMinBlocks * (kSmem + 1024) <= kSmemPerSm, "kMinBlocks blocks' shared memory");
  auto* kernel = Int8WgmmaGemmKernel<Acc, T, Y, kMi, kBn, kStages, kDrain, kMinBlocks, kConv>;
  static SharedMemoryOptIn opt_in;
  if (cudaError_t e = opt_in.For(kernel, kSmem); e != cudaSuccess) return e;
  dim3 grid;
  if (cudaError_t e = int8_tile::TileGrid(p, kBm, kBn, &grid); e != cudaSuccess) return e;
  kernel<<<grid, kThreads, kSmem, stream>>>(p, int8_tile::VectorsFor<Y>(p), conv);
  return cudaGetLastError();
}

// kTiles' rows are the cases' kBm = 2 * 64 * kMi below.
static_assert(kTiles[0].rows == 128 && kTiles[1].rows == 128 && kTiles[2].rows == 128 &&
              kTiles[3].rows == 256 && kTiles[4].rows == 128 && kTiles[5].rows == 128 &&
              kTiles[6].rows == 256 && kTiles[7].rows == 128 && kTiles[8].rows == 128 &&
              kTiles[9].rows == 128 && kTiles[10].rows == 256 && kTiles[11].rows == 128 &&
              kTiles[12].rows == 128 && kTiles[13].rows == 128 && kTiles[14].rows == 128 &&
              kTiles[15].rows == 256);
static_assert(kTiles[0].cols == 128 && kTiles[1].cols == 256 && kTiles[2].cols == 128 &&
              kTiles[3].cols == 128 && kTiles[4].cols == 128 && kTiles[5].cols == 256 &&
              kTiles[6].cols == 128 && kTiles[7].cols == 128 && kTiles[8].cols == 128 &&
              kTiles[9].cols == 256 && kTiles[10].cols == 96 && kTiles[11].cols == 192 &&
              kTiles[12].cols == 64 && kTiles[13].cols == 128 && kTiles[14].cols == 192 &&
              kTiles[15].cols == 128);

// The tile p.tile names. kConv: A is the implicit-GEMM view `conv` (the cp.async tiles only,
// Int8WgmmaTileGathers: a tensor map cannot gather).
template <typename Acc, typename T, typename Y, bool kConv = false>
cudaError_t LaunchTiled(const Int8MmaGemmParams& p, cudaStream_t stream,
                        const ImplicitGemmConv& conv = {}) {
  switch (p.tile) {
    case 0:  // 6 stages of 32 KB, one block per SM
      return LaunchTile<Acc, T, Y, 1, 128, 6, 1, 1, kConv>(p, stream, conv);
    case 1:  // 4 stages of 48 KB, one block per SM, 128 accumulators per thread
      return LaunchTile<Acc, T, Y, 1, 256, 4, 1, 1, kConv>(p, stream, conv);
    case 2:  // 3 stages of 32 KB: two blocks per SM
      return LaunchTile<Acc, T, Y, 1, 128, 3, 0, 2, kConv>(p, stream, conv);
    case 3:  // 4 stages of 48 KB, one block per SM, two 64-row tiles per warpgroup
      return LaunchTile<Acc, T, Y, 2, 128, 4, 1, 1, kConv>(p, stream, conv);
    case 12:  // 4 stages of 24 KB, two blocks per SM: 64 columns (a narrow Y's)
      return LaunchTile<Acc, T, Y, 1, 64, 4, 0, 2, kConv>(p, stream, conv);
  }
  if constexpr (!kConv) {
    switch (p.tile) {
      case 4:  // the TMA kernel: 6 stages of 32 KB
        return LaunchTmaTile<Acc, T, Y, 1, 128, 6>(p, stream);
      case 5:  // 4 stages of 48 KB
        return LaunchTmaTile<Acc, T, Y, 1, 256, 4>(p, stream);
      case 6:
        return LaunchTmaTile<Acc, T, Y, 2, 128, 4>(p, stream);
      case 7:  // ping-pong: 5 stages of 32 KB, 32-column chunks of the epilogue
        return LaunchPingPongTile<Acc, T, Y, 5, 32, 1>(p, stream);
      case 8:  // the same in clusters of two along M, B multicast
        return LaunchPingPongTile<Acc, T, Y, 5, 32, 2>(p, stream);
      case 9:  // tma-128x256 in clusters of two along M, B multicast
        return LaunchTmaTile<Acc, T, Y, 1, 256, 4, 2>(p, stream);
      case 10:  // 4 stages of 44 KB; two 64 x 96 products per warpgroup and K step
        return LaunchTmaTile<Acc, T, Y, 2, 96, 4>(p, stream);
      case 11:  // 4 stages of 40 KB
        return LaunchTmaTile<Acc, T, Y, 1, 192, 4>(p, stream);
      case 13:  // 3 stages of 32 KB, two blocks per SM
        return LaunchTmaTile<Acc, T, Y, 1, 128, 3, 1, 2>(p, stream);
      case 14:  // tma-128x192 with the producer warpgroup in the epilogue
        return LaunchTmaTile<Acc, T, Y, 1, 192, 4, 1, 1, true>(p, stream);
      case 15:  // tma-256x128 with the producer warpgroup in the epilogue
        return LaunchTmaTile<Acc, T, Y, 2, 128, 4, 1, 1, true>(p, stream);
    }
  }
  return cudaErrorInvalidValue;
}

}  // namespace

int Int8WgmmaTileCount() { return static_cast<int>(sizeof(kTiles) / sizeof(kTiles[0])); }

const char* Int8WgmmaTileName(int tile) {
  return tile >= 0 && tile < Int8WgmmaTileCount() ? kTiles[tile].name : "?";
}

int Int8WgmmaTileRows(int tile) {
  return tile >= 0 && tile < Int8WgmmaTileCount() ? kTiles[tile].rows : 0;
}

bool Int8WgmmaTileGpuTested(int tile) {
  return tile >= 0 && tile < Int8WgmmaTileCount() && kTiles[tile].gpu_tested;
}

const std::vector<int>& Int8WgmmaTileOrder(WgmmaTileUse use) {
  static const std::vector<int> product = {5, 6, 11, 10, 2, 4, 0, 3, 1, 12, 7, 8, 9, 13, 14, 15},
                                pointwise = {5, 2, 6, 11, 10, 4, 0, 3, 1, 12, 7, 8, 9, 13, 14, 15},
                                gather = {2, 0, 3, 1, 12};
  switch (use) {
    case WgmmaTileUse::kProduct:
      return product;
    case WgmmaTileUse::kPointwiseConv:
      return pointwise;
    case WgmmaTileUse::kGatherConv:
      break;
  }
  return gather;
}

std::vector<int> Int8WgmmaTileOrder(WgmmaTileUse use, int64_t rows, int64_t cols, int sms) {
  const std::vector<int>& order = Int8WgmmaTileOrder(use);
  // `tile` first, then the use's order: its first tile (the fastest measured at the shapes it
  // was chosen for) second, so a search that times two tiles a family times it too.
  auto first = [&](int tile) {
    std::vector<int> out = {tile};
    for (int t : order) {
      if (t != tile) out.push_back(t);
    }
    return out;
  };
  // Every other tile is at least twice as wide: half or more of its products would be on padding.
  if (cols > 0 && cols <= kTiles[kNarrowTile].cols) return first(kNarrowTile);
  if (rows <= 0 || cols <= 0 || sms <= 0 || use == WgmmaTileUse::kPointwiseConv) return order;
  // A tile's predicted time, in units of one SM's time for one output of the depth: its waves
  // of blocks (one block an SM) times one block's outputs. Two blocks sharing an SM (the cp.async
  // tiles of two blocks an SM) take as long as they would one after the other, so the waves count
  // by the SM count for them too.
  auto predicted = [&](int t) {
    const TileConfig& c = kTiles[t];
    auto blocks = [](int64_t n, int per) { return n / per + (n % per != 0); };
    const double tiles = static_cast<double>(blocks(rows, c.rows)) * blocks(cols, c.cols);
    return std::ceil(tiles / sms) * c.rows * c.cols;
  };
  if (use == WgmmaTileUse::kGatherConv) {
    // Between the gathering tiles alike but in width (128x128x2, the first, and 128x64x2): the
    // narrow one first where its blocks fill more of the SMs, more than 10% faster by the model
    // (ResNet-50's layer 4 3x3 at batch 32, 1568 x 512: 104 blocks of 128 x 64, one wave, against
    // 52 of 128 x 128 on 132 SMs). It gathers A once for 64 outputs, not 128, which the model does
    // not see; the use's first stays second, so a search of two tiles times both.
    const int wide = order[0];
    if (kTiles[wide].rows == kTiles[kNarrowTile].rows &&
        1.1 * predicted(kNarrowTile) < predicted(wide)) {
      return first(kNarrowTile);
    }
    return order;
  }
  int pick = -1;  // the model's fastest (the earliest in the order among equals)
  for (int t : order) {
    if (kTiles[t].waves && (pick < 0 || predicted(t) < predicted(pick))) pick = t;
  }
  if (pick < 0 || !kTiles[order[0]].waves || 1.1 * predicted(pick) >= predicted(order[0])) {
    return order;
  }
  return first(pick);
}

int Int8WgmmaSmCount() { return SmCount(); }

bool Int8WgmmaAvailable() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
      major != 9 || minor != 0) {
    return false;
  }
  // Once per device: sm_90a machine code runs only on compute capability 9.0 itself, and a build
  // without it gives the device PTX or sm_90 code, where the probe writes 0.
  static std::mutex mu;
  static std::array<int, 64> known{};  // 0 unknown, 1 yes, 2 no
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0 || device >= static_cast<int>(known.size())) return false;
  if (known[device] == 0) {
    int* flag = nullptr;
    int host = 0;
    bool ok = cudaMalloc(&flag, sizeof(int)) == cudaSuccess;
    if (ok) {
      WgmmaProbeKernel<<<1, 1>>>(flag);
      ok = cudaGetLastError() == cudaSuccess &&
           cudaMemcpy(&host, flag, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess;
      cudaFree(flag);
    }
    known[device] = ok && host == 1 ? 1 : 2;
  }
  return known[device] == 1;
}

cudaError_t LaunchMbarWaitTimeoutProbe(uint64_t timeout_ns, cudaStream_t stream) {
  MbarTimeoutProbeKernel<<<1, 1, 0, stream>>>(timeout_ns);
  return cudaGetLastError();
}

cudaError_t LaunchInt8WgmmaGemm(const Int8MmaGemmParams& p, cudaStream_t stream) {
  return int8_tile::DispatchOwnKernel<int8_t>(
      p, [&](auto t, auto y) { return LaunchTiled<int, decltype(t), decltype(y)>(p, stream); });
}

cudaError_t LaunchInt8WgmmaConv(const Int8MmaGemmParams& p, const ImplicitGemmConv& conv,
                                cudaStream_t stream) {
  if (!ImplicitGemmLaunchable(conv, p.epi.rows, p.depth)) return cudaErrorInvalidValue;
  return int8_tile::DispatchOwnKernel<int8_t>(p, [&](auto t, auto y) {
    return LaunchTiled<int, decltype(t), decltype(y), true>(p, stream, conv);
  });
}

int Int8WgmmaConvTileCount() {
  return static_cast<int>(Int8WgmmaTileOrder(WgmmaTileUse::kGatherConv).size());
}

bool Int8WgmmaTileGathers(int tile) {
  const std::vector<int>& gather = Int8WgmmaTileOrder(WgmmaTileUse::kGatherConv);
  return std::find(gather.begin(), gather.end(), tile) != gather.end();
}

cudaError_t LaunchFp8WgmmaGemm(const Int8MmaGemmParams& p, cudaStream_t stream) {
  return int8_tile::DispatchOwnKernel<int8_tile::E4m3Out>(
      p, [&](auto t, auto y) { return LaunchTiled<float, decltype(t), decltype(y)>(p, stream); });
}

}  // namespace kiln::cuda
