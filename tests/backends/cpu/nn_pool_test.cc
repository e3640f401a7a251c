// Pools, BatchNormalization and Resize on the CPU against double-precision references.
#include <gtest/gtest.h>

#include <cmath>

#include "nn_test_util.h"

namespace kiln::testing {
namespace {

struct PoolParams {
  std::vector<int64_t> x{}, kernel{}, strides{}, dilations{}, pads{};
  std::string auto_pad = "NOTSET";
  bool ceil_mode = false, count_include_pad = false;
};

Reference PoolReference(const PoolParams& p, bool is_max) {
  return [p, is_max](const std::vector<Tensor>& in, const std::vector<int64_t>& yd) {
    size_t r = p.kernel.size();
    bool one_d = r == 1;
    int64_t planes = p.x[0] * p.x[1];
    int64_t ih = one_d ? 1 : p.x[2], iw = p.x.back(), oh = one_d ? 1 : yd[2], ow = yd.back();
    auto at = [](const std::vector<int64_t>& v, size_t i, int64_t def) {
      return v.empty() ? def : v[i];
    };
    // Begin/end padding per the ONNX spec.
    auto pads = [&](size_t i, int64_t in_size, int64_t out_size) -> std::pair<int64_t, int64_t> {
      int64_t k = p.kernel[i], s = at(p.strides, i, 1), d = at(p.dilations, i, 1);
      if (p.auto_pad == "VALID") return {0, 0};
      if (p.auto_pad == "NOTSET") return {at(p.pads, i, 0), at(p.pads, i + r, 0)};
      int64_t total = std::max<int64_t>(0, (out_size - 1) * s + (k - 1) * d + 1 - in_size);
      int64_t b = p.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      return {b, total - b};
    };
    size_t wi = r - 1;
    auto [ph, peh] = one_d ? std::pair<int64_t, int64_t>{0, 0} : pads(0, ih, oh);
    auto [pw, pew] = pads(wi, iw, ow);
    int64_t kh = one_d ? 1 : p.kernel[0], kw = p.kernel[wi];
    int64_t sh = one_d ? 1 : at(p.strides, 0, 1), sw = at(p.strides, wi, 1);
    int64_t dh = one_d ? 1 : at(p.dilations, 0, 1), dw = at(p.dilations, wi, 1);
    std::vector<double> y;
    for (int64_t pl = 0; pl < planes; ++pl)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          double best = -INFINITY, sum = 0;
          int64_t count = 0, padded = 0;
          for (int64_t ky = 0; ky < kh; ++ky)
            for (int64_t kx = 0; kx < kw; ++kx) {
              int64_t yy = oy * sh - ph + ky * dh, xx = ox * sw - pw + kx * dw;
              if (yy >= -ph && yy < ih + peh && xx >= -pw && xx < iw + pew) ++padded;
              if (yy < 0 || yy >= ih || xx < 0 || xx >= iw) continue;
              double v = in[0].GetDouble((pl * ih + yy) * iw + xx);
              best = std::max(best, v);
              sum += v;
              ++count;
            }
          y.push_back(is_max ? best
                             : sum / static_cast<double>(p.count_include_pad ? padded : count));
        }
    return y;
  };
}

std::vector<int64_t> RunPool(const PoolParams& p, bool is_max, uint32_t seed) {
  std::mt19937 rng(seed);
  OpCase c;
  c.op = is_max ? "MaxPool" : "AveragePool";
  c.attrs.Set("kernel_shape", p.kernel);
  if (!p.strides.empty()) c.attrs.Set("strides", p.strides);
  if (!p.dilations.empty()) c.attrs.Set("dilations", p.dilations);
  if (!p.pads.empty()) c.attrs.Set("pads", p.pads);
  if (p.auto_pad != "NOTSET") c.attrs.Set("auto_pad", p.auto_pad);
  c.attrs.Set("ceil_mode", int64_t{p.ceil_mode});
  if (!is_max) c.attrs.Set("count_include_pad", int64_t{p.count_include_pad});
  c.inputs = {RandomTensor(p.x, rng)};
  auto results = CheckAllTactics(c, PoolReference(p, is_max), 1e-5, 1e-5);
  EXPECT_EQ(results.size(), 1u);
  auto dims = InferOutputDims(c);
  return dims.ok() ? *dims : std::vector<int64_t>{};
}

TEST(CpuPool, MaxPoolResNetStemAndCeilMode) {
  EXPECT_EQ(RunPool({{1, 3, 15, 14}, {3, 3}, {2, 2}, {}, {1, 1, 1, 1}}, true, 1),
            (std::vector<int64_t>{1, 3, 8, 7}));
  // ceil_mode: 8 -> (8 - 3) / 2 + 1 = 3.5 -> 4 windows.
  EXPECT_EQ(RunPool({{2, 2, 8, 9}, {3, 3}, {2, 2}, {}, {}, "NOTSET", true}, true, 2),
            (std::vector<int64_t>{2, 2, 4, 4}));
  RunPool({{1, 2, 9, 10}, {2, 3}, {1, 2}, {2, 1}, {1, 0, 0, 1}}, true, 3);
  RunPool({{1, 2, 9, 10}, {3, 2}, {2, 3}, {}, {}, "SAME_LOWER"}, true, 4);
  RunPool({{1, 3, 11}, {3}, {2}, {}, {}, "SAME_UPPER"}, true, 5);
}

TEST(CpuPool, AveragePoolCountIncludePadAndCeil) {
  for (bool include : {false, true}) {
    RunPool({{1, 3, 7, 8}, {3, 3}, {2, 2}, {}, {1, 1, 1, 1}, "NOTSET", false, include}, false, 6);
    RunPool({{1, 2, 8, 8}, {3, 2}, {2, 2}, {}, {1, 0, 1, 1}, "NOTSET", true, include}, false, 7);
    RunPool({{2, 2, 9, 7}, {2, 2}, {2, 2}, {2, 1}, {}, "SAME_UPPER", false, include}, false, 8);
  }
}

// 3-D windows with explicit pads, strides and dilations: a direct reference over (d, h, w).
TEST(CpuPool, ThreeDimensionalWindows) {
  for (bool is_max : {true, false}) {
    for (bool include : {false, true}) {
      if (is_max && include) continue;
      SCOPED_TRACE(std::string(is_max ? "max" : "average") + (include ? " include pad" : ""));
      const std::vector<int64_t> x = {1, 2, 5, 6, 7}, k = {2, 3, 2}, st = {1, 2, 2},
                                 dil = {2, 1, 2}, pads = {1, 0, 1, 0, 1, 1};
      std::mt19937 rng(9);
      OpCase c;
      c.op = is_max ? "MaxPool" : "AveragePool";
      c.attrs.Set("kernel_shape", k);
      c.attrs.Set("strides", st);
      c.attrs.Set("dilations", dil);
      c.attrs.Set("pads", pads);
      if (!is_max) c.attrs.Set("count_include_pad", int64_t{include});
      c.inputs = {RandomTensor(x, rng)};
      Reference ref = [&](const std::vector<Tensor>& in, const std::vector<int64_t>& yd) {
        std::vector<double> y;
        for (int64_t pl = 0; pl < 2; ++pl)
          for (int64_t o0 = 0; o0 < yd[2]; ++o0)
            for (int64_t o1 = 0; o1 < yd[3]; ++o1)
              for (int64_t o2 = 0; o2 < yd[4]; ++o2) {
                const int64_t o[3] = {o0, o1, o2};
                double best = -INFINITY, sum = 0;
                int64_t count = 0, padded = 0;
                for (int64_t a = 0; a < k[0]; ++a)
                  for (int64_t b = 0; b < k[1]; ++b)
                    for (int64_t e = 0; e < k[2]; ++e) {
                      const int64_t kk[3] = {a, b, e};
                      int64_t pos[3];
                      bool inside = true, in_pad = true;
                      for (int i = 0; i < 3; ++i) {
                        pos[i] = o[i] * st[i] - pads[i] + kk[i] * dil[i];
                        inside &= pos[i] >= 0 && pos[i] < x[i + 2];
                        in_pad &= pos[i] >= -pads[i] && pos[i] < x[i + 2] + pads[i + 3];
                      }
                      padded += in_pad;
                      if (!inside) continue;
                      const double v =
                          in[0].GetDouble(((pl * x[2] + pos[0]) * x[3] + pos[1]) * x[4] + pos[2]);
                      best = std::max(best, v);
                      sum += v;
                      ++count;
                    }
                y.push_back(is_max ? best : sum / static_cast<double>(include ? padded : count));
              }
        return y;
      };
      EXPECT_EQ(CheckAllTactics(c, ref, 1e-5, 1e-5).size(), 1u);
      auto dims = InferOutputDims(c);
      ASSERT_TRUE(dims.ok());
      // Window extents (k - 1) * dilation + 1: 3, 3, 3. d: (5 + 1 + 0 - 3) / 1 + 1 = 4;
      // h: (6 + 0 + 1 - 3) / 2 + 1 = 3; w: (7 + 1 + 1 - 3) / 2 + 1 = 4.
      EXPECT_EQ(*dims, (std::vector<int64_t>{1, 2, 4, 3, 4}));
    }
  }
}

// LpPool: the p-norm of each window (padding adds zeros), p 2 and 3, with pads and strides.
TEST(CpuPool, LpPoolNorms) {
  for (int64_t p : {2, 3}) {
    SCOPED_TRACE(p);
    std::mt19937 rng(11);
    OpCase c;
    c.op = "LpPool";
    c.attrs.Set("kernel_shape", std::vector<int64_t>{2, 3});
    c.attrs.Set("strides", std::vector<int64_t>{2, 1});
    c.attrs.Set("pads", std::vector<int64_t>{1, 1, 0, 1});
    c.attrs.Set("p", p);
    c.inputs = {RandomTensor({1, 2, 5, 6}, rng)};
    Reference ref = [p](const std::vector<Tensor>& in, const std::vector<int64_t>& yd) {
      std::vector<double> y;
      for (int64_t pl = 0; pl < 2; ++pl)
        for (int64_t oy = 0; oy < yd[2]; ++oy)
          for (int64_t ox = 0; ox < yd[3]; ++ox) {
            double sum = 0;
            for (int64_t ky = 0; ky < 2; ++ky)
              for (int64_t kx = 0; kx < 3; ++kx) {
                const int64_t yy = oy * 2 - 1 + ky, xx = ox - 1 + kx;
                if (yy < 0 || yy >= 5 || xx < 0 || xx >= 6) continue;
                sum += std::pow(std::fabs(in[0].GetDouble((pl * 5 + yy) * 6 + xx)),
                                static_cast<double>(p));
              }
            y.push_back(std::pow(sum, 1.0 / static_cast<double>(p)));
          }
      return y;
    };
    EXPECT_EQ(CheckAllTactics(c, ref, 1e-5, 1e-5).size(), 1u);
    auto dims = InferOutputDims(c);
    ASSERT_TRUE(dims.ok());
    EXPECT_EQ(*dims, (std::vector<int64_t>{1, 2, 3, 6}));  // h (5+1-2)/2+1, w (6+1+1-3)+1
  }
}

TEST(CpuPool, OnlyMaxPoolHasAnIndicesOutput) {
  // MaxPool's Indices output is supported (nn_signal_test.cc checks its values); a second output
  // on AveragePool is a model error.
  OpCase c;
  c.op = "AveragePool";
  c.attrs.Set("kernel_shape", std::vector<int64_t>{2, 2});
  std::mt19937 rng(9);
  c.inputs = {RandomTensor({1, 1, 4, 4}, rng)};
  c.num_outputs = 2;
  auto dims = InferOutputDims(c);
  ASSERT_FALSE(dims.ok());
  EXPECT_NE(dims.status().message().find("has 2 outputs"), std::string::npos)
      << dims.status().message();
  c.op = "MaxPool";
  dims = InferOutputDims(c);
  ASSERT_TRUE(dims.ok()) << dims.status().ToString();
  EXPECT_EQ(*dims, (std::vector<int64_t>{1, 1, 3, 3}));
}

TEST(CpuPool, GlobalPools) {
  for (bool is_max : {false, true}) {
    std::mt19937 rng(10);
    OpCase c;
    c.op = is_max ? "GlobalMaxPool" : "GlobalAveragePool";
    c.inputs = {RandomTensor({2, 3, 5, 7}, rng)};
    auto ref = [is_max](const std::vector<Tensor>& in, const std::vector<int64_t>& yd) {
      EXPECT_EQ(yd, (std::vector<int64_t>{2, 3, 1, 1}));
      std::vector<double> y;
      for (int64_t p = 0; p < 6; ++p) {
        double best = -INFINITY, sum = 0;
        for (int64_t i = 0; i < 35; ++i) {
          best = std::max(best, in[0].GetDouble(p * 35 + i));
          sum += in[0].GetDouble(p * 35 + i);
        }
        y.push_back(is_max ? best : sum / 35);
      }
      return y;
    };
    EXPECT_EQ(CheckAllTactics(c, ref, 1e-5, 1e-5).size(), 1u);
  }
}

TEST(CpuBatchNorm, InferenceForm) {
  std::mt19937 rng(11);
  OpCase c;
  c.op = "BatchNormalization";
  c.attrs.Set("epsilon", 1e-3f);
  c.inputs = {RandomTensor({2, 5, 3, 4}, rng), RandomTensor({5}, rng), RandomTensor({5}, rng),
              RandomTensor({5}, rng), RandomTensor({5}, rng, 0.1f, 2.f)};
  c.constant = {false, true, true, true, true};
  auto ref = [](const std::vector<Tensor>& in, const std::vector<int64_t>&) {
    std::vector<double> y;
    for (int64_t i = 0; i < 120; ++i) {
      int64_t ch = (i / 12) % 5;
      y.push_back((in[0].GetDouble(i) - in[3].GetDouble(ch)) /
                      std::sqrt(in[4].GetDouble(ch) + 1e-3) * in[1].GetDouble(ch) +
                  in[2].GetDouble(ch));
    }
    return y;
  };
  CheckAllTactics(c, ref, 1e-5, 1e-5);
  CheckAllTactics(c, ref, 2e-2, 2e-2, DataType::kFloat16);
  CheckAllTactics(c, ref, 1e-1, 5e-2, DataType::kBFloat16);
}

// ---- Resize: a direct (non-separable) 2-D reference from the ONNX formulas ------------------

struct ResizeParams {
  std::vector<int64_t> x{};
  std::string mode = "nearest", coord = "half_pixel", nearest = "round_prefer_floor";
  std::vector<float> scales{};   // over all axes, or
  std::vector<int64_t> sizes{};  // over all axes
  bool exclude_outside = false;
  bool antialias = false;
  std::vector<float> roi{};  // tf_crop_and_resize: starts then ends over all axes
  float extrapolation = 0;
};

double SrcCoord(const std::string& c, double x, double scale, int64_t in, int64_t out) {
  if (c == "half_pixel") return (x + 0.5) / scale - 0.5;
  if (c == "pytorch_half_pixel") return out > 1 ? (x + 0.5) / scale - 0.5 : 0;
  if (c == "align_corners") {  // the spec's length_resized is in * scale, unrounded
    return in * scale <= 1 ? 0 : x * (in - 1) / (in * scale - 1);
  }
  if (c == "asymmetric") return x / scale;
  return (x + 0.5) / scale;  // tf_half_pixel_for_nn
}

// Antialiased taps: the filter (triangle for linear, Keys' cubic) stretched by 1/scale when
// downsampling, over every source pixel it reaches (edge pixels repeated past the borders),
// normalized to sum 1 (over the pixels inside with exclude_outside).
std::vector<std::pair<int64_t, double>> AntialiasTaps(const ResizeParams& p, double x, double scale,
                                                      int64_t in) {
  const double s = std::min(scale, 1.0), reach = (p.mode == "linear" ? 1.0 : 2.0) / s;
  std::vector<std::pair<int64_t, double>> taps;
  double sum = 0;
  for (auto i = static_cast<int64_t>(std::floor(x - reach)) - 1; i <= x + reach + 1; ++i) {
    const double d = std::fabs(s * (static_cast<double>(i) - x)), a = -0.75;
    double w = p.mode == "linear" ? std::max(0.0, 1 - d)
               : d <= 1           ? ((a + 2) * d - (a + 3)) * d * d + 1
               : d < 2            ? ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
                                  : 0;
    if (p.exclude_outside && (i < 0 || i >= in)) w = 0;
    sum += w;
    taps.push_back({std::min(std::max<int64_t>(i, 0), in - 1), w});
  }
  for (auto& t : taps) t.second /= sum;
  return taps;
}

// Taps (index, weight) along one axis for output coordinate o; index -1: the extrapolation value
// (tf_crop_and_resize outside the input).
std::vector<std::pair<int64_t, double>> Taps(const ResizeParams& p, int64_t o, double scale,
                                             int64_t in, int64_t out, int axis) {
  double x = SrcCoord(p.coord, o, scale, in, out);
  if (p.coord == "tf_crop_and_resize") {
    const double r0 = p.roi[axis], r1 = p.roi[4 + axis], len = in * scale;
    x = r0 * (in - 1) +
        (len == 1 ? (r1 - r0) * (in - 1) / 2 : o * (r1 - r0) * (in - 1) / (len - 1));
    if (x < 0 || x > in - 1) return {{-1, 1.0}};
  }
  if (p.antialias && p.mode != "nearest") return AntialiasTaps(p, x, scale, in);
  auto clampi = [in](int64_t v) { return std::min(std::max<int64_t>(v, 0), in - 1); };
  if (p.mode == "nearest") {
    int64_t i;
    double f = std::floor(x);
    if (p.nearest == "floor") {
      i = static_cast<int64_t>(f);
    } else if (p.nearest == "ceil") {
      i = static_cast<int64_t>(std::ceil(x));
    } else if (x - f == 0.5) {
      i = static_cast<int64_t>(p.nearest == "round_prefer_floor" ? f : f + 1);
    } else {
      i = static_cast<int64_t>(std::round(x));
    }
    return {{clampi(i), 1.0}};
  }
  if (p.mode == "linear") {
    x = std::min(std::max(x, 0.0), static_cast<double>(in - 1));
    int64_t i0 = static_cast<int64_t>(std::floor(x));
    return {{i0, 1 - (x - i0)}, {clampi(i0 + 1), x - i0}};
  }
  double a = -0.75;
  int64_t i0 = static_cast<int64_t>(std::floor(x));
  double t = x - i0;
  std::vector<std::pair<int64_t, double>> taps;
  double sum = 0;
  for (int k = -1; k <= 2; ++k) {
    double d = std::fabs(t - k);
    double w = d <= 1  ? ((a + 2) * d - (a + 3)) * d * d + 1
               : d < 2 ? ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
                       : 0;
    if (p.exclude_outside && (i0 + k < 0 || i0 + k >= in)) w = 0;
    sum += w;
    taps.push_back({clampi(i0 + k), w});
  }
  if (p.exclude_outside) {
    for (auto& tp : taps) tp.second /= sum;
  }
  return taps;
}

void RunResize(const ResizeParams& p, const std::vector<int64_t>& expect_dims, uint32_t seed) {
  std::mt19937 rng(seed);
  OpCase c;
  c.op = "Resize";
  c.attrs.Set("mode", p.mode);
  c.attrs.Set("coordinate_transformation_mode", p.coord);
  c.attrs.Set("nearest_mode", p.nearest);
  if (p.exclude_outside) c.attrs.Set("exclude_outside", int64_t{1});
  if (p.antialias) c.attrs.Set("antialias", int64_t{1});
  if (!p.roi.empty()) c.attrs.Set("extrapolation_value", p.extrapolation);
  c.inputs = {RandomTensor(p.x, rng),
              p.roi.empty() ? Tensor() : Tensor::FromVector(DataType::kFloat32, {8}, p.roi)};
  c.constant = {false, true, true, true};
  if (!p.scales.empty()) {
    c.inputs.push_back(Tensor::FromVector(DataType::kFloat32, {4}, p.scales));
  } else {
    c.inputs.push_back(Tensor());
    c.inputs.push_back(Tensor::FromVector(DataType::kInt64, {4}, p.sizes));
  }
  auto dims = InferOutputDims(c);
  ASSERT_TRUE(dims.ok()) << dims.status().ToString();
  EXPECT_EQ(*dims, expect_dims);
  auto ref = [&p](const std::vector<Tensor>& in, const std::vector<int64_t>& yd) {
    int64_t planes = p.x[0] * p.x[1], ih = p.x[2], iw = p.x[3], oh = yd[2], ow = yd[3];
    double sh = p.scales.empty() ? static_cast<double>(oh) / ih : p.scales[2];
    double sw = p.scales.empty() ? static_cast<double>(ow) / iw : p.scales[3];
    std::vector<double> y;
    for (int64_t pl = 0; pl < planes; ++pl)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          double acc = 0;
          auto ty = Taps(p, oy, sh, ih, oh, 2), tx = Taps(p, ox, sw, iw, ow, 3);
          if (ty[0].first < 0 || tx[0].first < 0) {
            y.push_back(p.extrapolation);
            continue;
          }
          for (auto [yy, wy] : ty)
            for (auto [xx, wx] : tx) acc += wy * wx * in[0].GetDouble((pl * ih + yy) * iw + xx);
          y.push_back(acc);
        }
    return y;
  };
  EXPECT_EQ(CheckAllTactics(c, ref, 1e-5, 1e-5).size(), 1u);
}

TEST(CpuResize, NearestModesAndCoordinateTransforms) {
  for (std::string nearest : {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"}) {
    for (std::string coord : {"half_pixel", "asymmetric", "align_corners", "tf_half_pixel_for_nn",
                              "pytorch_half_pixel"}) {
      RunResize({{1, 2, 4, 5}, "nearest", coord, nearest, {1, 1, 2, 1.5f}}, {1, 2, 8, 7}, 20);
      RunResize({{1, 2, 7, 5}, "nearest", coord, nearest, {}, {1, 2, 3, 9}}, {1, 2, 3, 9}, 21);
    }
  }
}

TEST(CpuResize, LinearAndCubic) {
  for (std::string coord : {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"}) {
    RunResize({{2, 3, 5, 4}, "linear", coord, "floor", {1, 1, 2, 2.5f}}, {2, 3, 10, 10}, 22);
    RunResize({{1, 2, 9, 8}, "linear", coord, "floor", {}, {1, 2, 4, 5}}, {1, 2, 4, 5}, 23);
    RunResize({{1, 2, 6, 5}, "cubic", coord, "floor", {1, 1, 2, 1.6f}}, {1, 2, 12, 8}, 24);
  }
  ResizeParams p{{1, 1, 5, 6}, "cubic", "half_pixel", "floor", {}, {1, 1, 9, 4}, true};
  RunResize(p, {1, 1, 9, 4}, 25);
}

TEST(CpuResize, Antialias) {
  for (std::string mode : {"linear", "cubic"}) {
    for (std::string coord : {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"}) {
      // Downsampling by scales and by sizes (filter over ~2 and ~5 pixels), and upsampling (the
      // plain filter).
      RunResize({{1, 2, 9, 11}, mode, coord, "floor", {1, 1, 0.6f, 0.45f}, {}, false, true},
                {1, 2, 5, 4}, 26);
      RunResize({{2, 1, 13, 7}, mode, coord, "floor", {}, {2, 1, 3, 5}, false, true}, {2, 1, 3, 5},
                27);
      RunResize({{1, 1, 4, 5}, mode, coord, "floor", {1, 1, 1.5f, 0.5f}, {}, true, true},
                {1, 1, 6, 2}, 28);
    }
  }
}

TEST(CpuResize, TfCropAndResize) {
  // Crops inside, across and past the borders; extrapolated outputs take the attribute's value.
  for (std::string mode : {"linear", "nearest", "cubic"}) {
    RunResize({{1, 2, 6, 7},
               mode,
               "tf_crop_and_resize",
               "round_prefer_floor",
               {},
               {1, 2, 4, 5},
               false,
               false,
               {0, 0, 0.2f, 0.1f, 1, 1, 0.8f, 0.7f},
               0},
              {1, 2, 4, 5}, 29);
    RunResize({{1, 1, 5, 5},
               mode,
               "tf_crop_and_resize",
               "round_prefer_floor",
               {1, 1, 1.5f, 1.6f},
               {},
               false,
               false,
               {0, 0, -0.3f, 0.4f, 1, 1, 0.9f, 1.3f},
               7.5f},
              {1, 1, 7, 8}, 30);
  }
}

}  // namespace
}  // namespace kiln::testing
