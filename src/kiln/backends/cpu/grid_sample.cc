// GridSample on the CPU: X [N, C, D1..Dr] sampled at the normalized positions of grid
// [N, O1..Or, r] (nearest, linear or cubic; zeros, border or reflection padding; align_corners),
// as torch.nn.functional.grid_sample and ONNX's reference define it. Per output position the
// taps (source offset, weight) are found once and applied to every channel.
#include <cmath>

#include "kiln/backends/cpu/op_util.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

enum class Mode { kNearest, kLinear, kCubic };
enum class Padding { kZeros, kBorder, kReflection };

// At most this many taps per output position (4^3: cubic over a volume).
constexpr int kMaxTaps = 64;
constexpr int kMaxSpatial = 8;

struct GridSpec {
  Mode mode = Mode::kLinear;
  Padding padding = Padding::kZeros;
  bool align_corners = false;
};

// Reflects x into [lo, hi] by its nearer border, as many times as it takes.
double Reflect(double x, double lo, double hi) {
  const double range = hi - lo;
  if (range <= 0) return lo;
  if (x < lo) {
    const double dx = lo - x;
    const auto n = static_cast<int64_t>(dx / range);
    const double r = dx - static_cast<double>(n) * range;
    return n % 2 == 0 ? lo + r : hi - r;
  }
  if (x > hi) {
    const double dx = x - hi;
    const auto n = static_cast<int64_t>(dx / range);
    const double r = dx - static_cast<double>(n) * range;
    return n % 2 == 0 ? hi - r : lo + r;
  }
  return x;
}

// One spatial axis: its length and the sampled coordinate's border ([-0.5, len - 0.5], or
// [0, len - 1] with align_corners).
struct Axis {
  int64_t len = 0;
  double lo = 0, hi = 0;
};

// The source index of tap i along an axis after padding; -1 for a zero (padding zeros).
int64_t PadIndex(const GridSpec& s, const Axis& a, int64_t i) {
  if (i >= 0 && i < a.len) return i;
  switch (s.padding) {
    case Padding::kZeros:
      return -1;
    case Padding::kBorder:
      return std::clamp<int64_t>(i, 0, a.len - 1);
    case Padding::kReflection:
      return std::clamp<int64_t>(static_cast<int64_t>(Reflect(static_cast<double>(i), a.lo, a.hi)),
                                 0, a.len - 1);
  }
  return -1;
}

// Keys' cubic coefficients (a = -0.75) for the 4 taps around a point t in [0, 1) past the
// second one.
void CubicCoeffs(float t, float* c) {
  constexpr float a = -0.75f;
  const float x0 = t + 1, x1 = t, x2 = 1 - t, x3 = 2 - t;
  c[0] = ((a * x0 - 5 * a) * x0 + 8 * a) * x0 - 4 * a;
  c[1] = ((a + 2) * x1 - (a + 3)) * x1 * x1 + 1;
  c[2] = ((a + 2) * x2 - (a + 3)) * x2 * x2 + 1;
  c[3] = ((a * x3 - 5 * a) * x3 + 8 * a) * x3 - 4 * a;
}

// Per-axis taps of one sampled coordinate `n` (normalized to [-1, 1]): up to 4 (index, weight).
int AxisTaps(const GridSpec& s, const Axis& a, float n, int64_t* idx, float* w) {
  // In f32 as the reference computes it.
  const float len = static_cast<float>(a.len);
  float x = s.align_corners ? (n + 1) / 2.f * (len - 1) : ((n + 1) * len - 1) / 2.f;
  if (s.mode == Mode::kNearest) x = std::nearbyint(x);  // ties to even, as torch
  if (x < a.lo || x > a.hi) {
    if (s.padding == Padding::kBorder) {
      x = std::clamp(x, 0.f, len - 1);
    } else if (s.padding == Padding::kReflection) {
      x = static_cast<float>(Reflect(x, a.lo, a.hi));
    }
  }
  if (s.mode == Mode::kNearest) {
    idx[0] = PadIndex(s, a, static_cast<int64_t>(x));
    w[0] = 1.f;
    return 1;
  }
  const float x0 = std::floor(x);
  const auto i0 = static_cast<int64_t>(x0);
  const float t = x - x0;
  if (s.mode == Mode::kLinear) {
    idx[0] = PadIndex(s, a, i0);
    idx[1] = PadIndex(s, a, i0 + 1);
    w[0] = 1 - t;
    w[1] = t;
    return 2;
  }
  CubicCoeffs(t, w);
  for (int k = 0; k < 4; ++k) idx[k] = PadIndex(s, a, i0 - 1 + k);
  return 4;
}

int TapsPerAxis(Mode m) { return m == Mode::kNearest ? 1 : m == Mode::kLinear ? 2 : 4; }

Status RunGridSample(const GridSpec& s, const KernelRunArgs& args) {
  const TensorView& xv = args.inputs[0];
  const TensorView& gv = args.inputs[1];
  const TensorView& yv = args.outputs[0];
  const int64_t rank = static_cast<int64_t>(xv.dims.size());
  const int64_t r = rank - 2;
  const int64_t batch = xv.dims[0], channels = xv.dims[1];
  int64_t plane = 1, points = 1;
  Axis axes[kMaxSpatial];
  int64_t strides[kMaxSpatial];
  for (int64_t d = r - 1; d >= 0; --d) {
    Axis& a = axes[d];
    a.len = xv.dims[2 + d];
    a.lo = s.align_corners ? 0.0 : -0.5;
    a.hi = s.align_corners ? static_cast<double>(a.len - 1) : static_cast<double>(a.len) - 0.5;
    strides[d] = plane;
    plane *= a.len;
    points *= yv.dims[2 + d];
  }
  const float* x = xv.as<const float>();
  const float* grid = gv.as<const float>();
  float* y = yv.as<float>();
  if (plane == 0) {  // nothing to sample: every position is padding
    std::fill(y, y + yv.num_elements(), 0.f);
    return OkStatus();
  }
  const int per_axis = TapsPerAxis(s.mode);
  int combos = 1;
  for (int64_t d = 0; d < r; ++d) combos *= per_axis;
  ParallelRows(batch * points, channels * combos, [&](int64_t begin, int64_t end) {
    int64_t idx[kMaxSpatial][4];
    float w[kMaxSpatial][4];
    int64_t offs[kMaxTaps];
    float weights[kMaxTaps];
    for (int64_t row = begin; row < end; ++row) {
      const int64_t n = row / points, p = row % points;
      const float* g = grid + row * r;  // grid[n, o1..or, :], components in x, y, z order
      for (int64_t d = 0; d < r; ++d) AxisTaps(s, axes[d], g[r - 1 - d], idx[d], w[d]);
      // Every combination of the per-axis taps; taps on a zero pixel are dropped.
      int taps = 0;
      for (int c = 0; c < combos; ++c) {
        int rest = c;
        int64_t off = 0;
        float wt = 1.f;
        bool zero = false;
        for (int64_t d = r - 1; d >= 0; --d) {
          const int k = rest % per_axis;
          rest /= per_axis;
          zero |= idx[d][k] < 0;
          off += idx[d][k] * strides[d];
          wt *= w[d][k];
        }
        if (zero) continue;
        offs[taps] = off;
        weights[taps] = wt;
        ++taps;
      }
      const float* xn = x + n * channels * plane;
      float* yn = y + n * channels * points + p;
      for (int64_t c = 0; c < channels; ++c) {
        const float* xc = xn + c * plane;
        float acc = 0.f;
        for (int t = 0; t < taps; ++t) acc += weights[t] * xc[offs[t]];
        yn[c * points] = acc;
      }
    }
  });
  return OkStatus();
}

StatusOr<GridSpec> ReadGridSpec(const KernelRequest& r) {
  const AttributeMap& at = r.node->attrs();
  GridSpec s;
  const std::string mode = attrs::GridSample::mode(at);
  const std::string padding = attrs::GridSample::padding_mode(at);
  s.mode = mode == "nearest" ? Mode::kNearest : mode == "cubic" ? Mode::kCubic : Mode::kLinear;
  s.padding = padding == "border"       ? Padding::kBorder
              : padding == "reflection" ? Padding::kReflection
                                        : Padding::kZeros;
  s.align_corners = attrs::GridSample::align_corners(at) != 0;
  const int64_t spatial = static_cast<int64_t>(r.inputs[0].shape.size()) - 2;
  int64_t taps = 1;
  for (int64_t d = 0; d < spatial && taps <= kMaxTaps; ++d) taps *= TapsPerAxis(s.mode);
  if (spatial < 1 || spatial > kMaxSpatial || taps > kMaxTaps) {
    return MakeError(ErrorCode::kUnimplemented,
                     "node '{}' (GridSample): {} mode over {} spatial axes needs {} taps per "
                     "output; the CPU kernel takes at most {} (cubic up to 3 axes, linear up to 6)",
                     r.node->name(), mode, spatial, taps, kMaxTaps);
  }
  return s;
}

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "GridSample",
      .accepts =
          [](const KernelRequest& r) {
            return InType(r, 0) == DataType::kFloat32 && InType(r, 1) == DataType::kFloat32 &&
                   OutType(r, 0) == DataType::kFloat32;
          },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        KILN_ASSIGN_OR_RETURN(GridSpec spec, ReadGridSpec(r));
        return KernelOr([spec](const KernelRunArgs& a) { return RunGridSample(spec, a); });
      },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
