// Einsum on the CPU: any equation (ops/einsum.h), f32 (f16/bf16 through the float wrapper) and
// f64. Each
// output element sums, over the labels the output drops, the product of the operands' elements;
// an operand reads through one stride per axis of the iteration space (a label repeated in one
// operand adds its strides: the diagonal; an ellipsis dimension of extent 1 broadcasts with
// stride 0). Accumulation in double. Direct loops: correct for every equation; the common
// matrix-product equations run at naive-GEMM speed.
#include <algorithm>
#include <memory>
#include <vector>

#include "kiln/backends/cpu/op_util.h"
#include "kiln/ir/sizes.h"
#include "kiln/ops/einsum.h"

namespace kiln::cpu {
namespace {

// Bounds of the per-thread scratch (no allocation while executing): more operands or axes than
// this and the provider offers no kernel (KILN-E3003 names the layer).
constexpr size_t kMaxOperands = 8;
constexpr size_t kMaxAxes = 24;

template <typename T>
void RunEinsum(const EinsumPlan& p, std::span<const TensorView> in, T* y) {
  const size_t ops = in.size();
  ParallelRows(p.out_size, SatMul(p.red_size, static_cast<int64_t>(ops)),
               [&](int64_t b, int64_t e) {
                 int64_t base[kMaxOperands], off[kMaxOperands], idx[kMaxAxes];
                 const size_t nred = p.red_axes.size();
                 for (int64_t o = b; o < e; ++o) {
                   std::fill(base, base + ops, 0);
                   int64_t rest = o;
                   for (size_t k = p.out_axes.size(); k-- > 0;) {
                     const size_t axis = static_cast<size_t>(p.out_axes[k]);
                     const int64_t c = rest % p.extent[axis];
                     rest /= p.extent[axis];
                     for (size_t i = 0; i < ops; ++i) base[i] += c * p.stride[i][axis];
                   }
                   std::fill(idx, idx + nred, 0);
                   std::copy(base, base + ops, off);
                   double acc = 0;
                   for (int64_t r = 0; r < p.red_size; ++r) {
                     double prod = 1;
                     for (size_t i = 0; i < ops; ++i) prod *= in[i].as<const T>()[off[i]];
                     acc += prod;
                     // Next reduction index (an odometer over red_axes, the last fastest).
                     for (size_t k = nred; k-- > 0;) {
                       const size_t axis = static_cast<size_t>(p.red_axes[k]);
                       for (size_t i = 0; i < ops; ++i) off[i] += p.stride[i][axis];
                       if (++idx[k] < p.extent[axis]) break;
                       for (size_t i = 0; i < ops; ++i) off[i] -= idx[k] * p.stride[i][axis];
                       idx[k] = 0;
                     }
                   }
                   y[o] = static_cast<T>(acc);
                 }
               });
}

StatusOr<EinsumEquation> ParseRequest(const KernelRequest& r) {
  std::vector<int64_t> ranks;
  for (const OperandDesc& d : r.inputs) ranks.push_back(static_cast<int64_t>(d.shape.size()));
  return ParseEinsum(r.node->attrs().GetString("equation", ""), ranks);
}

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "Einsum",
      .accepts =
          [](const KernelRequest& r) {
            const DataType t = OutType(r, 0);
            if (r.inputs.empty() || r.inputs.size() > kMaxOperands ||
                (t != DataType::kFloat32 && t != DataType::kFloat64)) {
              return false;
            }
            for (const OperandDesc& d : r.inputs) {
              if (d.dtype != t) return false;
            }
            auto eq = ParseRequest(r);
            return eq.ok() && eq->num_axes() <= static_cast<int64_t>(kMaxAxes);
          },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        KILN_ASSIGN_OR_RETURN(EinsumEquation eq, ParseRequest(r));
        // The plan depends on the bound shapes only: made in Prepare, read by Run.
        auto plan = std::make_shared<EinsumPlan>();
        return std::unique_ptr<Kernel>(std::make_unique<FnKernel>(
            [plan](const KernelRunArgs& a) {
              if (a.outputs[0].dtype == DataType::kFloat64) {
                RunEinsum(*plan, a.inputs, a.outputs[0].as<double>());
              } else {
                RunEinsum(*plan, a.inputs, a.outputs[0].as<float>());
              }
              return OkStatus();
            },
            [plan, eq = std::move(eq)](std::span<const TensorView> in,
                                       std::span<const TensorView>) -> StatusOr<size_t> {
              KILN_ASSIGN_OR_RETURN(*plan, PlanEinsum(eq, in));
              return size_t{0};
            }));
      },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
