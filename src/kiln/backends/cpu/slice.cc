// Slice, Pad, Tile and Expand on the CPU (any dtype), all as per-axis index maps over MapCopy.
// Slice reads starts/ends/axes/steps from its inputs at run time with ONNX clamping; Pad supports
// constant, reflect, edge and wrap.
#include <limits>

#include "kiln/backends/cpu/op_util.h"

namespace kiln::cpu {
namespace {

bool AnyType(const KernelRequest& r) { return InType(r, 0) != DataType::kUndefined; }

std::vector<int64_t> AllAxes(size_t rank) {
  std::vector<int64_t> axes(rank);
  for (size_t i = 0; i < rank; ++i) axes[i] = static_cast<int64_t>(i);
  return axes;
}

// Identity maps for every axis.
std::vector<std::vector<int64_t>> IdentityMaps(std::span<const int64_t> dims) {
  std::vector<std::vector<int64_t>> maps(dims.size());
  for (size_t a = 0; a < dims.size(); ++a) {
    maps[a].resize(static_cast<size_t>(dims[a]));
    for (int64_t o = 0; o < dims[a]; ++o) maps[a][o] = o;
  }
  return maps;
}

Status RunSlice(const KernelRunArgs& a) {
  const TensorView& x = a.inputs[0];
  const TensorView& y = a.outputs[0];
  size_t rank = x.dims.size();
  std::vector<int64_t> starts = ReadInts(a.inputs[1]), ends = ReadInts(a.inputs[2]);
  std::vector<int64_t> axes =
      a.inputs.size() > 3 && a.inputs[3].data ? ReadInts(a.inputs[3]) : AllAxes(starts.size());
  std::vector<int64_t> steps = a.inputs.size() > 4 && a.inputs[4].data
                                   ? ReadInts(a.inputs[4])
                                   : std::vector<int64_t>(starts.size(), 1);
  std::vector<std::vector<int64_t>> maps = IdentityMaps(y.dims);
  for (size_t i = 0; i < axes.size(); ++i) {
    int64_t ax = axes[i] < 0 ? axes[i] + static_cast<int64_t>(rank) : axes[i];
    int64_t n = x.dims[ax], step = steps[i], s = starts[i];
    if (step == 0) return MakeError(ErrorCode::kKernelFailed, "Slice step is 0");
    if (s < 0) s += n;
    s = step > 0 ? std::clamp<int64_t>(s, 0, n) : std::clamp<int64_t>(s, 0, n - 1);
    for (int64_t o = 0; o < y.dims[ax]; ++o) maps[ax][o] = s + o * step;
    if (y.dims[ax] > 0 && (maps[ax].back() < 0 || maps[ax].back() >= n)) {
      return MakeError(ErrorCode::kKernelFailed, "Slice output dims disagree with its inputs");
    }
  }
  MapCopy(x.data, x.dims, y.data, y.dims, maps, SizeOf(x.dtype), nullptr);
  return OkStatus();
}

int64_t PadIndex(int64_t i, int64_t n, const std::string& mode) {
  if (i >= 0 && i < n) return i;
  if (mode == "constant" || n == 0) return -1;
  if (mode == "edge") return i < 0 ? 0 : n - 1;
  if (mode == "wrap") return ((i % n) + n) % n;
  // reflect: mirror without repeating the edge.
  if (n == 1) return 0;
  int64_t period = 2 * (n - 1);
  int64_t m = ((i % period) + period) % period;
  return m < n ? m : period - m;
}

const bool kRegistered = [] {
  RegisterOpKernel({.op_type = "Slice",
                    .float_wrap = false,
                    .accepts = AnyType,
                    .create = [](const KernelRequest&) { return KernelOr(RunSlice); }});
  RegisterOpKernel({
      .op_type = "Pad",
      .float_wrap = false,
      .accepts = AnyType,
      .create =
          [](const KernelRequest& r) {
            std::string mode = r.node->attrs().GetString("mode", "constant");
            return KernelOr([mode](const KernelRunArgs& a) -> Status {
              const TensorView& x = a.inputs[0];
              const TensorView& y = a.outputs[0];
              size_t rank = x.dims.size();
              std::vector<int64_t> pads = ReadInts(a.inputs[1]);
              std::vector<int64_t> axes =
                  a.inputs.size() > 3 && a.inputs[3].data ? ReadInts(a.inputs[3]) : AllAxes(rank);
              std::vector<int64_t> begin(rank, 0);
              for (size_t i = 0; i < axes.size(); ++i) {
                int64_t ax = axes[i] < 0 ? axes[i] + static_cast<int64_t>(rank) : axes[i];
                begin[ax] = pads[i];
              }
              std::vector<std::vector<int64_t>> maps(rank);
              for (size_t ax = 0; ax < rank; ++ax) {
                if (x.dims[ax] == 0 && mode != "constant" && y.dims[ax] > 0) {
                  return MakeError(ErrorCode::kKernelFailed, "Pad mode {} on an empty axis", mode);
                }
                for (int64_t o = 0; o < y.dims[ax]; ++o) {
                  maps[ax].push_back(PadIndex(o - begin[ax], x.dims[ax], mode));
                }
              }
              const void* fill = a.inputs.size() > 2 && a.inputs[2].data && mode == "constant"
                                     ? a.inputs[2].data
                                     : nullptr;
              MapCopy(x.data, x.dims, y.data, y.dims, maps, SizeOf(x.dtype), fill);
              return OkStatus();
            });
          },
  });
  for (bool tile : {true, false}) {
    RegisterOpKernel({
        .op_type = tile ? "Tile" : "Expand",
        .float_wrap = false,
        .accepts = AnyType,
        .create =
            [tile](const KernelRequest&) {
              return KernelOr([tile](const KernelRunArgs& a) -> Status {
                const TensorView& x = a.inputs[0];
                const TensorView& y = a.outputs[0];
                size_t rank = y.dims.size(), lead = rank - x.dims.size();
                // Expand may add leading axes; view the input with leading 1s.
                std::vector<int64_t> in_dims(lead, 1);
                in_dims.insert(in_dims.end(), x.dims.begin(), x.dims.end());
                std::vector<std::vector<int64_t>> maps(rank);
                for (size_t ax = 0; ax < rank; ++ax) {
                  int64_t n = in_dims[ax];
                  for (int64_t o = 0; o < y.dims[ax]; ++o) {
                    maps[ax].push_back(tile ? o % n : (n == 1 ? 0 : o));
                  }
                }
                MapCopy(x.data, in_dims, y.data, y.dims, maps, SizeOf(x.dtype), nullptr);
                return OkStatus();
              });
            },
    });
  }
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
