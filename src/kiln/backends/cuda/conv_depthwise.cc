// CUDA providers of kiln's own depthwise and grouped convolutions for Conv and FusedConv nodes in
// channels-last layout, f32/f16/bf16, with FusedConv's bias, residual and activation in the same
// pass. Depthwise (conv_depthwise.cu): group = C, one filter per channel (weight [C, 1, r, s], r
// and s up to 7), stride 1 or 2, no dilation. Grouped (conv_grouped.cu): groups of a multiple of
// 8 input channels and 8-64 output channels (RegNet, ResNeXt), any stride, pads and dilation, the
// group's filter in shared memory. Tactics beside cuDNN's engines; the builder times them all and
// keeps the fastest (cuDNN's engines run ConvNeXt's 7x7 depthwise and RegNet's grouped layers
// slowly).
#include <fmt/format.h>

#include <cstring>
#include <memory>

#include "kiln/backends/cuda/blas_kernels.h"
#include "kiln/backends/cuda/conv_depthwise.h"
#include "kiln/backends/cuda/cuda_common.h"
#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/backends/kernel.h"
#include "kiln/ops/fused.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/op_table.h"

namespace kiln::cuda {
namespace {

// The kernel computes the activation with activation.cuh's Activate, which takes the same list.
static_assert(static_cast<int>(BlasAct::kGeluTanh) == static_cast<int>(FusedActivation::kGeluTanh));

constexpr int64_t kMaxTaps = 7;  // per spatial axis

struct DwSpec {
  DataType dtype = DataType::kFloat32;
  std::string op_name;
  nn::WindowAttrs attrs;
  int64_t c = 0, r = 1, s = 1;
  int64_t cpg = 1;  // input channels per group (grouped); c is then the output channels
  bool has_bias = false, has_z = false;
  FusedActivationSpec act;
};

std::string_view DtypePrefix(DataType t) {
  return t == DataType::kFloat16 ? "f16" : t == DataType::kBFloat16 ? "bf16" : "f32";
}

// The parts both kernels read alike: the epilogue's operands and activation.
StatusOr<DwSpec> FinishDwSpec(const Node& node, const KernelRequest& req, DwSpec spec) {
  const bool fused = IsOp(node, OpType::kFusedConv);
  spec.op_name = fused ? "fused-conv" : "conv";
  spec.has_bias = req.inputs.size() > 2 && req.inputs[2].dtype != DataType::kUndefined;
  spec.has_z = req.inputs.size() > 3 && req.inputs[3].dtype != DataType::kUndefined;
  if (fused) {
    KILN_ASSIGN_OR_RETURN(spec.act, ParseFusedActivation(node.attrs()));
  }
  return spec;
}

// A channels-last 2-D convolution either kernel could take (grouped: conv_grouped.cu's).
StatusOr<DwSpec> ReadDwSpec(const KernelRequest& req, bool grouped = false) {
  const Node& node = *req.node;
  if (NodeLayout(node) != "NHWC") {
    return MakeError(ErrorCode::kUnimplemented, "kiln's depthwise convolution is channels-last");
  }
  if (req.inputs.size() < 2 || req.outputs.size() != 1) {
    return MakeError(ErrorCode::kInvalidModel, "node '{}': needs X, W and one output", node.name());
  }
  DwSpec spec;
  spec.dtype = req.inputs[0].dtype;
  if (spec.dtype != DataType::kFloat32 && spec.dtype != DataType::kFloat16 &&
      spec.dtype != DataType::kBFloat16) {
    return MakeError(ErrorCode::kUnimplemented, "depthwise convolution of {}",
                     ToString(spec.dtype));
  }
  for (const OperandDesc& d : req.inputs) {
    if (d.dtype != DataType::kUndefined && d.dtype != spec.dtype) {
      return MakeError(ErrorCode::kTypeMismatch, "mixed operand types");
    }
  }
  if (req.outputs[0].dtype != spec.dtype || req.inputs[0].shape.size() != 4) {
    return MakeError(ErrorCode::kUnimplemented, "2-D convolutions of one type only");
  }
  auto w = StaticDims(req.inputs[1].shape);
  if (!w || w->size() != 4 || !req.inputs[1].constant || (!grouped && (*w)[1] != 1)) {
    return MakeError(ErrorCode::kUnimplemented, "needs a constant [C, 1, r, s] weight");
  }
  spec.c = (*w)[0];
  spec.cpg = (*w)[1];
  spec.r = (*w)[2];
  spec.s = (*w)[3];
  KILN_ASSIGN_OR_RETURN(spec.attrs, nn::ReadWindowAttrs(node.attrs(), 2, {spec.r, spec.s}));
  const nn::WindowAttrs& a = spec.attrs;
  if (grouped) {
    if (a.group < 2 || spec.c % a.group != 0 ||
        !GroupedConvSupports(spec.cpg, spec.c / a.group, spec.r * spec.s)) {
      return MakeError(ErrorCode::kUnimplemented,
                       "not a grouped convolution of 8k input and 8-64 output channels per group");
    }
    return FinishDwSpec(node, req, std::move(spec));
  }
  if (a.group != spec.c || spec.r > kMaxTaps || spec.s > kMaxTaps) {
    return MakeError(ErrorCode::kUnimplemented, "not a depthwise convolution of up to 7x7 taps");
  }
  for (size_t i = 0; i < 2; ++i) {
    if (a.dilations[i] != 1 || (a.strides[i] != 1 && a.strides[i] != 2)) {
      return MakeError(ErrorCode::kUnimplemented, "stride 1 or 2 without dilation only");
    }
  }
  return FinishDwSpec(node, req, std::move(spec));
}

struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};

// ONNX's [C, 1, r, s] filter as [r * s, C] on the device (the taps' channels contiguous).
StatusOr<std::unique_ptr<void, DeviceFree>> UploadTaps(const Tensor& w) {
  const auto& d = w.dims();
  const int64_t c = d[0], taps = d[2] * d[3];
  const size_t es = SizeOf(w.dtype());
  std::vector<std::byte> host(static_cast<size_t>(c * taps) * es);
  const auto* src = static_cast<const std::byte*>(w.raw());
  for (int64_t ic = 0; ic < c; ++ic) {
    for (int64_t t = 0; t < taps; ++t) {
      std::memcpy(host.data() + (t * c + ic) * es, src + (ic * taps + t) * es, es);
    }
  }
  void* dev = nullptr;
  KILN_CUDA_RETURN_IF_ERROR(cudaMalloc(&dev, host.size()));
  std::unique_ptr<void, DeviceFree> owned(dev);
  KILN_CUDA_RETURN_IF_ERROR(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice));
  return owned;
}

// Output dims and begin pads of a channels-last convolution, checked against the attributes.
Status ResolveWindow(const DwSpec& spec, std::span<const int64_t> x, std::span<const int64_t> y,
                     int64_t pads[2]) {
  for (size_t i = 0; i < 2; ++i) {
    const int64_t in_size = x[1 + i], out_size = y[1 + i];
    if (nn::WindowOutDim<int64_t>(in_size, spec.attrs, i) != out_size) {
      return MakeError(ErrorCode::kShapeMismatch, "conv output dims do not match attributes");
    }
    pads[i] = nn::WindowPadBegin(in_size, out_size, spec.attrs, i);
    if (pads[i] < 0) return MakeError(ErrorCode::kUnimplemented, "negative begin padding");
  }
  return OkStatus();
}

class DepthwiseConvKernel final : public Kernel {
 public:
  DepthwiseConvKernel(DwSpec spec, std::unique_ptr<void, DeviceFree> taps, DepthwiseVariant variant)
      : spec_(std::move(spec)), taps_(std::move(taps)) {
    args_.variant = variant;
  }

  StatusOr<size_t> Prepare(std::span<const TensorView> in,
                           std::span<const TensorView> out) override {
    const auto& x = in[0].dims;
    const auto& y = out[0].dims;
    if (x.size() != 4 || y.size() != 4 || x[3] != spec_.c || y[3] != spec_.c || y[0] != x[0]) {
      return MakeError(ErrorCode::kShapeMismatch,
                       "depthwise convolution operands do not agree with the weight");
    }
    args_.n = x[0];
    args_.h = x[1];
    args_.w_in = x[2];
    args_.c = x[3];
    args_.oh = y[1];
    args_.ow = y[2];
    int64_t pads[2];
    KILN_RETURN_IF_ERROR(ResolveWindow(spec_, x, y, pads));
    args_.pad_h = static_cast<int>(pads[0]);
    args_.pad_w = static_cast<int>(pads[1]);
    return size_t{0};
  }

  Status Run(const KernelRunArgs& a) override {
    DepthwiseConvArgs args = args_;
    args.dtype = *ToElem(spec_.dtype);
    args.x = a.inputs[0].data;
    args.w = taps_.get();
    args.bias = spec_.has_bias && Present(a, 2) ? a.inputs[2].data : nullptr;
    args.z = spec_.has_z && Present(a, 3) ? a.inputs[3].data : nullptr;
    args.y = a.outputs[0].data;
    args.r = static_cast<int>(spec_.r);
    args.s = static_cast<int>(spec_.s);
    args.stride_h = static_cast<int>(spec_.attrs.strides[0]);
    args.stride_w = static_cast<int>(spec_.attrs.strides[1]);
    args.act = static_cast<int>(spec_.act.kind);
    args.act_min = spec_.act.min;
    args.act_max = spec_.act.max;
    return Launched(LaunchDepthwiseConv(args, StreamOf(a)), "depthwise convolution kernel");
  }

 private:
  DwSpec spec_;
  std::unique_ptr<void, DeviceFree> taps_;
  DepthwiseConvArgs args_;
};

// ONNX's [K, cpg, r, s] filter (K = group * kpg, any float type) as FP32
// [group][r * s][cpg][kpg] on the device: a group's filter contiguous, output channels innermost.
StatusOr<std::unique_ptr<void, DeviceFree>> UploadGroupedFilter(const Tensor& w, int64_t group) {
  const auto& d = w.dims();
  const int64_t k = d[0], cpg = d[1], taps = d[2] * d[3], kpg = k / group;
  const std::vector<float> src = w.ToFloatVector();
  std::vector<float> host(src.size());
  for (int64_t g = 0; g < group; ++g) {
    for (int64_t co = 0; co < kpg; ++co) {
      for (int64_t ci = 0; ci < cpg; ++ci) {
        for (int64_t t = 0; t < taps; ++t) {
          host[((g * taps + t) * cpg + ci) * kpg + co] =
              src[((g * kpg + co) * cpg + ci) * taps + t];
        }
      }
    }
  }
  void* dev = nullptr;
  KILN_CUDA_RETURN_IF_ERROR(cudaMalloc(&dev, host.size() * sizeof(float)));
  std::unique_ptr<void, DeviceFree> owned(dev);
  KILN_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(dev, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  return owned;
}

class GroupedConvKernel final : public Kernel {
 public:
  GroupedConvKernel(DwSpec spec, std::unique_ptr<void, DeviceFree> filter)
      : spec_(std::move(spec)), filter_(std::move(filter)) {}

  StatusOr<size_t> Prepare(std::span<const TensorView> in,
                           std::span<const TensorView> out) override {
    const auto& x = in[0].dims;
    const auto& y = out[0].dims;
    const int64_t group = spec_.attrs.group;
    if (x.size() != 4 || y.size() != 4 || x[3] != group * spec_.cpg || y[3] != spec_.c ||
        y[0] != x[0]) {
      return MakeError(ErrorCode::kShapeMismatch,
                       "grouped convolution operands do not agree with the weight");
    }
    int64_t pads[2];
    KILN_RETURN_IF_ERROR(ResolveWindow(spec_, x, y, pads));
    args_ = GroupedConvArgs{};
    args_.dtype = *ToElem(spec_.dtype);
    args_.n = x[0];
    args_.h = x[1];
    args_.w_in = x[2];
    args_.oh = y[1];
    args_.ow = y[2];
    args_.group = static_cast<int>(group);
    args_.cpg = static_cast<int>(spec_.cpg);
    args_.kpg = static_cast<int>(spec_.c / group);
    args_.r = static_cast<int>(spec_.r);
    args_.s = static_cast<int>(spec_.s);
    args_.stride_h = static_cast<int>(spec_.attrs.strides[0]);
    args_.stride_w = static_cast<int>(spec_.attrs.strides[1]);
    args_.dil_h = static_cast<int>(spec_.attrs.dilations[0]);
    args_.dil_w = static_cast<int>(spec_.attrs.dilations[1]);
    args_.pad_h = static_cast<int>(pads[0]);
    args_.pad_w = static_cast<int>(pads[1]);
    args_.act = static_cast<int>(spec_.act.kind);
    args_.act_min = spec_.act.min;
    args_.act_max = spec_.act.max;
    return size_t{0};
  }

  Status Run(const KernelRunArgs& a) override {
    GroupedConvArgs args = args_;
    args.x = a.inputs[0].data;
    args.w = static_cast<const float*>(filter_.get());
    args.bias = spec_.has_bias && Present(a, 2) ? a.inputs[2].data : nullptr;
    args.z = spec_.has_z && Present(a, 3) ? a.inputs[3].data : nullptr;
    args.y = a.outputs[0].data;
    return Launched(LaunchGroupedConv(args, StreamOf(a)), "grouped convolution kernel");
  }

 private:
  DwSpec spec_;
  std::unique_ptr<void, DeviceFree> filter_;
  GroupedConvArgs args_;
};

class GroupedConvProvider : public KernelProvider {
 public:
  BackendKind backend() const final { return BackendKind::kCuda; }
  bool SupportsLayout(std::string_view layout) const final { return layout == "NHWC"; }

  std::vector<TacticConfig> Tactics(const KernelRequest& request) const final {
    auto spec = ReadDwSpec(request, /*grouped=*/true);
    if (!spec.ok()) return {};
    return {{fmt::format("{}-{}-nhwc-grouped-kiln-{}x{}-s{}-g{}x{}", DtypePrefix(spec->dtype),
                         spec->op_name, spec->r, spec->s, spec->attrs.strides[0], spec->cpg,
                         spec->c / spec->attrs.group),
             {},
             0}};
  }

  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& request,
                                           const TacticConfig&) const final {
    KILN_ASSIGN_OR_RETURN(DwSpec spec, ReadDwSpec(request, /*grouped=*/true));
    KILN_ASSIGN_OR_RETURN(auto filter,
                          UploadGroupedFilter(*request.inputs[1].constant, spec.attrs.group));
    return std::unique_ptr<Kernel>(
        std::make_unique<GroupedConvKernel>(std::move(spec), std::move(filter)));
  }
};

class KilnGroupedConv final : public GroupedConvProvider {
 public:
  std::string_view id() const override { return "cuda.conv.grouped"; }
  std::string_view op_type() const override { return "Conv"; }
};
KILN_REGISTER_KERNEL_PROVIDER(KilnGroupedConv);

class KilnGroupedFusedConv final : public GroupedConvProvider {
 public:
  std::string_view id() const override { return "cuda.fused_conv.grouped"; }
  std::string_view op_type() const override { return "FusedConv"; }
};
KILN_REGISTER_KERNEL_PROVIDER(KilnGroupedFusedConv);

// Whether the shared-memory tile kernel takes this depthwise convolution.
bool SmemSupports(const DwSpec& spec) {
  return DepthwiseSmemSupports(*ToElem(spec.dtype), spec.c, static_cast<int>(spec.r),
                               static_cast<int>(spec.s), static_cast<int>(spec.attrs.strides[0]),
                               static_cast<int>(spec.attrs.strides[1]));
}

class DepthwiseConvProvider : public KernelProvider {
 public:
  BackendKind backend() const final { return BackendKind::kCuda; }
  bool SupportsLayout(std::string_view layout) const final { return layout == "NHWC"; }

  std::vector<TacticConfig> Tactics(const KernelRequest& request) const final {
    auto spec = ReadDwSpec(request);
    if (!spec.ok()) return {};
    std::vector<TacticConfig> tactics{
        {fmt::format("{}-{}-nhwc-depthwise-kiln-{}x{}-s{}", DtypePrefix(spec->dtype), spec->op_name,
                     spec->r, spec->s, spec->attrs.strides[0]),
         {static_cast<int64_t>(DepthwiseVariant::kRegisterTile)},
         0}};
    if (SmemSupports(*spec)) {
      tactics.push_back(
          {fmt::format("{}-{}-nhwc-depthwise-kiln-smem-{}x{}-s{}", DtypePrefix(spec->dtype),
                       spec->op_name, spec->r, spec->s, spec->attrs.strides[0]),
           {static_cast<int64_t>(DepthwiseVariant::kSharedTile)},
           0});
    }
    return tactics;
  }

  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& request,
                                           const TacticConfig& tactic) const final {
    KILN_ASSIGN_OR_RETURN(DwSpec spec, ReadDwSpec(request));
    // A tactic without params (an engine or timing cache from before the variants) is the
    // register-tiled kernel.
    const auto variant =
        !tactic.params.empty() &&
                tactic.params[0] == static_cast<int64_t>(DepthwiseVariant::kSharedTile)
            ? DepthwiseVariant::kSharedTile
            : DepthwiseVariant::kRegisterTile;
    if (variant == DepthwiseVariant::kSharedTile && !SmemSupports(spec)) {
      return MakeError(ErrorCode::kUnimplemented,
                       "the shared-memory depthwise kernel does not take this convolution");
    }
    KILN_ASSIGN_OR_RETURN(auto taps, UploadTaps(*request.inputs[1].constant));
    return std::unique_ptr<Kernel>(
        std::make_unique<DepthwiseConvKernel>(std::move(spec), std::move(taps), variant));
  }
};

class KilnDepthwiseConv final : public DepthwiseConvProvider {
 public:
  std::string_view id() const override { return "cuda.conv.depthwise"; }
  std::string_view op_type() const override { return "Conv"; }
};
KILN_REGISTER_KERNEL_PROVIDER(KilnDepthwiseConv);

class KilnDepthwiseFusedConv final : public DepthwiseConvProvider {
 public:
  std::string_view id() const override { return "cuda.fused_conv.depthwise"; }
  std::string_view op_type() const override { return "FusedConv"; }
};
KILN_REGISTER_KERNEL_PROVIDER(KilnDepthwiseFusedConv);

}  // namespace
}  // namespace kiln::cuda
