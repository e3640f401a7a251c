// FP8 E4M3 Gemm, FusedGemm, MatMul and FusedMatMul on CUDA through cuBLASLt (sm_89 and later:
// Ada, Hopper), "f8-gemm-cuda-cublaslt-e4m3-..." / "f8-matmul-cuda-cublaslt-e4m3-...", with the
// FP8 contract (kiln/backends/fp8_quant.h): offered only for nodes the precision pass marked
// (--fp8) whose B is a constant 2-D matrix. A in the layer's float storage is quantized per tensor
// to E4M3 with scale amax / 448, B per tensor with absmax(B) / 448; cuBLASLt multiplies with the
// two scales as its A/B scale pointers (D = alpha * scale_a * scale_b * A8 B8), accumulating in
// FP32, into an FP32 result; kiln's GEMM epilogue kernel (blas_kernels.cu) adds C/bias, applies
// the activation and stores Y in the storage type. MatMul's batch dims of A fold into M.
//
// cuBLASLt's FP8 kernels take only the "TN" form with 16-byte aligned operands, so the layout is
// the INT8 product's (cublaslt_int8.cc): B packed at Create as [Np, Kp] E4M3 in kiln's own memory
// (cuBLASLt's A, transposed), A quantized per run into the workspace as [Mp, Kp] (cuBLASLt's B),
// M, K and N zero-padded to 16, the FP32 result [Mp, Np] in the workspace (cuBLASLt's FP8 kernels
// want every dimension and pointer 16-byte aligned; the padding rows of A are zeros and the
// epilogue reads the first M rows only). The FP32 output
// keeps every C/bias/activation combination in kiln's one epilogue instead of cuBLASLt's FP8 bias
// epilogues (whose bias type depends on the output type).
#include <cstring>
#include <memory>
#include <optional>

#include "kiln/backends/cuda/blas_kernels.h"
#include "kiln/backends/cuda/cublaslt_util.h"
#include "kiln/backends/cuda/cuda_common.h"
#include "kiln/backends/cuda/fp8_kernels.h"
#include "kiln/backends/cuda/quant_gemm_plan.h"
#include "kiln/backends/fp8_quant.h"
#include "kiln/backends/kernel.h"
#include "kiln/core/logging.h"

namespace kiln::cuda {
namespace {

constexpr int kMaxTactics = 8;
// The two per-tensor scales sit 16 bytes apart in one allocation: every pointer cuBLASLt's FP8
// kernels take is then 16-byte aligned (the matrices must be; the scales alike, to be safe).
constexpr int kScaleStride = 4;

// FP8 tensor-core kernels exist from compute capability 8.9 (Ada) on.
bool DeviceHasFp8() {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    return false;
  }
  return major > 8 || (major == 8 && minor >= 9);
}

// cuBLASLt's descriptors for one M: E4M3 x E4M3 -> FP32, computed in FP32, TN form, with the
// per-tensor scales read from device memory (null while listing tactics: the heuristic does not
// read them; Prepare checks the chosen algorithm with them set).
struct Fp8Descs {
  MatmulDescPtr op;
  LayoutPtr a, b, d;  // cuBLASLt's A (kiln's packed B), B (quantized A), C = D (FP32)
  LtOperation lt() const { return {op.get(), a.get(), b.get(), d.get(), d.get()}; }
};

StatusOr<Fp8Descs> MakeFp8Descs(int64_t m, int64_t np, int64_t kp, const float* scale_a,
                                const float* scale_b) {
  Fp8Descs d;
  cublasLtMatmulDesc_t op = nullptr;
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  d.op.reset(op);
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  KILN_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  KILN_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (scale_a && scale_b) {
    // cuBLASLt's A is kiln's B and the other way round.
    KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &scale_b, sizeof(scale_b)));
    KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &scale_a, sizeof(scale_a)));
  }
  KILN_RETURN_IF_ERROR(MakeLayout(d.a, CUDA_R_8F_E4M3, kp, np, kp, 1, 0));
  KILN_RETURN_IF_ERROR(MakeLayout(d.b, CUDA_R_8F_E4M3, kp, m, kp, 1, 0));
  KILN_RETURN_IF_ERROR(MakeLayout(d.d, CUDA_R_32F, np, m, np, 1, 0));
  return d;
}

constexpr LtAlignment kFp8Alignment{16, 16, 16};

class CublasLtFp8Kernel final : public Kernel {
 public:
  CublasLtFp8Kernel(GemmSpec spec, BlasType type, float amax, int64_t k, int64_t n,
                    OwnedDeviceMemory b_q, OwnedDeviceMemory scales,
                    std::optional<cublasLtMatmulAlgo_t> algo, std::string name)
      : spec_(spec),
        type_(type),
        inv_scale_(Fp8InvScale(amax)),
        k_(k),
        n_(n),
        kp_(QuantPadded(k)),
        np_(QuantPadded(n)),
        b_q_(std::move(b_q)),
        scales_(std::move(scales)),
        tactic_algo_(algo),
        name_(std::move(name)) {}

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    KILN_ASSIGN_OR_RETURN(QuantRunShape run,
                          PrepareQuantRun(spec_, k_, n_, inputs, outputs, name_));
    m_ = run.m;
    mp_ = QuantPadded(m_);
    addend_ = run.addend;
    a_strides_ = run.a_strides;
    empty_ = run.empty;
    if (empty_) return size_t{0};
    const auto* scales = static_cast<const float*>(scales_.get());
    KILN_ASSIGN_OR_RETURN(descs_, MakeFp8Descs(mp_, np_, kp_, scales, scales + kScaleStride));
    KILN_ASSIGN_OR_RETURN(cublasLtHandle_t h, CublasLtHandle());
    bool have_algo = false;
    size_t lt_ws = 0;
    const LtOperation lt = descs_.lt();
    if (tactic_algo_) {
      cublasLtMatmulHeuristicResult_t r{};
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
      KILN_ASSIGN_OR_RETURN(auto results, LtHeuristics(h, lt, kFp8Alignment, 1));
      if (results.empty()) {
        return MakeError(ErrorCode::kCublasLtNoAlgorithm,
                         "{}: no cuBLASLt FP8 algorithm for m={} n={} k={} (padded {} x {})", name_,
                         m_, n_, k_, np_, kp_);
      }
      algo_ = results[0].algo;
      lt_ws = results[0].workspaceSize;
    }
    ws_ = QuantWorkspaceFor(mp_, np_, kp_, lt_ws);
    lt_ws_ = lt_ws;
    return ws_.total();
  }

  Status Run(const KernelRunArgs& args) override {
    if (empty_) return OkStatus();
    if (!descs_.op) return MakeError(ErrorCode::kInternal, "{}: Run before Prepare", name_);
    if (args.workspace == nullptr || args.workspace_bytes < ws_.total()) {
      return MakeError(ErrorCode::kInternal, "{}: workspace of {} bytes; {} needed", name_,
                       args.workspace_bytes, ws_.total());
    }
    KILN_ASSIGN_OR_RETURN(cublasLtHandle_t h, CublasLtHandle());
    cudaStream_t stream = static_cast<cudaStream_t>(args.stream);
    auto* base = reinterpret_cast<char*>(
        AlignUpSize(reinterpret_cast<uintptr_t>(args.workspace), kWorkspaceAlign));
    auto* a_q = reinterpret_cast<uint8_t*>(base);
    auto* acc = reinterpret_cast<float*>(base + ws_.a_bytes);
    void* lt_ws = base + ws_.a_bytes + ws_.acc_bytes;

    Fp8QuantizeParams q;
    q.x = args.inputs[0].data;
    q.type = type_;
    q.q = a_q;
    q.rows = m_;
    q.depth = k_;
    q.ldq = kp_;
    q.row_stride = a_strides_.row_stride;
    q.col_stride = a_strides_.col_stride;
    q.inv_scale = inv_scale_;
    KILN_CUDA_RETURN_IF_ERROR(LaunchFp8Quantize(q, stream));
    if (mp_ > m_) {  // padding rows: zeros (E4M3 0x00), not the workspace's last contents
      KILN_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(a_q + m_ * kp_, 0, static_cast<size_t>((mp_ - m_) * kp_), stream));
    }

    const float alpha = spec_.alpha, beta = 0.f;
    const LtOperation lt = descs_.lt();
    KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(h, lt.op, &alpha, b_q_.get(), lt.a, a_q, lt.b, &beta,
                                               acc, lt.c, acc, lt.d, &algo_,
                                               lt_ws_ ? lt_ws : nullptr, lt_ws_, stream));

    GemmEpilogueParams e;
    e.acc = acc;
    e.acc_ld = np_;
    e.y = args.outputs[0].data;
    e.type = type_;
    e.rows = m_;
    e.cols = n_;
    if (addend_.present) {
      e.c = args.inputs[2].data;
      e.c_row_stride = addend_.row_stride;
      e.c_col_stride = addend_.col_stride;
      e.beta = addend_.factor;
    }
    e.act = static_cast<BlasAct>(spec_.act.kind);
    e.act_min = spec_.act.min;
    e.act_max = spec_.act.max;
    KILN_CUDA_RETURN_IF_ERROR(LaunchGemmEpilogue(e, stream));
    return OkStatus();
  }

 private:
  GemmSpec spec_;
  BlasType type_;
  float inv_scale_;
  int64_t k_, n_, kp_, np_, m_ = 0, mp_ = 0;
  OwnedDeviceMemory b_q_;     // E4M3 [Np, Kp]
  OwnedDeviceMemory scales_;  // A's scale at [0], B's at [kScaleStride]
  std::optional<cublasLtMatmulAlgo_t> tactic_algo_;
  std::string name_;
  QuantAddend addend_;
  QuantAStrides a_strides_;
  bool empty_ = false;
  Fp8Descs descs_;
  cublasLtMatmulAlgo_t algo_{};
  size_t lt_ws_ = 0;
  QuantWorkspace ws_;
};

class CublasLtFp8ProviderBase : public KernelProvider {
 public:
  BackendKind backend() const final { return BackendKind::kCuda; }

  std::vector<TacticConfig> Tactics(const KernelRequest& request) const final {
    if (!QuantTacticsEnabled()) return {};
    std::optional<QuantizedGemm> p = ResolveQuantizedGemm(request, Fp8InputAmax(*request.node));
    if (!p) return {};
    auto handle = CublasLtHandle();  // fails where there is no GPU: no tactics then
    if (!handle.ok() || !DeviceHasFp8()) return {};
    const int64_t kp = QuantPadded(p->k), np = QuantPadded(p->n), mp = QuantPadded(p->m);
    auto descs = MakeFp8Descs(mp, np, kp, nullptr, nullptr);
    if (!descs.ok()) return {};
    auto found = LtHeuristics(*handle, descs->lt(), kFp8Alignment, kMaxTactics);
    if (!found.ok()) {
      KILN_LOG(Warn, BACKEND, "{}: {}", id(), found.status().ToString());
      return {};
    }
    std::vector<TacticConfig> tactics;
    const char* what = p->spec.kind == GemmKind::kGemm ? "gemm" : "matmul";
    for (const auto& r : *found) {
      TacticConfig t;
      t.name = fmt::format("f8-{}-cuda-cublaslt-e4m3-{}", what, AlgoName(r.algo));
      for (const TacticConfig& prev : tactics) {
        if (prev.name == t.name) t.name += fmt::format("-h{}", tactics.size());
      }
      t.params.resize(8);
      std::memcpy(t.params.data(), &r.algo, sizeof(r.algo));
      t.workspace_bytes = QuantWorkspaceFor(mp, np, kp, r.workspaceSize).total();
      tactics.push_back(std::move(t));
    }
    return tactics;
  }

  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& request,
                                           const TacticConfig& tactic) const final {
    const Node& node = *request.node;
    KILN_ASSIGN_OR_RETURN(GemmSpec spec, ReadGemmSpec(node));
    std::optional<float> amax = Fp8InputAmax(node);
    auto kn = QuantConstantB(spec, request);
    auto type = ToBlasType(request.inputs[0].dtype);
    if (!amax || !kn || !type || spec.alpha == 0.f) {
      return MakeError(ErrorCode::kNoTactic,
                       "node '{}': {} needs a finite positive {} attribute, a constant 2-D float "
                       "B (input 1), float A and a non-zero alpha",
                       node.name(), tactic.name, kFp8InputAmaxAttr);
    }
    std::optional<cublasLtMatmulAlgo_t> algo;
    if (tactic.params.size() == 8) {
      cublasLtMatmulAlgo_t x;
      std::memcpy(&x, tactic.params.data(), sizeof(x));
      algo = x;
    } else if (!tactic.params.empty()) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "{}: tactic '{}' has {} params; expected 8 (the algorithm's words)", id(),
                       tactic.name, tactic.params.size());
    }
    const Fp8PackedB b = PackFp8B(spec, *request.inputs[1].constant);
    float scales[2 * kScaleStride] = {};
    scales[0] = Fp8Scale(*amax);
    scales[kScaleStride] = b.scale;
    KILN_ASSIGN_OR_RETURN(OwnedDeviceMemory b_q, UploadToDevice(b.packed.data(), b.packed.size()));
    KILN_ASSIGN_OR_RETURN(OwnedDeviceMemory s, UploadToDevice(scales, sizeof(scales)));
    return std::unique_ptr<Kernel>(std::make_unique<CublasLtFp8Kernel>(
        spec, *type, *amax, b.k, b.n, std::move(b_q), std::move(s), algo, tactic.name));
  }
};

class Fp8GemmProvider final : public CublasLtFp8ProviderBase {
 public:
  std::string_view id() const override { return "cuda.gemm.cublaslt.f8"; }
  std::string_view op_type() const override { return "Gemm"; }
};
KILN_REGISTER_KERNEL_PROVIDER(Fp8GemmProvider);

class Fp8FusedGemmProvider final : public CublasLtFp8ProviderBase {
 public:
  std::string_view id() const override { return "cuda.fused_gemm.cublaslt.f8"; }
  std::string_view op_type() const override { return "FusedGemm"; }
};
KILN_REGISTER_KERNEL_PROVIDER(Fp8FusedGemmProvider);

class Fp8MatMulProvider final : public CublasLtFp8ProviderBase {
 public:
  std::string_view id() const override { return "cuda.matmul.cublaslt.f8"; }
  std::string_view op_type() const override { return "MatMul"; }
};
KILN_REGISTER_KERNEL_PROVIDER(Fp8MatMulProvider);

class Fp8FusedMatMulProvider final : public CublasLtFp8ProviderBase {
 public:
  std::string_view id() const override { return "cuda.fused_matmul.cublaslt.f8"; }
  std::string_view op_type() const override { return "FusedMatMul"; }
};
KILN_REGISTER_KERNEL_PROVIDER(Fp8FusedMatMulProvider);

}  // namespace
}  // namespace kiln::cuda
