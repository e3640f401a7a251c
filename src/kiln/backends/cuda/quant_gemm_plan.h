// The host-side half of the CUDA quantized matrix products (cublaslt_int8.cc: INT8 IMMA;
// cublaslt_fp8.cc: FP8 E4M3), without any CUDA call: which requests they take, the geometry
// (rows, depth, A's strides, how C enters), and B quantized and packed into the padded "TN"
// layout both cuBLASLt paths require. Separate so that a test can replay the whole product on
// the host where there is no GPU.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/backends/cuda/blas_kernels.h"
#include "kiln/backends/cuda/cublaslt_util.h"
#include "kiln/backends/cuda/int8_kernels.h"
#include "kiln/backends/int8_quant.h"
#include "kiln/backends/kernel.h"
#include "kiln/core/status.h"
#include "kiln/ir/tensor.h"

namespace kiln::cuda {

// The tag in TacticConfig::params[0] of a tactic that runs kiln's Hopper warpgroup kernels
// (int8_wgmma_gemm.cu) for an INT8 or FP8 layer: "wgmma" in ASCII.
inline constexpr int64_t kWgmmaTag = 0x77676d6d61;
// The same for kiln's mma.sync INT8 kernels (int8_mma_gemm.cu): "mma".
inline constexpr int64_t kMmaTag = 0x6d6d61;

// K and N are padded to this (IMMA needs multiples of 4; 16 keeps every column 16-byte aligned).
inline constexpr int64_t kQuantPad = 16;
inline int64_t QuantPadded(int64_t n) { return (n + kQuantPad - 1) / kQuantPad * kQuantPad; }

// K and N of the constant B, or nullopt when B is not a constant 2-D float matrix.
std::optional<std::pair<int64_t, int64_t>> QuantConstantB(const GemmSpec& s,
                                                          const KernelRequest& r);

// A request a quantized product takes, at its largest shapes: a Gemm-family node with a usable
// activation amax (the INT8 or FP8 attribute's), a non-zero alpha, A, C and Y in one float
// storage type and a constant 2-D B (any float type); nullopt (decline) otherwise.
// How C (Gemm, times beta) or the bias (FusedMatMul, unscaled) enters the epilogue: element
// (i, j) at i * row_stride + j * col_stride (0 broadcasts). The CPU kernel's broadcasting rules;
// Gemm ignores C when beta is 0.
struct QuantAddend {
  bool present = false;
  float factor = 1.f;
  int64_t row_stride = 0, col_stride = 0;
};

struct QuantizedGemm {
  GemmSpec spec;
  BlasType type = BlasType::kF32;
  float amax = 0.f;
  int64_t m = 0, k = 0, n = 0;
  QuantAddend addend;  // at the largest shapes
};
std::optional<QuantizedGemm> ResolveQuantizedGemm(const KernelRequest& r,
                                                  std::optional<float> amax);
// The same for a request whose A or Y (or both) may already have an edge's 8-bit type `edge`
// (int8 or E4M3, ops/quant_edge.h): those sides taken as B's float type, as the type rule does
// (ProductFloatType).
std::optional<QuantizedGemm> ResolveQuantizedGemmOnEdges(const KernelRequest& r,
                                                         std::optional<float> amax, DataType edge);
// The storage (float) type of such a product: A's where A is float, else Y's where Y is float,
// else B's (both sides 8-bit), as the type rule's ProductFloatType.
DataType EdgeProductFloatType(const KernelRequest& r, DataType edge);

// M and K of A for these dims: Gemm's A is 2-D; MatMul's leading dims fold into M (a 1-D A is
// one row). A transposed A must be 2-D. The CPU INT8 kernel's rule.
StatusOr<std::pair<int64_t, int64_t>> QuantRowsAndDepth(const GemmSpec& s,
                                                        std::span<const int64_t> a);

StatusOr<QuantAddend> ResolveQuantAddend(const GemmSpec& s, const std::vector<int64_t>* c_dims,
                                         int64_t m, int64_t n);

// A's element (i, k) sits at i * row_stride + k * col_stride.
struct QuantAStrides {
  int64_t row_stride = 0, col_stride = 1;
};
inline QuantAStrides QuantAStridesFor(const GemmSpec& s, int64_t m, int64_t k) {
  return s.trans_a ? QuantAStrides{1, m} : QuantAStrides{k, 1};
}

// What Prepare derives for one run of a quantized product with constant B [k, n]: M, how C
// enters, A's strides, and whether the output is empty; a shape error names `name`.
struct QuantRunShape {
  int64_t m = 0;
  QuantAddend addend;
  QuantAStrides a_strides;
  bool empty = false;
};
StatusOr<QuantRunShape> PrepareQuantRun(const GemmSpec& s, int64_t k, int64_t n,
                                        std::span<const TensorView> inputs,
                                        std::span<const TensorView> outputs, std::string_view name);

// The epilogue of one run (int8_kernels.h): Y (outputs[0], [m, n] in `type`), C or the bias
// (inputs[2]) as the addend says, the spec's activation, the per-column scales (col_scale, on the
// device); no accumulators. The INT8 result's epilogue kernel and kiln's own 8-bit products (INT8
// and FP8) share it.
Int8EpilogueParams QuantEpilogueFor(const GemmSpec& s, BlasType type, int64_t m, int64_t n,
                                    const QuantAddend& addend, const float* col_scale,
                                    const KernelRunArgs& args);

// The workspace of both quantized products: [alignment slack][quantized A: M x Kp bytes]
// [4-byte accumulators (int32 or FP32): M x Np][cuBLASLt's], each 256-byte aligned.
struct QuantWorkspace {
  size_t a_bytes = 0, acc_bytes = 0, lt_bytes = 0;
  size_t total() const { return kWorkspaceAlign + a_bytes + acc_bytes + lt_bytes; }
};
QuantWorkspace QuantWorkspaceFor(int64_t m, int64_t np, int64_t kp, size_t lt_bytes);

// B [K, N] (or [N, K] when transposed, any float type) quantized per output column with the
// INT8 contract and packed as [Np, Kp] int8 (each column's K weights contiguous, zero padded):
// cuBLASLt's A, column-major [Kp, Np], transposed. col_scale[n] = alpha * a_scale * b_scale[n]
// (0 in the padding), computed as the CPU kernel computes its output scales.
struct Int8PackedB {
  int64_t k = 0, n = 0, kp = 0, np = 0;
  std::vector<int8_t> packed;
  std::vector<float> col_scale;
};
Int8PackedB PackInt8B(const GemmSpec& s, const Tensor& b, float amax);
// The same packing for weights already quantized (Int8WeightsFor: the model's integers and scales
// for a layer of a QDQ model), with the activation scale a_scale.
Int8PackedB PackInt8B(const GemmSpec& s, int64_t k, int64_t n, const Int8Weights& w, float a_scale);
// The CUDA INT8 product's activation for `node`: the calibrated one, or the model's when its zero
// point is 0. The device quantization is the calibrated contract's (x times 1/scale, saturating
// at +-127), so a model zero point other than 0 is declined (nullopt) and the layer stays float
// between its Q/DQ (precision/assign.cc).
std::optional<Int8Activation> CudaInt8Activation(const Node& node);

// B quantized per tensor to FP8 E4M3 with the FP8 contract (backends/fp8_quant.h) and packed as
// [Np, Kp] E4M3 bytes, zero padded, like PackInt8B. scale = absmax(B) / 448 (1 for a zero B).
struct Fp8PackedB {
  int64_t k = 0, n = 0, kp = 0, np = 0;
  std::vector<uint8_t> packed;
  float scale = 1.f;
};
Fp8PackedB PackFp8B(const GemmSpec& s, const Tensor& b);

}  // namespace kiln::cuda
