// Scaffolding shared by the CPU op-family kernel files: providers built from a few functions (so
// a family registers many ops from a table), tactic naming, dtype dispatch, the n-ary broadcast
// row plan, and the strided copy / transpose routines that data-movement kernels reuse.
#pragma once

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kiln/backends/cpu/cpu_kernel.h"

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
  AcceptsFn accepts;
  CreateFn create;
};
// Registers a provider "cpu.<kebab op>" (plus "." variant when given).
void RegisterOpKernel(OpKernelDef def);

std::unique_ptr<Kernel> MakeKernel(LambdaKernel::RunFn run);
inline StatusOr<std::unique_ptr<Kernel>> KernelOr(LambdaKernel::RunFn run) {
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

// Integer contents of a host view (int64/int32, any rank).
std::vector<int64_t> ReadInts(const TensorView& v);
// A scalar of a host view as double.
inline double ReadScalar(const TensorView& v) { return LoadAsDouble(v, 0); }

// Calls f(std::type_identity<T>{}) for the C++ type of t among the listed kinds.
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
    default:
      return MakeError(ErrorCode::kKernelFailed, "CPU kernel has no {} path", ToString(t));
  }
}

// Broadcast of several inputs to an output, as rows: the output is `rows` x `inner` and input i
// reads `inner` elements from offset(row) with stride inner_stride[i] (1 or 0). The inner run is
// the longest suffix of dims over which every input is either complete or broadcast.
struct BroadcastPlan {
  BroadcastPlan(std::span<const TensorView> inputs, std::span<const int64_t> out_dims);
  int64_t rows = 0, inner = 1;
  std::vector<BroadcastIndexer> indexers;
  std::vector<int64_t> inner_stride;
  int64_t offset(size_t input, int64_t row) const { return indexers[input](row * inner); }
};

// Runs fn(begin, end) over [0, n) on the default pool when n * cost_per_item is large enough.
void ParallelRows(int64_t n, int64_t cost_per_item,
                  const std::function<void(int64_t, int64_t)>& fn);

// Transposes a dense tensor of `elem_size`-byte elements: out dims are in_dims permuted by perm.
// Coalesces dims, uses a blocked 2D path for batched matrix transposes and contiguous runs when
// the innermost dim is kept.
void TransposeBytes(const void* src, void* dst, std::span<const int64_t> in_dims,
                    std::span<const int64_t> perm, size_t elem_size);

// Copies with an independent index map per axis: output coord o on axis a reads input coord
// maps[a][o], or writes `fill` (elem_size bytes; zeros when null) where it is -1. Slice, Pad,
// Tile and Expand are all this; runs that are contiguous in the input become memcpy.
void MapCopy(const void* src, std::span<const int64_t> in_dims, void* dst,
             std::span<const int64_t> out_dims, const std::vector<std::vector<int64_t>>& maps,
             size_t elem_size, const void* fill);

// Row-major strides.
std::vector<int64_t> Strides(std::span<const int64_t> dims);

}  // namespace kiln::cpu
