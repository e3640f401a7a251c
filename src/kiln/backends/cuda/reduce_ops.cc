// CUDA providers of the Reduce* ops (kernels in reduce.cu). The axes input must be a build-time
// constant (it always is after the importer and constant folding); Prepare picks the row, column
// or strided form from the reduced axis set, so Run only launches.
#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/ops/op_table.h"

namespace kiln::cuda {
namespace {

class ReduceKernel final : public Kernel {
 public:
  ReduceKernel(ReduceOp op, Elem t, std::vector<int64_t> axes, bool noop)
      : op_(op), t_(t), axes_(std::move(axes)), noop_(noop) {}
  StatusOr<size_t> Prepare(std::span<const TensorView> in, std::span<const TensorView>) override {
    const auto& x = in[0].dims;
    const size_t rank = x.size();
    KILN_ASSIGN_OR_RETURN(std::vector<bool> reduce, ReducedAxes(x, axes_, noop_));
    // Adjacent reduced axes (ignoring size-1 dims) make [outer, n, inner].
    int first = -1, last = -1;
    for (size_t i = 0; i < rank; ++i) {
      if (reduce[i] && x[i] != 1) {
        if (first < 0) first = static_cast<int>(i);
        last = static_cast<int>(i);
      }
    }
    adjacent_ = true;
    for (int i = first; i >= 0 && i <= last; ++i) {
      if (!reduce[i] && x[i] != 1) adjacent_ = false;
    }
    outer_ = n_ = inner_ = 1;
    if (adjacent_) {
      for (size_t i = 0; i < rank; ++i) {
        int ii = static_cast<int>(i);
        (first < 0 || ii < first ? outer_ : (ii <= last ? n_ : inner_)) *= x[i];
      }
      return size_t{0};
    }
    KILN_ASSIGN_OR_RETURN(plan_, PlanStridedReduction(x, reduce));
    return size_t{0};
  }
  Status Run(const KernelRunArgs& a) override {
    if (adjacent_) {
      return Launched(LaunchReduce(op_, t_, a.inputs[0].data, a.outputs[0].data, outer_, n_, inner_,
                                   StreamOf(a)),
                      "reduce kernel");
    }
    return Launched(LaunchReduceStrided(op_, t_, a.inputs[0].data, a.outputs[0].data, plan_.kept,
                                        plan_.outputs, plan_.red, plan_.count, StreamOf(a)),
                    "strided reduce kernel");
  }

 private:
  ReduceOp op_;
  Elem t_;
  std::vector<int64_t> axes_;
  bool noop_;
  bool adjacent_ = true;
  int64_t outer_ = 1, n_ = 1, inner_ = 1;
  StridedReduction plan_;  // when the reduced axes are not adjacent
};

CudaOpDef ReduceDef(const char* op, ReduceOp kind) {
  return {
      .op_type = op,
      .accepts =
          [](const KernelRequest& r) {
            return IsFloatStorage(InType(r, 0)) && ReduceAxesAreConstant(r);
          },
      .create = [kind](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        std::vector<int64_t> axes = ConstantInts(r, 1).value_or(std::vector<int64_t>{});
        bool noop = attrs::ReduceSum::noop_with_empty_axes(*r.node) != 0;
        return std::unique_ptr<Kernel>(
            std::make_unique<ReduceKernel>(kind, *ToElem(InType(r, 0)), std::move(axes), noop));
      },
  };
}
KILN_CUDA_OP_PROVIDER(ReduceSumProvider, ReduceDef("ReduceSum", ReduceOp::kSum));
KILN_CUDA_OP_PROVIDER(ReduceMeanProvider, ReduceDef("ReduceMean", ReduceOp::kMean));
KILN_CUDA_OP_PROVIDER(ReduceMaxProvider, ReduceDef("ReduceMax", ReduceOp::kMax));
KILN_CUDA_OP_PROVIDER(ReduceMinProvider, ReduceDef("ReduceMin", ReduceOp::kMin));
KILN_CUDA_OP_PROVIDER(ReduceProdProvider, ReduceDef("ReduceProd", ReduceOp::kProd));
KILN_CUDA_OP_PROVIDER(ReduceSumSquareProvider, ReduceDef("ReduceSumSquare", ReduceOp::kSumSquare));
KILN_CUDA_OP_PROVIDER(ReduceL2Provider, ReduceDef("ReduceL2", ReduceOp::kL2));
KILN_CUDA_OP_PROVIDER(ReduceLogSumExpProvider, ReduceDef("ReduceLogSumExp", ReduceOp::kLogSumExp));

}  // namespace
}  // namespace kiln::cuda
