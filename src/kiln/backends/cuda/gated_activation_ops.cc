// CUDA provider of GatedActivation (SwiGLU, GeGLU): one elementwise pass, act(a) * b, over two
// inputs or the packed gate/up halves of one (kernel in blas_kernels.cu, beside the GEMM
// epilogue whose activation formulas it shares). f32, f16 and bf16 storage, FP32 math.
#include "kiln/backends/cuda/blas_kernels.h"
#include "kiln/backends/cuda/cuda_common.h"
#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/ops/fused.h"

namespace kiln::cuda {
namespace {

static_assert(static_cast<int>(BlasAct::kSilu) == static_cast<int>(FusedActivation::kSilu));
static_assert(static_cast<int>(BlasAct::kGeluTanh) == static_cast<int>(FusedActivation::kGeluTanh));

class GatedActivationKernel final : public Kernel {
 public:
  GatedActivationKernel(FusedActivationSpec act, BlasType type, bool packed)
      : act_(act), type_(type), packed_(packed) {}
  StatusOr<size_t> Prepare(std::span<const TensorView> in, std::span<const TensorView>) override {
    const auto& a = in[0].dims;
    if (packed_) {
      if (a.empty() || a.back() % 2 != 0) {
        return MakeError(ErrorCode::kShapeMismatch,
                         "GatedActivation's packed input needs an even last axis");
      }
      n_ = a.back() / 2;
      rows_ = n_ == 0 ? 0 : in[0].num_elements() / (2 * n_);
      stride_ = 2 * n_;
    } else {
      if (in[1].num_elements() != in[0].num_elements()) {
        return MakeError(ErrorCode::kShapeMismatch,
                         "GatedActivation on CUDA needs B of A's shape ({} vs {} elements)",
                         in[1].num_elements(), in[0].num_elements());
      }
      n_ = a.empty() ? 1 : a.back();
      rows_ = n_ == 0 ? 0 : in[0].num_elements() / n_;
      stride_ = n_;
    }
    return size_t{0};
  }
  Status Run(const KernelRunArgs& a) override {
    GatedActivationParams p;
    p.a = a.inputs[0].data;
    p.b = packed_ ? static_cast<const char*>(a.inputs[0].data) +
                        static_cast<size_t>(n_) * SizeOf(a.inputs[0].dtype)
                  : a.inputs[1].data;
    p.y = a.outputs[0].data;
    p.type = type_;
    p.rows = rows_;
    p.n = n_;
    p.stride = stride_;
    p.act = static_cast<BlasAct>(act_.kind);
    p.act_min = act_.min;
    p.act_max = act_.max;
    return Launched(LaunchGatedActivation(p, StreamOf(a)), "GatedActivation kernel");
  }

 private:
  FusedActivationSpec act_;
  BlasType type_;
  bool packed_;
  int64_t rows_ = 0, n_ = 0, stride_ = 0;
};

CudaOpDef GatedActivationDef() {
  return {
      .op_type = "GatedActivation",
      .accepts =
          [](const KernelRequest& r) {
            DataType t = InType(r, 0);
            if (!ToBlasType(t) || OutType(r, 0) != t) return false;
            if (r.inputs.size() > 1 && InType(r, 1) != t) return false;
            auto act = ParseFusedActivation(r.node->attrs());
            return act.ok() && act->kind != FusedActivation::kNone;
          },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        KILN_ASSIGN_OR_RETURN(FusedActivationSpec act, ParseFusedActivation(r.node->attrs()));
        return std::unique_ptr<Kernel>(std::make_unique<GatedActivationKernel>(
            act, *ToBlasType(InType(r, 0)), r.inputs.size() < 2));
      },
  };
}
KILN_CUDA_OP_PROVIDER(GatedActivationProvider, GatedActivationDef());

}  // namespace
}  // namespace kiln::cuda
