// Shape-only and data-movement-free ops on the CPU: Identity, Reshape, Flatten, Squeeze and
// Unsqueeze copy bytes (the builder may alias them later); Shape and Size write dims;
// ConstantOfShape fills; Range counts. All dtypes.
#include "kiln/backends/cpu/op_util.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

Status CopyBytes(const KernelRunArgs& a) {
  const TensorView& in = a.inputs[0];
  const TensorView& out = a.outputs[0];
  if (in.size_bytes() != out.size_bytes()) {
    return MakeError(ErrorCode::kKernelFailed, "copy of {} bytes into {} bytes", in.size_bytes(),
                     out.size_bytes());
  }
  if (in.data != out.data && out.size_bytes() > 0) {
    auto* src = static_cast<const std::byte*>(in.data);
    auto* dst = static_cast<std::byte*>(out.data);
    ParallelRows(static_cast<int64_t>(out.size_bytes()), 1, [&](int64_t b, int64_t e) {
      std::memcpy(dst + b, src + b, static_cast<size_t>(e - b));
    });
  }
  return OkStatus();
}

bool AnyType(const KernelRequest& r) { return InType(r, 0) != DataType::kUndefined; }

template <typename T>
void FillRange(const KernelRunArgs& a) {
  T start = a.inputs[0].as<const T>()[0], delta = a.inputs[2].as<const T>()[0];
  T* y = a.outputs[0].as<T>();
  int64_t n = a.outputs[0].num_elements();
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(start + static_cast<T>(i) * delta);
}

const bool kRegistered = [] {
  for (const char* op : {"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze"}) {
    RegisterOpKernel({.op_type = op,
                      .float_wrap = false,
                      .storage_types = true,
                      .accepts = AnyType,
                      .create = [](const KernelRequest&) { return KernelOr(CopyBytes); }});
  }
  RegisterOpKernel({
      .op_type = "Shape",
      .name_operand = -1,
      .float_wrap = false,
      .storage_types = true,
      .accepts = AnyType,
      .create =
          [](const KernelRequest& r) {
            int64_t start = attrs::Shape::start(*r.node);
            return KernelOr([start](const KernelRunArgs& a) {
              int64_t rank = static_cast<int64_t>(a.inputs[0].dims.size());
              int64_t s = start < 0 ? start + rank : start;
              s = std::clamp<int64_t>(s, 0, rank);
              int64_t n = a.outputs[0].num_elements();
              for (int64_t i = 0; i < n; ++i)
                a.outputs[0].as<int64_t>()[i] = a.inputs[0].dims[s + i];
              return OkStatus();
            });
          },
  });
  RegisterOpKernel({
      .op_type = "Size",
      .name_operand = -1,
      .float_wrap = false,
      .storage_types = true,
      .accepts = AnyType,
      .create =
          [](const KernelRequest&) {
            return KernelOr([](const KernelRunArgs& a) {
              a.outputs[0].as<int64_t>()[0] = a.inputs[0].num_elements();
              return OkStatus();
            });
          },
  });
  RegisterOpKernel({
      .op_type = "ConstantOfShape",
      .name_operand = -1,
      .float_wrap = false,
      .accepts = [](const KernelRequest& r) { return OutType(r, 0) != DataType::kUndefined; },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        DataType t = OutType(r, 0);
        const Tensor* v = r.node->attrs().GetTensor("value");
        std::vector<std::byte> value(SizeOf(t));
        if (v) {
          if (v->dtype() != t) {
            return MakeError(ErrorCode::kKernelFailed, "value is {} but the output is {}",
                             ToString(v->dtype()), ToString(t));
          }
          std::memcpy(value.data(), v->raw(), value.size());
        }
        return KernelOr([value](const KernelRunArgs& a) {
          auto* y = a.outputs[0].as<std::byte>();
          int64_t n = a.outputs[0].num_elements();
          size_t es = value.size();
          for (int64_t i = 0; i < n; ++i) std::memcpy(y + i * es, value.data(), es);
          return OkStatus();
        });
      },
  });
  RegisterOpKernel({
      .op_type = "Range",
      .accepts =
          [](const KernelRequest& r) {
            DataType t = InType(r, 0);
            return t == DataType::kFloat32 || t == DataType::kInt64 || t == DataType::kInt32;
          },
      .create =
          [](const KernelRequest& r) {
            return KernelOr([t = InType(r, 0)](const KernelRunArgs& a) {
              if (t == DataType::kFloat32) FillRange<float>(a);
              if (t == DataType::kInt64) FillRange<int64_t>(a);
              if (t == DataType::kInt32) FillRange<int32_t>(a);
              return OkStatus();
            });
          },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
