// Trilu and OneHot on the CPU. Trilu keeps the upper or lower triangle of the last two axes
// (any dtype; zero bytes elsewhere); OneHot writes values[0]/values[1] by index.
#include "kiln/backends/cpu/op_util.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "Trilu",
      .float_wrap = false,
      .accepts = [](const KernelRequest& r) { return InType(r, 0) != DataType::kUndefined; },
      .create =
          [](const KernelRequest& r) {
            bool upper = attrs::Trilu::upper(*r.node) != 0;
            return KernelOr([upper](const KernelRunArgs& a) {
              const TensorView& x = a.inputs[0];
              int64_t k = a.inputs.size() > 1 && a.inputs[1].data ? ReadInts(a.inputs[1])[0] : 0;
              size_t rank = x.dims.size(), es = SizeOf(x.dtype);
              int64_t rows = x.dims[rank - 2], cols = x.dims[rank - 1];
              int64_t mats = rows * cols == 0 ? 0 : x.num_elements() / (rows * cols);
              auto* src = x.as<const std::byte>();
              auto* dst = a.outputs[0].as<std::byte>();
              ParallelRows(mats * rows, cols, [&](int64_t b, int64_t e) {
                for (int64_t t = b; t < e; ++t) {
                  int64_t i = t % rows;
                  // Kept columns: j - i >= k (upper) or j - i <= k (lower).
                  int64_t lo = upper ? std::clamp<int64_t>(i + k, 0, cols) : 0;
                  int64_t hi = upper ? cols : std::clamp<int64_t>(i + k + 1, 0, cols);
                  std::byte* d = dst + t * cols * es;
                  std::memset(d, 0, cols * es);
                  if (hi > lo) std::memcpy(d + lo * es, src + (t * cols + lo) * es, (hi - lo) * es);
                }
              });
              return OkStatus();
            });
          },
  });
  RegisterOpKernel({
      .op_type = "OneHot",
      .name_operand = 2,
      .float_wrap = false,
      .accepts =
          [](const KernelRequest& r) {
            return InType(r, 0) != DataType::kUndefined && InType(r, 2) != DataType::kUndefined;
          },
      .create =
          [](const KernelRequest& r) {
            int64_t axis_attr = attrs::OneHot::axis(*r.node);
            return KernelOr([axis_attr](const KernelRunArgs& a) {
              const TensorView& ind = a.inputs[0];
              const TensorView& y = a.outputs[0];
              int64_t rank = static_cast<int64_t>(y.dims.size());
              int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
              int64_t depth = y.dims[axis], outer = 1, inner = 1;
              for (int64_t i = 0; i < axis; ++i) outer *= y.dims[i];
              for (int64_t i = axis + 1; i < rank; ++i) inner *= y.dims[i];
              size_t es = SizeOf(y.dtype);
              auto* vals = a.inputs[2].as<const std::byte>();
              auto* dst = y.as<std::byte>();
              for (int64_t o = 0; o < outer; ++o) {
                for (int64_t d = 0; d < depth; ++d) {
                  for (int64_t i = 0; i < inner; ++i) {
                    int64_t idx = static_cast<int64_t>(LoadAsDouble(ind, o * inner + i));
                    if (idx < 0) idx += depth;
                    std::memcpy(dst + ((o * depth + d) * inner + i) * es,
                                vals + (idx == d ? es : 0), es);
                  }
                }
              }
              return OkStatus();
            });
          },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
