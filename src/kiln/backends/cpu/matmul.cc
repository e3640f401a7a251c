// MatMul and FusedMatMul on the CPU: numpy batched broadcasting and 1-D operands.
// Y = act(alpha * op(A) @ op(B) + bias) (FusedMatMul; plain MatMul has alpha 1, no bias).
// Tactics: f32-matmul-cpu-openblas[-1thread] and f32-matmul-cpu-blocked-8x8[-k128] (sgemm.h's
// GemmTactics). When B has no batch dims
// and A is not transposed, the batch is folded into M: one large sgemm (the BERT case).
#include <algorithm>

#include "kiln/backends/cpu/conv_common.h"
#include "kiln/backends/cpu/cpu_kernel.h"
#include "kiln/backends/cpu/sgemm.h"
#include "kiln/ops/matmul_geometry.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

struct MatMulSpec {
  bool trans_a = false, trans_b = false;
  float alpha = 1.f;
  FusedActivationSpec act;
};

class MatMulKernel final : public Kernel {
 public:
  MatMulKernel(MatMulSpec spec, GemmImpl impl) : spec_(spec), impl_(impl) {}

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    KILN_ASSIGN_OR_RETURN(d_, ResolveMatMulGeometry(spec_.trans_a, spec_.trans_b, inputs[0].dims,
                                                    inputs[1].dims, true));
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
    const bool ta = d_.ta, tb = d_.tb;
    const int64_t lda = ta ? d_.m : d_.k, ldb = tb ? d_.k : d_.n;
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
  MatMulGeometry d_;
};

class MatMulProviderBase : public CpuFloatProvider {
 protected:
  static StatusOr<MatMulSpec> ReadSpec(const KernelRequest& request) {
    MatMulSpec s;
    if (IsOp(*request.node, OpType::kFusedMatMul)) {
      const AttributeMap& at = request.node->attrs();
      s.trans_a = attrs::FusedMatMul::transA(at) != 0;
      s.trans_b = attrs::FusedMatMul::transB(at) != 0;
      s.alpha = attrs::FusedMatMul::alpha(at);
      KILN_ASSIGN_OR_RETURN(s.act, ParseFusedActivation(at));
    }
    return s;
  }

  std::vector<TacticConfig> F32Tactics(const KernelRequest& request) const override {
    auto spec = ReadSpec(request);
    if (!spec.ok() || request.inputs.size() < 2) return {};
    std::vector<int64_t> a = MaxDimsOf(request.inputs[0]), b = MaxDimsOf(request.inputs[1]);
    auto d = ResolveMatMulGeometry(spec->trans_a, spec->trans_b, a, b, false);
    if (!d.ok()) return {};
    return GemmTactics("f32-matmul-cpu", d->fold ? d->batch * d->m : d->m, d->n, d->k);
  }

  StatusOr<std::unique_ptr<Kernel>> CreateF32(const KernelRequest& request,
                                              const TacticConfig& tactic) const override {
    KILN_ASSIGN_OR_RETURN(MatMulSpec spec, ReadSpec(request));
    KILN_ASSIGN_OR_RETURN(GemmImpl impl, GemmImplOf(tactic, id()));
    return std::unique_ptr<Kernel>(std::make_unique<MatMulKernel>(spec, impl));
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
