// Launchers for the kernels around the INT8 cuBLASLt product (int8_gemm.cu): quantizing the
// activations into the padded int8 layout cuBLASLt's IMMA kernels take, and the epilogue that
// dequantizes the int32 result per output channel, adds bias/C and applies the activation. Plain
// structs and cudaError_t only, like blas_kernels.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kiln/backends/cuda/blas_kernels.h"

namespace kiln::cuda {

// q[i * ldq + k] = QuantizeInt8(x(i, k), inv_scale) for k < depth, 0 for depth <= k < ldq, over
// rows x ldq; x(i, k) is x[i * row_stride + k * col_stride] in storage type `type`. ldq must be a
// multiple of 4 and q 4-byte aligned (every thread writes four bytes at once).
struct Int8QuantizeParams {
  const void* x = nullptr;
  BlasType type = BlasType::kF32;
  int8_t* q = nullptr;
  int64_t rows = 0, depth = 0, ldq = 0;
  int64_t row_stride = 0, col_stride = 1;
  float inv_scale = 1.f;
};
cudaError_t LaunchInt8Quantize(const Int8QuantizeParams& p, cudaStream_t stream);

// y[r, c] = act(float(acc[r * ld_acc + c]) * col_scale[c] + beta * C[r * c_row_stride + c *
// c_col_stride]) for rows x cols (y row-major, no gaps, storage `type`; C of the same type, may
// be null). col_scale is on the device: alpha * activation scale * weight scale per channel.
// z: a residual of Y's shape (rows x cols, no gaps, storage `type`) added before the activation,
// after C; kiln's own kernels only (LaunchInt8Epilogue declines it).
struct Int8EpilogueParams {
  const int32_t* acc = nullptr;
  int64_t ld_acc = 0;
  const float* col_scale = nullptr;
  void* y = nullptr;
  BlasType type = BlasType::kF32;
  int64_t rows = 0, cols = 0;
  const void* c = nullptr;
  int64_t c_row_stride = 0, c_col_stride = 0;
  float beta = 1.f;
  const void* z = nullptr;
  BlasAct act = BlasAct::kNone;
  float act_min = 0.f, act_max = 0.f;
};
cudaError_t LaunchInt8Epilogue(const Int8EpilogueParams& p, cudaStream_t stream);

// kiln's own INT8 product with that epilogue fused (int8_mma_gemm.cu, sm_80+): y[r, c] for r < m,
// c < n (epi's rows and cols) as epi computes it, from acc = A [m, depth] (row stride lda) times
// B [np, depth]^T (row stride ldb), both int8 with each row's depth bytes contiguous: depth, lda
// and ldb multiples of 16, A and B 16-byte aligned, np >= n a multiple of 16, col_scale
// 16-byte aligned with np entries.
// `tile` picks the block shape, 0 <= tile < Int8MmaTileCount(). y_quantized: Y is int8 (an INT8
// edge's producer), each value quantized by the INT8 contract with y_inv_scale after the
// activation (E4M3 by the FP8 contract in LaunchFp8WgmmaGemm); epi.type stays the float type of C
// and of the arithmetic.
struct Int8MmaGemmParams {
  const int8_t* a = nullptr;
  const int8_t* b = nullptr;
  int64_t lda = 0, ldb = 0, np = 0, depth = 0;
  Int8EpilogueParams epi;  // rows = m, cols = n; acc and ld_acc unused (no int32 result)
  bool y_quantized = false;
  float y_inv_scale = 1.f;
  int tile = 0;
};
cudaError_t LaunchInt8MmaGemm(const Int8MmaGemmParams& p, cudaStream_t stream);
int Int8MmaTileCount();
const char* Int8MmaTileName(int tile);  // "128x128": the block's rows x columns of Y
int Int8MmaTileRows(int tile);          // the block's rows of Y (0 for no tile)

// A launch of these kernels puts Y's row blocks on the grid's y extent, at most 65535 of them:
// whether `rows` rows fit a tile of `tile_rows` rows. The providers offer no tile they do not
// fit (a launch would fail with cudaErrorInvalidConfiguration).
inline constexpr int64_t kInt8MaxRowBlocks = 65535;
inline bool Int8TileFitsRows(int64_t rows, int tile_rows) {
  // Rounded up without rows + tile_rows - 1, which could pass int64 for a saturated size.
  return tile_rows > 0 && rows / tile_rows + (rows % tile_rows != 0) <= kInt8MaxRowBlocks;
}

// The same product on Hopper's warpgroup tensor cores (int8_wgmma_gemm.cu): the contract and
// operand requirements of LaunchInt8MmaGemm, `tile` in [0, Int8WgmmaTileCount()). It runs where
// Int8WgmmaAvailable(): a compute capability 9.0 device, and this build carries sm_90a machine
// code (KILN_CUDA_ARCHS' 90a-real), which the device is asked once.
cudaError_t LaunchInt8WgmmaGemm(const Int8MmaGemmParams& p, cudaStream_t stream);
int Int8WgmmaTileCount();
const char* Int8WgmmaTileName(int tile);
int Int8WgmmaTileRows(int tile);  // as Int8MmaTileRows
// Whether the tile has passed the GPU tests that name every tile (OwnWarpgroupKernelRunsEveryTile,
// INT8 and FP8, and the INT8 convolution tests, on a Hopper GPU). The providers offer an untested
// tile only where KILN_CUDA_WGMMA_TILES names it (cublaslt_util.h), so that no build picks a
// kernel that has never been checked against the CPU contract. Every tile up to 128x64x2 has
// passed them (session 39, H100); session 40's three, written without a GPU, have not.
bool Int8WgmmaTileGpuTested(int tile);
bool Int8WgmmaAvailable();
// What the warpgroup kernel's tiles serve: a product (MatMul, Gemm; INT8 or FP8), a pointwise
// convolution (a product over the pixels) or a gathering convolution (the cp.async tiles only).
enum class WgmmaTileUse : int { kProduct, kPointwiseConv, kGatherConv };
// The tiles in the order the providers offer them, the likeliest fastest first, so a tactic search
// that times the first few of each family (TacticsPerProvider: two at the default opt level)
// times those: for a product, tma-128x256 then tma-256x128 (between them the fastest of every
// tile on BERT-base's four products at batch 32; 128x128x2 was 12-22% slower on QKV and fc1:
// H100, sessions 35 and 36); for a pointwise convolution, tma-128x256 then 128x128x2 (30-45%
// faster than either TMA tile on most of ResNet-50's pointwise convolutions, whose N or K is
// 64-256: session 36, which saw ResNet-50 INT8 lose 6% end to end when the order put tma-256x128
// second); the ping-pong and cluster tiles last; for a gathering convolution 128x128x2 then
// 128x128 (session 34). tma-128x192 and tma-256x96 follow the product's two (and the pointwise
// convolution's three): they fill the last wave of blocks where the others leave SMs idle (below).
// 128x64x2 comes before the ping-pong and cluster tiles (and last for a gathering convolution);
// the shape's order puts it first for a narrow output (below). Session 40's TMA tiles, not yet
// GPU-tested (tma2-128x128, tmae-128x192, tmae-256x128), come last for products and pointwise
// convolutions. Every tile appears once.
const std::vector<int>& Int8WgmmaTileOrder(WgmmaTileUse use);
// The order for a product of rows x cols outputs on a device of `sms` SMs: the use's order, with
// the fastest by a model of waves moved to the front where the model predicts it more than 10%
// faster than the use's first tile, which stays second (a search that times two tiles a family
// still times it). The model weighs the one-block-an-SM TMA tiles of at least 128 x 192
// (tma-128x256, tma-256x128, tma-128x192, tma-256x96: one kernel, alike in work per output): a
// tile's predicted time is its waves of blocks (its tile count over the SM count, rounded up)
// times one block's rows x cols. BERT-base's QKV at batch 32 (4096 x 2304) is 288 tiles of
// 128 x 256 on an H100's 132 SMs, three waves of which the last keeps 24 SMs busy, where 384
// tiles of 128 x 192 fill three waves; its output projection and fc2 (4096 x 768) are 96 tiles of
// 128 x 256 (one wave on 96 SMs) against 128 of 128 x 192. A gathering convolution: the same
// model between 128x128x2 and 128x64x2 (two blocks an SM, alike but in width), the narrow one
// first where it is more than 10% faster by it (ResNet-50's layer 4 3x3: 104 blocks of 128 x 64
// in one wave against 52 of 128 x 128), the use's first second. Pointwise convolutions, and a
// shape of unknown size (rows or cols 0) or device (sms 0), take the use's order. For any use, an
// output of at most 64 columns (cols 1-64) puts 128x64x2 first, the only tile that narrow: every
// other is 128 or more columns wide, so half or more of its products would be on padding
// (ResNet-50's stem and layer 1, 64 channels: their INT8 convolutions took 2-2.5x FP16's time on
// 128-column tiles, H100, session 36).
std::vector<int> Int8WgmmaTileOrder(WgmmaTileUse use, int64_t rows, int64_t cols, int sms);
// The current device's SM count (0 where it cannot be read).
int Int8WgmmaSmCount();

// The FP8 product on the same kernels (wgmma's E4M3 x E4M3 -> FP32): a and b hold E4M3 bytes
// ([M, depth] and [np, depth], the layout and requirements above), col_scale alpha * A's scale *
// B's scale (per tensor, repeated; 0 in the padding), y_quantized an E4M3 Y (an FP8 edge's
// producer: the value rounded to epi.type, times y_inv_scale, saturated to +-448). The tensor
// cores sum each product in their own FP32 accumulators over the whole depth, as cuBLASLt's
// "fast accumulation" does. Runs where Int8WgmmaAvailable(); tile in [0, Int8WgmmaTileCount()).
cudaError_t LaunchFp8WgmmaGemm(const Int8MmaGemmParams& p, cudaStream_t stream);

// An INT8 NHWC convolution on the same kernels (implicit GEMM, implicit_gemm_conv.h): p.a is the
// quantized input x [N, H, W, conv.cp], p.b the packed weights [np, R * S * Cp], p.depth
// conv.depth(), epi.rows conv.rows(), Y [N * OH * OW, K] (NHWC) with the epilogue of
// LaunchInt8MmaGemm; lda is not read (the loader gathers A's rows) but must be a multiple of 16.
// The cp.async tiles only: a tile where Int8WgmmaTileGathers. conv_int8.cc's provider offers it
// (written without a GPU, sessions 30-31).
struct ImplicitGemmConv;
cudaError_t LaunchInt8WgmmaConv(const Int8MmaGemmParams& p, const ImplicitGemmConv& conv,
                                cudaStream_t stream);
// The tiles that gather (the cp.async ones: 128x128, 128x256, 128x128x2, 256x128, 128x64x2), and
// how many there are (Int8WgmmaTileOrder(kGatherConv)'s).
bool Int8WgmmaTileGathers(int tile);
int Int8WgmmaConvTileCount();

// The same convolution on kiln's mma.sync kernel (int8_mma_gemm.cu, sm_80+), every tile of
// LaunchInt8MmaGemm, with the same operands and requirements (lda is not read).
cudaError_t LaunchInt8MmaConv(const Int8MmaGemmParams& p, const ImplicitGemmConv& conv,
                              cudaStream_t stream);

// The bound of the TMA kernels' barrier waits, for its test: one thread waits on a barrier phase
// that never completes and traps after timeout_ns, so the stream's next synchronisation reports
// an error (a trap: cudaErrorLaunchFailure) and the process's CUDA context is lost (run it in a
// child process). A build without sm_90a code launches an empty kernel.
cudaError_t LaunchMbarWaitTimeoutProbe(uint64_t timeout_ns, cudaStream_t stream);

}  // namespace kiln::cuda
