// GatedActivation on the CPU (the reference for other backends): y = act(a) * b per element, a and
// b two inputs of one shape or the two halves of the packed input's last axis. FP32 math (f16/bf16
// storage comes from CpuFloatProvider); the activation is the fused ops' (ApplyActivation).
#include <algorithm>

#include "kiln/backends/cpu/op_util.h"
#include "kiln/backends/cpu/sgemm.h"
#include "kiln/ops/fused.h"

namespace kiln::cpu {
namespace {

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "GatedActivation",
      .variant = "rows",
      .accepts =
          [](const KernelRequest& r) {
            return InType(r, 0) == DataType::kFloat32 &&
                   (r.inputs.size() < 2 || InType(r, 1) == DataType::kFloat32);
          },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        KILN_ASSIGN_OR_RETURN(FusedActivationSpec act, ParseFusedActivation(r.node->attrs()));
        const bool packed = r.inputs.size() < 2;
        auto run = [act, packed](const KernelRunArgs& a) {
          const TensorView& x = a.inputs[0];
          // Rows of n outputs; a row of A (and B) starts every `stride` elements.
          int64_t n, rows, stride;
          if (packed) {
            n = x.dims.empty() ? 0 : x.dims.back() / 2;
            rows = n == 0 ? 0 : x.num_elements() / (2 * n);
            stride = 2 * n;
          } else {
            if (a.inputs[1].num_elements() != x.num_elements()) {
              return MakeError(ErrorCode::kShapeMismatch,
                               "GatedActivation needs B of A's shape ({} vs {} elements)",
                               a.inputs[1].num_elements(), x.num_elements());
            }
            n = x.dims.empty() ? 1 : x.dims.back();
            rows = n == 0 ? 0 : x.num_elements() / n;
            stride = n;
          }
          const float* pa = x.as<const float>();
          const float* pb = packed ? pa + n : a.inputs[1].as<const float>();
          float* py = a.outputs[0].as<float>();
          ParallelRows(rows, n * 8, [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r) {
              float* q = py + r * n;
              std::copy(pa + r * stride, pa + r * stride + n, q);
              ApplyActivation(act, q, n);
              const float* g = pb + r * stride;
              for (int64_t j = 0; j < n; ++j) q[j] *= g[j];
            }
          });
          return OkStatus();
        };
        return KernelOr(run);
      },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
