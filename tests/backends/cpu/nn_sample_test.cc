// GridSample, Col2Im and CenterCropPad on the CPU against direct double-precision references
// written from the ONNX spec (per output element, not the kernels' per-axis tap tables).
#include <gtest/gtest.h>

#include <cmath>

#include "nn_test_util.h"

namespace kiln::testing {
namespace {

// ---- GridSample -----------------------------------------------------------------------------

struct GridParams {
  std::vector<int64_t> x{};     // N, C, D1..Dr
  std::vector<int64_t> out{};   // O1..Or
  std::string mode = "linear";  // linear, nearest, cubic (opset 20 names)
  std::string padding = "zeros";
  bool align_corners = false;
  float grid_range = 1.2f;  // grid values in [-range, range): some fall outside the image
};

// Reflects x into [lo, hi] (a mirror at each border, repeated).
double ReflectInto(double x, double lo, double hi) {
  const double span = hi - lo;
  if (span <= 0) return lo;
  double d = std::fmod(std::fabs(x - lo), 2 * span);
  return lo + (d <= span ? d : 2 * span - d);
}

Reference GridReference(const GridParams& p) {
  return [p](const std::vector<Tensor>& in, const std::vector<int64_t>& yd) {
    const size_t r = p.x.size() - 2;
    const int64_t n_batch = p.x[0], channels = p.x[1];
    int64_t plane = 1, points = 1;
    for (size_t d = 0; d < r; ++d) {
      plane *= p.x[2 + d];
      points *= yd[2 + d];
    }
    // The pixel at integer coordinates `idx` (spatial order D1..Dr) after padding; 0 outside
    // with zeros padding.
    auto pixel = [&](int64_t n, int64_t c, const std::vector<int64_t>& idx) -> double {
      int64_t off = 0;
      for (size_t d = 0; d < r; ++d) {
        const int64_t len = p.x[2 + d];
        int64_t i = idx[d];
        if (i < 0 || i >= len) {
          if (p.padding == "zeros") return 0;
          if (p.padding == "border") i = std::clamp<int64_t>(i, 0, len - 1);
          if (p.padding == "reflection") {
            const double lo = p.align_corners ? 0 : -0.5;
            const double hi = p.align_corners ? len - 1 : len - 0.5;
            i = std::clamp<int64_t>(static_cast<int64_t>(ReflectInto(i, lo, hi)), 0, len - 1);
          }
        }
        off = off * len + i;
      }
      return in[0].GetDouble((n * channels + c) * plane + off);
    };
    auto cubic = [](double t) {  // Keys, a = -0.75, |t| < 2
      const double a = -0.75;
      t = std::fabs(t);
      return t <= 1  ? ((a + 2) * t - (a + 3)) * t * t + 1
             : t < 2 ? ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
                     : 0;
    };
    std::vector<double> y(static_cast<size_t>(n_batch * channels * points));
    for (int64_t n = 0; n < n_batch; ++n) {
      for (int64_t pt = 0; pt < points; ++pt) {
        // Source coordinate per spatial axis: grid's last axis lists them W first.
        std::vector<double> src(r);
        for (size_t d = 0; d < r; ++d) {
          const double g =
              in[1].GetDouble((n * points + pt) * static_cast<int64_t>(r) + (r - 1 - d));
          const double len = static_cast<double>(p.x[2 + d]);
          double v = p.align_corners ? (g + 1) / 2 * (len - 1) : ((g + 1) * len - 1) / 2;
          if (p.mode == "nearest") v = std::nearbyint(v);
          const double lo = p.align_corners ? 0 : -0.5, hi = p.align_corners ? len - 1 : len - 0.5;
          if (v < lo || v > hi) {
            if (p.padding == "border") v = std::clamp(v, 0.0, len - 1);
            if (p.padding == "reflection") v = ReflectInto(v, lo, hi);
          }
          src[d] = v;
        }
        for (int64_t c = 0; c < channels; ++c) {
          double acc = 0;
          const int taps = p.mode == "nearest" ? 1 : p.mode == "linear" ? 2 : 4;
          int64_t combos = 1;
          for (size_t d = 0; d < r; ++d) combos *= taps;
          for (int64_t k = 0; k < combos; ++k) {
            std::vector<int64_t> idx(r);
            double w = 1;
            for (size_t d = 0, rest = static_cast<size_t>(k); d < r; ++d, rest /= taps) {
              const int64_t j = static_cast<int64_t>(rest % taps);
              if (p.mode == "nearest") {
                idx[d] = static_cast<int64_t>(src[d]);
              } else {
                const double f = std::floor(src[d]);
                idx[d] = static_cast<int64_t>(f) + (p.mode == "linear" ? j : j - 1);
                w *= p.mode == "linear" ? 1 - std::fabs(src[d] - static_cast<double>(idx[d]))
                                        : cubic(src[d] - static_cast<double>(idx[d]));
              }
            }
            acc += w * pixel(n, c, idx);
          }
          y[static_cast<size_t>((n * channels + c) * points + pt)] = acc;
        }
      }
    }
    return y;
  };
}

void RunGridSample(const GridParams& p, uint32_t seed) {
  std::mt19937 rng(seed);
  OpCase c;
  c.op = "GridSample";
  c.attrs.Set("mode", p.mode);
  c.attrs.Set("padding_mode", p.padding);
  c.attrs.Set("align_corners", int64_t{p.align_corners ? 1 : 0});
  std::vector<int64_t> grid = {p.x[0]};
  grid.insert(grid.end(), p.out.begin(), p.out.end());
  grid.push_back(static_cast<int64_t>(p.out.size()));
  c.inputs = {RandomTensor(p.x, rng), RandomTensor(grid, rng, -p.grid_range, p.grid_range)};
  c.constant = {false, false};
  auto dims = InferOutputDims(c);
  ASSERT_TRUE(dims.ok()) << dims.status().ToString();
  std::vector<int64_t> want = {p.x[0], p.x[1]};
  want.insert(want.end(), p.out.begin(), p.out.end());
  EXPECT_EQ(*dims, want);
  SCOPED_TRACE(p.mode + " " + p.padding + (p.align_corners ? " align_corners" : ""));
  EXPECT_EQ(CheckAllTactics(c, GridReference(p), 1e-4, 1e-4).size(), 1u);
  CheckAllTactics(c, GridReference(p), 3e-2, 3e-2, DataType::kFloat16);
}

TEST(CpuGridSample, EveryModePaddingAndAlignment2D) {
  uint32_t seed = 40;
  for (std::string mode : {"linear", "nearest", "cubic"}) {
    for (std::string padding : {"zeros", "border", "reflection"}) {
      for (bool align : {false, true}) {
        RunGridSample({{2, 3, 5, 7}, {4, 6}, mode, padding, align}, ++seed);
        // Far outside: reflection folds several times.
        RunGridSample({{1, 2, 3, 4}, {5, 3}, mode, padding, align, 3.5f}, ++seed);
      }
    }
  }
}

TEST(CpuGridSample, VolumesAndOneAxis) {
  uint32_t seed = 80;
  for (std::string mode : {"linear", "nearest", "cubic"}) {
    for (std::string padding : {"zeros", "border", "reflection"}) {
      RunGridSample({{1, 2, 3, 4, 5}, {2, 3, 4}, mode, padding, false}, ++seed);
      RunGridSample({{2, 2, 6}, {9}, mode, padding, true}, ++seed);
    }
  }
}

// ---- Col2Im -----------------------------------------------------------------------------------

struct Col2ImParams {
  std::vector<int64_t> image{}, block{};
  std::vector<int64_t> dilations{}, pads{}, strides{};
  int64_t n = 1, c = 1;
};

void RunCol2Im(const Col2ImParams& p, uint32_t seed) {
  const size_t r = p.image.size();
  auto at = [](const std::vector<int64_t>& v, size_t i, int64_t def) {
    return v.empty() ? def : v[i];
  };
  std::vector<int64_t> count(r);
  int64_t per_channel = 1, positions = 1;
  for (size_t i = 0; i < r; ++i) {
    const int64_t span = p.image[i] + at(p.pads, i, 0) + at(p.pads, i + r, 0) -
                         at(p.dilations, i, 1) * (p.block[i] - 1) - 1;
    count[i] = span / at(p.strides, i, 1) + 1;
    per_channel *= p.block[i];
    positions *= count[i];
  }
  std::mt19937 rng(seed);
  OpCase c;
  c.op = "Col2Im";
  if (!p.dilations.empty()) c.attrs.Set("dilations", p.dilations);
  if (!p.pads.empty()) c.attrs.Set("pads", p.pads);
  if (!p.strides.empty()) c.attrs.Set("strides", p.strides);
  c.inputs = {RandomTensor({p.n, p.c * per_channel, positions}, rng),
              Tensor::FromVector(DataType::kInt64, {static_cast<int64_t>(r)}, p.image),
              Tensor::FromVector(DataType::kInt64, {static_cast<int64_t>(r)}, p.block)};
  c.constant = {false, true, true};
  auto dims = InferOutputDims(c);
  ASSERT_TRUE(dims.ok()) << dims.status().ToString();
  std::vector<int64_t> want = {p.n, p.c};
  want.insert(want.end(), p.image.begin(), p.image.end());
  EXPECT_EQ(*dims, want);
  // Gather form: each image pixel sums the (block offset, position) pairs that land on it.
  auto ref = [&](const std::vector<Tensor>& in, const std::vector<int64_t>&) {
    int64_t pixels = 1;
    for (int64_t d : p.image) pixels *= d;
    std::vector<double> y;
    for (int64_t plane = 0; plane < p.n * p.c; ++plane) {
      for (int64_t px = 0; px < pixels; ++px) {
        std::vector<int64_t> pos(r);
        for (size_t i = r, rest = static_cast<size_t>(px); i-- > 0;) {
          pos[i] = static_cast<int64_t>(rest % p.image[i]);
          rest /= p.image[i];
        }
        double acc = 0;
        for (int64_t b = 0; b < per_channel; ++b) {
          int64_t l = 0;
          bool hit = true;
          for (size_t i = 0, rest = static_cast<size_t>(b), div = per_channel; i < r; ++i) {
            div /= p.block[i];
            const int64_t k = static_cast<int64_t>(rest / div);
            rest %= div;
            const int64_t t = pos[i] + at(p.pads, i, 0) - k * at(p.dilations, i, 1);
            const int64_t s = at(p.strides, i, 1);
            hit = hit && t >= 0 && t % s == 0 && t / s < count[i];
            l = l * count[i] + (hit ? t / s : 0);
          }
          if (hit) acc += in[0].GetDouble((plane * per_channel + b) * positions + l);
        }
        y.push_back(acc);
      }
    }
    return y;
  };
  EXPECT_EQ(CheckAllTactics(c, ref, 1e-5, 1e-5).size(), 1u);
}

TEST(CpuCol2Im, BlocksDilationsPadsStrides) {
  RunCol2Im({{5, 5}, {1, 5}}, 90);
  RunCol2Im({{6, 7}, {2, 3}, {}, {}, {}, 2, 3}, 91);
  RunCol2Im({{6, 6}, {2, 2}, {1, 5}}, 92);
  RunCol2Im({{5, 5}, {3, 2}, {}, {1, 0, 2, 1}, {}, 1, 2}, 93);
  RunCol2Im({{7, 8}, {3, 2}, {2, 1}, {1, 1, 0, 2}, {2, 3}, 2, 1}, 94);
  RunCol2Im({{3, 4, 5}, {2, 2, 3}, {}, {}, {1, 2, 1}, 1, 2}, 95);
}

// ---- CenterCropPad ----------------------------------------------------------------------------

TEST(CpuCenterCropPad, CropsAndPadsAboutTheCentre) {
  struct Case {
    std::vector<int64_t> x, shape, axes;
  };
  for (const Case& k : std::vector<Case>{{{6, 5, 3}, {3, 8, 3}, {}},
                                         {{7, 4, 2}, {4, 7}, {0, 1}},
                                         {{2, 9, 6}, {5, 1}, {-2, -1}},
                                         {{3, 4}, {3, 4}, {}}}) {
    std::mt19937 rng(100);
    OpCase c;
    c.op = "CenterCropPad";
    if (!k.axes.empty()) c.attrs.Set("axes", k.axes);
    c.inputs = {
        RandomTensor(k.x, rng),
        Tensor::FromVector(DataType::kInt64, {static_cast<int64_t>(k.shape.size())}, k.shape)};
    c.constant = {false, true};
    std::vector<int64_t> want = k.x;
    const auto rank = static_cast<int64_t>(k.x.size());
    std::vector<int64_t> axes = k.axes;
    if (axes.empty()) {
      for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
    }
    for (int64_t& a : axes) a = a < 0 ? a + rank : a;
    for (size_t i = 0; i < axes.size(); ++i) want[axes[i]] = k.shape[i];
    auto dims = InferOutputDims(c);
    ASSERT_TRUE(dims.ok()) << dims.status().ToString();
    EXPECT_EQ(*dims, want);
    // Output coordinate o on an axis shows input coordinate o + floor((in - out) / 2) when
    // cropping, o - floor((out - in) / 2) when padding (zero where that is outside).
    auto ref = [&](const std::vector<Tensor>& in, const std::vector<int64_t>& yd) {
      int64_t total = 1;
      for (int64_t d : yd) total *= d;
      std::vector<double> y;
      for (int64_t e = 0; e < total; ++e) {
        int64_t off = 0;
        bool inside = true;
        for (int64_t a = 0, rest = e, div = total; a < rank; ++a) {
          div /= yd[a];
          const int64_t o = rest / div;
          rest %= div;
          const int64_t xin = k.x[a], yout = yd[a];
          const int64_t i = xin >= yout ? o + (xin - yout) / 2 : o - (yout - xin) / 2;
          inside = inside && i >= 0 && i < xin;
          off = off * xin + (inside ? i : 0);
        }
        y.push_back(inside ? in[0].GetDouble(off) : 0.0);
      }
      return y;
    };
    EXPECT_EQ(CheckAllTactics(c, ref, 0, 0).size(), 1u);
  }
}

}  // namespace
}  // namespace kiln::testing
