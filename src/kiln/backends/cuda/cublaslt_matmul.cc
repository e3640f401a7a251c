// Gemm, FusedGemm, MatMul and FusedMatMul on CUDA through cuBLASLt. FP32 (CUBLAS_COMPUTE_32F, no
// TF32: results match the CPU), FP16 and BF16 with FP32 accumulation. Bias, ReLU and tanh-GELU
// run in cuBLASLt's epilogue; anything else (a C that broadcasts otherwise, beta with a bias,
// other activations) in one extra launch of blas_kernels.cu on cuBLASLt's FP32 result.
// Tactics are the heuristic's top algorithms at the request's largest shapes, best first; each
// stores cublasLtMatmulAlgo_t's words (cuBLASLt documents the struct as serializable for the same
// library version, which engines are keyed on), so a reloaded engine runs exactly that algorithm.
//
// Row-major Y[M,N] = op(A) op(B) is computed as column-major Y^T[N,M] = op(B)^T op(A)^T: kiln's B
// is cuBLASLt's A and kiln's A is cuBLASLt's B, and no operand is ever copied or transposed.
#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>

#include "kiln/backends/cuda/blas_kernels.h"
#include "kiln/backends/cuda/cublaslt_util.h"
#include "kiln/backends/cuda/cuda_common.h"
#include "kiln/backends/kernel.h"
#include "kiln/core/logging.h"
#include "kiln/ops/fused.h"
#include "kiln/ops/matmul_geometry.h"
#include "kiln/ops/op_table.h"

namespace kiln::cuda {
namespace {

static_assert(static_cast<int>(BlasAct::kGeluTanh) == static_cast<int>(FusedActivation::kGeluTanh));
static_assert(static_cast<int>(BlasAct::kClip) == static_cast<int>(FusedActivation::kClip));
static_assert(sizeof(cublasLtMatmulAlgo_t) == 8 * sizeof(uint64_t));

// Operand base alignment kiln's memory plan guarantees (kPlanAlignment) and the most any
// cuBLASLt kernel asks for.
constexpr int64_t kBaseAlign = 64;
constexpr int64_t kMaxUsefulAlign = 16;

using OpKind = GemmKind;
using Spec = GemmSpec;

// Plan variants, stored with the tactic (its 9th param) so that Prepare rebuilds the plan the
// algorithm was chosen for. Used when cuBLASLt has no algorithm for the preferred plan.
constexpr int64_t kPlanDefault = 0;
constexpr int64_t kPlanOwnEpilogue = 1;   // bias/C and activation in kiln's kernel only
constexpr int64_t kPlanNoZeroStride = 2;  // broadcast batches as calls, not a stride-0 batch

cudaDataType_t CudaType(BlasType t) {
  switch (t) {
    case BlasType::kF16:
      return CUDA_R_16F;
    case BlasType::kBF16:
      return CUDA_R_16BF;
    default:
      return CUDA_R_32F;
  }
}

int64_t ElemSize(BlasType t) { return t == BlasType::kF32 ? 4 : 2; }

const char* TypePrefix(BlasType t) {
  switch (t) {
    case BlasType::kF16:
      return "f16";
    case BlasType::kBF16:
      return "bf16";
    default:
      return "f32";
  }
}

// Largest power of two <= kMaxUsefulAlign dividing every byte offset (and the arena's base).
int64_t AlignmentOf(std::initializer_list<int64_t> byte_offsets) {
  int64_t g = kBaseAlign;
  for (int64_t o : byte_offsets) g = std::gcd(g, o);
  int64_t a = 1;
  while (a * 2 <= std::min(g, kMaxUsefulAlign) && g % (a * 2) == 0) a *= 2;
  return a;
}

// One matrix product resolved for concrete dims: `calls` cuBLASLt calls, each a strided batch of
// `count` products of [m,k] x [k,n] (row-major view). Output batches are contiguous.
struct Problem {
  int64_t m = 0, n = 0, k = 0;
  bool ta = false, tb = false;  // effective (ignored for 1-D MatMul operands)
  int64_t count = 1, a_stride = 0, b_stride = 0;
  std::vector<int64_t> a_off{0}, b_off{0};  // per call, in elements
  int64_t rows() const { return m * count * static_cast<int64_t>(a_off.size()); }
  // How C (Gemm) or the bias (FusedMatMul) enters: not at all, as cuBLASLt's C matrix (beta*C of
  // Y's shape), as cuBLASLt's bias epilogue (a row vector, unscaled), or in kiln's epilogue kernel.
  enum class CMode { kNone, kLtMatrix, kLtBias, kOwn } c_mode = CMode::kNone;
  int64_t c_row_stride = 0, c_col_stride = 0;  // for kOwn (elements; 0 broadcasts)
  bool own_epilogue = false;                   // the extra launch runs
  // FP16/BF16 with an activation cuBLASLt lacks (erf GELU, SiLU...): cuBLASLt writes Y in the
  // storage type (bias in its epilogue), then kiln's kernel applies the activation in place.
  // Half the traffic of the FP32 round trip through the workspace; Y is rounded once before the
  // activation, which the FP16 tolerance covers.
  bool act_in_place = false;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
};

bool operator==(const Problem& a, const Problem& b) {
  return a.m == b.m && a.n == b.n && a.k == b.k && a.ta == b.ta && a.tb == b.tb &&
         a.count == b.count && a.a_stride == b.a_stride && a.b_stride == b.b_stride &&
         a.a_off == b.a_off && a.b_off == b.b_off && a.c_mode == b.c_mode &&
         a.c_row_stride == b.c_row_stride && a.c_col_stride == b.c_col_stride &&
         a.own_epilogue == b.own_epilogue && a.act_in_place == b.act_in_place &&
         a.epilogue == b.epilogue;
}

// The batch structure of a MatMul (numpy broadcasting of the leading dims).
Status ResolveMatMulBatch(const Spec& s, std::span<const int64_t> ad, std::span<const int64_t> bd,
                          int64_t flags, Problem& p) {
  KILN_ASSIGN_OR_RETURN(MatMulGeometry g,
                        ResolveMatMulGeometry(s.trans_a, s.trans_b, ad, bd, /*offsets=*/true));
  p.ta = g.ta;
  p.tb = g.tb;
  p.m = g.m;
  p.k = g.k;
  p.n = g.n;
  if (g.fold) {
    // A's batch dims are the output's: A is one [batch*M, K] matrix (one large GEMM).
    p.m *= g.batch;
    return OkStatus();
  }
  const int64_t batch = g.batch;
  const size_t rank = g.batch_dims.size();
  const std::vector<int64_t>& out = g.batch_dims;
  const std::vector<int64_t>& ao = g.a_offsets;
  const std::vector<int64_t>& bo = g.b_offsets;
  // The longest run of trailing batch dims over which both operands step by a constant stride
  // becomes one strided-batched call; the leading dims (rare: two-sided broadcasting such as
  // [2,1] x [1,3]) become separate calls.
  int64_t inner = batch;
  for (size_t s_len = rank + 1; s_len-- > 0;) {
    inner = 1;
    for (size_t i = rank - s_len; i < rank; ++i) inner *= out[i];
    int64_t sa = inner > 1 ? ao[1] - ao[0] : 0, sb = inner > 1 ? bo[1] - bo[0] : 0;
    bool affine = sa >= 0 && sb >= 0;
    for (int64_t q = 0; q < batch && affine; ++q) {
      int64_t base = q / inner * inner, r = q % inner;
      affine = ao[q] == ao[base] + r * sa && bo[q] == bo[base] + r * sb;
    }
    if (affine) {
      p.count = inner;
      p.a_stride = sa;
      p.b_stride = sb;
      break;
    }
  }
  if ((flags & kPlanNoZeroStride) && p.count > 1 && (p.a_stride == 0 || p.b_stride == 0)) {
    p.count = 1;
    p.a_stride = p.b_stride = 0;
  }
  p.a_off.clear();
  p.b_off.clear();
  for (int64_t q = 0; q < batch; q += p.count) {
    p.a_off.push_back(ao[q]);
    p.b_off.push_back(bo[q]);
  }
  return OkStatus();
}

// The whole problem for operand dims (c_dims empty when there is no C / bias).
StatusOr<Problem> Resolve(const Spec& s, BlasType type, std::span<const int64_t> ad,
                          std::span<const int64_t> bd, const std::vector<int64_t>* c_dims,
                          int64_t flags) {
  Problem p;
  if (s.kind == OpKind::kGemm) {
    if (ad.size() != 2 || bd.size() != 2) {
      return MakeError(ErrorCode::kShapeMismatch, "Gemm operands must be 2-D");
    }
    p.ta = s.trans_a;
    p.tb = s.trans_b;
    p.m = p.ta ? ad[1] : ad[0];
    p.k = p.ta ? ad[0] : ad[1];
    p.n = p.tb ? bd[0] : bd[1];
    if ((p.tb ? bd[1] : bd[0]) != p.k) {
      return MakeError(ErrorCode::kShapeMismatch, "Gemm operand dims disagree");
    }
  } else {
    KILN_RETURN_IF_ERROR(ResolveMatMulBatch(s, ad, bd, flags, p));
  }
  if (c_dims) {
    const auto& c = *c_dims;
    if (s.kind == OpKind::kMatMul) {
      if (c.size() != 1 || c[0] != p.n) {
        return MakeError(ErrorCode::kShapeMismatch, "MatMul bias must be [{}]", p.n);
      }
      p.c_mode = Problem::CMode::kLtBias;
      p.c_col_stride = 1;
    } else if (s.beta != 0.f) {  // the CPU reference ignores C when beta is 0
      if (c.size() > 2) return MakeError(ErrorCode::kShapeMismatch, "Gemm C has rank > 2");
      int64_t cm = c.size() == 2 ? c[0] : 1, cn = c.empty() ? 1 : c.back();
      if ((cm != 1 && cm != p.m) || (cn != 1 && cn != p.n)) {
        return MakeError(ErrorCode::kShapeMismatch, "Gemm C does not broadcast to [{}, {}]", p.m,
                         p.n);
      }
      p.c_row_stride = cm == 1 ? 0 : cn;
      p.c_col_stride = cn == 1 ? 0 : 1;
      if (cm == p.m && cn == p.n) {
        p.c_mode = Problem::CMode::kLtMatrix;
      } else if (cm == 1 && cn == p.n && s.beta == 1.f) {
        p.c_mode = Problem::CMode::kLtBias;
      } else {
        p.c_mode = Problem::CMode::kOwn;
      }
    }
  }
  // cuBLASLt's GELU epilogue may evaluate tanh less exactly than FP32 results must match the CPU
  // (1e-4); FP32 takes kiln's kernel (tanhf), FP16/BF16 the epilogue.
  // FP16/BF16 erf-GELU also takes cuBLASLt's GELU epilogue (the tanh form): the two differ by at
  // most 4.7e-4 (at |x| ~ 2), below FP16's spacing of 9.8e-4 near 1 and far below BF16's; the
  // tactic name says "gelu-tanh-form". The flag kPlanOwnEpilogue keeps the exact erf in kiln's
  // kernel. FP32 layers always compute erf exactly.
  const bool half = type != BlasType::kF32;
  const bool erf_as_tanh = half && s.act.kind == FusedActivation::kGelu;
  bool lt_act = s.act.kind == FusedActivation::kNone || s.act.kind == FusedActivation::kRelu ||
                (s.act.kind == FusedActivation::kGeluTanh && half) || erf_as_tanh;
  p.act_in_place = !lt_act && type != BlasType::kF32 && p.c_mode != Problem::CMode::kOwn &&
                   (flags & kPlanOwnEpilogue) == 0;
  p.own_epilogue = (!lt_act && !p.act_in_place) || p.c_mode == Problem::CMode::kOwn ||
                   (flags & kPlanOwnEpilogue) != 0;
  if (p.own_epilogue) {
    // kiln's kernel does C/bias and the activation together on cuBLASLt's FP32 result.
    if (p.c_mode == Problem::CMode::kLtMatrix || p.c_mode == Problem::CMode::kLtBias) {
      p.c_mode = Problem::CMode::kOwn;
    }
    p.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    return p;
  }
  bool bias = p.c_mode == Problem::CMode::kLtBias;
  switch (p.act_in_place ? FusedActivation::kNone : s.act.kind) {
    case FusedActivation::kRelu:
      p.epilogue = bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
      break;
    case FusedActivation::kGeluTanh:  // cuBLASLt's GELU is the tanh approximation
    case FusedActivation::kGelu:      // FP16/BF16 only (erf_as_tanh above)
      p.epilogue = bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
      break;
    default:
      p.epilogue = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  }
  return p;
}

// cuBLASLt descriptors for one resolved problem.
struct LtDescs {
  MatmulDescPtr op;
  LayoutPtr a, b, c, d;  // cuBLASLt's A (kiln's B), B (kiln's A), C, D
  int64_t align_a = 1, align_b = 1, align_cd = 1;
  bool d_f32 = false;  // D is FP32 (kiln's epilogue follows)
};

StatusOr<LtDescs> MakeDescs(const Problem& p, BlasType type) {
  LtDescs d;
  cudaDataType_t t = CudaType(type);
  d.d_f32 = p.own_epilogue;
  cudaDataType_t dt = d.d_f32 ? CUDA_R_32F : t;
  cublasLtMatmulDesc_t op = nullptr;
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  d.op.reset(op);
  cublasOperation_t ta = p.tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is kiln's B
  cublasOperation_t tb = p.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  KILN_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  KILN_CUBLAS_RETURN_IF_ERROR(
      cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                             &p.epilogue, sizeof(p.epilogue)));
  // Stored (pre-op) column-major shapes: kiln's row-major [R,C] is column-major [C,R].
  int64_t b_rows = p.tb ? p.k : p.n, b_cols = p.tb ? p.n : p.k;  // kiln's B
  int64_t a_rows = p.ta ? p.m : p.k, a_cols = p.ta ? p.k : p.m;  // kiln's A
  KILN_RETURN_IF_ERROR(MakeLayout(d.a, t, b_rows, b_cols, b_rows, p.count, p.b_stride));
  KILN_RETURN_IF_ERROR(MakeLayout(d.b, t, a_rows, a_cols, a_rows, p.count, p.a_stride));
  cudaDataType_t ct = p.c_mode == Problem::CMode::kLtMatrix ? t : dt;
  KILN_RETURN_IF_ERROR(MakeLayout(d.c, ct, p.n, p.m, p.n, p.count, p.m * p.n));
  KILN_RETURN_IF_ERROR(MakeLayout(d.d, dt, p.n, p.m, p.n, p.count, p.m * p.n));
  int64_t es = ElemSize(type), des = d.d_f32 ? 4 : es;
  d.align_a = AlignmentOf({p.b_stride * es});
  d.align_b = AlignmentOf({p.a_stride * es});
  for (size_t i = 0; i < p.a_off.size(); ++i) {
    d.align_a = std::min(d.align_a, AlignmentOf({p.b_off[i] * es}));
    d.align_b = std::min(d.align_b, AlignmentOf({p.a_off[i] * es}));
  }
  d.align_cd = AlignmentOf({p.m * p.n * des, p.count * p.m * p.n * des});
  return d;
}

// The heuristic's algorithms (best first) for these descriptors.
StatusOr<std::vector<cublasLtMatmulHeuristicResult_t>> Heuristics(cublasLtHandle_t h,
                                                                  const LtDescs& d, int count) {
  return LtHeuristics(h, {d.op.get(), d.a.get(), d.b.get(), d.c.get(), d.d.get()},
                      {d.align_a, d.align_b, d.align_cd}, count);
}

// Workspace layout: [cuBLASLt workspace, 256-aligned][FP32 result for kiln's epilogue]. The
// extra 256 bytes let Run align a workspace pointer that is only 64-byte aligned.
size_t WorkspaceBytes(const Problem& p, BlasType type, size_t lt_bytes) {
  size_t bytes = AlignUpSize(lt_bytes, kWorkspaceAlign);
  if (p.own_epilogue && type != BlasType::kF32) {
    bytes += static_cast<size_t>(p.rows() * p.n) * sizeof(float);
  }
  return bytes == 0 ? 0 : bytes + kWorkspaceAlign;
}

class CublasLtMatMulKernel final : public Kernel {
 public:
  CublasLtMatMulKernel(Spec spec, BlasType type, std::optional<cublasLtMatmulAlgo_t> algo,
                       int64_t flags, std::string name)
      : spec_(spec), type_(type), tactic_algo_(algo), flags_(flags), name_(std::move(name)) {}

  // Its operands (weights included) are read through Run's views only: a refit changes nothing.
  bool renews_weights() const override { return true; }

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    std::vector<int64_t> c_dims;
    bool has_c = inputs.size() > 2 && inputs[2].dtype != DataType::kUndefined;
    if (has_c) c_dims.assign(inputs[2].dims.begin(), inputs[2].dims.end());
    KILN_ASSIGN_OR_RETURN(problem_, Resolve(spec_, type_, inputs[0].dims, inputs[1].dims,
                                            has_c ? &c_dims : nullptr, flags_));
    if (outputs[0].num_elements() != problem_.rows() * problem_.n) {
      return MakeError(ErrorCode::kShapeMismatch, "{}: output has {} elements; expected {}", name_,
                       outputs[0].num_elements(), problem_.rows() * problem_.n);
    }
    // An empty output (a dynamic dim at 0) needs no launch; cuBLASLt rejects zero sizes.
    empty_ = problem_.rows() * problem_.n == 0;
    if (empty_) return size_t{0};
    KILN_ASSIGN_OR_RETURN(descs_, MakeDescs(problem_, type_));
    KILN_ASSIGN_OR_RETURN(cublasLtHandle_t h, CublasLtHandle());
    size_t lt_ws = 0;
    bool have_algo = false;
    if (tactic_algo_) {
      // The tactic's own algorithm, if it supports these shapes (it was chosen at the largest).
      cublasLtMatmulHeuristicResult_t r{};
      cublasStatus_t st =
          cublasLtMatmulAlgoCheck(h, descs_.op.get(), descs_.a.get(), descs_.b.get(),
                                  descs_.c.get(), descs_.d.get(), &*tactic_algo_, &r);
      if (st == CUBLAS_STATUS_SUCCESS && r.workspaceSize <= kMaxCublasWorkspace) {
        algo_ = *tactic_algo_;
        lt_ws = r.workspaceSize;
        have_algo = true;
      } else {
        KILN_LOG(Debug, BACKEND,
                 "{}: the tactic's algorithm does not fit [{}x{}x{}] (status {}); "
                 "using the heuristic's first",
                 name_, problem_.m, problem_.n, problem_.k, static_cast<int>(st));
      }
    }
    if (!have_algo) {
      KILN_ASSIGN_OR_RETURN(auto results, Heuristics(h, descs_, 1));
      if (results.empty()) {
        return MakeError(ErrorCode::kCublasLtNoAlgorithm,
                         "{}: no cuBLASLt algorithm for m={} n={} k={} batch={}x{}", name_,
                         problem_.m, problem_.n, problem_.k, problem_.a_off.size(), problem_.count);
      }
      algo_ = results[0].algo;
      lt_ws = results[0].workspaceSize;
    }
    lt_ws_ = lt_ws;
    return WorkspaceBytes(problem_, type_, lt_ws);
  }

  Status Run(const KernelRunArgs& args) override {
    if (empty_) return OkStatus();
    if (!descs_.op) return MakeError(ErrorCode::kInternal, "{}: Run before Prepare", name_);
    KILN_ASSIGN_OR_RETURN(cublasLtHandle_t h, CublasLtHandle());
    auto stream = static_cast<cudaStream_t>(args.stream);
    const Problem& p = problem_;
    const int64_t es = ElemSize(type_);
    auto* a = static_cast<const char*>(args.inputs[0].data);
    auto* b = static_cast<const char*>(args.inputs[1].data);
    const void* c = args.inputs.size() > 2 ? args.inputs[2].data : nullptr;
    char* y = static_cast<char*>(args.outputs[0].data);
    auto misaligned = [](const void* ptr, int64_t align) {
      return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(align) != 0;
    };
    if (misaligned(a, descs_.align_b) || misaligned(b, descs_.align_a) ||
        misaligned(y, descs_.align_cd) ||
        (p.c_mode == Problem::CMode::kLtMatrix && misaligned(c, descs_.align_cd))) {
      return MakeError(ErrorCode::kCudaMisalignedOperand,
                       "{}: operands at {}, {}, {} are not aligned to {}/{}/{} bytes", name_,
                       static_cast<const void*>(a), static_cast<const void*>(b),
                       static_cast<void*>(y), descs_.align_b, descs_.align_a, descs_.align_cd);
    }
    // Workspace: [cuBLASLt's][FP32 result], from a 256-aligned start.
    char* ws = nullptr;
    size_t need = WorkspaceBytes(p, type_, lt_ws_);
    if (need > 0) {
      if (args.workspace == nullptr || args.workspace_bytes < need) {
        return MakeError(ErrorCode::kInternal, "{}: workspace of {} bytes; {} needed", name_,
                         args.workspace_bytes, need);
      }
      auto base = reinterpret_cast<uintptr_t>(args.workspace);
      ws = reinterpret_cast<char*>(AlignUpSize(base, kWorkspaceAlign));
    }
    float* acc = nullptr;
    if (p.own_epilogue) {
      acc = type_ == BlasType::kF32
                ? reinterpret_cast<float*>(y)
                : reinterpret_cast<float*>(ws + AlignUpSize(lt_ws_, kWorkspaceAlign));
    }
    if (p.c_mode == Problem::CMode::kLtBias) {
      KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
          descs_.op.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c, sizeof(c)));
    }
    const float alpha = spec_.alpha;
    const float beta = p.c_mode == Problem::CMode::kLtMatrix ? spec_.beta : 0.f;
    const int64_t out_stride = p.count * p.m * p.n;
    const int64_t d_es = descs_.d_f32 ? 4 : es;
    char* d_base = acc ? reinterpret_cast<char*>(acc) : y;
    for (size_t call = 0; call < p.a_off.size(); ++call) {
      char* d = d_base + static_cast<int64_t>(call) * out_stride * d_es;
      const void* cm = p.c_mode == Problem::CMode::kLtMatrix ? c : d;
      KILN_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(h, descs_.op.get(), &alpha, b + p.b_off[call] * es,
                                                 descs_.a.get(), a + p.a_off[call] * es,
                                                 descs_.b.get(), &beta, cm, descs_.c.get(), d,
                                                 descs_.d.get(), &algo_, ws, lt_ws_, stream));
    }
    if (p.own_epilogue) {
      GemmEpilogueParams e;
      e.acc = acc;
      e.y = y;
      e.type = type_;
      e.rows = p.rows();
      e.cols = p.n;
      if (p.c_mode == Problem::CMode::kOwn) {
        e.c = c;
        e.c_row_stride = p.c_row_stride;
        e.c_col_stride = p.c_col_stride;
        e.beta = spec_.kind == OpKind::kGemm ? spec_.beta : 1.f;
      }
      e.act = static_cast<BlasAct>(spec_.act.kind);
      e.act_min = spec_.act.min;
      e.act_max = spec_.act.max;
      KILN_CUDA_RETURN_IF_ERROR(LaunchGemmEpilogue(e, stream));
    } else if (p.act_in_place) {
      GemmEpilogueParams e;  // acc == nullptr: in place on Y
      e.y = y;
      e.type = type_;
      e.rows = p.rows();
      e.cols = p.n;
      e.act = static_cast<BlasAct>(spec_.act.kind);
      e.act_min = spec_.act.min;
      e.act_max = spec_.act.max;
      KILN_CUDA_RETURN_IF_ERROR(LaunchGemmEpilogue(e, stream));
    }
    return OkStatus();
  }

 private:
  Spec spec_;
  BlasType type_;
  std::optional<cublasLtMatmulAlgo_t> tactic_algo_;
  int64_t flags_ = kPlanDefault;
  std::string name_;
  Problem problem_;
  LtDescs descs_;
  cublasLtMatmulAlgo_t algo_{};
  size_t lt_ws_ = 0;
  bool empty_ = false;
};

class CublasLtProviderBase : public KernelProvider {
 public:
  BackendKind backend() const final { return BackendKind::kCuda; }

  std::vector<TacticConfig> Tactics(const KernelRequest& request) const final {
    auto spec = ReadGemmSpec(*request.node);
    auto type = Type(request);
    if (!spec.ok() || !type) return {};
    std::vector<int64_t> a = LargestDims(request.inputs[0]), b = LargestDims(request.inputs[1]);
    if (a.empty() || b.empty()) return {};
    bool has_c = request.inputs.size() > 2 && request.inputs[2].dtype != DataType::kUndefined;
    std::vector<int64_t> c;
    if (has_c) {
      c = LargestDims(request.inputs[2]);
      if (c.empty() && request.inputs[2].shape.size() != 0) return {};
    }
    auto handle = CublasLtHandle();  // fails where there is no GPU: no tactics then
    if (!handle.ok()) return {};
    // The preferred plan first; the fallbacks only when cuBLASLt has nothing for it.
    std::optional<Problem> problem;
    std::vector<cublasLtMatmulHeuristicResult_t> results;
    int64_t flags = kPlanDefault;
    for (int64_t f : {kPlanDefault, kPlanNoZeroStride, kPlanOwnEpilogue,
                      kPlanOwnEpilogue | kPlanNoZeroStride}) {
      auto pr = Resolve(*spec, *type, a, b, has_c ? &c : nullptr, f);
      if (!pr.ok() || pr->m == 0 || pr->n == 0 || pr->k == 0) return {};
      if (f != kPlanDefault && *pr == *problem) continue;  // the flag changes nothing here
      auto descs = MakeDescs(*pr, *type);
      if (!descs.ok()) return {};
      auto found = Heuristics(*handle, *descs, kMaxTactics);
      if (!found.ok()) {
        KILN_LOG(Warn, BACKEND, "{}: {}", id(), found.status().ToString());
        return {};
      }
      problem = std::move(*pr);
      flags = f;
      if (!found->empty()) {
        results = std::move(*found);
        break;
      }
    }
    std::vector<TacticConfig> tactics;
    const char* what = spec->kind == OpKind::kGemm ? "gemm" : "matmul";
    for (const auto& r : results) {
      TacticConfig t;
      t.name = fmt::format("{}-{}-cuda-cublaslt-{}", TypePrefix(*type), what, AlgoName(r.algo));
      for (const TacticConfig& prev : tactics) {
        if (prev.name == t.name) t.name += fmt::format("-h{}", tactics.size());
      }
      if (flags & kPlanOwnEpilogue) t.name += "-kiln-epilogue";
      if (problem->act_in_place) t.name += "-act-in-place";
      if (!problem->own_epilogue && spec->act.kind == FusedActivation::kGelu) {
        t.name += "-gelu-tanh-form";
      }
      if (flags & kPlanNoZeroStride) t.name += "-unbatched";
      t.params.resize(9);
      std::memcpy(t.params.data(), &r.algo, sizeof(r.algo));
      t.params[8] = flags;
      t.workspace_bytes = WorkspaceBytes(*problem, *type, r.workspaceSize);
      tactics.push_back(std::move(t));
    }
    return tactics;
  }

  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& request,
                                           const TacticConfig& tactic) const final {
    KILN_ASSIGN_OR_RETURN(Spec spec, ReadGemmSpec(*request.node));
    auto type = Type(request);
    if (!type) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "{}: operand types are not one of f32, f16, "
                       "bf16 (all equal)",
                       id());
    }
    std::optional<cublasLtMatmulAlgo_t> algo;
    int64_t flags = kPlanDefault;
    if (tactic.params.size() == 9 && tactic.params[8] >= 0 &&
        tactic.params[8] <= (kPlanOwnEpilogue | kPlanNoZeroStride)) {
      cublasLtMatmulAlgo_t x;
      std::memcpy(&x, tactic.params.data(), sizeof(x));
      algo = x;
      flags = tactic.params[8];
    } else if (!tactic.params.empty()) {
      return MakeError(ErrorCode::kInvalidArgument,
                       "{}: tactic '{}' has {} params; expected 9 (the algorithm's 8 words and "
                       "the plan flags)",
                       id(), tactic.name, tactic.params.size());
    }
    return std::unique_ptr<Kernel>(
        std::make_unique<CublasLtMatMulKernel>(spec, *type, algo, flags, tactic.name));
  }

 private:
  static constexpr int kMaxTactics = 8;

  // The one storage type of A, B, C/bias and Y, if cuBLASLt's path takes it.
  static std::optional<BlasType> Type(const KernelRequest& r) {
    if (r.inputs.size() < 2 || r.outputs.empty()) return std::nullopt;
    DataType t = r.inputs[0].dtype;
    if (r.inputs[1].dtype != t || r.outputs[0].dtype != t) return std::nullopt;
    if (r.inputs.size() > 2 && r.inputs[2].dtype != DataType::kUndefined &&
        r.inputs[2].dtype != t) {
      return std::nullopt;
    }
    return ToBlasType(t);
  }
};

class GemmProvider final : public CublasLtProviderBase {
 public:
  std::string_view id() const override { return "cuda.gemm.cublaslt"; }
  std::string_view op_type() const override { return "Gemm"; }
};
KILN_REGISTER_KERNEL_PROVIDER(GemmProvider);

class FusedGemmProvider final : public CublasLtProviderBase {
 public:
  std::string_view id() const override { return "cuda.fused_gemm.cublaslt"; }
  std::string_view op_type() const override { return "FusedGemm"; }
};
KILN_REGISTER_KERNEL_PROVIDER(FusedGemmProvider);

class MatMulProvider final : public CublasLtProviderBase {
 public:
  std::string_view id() const override { return "cuda.matmul.cublaslt"; }
  std::string_view op_type() const override { return "MatMul"; }
};
KILN_REGISTER_KERNEL_PROVIDER(MatMulProvider);

class FusedMatMulProvider final : public CublasLtProviderBase {
 public:
  std::string_view id() const override { return "cuda.fused_matmul.cublaslt"; }
  std::string_view op_type() const override { return "FusedMatMul"; }
};
KILN_REGISTER_KERNEL_PROVIDER(FusedMatMulProvider);

}  // namespace
}  // namespace kiln::cuda
