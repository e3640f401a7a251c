// Slice, Pad, CenterCropPad, Tile and Expand on the CPU (any dtype), all as per-axis index maps
// over MapCopy. Slice reads starts/ends/axes/steps from its inputs at run time with ONNX clamping;
// Pad supports constant, reflect, edge and wrap.
#include <limits>

#include "kiln/backends/cpu/op_util.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

bool AnyType(const KernelRequest& r) { return InType(r, 0) != DataType::kUndefined; }

DimVec AllAxes(size_t rank) {
  DimVec axes(rank);
  for (size_t i = 0; i < rank; ++i) axes[i] = static_cast<int64_t>(i);
  return axes;
}

Status RunSlice(const KernelRunArgs& a) {
  const TensorView& x = a.inputs[0];
  const TensorView& y = a.outputs[0];
  size_t rank = x.dims.size();
  DimVec starts = ReadInts(a.inputs[1]), ends = ReadInts(a.inputs[2]);
  DimVec axes =
      a.inputs.size() > 3 && a.inputs[3].data ? ReadInts(a.inputs[3]) : AllAxes(starts.size());
  DimVec steps =
      a.inputs.size() > 4 && a.inputs[4].data ? ReadInts(a.inputs[4]) : DimVec(starts.size(), 1);
  // Output coord o on axis ax reads first[ax] + o * step[ax] (identity on unsliced axes).
  DimVec first(rank, 0), step(rank, 1);
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t ax = axes[i] < 0 ? axes[i] + static_cast<int64_t>(rank) : axes[i];
    int64_t n = x.dims[ax], s = starts[i];
    if (steps[i] == 0) return MakeError(ErrorCode::kKernelFailed, "Slice step is 0");
    if (s < 0) s += n;
    s = steps[i] > 0 ? std::clamp<int64_t>(s, 0, n) : std::clamp<int64_t>(s, 0, n - 1);
    first[ax] = s;
    step[ax] = steps[i];
    int64_t last = s + (y.dims[ax] - 1) * steps[i];
    if (y.dims[ax] > 0 && (last < 0 || last >= n)) {
      return MakeError(ErrorCode::kKernelFailed, "Slice output dims disagree with its inputs");
    }
  }
  MapCopy(
      x.data, x.dims, y.data, y.dims,
      [&](size_t ax, int64_t o) { return first[ax] + o * step[ax]; }, SizeOf(x.dtype), nullptr);
  return OkStatus();
}

enum class PadMode { kConstant, kEdge, kWrap, kReflect };

int64_t PadIndex(int64_t i, int64_t n, PadMode mode) {
  if (i >= 0 && i < n) return i;
  if (mode == PadMode::kConstant || n == 0) return -1;
  if (mode == PadMode::kEdge) return i < 0 ? 0 : n - 1;
  if (mode == PadMode::kWrap) return ((i % n) + n) % n;
  // reflect: mirror without repeating the edge.
  if (n == 1) return 0;
  int64_t period = 2 * (n - 1);
  int64_t m = ((i % period) + period) % period;
  return m < n ? m : period - m;
}

const bool kRegistered = [] {
  RegisterOpKernel({.op_type = "Slice",
                    .float_wrap = false,
                    .storage_types = true,
                    .accepts = AnyType,
                    .create = [](const KernelRequest&) { return KernelOr(RunSlice); }});
  RegisterOpKernel({
      .op_type = "Pad",
      .float_wrap = false,
      .accepts = AnyType,
      .create =
          [](const KernelRequest& r) {
            std::string name = attrs::Pad::mode(*r.node);
            PadMode mode = name == "edge"      ? PadMode::kEdge
                           : name == "wrap"    ? PadMode::kWrap
                           : name == "reflect" ? PadMode::kReflect
                                               : PadMode::kConstant;
            return KernelOr([mode, name](const KernelRunArgs& a) -> Status {
              const TensorView& x = a.inputs[0];
              const TensorView& y = a.outputs[0];
              size_t rank = x.dims.size();
              DimVec pads = ReadInts(a.inputs[1]);
              DimVec axes =
                  a.inputs.size() > 3 && a.inputs[3].data ? ReadInts(a.inputs[3]) : AllAxes(rank);
              DimVec begin(rank, 0);
              for (size_t i = 0; i < axes.size(); ++i) {
                int64_t ax = axes[i] < 0 ? axes[i] + static_cast<int64_t>(rank) : axes[i];
                begin[ax] = pads[i];
              }
              for (size_t ax = 0; ax < rank; ++ax) {
                if (x.dims[ax] == 0 && mode != PadMode::kConstant && y.dims[ax] > 0) {
                  return MakeError(ErrorCode::kKernelFailed, "Pad mode {} on an empty axis", name);
                }
              }
              const void* fill =
                  a.inputs.size() > 2 && a.inputs[2].data && mode == PadMode::kConstant
                      ? a.inputs[2].data
                      : nullptr;
              MapCopy(
                  x.data, x.dims, y.data, y.dims,
                  [&](size_t ax, int64_t o) { return PadIndex(o - begin[ax], x.dims[ax], mode); },
                  SizeOf(x.dtype), fill);
              return OkStatus();
            });
          },
  });
  // CenterCropPad: each axis read from (in - out) / 2 on (a crop), or written from
  // (out - in) / 2 on with zeros around (a pad); the output's dims say which.
  RegisterOpKernel({
      .op_type = "CenterCropPad",
      .float_wrap = false,
      .accepts = AnyType,
      .create =
          [](const KernelRequest&) {
            return KernelOr([](const KernelRunArgs& a) -> Status {
              const TensorView& x = a.inputs[0];
              const TensorView& y = a.outputs[0];
              MapCopy(
                  x.data, x.dims, y.data, y.dims,
                  [&](size_t ax, int64_t o) -> int64_t {
                    const int64_t in = x.dims[ax], out = y.dims[ax];
                    const int64_t m = in >= out ? o + (in - out) / 2 : o - (out - in) / 2;
                    return m >= 0 && m < in ? m : -1;
                  },
                  SizeOf(x.dtype), nullptr);
              return OkStatus();
            });
          },
  });
  for (bool tile : {true, false}) {
    RegisterOpKernel({
        .op_type = tile ? "Tile" : "Expand",
        .float_wrap = false,
        .storage_types = true,
        .accepts = AnyType,
        .create =
            [tile](const KernelRequest&) {
              return KernelOr([tile](const KernelRunArgs& a) -> Status {
                const TensorView& x = a.inputs[0];
                const TensorView& y = a.outputs[0];
                size_t rank = y.dims.size(), lead = rank - x.dims.size();
                // Expand may add leading axes; view the input with leading 1s.
                DimVec in_dims(lead, 1);
                in_dims.append(x.dims.begin(), x.dims.end());
                MapCopy(
                    x.data, in_dims, y.data, y.dims,
                    [&](size_t ax, int64_t o) {
                      int64_t n = in_dims[ax];
                      return tile ? o % n : (n == 1 ? 0 : o);
                    },
                    SizeOf(x.dtype), nullptr);
                return OkStatus();
              });
            },
    });
  }
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
