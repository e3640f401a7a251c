// CUDA providers of the variadic elementwise ops (kernel in variadic.cu): Sum and Mean with any
// number of inputs up to kMaxVariadicInputs, the variadic rows of ops/binary_ops.inc (Max, Min)
// with other than two (the binary provider in elementwise_ops.cc takes two). Broadcast strides are
// worked out in Prepare.
#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/backends/cuda/cuda_launch_more.h"

namespace kiln::cuda {
namespace {

class VariadicKernel final : public Kernel {
 public:
  VariadicKernel(VariadicOp op, Elem t) : op_(op), t_(t) {}
  StatusOr<size_t> Prepare(std::span<const TensorView> in,
                           std::span<const TensorView> out) override {
    const auto& y = out[0].dims;
    if (y.size() > static_cast<size_t>(kMaxRank) || in.size() > kMaxVariadicInputs) {
      return MakeError(ErrorCode::kUnimplemented,
                       "variadic op of {} inputs at rank {} on CUDA (at most {} inputs, rank {})",
                       in.size(), y.size(), kMaxVariadicInputs, kMaxRank);
    }
    d_ = VariadicDesc{};
    d_.count = static_cast<int32_t>(in.size());
    d_.rank = static_cast<int32_t>(y.size());
    d_.dense = true;
    for (size_t a = 0; a < y.size(); ++a) d_.dims[a] = y[a];
    for (size_t k = 0; k < in.size(); ++k) {
      const auto& x = in[k].dims;
      if (x.size() > y.size()) {
        return MakeError(ErrorCode::kShapeMismatch, "input {} of rank {} broadcast to rank {}", k,
                         x.size(), y.size());
      }
      d_.dense = d_.dense && SameDims(x, y);
      std::vector<int64_t> dense = DenseStrides(x);
      size_t lead = y.size() - x.size();
      for (size_t j = 0; j < x.size(); ++j) {
        if (x[j] != 1 && x[j] != y[lead + j]) {
          return MakeError(ErrorCode::kShapeMismatch,
                           "input {} dim {} of size {} cannot broadcast "
                           "to {}",
                           k, j, x[j], y[lead + j]);
        }
        d_.strides[k][lead + j] = x[j] == 1 ? 0 : dense[j];
      }
    }
    return size_t{0};
  }
  Status Run(const KernelRunArgs& a) override {
    VariadicDesc d = d_;
    for (int k = 0; k < d.count; ++k) d.ptr[k] = a.inputs[k].data;
    return Launched(
        LaunchVariadic(op_, t_, d, a.outputs[0].data, a.outputs[0].num_elements(), StreamOf(a)),
        "variadic elementwise kernel");
  }

 private:
  VariadicOp op_;
  Elem t_;
  VariadicDesc d_;
};

// The CPU reference's types (its ArithType): floats and i8/u8/i32/i64.
bool VariadicType(DataType t) {
  return IsFloatStorage(t) || t == DataType::kInt32 || t == DataType::kInt64 ||
         t == DataType::kInt8 || t == DataType::kUInt8;
}

CudaOpDef VariadicDef(const char* op, VariadicOp kind, bool skip_binary) {
  return {
      .op_type = op,
      .variant = "variadic",
      .accepts =
          [kind, skip_binary](const KernelRequest& r) {
            size_t n = r.inputs.size();
            if (n < 1 || n > static_cast<size_t>(kMaxVariadicInputs)) return false;
            if (skip_binary && n == 2) return false;  // elementwise_ops.cc's binary kernel
            DataType t = InType(r, 0);
            for (size_t i = 1; i < n; ++i) {
              if (InType(r, i) != t) return false;
            }
            // Mean is a float op (its shape rule rejects integers).
            if (kind == VariadicOp::kMean && !IsFloatStorage(t)) return false;
            return VariadicType(t) && OutType(r, 0) == t;
          },
      .create = [kind](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        return std::unique_ptr<Kernel>(
            std::make_unique<VariadicKernel>(kind, *ToElem(InType(r, 0))));
      },
  };
}
KILN_CUDA_OP_PROVIDER(SumProvider, VariadicDef("Sum", VariadicOp::kSum, false));
KILN_CUDA_OP_PROVIDER(MeanProvider, VariadicDef("Mean", VariadicOp::kMean, false));
// One per KILN_VARIADIC_OP row of ops/binary_ops.inc ("cuda.max.variadic", ...), for other than
// two inputs.
#define KILN_BINARY_OP(Name, Types, formula)
#define KILN_VARIADIC_OP(Name, Types, formula) \
  KILN_CUDA_OP_PROVIDER(Name##VariadicProvider, VariadicDef(#Name, VariadicOp::k##Name, true));
#include "kiln/ops/binary_ops.inc"
#undef KILN_VARIADIC_OP
#undef KILN_BINARY_OP

}  // namespace
}  // namespace kiln::cuda
