// CUDA providers of MaxPool, AveragePool (1-D and 2-D windows) and GlobalAveragePool /
// GlobalMaxPool (kernels in pool.cu). The string attribute kiln_layout="NHWC", set by the
// builder's layout pass, means 4-D activations are N,H,W,C; window geometry is fixed in Prepare.
#include <algorithm>
#include <array>
#include <span>

#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/op_table.h"

namespace kiln::cuda {
namespace {

bool Nhwc(const Node& node) { return node.attrs().GetString("kiln_layout", "NCHW") == "NHWC"; }

class PoolKernel final : public Kernel {
 public:
  PoolKernel(nn::WindowAttrs attrs, bool is_max, bool count_include_pad, bool nhwc, Elem t)
      : attrs_(std::move(attrs)), t_(t) {
    d_.is_max = is_max;
    d_.count_include_pad = count_include_pad;
    d_.nhwc = nhwc;
  }
  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    const auto& x = inputs[0].dims;
    const auto& y = outputs[0].dims;
    size_t r = attrs_.kernel.size();
    if (x.size() != r + 2 || y.size() != r + 2 || (r != 1 && r != 2) || (d_.nhwc && r != 2)) {
      return MakeError(ErrorCode::kShapeMismatch, "pool operand ranks do not match the kernel");
    }
    // Logical NCHW dims of x and y whatever the memory layout.
    auto logical = [&](std::span<const int64_t> v) {
      std::vector<int64_t> l(v.begin(), v.end());
      if (d_.nhwc) l = {v[0], v[3], v[1], v[2]};
      return l;
    };
    std::vector<int64_t> lx = logical(x), ly = logical(y);
    d_.n = lx[0];
    d_.c = lx[1];
    if (ly[1] != d_.c || ly[0] != d_.n) {
      return MakeError(ErrorCode::kShapeMismatch, "pool output batch/channels differ from input");
    }
    auto axis = [&](size_t i, int64_t& in, int64_t& out, int32_t& k, int32_t& s, int32_t& dl,
                    int32_t& pb, int32_t& pe) -> Status {
      in = lx[i + 2];
      out = nn::WindowOutDim<int64_t>(in, attrs_, i);
      if (out != ly[i + 2]) {
        return MakeError(ErrorCode::kShapeMismatch, "pool output dim {} is {}; expected {}", i,
                         ly[i + 2], out);
      }
      k = static_cast<int32_t>(attrs_.kernel[i]);
      s = static_cast<int32_t>(attrs_.strides[i]);
      dl = static_cast<int32_t>(attrs_.dilations[i]);
      int64_t begin = nn::WindowPadBegin(in, out, attrs_, i);
      // End padding as the attributes give it (SAME: the rest of the total padding).
      int64_t end = attrs_.auto_pad == nn::AutoPad::kNotSet
                        ? attrs_.pads[i + r]
                        : std::max<int64_t>(0, (out - 1) * s + dl * (k - 1) + 1 - in - begin);
      if (attrs_.auto_pad == nn::AutoPad::kValid) end = 0;
      pb = static_cast<int32_t>(begin);
      pe = static_cast<int32_t>(end);
      return OkStatus();
    };
    if (r == 2) KILN_RETURN_IF_ERROR(axis(0, d_.ih, d_.oh, d_.kh, d_.sh, d_.dh, d_.ph, d_.peh));
    KILN_RETURN_IF_ERROR(axis(r - 1, d_.iw, d_.ow, d_.kw, d_.sw, d_.dw, d_.pw, d_.pew));
    return size_t{0};
  }
  Status Run(const KernelRunArgs& a) override {
    return Launched(LaunchPool(t_, d_, a.inputs[0].data, a.outputs[0].data, StreamOf(a)),
                    "pool kernel");
  }

 private:
  nn::WindowAttrs attrs_;
  Elem t_;
  PoolDesc d_;
};

CudaOpDef PoolDef(const char* op, bool is_max) {
  return {
      .op_type = op,
      .variant = "direct",
      .channels_last = true,
      .accepts =
          [](const KernelRequest& r) {
            size_t rank = r.inputs.empty() ? 0 : r.inputs[0].shape.size();
            if (r.outputs.size() != 1 || !IsFloatStorage(InType(r, 0))) return false;
            if (Nhwc(*r.node)) return rank == 4;
            return rank == 3 || rank == 4;
          },
      .create = [is_max](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        size_t rank = r.inputs[0].shape.size();
        auto attrs = nn::ReadWindowAttrs(r.node->attrs(), rank - 2, {});
        if (!attrs.ok()) {
          return MakeError(attrs.status().code(), "node '{}': {}", r.node->name(),
                           attrs.status().message());
        }
        return std::unique_ptr<Kernel>(std::make_unique<PoolKernel>(
            std::move(*attrs), is_max, attrs::AveragePool::count_include_pad(*r.node) != 0,
            Nhwc(*r.node), *ToElem(InType(r, 0))));
      },
  };
}
KILN_CUDA_OP_PROVIDER(MaxPoolProvider, PoolDef("MaxPool", true));
KILN_CUDA_OP_PROVIDER(AveragePoolProvider, PoolDef("AveragePool", false));

// Global pools: NCHW any spatial rank; NHWC 4-D.
CudaOpDef GlobalPoolDef(const char* op, bool is_max) {
  return {
      .op_type = op,
      .channels_last = true,
      .accepts =
          [](const KernelRequest& r) {
            size_t rank = r.inputs.empty() ? 0 : r.inputs[0].shape.size();
            if (!IsFloatStorage(InType(r, 0)) || rank < 2) return false;
            return !Nhwc(*r.node) || rank == 4;
          },
      .create =
          [is_max](const KernelRequest& r) {
            bool nhwc = Nhwc(*r.node);
            Elem t = *ToElem(InType(r, 0));
            // planes = N*C, channels = C, size = the spatial elements per plane.
            auto geometry = [nhwc](const TensorView& x) {
              const int64_t channels = nhwc ? x.dims.back() : x.dims[1];
              const int64_t planes = x.dims[0] * channels;
              const int64_t size = planes == 0 ? 0 : x.num_elements() / planes;
              return std::array<int64_t, 3>{planes, channels, size};
            };
            return MakeFnKernel(
                [is_max, nhwc, t, geometry](const KernelRunArgs& a) {
                  const auto [planes, channels, size] = geometry(a.inputs[0]);
                  return Launched(
                      LaunchGlobalPool(t, is_max, nhwc, a.inputs[0].data, a.outputs[0].data, planes,
                                       channels, size, a.workspace, a.workspace_bytes, StreamOf(a)),
                      "global pool kernel");
                },
                [nhwc, geometry](std::span<const TensorView> in,
                                 std::span<const TensorView>) -> StatusOr<size_t> {
                  if (!nhwc) return size_t{0};
                  const auto [planes, channels, size] = geometry(in[0]);
                  return channels == 0 ? size_t{0}
                                       : GlobalPoolNhwcWorkspace(planes / channels, channels, size);
                });
          },
  };
}
KILN_CUDA_OP_PROVIDER(GlobalAveragePoolProvider, GlobalPoolDef("GlobalAveragePool", false));
KILN_CUDA_OP_PROVIDER(GlobalMaxPoolProvider, GlobalPoolDef("GlobalMaxPool", true));

}  // namespace
}  // namespace kiln::cuda
