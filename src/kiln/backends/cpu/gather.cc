// Gather, GatherElements and ScatterND on the CPU (any data dtype: byte moves; int32/int64
// indices, negative indices count from the end). An out-of-range index is an error, not a crash.
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

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "Gather",
      .float_wrap = false,
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
      .op_type = "ScatterND",
      .float_wrap = false,
      .accepts =
          [](const KernelRequest& r) {
            // The reducing forms need arithmetic: f32/i64/i32 only.
            if (attrs::ScatterND::reduction(*r.node) == "none") return DataAndIndices(r);
            DataType t = InType(r, 0);
            return IsIndexType(InType(r, 1)) &&
                   (t == DataType::kFloat32 || t == DataType::kInt64 || t == DataType::kInt32);
          },
      .create =
          [](const KernelRequest& r) {
            std::string red = attrs::ScatterND::reduction(*r.node);
            return KernelOr([red](const KernelRunArgs& a) -> Status {
              const TensorView& data = a.inputs[0];
              const TensorView& ind = a.inputs[1];
              size_t es = SizeOf(data.dtype);
              auto* dst = a.outputs[0].as<std::byte>();
              std::memcpy(dst, data.data, data.size_bytes());
              int64_t k = ind.dims.back();
              int64_t q = ind.num_elements() / std::max<int64_t>(k, 1);
              DimVec ds = Strides(data.dims);
              int64_t slice = 1;
              for (size_t d = static_cast<size_t>(k); d < data.dims.size(); ++d)
                slice *= data.dims[d];
              auto* upd = a.inputs[2].as<const std::byte>();
              for (int64_t t = 0; t < q; ++t) {
                int64_t off = 0;
                for (int64_t d = 0; d < k; ++d) {
                  int64_t i = ReadInt(ind, t * k + d), n = data.dims[d];
                  if (i < -n || i >= n) return BadIndex(i, n);
                  off += (i < 0 ? i + n : i) * ds[d];
                }
                if (red == "none") {
                  std::memcpy(dst + off * es, upd + t * slice * es, slice * es);
                  continue;
                }
                KILN_RETURN_IF_ERROR(DispatchNumeric(data.dtype, [&](auto tag) -> Status {
                  using T = typename decltype(tag)::type;
                  T* o = reinterpret_cast<T*>(dst) + off;
                  const T* u = reinterpret_cast<const T*>(upd) + t * slice;
                  for (int64_t j = 0; j < slice; ++j) {
                    if (red == "add") {
                      o[j] = static_cast<T>(o[j] + u[j]);
                    } else if (red == "mul") {
                      o[j] = static_cast<T>(o[j] * u[j]);
                    } else if (red == "max") {
                      o[j] = std::max(o[j], u[j]);
                    } else {
                      o[j] = std::min(o[j], u[j]);
                    }
                  }
                  return OkStatus();
                }));
              }
              return OkStatus();
            });
          },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
