// Gather, GatherElements, GatherND, ScatterElements and ScatterND on the CPU (any data dtype:
// byte moves; int32/int64 indices, negative indices count from the end; the scatter reductions
// on float and integer types). An out-of-range index is an error, not a crash.
#include <type_traits>

#include "kiln/backends/cpu/op_util.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

bool DataAndIndices(const KernelRequest& r) {
  return InType(r, 0) != DataType::kUndefined && IsIndexType(InType(r, 1));
}

Status BadIndex(int64_t index, int64_t size) {
  return MakeError(ErrorCode::kKernelFailed, "index {} is out of range for an axis of size {}",
                   index, size);
}

// The scatter ops' `reduction` attribute (the shape rules accept only these five).
enum class Reduction { kNone, kAdd, kMul, kMax, kMin };

Reduction ParseReduction(const std::string& s) {
  return s == "add"   ? Reduction::kAdd
         : s == "mul" ? Reduction::kMul
         : s == "max" ? Reduction::kMax
         : s == "min" ? Reduction::kMin
                      : Reduction::kNone;
}

// Data types a reducing scatter combines: the float and integer types (bool has no arithmetic).
bool Reducible(DataType t) { return IsFloat(t) || IsInteger(t); }

// Calls f(std::type_identity<T>{}) for a Reducible type.
template <typename F>
Status DispatchReducible(DataType t, F&& f) {
  switch (t) {
    case DataType::kFloat32:
      return f(std::type_identity<float>{});
    case DataType::kFloat16:
      return f(std::type_identity<Float16>{});
    case DataType::kBFloat16:
      return f(std::type_identity<BFloat16>{});
    case DataType::kInt64:
      return f(std::type_identity<int64_t>{});
    case DataType::kInt32:
      return f(std::type_identity<int32_t>{});
    case DataType::kInt8:
      return f(std::type_identity<int8_t>{});
    case DataType::kUInt8:
      return f(std::type_identity<uint8_t>{});
    default:
      return MakeError(ErrorCode::kKernelFailed, "a reducing scatter has no {} path", ToString(t));
  }
}

// `o` combined with `u` by the reduction; f16/bf16 combine in float and round once.
template <typename T>
T Combine(T o, T u, Reduction r) {
  if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>) {
    return T(Combine(static_cast<float>(o), static_cast<float>(u), r));
  } else {
    switch (r) {
      case Reduction::kAdd:
        return static_cast<T>(o + u);
      case Reduction::kMul:
        return static_cast<T>(o * u);
      case Reduction::kMax:
        return std::max(o, u);
      default:
        return std::min(o, u);
    }
  }
}

// Copies data to the output (skipped when the planner made them one buffer).
void CopyData(const TensorView& data, const TensorView& out) {
  if (out.data != data.data) std::memcpy(out.data, data.data, data.size_bytes());
}

// GatherElements/ScatterElements: indices (of data's rank) address data by their own coordinates
// on every axis but `axis`, so there they may not be longer than data (symbolic dims can differ
// at run time even where the shape rule saw nothing wrong).
Status IndicesFitData(const TensorView& data, const TensorView& indices, int64_t axis) {
  for (size_t d = 0; d < data.dims.size(); ++d) {
    if (static_cast<int64_t>(d) != axis && indices.dims[d] > data.dims[d]) {
      return MakeError(ErrorCode::kKernelFailed,
                       "indices dim {} has {} entries, data only {} (axis is {})", d,
                       indices.dims[d], data.dims[d], axis);
    }
  }
  return OkStatus();
}

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "Gather",
      .float_wrap = false,
      .storage_types = true,
      .accepts = DataAndIndices,
      .create =
          [](const KernelRequest& r) {
            int64_t axis_attr = attrs::Gather::axis(*r.node);
            return KernelOr([axis_attr](const KernelRunArgs& a) -> Status {
              const TensorView& data = a.inputs[0];
              int64_t rank = static_cast<int64_t>(data.dims.size());
              int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
              // Indices are read in place (no copy: Run does not allocate), checked first.
              const TensorView& indices = a.inputs[1];
              int64_t n = data.dims[axis], outer = 1;
              size_t inner = SizeOf(data.dtype);
              for (int64_t i = 0; i < axis; ++i) outer *= data.dims[i];
              for (int64_t i = axis + 1; i < rank; ++i) inner *= static_cast<size_t>(data.dims[i]);
              int64_t k = indices.num_elements();
              for (int64_t j = 0; j < k; ++j) {
                int64_t i = ReadInt(indices, j);
                if (i < -n || i >= n) return BadIndex(i, n);
              }
              auto* src = data.as<const std::byte>();
              auto* dst = a.outputs[0].as<std::byte>();
              if (a.outputs[0].size_bytes() == 0) return OkStatus();
              ParallelRows(outer * k, static_cast<int64_t>(inner), [&](int64_t b, int64_t e) {
                for (int64_t t = b; t < e; ++t) {
                  int64_t o = t / k, i = ReadInt(indices, t % k);
                  if (i < 0) i += n;
                  std::memcpy(dst + t * inner, src + (o * n + i) * inner, inner);
                }
              });
              return OkStatus();
            });
          },
  });
  RegisterOpKernel({
      .op_type = "GatherElements",
      .float_wrap = false,
      .storage_types = true,
      .accepts = DataAndIndices,
      .create =
          [](const KernelRequest& r) {
            int64_t axis_attr = attrs::GatherElements::axis(*r.node);
            return KernelOr([axis_attr](const KernelRunArgs& a) -> Status {
              const TensorView& data = a.inputs[0];
              const TensorView& out = a.outputs[0];
              size_t rank = data.dims.size();
              int64_t axis = axis_attr < 0 ? axis_attr + static_cast<int64_t>(rank) : axis_attr;
              const TensorView& indices = a.inputs[1];
              DimVec ds = Strides(data.dims);
              DimVec coord(rank, 0);
              size_t es = SizeOf(data.dtype);
              int64_t n = data.dims[axis];
              KILN_RETURN_IF_ERROR(IndicesFitData(data, indices, axis));
              auto* src = data.as<const std::byte>();
              auto* dst = out.as<std::byte>();
              for (int64_t t = 0; t < indices.num_elements(); ++t) {
                int64_t i = ReadInt(indices, t);
                if (i < -n || i >= n) return BadIndex(i, n);
                if (i < 0) i += n;
                int64_t off = 0;
                for (size_t d = 0; d < rank; ++d) {
                  off += (static_cast<int64_t>(d) == axis ? i : coord[d]) * ds[d];
                }
                std::memcpy(dst + t * es, src + off * es, es);
                for (size_t d = rank; d-- > 0;) {
                  if (++coord[d] < out.dims[d]) break;
                  coord[d] = 0;
                }
              }
              return OkStatus();
            });
          },
  });
  RegisterOpKernel({
      .op_type = "GatherND",
      .float_wrap = false,
      .storage_types = true,
      .accepts = DataAndIndices,
      .create =
          [](const KernelRequest& r) {
            int64_t b = attrs::GatherND::batch_dims(*r.node);
            return KernelOr([b](const KernelRunArgs& a) -> Status {
              const TensorView& data = a.inputs[0];
              const TensorView& ind = a.inputs[1];
              size_t rank = data.dims.size(), q = ind.dims.size();
              int64_t k = ind.dims.back();
              // batch x tuples x slice: tuple j of batch i picks a slice of data's batch i.
              int64_t batch = 1, tuples = 1, slice = 1;
              for (int64_t d = 0; d < b; ++d) {
                if (data.dims[d] != ind.dims[d]) {
                  return MakeError(ErrorCode::kKernelFailed,
                                   "batch dim {} is {} in data but {} in indices", d, data.dims[d],
                                   ind.dims[d]);
                }
                batch *= data.dims[d];
              }
              for (size_t d = static_cast<size_t>(b); d + 1 < q; ++d) tuples *= ind.dims[d];
              for (size_t d = static_cast<size_t>(b + k); d < rank; ++d) slice *= data.dims[d];
              DimVec ds = Strides(data.dims);
              int64_t batch_stride = b > 0 ? ds[b - 1] : 0;
              // Checked first, as Gather does, so the copy below needs no error path.
              for (int64_t t = 0; t < batch * tuples * k; ++t) {
                int64_t i = ReadInt(ind, t), n = data.dims[b + t % k];
                if (i < -n || i >= n) return BadIndex(i, n);
              }
              size_t bytes = static_cast<size_t>(slice) * SizeOf(data.dtype);
              auto* src = data.as<const std::byte>();
              auto* dst = a.outputs[0].as<std::byte>();
              if (a.outputs[0].size_bytes() == 0) return OkStatus();
              ParallelRows(batch * tuples, slice, [&](int64_t t0, int64_t t1) {
                for (int64_t t = t0; t < t1; ++t) {
                  int64_t off = (t / tuples) * batch_stride;
                  for (int64_t d = 0; d < k; ++d) {
                    int64_t i = ReadInt(ind, t * k + d), n = data.dims[b + d];
                    off += (i < 0 ? i + n : i) * ds[b + d];
                  }
                  std::memcpy(dst + t * bytes, src + off * SizeOf(data.dtype), bytes);
                }
              });
              return OkStatus();
            });
          },
  });
  RegisterOpKernel({
      .op_type = "ScatterElements",
      .float_wrap = false,
      .accepts =
          [](const KernelRequest& r) {
            if (attrs::ScatterElements::reduction(*r.node) == "none") return DataAndIndices(r);
            return IsIndexType(InType(r, 1)) && Reducible(InType(r, 0));
          },
      .create =
          [](const KernelRequest& r) {
            int64_t axis_attr = attrs::ScatterElements::axis(*r.node);
            Reduction red = ParseReduction(attrs::ScatterElements::reduction(*r.node));
            return KernelOr([axis_attr, red](const KernelRunArgs& a) -> Status {
              const TensorView& data = a.inputs[0];
              const TensorView& ind = a.inputs[1];
              size_t rank = data.dims.size();
              int64_t axis = axis_attr < 0 ? axis_attr + static_cast<int64_t>(rank) : axis_attr;
              KILN_RETURN_IF_ERROR(IndicesFitData(data, ind, axis));
              CopyData(data, a.outputs[0]);
              DimVec ds = Strides(data.dims);
              int64_t n = data.dims[axis];
              size_t es = SizeOf(data.dtype);
              auto* dst = a.outputs[0].as<std::byte>();
              auto* upd = a.inputs[2].as<const std::byte>();
              // In index order (later updates win, or combine in that order): `visit(t, off)`
              // applies update t at data element `off`.
              auto each = [&](auto&& visit) -> Status {
                DimVec coord(rank, 0);
                for (int64_t t = 0; t < ind.num_elements(); ++t) {
                  int64_t i = ReadInt(ind, t);
                  if (i < -n || i >= n) return BadIndex(i, n);
                  if (i < 0) i += n;
                  int64_t off = 0;
                  for (size_t d = 0; d < rank; ++d) {
                    off += (static_cast<int64_t>(d) == axis ? i : coord[d]) * ds[d];
                  }
                  visit(t, off);
                  for (size_t d = rank; d-- > 0;) {
                    if (++coord[d] < ind.dims[d]) break;
                    coord[d] = 0;
                  }
                }
                return OkStatus();
              };
              if (red == Reduction::kNone) {
                return each(
                    [&](int64_t t, int64_t off) { std::memcpy(dst + off * es, upd + t * es, es); });
              }
              return DispatchReducible(data.dtype, [&](auto tag) -> Status {
                using T = typename decltype(tag)::type;
                T* o = reinterpret_cast<T*>(dst);
                const T* u = reinterpret_cast<const T*>(upd);
                return each([&](int64_t t, int64_t off) { o[off] = Combine(o[off], u[t], red); });
              });
            });
          },
  });
  RegisterOpKernel({
      .op_type = "ScatterND",
      .float_wrap = false,
      .accepts =
          [](const KernelRequest& r) {
            if (attrs::ScatterND::reduction(*r.node) == "none") return DataAndIndices(r);
            return IsIndexType(InType(r, 1)) && Reducible(InType(r, 0));
          },
      .create =
          [](const KernelRequest& r) {
            Reduction red = ParseReduction(attrs::ScatterND::reduction(*r.node));
            return KernelOr([red](const KernelRunArgs& a) -> Status {
              const TensorView& data = a.inputs[0];
              const TensorView& ind = a.inputs[1];
              size_t es = SizeOf(data.dtype);
              auto* dst = a.outputs[0].as<std::byte>();
              CopyData(data, a.outputs[0]);
              int64_t k = ind.dims.back();
              int64_t q = ind.num_elements() / std::max<int64_t>(k, 1);
              if (k < 1 || k > static_cast<int64_t>(data.dims.size())) {
                return MakeError(ErrorCode::kKernelFailed,
                                 "index tuples of {} entries for data of rank {}", k,
                                 data.dims.size());
              }
              DimVec ds = Strides(data.dims);
              int64_t slice = 1;
              for (size_t d = static_cast<size_t>(k); d < data.dims.size(); ++d)
                slice *= data.dims[d];
              if (a.inputs[2].num_elements() != q * slice) {
                return MakeError(ErrorCode::kKernelFailed,
                                 "{} updates for {} index tuples of {}-element slices",
                                 a.inputs[2].num_elements(), q, slice);
              }
              auto* upd = a.inputs[2].as<const std::byte>();
              // Each index tuple's element offset, checked; `visit(t, off)` applies update t.
              auto each = [&](auto&& visit) -> Status {
                for (int64_t t = 0; t < q; ++t) {
                  int64_t off = 0;
                  for (int64_t d = 0; d < k; ++d) {
                    int64_t i = ReadInt(ind, t * k + d), n = data.dims[d];
                    if (i < -n || i >= n) return BadIndex(i, n);
                    off += (i < 0 ? i + n : i) * ds[d];
                  }
                  visit(t, off);
                }
                return OkStatus();
              };
              if (red == Reduction::kNone) {
                return each([&](int64_t t, int64_t off) {
                  std::memcpy(dst + off * es, upd + t * slice * es, slice * es);
                });
              }
              return DispatchReducible(data.dtype, [&](auto tag) -> Status {
                using T = typename decltype(tag)::type;
                return each([&](int64_t t, int64_t off) {
                  T* o = reinterpret_cast<T*>(dst) + off;
                  const T* u = reinterpret_cast<const T*>(upd) + t * slice;
                  for (int64_t j = 0; j < slice; ++j) o[j] = Combine(o[j], u[j], red);
                });
              });
            });
          },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
