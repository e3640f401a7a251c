// CUDA providers of GatherElements, ScatterND and OneHot (kernels in scatter_gather.cu). Indices
// are device data: out-of-range ones are errors, as on the CPU, checked as Gather's are
// (index_fault.h: after the layer when it runs eagerly; constant indices in Prepare).
#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/backends/cuda/cuda_launch_more.h"
#include "kiln/backends/cuda/index_fault.h"
#include "kiln/ops/op_table.h"

namespace kiln::cuda {
namespace {

bool IndexType(DataType t) { return t == DataType::kInt64 || t == DataType::kInt32; }

Status BadConstantIndex(std::string_view op, int64_t index, int64_t size) {
  return MakeError(ErrorCode::kKernelFailed,
                   "{}: constant index {} is out of range for an axis of size {}", op, index, size);
}

// ---- GatherElements ---------------------------------------------------------------------------
class GatherElementsKernel final : public Kernel {
 public:
  GatherElementsKernel(int64_t axis_attr, std::optional<std::vector<int64_t>> constant)
      : axis_attr_(axis_attr), constant_(std::move(constant)) {}
  StatusOr<size_t> Prepare(std::span<const TensorView> in, std::span<const TensorView>) override {
    const auto& data = in[0].dims;
    const auto& idx = in[1].dims;
    int64_t rank = static_cast<int64_t>(data.size());
    int64_t axis = axis_attr_ < 0 ? axis_attr_ + rank : axis_attr_;
    if (axis < 0 || axis >= rank || idx.size() != data.size() || rank > kMaxRank) {
      return MakeError(ErrorCode::kShapeMismatch,
                       "GatherElements axis {} with data of rank {} and indices of rank {}",
                       axis_attr_, rank, idx.size());
    }
    d_ = GatherElementsDesc{};
    d_.rank = static_cast<int32_t>(rank);
    d_.axis = static_cast<int32_t>(axis);
    for (int64_t a = 0; a < rank; ++a) {
      d_.data_dims[a] = data[a];
      d_.idx_dims[a] = idx[a];
    }
    for (int64_t i : constant_.value_or(std::vector<int64_t>{})) {
      if (i < -data[axis] || i >= data[axis])
        return BadConstantIndex("GatherElements", i, data[axis]);
    }
    return size_t{0};
  }
  Status Run(const KernelRunArgs& a) override {
    IndexFault* fault = nullptr;
    if (!constant_) {
      KILN_ASSIGN_OR_RETURN(fault, check_.Begin(StreamOf(a)));
    }
    KILN_RETURN_IF_ERROR(Launched(
        LaunchGatherElements(SizeOf(a.inputs[0].dtype), d_, a.inputs[0].data, a.inputs[1].data,
                             a.inputs[1].dtype == DataType::kInt64, a.outputs[0].data,
                             a.outputs[0].num_elements(), fault, StreamOf(a)),
        "GatherElements kernel"));
    return fault ? check_.End(StreamOf(a), "GatherElements", "the output holds zeros there")
                 : OkStatus();
  }

 private:
  int64_t axis_attr_;
  std::optional<std::vector<int64_t>> constant_;
  IndexFaultCheck check_;
  GatherElementsDesc d_;
};

CudaOpDef GatherElementsDef() {
  return {
      .op_type = "GatherElements",
      .accepts =
          [](const KernelRequest& r) {
            return ToElem(InType(r, 0)).has_value() && IndexType(InType(r, 1));
          },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        return std::unique_ptr<Kernel>(std::make_unique<GatherElementsKernel>(
            attrs::GatherElements::axis(*r.node), ConstantInts(r, 1)));
      },
  };
}
KILN_CUDA_OP_PROVIDER(GatherElementsProvider, GatherElementsDef());

// ---- ScatterND --------------------------------------------------------------------------------
std::optional<ScatterReduction> ReductionOf(const std::string& name) {
  if (name == "none") return ScatterReduction::kNone;
  if (name == "add") return ScatterReduction::kAdd;
  if (name == "mul") return ScatterReduction::kMul;
  if (name == "max") return ScatterReduction::kMax;
  if (name == "min") return ScatterReduction::kMin;
  return std::nullopt;
}

class ScatterNDKernel final : public Kernel {
 public:
  ScatterNDKernel(ScatterReduction reduction, Elem t, std::optional<std::vector<int64_t>> constant)
      : reduction_(reduction), t_(t), constant_(std::move(constant)) {}
  StatusOr<size_t> Prepare(std::span<const TensorView> in, std::span<const TensorView>) override {
    const auto& data = in[0].dims;
    const auto& idx = in[1].dims;
    if (idx.empty() || data.size() > static_cast<size_t>(kMaxRank)) {
      return MakeError(ErrorCode::kShapeMismatch, "ScatterND with indices of rank {}", idx.size());
    }
    int64_t k = idx.back();
    if (k < 0 || k > static_cast<int64_t>(data.size())) {
      return MakeError(ErrorCode::kShapeMismatch, "ScatterND index depth {} for data of rank {}", k,
                       data.size());
    }
    d_ = ScatterNDDesc{};
    d_.k = static_cast<int32_t>(k);
    d_.reduction = reduction_;
    int64_t q = 1;
    for (size_t i = 0; i + 1 < idx.size(); ++i) q *= idx[i];
    d_.q = q;
    d_.slice = 1;
    for (size_t a = static_cast<size_t>(k); a < data.size(); ++a) d_.slice *= data[a];
    std::vector<int64_t> strides = DenseStrides(data);
    for (int64_t a = 0; a < k; ++a) {
      d_.data_dims[a] = data[a];
      d_.data_strides[a] = strides[a];
    }
    if (in[2].num_elements() != q * d_.slice) {
      return MakeError(ErrorCode::kShapeMismatch, "ScatterND updates of {} elements, expected {}",
                       in[2].num_elements(), q * d_.slice);
    }
    if (constant_) {
      for (size_t i = 0; i < constant_->size(); ++i) {
        int64_t size = data[i % static_cast<size_t>(std::max<int64_t>(k, 1))];
        int64_t v = (*constant_)[i];
        if (v < -size || v >= size) return BadConstantIndex("ScatterND", v, size);
      }
    }
    return size_t{0};
  }
  Status Run(const KernelRunArgs& a) override {
    IndexFault* fault = nullptr;
    if (!constant_) {
      KILN_ASSIGN_OR_RETURN(fault, check_.Begin(StreamOf(a)));
    }
    KILN_RETURN_IF_ERROR(
        Launched(LaunchScatterND(t_, d_, a.inputs[0].data, a.inputs[1].data,
                                 a.inputs[1].dtype == DataType::kInt64, a.inputs[2].data,
                                 a.outputs[0].data, a.inputs[0].num_elements(), fault, StreamOf(a)),
                 "ScatterND kernel"));
    return fault ? check_.End(StreamOf(a), "ScatterND", "that update was not applied") : OkStatus();
  }

 private:
  ScatterReduction reduction_;
  Elem t_;
  std::optional<std::vector<int64_t>> constant_;
  IndexFaultCheck check_;
  ScatterNDDesc d_;
};

CudaOpDef ScatterNDDef() {
  return {
      .op_type = "ScatterND",
      .accepts =
          [](const KernelRequest& r) {
            DataType t = InType(r, 0);
            if (!ToElem(t) || !IndexType(InType(r, 1)) || InType(r, 2) != t) return false;
            auto red = ReductionOf(attrs::ScatterND::reduction(*r.node));
            if (!red) return false;
            // Reductions combine values: f32/i32/i64, as the CPU reference.
            return *red == ScatterReduction::kNone || t == DataType::kFloat32 ||
                   t == DataType::kInt32 || t == DataType::kInt64;
          },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        auto red = *ReductionOf(attrs::ScatterND::reduction(*r.node));
        return std::unique_ptr<Kernel>(
            std::make_unique<ScatterNDKernel>(red, *ToElem(InType(r, 0)), ConstantInts(r, 1)));
      },
  };
}
KILN_CUDA_OP_PROVIDER(ScatterNDProvider, ScatterNDDef());

// ---- OneHot -----------------------------------------------------------------------------------
// depth (input 1) is only needed for the output shape, which shape inference already fixed.
CudaOpDef OneHotDef() {
  return {
      .op_type = "OneHot",
      .name_operand = 2,
      .accepts =
          [](const KernelRequest& r) {
            return ToElem(InType(r, 0)).has_value() && ToElem(InType(r, 2)).has_value() &&
                   OutType(r, 0) == InType(r, 2);
          },
      .create =
          [](const KernelRequest& r) {
            int64_t axis_attr = attrs::OneHot::axis(*r.node);
            Elem idx_t = *ToElem(InType(r, 0));
            return MakeFnKernel([axis_attr, idx_t](const KernelRunArgs& a) -> Status {
              const TensorView& y = a.outputs[0];
              int64_t rank = static_cast<int64_t>(y.dims.size());
              int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
              if (axis < 0 || axis >= rank) {
                return MakeError(ErrorCode::kShapeMismatch, "OneHot axis {} of output rank {}",
                                 axis_attr, rank);
              }
              if (a.inputs[2].num_elements() < 2) {
                return MakeError(ErrorCode::kShapeMismatch, "OneHot values has {} elements, not 2",
                                 a.inputs[2].num_elements());
              }
              int64_t depth = y.dims[axis], outer = 1, inner = 1;
              for (int64_t i = 0; i < axis; ++i) outer *= y.dims[i];
              for (int64_t i = axis + 1; i < rank; ++i) inner *= y.dims[i];
              return Launched(
                  LaunchOneHot(SizeOf(y.dtype), idx_t, a.inputs[0].data, a.inputs[2].data, y.data,
                               outer, depth, inner, StreamOf(a)),
                  "OneHot kernel");
            });
          },
  };
}
KILN_CUDA_OP_PROVIDER(OneHotProvider, OneHotDef());

}  // namespace
}  // namespace kiln::cuda
