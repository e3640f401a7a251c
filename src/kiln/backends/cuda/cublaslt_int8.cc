// INT8 Gemm, FusedGemm, MatMul and FusedMatMul on CUDA through cuBLASLt's IMMA kernels
// ("i8-gemm-cuda-cublaslt-...", "i8-matmul-cuda-cublaslt-..."), with the CPU INT8 kernel's
// contract (kiln/backends/int8_quant.h, backends/cpu/gemm_int8.cc): offered only for nodes the
// precision pass marked, whose B is a constant 2-D matrix; A in the layer's float storage is
// quantized per tensor (amax / 127, or a QDQ model's scale when its zero point is 0: the device
// quantization is symmetric, so other zero points are declined), B per output column N (or the
// model's integers with its scales), products accumulate in int32, and
// alpha * a_scale * b_scale[n] dequantizes before C/bias and the activation; Y is in the storage
// type. MatMul's batch dims of A fold into M (B has none), as on the CPU.
//
// cuBLASLt's IMMA kernels in the regular column-major order take only the "TN" form (A transposed,
// B not), m and k multiples of 4 and leading dimensions multiples of 4, and for int32 results no
// epilogue at all (no bias, no activation, no per-channel alpha: those need int8 outputs). So:
//  * B is quantized at Create into kiln's own device buffer as [Np, Kp] (each output channel's K
//    weights contiguous, zero padded), which is cuBLASLt's A stored [Kp, Np] and transposed;
//  * each Run quantizes A into the workspace as [M, Kp] (cuBLASLt's B, column-major [Kp, M],
//    not transposed), transposing a transA operand on the way, zero padding K;
//  * cuBLASLt writes Y^T = B^T A^T as int32 [M, Np] into the workspace, and one kernel
//    (int8_gemm.cu) dequantizes, adds C and activates into Y.
// Np and Kp are N and K rounded up to 16 (the requirement is 4; 16 keeps every column 16-byte
// aligned, which the faster kernels ask for), and every operand cuBLASLt touches is kiln's own
// buffer, so no shape or operand address is refused for layout reasons. The zero padding adds
// nothing to the sums.
//
// Tactics are the heuristic's top algorithms at the profile's largest M, stored as the
// algorithm's 8 words like the FP16 tactics (cublaslt_matmul.cc), and, on sm_80 and newer, kiln's
// own tensor-core products with the epilogue fused, which skip the int32 round trip through
// memory: the mma.sync kernel (int8_mma_gemm.cu: "i8-...-cuda-mma-128x128", params
// {kMmaTag, tile}) and, on Hopper, the warpgroup kernel (int8_wgmma_gemm.cu:
// "i8-...-cuda-wgmma-128x128", params {kWgmmaTag, tile}), the families offered alternately
// (KILN_CUDA_INT8_KERNEL below says which). The builder times them. kiln's kernels also serve INT8
// edges (ops/quant_edge.h): they read an int8 A [M, K] in place (K a multiple of 16, A not
// transposed), or write Y as int8 for the consumer.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

#include "kiln/backends/cuda/cublaslt_util.h"
#include "kiln/backends/cuda/cuda_common.h"
#include "kiln/backends/cuda/int8_kernels.h"
#include "kiln/backends/cuda/quant_gemm_plan.h"
#include "kiln/backends/int8_quant.h"
#include "kiln/backends/kernel.h"
#include "kiln/core/logging.h"
#include "kiln/ops/quant_edge.h"

namespace kiln::cuda {
namespace {

constexpr int kMaxTactics = 8;

// kiln's own kernel a tactic names: its family's launcher and tile.
struct OwnKernel {
  bool wgmma = false;
  int tile = -1;  // -1: none (cuBLASLt)
};

// cuBLASLt's descriptors for one M: int8 x int8 -> int32, computed in int32, TN form.
struct Int8Descs {
  MatmulDescPtr op;
  LayoutPtr a, b, d;  // cuBLASLt's A (kiln's quantized B), B (quantized A), C = D (int32)
  LtOperation lt() const { return {op.get(), a.get(), b.get(), d.get(), d.get()}; }
};

StatusOr<Int8Descs> MakeInt8Descs(int64_t m, int64_t np, int64_t kp) {
  Int8Descs d;
  cublasLtMatmulDesc_t op = nullptr;
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32I, CUDA_R_32I));
  d.op.reset(op);
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  KILN_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  KILN_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  KILN_RETURN_IF_ERROR(MakeLayout(d.a, CUDA_R_8I, kp, np, kp, 1, 0));
  KILN_RETURN_IF_ERROR(MakeLayout(d.b, CUDA_R_8I, kp, m, kp, 1, 0));
  KILN_RETURN_IF_ERROR(MakeLayout(d.d, CUDA_R_32I, np, m, np, 1, 0));
  return d;
}

// Every operand is a 256-byte aligned buffer of kiln's with 16-byte aligned columns.
constexpr LtAlignment kInt8Alignment{16, 16, 16};

class CublasLtInt8Kernel final : public Kernel {
 public:
  CublasLtInt8Kernel(GemmSpec spec, BlasType type, float a_scale, int64_t k, int64_t n,
                     OwnedDeviceMemory b_q, OwnedDeviceMemory col_scale,
                     std::optional<cublasLtMatmulAlgo_t> algo, OwnKernel own, bool in_int8,
                     float out_scale, std::string name)
      : spec_(spec),
        type_(type),
        inv_scale_(1.f / a_scale),
        k_(k),
        n_(n),
        kp_(QuantPadded(k)),
        np_(QuantPadded(n)),
        b_q_(std::move(b_q)),
        col_scale_(std::move(col_scale)),
        tactic_algo_(algo),
        own_(own),
        in_int8_(in_int8),
        out_inv_scale_(out_scale > 0.f ? 1.f / out_scale : 0.f),
        name_(std::move(name)) {}

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    KILN_ASSIGN_OR_RETURN(QuantRunShape run,
                          PrepareQuantRun(spec_, k_, n_, inputs, outputs, name_));
    m_ = run.m;
    addend_ = run.addend;
    a_strides_ = run.a_strides;
    empty_ = run.empty;
    if (empty_) return size_t{0};
    if (own_.tile >= 0) {
      ws_ = QuantWorkspaceFor(m_, np_, kp_, 0);
      ws_.acc_bytes = 0;              // the accumulators stay in registers
      if (in_int8_) ws_.a_bytes = 0;  // A is read in place
      return ws_.total();
    }
    KILN_ASSIGN_OR_RETURN(descs_, MakeInt8Descs(m_, np_, kp_));
    KILN_ASSIGN_OR_RETURN(cublasLtHandle_t h, CublasLtHandle());
    bool have_algo = false;
    size_t lt_ws = 0;
    if (tactic_algo_) {
      // The tactic's own algorithm, if it takes this M (it was chosen at the largest).
      cublasLtMatmulHeuristicResult_t r{};
      const LtOperation lt = descs_.lt();
      cublasStatus_t st =
          cublasLtMatmulAlgoCheck(h, lt.op, lt.a, lt.b, lt.c, lt.d, &*tactic_algo_, &r);
      if (st == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= kMaxCublasWorkspace) {
        algo_ = *tactic_algo_;
        lt_ws = r.workspaceSize;
        have_algo = true;
      } else {
        KILN_LOG(Debug, BACKEND,
                 "{}: the tactic's algorithm does not fit M={} (status {}); using the heuristic's "
                 "first",
                 name_, m_, static_cast<int>(st));
      }
    }
    if (!have_algo) {
      KILN_ASSIGN_OR_RETURN(auto results, LtHeuristics(h, descs_.lt(), kInt8Alignment, 1));
      if (results.empty()) {
        return MakeError(ErrorCode::kCublasLtNoAlgorithm,
                         "{}: no cuBLASLt int8 algorithm for m={} n={} k={} (padded {} x {})",
                         name_, m_, n_, k_, np_, kp_);
      }
      algo_ = results[0].algo;
      lt_ws = results[0].workspaceSize;
    }
    ws_ = QuantWorkspaceFor(m_, np_, kp_, lt_ws);
    lt_ws_ = lt_ws;
    return ws_.total();
  }

  Status Run(const KernelRunArgs& args) override {
    if (empty_) return OkStatus();
    if (!descs_.op && own_.tile < 0) {
      return MakeError(ErrorCode::kInternal, "{}: Run before Prepare", name_);
    }
    if (args.workspace == nullptr || args.workspace_bytes < ws_.total()) {
      return MakeError(ErrorCode::kInternal, "{}: workspace of {} bytes; {} needed", name_,
                       args.workspace_bytes, ws_.total());
    }
    cudaStream_t stream = static_cast<cudaStream_t>(args.stream);
    auto* base = reinterpret_cast<char*>(
        AlignUpSize(reinterpret_cast<uintptr_t>(args.workspace), kWorkspaceAlign));
    auto* a_q = reinterpret_cast<int8_t*>(base);
    if (in_int8_) return RunMma(args, static_cast<const int8_t*>(args.inputs[0].data), stream);
    auto* acc = reinterpret_cast<int32_t*>(base + ws_.a_bytes);
    void* lt_ws = base + ws_.a_bytes + ws_.acc_bytes;

    Int8QuantizeParams q;
    q.x = args.inputs[0].data;
    q.type = type_;
    q.q = a_q;
    q.rows = m_;
    q.depth = k_;
    q.ldq = kp_;
    q.row_stride = a_strides_.row_stride;
    q.col_stride = a_strides_.col_stride;
    q.inv_scale = inv_scale_;
    KILN_CUDA_RETURN_IF_ERROR(LaunchInt8Quantize(q, stream));
    if (own_.tile >= 0) return RunMma(args, a_q, stream);

    KILN_ASSIGN_OR_RETURN(cublasLtHandle_t h, CublasLtHandle());
    const int32_t alpha = 1, beta = 0;
    const LtOperation lt = descs_.lt();
    KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(h, lt.op, &alpha, b_q_.get(), lt.a, a_q, lt.b, &beta,
                                               acc, lt.c, acc, lt.d, &algo_,
                                               lt_ws_ ? lt_ws : nullptr, lt_ws_, stream));

    Int8EpilogueParams e = Epilogue(args);
    e.acc = acc;
    e.ld_acc = np_;
    KILN_CUDA_RETURN_IF_ERROR(LaunchInt8Epilogue(e, stream));
    return OkStatus();
  }

 private:
  // The epilogue both paths share (the int32 result's kernel, kiln's product), less the
  // accumulators.
  Int8EpilogueParams Epilogue(const KernelRunArgs& args) const {
    return QuantEpilogueFor(spec_, type_, m_, n_, addend_,
                            static_cast<const float*>(col_scale_.get()), args);
  }

  Status RunMma(const KernelRunArgs& args, const int8_t* a_q, cudaStream_t stream) {
    Int8MmaGemmParams g;
    g.a = a_q;
    g.lda = kp_;
    g.b = static_cast<const int8_t*>(b_q_.get());
    g.ldb = kp_;
    g.np = np_;
    g.depth = kp_;
    g.epi = Epilogue(args);
    g.tile = own_.tile;
    g.y_quantized = out_inv_scale_ > 0.f;
    g.y_inv_scale = out_inv_scale_;
    KILN_CUDA_RETURN_IF_ERROR(own_.wgmma ? LaunchInt8WgmmaGemm(g, stream)
                                         : LaunchInt8MmaGemm(g, stream));
    return OkStatus();
  }

  GemmSpec spec_;
  BlasType type_;
  float inv_scale_;
  int64_t k_, n_, kp_, np_, m_ = 0;
  OwnedDeviceMemory b_q_;        // int8 [Np, Kp]
  OwnedDeviceMemory col_scale_;  // float [Np]: alpha * a_scale * b_scale[n] (0 in the padding)
  std::optional<cublasLtMatmulAlgo_t> tactic_algo_;
  OwnKernel own_;              // tile >= 0: kiln's own kernel, no cuBLASLt
  bool in_int8_ = false;       // A arrives as int8 [M, K] (an INT8 edge's consumer)
  float out_inv_scale_ = 0.f;  // > 0: Y is int8 with this inverse scale (an edge's producer)
  std::string name_;
  QuantAddend addend_;
  QuantAStrides a_strides_;
  bool empty_ = false;
  Int8Descs descs_;
  cublasLtMatmulAlgo_t algo_{};
  size_t lt_ws_ = 0;
  QuantWorkspace ws_;
};

class CublasLtInt8ProviderBase : public KernelProvider {
 public:
  BackendKind backend() const final { return BackendKind::kCuda; }

  std::vector<TacticConfig> Tactics(const KernelRequest& request) const final {
    std::optional<QuantizedGemm> p = Resolve(request);
    // int32 accumulation: 127 * 127 * K must not overflow.
    if (p && p->k > (int64_t{1} << 31) / (127 * 127)) return {};
    // The gate after the layer is known to be INT8, so that only INT8 builds hear about it.
    if (!p || !QuantTacticsEnabled()) return {};
    auto handle = CublasLtHandle();  // fails where there is no GPU: no tactics then
    if (!handle.ok()) return {};
    const int64_t kp = QuantPadded(p->k), np = QuantPadded(p->n);
    auto descs = MakeInt8Descs(p->m, np, kp);
    if (!descs.ok()) return {};
    const char* what = p->spec.kind == GemmKind::kGemm ? "gemm" : "matmul";
    const Int8Families families = Int8FamiliesFromEnv();
    std::vector<TacticConfig> wgmma, mma, lt;
    auto own = [&](std::vector<TacticConfig>& out, const char* fam, int64_t tag, int tile,
                   const char* tile_name) {
      TacticConfig t;
      t.name = fmt::format("i8-{}-cuda-{}-{}", what, fam, tile_name);
      t.params = {tag, tile};
      t.family = fam;
      QuantWorkspace ws = QuantWorkspaceFor(p->m, np, kp, 0);
      ws.acc_bytes = 0;
      t.workspace_bytes = ws.total();
      out.push_back(std::move(t));
    };
    if (families.wgmma && Int8WgmmaAvailable()) {
      // The likeliest fastest first.
      for (int tile : Int8WgmmaTilesOffered(WgmmaTileUse::kProduct, p->m, p->n)) {
        if (!Int8TileFitsRows(p->m, Int8WgmmaTileRows(tile))) continue;
        own(wgmma, "wgmma", kWgmmaTag, tile, Int8WgmmaTileName(tile));
      }
    }
    if (families.mma && MmaCapable()) {
      // Kiln's tiles, the likeliest first: eight warps of 64 x 32 ran BERT-base's products at
      // batch 32 faster than four of 64 x 64 (H100, session 28: QKV 61 us against 80).
      for (int tile : {4, 0, 2, 1, 3}) {
        if (tile >= Int8MmaTileCount() || !Int8TileFitsRows(p->m, Int8MmaTileRows(tile))) continue;
        own(mma, "mma", kMmaTag, tile, Int8MmaTileName(tile));
      }
    }
    if (families.lt) {
      auto found = LtHeuristics(*handle, descs->lt(), kInt8Alignment, kMaxTactics);
      if (!found.ok()) KILN_LOG(Warn, BACKEND, "{}: {}", id(), found.status().ToString());
      for (const auto& r : found.ok() ? *found : std::vector<cublasLtMatmulHeuristicResult_t>{}) {
        TacticConfig t;
        t.name = fmt::format("i8-{}-cuda-cublaslt-{}", what, AlgoName(r.algo));
        for (const TacticConfig& prev : lt) {
          if (prev.name == t.name) t.name += fmt::format("-h{}", lt.size());
        }
        t.params.resize(8);
        std::memcpy(t.params.data(), &r.algo, sizeof(r.algo));
        t.workspace_bytes = QuantWorkspaceFor(p->m, np, kp, r.workspaceSize).total();
        t.family = "cublaslt";
        lt.push_back(std::move(t));
      }
    }
    // Three families (TacticConfig::family): a search that times the first few tactics of a
    // provider (--opt-level 1-4) times that many of each. cuBLASLt's heuristic first, so that one
    // that times nothing keeps the library's pick.
    return InterleaveFamilies({&lt, &wgmma, &mma});
  }

  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& request,
                                           const TacticConfig& tactic) const final {
    const Node& node = *request.node;
    KILN_ASSIGN_OR_RETURN(GemmSpec spec, ReadGemmSpec(node));
    std::optional<Int8Activation> act = CudaInt8Activation(node);
    auto kn = QuantConstantB(spec, request);
    // On an INT8 edge (ops/quant_edge.h) A or Y or both are int8; the float type is the float
    // side's, B's with both (the type rule's, ProductFloatType).
    const bool in_int8 = request.inputs[0].dtype == kInt8EdgeType;
    const bool out_int8 = request.outputs[0].dtype == kInt8EdgeType;
    const float out_scale = out_int8 ? node.attrs().GetFloat(kInt8OutputScaleAttr, 0.f) : 0.f;
    auto type = ToBlasType(EdgeProductFloatType(request, kInt8EdgeType));
    if (!act || !kn || !type || spec.alpha == 0.f ||
        (out_int8 && !(out_scale > 0.f && std::isfinite(out_scale)))) {
      return MakeError(ErrorCode::kNoTactic,
                       "node '{}': {} needs a finite positive {} attribute (or the model's scales "
                       "with zero point 0; and {} for an int8 Y), a constant 2-D float B (input "
                       "1), float A and a non-zero alpha",
                       node.name(), tactic.name, kInt8InputAmaxAttr, kInt8OutputScaleAttr);
    }
    std::optional<cublasLtMatmulAlgo_t> algo;
    OwnKernel own_kernel;
    if (OwnTactic(tactic)) {
      own_kernel.wgmma = tactic.params[0] == kWgmmaTag;
      const int tiles = own_kernel.wgmma ? Int8WgmmaTileCount() : Int8MmaTileCount();
      if (tactic.params[1] < 0 || tactic.params[1] >= tiles) {
        return MakeError(ErrorCode::kInvalidArgument, "{}: tactic '{}' names tile {} of {}", id(),
                         tactic.name, tactic.params[1], tiles);
      }
      if (own_kernel.wgmma && !Int8WgmmaAvailable()) {
        return MakeError(ErrorCode::kNoTactic,
                         "node '{}': {} needs a compute capability 9.0 GPU and a kiln built with "
                         "sm_90a code (KILN_CUDA_ARCHS with 90a-real)",
                         node.name(), tactic.name);
      }
      own_kernel.tile = static_cast<int>(tactic.params[1]);
    } else if ((in_int8 || out_int8) && !tactic.params.empty()) {
      return MakeError(ErrorCode::kNoTactic,
                       "node '{}': {} cannot read or write int8 (only kiln's own kernel does)",
                       node.name(), tactic.name);
    } else if (tactic.params.size() == 8) {
      cublasLtMatmulAlgo_t x;
      std::memcpy(&x, tactic.params.data(), sizeof(x));
      algo = x;
    } else if (!tactic.params.empty()) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "{}: tactic '{}' has {} params; expected 8 (the algorithm's words) or 2 "
                       "(kiln's own kernel)",
                       id(), tactic.name, tactic.params.size());
    }
    const Tensor b_f32 = request.inputs[1].constant->CastTo(DataType::kFloat32);
    KILN_ASSIGN_OR_RETURN(Int8Weights w, Int8WeightsFor(node, b_f32));
    const Int8PackedB b = PackInt8B(spec, kn->first, kn->second, w, act->scale);
    KILN_ASSIGN_OR_RETURN(OwnedDeviceMemory b_q, UploadToDevice(b.packed.data(), b.packed.size()));
    KILN_ASSIGN_OR_RETURN(OwnedDeviceMemory scales,
                          UploadToDevice(b.col_scale.data(), b.col_scale.size() * sizeof(float)));
    return std::unique_ptr<Kernel>(std::make_unique<CublasLtInt8Kernel>(
        spec, *type, act->scale, b.k, b.n, std::move(b_q), std::move(scales), algo, own_kernel,
        in_int8, out_scale, tactic.name));
  }

  // An INT8 edge's producer: kiln's own kernel, whatever Y's float type.
  bool WritesInt8Output(const KernelRequest& request, const TacticConfig& tactic) const final {
    return OwnTactic(tactic) && Resolve(request);
  }
  // An INT8 edge's consumer: A read in place as int8 [M, K] rows, so A is not transposed and K is
  // a multiple of 16 (the kernel's 16-byte copies). A product may be on both sides (a transformer's
  // first feed-forward product reads its norm's int8 copy and writes int8 for the second).
  bool ReadsInt8Input(const KernelRequest& request, const TacticConfig& tactic) const final {
    std::optional<QuantizedGemm> p = Resolve(request);
    return OwnTactic(tactic) && p && !p->spec.trans_a && p->k % kQuantPad == 0;
  }

 private:
  static bool OwnTactic(const TacticConfig& t) {
    return t.name.starts_with("i8-") && t.params.size() == 2 &&
           (t.params[0] == kMmaTag || t.params[0] == kWgmmaTag);
  }
  // The product of `request` in its float type, an int8 A or Y taken as B's type.
  static std::optional<QuantizedGemm> Resolve(const KernelRequest& request) {
    std::optional<Int8Activation> act = CudaInt8Activation(*request.node);
    return ResolveQuantizedGemmOnEdges(
        request, act ? std::optional<float>(act->scale * 127.f) : std::nullopt, kInt8EdgeType);
  }
};

class Int8GemmProvider final : public CublasLtInt8ProviderBase {
 public:
  std::string_view id() const override { return "cuda.gemm.cublaslt.i8"; }
  std::string_view op_type() const override { return "Gemm"; }
};
KILN_REGISTER_KERNEL_PROVIDER(Int8GemmProvider);

class Int8FusedGemmProvider final : public CublasLtInt8ProviderBase {
 public:
  std::string_view id() const override { return "cuda.fused_gemm.cublaslt.i8"; }
  std::string_view op_type() const override { return "FusedGemm"; }
};
KILN_REGISTER_KERNEL_PROVIDER(Int8FusedGemmProvider);

class Int8MatMulProvider final : public CublasLtInt8ProviderBase {
 public:
  std::string_view id() const override { return "cuda.matmul.cublaslt.i8"; }
  std::string_view op_type() const override { return "MatMul"; }
};
KILN_REGISTER_KERNEL_PROVIDER(Int8MatMulProvider);

class Int8FusedMatMulProvider final : public CublasLtInt8ProviderBase {
 public:
  std::string_view id() const override { return "cuda.fused_matmul.cublaslt.i8"; }
  std::string_view op_type() const override { return "FusedMatMul"; }
};
KILN_REGISTER_KERNEL_PROVIDER(Int8FusedMatMulProvider);

}  // namespace
}  // namespace kiln::cuda
