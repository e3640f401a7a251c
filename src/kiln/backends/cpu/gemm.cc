// Gemm and FusedGemm on the CPU: Y = act(alpha * op(A) op(B) + beta * C).
// Tactics (sgemm.h's GemmTactics): f32-gemm-cpu-openblas (cblas_sgemm slices on kiln's
// ThreadPool), -openblas-1thread (one call, no fork/join), -blocked-8x8 and -blocked-8x8-k128
// (kiln's packed kernel, K blocks of 256 or 128).
#include "kiln/backends/cpu/conv_common.h"
#include "kiln/backends/cpu/cpu_kernel.h"
#include "kiln/backends/cpu/sgemm.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

struct GemmSpec {
  bool trans_a = false, trans_b = false;
  float alpha = 1.f, beta = 1.f;
  FusedActivationSpec act;
};

class GemmKernel final : public Kernel {
 public:
  GemmKernel(GemmSpec spec, GemmImpl impl) : spec_(spec), impl_(impl) {}

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    const auto& a = inputs[0].dims;
    const auto& b = inputs[1].dims;
    if (a.size() != 2 || b.size() != 2) {
      return MakeError(ErrorCode::kShapeMismatch, "Gemm operands must be 2-D");
    }
    m_ = spec_.trans_a ? a[1] : a[0];
    k_ = spec_.trans_a ? a[0] : a[1];
    n_ = spec_.trans_b ? b[0] : b[1];
    if ((spec_.trans_b ? b[1] : b[0]) != k_ || outputs[0].num_elements() != m_ * n_) {
      return MakeError(ErrorCode::kShapeMismatch, "Gemm operand dims disagree");
    }
    has_c_ = inputs.size() > 2 && inputs[2].data != nullptr && spec_.beta != 0.f;
    if (has_c_) {
      const auto& c = inputs[2].dims;
      if (c.size() > 2) return MakeError(ErrorCode::kShapeMismatch, "Gemm C has rank > 2");
      int64_t cm = c.size() == 2 ? c[0] : 1, cn = c.empty() ? 1 : c.back();
      if ((cm != 1 && cm != m_) || (cn != 1 && cn != n_)) {
        return MakeError(ErrorCode::kShapeMismatch, "Gemm C does not broadcast to [{}, {}]", m_,
                         n_);
      }
      c_row_stride_ = cm == 1 ? 0 : cn;
      c_col_stride_ = cn == 1 ? 0 : 1;
    }
    return SgemmWorkspaceBytes(impl_, m_, n_, k_);
  }

  Status Run(const KernelRunArgs& args) override {
    const float* a = args.inputs[0].as<const float>();
    const float* b = args.inputs[1].as<const float>();
    float* y = args.outputs[0].as<float>();
    float beta = 0.f;
    if (has_c_) {
      const float* c = args.inputs[2].as<const float>();
      for (int64_t i = 0; i < m_; ++i) {
        for (int64_t j = 0; j < n_; ++j) y[i * n_ + j] = c[i * c_row_stride_ + j * c_col_stride_];
      }
      beta = spec_.beta;
    }
    Sgemm(impl_, spec_.trans_a, spec_.trans_b, m_, n_, k_, spec_.alpha, a, spec_.trans_a ? m_ : k_,
          b, spec_.trans_b ? k_ : n_, beta, y, n_, args.workspace);
    ApplyActivation(spec_.act, y, m_ * n_);
    return OkStatus();
  }

 private:
  GemmSpec spec_;
  GemmImpl impl_;
  int64_t m_ = 0, n_ = 0, k_ = 0, c_row_stride_ = 0, c_col_stride_ = 0;
  bool has_c_ = false;
};

class GemmProviderBase : public CpuFloatProvider {
 protected:
  static StatusOr<GemmSpec> ReadSpec(const KernelRequest& request) {
    const AttributeMap& at = request.node->attrs();
    GemmSpec s;
    s.trans_a = attrs::Gemm::transA(at) != 0;
    s.trans_b = attrs::Gemm::transB(at) != 0;
    s.alpha = attrs::Gemm::alpha(at);
    s.beta = attrs::Gemm::beta(at);
    if (IsOp(*request.node, OpType::kFusedGemm)) {
      KILN_ASSIGN_OR_RETURN(s.act, ParseFusedActivation(at));
    }
    return s;
  }

  std::vector<TacticConfig> F32Tactics(const KernelRequest& request) const override {
    auto spec = ReadSpec(request);
    if (!spec.ok() || request.inputs.size() < 2) return {};
    std::vector<int64_t> a = MaxDimsOf(request.inputs[0]), b = MaxDimsOf(request.inputs[1]);
    if (a.size() != 2 || b.size() != 2) return {};
    int64_t m = spec->trans_a ? a[1] : a[0], k = spec->trans_a ? a[0] : a[1];
    int64_t n = spec->trans_b ? b[0] : b[1];
    return GemmTactics("f32-gemm-cpu", m, n, k);
  }

  StatusOr<std::unique_ptr<Kernel>> CreateF32(const KernelRequest& request,
                                              const TacticConfig& tactic) const override {
    KILN_ASSIGN_OR_RETURN(GemmSpec spec, ReadSpec(request));
    KILN_ASSIGN_OR_RETURN(GemmImpl impl, GemmImplOf(tactic, id()));
    return std::unique_ptr<Kernel>(std::make_unique<GemmKernel>(spec, impl));
  }
};

class GemmProvider final : public GemmProviderBase {
 public:
  std::string_view id() const override { return "cpu.gemm"; }
  std::string_view op_type() const override { return "Gemm"; }
};
KILN_REGISTER_KERNEL_PROVIDER(GemmProvider);

class FusedGemmProvider final : public GemmProviderBase {
 public:
  std::string_view id() const override { return "cpu.fused_gemm"; }
  std::string_view op_type() const override { return "FusedGemm"; }
};
KILN_REGISTER_KERNEL_PROVIDER(FusedGemmProvider);

}  // namespace
}  // namespace kiln::cpu
