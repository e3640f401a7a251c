// MatMul and FusedMatMul on the CPU: numpy batched broadcasting and 1-D operands.
// Y = act(alpha * op(A) @ op(B) + bias) (FusedMatMul; plain MatMul has alpha 1, no bias).
// Tactics: f32-matmul-cpu-openblas[-1thread] and f32-matmul-cpu-blocked-8x8[-k128] (sgemm.h's
// GemmTactics). When B has no batch dims
// and A is not transposed, the batch is folded into M: one large sgemm (the BERT case).
#include <algorithm>

#include "kiln/backends/cpu/conv_common.h"
#include "kiln/backends/cpu/cpu_kernel.h"
#include "kiln/backends/cpu/sgemm.h"

namespace kiln::cpu {
namespace {

struct MatMulSpec {
  bool trans_a = false, trans_b = false;
  float alpha = 1.f;
  FusedActivationSpec act;
};

// Problem sizes of one MatMul for given operand dims.
struct MatMulDims {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  bool fold = false;                          // batch folded into M
  std::vector<int64_t> a_offsets, b_offsets;  // per batch, in elements
};

StatusOr<MatMulDims> ResolveMatMul(const MatMulSpec& s, std::span<const int64_t> ad,
                                   std::span<const int64_t> bd, bool offsets) {
  std::vector<int64_t> a(ad.begin(), ad.end()), b(bd.begin(), bd.end());
  if (a.empty() || b.empty()) return MakeError(ErrorCode::kShapeMismatch, "MatMul of a scalar");
  bool a_vec = a.size() == 1, b_vec = b.size() == 1;
  if (a_vec) a = {1, a[0]};
  if (b_vec) b = {b[0], 1};
  bool ta = s.trans_a && !a_vec, tb = s.trans_b && !b_vec;
  MatMulDims d;
  size_t ra = a.size(), rb = b.size();
  d.m = ta ? a[ra - 1] : a[ra - 2];
  d.k = ta ? a[ra - 2] : a[ra - 1];
  d.n = tb ? b[rb - 2] : b[rb - 1];
  if ((tb ? b[rb - 1] : b[rb - 2]) != d.k) {
    return MakeError(ErrorCode::kShapeMismatch, "MatMul inner dims differ ({} vs {})", d.k,
                     tb ? b[rb - 1] : b[rb - 2]);
  }
  size_t rank = std::max(ra, rb) - 2;
  std::vector<int64_t> out(rank), as(rank, 0), bs(rank, 0);
  int64_t a_stride = d.m * d.k, b_stride = d.k * d.n;
  for (size_t i = rank; i-- > 0;) {
    int64_t da = i + ra - 2 >= rank ? a[i + ra - 2 - rank] : 1;
    int64_t db = i + rb - 2 >= rank ? b[i + rb - 2 - rank] : 1;
    if (da != db && da != 1 && db != 1) {
      return MakeError(ErrorCode::kShapeMismatch, "MatMul batch dims {} and {} do not broadcast",
                       da, db);
    }
    out[i] = std::max(da, db);
    as[i] = da == 1 ? 0 : a_stride;
    bs[i] = db == 1 ? 0 : b_stride;
    a_stride *= da;
    b_stride *= db;
  }
  for (int64_t x : out) d.batch *= x;
  bool b_batched = std::any_of(bs.begin(), bs.end(), [](int64_t v) { return v != 0; });
  // Without batch dims in B, A's batch dims are the output's: A is one [batch*M, K] matrix.
  d.fold = !b_batched && !ta;
  if (offsets && !d.fold) {
    d.a_offsets.resize(d.batch);
    d.b_offsets.resize(d.batch);
    for (int64_t p = 0; p < d.batch; ++p) {
      int64_t rem = p, ao = 0, bo = 0;
      for (size_t i = rank; i-- > 0;) {
        int64_t coord = rem % out[i];
        rem /= out[i];
        ao += coord * as[i];
        bo += coord * bs[i];
      }
      d.a_offsets[p] = ao;
      d.b_offsets[p] = bo;
    }
  }
  return d;
}

class MatMulKernel final : public Kernel {
 public:
  MatMulKernel(MatMulSpec spec, GemmImpl impl) : spec_(spec), impl_(impl) {}

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    KILN_ASSIGN_OR_RETURN(d_, ResolveMatMul(spec_, inputs[0].dims, inputs[1].dims, true));
    if (outputs[0].num_elements() != d_.batch * d_.m * d_.n) {
      return MakeError(ErrorCode::kShapeMismatch, "MatMul output has {} elements; expected {}",
                       outputs[0].num_elements(), d_.batch * d_.m * d_.n);
    }
    return d_.fold ? SgemmWorkspaceBytes(impl_, d_.batch * d_.m, d_.n, d_.k)
                   : SgemmWorkspaceBytes(impl_, d_.m, d_.n, d_.k);
  }

  Status Run(const KernelRunArgs& args) override {
    const float* a = args.inputs[0].as<const float>();
    const float* b = args.inputs[1].as<const float>();
    const float* bias = args.inputs.size() > 2 ? args.inputs[2].as<const float>() : nullptr;
    float* y = args.outputs[0].as<float>();
    int64_t lda = spec_.trans_a ? d_.m : d_.k, ldb = spec_.trans_b ? d_.k : d_.n;
    bool ta = spec_.trans_a && args.inputs[0].dims.size() > 1;
    bool tb = spec_.trans_b && args.inputs[1].dims.size() > 1;
    if (!ta) lda = d_.k;
    if (!tb) ldb = d_.n;
    int64_t rows = d_.fold ? d_.batch * d_.m : d_.m;
    if (d_.fold) {
      Sgemm(impl_, false, tb, rows, d_.n, d_.k, spec_.alpha, a, lda, b, ldb, 0.f, y, d_.n,
            args.workspace);
    } else {
      for (int64_t p = 0; p < d_.batch; ++p) {
        Sgemm(impl_, ta, tb, d_.m, d_.n, d_.k, spec_.alpha, a + d_.a_offsets[p], lda,
              b + d_.b_offsets[p], ldb, 0.f, y + p * d_.m * d_.n, d_.n, args.workspace);
      }
    }
    if (bias || spec_.act.kind != FusedActivation::kNone) {
      int64_t total = d_.batch * d_.m;
      ThreadPool::Default().ParallelFor(total, [&](int64_t r0, int64_t r1) {
        ApplyEpilogue(y + r0 * d_.n, r1 - r0, d_.n, d_.n, nullptr, bias, nullptr, spec_.act);
      });
    }
    return OkStatus();
  }

 private:
  MatMulSpec spec_;
  GemmImpl impl_;
  MatMulDims d_;
};

class MatMulProviderBase : public CpuFloatProvider {
 protected:
  static StatusOr<MatMulSpec> ReadSpec(const KernelRequest& request) {
    MatMulSpec s;
    if (request.node->op_type() == "FusedMatMul") {
      const AttributeMap& at = request.node->attrs();
      s.trans_a = at.GetInt("transA", 0) != 0;
      s.trans_b = at.GetInt("transB", 0) != 0;
      s.alpha = at.GetFloat("alpha", 1.f);
      KILN_ASSIGN_OR_RETURN(s.act, ParseFusedActivation(at));
    }
    return s;
  }

  std::vector<TacticConfig> F32Tactics(const KernelRequest& request) const override {
    auto spec = ReadSpec(request);
    if (!spec.ok() || request.inputs.size() < 2) return {};
    std::vector<int64_t> a = MaxDimsOf(request.inputs[0]), b = MaxDimsOf(request.inputs[1]);
    auto d = ResolveMatMul(*spec, a, b, false);
    if (!d.ok()) return {};
    std::vector<TacticConfig> out;
    for (const GemmTactic& t :
         GemmTactics("f32-matmul-cpu", d->fold ? d->batch * d->m : d->m, d->n, d->k)) {
      out.push_back({t.name, {static_cast<int64_t>(t.impl)}, t.workspace_bytes});
    }
    return out;
  }

  StatusOr<std::unique_ptr<Kernel>> CreateF32(const KernelRequest& request,
                                              const TacticConfig& tactic) const override {
    KILN_ASSIGN_OR_RETURN(MatMulSpec spec, ReadSpec(request));
    if (tactic.params.size() != 1 || tactic.params[0] < 0 || tactic.params[0] >= kNumGemmImpls) {
      return MakeError(ErrorCode::kInvalidArgument, "{}: tactic '{}' has invalid params", id(),
                       tactic.name);
    }
    return std::unique_ptr<Kernel>(
        std::make_unique<MatMulKernel>(spec, static_cast<GemmImpl>(tactic.params[0])));
  }
};

class MatMulProvider final : public MatMulProviderBase {
 public:
  std::string_view id() const override { return "cpu.matmul"; }
  std::string_view op_type() const override { return "MatMul"; }
};
KILN_REGISTER_KERNEL_PROVIDER(MatMulProvider);

class FusedMatMulProvider final : public MatMulProviderBase {
 public:
  std::string_view id() const override { return "cpu.fused_matmul"; }
  std::string_view op_type() const override { return "FusedMatMul"; }
};
KILN_REGISTER_KERNEL_PROVIDER(FusedMatMulProvider);

}  // namespace
}  // namespace kiln::cpu
