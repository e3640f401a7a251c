// CUDA providers of Neg, Abs and Sign on signed integers (kernel in int_unary.cu), next to the
// float providers of elementwise_ops.cc (which take float storage only).
#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/backends/cuda/cuda_launch_more.h"

namespace kiln::cuda {
namespace {

CudaOpDef IntUnaryDef(const char* op, IntUnaryOp kind) {
  return {
      .op_type = op,
      .variant = "int",
      .accepts =
          [](const KernelRequest& r) {
            DataType t = InType(r, 0);
            return (t == DataType::kInt8 || t == DataType::kInt32 || t == DataType::kInt64) &&
                   OutType(r, 0) == t;
          },
      .create =
          [kind](const KernelRequest& r) {
            Elem t = *ToElem(InType(r, 0));
            return MakeFnKernel([kind, t](const KernelRunArgs& a) {
              return Launched(LaunchIntUnary(kind, t, a.inputs[0].data, a.outputs[0].data,
                                             a.outputs[0].num_elements(), StreamOf(a)),
                              "integer unary kernel");
            });
          },
  };
}
#define KILN_UNARY_OP(Name, formula)
#define KILN_INT_UNARY_OP(Name, formula) \
  KILN_CUDA_OP_PROVIDER(Name##IntProvider, IntUnaryDef(#Name, IntUnaryOp::k##Name));
#include "kiln/ops/unary_ops.inc"
#undef KILN_INT_UNARY_OP
#undef KILN_UNARY_OP

}  // namespace
}  // namespace kiln::cuda
