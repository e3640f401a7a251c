// CUDA providers of the Reduce* ops on integers (kernel in reduce_int.cu), next to the float
// providers of reduce_ops.cc: ReduceSum/Mean/Max/Min/Prod/SumSquare on i32/i64, ReduceMax/Min on
// bool too (the types the CPU reference takes). The axes input must be a build-time constant.
#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/backends/cuda/cuda_launch_more.h"

namespace kiln::cuda {
namespace {

class IntReduceKernel final : public Kernel {
 public:
  IntReduceKernel(IntReduceOp op, Elem t, std::vector<int64_t> axes, bool noop)
      : op_(op), t_(t), axes_(std::move(axes)), noop_(noop) {}
  StatusOr<size_t> Prepare(std::span<const TensorView> in, std::span<const TensorView>) override {
    const auto& x = in[0].dims;
    size_t rank = x.size();
    // No axes: all of them, unless noop_with_empty_axes (then none: a copy).
    std::vector<bool> reduce(rank, axes_.empty() && !noop_);
    for (int64_t ax : axes_) {
      int64_t a = ax < 0 ? ax + static_cast<int64_t>(rank) : ax;
      if (a < 0 || a >= static_cast<int64_t>(rank)) {
        return MakeError(ErrorCode::kShapeMismatch, "reduce axis {} of rank {}", ax, rank);
      }
      reduce[static_cast<size_t>(a)] = true;
    }
    std::vector<int64_t> strides = DenseStrides(x);
    std::vector<int64_t> kd, ks, rd, rs;
    outputs_ = 1;
    count_ = 1;
    for (size_t i = 0; i < rank; ++i) {
      (reduce[i] ? rd : kd).push_back(x[i]);
      (reduce[i] ? rs : ks).push_back(strides[i]);
      (reduce[i] ? count_ : outputs_) *= x[i];
    }
    kept_ = CoalesceOne(kd, ks, 0);
    red_ = CoalesceOne(rd, rs, 0);
    if (kept_.rank < 0 || red_.rank < 0) {
      return MakeError(ErrorCode::kUnimplemented, "reduction of more than {} separate axes",
                       kMaxRank);
    }
    return size_t{0};
  }
  Status Run(const KernelRunArgs& a) override {
    return Launched(LaunchIntReduce(op_, t_, a.inputs[0].data, a.outputs[0].data, kept_, outputs_,
                                    red_, count_, StreamOf(a)),
                    "integer reduce kernel");
  }

 private:
  IntReduceOp op_;
  Elem t_;
  std::vector<int64_t> axes_;
  bool noop_;
  Strided kept_, red_;
  int64_t outputs_ = 1, count_ = 1;
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
            if (!type_ok || OutType(r, 0) != t) return false;
            // The axes input, when present, must be constant (no host reads at run time).
            return r.inputs.size() < 2 || InType(r, 1) == DataType::kUndefined ||
                   ConstantInts(r, 1).has_value();
          },
      .create = [kind](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        std::vector<int64_t> axes = ConstantInts(r, 1).value_or(std::vector<int64_t>{});
        bool noop = r.node->attrs().GetInt("noop_with_empty_axes", 0) != 0;
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
