// CUDA providers of the ops along one axis that are not reductions to a value: ArgMax/ArgMin
// (arg_reduce.cu), CumSum (cumsum.cu) and TopK (topk.cu), the family of the CPU's reduce.cc.
// Floats (f32/f16/bf16) and i32/i64; ArgMax's keepdims does not matter (the output is dense).
#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/backends/cuda/cuda_launch_more.h"
#include "kiln/ops/op_table.h"

namespace kiln::cuda {
namespace {

bool NumericType(DataType t) {
  return IsFloatStorage(t) || t == DataType::kInt32 || t == DataType::kInt64;
}

// [outer, n, inner] around `axis` of dims.
struct AxisSplit {
  int64_t outer = 1, n = 1, inner = 1;
};
StatusOr<AxisSplit> SplitAt(std::span<const int64_t> dims, int64_t axis_attr) {
  int64_t rank = static_cast<int64_t>(dims.size());
  int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
  if (axis < 0 || axis >= rank) {
    return MakeError(ErrorCode::kShapeMismatch, "axis {} of rank {}", axis_attr, rank);
  }
  AxisSplit s;
  for (int64_t i = 0; i < rank; ++i) (i < axis ? s.outer : (i == axis ? s.n : s.inner)) *= dims[i];
  return s;
}

CudaOpDef ArgDef(bool is_max) {
  return {
      .op_type = is_max ? "ArgMax" : "ArgMin",
      .accepts =
          [](const KernelRequest& r) {
            return NumericType(InType(r, 0)) && OutType(r, 0) == DataType::kInt64;
          },
      .create =
          [is_max](const KernelRequest& r) {
            int64_t axis = attrs::ArgMax::axis(*r.node);  // ArgMin declares the same defaults
            bool last = attrs::ArgMax::select_last_index(*r.node) != 0;
            Elem t = *ToElem(InType(r, 0));
            return MakeFnKernel([=](const KernelRunArgs& a) -> Status {
              KILN_ASSIGN_OR_RETURN(AxisSplit s, SplitAt(a.inputs[0].dims, axis));
              if (s.n == 0 && s.outer * s.inner > 0) {
                return MakeError(ErrorCode::kShapeMismatch, "{} over an empty axis",
                                 is_max ? "ArgMax" : "ArgMin");
              }
              return Launched(
                  LaunchArgReduce(t, is_max, last, a.inputs[0].data, a.outputs[0].as<int64_t>(),
                                  s.outer, s.n, s.inner, StreamOf(a)),
                  is_max ? "ArgMax kernel" : "ArgMin kernel");
            });
          },
  };
}
KILN_CUDA_OP_PROVIDER(ArgMaxProvider, ArgDef(true));
KILN_CUDA_OP_PROVIDER(ArgMinProvider, ArgDef(false));

// CumSum's axis is an input; the CUDA kernel needs it at build time (it is a constant in the
// models seen: exporters write it as an initializer).
CudaOpDef CumSumDef() {
  return {
      .op_type = "CumSum",
      .accepts =
          [](const KernelRequest& r) {
            auto axis = ConstantInts(r, 1);
            return NumericType(InType(r, 0)) && OutType(r, 0) == InType(r, 0) && axis &&
                   axis->size() == 1;
          },
      .create =
          [](const KernelRequest& r) {
            int64_t axis = (*ConstantInts(r, 1))[0];
            bool exclusive = attrs::CumSum::exclusive(*r.node) != 0;
            bool reverse = attrs::CumSum::reverse(*r.node) != 0;
            Elem t = *ToElem(InType(r, 0));
            return MakeFnKernel([=](const KernelRunArgs& a) -> Status {
              KILN_ASSIGN_OR_RETURN(AxisSplit s, SplitAt(a.inputs[0].dims, axis));
              return Launched(LaunchCumSum(t, exclusive, reverse, a.inputs[0].data,
                                           a.outputs[0].data, s.outer, s.n, s.inner, StreamOf(a)),
                              "CumSum kernel");
            });
          },
  };
}
KILN_CUDA_OP_PROVIDER(CumSumProvider, CumSumDef());

// A K computed at run time makes the output dim data-dependent (docs/architecture.md): only a
// kernel that reports its dims (the CPU's) may take the layer.
bool HasDataDependentDim(const OperandDesc& d) {
  for (const Dim& dim : d.shape) {
    for (const std::string& s : dim.Symbols()) {
      if (IsDataDependentSymbol(s)) return true;
    }
  }
  return false;
}

// TopK: k is an input, but the output dims (from shape inference, which needs k constant or
// bounded by the profile) already carry it; the kernel takes k from them.
CudaOpDef TopKDef() {
  return {
      .op_type = "TopK",
      .accepts =
          [](const KernelRequest& r) {
            return NumericType(InType(r, 0)) && OutType(r, 0) == InType(r, 0) &&
                   OutType(r, 1) == DataType::kInt64 && !HasDataDependentDim(r.outputs[0]);
          },
      .create =
          [](const KernelRequest& r) {
            int64_t axis = attrs::TopK::axis(*r.node);
            bool largest = attrs::TopK::largest(*r.node) != 0;
            bool sorted = attrs::TopK::sorted(*r.node) != 0;
            Elem t = *ToElem(InType(r, 0));
            return MakeFnKernel([=](const KernelRunArgs& a) -> Status {
              const TensorView& x = a.inputs[0];
              KILN_ASSIGN_OR_RETURN(AxisSplit s, SplitAt(x.dims, axis));
              int64_t ax = axis < 0 ? axis + static_cast<int64_t>(x.dims.size()) : axis;
              int64_t k = a.outputs[0].dims[static_cast<size_t>(ax)];
              if (k > s.n) {
                return MakeError(ErrorCode::kShapeMismatch, "TopK of {} from an axis of {}", k,
                                 s.n);
              }
              return Launched(
                  LaunchTopK(t, largest, sorted, x.data, a.outputs[0].data,
                             a.outputs[1].as<int64_t>(), s.outer, s.n, s.inner, k, StreamOf(a)),
                  "TopK kernel");
            });
          },
  };
}
KILN_CUDA_OP_PROVIDER(TopKProvider, TopKDef());

}  // namespace
}  // namespace kiln::cuda
