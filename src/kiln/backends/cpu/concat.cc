// Concat, ConcatSlices and Split on the CPU (any dtype: byte moves). Each sees the tensor as
// [outer, axis*inner] and copies one contiguous chunk per input (output) per outer index.
#include <cstring>
#include <span>

#include "kiln/backends/cpu/op_util.h"

namespace kiln::cpu {
namespace {

int64_t AxisOf(int64_t axis, size_t rank) {
  return axis < 0 ? axis + static_cast<int64_t>(rank) : axis;
}
int64_t AxisOf(const Node& node, int64_t def, size_t rank) {
  return AxisOf(node.attrs().GetInt("axis", def), rank);
}

int64_t Outer(std::span<const int64_t> dims, int64_t axis) {
  int64_t n = 1;
  for (int64_t i = 0; i < axis; ++i) n *= dims[i];
  return n;
}

// Bytes of one outer slice: dims[axis:] * element size.
size_t ChunkBytes(const TensorView& v, int64_t axis) {
  size_t n = SizeOf(v.dtype);
  for (size_t i = axis; i < v.dims.size(); ++i) n *= static_cast<size_t>(v.dims[i]);
  return n;
}

bool AnyType(const KernelRequest& r) { return InType(r, 0) != DataType::kUndefined; }

// Concat along `axis` of a range of each input's axis: [starts[i], starts[i] + lengths[i]), or
// the whole input when `starts` is empty (Concat). One contiguous chunk per input per outer index.
Status ConcatRanges(const KernelRunArgs& a, int64_t axis_attr, std::span<const int64_t> starts,
                    std::span<const int64_t> lengths) {
  const TensorView& out = a.outputs[0];
  const int64_t axis = AxisOf(axis_attr, out.dims.size());
  const int64_t outer = Outer(out.dims, axis);
  const size_t out_chunk = ChunkBytes(out, axis);
  SmallVec<size_t, 16> offsets, chunks, rows, firsts;  // inline: Run does not allocate
  size_t off = 0;
  for (size_t i = 0; i < a.inputs.size(); ++i) {
    const TensorView& in = a.inputs[i];
    rows.push_back(ChunkBytes(in, axis));
    if (starts.empty()) {
      chunks.push_back(rows.back());
      firsts.push_back(0);
    } else {
      const int64_t n = in.dims[axis];
      if (starts[i] < 0 || starts[i] + lengths[i] > n) {
        return MakeError(ErrorCode::kShapeMismatch,
                         "ConcatSlices: part {} [{}, {}) of an axis of {}", i, starts[i],
                         starts[i] + lengths[i], n);
      }
      const size_t unit = n == 0 ? 0 : rows.back() / static_cast<size_t>(n);
      chunks.push_back(static_cast<size_t>(lengths[i]) * unit);
      firsts.push_back(static_cast<size_t>(starts[i]) * unit);
    }
    offsets.push_back(off);
    off += chunks.back();
  }
  if (off != out_chunk) {
    return MakeError(ErrorCode::kShapeMismatch, "Concat: parts do not add up along axis {}", axis);
  }
  auto* dst = out.as<std::byte>();
  ParallelRows(outer, static_cast<int64_t>(out_chunk), [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      for (size_t i = 0; i < a.inputs.size(); ++i) {
        if (chunks[i] == 0) continue;
        std::memcpy(dst + o * out_chunk + offsets[i],
                    a.inputs[i].as<const std::byte>() + o * rows[i] + firsts[i], chunks[i]);
      }
    }
  });
  return OkStatus();
}

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "Concat",
      .float_wrap = false,
      .storage_types = true,
      .accepts = AnyType,
      .create =
          [](const KernelRequest& r) {
            const int64_t axis = r.node->attrs().GetInt("axis", 0);
            return KernelOr(
                [axis](const KernelRunArgs& a) { return ConcatRanges(a, axis, {}, {}); });
          },
  });
  // ConcatSlices: Concat with part i the range [starts[i], starts[i] + lengths[i]) of its input's
  // axis, copied from where it lies (attributes read once here: Run does not allocate).
  RegisterOpKernel({
      .op_type = "ConcatSlices",
      .float_wrap = false,
      .storage_types = true,
      .accepts = AnyType,
      .create =
          [](const KernelRequest& r) {
            const int64_t axis = r.node->attrs().GetInt("axis", 0);
            return KernelOr([axis, starts = r.node->attrs().GetInts("starts"),
                             lengths = r.node->attrs().GetInts("lengths")](const KernelRunArgs& a) {
              return ConcatRanges(a, axis, starts, lengths);
            });
          },
  });
  RegisterOpKernel({
      .op_type = "Split",
      .float_wrap = false,
      .storage_types = true,
      .accepts = AnyType,
      .create =
          [](const KernelRequest& r) {
            const Node* node = r.node;
            return KernelOr([node](const KernelRunArgs& a) {
              const TensorView& in = a.inputs[0];
              int64_t axis = AxisOf(*node, 0, in.dims.size());
              int64_t outer = Outer(in.dims, axis);
              size_t in_chunk = ChunkBytes(in, axis);
              auto* src = in.as<const std::byte>();
              size_t off = 0;
              for (const TensorView& out : a.outputs) {
                size_t chunk = ChunkBytes(out, axis);
                auto* dst = out.as<std::byte>();
                if (chunk > 0) {
                  ParallelRows(outer, static_cast<int64_t>(chunk), [&](int64_t o0, int64_t o1) {
                    for (int64_t o = o0; o < o1; ++o) {
                      std::memcpy(dst + o * chunk, src + o * in_chunk + off, chunk);
                    }
                  });
                }
                off += chunk;
              }
              if (off != in_chunk) {
                return MakeError(ErrorCode::kKernelFailed, "Split outputs cover {} of {} bytes",
                                 off, in_chunk);
              }
              return OkStatus();
            });
          },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
