// Shared cuBLASLt helpers (cublaslt_util.h).
#include "kiln/backends/cuda/cublaslt_util.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include "kiln/backends/cuda/cuda_common.h"
#include "kiln/backends/cuda/int8_kernels.h"
#include "kiln/core/logging.h"
#include "kiln/ops/op_table.h"

namespace kiln::cuda {

bool QuantTacticsEnabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("KILN_CUDA_QUANT_TACTICS");
    return v && std::string_view(v) == "1";
  }();
  if (!enabled) {
    static std::once_flag told;
    std::call_once(told, [] {
      KILN_LOG(Info, BACKEND,
               "CUDA INT8/FP8 tactics are off: they pass their GPU tests but run slower than "
               "FP16 on the GPUs measured (KILN_CUDA_QUANT_TACTICS=1 turns them on; a tactic "
               "search then keeps a layer FP16 where its float tactic is faster); such layers "
               "stay FP16");
    });
  }
  return enabled;
}

Int8Families Int8FamiliesFromEnv() {
  const char* v = std::getenv("KILN_CUDA_INT8_KERNEL");
  const std::string_view k = v ? v : "";
  if (k == "mma") return {false, true, false};
  if (k == "wgmma") return {false, false, true};
  if (k == "cublaslt") return {true, false, false};
  return {};  // "all", unset or anything else: every family
}

std::vector<int> Int8WgmmaTilesOffered(WgmmaTileUse use, int64_t rows, int64_t cols) {
  const std::vector<int> order = rows > 0 && cols > 0
                                     ? Int8WgmmaTileOrder(use, rows, cols, Int8WgmmaSmCount())
                                     : Int8WgmmaTileOrder(use);
  const char* what = use == WgmmaTileUse::kProduct         ? "a product"
                     : use == WgmmaTileUse::kPointwiseConv ? "a pointwise convolution"
                                                           : "a gathering convolution";
  auto tested = [&] {
    std::vector<int> out;
    for (int t : order) {
      if (Int8WgmmaTileGpuTested(t)) out.push_back(t);
    }
    return out;
  };
  const char* v = std::getenv("KILN_CUDA_WGMMA_TILES");
  if (!v || !*v) return tested();
  std::vector<int> named;
  std::string_view rest(v);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view name = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (name.empty()) continue;
    const auto it = std::find_if(order.begin(), order.end(),
                                 [&](int t) { return name == Int8WgmmaTileName(t); });
    if (it == order.end()) {
      // Once per name and use, not per layer asked.
      static std::mutex mu;
      static std::set<std::string> told;
      std::lock_guard<std::mutex> lock(mu);
      if (told.insert(std::string(name) + "/" + what).second) {
        std::string names;
        for (int t : order) names += std::string(names.empty() ? "" : ", ") + Int8WgmmaTileName(t);
        KILN_LOG(Warn, BACKEND,
                 "KILN_CUDA_WGMMA_TILES: '{}' is no tile of kiln's wgmma kernel for {}, skipped "
                 "(its tiles: {})",
                 name, what, names);
      }
    } else if (std::find(named.begin(), named.end(), *it) == named.end()) {
      named.push_back(*it);
    }
  }
  return named.empty() ? tested() : named;
}

bool MmaCapable() {
  int device = 0, major = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         major >= 8;
}

std::vector<TacticConfig> InterleaveFamilies(
    std::initializer_list<std::vector<TacticConfig>*> families) {
  size_t most = 0;
  for (const std::vector<TacticConfig>* f : families) most = std::max(most, f->size());
  std::vector<TacticConfig> tactics;
  for (size_t i = 0; i < most; ++i) {
    for (std::vector<TacticConfig>* f : families) {
      if (i < f->size()) tactics.push_back(std::move((*f)[i]));
    }
  }
  return tactics;
}

StatusOr<GemmSpec> ReadGemmSpec(const Node& node) {
  const AttributeMap& at = node.attrs();
  GemmSpec s;
  const OpType op = OpTypeOf(node);
  s.kind = (op == OpType::kGemm || op == OpType::kFusedGemm) ? GemmKind::kGemm : GemmKind::kMatMul;
  if (op != OpType::kMatMul) {
    // Gemm, MatMul and their fused forms share these defaults (ops.inc).
    s.trans_a = attrs::Gemm::transA(at) != 0;
    s.trans_b = attrs::Gemm::transB(at) != 0;
    s.alpha = attrs::Gemm::alpha(at);
  }
  if (s.kind == GemmKind::kGemm) s.beta = attrs::Gemm::beta(at);
  if (op == OpType::kFusedGemm || op == OpType::kFusedMatMul) {
    KILN_ASSIGN_OR_RETURN(s.act, ParseFusedActivation(at));
  }
  return s;
}

void DeviceFree::operator()(void* p) const { cudaFree(p); }

StatusOr<OwnedDeviceMemory> UploadToDevice(const void* host, size_t bytes) {
  void* dev = nullptr;
  KILN_CUDA_RETURN_IF_ERROR(cudaMalloc(&dev, bytes));
  OwnedDeviceMemory owned(dev);
  KILN_CUDA_RETURN_IF_ERROR(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
  return owned;
}

Status MakeLayout(LayoutPtr& out, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld,
                  int64_t count, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&l, t, static_cast<uint64_t>(rows),
                                                         static_cast<uint64_t>(cols), ld));
  out.reset(l);
  if (count > 1) {
    int32_t c32 = static_cast<int32_t>(count);
    KILN_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &c32, sizeof(c32)));
    KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutSetAttribute(
        l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return OkStatus();
}

StatusOr<std::vector<cublasLtMatmulHeuristicResult_t>> LtHeuristics(cublasLtHandle_t h,
                                                                    const LtOperation& d,
                                                                    const LtAlignment& align,
                                                                    int count) {
  cublasLtMatmulPreference_t pref = nullptr;
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  PreferencePtr owned(pref);
  size_t ws = kMaxCublasWorkspace;
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  uint32_t aa = static_cast<uint32_t>(align.a), ab = static_cast<uint32_t>(align.b),
           acd = static_cast<uint32_t>(align.cd);
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof(aa)));
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof(ab)));
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &acd, sizeof(acd)));
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &acd, sizeof(acd)));
  // Split-K partial sums are reduced in the compute type (FP32; int32 for INT8) only: the in-place
  // and output-type schemes add them in the output type, which for BF16/FP16 outputs lost up to
  // 0.04 per element on a K=129 product on the H200 (seen in cuda_blas_tests).
  uint32_t reduction = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction, sizeof(reduction)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(count));
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(h, d.op, d.a, d.b, d.c, d.d, pref, count,
                                                     results.data(), &found);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED)
    found = 0;  // no algorithm: an empty list, not a failure
  else if (st != CUBLAS_STATUS_SUCCESS)
    return CublasStatus(st, "cublasLtMatmulAlgoGetHeuristic");
  results.resize(static_cast<size_t>(found));
  std::erase_if(results, [](const cublasLtMatmulHeuristicResult_t& r) {
    return r.state != CUBLAS_STATUS_SUCCESS;
  });
  return results;
}

std::string AlgoName(const cublasLtMatmulAlgo_t& algo) {
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr) -> int64_t {
    // cuBLASLt checks the buffer size against the attribute's own (16/32/64-bit): ask first.
    size_t size = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, nullptr, 0, &size) !=
            CUBLAS_STATUS_SUCCESS ||
        size == 0 || size > sizeof(uint64_t)) {
      return -1;
    }
    uint64_t v = 0;  // little-endian: a narrower attribute lands in the low bytes
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, size, &written) !=
        CUBLAS_STATUS_SUCCESS) {
      return -1;
    }
    if (size == 4) return static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(v)));
    if (size == 2) return static_cast<int64_t>(static_cast<int16_t>(static_cast<uint16_t>(v)));
    return static_cast<int64_t>(v);
  };
  return fmt::format(
      "algo{}-tile{}-stages{}-splitk{}-red{}-swz{}-cust{}-inner{}-cluster{}",
      get(CUBLASLT_ALGO_CONFIG_ID), get(CUBLASLT_ALGO_CONFIG_TILE_ID),
      get(CUBLASLT_ALGO_CONFIG_STAGES_ID), get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
      get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
      get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION), get(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID),
      get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
}

}  // namespace kiln::cuda
