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
// keeps every C/bias/activation combination in kiln's one epilogue.
//
// The direct plan (tactics named "...-lt-epilogue", the tactic's 9th param 1) skips that round
// trip where cuBLASLt can do the whole layer: FP16/BF16 storage, N a multiple of 16, no C or a
// bias row vector (unscaled) or a C of Y's shape (times beta), and no activation, ReLU or GELU
// (cuBLASLt's is the tanh form; erf-GELU in FP16/BF16 takes it as the FP16 product does, and the
// tactic name says "gelu-tanh-form"). cuBLASLt then writes Y in the storage type with the bias,
// C and activation in its epilogue: no FP32 result [M, Np] in the workspace and no second
// launch, which cost more than the FP8 product saved (BERT-base at batch 32 ran at half FP16's
// speed with the FP32 plan alone). The builder times both plans.
//
// On Hopper, kiln's own warpgroup kernel (int8_wgmma_gemm.cu's LaunchFp8WgmmaGemm, tactics
// "f8-...-cuda-wgmma-e4m3-<tile>-fast-accum", params {kWgmmaTag, tile}) takes the same packed B and
// quantized A and does the whole layer in one launch: the product, the scales, C/bias, any
// activation kiln's epilogue knows, and an E4M3 Y for an FP8 edge. KILN_CUDA_FP8_KERNEL picks the
// families offered: "wgmma", "cublaslt" or "all"; unset, cuBLASLt's only, until the kernel has
// run on a GPU (it was written in a session that got no GPU machine).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "kiln/backends/cuda/blas_kernels.h"
#include "kiln/backends/cuda/cublaslt_util.h"
#include "kiln/backends/cuda/cuda_common.h"
#include "kiln/backends/cuda/fp8_kernels.h"
#include "kiln/backends/cuda/int8_kernels.h"
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
  LayoutPtr a, b, d;  // cuBLASLt's A (kiln's packed B), B (quantized A), D (and C, unless c)
  LayoutPtr c;        // set where C's type differs from D's (an E4M3 D reads an FP16/BF16 C)
  LtOperation lt() const { return {op.get(), a.get(), b.get(), c ? c.get() : d.get(), d.get()}; }
};

StatusOr<Fp8Descs> MakeFp8Descs(int64_t m, int64_t np, int64_t kp, const float* scale_a,
                                const float* scale_b, bool fast_accum) {
  Fp8Descs d;
  cublasLtMatmulDesc_t op = nullptr;
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  d.op.reset(op);
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  KILN_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  KILN_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (fast_accum) {
    // No periodic promotion of the partial sums to FP32 (Hopper, Ada): faster, at the cost of
    // the MMA's own accumulation precision over the whole K.
    const int8_t on = 1;
    KILN_CUBLAS_RETURN_IF_ERROR(
        cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &on, sizeof(on)));
  }
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

// The tactic's flags (params[8]): the direct plan, FP8 fast accumulation.
constexpr int64_t kPlanDirect = 1;
constexpr int64_t kFastAccum = 2;

struct Fp8Families {
  bool lt = true, wgmma = false;
};
Fp8Families Fp8FamiliesFromEnv() {
  const char* v = std::getenv("KILN_CUDA_FP8_KERNEL");
  if (v && std::strcmp(v, "wgmma") == 0) return {false, true};
  if (v && std::strcmp(v, "all") == 0) return {true, true};
  return {};
}
// The tile of a tactic of kiln's warpgroup kernel (params {kWgmmaTag, tile}), or -1.
int WgmmaTile(const TacticConfig& t) {
  return t.params.size() == 2 && t.params[0] == kWgmmaTag ? static_cast<int>(t.params[1]) : -1;
}

// What the direct plan does for one layer: cuBLASLt's epilogue, and how C enters.
struct DirectForm {
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  bool bias = false;      // C is a row vector [N], added unscaled (cuBLASLt's bias epilogue)
  bool c_matrix = false;  // C is [M, N], times beta (cuBLASLt's C)
  float beta = 0.f;
};

// The direct plan for this layer, or nullopt when cuBLASLt's epilogue cannot do all of it.
std::optional<DirectForm> DirectFormFor(const GemmSpec& s, BlasType type, int64_t n,
                                        const QuantAddend& addend) {
  if (type == BlasType::kF32 || n % 16 != 0) return std::nullopt;
  DirectForm f;
  if (addend.present) {
    if (addend.row_stride == 0 && addend.col_stride == 1 && addend.factor == 1.f) {
      f.bias = true;
    } else if (addend.row_stride == n && addend.col_stride == 1) {
      f.c_matrix = true;
      f.beta = addend.factor;
    } else {
      return std::nullopt;
    }
  }
  switch (s.act.kind) {
    case FusedActivation::kNone:
      f.epilogue = f.bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
      break;
    case FusedActivation::kRelu:
      f.epilogue = f.bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
      break;
    case FusedActivation::kGelu:  // the tanh form, as the FP16/BF16 product takes it
    case FusedActivation::kGeluTanh:
      f.epilogue = f.bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
      break;
    default:
      return std::nullopt;
  }
  return f;
}

cudaDataType_t StorageCudaType(BlasType t) {
  return t == BlasType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
}

// The direct plan's descriptors: E4M3 x E4M3 -> Y in the storage type, unpadded M and N (N is a
// multiple of 16; A's rows sit Kp apart), with the epilogue (the bias pointer is set per run). On
// an FP8 edge's producer (out_fp8) Y is E4M3: cuBLASLt multiplies the epilogue's result by the D
// scale (448 / the consumer's amax) before its saturating conversion, and C keeps the storage
// type.
StatusOr<Fp8Descs> MakeFp8DirectDescs(int64_t m, int64_t n, int64_t kp, BlasType type,
                                      const DirectForm& form, const float* scale_a,
                                      const float* scale_b, bool out_fp8, const float* scale_d,
                                      bool fast_accum) {
  KILN_ASSIGN_OR_RETURN(Fp8Descs d, MakeFp8Descs(m, n, kp, scale_a, scale_b, fast_accum));
  const cudaDataType_t t = StorageCudaType(type);
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      d.op.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, &form.epilogue, sizeof(form.epilogue)));
  if (form.bias) {
    KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
        d.op.get(), CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof(t)));
  }
  if (out_fp8) {
    if (scale_d) {
      KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          d.op.get(), CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, &scale_d, sizeof(scale_d)));
    }
    KILN_RETURN_IF_ERROR(MakeLayout(d.c, t, n, m, n, 1, 0));
    KILN_RETURN_IF_ERROR(MakeLayout(d.d, CUDA_R_8F_E4M3, n, m, n, 1, 0));
    return d;
  }
  KILN_RETURN_IF_ERROR(MakeLayout(d.d, t, n, m, n, 1, 0));
  return d;
}

class CublasLtFp8Kernel final : public Kernel {
 public:
  // in_fp8: input 0 arrives as E4M3 already quantized with `amax` (an FP8 edge's consumer);
  // out_amax > 0: Y is written as E4M3 for a consumer of that amax (an FP8 edge's producer).
  // own_tile >= 0: kiln's warpgroup kernel in that tile (no cuBLASLt), with col_scale.
  CublasLtFp8Kernel(GemmSpec spec, BlasType type, float amax, int64_t k, int64_t n,
                    OwnedDeviceMemory b_q, OwnedDeviceMemory scales,
                    std::optional<cublasLtMatmulAlgo_t> algo, bool want_direct, bool fast_accum,
                    bool in_fp8, float out_amax, int own_tile, OwnedDeviceMemory col_scale,
                    std::string name)
      : spec_(spec),
        want_direct_(want_direct),
        fast_accum_(fast_accum),
        type_(type),
        inv_scale_(Fp8InvScale(amax)),
        in_fp8_(in_fp8),
        out_fp8_(out_amax > 0.f),
        out_inv_scale_(out_amax > 0.f ? Fp8InvScale(out_amax) : 1.f),
        k_(k),
        n_(n),
        kp_(QuantPadded(k)),
        np_(QuantPadded(n)),
        b_q_(std::move(b_q)),
        scales_(std::move(scales)),
        tactic_algo_(algo),
        own_tile_(own_tile),
        col_scale_(std::move(col_scale)),
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
    if (in_fp8_ && (kp_ != k_ || a_strides_.row_stride != k_ || a_strides_.col_stride != 1)) {
      return MakeError(ErrorCode::kInternal,
                       "{}: an E4M3 input needs rows of K = {} (a multiple of 16) side by side",
                       name_, k_);
    }
    // A quantized here sits in the workspace, M padded to 16 rows for the FP32 plan; an E4M3
    // input is read where it is, M rows.
    const int64_t a_rows = in_fp8_ ? m_ : mp_;
    const int64_t a_depth = in_fp8_ ? 0 : kp_;  // workspace bytes per row for A
    if (own_tile_ >= 0) {  // A's M rows, no result in the workspace: it stays in registers
      ws_ = QuantWorkspaceFor(m_, 0, a_depth, 0);
      return ws_.total();
    }
    const auto* scales = static_cast<const float*>(scales_.get());
    direct_.reset();
    if (want_direct_) {
      if (std::optional<DirectForm> form = DirectFormFor(spec_, type_, n_, addend_)) {
        KILN_ASSIGN_OR_RETURN(
            descs_, MakeFp8DirectDescs(m_, n_, kp_, type_, *form, scales, scales + kScaleStride,
                                       out_fp8_, scales + 2 * kScaleStride, fast_accum_));
        KILN_ASSIGN_OR_RETURN(std::optional<size_t> lt_ws, ChooseAlgorithm());
        if (lt_ws) {
          direct_ = form;
          ws_ = QuantWorkspaceFor(m_, 0, a_depth, *lt_ws);
          lt_ws_ = *lt_ws;
          return ws_.total();
        }
      }
      KILN_LOG(Debug, BACKEND, "{}: no direct plan for M={}; the FP32 result and kiln's epilogue",
               name_, m_);
    }
    KILN_ASSIGN_OR_RETURN(
        descs_, MakeFp8Descs(a_rows, np_, kp_, scales, scales + kScaleStride, fast_accum_));
    KILN_ASSIGN_OR_RETURN(std::optional<size_t> lt_ws, ChooseAlgorithm());
    if (!lt_ws) {
      return MakeError(ErrorCode::kCublasLtNoAlgorithm,
                       "{}: no cuBLASLt FP8 algorithm for m={} n={} k={} (padded {} x {})", name_,
                       m_, n_, k_, np_, kp_);
    }
    ws_ = QuantWorkspaceFor(a_rows, np_, a_depth, *lt_ws);
    lt_ws_ = *lt_ws;
    return ws_.total();
  }

  Status Run(const KernelRunArgs& args) override {
    if (empty_) return OkStatus();
    if (!descs_.op && own_tile_ < 0) {
      return MakeError(ErrorCode::kInternal, "{}: Run before Prepare", name_);
    }
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

    if (in_fp8_) {
      // The producer quantized A with this layer's scale (an FP8 edge).
      a_q = static_cast<uint8_t*>(const_cast<void*>(args.inputs[0].data));
      if (reinterpret_cast<uintptr_t>(a_q) % 16 != 0) {
        return MakeError(ErrorCode::kCudaMisalignedOperand,
                         "{}: the E4M3 input at {} is not 16-byte aligned", name_,
                         static_cast<const void*>(a_q));
      }
    } else {
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
    }
    if (own_tile_ >= 0) return RunOwn(args, a_q, stream);
    const float alpha = spec_.alpha;
    const LtOperation lt = descs_.lt();
    if (direct_) {
      // cuBLASLt writes Y: the bias (set per run: the views may move), C times beta, the
      // activation.
      void* y = args.outputs[0].data;
      // Without a C matrix beta is 0 and C is not read; it may alias D only where C's
      // descriptor is D's, so an E4M3 Y (an FP16/BF16 C) passes no C at all (cuBLASLt rejects
      // C == D with two types: CUBLAS_STATUS_INVALID_VALUE, H100).
      const void* c = direct_->c_matrix ? args.inputs[2].data : out_fp8_ ? nullptr : y;
      const void* bias = direct_->bias ? args.inputs[2].data : nullptr;
      auto misaligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 != 0; };
      if (misaligned(y) || misaligned(c) || (bias && misaligned(bias))) {
        return MakeError(ErrorCode::kCudaMisalignedOperand,
                         "{}: Y at {}, C or bias at {} are not 16-byte aligned", name_, y,
                         direct_->bias ? bias : c);
      }
      if (bias) {
        KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
            lt.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
      }
      const float beta = direct_->c_matrix ? direct_->beta : 0.f;
      KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(h, lt.op, &alpha, b_q_.get(), lt.a, a_q, lt.b,
                                                 &beta, c, lt.c, y, lt.d, &algo_,
                                                 lt_ws_ ? lt_ws : nullptr, lt_ws_, stream));
      return OkStatus();
    }
    if (!in_fp8_ && mp_ > m_) {  // padding rows: zeros (E4M3 0x00), not the last contents
      KILN_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(a_q + m_ * kp_, 0, static_cast<size_t>((mp_ - m_) * kp_), stream));
    }

    const float beta = 0.f;
    KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(h, lt.op, &alpha, b_q_.get(), lt.a, a_q, lt.b, &beta,
                                               acc, lt.c, acc, lt.d, &algo_,
                                               lt_ws_ ? lt_ws : nullptr, lt_ws_, stream));

    GemmEpilogueParams e;
    e.acc = acc;
    e.acc_ld = np_;
    if (out_fp8_) {
      e.y_e4m3 = static_cast<uint8_t*>(args.outputs[0].data);
      e.y_inv_scale = out_inv_scale_;
    } else {
      e.y = args.outputs[0].data;
    }
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
  // kiln's warpgroup kernel: the whole layer in one launch from the E4M3 A [M, Kp].
  Status RunOwn(const KernelRunArgs& args, const uint8_t* a_q, cudaStream_t stream) {
    Int8MmaGemmParams g;
    g.a = reinterpret_cast<const int8_t*>(a_q);
    g.lda = kp_;
    g.b = static_cast<const int8_t*>(b_q_.get());
    g.ldb = kp_;
    g.np = np_;
    g.depth = kp_;
    g.tile = own_tile_;
    g.epi = QuantEpilogueFor(spec_, type_, m_, n_, addend_,
                             static_cast<const float*>(col_scale_.get()), args);
    g.y_quantized = out_fp8_;
    g.y_inv_scale = out_inv_scale_;
    KILN_CUDA_RETURN_IF_ERROR(LaunchFp8WgmmaGemm(g, stream));
    return OkStatus();
  }

  // The tactic's algorithm when it fits these descriptors, else the heuristic's first: the
  // cuBLASLt workspace it needs (algo_ set), or nullopt when cuBLASLt has none.
  StatusOr<std::optional<size_t>> ChooseAlgorithm() {
    KILN_ASSIGN_OR_RETURN(cublasLtHandle_t h, CublasLtHandle());
    const LtOperation lt = descs_.lt();
    if (tactic_algo_) {
      cublasLtMatmulHeuristicResult_t r{};
      cublasStatus_t st =
          cublasLtMatmulAlgoCheck(h, lt.op, lt.a, lt.b, lt.c, lt.d, &*tactic_algo_, &r);
      if (st == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= kMaxCublasWorkspace) {
        algo_ = *tactic_algo_;
        return std::optional<size_t>(r.workspaceSize);
      }
      KILN_LOG(Debug, BACKEND,
               "{}: the tactic's algorithm does not fit M={} (status {}); using the heuristic's "
               "first",
               name_, m_, static_cast<int>(st));
    }
    KILN_ASSIGN_OR_RETURN(auto results, LtHeuristics(h, lt, kFp8Alignment, 1));
    if (results.empty()) return std::optional<size_t>();
    algo_ = results[0].algo;
    return std::optional<size_t>(results[0].workspaceSize);
  }

  GemmSpec spec_;
  bool want_direct_;                  // the tactic's plan (kPlanDirect)
  bool fast_accum_;                   // the tactic's accumulation (kFastAccum)
  std::optional<DirectForm> direct_;  // what Prepare chose: the direct plan, or the FP32 one
  BlasType type_;
  float inv_scale_;
  bool in_fp8_;          // input 0 is E4M3 (an FP8 edge's consumer)
  bool out_fp8_;         // Y is E4M3 (an FP8 edge's producer)
  float out_inv_scale_;  // 448 / the consumer's amax
  int64_t k_, n_, kp_, np_, m_ = 0, mp_ = 0;
  OwnedDeviceMemory b_q_;     // E4M3 [Np, Kp]
  OwnedDeviceMemory scales_;  // A's scale at [0], B's at [kScaleStride], D's at [2 kScaleStride]
  std::optional<cublasLtMatmulAlgo_t> tactic_algo_;
  int own_tile_ = -1;            // >= 0: kiln's warpgroup kernel, no cuBLASLt
  OwnedDeviceMemory col_scale_;  // its float [Np]: alpha * A's scale * B's scale (0 in padding)
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
    std::optional<QuantizedGemm> p = ResolveQuantizedGemm(request, Fp8InputAmax(*request.node));
    // The gate after the layer is known to be FP8, so that only FP8 builds hear about it.
    if (!p || !QuantTacticsEnabled()) return {};
    auto handle = CublasLtHandle();  // fails where there is no GPU: no tactics then
    if (!handle.ok() || !DeviceHasFp8()) return {};
    const int64_t kp = QuantPadded(p->k), np = QuantPadded(p->n), mp = QuantPadded(p->m);
    std::vector<TacticConfig> tactics;
    const char* what = p->spec.kind == GemmKind::kGemm ? "gemm" : "matmul";
    const Fp8Families families = Fp8FamiliesFromEnv();
    if (families.wgmma && Int8WgmmaAvailable()) {
      // kiln's kernel: its own family, so a search that times the first few tactics of each
      // family times some of these (the likeliest fastest) and some of cuBLASLt's.
      for (int tile : Int8WgmmaTilesOffered(WgmmaTileUse::kProduct, p->m, p->n)) {
        if (!Int8TileFitsRows(p->m, Int8WgmmaTileRows(tile))) continue;
        TacticConfig t;
        t.name = fmt::format("f8-{}-cuda-wgmma-e4m3-{}-fast-accum", what, Int8WgmmaTileName(tile));
        t.params = {kWgmmaTag, tile};
        t.family = "wgmma";
        t.workspace_bytes = QuantWorkspaceFor(p->m, 0, kp, 0).total();
        tactics.push_back(std::move(t));
      }
    }
    if (!families.lt) return tactics;
    // The direct plan's algorithms first (no FP32 round trip), then the FP32 plan's; each with
    // the default accumulation (partial sums promoted to FP32 now and then) and with fast
    // accumulation, which the builder takes where it is faster.
    const std::optional<DirectForm> form = DirectFormFor(p->spec, p->type, p->n, p->addend);
    for (const bool fast : {false, true}) {
      const char* accum = fast ? "-fast-accum" : "";
      const int64_t flags = fast ? kFastAccum : 0;
      if (form) {
        auto descs = MakeFp8DirectDescs(p->m, p->n, kp, p->type, *form, nullptr, nullptr, false,
                                        nullptr, fast);
        auto found = descs.ok()
                         ? LtHeuristics(*handle, descs->lt(), kFp8Alignment, kMaxTactics)
                         : StatusOr<std::vector<cublasLtMatmulHeuristicResult_t>>(descs.status());
        if (found.ok()) {
          const char* gelu = p->spec.act.kind == FusedActivation::kGelu ? "-gelu-tanh-form" : "";
          for (const auto& r : *found) {
            AddTactic(tactics,
                      fmt::format("f8-{}-cuda-cublaslt-e4m3-{}-lt-epilogue{}{}", what,
                                  AlgoName(r.algo), accum, gelu),
                      r, kPlanDirect | flags,
                      QuantWorkspaceFor(p->m, 0, kp, r.workspaceSize).total());
          }
        } else {
          KILN_LOG(Debug, BACKEND, "{}: no direct plan: {}", id(), found.status().ToString());
        }
      }
      auto descs = MakeFp8Descs(mp, np, kp, nullptr, nullptr, fast);
      if (!descs.ok()) continue;
      auto found = LtHeuristics(*handle, descs->lt(), kFp8Alignment, kMaxTactics);
      if (!found.ok()) {
        KILN_LOG(Warn, BACKEND, "{}: {}", id(), found.status().ToString());
        continue;
      }
      for (const auto& r : *found) {
        AddTactic(tactics,
                  fmt::format("f8-{}-cuda-cublaslt-e4m3-{}{}", what, AlgoName(r.algo), accum), r,
                  flags, QuantWorkspaceFor(mp, np, kp, r.workspaceSize).total());
      }
    }
    return tactics;
  }

  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& request,
                                           const TacticConfig& tactic) const final {
    const Node& node = *request.node;
    KILN_ASSIGN_OR_RETURN(GemmSpec spec, ReadGemmSpec(node));
    std::optional<float> amax = Fp8InputAmax(node);
    auto kn = QuantConstantB(spec, request);
    // On an FP8 edge (ops/quant_edge.h) A or Y or both are E4M3; the storage type is the float
    // side's, B's with both (the type rule's, ProductFloatType).
    const bool in_fp8 = request.inputs[0].dtype == kFp8EdgeType;
    const bool out_fp8 = request.outputs[0].dtype == kFp8EdgeType;
    const float out_amax = out_fp8 ? Fp8OutputAmax(node).value_or(0.f) : 0.f;  // 0: none
    auto type = ToBlasType(EdgeProductFloatType(request, kFp8EdgeType));
    if (!amax || !kn || !type || spec.alpha == 0.f || (out_fp8 && out_amax <= 0.f)) {
      return MakeError(ErrorCode::kNoTactic,
                       "node '{}': {} needs a finite positive {} attribute (and {} for an E4M3 "
                       "Y), a constant 2-D float B (input 1), float A and a non-zero alpha",
                       node.name(), tactic.name, kFp8InputAmaxAttr, kFp8OutputAmaxAttr);
    }
    std::optional<cublasLtMatmulAlgo_t> algo;
    int64_t flags = 0;
    const int own_tile = WgmmaTile(tactic);
    if (own_tile >= 0 && (own_tile >= Int8WgmmaTileCount() || !Int8WgmmaAvailable())) {
      return MakeError(ErrorCode::kNoTactic,
                       "{}: tactic '{}' needs kiln's wgmma kernel (a compute capability 9.0 GPU "
                       "and sm_90a code in this build) and a tile below {}",
                       id(), tactic.name, Int8WgmmaTileCount());
    }
    if (own_tile < 0 && (tactic.params.size() == 8 || tactic.params.size() == 9)) {
      cublasLtMatmulAlgo_t x;
      std::memcpy(&x, tactic.params.data(), sizeof(x));
      algo = x;
      flags = tactic.params.size() == 9 ? tactic.params[8] : 0;
    }
    if ((own_tile < 0 && !tactic.params.empty() && !algo) ||
        (flags & ~(kPlanDirect | kFastAccum)) != 0) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "{}: tactic '{}' has {} params; expected 8 (the algorithm's words), 9 "
                       "(and the plan's flags, 0 to 3) or 2 (kiln's kernel and its tile)",
                       id(), tactic.name, tactic.params.size());
    }
    const Fp8PackedB b = PackFp8B(spec, *request.inputs[1].constant);
    float scales[3 * kScaleStride] = {};
    scales[0] = Fp8Scale(*amax);
    scales[kScaleStride] = b.scale;
    scales[2 * kScaleStride] = out_fp8 ? Fp8InvScale(out_amax) : 1.f;
    KILN_ASSIGN_OR_RETURN(OwnedDeviceMemory b_q, UploadToDevice(b.packed.data(), b.packed.size()));
    KILN_ASSIGN_OR_RETURN(OwnedDeviceMemory s, UploadToDevice(scales, sizeof(scales)));
    OwnedDeviceMemory col_scale;
    if (own_tile >= 0) {
      std::vector<float> cs(static_cast<size_t>(b.np), 0.f);
      std::fill(cs.begin(), cs.begin() + b.n, spec.alpha * scales[0] * b.scale);
      KILN_ASSIGN_OR_RETURN(col_scale, UploadToDevice(cs.data(), cs.size() * sizeof(float)));
    }
    return std::unique_ptr<Kernel>(std::make_unique<CublasLtFp8Kernel>(
        spec, *type, *amax, b.k, b.n, std::move(b_q), std::move(s), algo,
        (flags & kPlanDirect) != 0, (flags & kFastAccum) != 0, in_fp8, out_amax, own_tile,
        std::move(col_scale), tactic.name));
  }

  // An FP8 edge's producer: Y in FP16/BF16 as the tactic was chosen (E4M3 takes its place).
  bool WritesFp8Output(const KernelRequest& request, const TacticConfig& tactic) const final {
    std::optional<QuantizedGemm> p = Resolve(request);
    return OwnTactic(tactic) && p && p->type != BlasType::kF32;
  }
  // An FP8 edge's consumer: A read in place as [M, K] E4M3 rows, so A is not transposed and K is
  // a multiple of 16 (cuBLASLt's FP8 row alignment). A product may be on both sides (a
  // transformer's first feed-forward product reads its norm's E4M3 copy and writes E4M3 for the
  // second).
  bool ReadsFp8Input(const KernelRequest& request, const TacticConfig& tactic) const final {
    std::optional<QuantizedGemm> p = Resolve(request);
    return OwnTactic(tactic) && p && p->type != BlasType::kF32 && !p->spec.trans_a &&
           p->k % kQuantPad == 0;
  }

 private:
  // The product of `request` in its storage type, an E4M3 A or Y taken as B's type.
  static std::optional<QuantizedGemm> Resolve(const KernelRequest& request) {
    return ResolveQuantizedGemmOnEdges(request, Fp8InputAmax(*request.node), kFp8EdgeType);
  }
  // One tactic: the algorithm's words, then the flags (9th param) where any is set.
  static bool OwnTactic(const TacticConfig& t) {
    return t.name.starts_with("f8-") &&
           (t.params.size() == 8 || t.params.size() == 9 || WgmmaTile(t) >= 0);
  }
  static void AddTactic(std::vector<TacticConfig>& tactics, std::string name,
                        const cublasLtMatmulHeuristicResult_t& r, int64_t flags, size_t workspace) {
    TacticConfig t;
    t.name = std::move(name);
    for (const TacticConfig& prev : tactics) {
      if (prev.name == t.name) t.name += fmt::format("-h{}", tactics.size());
    }
    t.params.resize(flags ? 9 : 8);
    std::memcpy(t.params.data(), &r.algo, sizeof(r.algo));
    if (flags) t.params[8] = flags;
    t.workspace_bytes = workspace;
    tactics.push_back(std::move(t));
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
