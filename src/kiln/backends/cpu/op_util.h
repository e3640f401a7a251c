// Scaffolding shared by the CPU op-family kernel files: providers built from a few functions (so
// a family registers many ops from a table), tactic naming, dtype dispatch, the n-ary broadcast
// row plan, and the strided copy / transpose routines that data-movement kernels reuse.
#pragma once

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kiln/backends/cpu/cpu_kernel.h"
#include "kiln/backends/cpu/small_vec.h"

namespace kiln::cpu {

// "LeakyRelu" -> "leaky-relu".
std::string KebabCase(std::string_view op);
// "<dtype>-<op>-cpu[-variant]": "f32-softmax-cpu-row", "i64-gather-cpu" (STYLE.md rule 5).
std::string TacticName(DataType dtype, std::string_view op, std::string_view variant = "");

using CreateFn = std::function<StatusOr<std::unique_ptr<Kernel>>(const KernelRequest&)>;
using AcceptsFn = std::function<bool(const KernelRequest&)>;

// One op's CPU kernel, described by functions. `accepts` sees the request with f16/bf16 operands
// already shown as f32 when `float_wrap` is set (CpuFloatProvider then serves f16/bf16 for free).
struct OpKernelDef {
  std::string op_type;     // "Add"
  std::string variant;     // tactic suffix ("" or "row", "blocked"...)
  int name_operand = 0;    // the input whose dtype prefixes the tactic name; -1: output 0
  bool float_wrap = true;  // false: dtype-agnostic (byte moves), no f16/bf16 conversion
  // Whether `accepts` may see the storage-only types (dtype.h: float8, float4, int4, int2...):
  // set by kernels that convert them (Cast, Q/DQ) or move their bytes unchanged (one byte per
  // value). Other kernels never see them; their layers fail at build with no CPU tactic.
  bool storage_types = false;
  AcceptsFn accepts;
  CreateFn create;
};
// Registers a provider "cpu.<kebab op>" (plus "." variant when given).
void RegisterOpKernel(OpKernelDef def);

std::unique_ptr<Kernel> MakeKernel(FnKernel::RunFn run);
inline StatusOr<std::unique_ptr<Kernel>> KernelOr(FnKernel::RunFn run) {
  return MakeKernel(std::move(run));
}

// Operand predicates for `accepts`.
inline DataType InType(const KernelRequest& r, size_t i) {
  return i < r.inputs.size() ? r.inputs[i].dtype : DataType::kUndefined;
}
inline DataType OutType(const KernelRequest& r, size_t i) {
  return i < r.outputs.size() ? r.outputs[i].dtype : DataType::kUndefined;
}
inline bool IsIndexType(DataType t) { return t == DataType::kInt64 || t == DataType::kInt32; }

// Integer contents of a host view (int64/int32, any rank): for small shape-like tensors (dims,
// axes, pads), kept inline without allocating; element i of a larger one is ReadInt(v, i).
DimVec ReadInts(const TensorView& v);
inline int64_t ReadInt(const TensorView& v, int64_t i) {
  return v.dtype == DataType::kInt64   ? v.as<const int64_t>()[i]
         : v.dtype == DataType::kInt32 ? v.as<const int32_t>()[i]
                                       : static_cast<int64_t>(LoadAsDouble(v, i));
}
// A scalar of a host view as double.
inline double ReadScalar(const TensorView& v) { return LoadAsDouble(v, 0); }

// Calls f(std::type_identity<T>{}) for the C++ type of t: every numeric type and bool (f16/bf16
// come as f32 through the float wrapper). Kernels accept the types they instantiate.
template <typename F>
Status DispatchNumeric(DataType t, F&& f) {
  switch (t) {
    case DataType::kFloat32:
      return f(std::type_identity<float>{});
    case DataType::kInt64:
      return f(std::type_identity<int64_t>{});
    case DataType::kInt32:
      return f(std::type_identity<int32_t>{});
    case DataType::kInt8:
      return f(std::type_identity<int8_t>{});
    case DataType::kUInt8:
      return f(std::type_identity<uint8_t>{});
    case DataType::kBool:
      return f(std::type_identity<bool>{});
    case DataType::kFloat64:
      return f(std::type_identity<double>{});
    case DataType::kInt16:
      return f(std::type_identity<int16_t>{});
    case DataType::kUInt16:
      return f(std::type_identity<uint16_t>{});
    case DataType::kUInt32:
      return f(std::type_identity<uint32_t>{});
    case DataType::kUInt64:
      return f(std::type_identity<uint64_t>{});
    default:
      return MakeError(ErrorCode::kKernelFailed, "CPU kernel has no {} path", ToString(t));
  }
}

// Broadcast of several inputs to an output, as rows: the output is `rows` x `inner` and input i
// reads `inner` elements from offset(row) with stride inner_stride[i] (1 or 0). The inner run is
// the longest suffix of dims over which every input is either complete or broadcast.
// Built on the stack in Run: it allocates nothing for up to 4 inputs of rank <= 12.
struct BroadcastPlan {
  BroadcastPlan(std::span<const TensorView> inputs, std::span<const int64_t> out_dims);
  int64_t rows = 0, inner = 1;
  SmallVec<BroadcastIndexer, 4> indexers;
  SmallVec<int64_t, 4> inner_stride;
  int64_t offset(size_t input, int64_t row) const { return indexers[input](row * inner); }
};

// Runs fn(begin, end) over [0, n) on the default pool when n * cost_per_item is large enough.
// A template so that the callable is passed by reference (a std::function would allocate).
template <typename F>
void ParallelRows(int64_t n, int64_t cost_per_item, F&& fn) {
  constexpr int64_t kGrain = 1 << 15;  // elements worth one task
  int64_t min_chunk = std::max<int64_t>(1, kGrain / std::max<int64_t>(1, cost_per_item));
  ThreadPool::Default().ParallelFor(n, fn, min_chunk);
}

// Transposes a dense tensor of `elem_size`-byte elements: out dims are in_dims permuted by perm.
// Coalesces dims, uses a blocked 2D path for batched matrix transposes and contiguous runs when
// the innermost dim is kept.
void TransposeBytes(const void* src, void* dst, std::span<const int64_t> in_dims,
                    std::span<const int64_t> perm, size_t elem_size);

// Copies with an independent index map per axis: output coord o on axis a reads input coord
// map(a, o), or writes `fill` (elem_size bytes; zeros when null) where it is -1. Slice, Pad,
// Tile and Expand are all this; runs that are contiguous in the input become memcpy. The map is
// a callable (computed, not stored), so nothing is allocated.
template <typename Map>
void MapCopy(const void* src, std::span<const int64_t> in_dims, void* dst,
             std::span<const int64_t> out_dims, const Map& map, size_t es, const void* fill);
// Row-major strides.
DimVec Strides(std::span<const int64_t> dims);

template <typename Map>
void MapCopy(const void* src, std::span<const int64_t> in_dims, void* dst,
             std::span<const int64_t> out_dims, const Map& map, size_t es, const void* fill) {
  size_t rank = out_dims.size();
  int64_t total = 1;
  for (int64_t d : out_dims) total *= d;
  if (total == 0) return;
  auto* s = static_cast<const std::byte*>(src);
  auto* d = static_cast<std::byte*>(dst);
  static constexpr std::byte kZero[16] = {};
  const auto* fill_bytes = fill ? static_cast<const std::byte*>(fill) : kZero;
  if (rank == 0) {
    std::memcpy(d, s, es);
    return;
  }
  DimVec in_strides = Strides(in_dims);
  int64_t inner = out_dims[rank - 1];
  int64_t rows = total / inner;
  ParallelRows(rows, inner, [&](int64_t r0, int64_t r1) {
    DimVec coord(rank, 0);
    int64_t rem = r0;
    for (size_t a = rank - 1; a-- > 0;) {
      coord[a] = rem % out_dims[a];
      rem /= out_dims[a];
    }
    for (int64_t r = r0; r < r1; ++r) {
      int64_t off = 0;
      bool filled = false;
      for (size_t a = 0; a + 1 < rank; ++a) {
        int64_t m = map(a, coord[a]);
        if (m < 0) filled = true;
        off += m * in_strides[a];
      }
      std::byte* row = d + r * inner * static_cast<int64_t>(es);
      // Maximal runs of the last axis that read consecutive input elements (or all fill).
      for (int64_t o = 0; o < inner;) {
        int64_t m = filled ? -1 : map(rank - 1, o);
        int64_t len = 1;
        while (o + len < inner) {
          int64_t next = filled ? -1 : map(rank - 1, o + len);
          if (m < 0 ? next >= 0 : next != m + len) break;
          ++len;
        }
        std::byte* out = row + o * static_cast<int64_t>(es);
        if (m < 0) {
          for (int64_t j = 0; j < len; ++j) std::memcpy(out + j * es, fill_bytes, es);
        } else {
          std::memcpy(out, s + (off + m) * static_cast<int64_t>(es), static_cast<size_t>(len) * es);
        }
        o += len;
      }
      for (size_t a = rank - 1; a-- > 0;) {
        if (++coord[a] < out_dims[a]) break;
        coord[a] = 0;
      }
    }
  });
}

}  // namespace kiln::cpu
