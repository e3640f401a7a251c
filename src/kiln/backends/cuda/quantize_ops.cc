// CUDA providers of QuantizeLinear and DequantizeLinear (kernels in quantize.cu): the requests
// the CPU's kernels take (backends/cpu/quantize.cc), per tensor or per axis. A constant per-tensor
// scale or zero point is read on the host when the kernel is created and passed by value; a
// per-axis or run-time one is read by the kernel from the device.
#include <memory>

#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/backends/cuda/cuda_launch_more.h"
#include "kiln/ops/op_table.h"

namespace kiln::cuda {
namespace {

bool QuantizedType(DataType t) { return t == DataType::kInt8 || t == DataType::kUInt8; }

// The parameters' state of one layer: the by-value ones fixed at create, the channel split set
// in Prepare (it depends on the bound shapes), the device pointers filled in at each run.
struct QdqState {
  QuantDesc desc;
  bool scale_on_host = false, zero_on_host = false;
};

// A by-value scalar when operand i is a one-element constant.
const Tensor* HostScalar(const KernelRequest& r, size_t i) {
  const Tensor* c = i < r.inputs.size() ? r.inputs[i].constant : nullptr;
  return c && c->num_elements() == 1 ? c : nullptr;
}

std::shared_ptr<QdqState> MakeState(const KernelRequest& r) {
  auto s = std::make_shared<QdqState>();
  s->desc.scale_t = *ToElem(InType(r, 1));
  if (const Tensor* scale = HostScalar(r, 1)) {
    s->scale_on_host = true;
    s->desc.scale_value = static_cast<float>(scale->GetDouble(0));
  }
  if (InType(r, 2) == DataType::kUndefined) {
    s->zero_on_host = true;  // omitted: zero
  } else if (const Tensor* zero = HostScalar(r, 2)) {
    s->zero_on_host = true;
    s->desc.zero_value = static_cast<int32_t>(zero->GetDouble(0));
  }
  return s;
}

// Prepare: element i uses channel (i / inner) % channels, channels = the scale's elements (one:
// per tensor), as the CPU kernel splits it.
Status SplitChannels(QdqState& s, std::span<const TensorView> in, int64_t axis_attr) {
  const int64_t channels = in[1].num_elements();
  s.desc.channels = channels < 1 ? 1 : channels;
  s.desc.inner = 1;
  if (channels <= 1) return OkStatus();
  const int64_t rank = static_cast<int64_t>(in[0].dims.size());
  const int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
  if (axis < 0 || axis >= rank || in[0].dims[static_cast<size_t>(axis)] != channels) {
    return MakeError(ErrorCode::kShapeMismatch,
                     "the per-axis scale has {} elements; axis {} of an input of rank {} does not "
                     "have as many",
                     channels, axis_attr, rank);
  }
  for (int64_t d = axis + 1; d < rank; ++d) s.desc.inner *= in[0].dims[static_cast<size_t>(d)];
  return OkStatus();
}

// The layer's kernel: `launch(desc, args)` with the device parameters of this run filled in.
template <typename LaunchFn>
StatusOr<std::unique_ptr<Kernel>> QdqKernel(const KernelRequest& r, int64_t axis, LaunchFn launch) {
  auto state = MakeState(r);
  return MakeFnKernel(
      [state, launch](const KernelRunArgs& a) -> Status {
        QuantDesc d = state->desc;
        if (!state->scale_on_host) d.scale = a.inputs[1].data;
        if (!state->zero_on_host) d.zero = a.inputs[2].data;
        return launch(d, a);
      },
      [state, axis](std::span<const TensorView> in,
                    std::span<const TensorView>) -> StatusOr<size_t> {
        KILN_RETURN_IF_ERROR(SplitChannels(*state, in, axis));
        return size_t{0};
      });
}

CudaOpDef QuantizeDef() {
  return {
      .op_type = "QuantizeLinear",
      .accepts =
          [](const KernelRequest& r) {
            const DataType x = InType(r, 0);
            // Blockwise scales (block_size > 0) have no CUDA kernel: the host fallback runs them.
            return (IsFloatStorage(x) || x == DataType::kInt32) && IsFloatStorage(InType(r, 1)) &&
                   QuantizedType(OutType(r, 0)) && attrs::QuantizeLinear::block_size(*r.node) == 0;
          },
      .create =
          [](const KernelRequest& r) {
            const Elem x = *ToElem(InType(r, 0)), q = *ToElem(OutType(r, 0));
            return QdqKernel(r, attrs::QuantizeLinear::axis(*r.node),
                             [x, q](const QuantDesc& d, const KernelRunArgs& a) {
                               return Launched(
                                   LaunchQuantize(x, q, d, a.inputs[0].data, a.outputs[0].data,
                                                  a.outputs[0].num_elements(), StreamOf(a)),
                                   "QuantizeLinear kernel");
                             });
          },
  };
}
KILN_CUDA_OP_PROVIDER(QuantizeLinearProvider, QuantizeDef());

CudaOpDef DequantizeDef() {
  return {
      .op_type = "DequantizeLinear",
      .accepts =
          [](const KernelRequest& r) {
            const DataType q = InType(r, 0);
            return (QuantizedType(q) || q == DataType::kInt32) && IsFloatStorage(InType(r, 1)) &&
                   IsFloatStorage(OutType(r, 0)) &&
                   attrs::DequantizeLinear::block_size(*r.node) == 0;
          },
      .create =
          [](const KernelRequest& r) {
            const Elem q = *ToElem(InType(r, 0)), y = *ToElem(OutType(r, 0));
            return QdqKernel(r, attrs::DequantizeLinear::axis(*r.node),
                             [q, y](const QuantDesc& d, const KernelRunArgs& a) {
                               return Launched(
                                   LaunchDequantize(q, y, d, a.inputs[0].data, a.outputs[0].data,
                                                    a.outputs[0].num_elements(), StreamOf(a)),
                                   "DequantizeLinear kernel");
                             });
          },
  };
}
KILN_CUDA_OP_PROVIDER(DequantizeLinearProvider, DequantizeDef());

}  // namespace
}  // namespace kiln::cuda
