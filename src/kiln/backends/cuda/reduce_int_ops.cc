// CUDA providers of the Reduce* ops on integers (kernel in reduce_int.cu), next to the float
// providers of reduce_ops.cc: ReduceSum/Mean/Max/Min/Prod/SumSquare on i32/i64, ReduceMax/Min on
// bool too (the types the CPU reference takes). The axes input must be a build-time constant.
#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/backends/cuda/cuda_launch_more.h"
#include "kiln/ops/op_table.h"

namespace kiln::cuda {
namespace {

class IntReduceKernel final : public Kernel {
 public:
  IntReduceKernel(IntReduceOp op, Elem t, std::vector<int64_t> axes, bool noop)
      : op_(op), t_(t), axes_(std::move(axes)), noop_(noop) {}
  StatusOr<size_t> Prepare(std::span<const TensorView> in, std::span<const TensorView>) override {
    KILN_ASSIGN_OR_RETURN(std::vector<bool> reduce, ReducedAxes(in[0].dims, axes_, noop_));
    KILN_ASSIGN_OR_RETURN(plan_, PlanStridedReduction(in[0].dims, reduce));
    return size_t{0};
  }
  Status Run(const KernelRunArgs& a) override {
    return Launched(LaunchIntReduce(op_, t_, a.inputs[0].data, a.outputs[0].data, plan_.kept,
                                    plan_.outputs, plan_.red, plan_.count, StreamOf(a)),
                    "integer reduce kernel");
  }

 private:
  IntReduceOp op_;
  Elem t_;
  std::vector<int64_t> axes_;
  bool noop_;
  StridedReduction plan_;
};

CudaOpDef IntReduceDef(const char* op, IntReduceOp kind) {
  return {
      .op_type = op,
      .variant = "int",
      .accepts =
          [kind](const KernelRequest& r) {
            DataType t = InType(r, 0);
            bool max_min = kind == IntReduceOp::kMax || kind == IntReduceOp::kMin;
            bool type_ok =
                t == DataType::kInt32 || t == DataType::kInt64 || (max_min && t == DataType::kBool);
            return type_ok && OutType(r, 0) == t && ReduceAxesAreConstant(r);
          },
      .create = [kind](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        std::vector<int64_t> axes = ConstantInts(r, 1).value_or(std::vector<int64_t>{});
        bool noop = attrs::ReduceSum::noop_with_empty_axes(*r.node) != 0;
        return std::unique_ptr<Kernel>(
            std::make_unique<IntReduceKernel>(kind, *ToElem(InType(r, 0)), std::move(axes), noop));
      },
  };
}
KILN_CUDA_OP_PROVIDER(ReduceSumIntProvider, IntReduceDef("ReduceSum", IntReduceOp::kSum));
KILN_CUDA_OP_PROVIDER(ReduceMeanIntProvider, IntReduceDef("ReduceMean", IntReduceOp::kMean));
KILN_CUDA_OP_PROVIDER(ReduceMaxIntProvider, IntReduceDef("ReduceMax", IntReduceOp::kMax));
KILN_CUDA_OP_PROVIDER(ReduceMinIntProvider, IntReduceDef("ReduceMin", IntReduceOp::kMin));
KILN_CUDA_OP_PROVIDER(ReduceProdIntProvider, IntReduceDef("ReduceProd", IntReduceOp::kProd));
KILN_CUDA_OP_PROVIDER(ReduceSumSquareIntProvider,
                      IntReduceDef("ReduceSumSquare", IntReduceOp::kSumSquare));

}  // namespace
}  // namespace kiln::cuda
