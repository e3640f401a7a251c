// CUDA providers of IsNaN and IsInf (kernel in classify.cu): float storage in, bool out.
#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/backends/cuda/cuda_launch_more.h"
#include "kiln/ops/op_table.h"

namespace kiln::cuda {
namespace {

CudaOpDef ClassifyDef(const char* op, bool nan) {
  return {
      .op_type = op,
      .accepts =
          [](const KernelRequest& r) {
            return IsFloatStorage(InType(r, 0)) && OutType(r, 0) == DataType::kBool;
          },
      .create =
          [nan](const KernelRequest& r) {
            const AttributeMap& at = r.node->attrs();
            bool pos = attrs::IsInf::detect_positive(at) != 0;
            bool neg = attrs::IsInf::detect_negative(at) != 0;
            Elem t = *ToElem(InType(r, 0));
            return MakeFnKernel([t, nan, pos, neg](const KernelRunArgs& a) {
              return Launched(
                  LaunchIsNanInf(t, nan, pos, neg, a.inputs[0].data, a.outputs[0].as<bool>(),
                                 a.outputs[0].num_elements(), StreamOf(a)),
                  nan ? "IsNaN kernel" : "IsInf kernel");
            });
          },
  };
}
KILN_CUDA_OP_PROVIDER(IsNaNProvider, ClassifyDef("IsNaN", true));
KILN_CUDA_OP_PROVIDER(IsInfProvider, ClassifyDef("IsInf", false));

}  // namespace
}  // namespace kiln::cuda
