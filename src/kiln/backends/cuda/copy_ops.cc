// CUDA providers of the data-movement and shape ops (kernels in copy.cu): Identity, Reshape,
// Flatten, Squeeze, Unsqueeze (a device copy unless the planner aliased them), Transpose, Expand,
// Slice, Concat, Split, Gather, Trilu, Shape, Size, ConstantOfShape and Range. Any dtype: these
// move bytes. Values that live on the device at run time (Slice bounds, Gather indices, Trilu's
// k, Range's start/delta) are read by the kernels, never by the host (Gather's index check waits
// for the layer instead, index_fault.h).
#include <algorithm>
#include <cstring>

#include "kiln/backends/cuda/cuda_common.h"
#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/backends/cuda/index_fault.h"
#include "kiln/ops/op_table.h"

namespace kiln::cuda {
namespace {

bool AnyType(const KernelRequest& r) { return ToElem(InType(r, 0)).has_value(); }

int64_t NormAxis(int64_t axis, size_t rank) {
  return axis < 0 ? axis + static_cast<int64_t>(rank) : axis;
}

Status CopyDevice(const KernelRunArgs& a) {
  const TensorView& in = a.inputs[0];
  const TensorView& out = a.outputs[0];
  if (in.size_bytes() != out.size_bytes()) {
    return MakeError(ErrorCode::kKernelFailed, "copy of {} bytes into {} bytes", in.size_bytes(),
                     out.size_bytes());
  }
  if (in.data == out.data || out.size_bytes() == 0) return OkStatus();
  KILN_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(out.data, in.data, out.size_bytes(), cudaMemcpyDeviceToDevice, StreamOf(a)));
  return OkStatus();
}

CudaOpDef CopyDef(const char* op) {
  return {.op_type = op, .variant = "copy", .accepts = AnyType, .create = [](const KernelRequest&) {
            return MakeFnKernel(CopyDevice);
          }};
}
KILN_CUDA_OP_PROVIDER(IdentityProvider, CopyDef("Identity"));
KILN_CUDA_OP_PROVIDER(ReshapeProvider, CopyDef("Reshape"));
KILN_CUDA_OP_PROVIDER(FlattenProvider, CopyDef("Flatten"));
KILN_CUDA_OP_PROVIDER(SqueezeProvider, CopyDef("Squeeze"));
KILN_CUDA_OP_PROVIDER(UnsqueezeProvider, CopyDef("Unsqueeze"));

// A copy whose source index is affine in the output coordinates (Transpose, Expand, constant
// Slice): `plan` turns the operand dims into a coalesced Strided in Prepare.
class StridedCopyKernel final : public Kernel {
 public:
  using PlanFn = std::function<StatusOr<Strided>(std::span<const TensorView> in,
                                                 std::span<const TensorView> out)>;
  StridedCopyKernel(size_t elem_size, PlanFn plan)
      : elem_size_(elem_size), plan_(std::move(plan)) {}
  StatusOr<size_t> Prepare(std::span<const TensorView> in,
                           std::span<const TensorView> out) override {
    KILN_ASSIGN_OR_RETURN(space_, plan_(in, out));
    if (space_.rank < 0) {
      return MakeError(ErrorCode::kUnimplemented, "copy needs more than {} separate dims",
                       kMaxRank);
    }
    return size_t{0};
  }
  Status Run(const KernelRunArgs& a) override {
    return Launched(LaunchStridedCopy(elem_size_, a.inputs[0].data, a.outputs[0].data, space_,
                                      a.outputs[0].num_elements(), StreamOf(a)),
                    "strided copy kernel");
  }

 private:
  size_t elem_size_;
  PlanFn plan_;
  Strided space_;
};

CudaOpDef TransposeDef() {
  return {
      .op_type = "Transpose",
      .accepts = AnyType,
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        std::vector<int64_t> perm = attrs::Transpose::perm(*r.node);
        auto plan = [perm](std::span<const TensorView> in,
                           std::span<const TensorView> out) -> StatusOr<Strided> {
          return TransposeSpace(in[0].dims, perm, out[0].dims);
        };
        return std::unique_ptr<Kernel>(
            std::make_unique<StridedCopyKernel>(SizeOf(InType(r, 0)), plan));
      },
  };
}
KILN_CUDA_OP_PROVIDER(TransposeProvider, TransposeDef());

CudaOpDef ExpandDef() {
  return {
      .op_type = "Expand",
      .accepts = AnyType,
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        auto plan = [](std::span<const TensorView> in,
                       std::span<const TensorView> out) -> StatusOr<Strided> {
          std::span<const int64_t> dims[1] = {in[0].dims};
          KILN_ASSIGN_OR_RETURN(Strided s, BroadcastSpace(dims, out[0].dims));
          return s;
        };
        return std::unique_ptr<Kernel>(
            std::make_unique<StridedCopyKernel>(SizeOf(InType(r, 0)), plan));
      },
  };
}
KILN_CUDA_OP_PROVIDER(ExpandProvider, ExpandDef());

// ---- Slice ------------------------------------------------------------------------------------
bool IndexType(DataType t) { return t == DataType::kInt64 || t == DataType::kInt32; }

class DeviceSliceKernel final : public Kernel {
 public:
  DeviceSliceKernel(size_t elem_size, bool idx64) : elem_size_(elem_size), idx64_(idx64) {}
  Status Run(const KernelRunArgs& a) override {
    const TensorView& x = a.inputs[0];
    DeviceSliceArgs s;
    s.starts = a.inputs[1].data;
    s.axes = Present(a, 3) ? a.inputs[3].data : nullptr;
    s.steps = Present(a, 4) ? a.inputs[4].data : nullptr;
    s.idx64 = idx64_;
    s.count = static_cast<int32_t>(a.inputs[1].num_elements());
    if (x.dims.size() > static_cast<size_t>(kMaxRank)) {
      return MakeError(ErrorCode::kUnimplemented, "Slice of rank {} on CUDA", x.dims.size());
    }
    return Launched(
        LaunchDeviceSlice(elem_size_, x.data, a.outputs[0].data,
                          static_cast<int32_t>(x.dims.size()), x.dims.data(),
                          a.outputs[0].dims.data(), s, a.outputs[0].num_elements(), StreamOf(a)),
        "Slice kernel");
  }

 private:
  size_t elem_size_;
  bool idx64_;
};

CudaOpDef SliceDef() {
  return {
      .op_type = "Slice",
      .accepts =
          [](const KernelRequest& r) {
            if (!AnyType(r) || r.inputs.size() < 3) return false;
            DataType it = InType(r, 1);
            if (!IndexType(it)) return false;
            for (size_t i = 2; i < r.inputs.size(); ++i) {
              if (InType(r, i) != DataType::kUndefined && InType(r, i) != it) return false;
            }
            return true;
          },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        size_t es = SizeOf(InType(r, 0));
        auto starts = ConstantInts(r, 1);
        bool has_axes = r.inputs.size() > 3 && InType(r, 3) != DataType::kUndefined;
        bool has_steps = r.inputs.size() > 4 && InType(r, 4) != DataType::kUndefined;
        auto axes = has_axes ? ConstantInts(r, 3) : std::optional<std::vector<int64_t>>({});
        auto steps = has_steps ? ConstantInts(r, 4) : std::optional<std::vector<int64_t>>({});
        if (starts && axes && steps) {
          auto plan = [s = *starts, ax = *axes, st = *steps](
                          std::span<const TensorView> in,
                          std::span<const TensorView> out) -> StatusOr<Strided> {
            return SliceSpace(s, ax, st, in[0].dims, out[0].dims);
          };
          return std::unique_ptr<Kernel>(std::make_unique<StridedCopyKernel>(es, plan));
        }
        return std::unique_ptr<Kernel>(
            std::make_unique<DeviceSliceKernel>(es, InType(r, 1) == DataType::kInt64));
      },
  };
}
KILN_CUDA_OP_PROVIDER(SliceProvider, SliceDef());

// ---- Concat / Split ---------------------------------------------------------------------------
int64_t Outer(std::span<const int64_t> dims, int64_t axis) {
  int64_t n = 1;
  for (int64_t i = 0; i < axis; ++i) n *= dims[i];
  return n;
}
int64_t RowBytes(const TensorView& v, int64_t axis) {
  int64_t n = static_cast<int64_t>(SizeOf(v.dtype));
  for (size_t i = static_cast<size_t>(axis); i < v.dims.size(); ++i) n *= v.dims[i];
  return n;
}

// The parts of a Concat (Split) along `axis` of `whole`: each a whole tensor, or with `starts`
// the range [starts[i], starts[i] + lengths[i]) of part i's axis, read in place.
Status RunParts(const KernelRunArgs& a, int64_t axis_attr, bool concat,
                std::span<const int64_t> starts, std::span<const int64_t> lengths) {
  const TensorView& whole = concat ? a.outputs[0] : a.inputs[0];
  std::span<const TensorView> parts = concat ? a.inputs : a.outputs;
  const int64_t axis = NormAxis(axis_attr, whole.dims.size());
  ConcatDesc d;
  int64_t begin = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const TensorView& p = parts[i];
    const int64_t row = RowBytes(p, axis);
    int64_t first = 0, bytes = row;
    if (!starts.empty()) {
      const int64_t n = p.dims[static_cast<size_t>(axis)];
      if (starts[i] < 0 || starts[i] + lengths[i] > n) {
        return MakeError(ErrorCode::kShapeMismatch,
                         "ConcatSlices: part {} [{}, {}) of an axis of {}", i, starts[i],
                         starts[i] + lengths[i], n);
      }
      const int64_t unit = n == 0 ? 0 : row / n;
      first = starts[i] * unit;
      bytes = lengths[i] * unit;
    }
    if (bytes == 0) continue;
    if (d.parts == kMaxConcatParts) {
      return MakeError(ErrorCode::kUnimplemented, "more than {} parts", kMaxConcatParts);
    }
    d.ptr[d.parts] = static_cast<const std::byte*>(p.data) + first;
    d.begin[d.parts] = begin;
    d.size[d.parts] = bytes;
    d.stride[d.parts] = row;
    ++d.parts;
    begin += bytes;
  }
  int64_t outer = Outer(whole.dims, axis);
  if (begin != RowBytes(whole, axis)) {
    return MakeError(ErrorCode::kShapeMismatch, "{} parts do not add up along axis {}",
                     concat ? "Concat" : "Split", axis);
  }
  if (d.parts == 0) return OkStatus();
  cudaError_t err = concat ? LaunchConcat(d, whole.data, outer, begin, StreamOf(a))
                           : LaunchSplit(d, whole.data, outer, begin, StreamOf(a));
  return Launched(err, concat ? "Concat kernel" : "Split kernel");
}

Status RunConcat(const KernelRunArgs& a, int64_t axis_attr, bool concat) {
  return RunParts(a, axis_attr, concat, {}, {});
}

CudaOpDef ConcatDef(bool concat) {
  return {
      .op_type = concat ? "Concat" : "Split",
      .accepts =
          [concat](const KernelRequest& r) {
            size_t parts = concat ? r.inputs.size() : r.outputs.size();
            return AnyType(r) && parts <= static_cast<size_t>(kMaxConcatParts);
          },
      .create =
          [concat](const KernelRequest& r) {
            int64_t axis = r.node->attrs().GetInt("axis", 0);
            return MakeFnKernel(
                [axis, concat](const KernelRunArgs& a) { return RunConcat(a, axis, concat); });
          },
  };
}
KILN_CUDA_OP_PROVIDER(ConcatProvider, ConcatDef(true));
KILN_CUDA_OP_PROVIDER(SplitProvider, ConcatDef(false));

// ConcatSlices: Concat's kernel with each part read in place from its source, the range
// [starts[i], starts[i] + lengths[i]) of the axis (rows of the source's full width apart).
CudaOpDef ConcatSlicesDef() {
  return {
      .op_type = "ConcatSlices",
      .accepts =
          [](const KernelRequest& r) {
            return AnyType(r) && r.inputs.size() <= static_cast<size_t>(kMaxConcatParts);
          },
      .create =
          [](const KernelRequest& r) {
            const int64_t axis = r.node->attrs().GetInt("axis", 0);
            std::vector<int64_t> starts = r.node->attrs().GetInts("starts");
            std::vector<int64_t> lengths = r.node->attrs().GetInts("lengths");
            return MakeFnKernel([axis, starts, lengths](const KernelRunArgs& a) {
              return RunParts(a, axis, true, starts, lengths);
            });
          },
  };
}
KILN_CUDA_OP_PROVIDER(ConcatSlicesProvider, ConcatSlicesDef());

// ---- Gather -----------------------------------------------------------------------------------
// Out-of-range indices are an error, as on the CPU: constant indices are checked on the host in
// Prepare; run-time ones by the kernel, reported after the layer when it runs eagerly
// (index_fault.h says why not inside CUDA graphs).
class GatherKernel final : public Kernel {
 public:
  GatherKernel(int64_t axis_attr, bool idx64, std::optional<std::vector<int64_t>> constant)
      : axis_attr_(axis_attr), idx64_(idx64), constant_(std::move(constant)) {}
  StatusOr<size_t> Prepare(std::span<const TensorView> in, std::span<const TensorView>) override {
    const TensorView& data = in[0];
    int64_t rank = static_cast<int64_t>(data.dims.size());
    axis_ = NormAxis(axis_attr_, data.dims.size());
    if (axis_ < 0 || axis_ >= rank) {
      return MakeError(ErrorCode::kShapeMismatch, "Gather axis {} of rank {}", axis_attr_, rank);
    }
    int64_t n = data.dims[axis_];
    for (int64_t i : constant_.value_or(std::vector<int64_t>{})) {
      if (i < -n || i >= n) {
        return MakeError(ErrorCode::kKernelFailed,
                         "Gather: constant index {} is out of range for an axis of size {}", i, n);
      }
    }
    inner_ = 1;
    for (int64_t i = axis_ + 1; i < rank; ++i) inner_ *= data.dims[i];
    outer_ = Outer(data.dims, axis_);
    return size_t{0};
  }
  Status Run(const KernelRunArgs& a) override {
    const TensorView& data = a.inputs[0];
    // Constant indices were checked in Prepare; run-time ones are checked around the launch.
    IndexFault* fault = nullptr;
    if (!constant_) {
      KILN_ASSIGN_OR_RETURN(fault, check_.Begin(StreamOf(a)));
    }
    KILN_RETURN_IF_ERROR(
        Launched(LaunchGatherChecked(SizeOf(data.dtype), data.data, a.inputs[1].data, idx64_,
                                     a.outputs[0].data, outer_, data.dims[axis_], inner_,
                                     a.inputs[1].num_elements(), fault, StreamOf(a)),
                 "Gather kernel"));
    return fault ? check_.End(StreamOf(a), "Gather", "the output holds zeros there") : OkStatus();
  }

 private:
  int64_t axis_attr_;
  bool idx64_;
  std::optional<std::vector<int64_t>> constant_;
  IndexFaultCheck check_;
  int64_t axis_ = 0, outer_ = 1, inner_ = 1;
};

CudaOpDef GatherDef() {
  return {
      .op_type = "Gather",
      .accepts = [](const KernelRequest& r) { return AnyType(r) && IndexType(InType(r, 1)); },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        int64_t axis_attr = attrs::Gather::axis(*r.node);
        bool idx64 = InType(r, 1) == DataType::kInt64;
        return std::unique_ptr<Kernel>(
            std::make_unique<GatherKernel>(axis_attr, idx64, ConstantInts(r, 1)));
      },
  };
}
KILN_CUDA_OP_PROVIDER(GatherProvider, GatherDef());

// ---- Trilu ------------------------------------------------------------------------------------
CudaOpDef TriluDef() {
  return {
      .op_type = "Trilu",
      .accepts =
          [](const KernelRequest& r) {
            return AnyType(r) && r.inputs[0].shape.size() >= 2 &&
                   (r.inputs.size() < 2 || InType(r, 1) == DataType::kUndefined ||
                    IndexType(InType(r, 1)));
          },
      .create =
          [](const KernelRequest& r) {
            bool upper = attrs::Trilu::upper(*r.node) != 0;
            return MakeFnKernel([upper](const KernelRunArgs& a) {
              const TensorView& x = a.inputs[0];
              size_t rank = x.dims.size();
              int64_t rows = x.dims[rank - 2], cols = x.dims[rank - 1];
              int64_t mats = rows * cols == 0 ? 0 : x.num_elements() / (rows * cols);
              const void* k = Present(a, 1) ? a.inputs[1].data : nullptr;
              bool k64 = Present(a, 1) && a.inputs[1].dtype == DataType::kInt64;
              return Launched(LaunchTrilu(SizeOf(x.dtype), upper, x.data, k, k64, a.outputs[0].data,
                                          mats, rows, cols, StreamOf(a)),
                              "Trilu kernel");
            });
          },
  };
}
KILN_CUDA_OP_PROVIDER(TriluProvider, TriluDef());

// ---- Shape, Size, ConstantOfShape, Range ------------------------------------------------------
CudaOpDef ShapeDef() {
  return {
      .op_type = "Shape",
      .name_operand = -1,
      .accepts = AnyType,
      .create =
          [](const KernelRequest& r) {
            int64_t start = attrs::Shape::start(*r.node);
            return MakeFnKernel([start](const KernelRunArgs& a) -> Status {
              int64_t rank = static_cast<int64_t>(a.inputs[0].dims.size());
              int64_t s = std::clamp<int64_t>(start < 0 ? start + rank : start, 0, rank);
              int64_t n = a.outputs[0].num_elements();
              if (n > kMaxRank || s + n > rank) {
                return MakeError(ErrorCode::kShapeMismatch, "Shape output of {} values", n);
              }
              // The dims are host facts known at Prepare; they travel as kernel arguments.
              Int64Values v;
              v.count = static_cast<int32_t>(n);
              for (int64_t i = 0; i < n; ++i) v.v[i] = a.inputs[0].dims[s + i];
              return Launched(LaunchWriteInt64(v, a.outputs[0].as<int64_t>(), StreamOf(a)),
                              "Shape kernel");
            });
          },
  };
}
KILN_CUDA_OP_PROVIDER(ShapeProvider, ShapeDef());

CudaOpDef SizeDef() {
  return {
      .op_type = "Size",
      .name_operand = -1,
      .accepts = AnyType,
      .create =
          [](const KernelRequest&) {
            return MakeFnKernel([](const KernelRunArgs& a) {
              Int64Values v;
              v.count = 1;
              v.v[0] = a.inputs[0].num_elements();
              return Launched(LaunchWriteInt64(v, a.outputs[0].as<int64_t>(), StreamOf(a)),
                              "Size kernel");
            });
          },
  };
}
KILN_CUDA_OP_PROVIDER(SizeProvider, SizeDef());

CudaOpDef ConstantOfShapeDef() {
  return {
      .op_type = "ConstantOfShape",
      .name_operand = -1,
      .accepts =
          [](const KernelRequest& r) {
            DataType t = OutType(r, 0);
            const Tensor* v = r.node->attrs().GetTensor("value");
            return ToElem(t).has_value() && (!v || v->dtype() == t);
          },
      .create =
          [](const KernelRequest& r) {
            DataType t = OutType(r, 0);
            const Tensor* v = r.node->attrs().GetTensor("value");
            uint64_t bits = 0;
            if (v && v->num_elements() > 0) std::memcpy(&bits, v->raw(), SizeOf(t));
            return MakeFnKernel([bits, es = SizeOf(t)](const KernelRunArgs& a) {
              return Launched(
                  LaunchFill(es, bits, a.outputs[0].data, a.outputs[0].num_elements(), StreamOf(a)),
                  "fill kernel");
            });
          },
  };
}
KILN_CUDA_OP_PROVIDER(ConstantOfShapeProvider, ConstantOfShapeDef());

CudaOpDef RangeDef() {
  return {
      .op_type = "Range",
      .accepts =
          [](const KernelRequest& r) {
            DataType t = InType(r, 0);
            return (t == DataType::kFloat32 || t == DataType::kFloat16 ||
                    t == DataType::kBFloat16 || IndexType(t)) &&
                   InType(r, 2) == t;
          },
      .create =
          [](const KernelRequest& r) {
            Elem t = *ToElem(InType(r, 0));
            return MakeFnKernel([t](const KernelRunArgs& a) {
              return Launched(LaunchRange(t, a.inputs[0].data, a.inputs[2].data, a.outputs[0].data,
                                          a.outputs[0].num_elements(), StreamOf(a)),
                              "Range kernel");
            });
          },
  };
}
KILN_CUDA_OP_PROVIDER(RangeProvider, RangeDef());

}  // namespace
}  // namespace kiln::cuda
