// Launchers for kiln's own CUDA kernels that go with the cuBLASLt matrix products and the fused
// attention (blas_kernels.cu, attention.cu). Plain structs and cudaError_t only, so that the
// .cu files stay free of kiln's C++ headers and the .cc providers free of device code.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::cuda {

// Storage types the kernels handle; the providers map DataType onto these.
enum class BlasType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

// kiln::FusedActivation's values, from the same list (activations.inc is plain macros, so the .cu
// files stay free of kiln's C++ headers); the device formulas are in activation.cuh.
enum class BlasAct : int {
#define KILN_ACTIVATION(kind, name, source, formula) k##kind,
#include "kiln/ops/activations.inc"
#undef KILN_ACTIVATION
};

// y[r, c] = act(acc[r, c] + beta * C[r * c_row_stride + c * c_col_stride]), rows x cols
// row-major. acc is FP32 (the matmul's unrounded result; may alias y when y is FP32); C and y
// have type `type`; C may be null. One launch, every element computed in FP32.
// acc == nullptr: y already holds the product in `type` (cuBLASLt wrote it, bias included) and
// the activation is applied in place; C must be null then.
struct GemmEpilogueParams {
  const float* acc = nullptr;
  int64_t acc_ld = 0;  // acc's row stride in elements; 0: cols (acc dense like y)
  void* y = nullptr;
  BlasType type = BlasType::kF32;
  int64_t rows = 0, cols = 0;
  const void* c = nullptr;
  int64_t c_row_stride = 0, c_col_stride = 0;
  float beta = 1.f;
  BlasAct act = BlasAct::kNone;
  float act_min = 0.f, act_max = 0.f;
  // Set (with y null) to write Y as FP8 E4M3 instead: each result rounded to `type` first, then
  // E4M3(value * y_inv_scale) with saturation, as the FP8 contract quantizes a stored activation
  // (an FP8 edge's producer, ops/quant_edge.h). Needs acc.
  uint8_t* y_e4m3 = nullptr;
  float y_inv_scale = 1.f;
};
cudaError_t LaunchGemmEpilogue(const GemmEpilogueParams& p, cudaStream_t stream);

// GatedActivation: y[r, j] = act(a[r * stride + j]) * b[r * stride + j], rows x n outputs (y
// row-major, no gaps). Two inputs: stride = n; the packed gate/up input [rows, 2n]: b = a + n,
// stride = 2n. FP32 math.
struct GatedActivationParams {
  const void* a = nullptr;
  const void* b = nullptr;
  void* y = nullptr;
  BlasType type = BlasType::kF32;
  int64_t rows = 0, n = 0, stride = 0;
  BlasAct act = BlasAct::kSilu;
  float act_min = 0.f, act_max = 0.f;
};
cudaError_t LaunchGatedActivation(const GatedActivationParams& p, cudaStream_t stream);

// Fused scaled dot-product attention (kiln's Attention op) over a flattened batch.
// Q [batch, sq, d], K [batch_k, sk, d], V [batch_v, sk, dv] with per-batch offsets given by
// index maps: the operand batch index of output batch b is sum over dims of coord * stride
// (strides 0 where the operand broadcasts). Up to kAttentionMaxBatchDims batch dims.
inline constexpr int kAttentionMaxBatchDims = 6;
inline constexpr int kAttentionMaxHeadDim = 128;  // kCudaAttentionMaxHeadDim (backend.h)
enum class AttnMask : int { kNone = 0, kAdditive, kBoolean, kCausal };
struct AttentionParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* mask = nullptr;  // additive: type `type`; boolean: bool (1 byte)
  void* y = nullptr;
  BlasType type = BlasType::kF32;
  AttnMask mask_kind = AttnMask::kNone;
  float scale = 1.f, mask_fill = 0.f;
  int64_t batch = 1, sq = 0, sk = 0, d = 0, dv = 0;
  int batch_rank = 0;
  int64_t out_batch_dims[kAttentionMaxBatchDims] = {};
  // Element strides of each operand over the output batch dims (0 = broadcast).
  int64_t q_stride[kAttentionMaxBatchDims] = {};
  int64_t k_stride[kAttentionMaxBatchDims] = {};
  int64_t v_stride[kAttentionMaxBatchDims] = {};
  int64_t y_stride[kAttentionMaxBatchDims] = {};
  // Element stride between consecutive rows (sequence positions) of each operand: d / dv for
  // the dense [..., S, D] layout, heads * d when the heads are interleaved ([B, S, H, D]).
  int64_t q_row = 0, k_row = 0, v_row = 0, y_row = 0;
  // The mask's element strides over [batch dims..., sq, sk] (0 = broadcast).
  int64_t m_stride[kAttentionMaxBatchDims + 2] = {};
  // Set (with y null) to write Y as FP8 E4M3 at Y's element offsets instead: each output rounded
  // to `type`, then E4M3(value * y_inv_scale), saturating (an FP8 edge's producer,
  // ops/quant_edge.h). Variants 2-6 only.
  uint8_t* y_e4m3 = nullptr;
  // Or (with y null) as int8 by the INT8 contract (kiln/backends/int8_quant.h): each output
  // rounded to `type`, times y_inv_scale, saturated to [-127, 127], rounded half to even (an INT8
  // edge's producer). Variants 2-6 only.
  int8_t* y_i8 = nullptr;
  float y_inv_scale = 1.f;
};
// Tiled flash-attention style kernels (online softmax, FP32 accumulation, one pass over K and V).
// variant 0: CUDA cores, FP32 math, any type; variant 1: tensor cores (wmma), f16/bf16 with head
// dims that are multiples of 16. cudaErrorInvalidValue for what a variant does not support
// (head dims above kAttentionMaxHeadDim among them).
// variant 2 / 3: tensor cores through mma.sync (flash-attention-2 style: S, P and O live in
// registers), f16/bf16, d == dv in {16, 32, 64, 128}, 16-byte aligned rows; 4 / 2 warps of 16
// query rows per block. variant 4 / 5: variant 2's kernel with K/V double-buffered through
// cp.async, 4 / 8 warps (sm_80+; 8 warps at d = 128 needs ~104 KiB of shared memory per block,
// more than sm_86/89 give: an error there). variant 6: variant 4 with two 16-row m-tiles per warp
// (128 rows per block; each K/V fragment from shared memory feeds both), head dims up to 64.
// A row every key of which is masked (l = 0) is written as zeros.
cudaError_t LaunchAttention(const AttentionParams& p, int variant, cudaStream_t stream);
// Whether variants 2-6 take these params (types, head dims, alignment of pointers and strides).
bool AttentionMmaSupports(const AttentionParams& p);

}  // namespace kiln::cuda
