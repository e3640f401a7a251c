// Resize on the CPU: nearest, linear (bi/tri-linear) and cubic, any rank, with antialias and
// tf_crop_and_resize. Every mode is separable, so the kernel resamples one axis at a time with
// per-axis tap tables (source index and weight per output coordinate) built in Prepare; Run only
// reads them. Intermediate results between passes live in the workspace.
#include <algorithm>
#include <array>
#include <cmath>

#include "kiln/backends/cpu/cpu_kernel.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

enum class Mode { kNearest, kLinear, kCubic };
enum class Coord {
  kHalfPixel,
  kHalfPixelSymmetric,
  kPytorchHalfPixel,
  kAlignCorners,
  kAsymmetric,
  kTfHalfPixelForNn,
  kTfCropAndResize
};
enum class Nearest { kRoundPreferFloor, kRoundPreferCeil, kFloor, kCeil };

struct ResizeSpec {
  Mode mode = Mode::kNearest;
  Coord coord = Coord::kHalfPixel;
  Nearest nearest = Nearest::kRoundPreferFloor;
  float cubic_a = -0.75f;
  bool exclude_outside = false;
  // Downsampling widens the linear/cubic filter by 1/scale (a low-pass filter, as PIL does).
  bool antialias = false;
  float extrapolation_value = 0.f;  // tf_crop_and_resize outside the input
  std::vector<int64_t> axes;
  std::vector<float> scales;  // per listed axis; empty when sizes are given
  std::vector<double> roi;    // tf_crop_and_resize: per listed axis, starts then ends
};

size_t Align64(size_t n) { return (n + 63) / 64 * 64; }

// Source coordinate of output coordinate x along an axis (ONNX coordinate_transformation_mode);
// `roi` is the axis' [start, end] for tf_crop_and_resize.
double SourceCoord(Coord c, double x, double scale, int64_t in, int64_t out, const double roi[2]) {
  switch (c) {
    case Coord::kTfCropAndResize: {
      // As ONNX: the crop's length over the unrounded resized length (in * scale).
      const double len = scale * static_cast<double>(in), span = roi[1] - roi[0];
      const double last = static_cast<double>(in - 1);
      return roi[0] * last + (len == 1 ? span * last / 2 : x * span * last / (len - 1));
    }
    case Coord::kHalfPixel:
      return (x + 0.5) / scale - 0.5;
    case Coord::kHalfPixelSymmetric: {
      double adjustment = static_cast<double>(out) / (scale * static_cast<double>(in));
      double center = static_cast<double>(in) / 2;
      return center * (1 - adjustment) + (x + 0.5) / scale - 0.5;
    }
    case Coord::kPytorchHalfPixel:
      return out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
    case Coord::kAlignCorners: {
      // ONNX uses the unrounded resized length (in * scale), not the output size.
      double len = scale * static_cast<double>(in);
      return len <= 1 ? 0.0 : x * static_cast<double>(in - 1) / (len - 1);
    }
    case Coord::kAsymmetric:
      return x / scale;
    case Coord::kTfHalfPixelForNn:
      return (x + 0.5) / scale;
  }
  return 0;
}

int64_t NearestIndex(Nearest n, double x) {
  switch (n) {
    case Nearest::kRoundPreferFloor:
      return x == std::floor(x) + 0.5 ? static_cast<int64_t>(std::floor(x))
                                      : static_cast<int64_t>(std::round(x));
    case Nearest::kRoundPreferCeil:
      return x == std::floor(x) + 0.5 ? static_cast<int64_t>(std::ceil(x))
                                      : static_cast<int64_t>(std::round(x));
    case Nearest::kFloor:
      return static_cast<int64_t>(std::floor(x));
    case Nearest::kCeil:
      return static_cast<int64_t>(std::ceil(x));
  }
  return 0;
}

struct AxisPass {
  int64_t axis = 0, in = 0, out = 0, taps = 1;
  std::vector<int64_t> index;        // out * taps
  std::vector<float> weight;         // out * taps
  std::vector<uint8_t> extrapolate;  // per output coordinate (tf_crop_and_resize); may be empty
};

// Keys' cubic convolution kernel at distance d, coefficient a.
double CubicCoeff(double a, double d) {
  d = std::fabs(d);
  if (d <= 1) return ((a + 2) * d - (a + 3)) * d * d + 1;
  if (d < 2) return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
  return 0.0;
}

// Taps of the antialiasing filter: the linear (triangle) or cubic kernel stretched by 1/scale
// when downsampling, over the `taps` source pixels nearest x (the window ONNX's reference takes:
// it starts `first` pixels from the last pixel at or left of x, ties to the left), normalized
// to sum 1.
int64_t AntialiasTaps(Mode mode, double scale, int64_t* first) {
  const double s = std::min(scale, 1.0);
  *first = static_cast<int64_t>(std::floor((mode == Mode::kLinear ? -1 : -2) / s)) + 1;
  return 2 - 2 * *first;
}

void AntialiasWeights(const ResizeSpec& s, double x, double scale, int64_t in, int64_t first,
                      int64_t taps, int64_t* idx, float* w) {
  const double sc = std::min(scale, 1.0);
  const int64_t left = static_cast<int64_t>(std::ceil(x)) - 1;  // ratio x - left is in (0, 1]
  std::vector<double> ws(static_cast<size_t>(taps));
  double sum = 0;
  for (int64_t k = 0; k < taps; ++k) {
    const int64_t src = left + first + k;
    const double d = sc * (static_cast<double>(src) - x);
    ws[k] =
        s.mode == Mode::kLinear ? std::clamp(1 - std::fabs(d), 0.0, 1.0) : CubicCoeff(s.cubic_a, d);
    sum += ws[k];
    idx[k] = std::clamp<int64_t>(src, 0, in - 1);
  }
  if (sum != 0) {
    for (double& v : ws) v /= sum;
  }
  if (s.exclude_outside) {
    double kept = 0;
    for (int64_t k = 0; k < taps; ++k) {
      const int64_t src = left + first + k;
      if (src < 0 || src >= in) ws[k] = 0;
      kept += ws[k];
    }
    if (kept != 0) {
      for (double& v : ws) v /= kept;
    }
  }
  for (int64_t k = 0; k < taps; ++k) w[k] = static_cast<float>(ws[k]);
}

AxisPass BuildPass(const ResizeSpec& s, int64_t axis, int64_t in, int64_t out, double scale,
                   const double roi[2]) {
  AxisPass p;
  p.axis = axis;
  p.in = in;
  p.out = out;
  const bool antialias = s.antialias && s.mode != Mode::kNearest;
  int64_t first = 0;
  p.taps = antialias                  ? AntialiasTaps(s.mode, scale, &first)
           : s.mode == Mode::kNearest ? 1
           : s.mode == Mode::kLinear  ? 2
                                      : 4;
  p.index.resize(out * p.taps);
  p.weight.resize(out * p.taps);
  if (s.coord == Coord::kTfCropAndResize) p.extrapolate.assign(out, 0);
  for (int64_t o = 0; o < out; ++o) {
    double x = SourceCoord(s.coord, static_cast<double>(o), scale, in, out, roi);
    int64_t* idx = &p.index[o * p.taps];
    float* w = &p.weight[o * p.taps];
    if (s.coord == Coord::kTfCropAndResize && (x < 0 || x > static_cast<double>(in - 1))) {
      p.extrapolate[o] = 1;
      std::fill(idx, idx + p.taps, 0);
      std::fill(w, w + p.taps, 0.f);
      continue;
    }
    if (antialias) {
      AntialiasWeights(s, x, scale, in, first, p.taps, idx, w);
    } else if (s.mode == Mode::kNearest) {
      idx[0] = std::clamp<int64_t>(NearestIndex(s.nearest, x), 0, in - 1);
      w[0] = 1.f;
    } else if (s.mode == Mode::kLinear) {
      x = std::clamp(x, 0.0, static_cast<double>(in - 1));
      int64_t x0 = static_cast<int64_t>(std::floor(x));
      int64_t x1 = std::min(x0 + 1, in - 1);
      double t = x - static_cast<double>(x0);
      idx[0] = x0;
      idx[1] = x1;
      w[0] = static_cast<float>(1 - t);
      w[1] = static_cast<float>(t);
    } else {
      int64_t x0 = static_cast<int64_t>(std::floor(x));
      double t = x - static_cast<double>(x0);
      double sum = 0;
      double ws[4];
      for (int k = 0; k < 4; ++k) {
        int64_t src = x0 - 1 + k;
        ws[k] = CubicCoeff(s.cubic_a, t + 1 - k);
        if (s.exclude_outside && (src < 0 || src >= in)) ws[k] = 0;
        sum += ws[k];
        idx[k] = std::clamp<int64_t>(src, 0, in - 1);
      }
      for (int k = 0; k < 4; ++k) {
        w[k] = static_cast<float>(s.exclude_outside && sum != 0 ? ws[k] / sum : ws[k]);
      }
    }
  }
  return p;
}

class ResizeKernel final : public Kernel {
 public:
  explicit ResizeKernel(ResizeSpec spec) : spec_(std::move(spec)) {}

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    const auto& x = inputs[0].dims;
    const auto& y = outputs[0].dims;
    if (x.size() != y.size()) return MakeError(ErrorCode::kShapeMismatch, "Resize changes rank");
    passes_.clear();
    std::vector<double> scale(x.size(), 1.0);
    for (size_t i = 0; i < x.size(); ++i) {
      scale[i] = static_cast<double>(y[i]) / static_cast<double>(std::max<int64_t>(x[i], 1));
    }
    for (size_t i = 0; i < spec_.scales.size() && i < spec_.axes.size(); ++i) {
      scale[spec_.axes[i]] = spec_.scales[i];
    }
    // tf_crop_and_resize's crop per axis (the whole axis where not listed).
    std::vector<std::array<double, 2>> roi(x.size(), {0.0, 1.0});
    const size_t listed = spec_.axes.size();
    for (size_t i = 0; i < listed && 2 * listed == spec_.roi.size(); ++i) {
      roi[spec_.axes[i]] = {spec_.roi[i], spec_.roi[listed + i]};
    }
    std::vector<int64_t> cur(x.begin(), x.end());
    max_intermediate_ = 0;
    for (size_t d = 0; d < x.size(); ++d) {
      const bool whole = roi[d][0] == 0.0 && roi[d][1] == 1.0;
      if (x[d] == y[d] && scale[d] == 1.0 && (whole || spec_.coord != Coord::kTfCropAndResize)) {
        continue;
      }
      if (x[d] < 1) return MakeError(ErrorCode::kShapeMismatch, "Resize of an empty axis");
      passes_.push_back(
          BuildPass(spec_, static_cast<int64_t>(d), x[d], y[d], scale[d], roi[d].data()));
      cur[d] = y[d];
      max_intermediate_ = std::max(max_intermediate_, NumElements(cur));
    }
    return passes_.size() > 1 ? 2 * Align64(static_cast<size_t>(max_intermediate_) * 4) : 0;
  }

  Status Run(const KernelRunArgs& args) override {
    const float* src = args.inputs[0].as<const float>();
    float* out = args.outputs[0].as<float>();
    const auto& x = args.inputs[0].dims;
    if (passes_.empty()) {
      std::copy(src, src + args.inputs[0].num_elements(), out);
      return OkStatus();
    }
    auto* ws = static_cast<std::byte*>(args.workspace);
    float* buf[2] = {reinterpret_cast<float*>(ws),
                     reinterpret_cast<float*>(ws + Align64(max_intermediate_ * 4))};
    int64_t dims[8];
    std::vector<int64_t>::size_type rank = x.size();
    if (rank > 8) return MakeError(ErrorCode::kUnimplemented, "Resize of rank > 8");
    std::copy(x.begin(), x.end(), dims);
    for (size_t p = 0; p < passes_.size(); ++p) {
      const AxisPass& pass = passes_[p];
      float* dst = p + 1 == passes_.size() ? out : buf[p % 2];
      int64_t outer = 1, inner = 1;
      for (int64_t d = 0; d < pass.axis; ++d) outer *= dims[d];
      for (size_t d = pass.axis + 1; d < rank; ++d) inner *= dims[d];
      const float* s = src;
      const float extrapolation = spec_.extrapolation_value;
      ThreadPool::Default().ParallelFor(outer * pass.out, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          int64_t o = r / pass.out, j = r % pass.out;
          float* d = dst + r * inner;
          const int64_t* idx = &pass.index[j * pass.taps];
          const float* w = &pass.weight[j * pass.taps];
          const float* base = s + o * pass.in * inner;
          const float* row0 = base + idx[0] * inner;
          if (!pass.extrapolate.empty() && pass.extrapolate[j]) {
            std::fill(d, d + inner, extrapolation);
            continue;
          }
          if (pass.taps == 1) {
            std::copy(row0, row0 + inner, d);
            continue;
          }
          for (int64_t i = 0; i < inner; ++i) d[i] = w[0] * row0[i];
          for (int64_t t = 1; t < pass.taps; ++t) {
            const float* row = base + idx[t] * inner;
            for (int64_t i = 0; i < inner; ++i) d[i] += w[t] * row[i];
          }
        }
      });
      dims[pass.axis] = pass.out;
      src = dst;
    }
    return OkStatus();
  }

 private:
  ResizeSpec spec_;
  std::vector<AxisPass> passes_;
  int64_t max_intermediate_ = 0;
};

StatusOr<ResizeSpec> ReadResizeSpec(const KernelRequest& request) {
  const AttributeMap& at = request.node->attrs();
  ResizeSpec s;
  std::string mode = attrs::Resize::mode(at);
  s.mode = mode == "linear" ? Mode::kLinear : mode == "cubic" ? Mode::kCubic : Mode::kNearest;
  std::string c = attrs::Resize::coordinate_transformation_mode(at);
  if (c == "half_pixel") {
    s.coord = Coord::kHalfPixel;
  } else if (c == "half_pixel_symmetric") {
    s.coord = Coord::kHalfPixelSymmetric;
  } else if (c == "pytorch_half_pixel") {
    s.coord = Coord::kPytorchHalfPixel;
  } else if (c == "align_corners") {
    s.coord = Coord::kAlignCorners;
  } else if (c == "asymmetric") {
    s.coord = Coord::kAsymmetric;
  } else if (c == "tf_half_pixel_for_nn") {
    s.coord = Coord::kTfHalfPixelForNn;
  } else if (c == "tf_crop_and_resize") {
    s.coord = Coord::kTfCropAndResize;
  } else {
    return MakeError(ErrorCode::kUnimplemented,
                     "node '{}': coordinate_transformation_mode '{}' is not supported",
                     request.node->name(), c);
  }
  std::string n = attrs::Resize::nearest_mode(at);
  s.nearest = n == "round_prefer_ceil" ? Nearest::kRoundPreferCeil
              : n == "floor"           ? Nearest::kFloor
              : n == "ceil"            ? Nearest::kCeil
                                       : Nearest::kRoundPreferFloor;
  s.cubic_a = attrs::Resize::cubic_coeff_a(at);
  s.exclude_outside = attrs::Resize::exclude_outside(at) != 0;
  int64_t rank = static_cast<int64_t>(request.inputs[0].shape.size());
  s.axes = attrs::Resize::axes(at);
  if (s.axes.empty()) {
    for (int64_t i = 0; i < rank; ++i) s.axes.push_back(i);
  }
  for (auto& a : s.axes) a = a < 0 ? a + rank : a;
  if (request.inputs.size() > 2 && request.inputs[2].constant &&
      request.inputs[2].constant->num_elements() > 0) {
    s.scales = request.inputs[2].constant->ToFloatVector();
  }
  s.antialias = attrs::Resize::antialias(at) != 0;
  s.extrapolation_value = attrs::Resize::extrapolation_value(at);
  if (s.coord == Coord::kTfCropAndResize) {
    // The crop decides every tap: it must be known when the kernel is made (a constant, or a
    // shape input's values, which re-make the kernel when they change).
    const Tensor* roi = request.inputs.size() > 1 ? request.inputs[1].constant : nullptr;
    if (!roi || roi->num_elements() != 2 * static_cast<int64_t>(s.axes.size())) {
      return MakeError(ErrorCode::kUnimplemented,
                       "node '{}': tf_crop_and_resize needs roi as a constant or a shape input "
                       "of {} values",
                       request.node->name(), 2 * s.axes.size());
    }
    for (int64_t i = 0; i < roi->num_elements(); ++i) s.roi.push_back(roi->GetDouble(i));
  }
  return s;
}

class ResizeProvider final : public CpuFloatProvider {
 public:
  std::string_view id() const override { return "cpu.resize"; }
  std::string_view op_type() const override { return "Resize"; }

 protected:
  bool AcceptsTypes(const KernelRequest& r) const override {
    // roi/scales are float, sizes int64; only X and Y carry the data type.
    return r.inputs[0].dtype == DataType::kFloat32 && r.outputs[0].dtype == DataType::kFloat32;
  }
  std::vector<TacticConfig> F32Tactics(const KernelRequest& request) const override {
    if (!ReadResizeSpec(request).ok()) return {};
    // Workspace at the max shape: two intermediates of at most the larger of X and Y per pass.
    auto x = StaticDims(request.inputs[0].shape);
    auto y = StaticDims(request.outputs[0].shape);
    std::vector<int64_t> xm =
        request.inputs[0].max_dims.empty() && x ? *x : request.inputs[0].max_dims;
    std::vector<int64_t> ym =
        request.outputs[0].max_dims.empty() && y ? *y : request.outputs[0].max_dims;
    size_t ws = 0;
    if (xm.size() == ym.size() && !xm.empty()) {
      std::vector<int64_t> big(xm.size());
      for (size_t i = 0; i < xm.size(); ++i) big[i] = std::max(xm[i], ym[i]);
      ws = 2 * Align64(static_cast<size_t>(NumElements(big)) * 4);
    }
    return {{"f32-resize-cpu-separable", {}, ws}};
  }
  StatusOr<std::unique_ptr<Kernel>> CreateF32(const KernelRequest& request,
                                              const TacticConfig&) const override {
    KILN_ASSIGN_OR_RETURN(ResizeSpec spec, ReadResizeSpec(request));
    return std::unique_ptr<Kernel>(std::make_unique<ResizeKernel>(std::move(spec)));
  }
};
KILN_REGISTER_KERNEL_PROVIDER(ResizeProvider);

}  // namespace
}  // namespace kiln::cpu
