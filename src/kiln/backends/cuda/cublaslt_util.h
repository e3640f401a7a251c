// What the cuBLASLt providers share (cublaslt_matmul.cc: f32/f16/bf16; cublaslt_int8.cc: INT8):
// descriptor ownership, layouts, the heuristic query, workspace limits and tactic naming.
#pragma once

#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "kiln/backends/kernel.h"
#include "kiln/core/status.h"
#include "kiln/ir/graph.h"
#include "kiln/ops/fused.h"

namespace kiln::cuda {

// cuBLAS's own default for Hopper; tactics needing more are not offered.
inline constexpr size_t kMaxCublasWorkspace = size_t{32} << 20;
// cuBLASLt wants a 256-byte aligned workspace; kiln's arena guarantees 64.
inline constexpr size_t kWorkspaceAlign = 256;

inline size_t AlignUpSize(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Gemm, FusedGemm, MatMul and FusedMatMul's attributes (MatMul: the defaults).
enum class GemmKind { kGemm, kMatMul };
struct GemmSpec {
  GemmKind kind = GemmKind::kGemm;
  bool trans_a = false, trans_b = false;
  float alpha = 1.f, beta = 1.f;  // beta: Gemm's; MatMul's bias enters unscaled
  FusedActivationSpec act;
};
StatusOr<GemmSpec> ReadGemmSpec(const Node& node);

// Whether the INT8 and FP8 tactics (cublaslt_int8.cc, cublaslt_fp8.cc, conv_int8.cc) are offered.
// Their GPU tests pass (H100, sessions 33-36), but they are no faster than FP16 there (BERT-base
// with every product INT8 at FP16's speed end to end, ResNet-50 INT8 0.70x:
// bench/results/h100_session36/), so they are off unless
// KILN_CUDA_QUANT_TACTICS=1: a CUDA --int8/--fp8 build keeps those layers FP16 with the reason
// "no int8 kernel on cuda". The first refusal logs how to turn them on. (A QDQ model's INT8
// layers keep the model's quantization and do not race their float tactics, so ungating them
// would make such models slower.)
bool QuantTacticsEnabled();

// KILN_CUDA_INT8_KERNEL picks the families of INT8 tactics offered (tests, and comparing them):
// "mma", "wgmma" or "cublaslt" that one only; unset, "all" or anything else, the three. kiln's
// wgmma kernel (Hopper) is the fastest INT8 family at BERT-base's and ResNet-50's shapes, and
// every CUDA INT8/FP8 test passes with it among the families (H100, session 34), so it is offered
// by default since then. The INT8 convolution (conv_int8.cc) has no cuBLASLt family.
struct Int8Families {
  bool lt = true, mma = true, wgmma = true;
};
Int8Families Int8FamiliesFromEnv();
enum class WgmmaTileUse : int;  // int8_kernels.h
// The tiles of kiln's wgmma kernel a provider offers (INT8 and FP8 products, INT8 convolutions),
// likeliest fastest first for their use: Int8WgmmaTileOrder(use, rows, cols, the device's SM
// count) for a product of rows x cols outputs (0: shape unknown, the use's order), or, where
// KILN_CUDA_WGMMA_TILES names tiles (comma-separated, e.g. "pp-128x128,tma-128x256"), those of
// them in that order, to compare tiles end to end. A name that is no tile of this use is skipped
// with a warning; when none is left, the default order stands. The default order leaves out the
// tiles not yet GPU-tested (Int8WgmmaTileGpuTested); naming one offers it.
std::vector<int> Int8WgmmaTilesOffered(WgmmaTileUse use, int64_t rows = 0, int64_t cols = 0);
// Whether the current device runs kiln's mma.sync INT8 kernel (compute capability 8.0 or later).
bool MmaCapable();

// The tactics of a provider's kernel families (TacticConfig::family) as one list, alternating:
// the first of each family in the order given, then the second of each, ... A search without
// timing takes the first family's first tactic.
std::vector<TacticConfig> InterleaveFamilies(
    std::initializer_list<std::vector<TacticConfig>*> families);

// ---- RAII for cuBLASLt descriptors.
struct DescDeleter {
  void operator()(cublasLtMatmulDescOpaque_t* d) const { cublasLtMatmulDescDestroy(d); }
  void operator()(cublasLtMatrixLayoutOpaque_t* d) const { cublasLtMatrixLayoutDestroy(d); }
  void operator()(cublasLtMatmulPreferenceOpaque_t* d) const { cublasLtMatmulPreferenceDestroy(d); }
};
using MatmulDescPtr = std::unique_ptr<cublasLtMatmulDescOpaque_t, DescDeleter>;
using LayoutPtr = std::unique_ptr<cublasLtMatrixLayoutOpaque_t, DescDeleter>;
using PreferencePtr = std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, DescDeleter>;

// Device memory a kernel owns (quantized, packed weights), and a host copy uploaded into it.
struct DeviceFree {
  void operator()(void* p) const;
};
using OwnedDeviceMemory = std::unique_ptr<void, DeviceFree>;
StatusOr<OwnedDeviceMemory> UploadToDevice(const void* host, size_t bytes);

// A column-major layout (CUBLASLT_ORDER_COL), strided-batched when count > 1.
Status MakeLayout(LayoutPtr& out, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld,
                  int64_t count, int64_t stride);

// The descriptors of one cublasLtMatmul (borrowed) and the operands' guaranteed alignments in
// bytes (cuBLASLt's A, B, and C/D).
struct LtOperation {
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t a, b, c, d;
};
struct LtAlignment {
  int64_t a = 1, b = 1, cd = 1;
};
// The heuristic's algorithms (best first) for these descriptors, within kMaxCublasWorkspace;
// empty (not an error) when cuBLASLt has none.
StatusOr<std::vector<cublasLtMatmulHeuristicResult_t>> LtHeuristics(cublasLtHandle_t h,
                                                                    const LtOperation& op,
                                                                    const LtAlignment& align,
                                                                    int count);

// "algo66-tile15-stages8-splitk1-red0-swz0-cust0-inner0-cluster1": the algorithm's config.
std::string AlgoName(const cublasLtMatmulAlgo_t& algo);

}  // namespace kiln::cuda
