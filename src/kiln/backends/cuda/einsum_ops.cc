// CUDA provider of Einsum (kernel in einsum.cu): the equations the CPU runs (ops/einsum.h's
// parser and plan, shared with the shape rule and the CPU kernel), in f32, f16 and bf16. The plan
// is made on the host in Prepare and passed to the kernel by value, its output and summed dims
// coalesced (size-1 dims dropped, runs that every operand walks contiguously merged).
#include <memory>
#include <string>
#include <vector>

#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/backends/cuda/cuda_launch_more.h"
#include "kiln/ops/einsum.h"

namespace kiln::cuda {
namespace {

StatusOr<EinsumEquation> ParseRequest(const KernelRequest& r) {
  std::vector<int64_t> ranks;
  for (const OperandDesc& d : r.inputs) ranks.push_back(static_cast<int64_t>(d.shape.size()));
  return ParseEinsum(r.node->attrs().GetString("equation", ""), ranks);
}

// Dims `axes` of the plan (outermost first) with every operand's strides, size-1 dims dropped
// and dim k merged into the one before it where each operand's stride there is its stride at k
// times k's extent. Fails when more than kEinsumMaxRank dims remain.
Status Coalesce(const EinsumPlan& p, const std::vector<int64_t>& axes, size_t operands,
                int32_t& rank, int64_t* dims, int64_t (*strides)[kEinsumMaxRank]) {
  std::vector<int64_t> md;
  std::vector<std::vector<int64_t>> ms(operands);
  for (int64_t axis : axes) {
    const int64_t extent = p.extent[static_cast<size_t>(axis)];
    if (extent == 1) continue;
    bool merge = !md.empty();
    for (size_t i = 0; i < operands && merge; ++i) {
      merge = ms[i].back() == p.stride[i][static_cast<size_t>(axis)] * extent;
    }
    if (merge) {
      md.back() *= extent;
      for (size_t i = 0; i < operands; ++i) ms[i].back() = p.stride[i][static_cast<size_t>(axis)];
    } else {
      md.push_back(extent);
      for (size_t i = 0; i < operands; ++i) ms[i].push_back(p.stride[i][static_cast<size_t>(axis)]);
    }
  }
  if (md.size() > static_cast<size_t>(kEinsumMaxRank)) {
    return MakeError(ErrorCode::kUnimplemented,
                     "Einsum with more than {} separate output or summed dims on CUDA",
                     kEinsumMaxRank);
  }
  rank = static_cast<int32_t>(md.size());
  for (size_t k = 0; k < md.size(); ++k) {
    dims[k] = md[k];
    for (size_t i = 0; i < operands; ++i) strides[i][k] = ms[i][k];
  }
  return OkStatus();
}

StatusOr<EinsumDesc> Describe(const EinsumEquation& eq, std::span<const TensorView> in) {
  KILN_ASSIGN_OR_RETURN(EinsumPlan p, PlanEinsum(eq, in));
  EinsumDesc d;
  d.operands = static_cast<int32_t>(in.size());
  d.red_size = p.red_size;
  KILN_RETURN_IF_ERROR(Coalesce(p, p.out_axes, in.size(), d.out_rank, d.out_dims, d.out_strides));
  KILN_RETURN_IF_ERROR(Coalesce(p, p.red_axes, in.size(), d.red_rank, d.red_dims, d.red_strides));
  return d;
}

CudaOpDef EinsumDef() {
  return {
      .op_type = "Einsum",
      .variant = "direct",
      .accepts =
          [](const KernelRequest& r) {
            const DataType t = OutType(r, 0);
            if (r.inputs.empty() || r.inputs.size() > static_cast<size_t>(kEinsumMaxOperands) ||
                !IsFloatStorage(t)) {
              return false;
            }
            for (const OperandDesc& d : r.inputs) {
              if (d.dtype != t) return false;
            }
            auto eq = ParseRequest(r);
            if (!eq.ok()) return false;
            const int64_t out = static_cast<int64_t>(eq->output_axes.size());
            return out <= kEinsumMaxRank && eq->num_axes() - out <= kEinsumMaxRank;
          },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        KILN_ASSIGN_OR_RETURN(EinsumEquation eq, ParseRequest(r));
        const Elem t = *ToElem(OutType(r, 0));
        // The plan depends on the bound shapes only: made in Prepare, read by Run.
        auto desc = std::make_shared<EinsumDesc>();
        return MakeFnKernel(
            [desc, t](const KernelRunArgs& a) {
              EinsumDesc d = *desc;
              for (size_t i = 0; i < a.inputs.size(); ++i) d.ptr[i] = a.inputs[i].data;
              return Launched(
                  LaunchEinsum(t, d, a.outputs[0].data, a.outputs[0].num_elements(), StreamOf(a)),
                  "Einsum kernel");
            },
            [desc, eq = std::move(eq)](std::span<const TensorView> in,
                                       std::span<const TensorView>) -> StatusOr<size_t> {
              KILN_ASSIGN_OR_RETURN(*desc, Describe(eq, in));
              return size_t{0};
            });
      },
  };
}
KILN_CUDA_OP_PROVIDER(EinsumDirectProvider, EinsumDef());

}  // namespace
}  // namespace kiln::cuda
