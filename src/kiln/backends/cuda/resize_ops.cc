// CUDA provider of Resize, nearest, linear and cubic modes (kernel in resize.cu; antialias stays on
// the CPU). Scales come from a constant `scales` input when given, else from the output and
// input sizes, as the CPU reference does; the output shape itself is known from shape inference.
#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/ops/op_table.h"

namespace kiln::cuda {
namespace {

struct ResizeSpec {
  int32_t mode = 0, coord = 0, nearest = 0;
  float cubic_a = -0.75f;
  bool exclude_outside = false;
  std::vector<int64_t> axes;
  std::vector<float> scales;
};

// Coordinate modes in the order resize.cu's SourceCoord numbers them.
constexpr const char* kCoordModes[] = {"half_pixel",         "half_pixel_symmetric",
                                       "pytorch_half_pixel", "align_corners",
                                       "asymmetric",         "tf_half_pixel_for_nn"};
constexpr const char* kNearestModes[] = {"round_prefer_floor", "round_prefer_ceil", "floor",
                                         "ceil"};

std::optional<ResizeSpec> ReadSpec(const KernelRequest& r) {
  const AttributeMap& at = r.node->attrs();
  ResizeSpec s;
  std::string mode = attrs::Resize::mode(at);
  if (mode != "nearest" && mode != "linear" && mode != "cubic") return std::nullopt;
  if (attrs::Resize::antialias(at) != 0) return std::nullopt;
  s.mode = mode == "linear" ? 1 : (mode == "cubic" ? 2 : 0);
  s.cubic_a = attrs::Resize::cubic_coeff_a(at);
  s.exclude_outside = attrs::Resize::exclude_outside(at) != 0;
  std::string c = attrs::Resize::coordinate_transformation_mode(at);
  s.coord = -1;
  for (int i = 0; i < 6; ++i) {
    if (c == kCoordModes[i]) s.coord = i;
  }
  if (s.coord < 0) return std::nullopt;
  std::string n = attrs::Resize::nearest_mode(at);
  for (int i = 0; i < 4; ++i) {
    if (n == kNearestModes[i]) s.nearest = i;
  }
  int64_t rank = static_cast<int64_t>(r.inputs[0].shape.size());
  s.axes = attrs::Resize::axes(at);
  if (s.axes.empty()) {
    for (int64_t i = 0; i < rank; ++i) s.axes.push_back(i);
  }
  for (auto& a : s.axes) a = a < 0 ? a + rank : a;
  if (r.inputs.size() > 2 && r.inputs[2].dtype != DataType::kUndefined) {
    if (r.inputs[2].constant) {
      if (r.inputs[2].constant->num_elements() > 0) {
        s.scales = r.inputs[2].constant->ToFloatVector();
      }
    } else if (!(r.inputs[2].shape.size() == 1 && r.inputs[2].shape[0].is_static() &&
                 r.inputs[2].shape[0].value() == 0)) {
      return std::nullopt;  // run-time scales would need a host read
    }
  }
  return s;
}

class ResizeKernel final : public Kernel {
 public:
  ResizeKernel(ResizeSpec spec, Elem t) : spec_(std::move(spec)), t_(t) {}
  StatusOr<size_t> Prepare(std::span<const TensorView> in,
                           std::span<const TensorView> out) override {
    const auto& x = in[0].dims;
    const auto& y = out[0].dims;
    if (x.size() != y.size() || x.size() > static_cast<size_t>(kMaxRank)) {
      return MakeError(ErrorCode::kShapeMismatch, "Resize of rank {} to rank {}", x.size(),
                       y.size());
    }
    d_ = ResizeDesc{};
    d_.rank = static_cast<int32_t>(x.size());
    d_.mode = spec_.mode;
    d_.coord = spec_.coord;
    d_.nearest = spec_.nearest;
    d_.cubic_a = spec_.cubic_a;
    d_.exclude_outside = spec_.exclude_outside ? 1 : 0;
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i] < 1 && y[i] > 0)
        return MakeError(ErrorCode::kShapeMismatch, "Resize of an empty axis");
      d_.in[i] = x[i];
      d_.out[i] = y[i];
      d_.scale[i] = static_cast<double>(y[i]) / static_cast<double>(std::max<int64_t>(x[i], 1));
    }
    for (size_t i = 0; i < spec_.scales.size() && i < spec_.axes.size(); ++i) {
      if (spec_.axes[i] >= 0 && spec_.axes[i] < d_.rank) d_.scale[spec_.axes[i]] = spec_.scales[i];
    }
    // The kernel blends 4^k corners for k cubic axes: bound it (images resample 2 axes).
    int resampled = 0;
    for (int i = 0; i < d_.rank; ++i) resampled += !(d_.in[i] == d_.out[i] && d_.scale[i] == 1.0);
    if (spec_.mode == 2 && resampled > 3) {
      return MakeError(ErrorCode::kUnimplemented,
                       "cubic Resize of {} axes on CUDA (at most 3; the CPU backend runs it)",
                       resampled);
    }
    return size_t{0};
  }
  Status Run(const KernelRunArgs& a) override {
    return Launched(LaunchResize(t_, d_, a.inputs[0].data, a.outputs[0].data,
                                 a.outputs[0].num_elements(), StreamOf(a)),
                    "Resize kernel");
  }

 private:
  ResizeSpec spec_;
  Elem t_;
  ResizeDesc d_;
};

CudaOpDef ResizeDef() {
  return {
      .op_type = "Resize",
      .variant = "direct",
      .accepts =
          [](const KernelRequest& r) {
            return IsFloatStorage(InType(r, 0)) && OutType(r, 0) == InType(r, 0) &&
                   ReadSpec(r).has_value();
          },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        return std::unique_ptr<Kernel>(
            std::make_unique<ResizeKernel>(*ReadSpec(r), *ToElem(InType(r, 0))));
      },
  };
}
KILN_CUDA_OP_PROVIDER(ResizeProvider, ResizeDef());

}  // namespace
}  // namespace kiln::cuda
