// Conv, FusedConv and ConvTranspose on the CPU: every tactic against a naive double-precision
// reference, over odd sizes, groups, depthwise, strides, dilations, padding and auto_pad.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "nn_test_util.h"

namespace kiln::testing {
namespace {

struct ConvParams {
  std::vector<int64_t> x{}, w{};  // NCHW / MCkk, or NCW / MCk for 1-D
  std::vector<int64_t> strides{}, dilations{}, pads{};
  std::string auto_pad = "NOTSET";
  int64_t group = 1;
  bool bias = true;
};

AttributeMap ConvAttrs(const ConvParams& p) {
  AttributeMap a;
  size_t r = p.x.size() - 2;
  if (!p.strides.empty()) a.Set("strides", p.strides);
  if (!p.dilations.empty()) a.Set("dilations", p.dilations);
  if (!p.pads.empty()) a.Set("pads", p.pads);
  if (p.auto_pad != "NOTSET") a.Set("auto_pad", p.auto_pad);
  a.Set("group", p.group);
  a.Set("kernel_shape", std::vector<int64_t>(p.w.begin() + 2, p.w.end()));
  (void)r;
  return a;
}

// Begin padding computed from the ONNX spec, independently of the kernels.
int64_t PadBegin(const ConvParams& p, size_t i, int64_t in, int64_t out) {
  size_t r = p.x.size() - 2;
  int64_t k = p.w[i + 2], s = p.strides.empty() ? 1 : p.strides[i];
  int64_t d = p.dilations.empty() ? 1 : p.dilations[i];
  if (p.auto_pad == "VALID") return 0;
  if (p.auto_pad == "NOTSET") return p.pads.empty() ? 0 : p.pads[i];
  int64_t total = std::max<int64_t>(0, (out - 1) * s + (k - 1) * d + 1 - in);
  (void)r;
  return p.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
}

double Activate(const std::string& act, double v) {
  if (act == "relu") return std::max(v, 0.0);
  if (act == "relu6") return std::min(std::max(v, 0.0), 6.0);
  if (act == "clip") return std::min(std::max(v, -0.5), 0.75);
  if (act == "sigmoid") return 1 / (1 + std::exp(-v));
  if (act == "hardswish") return v * std::min(std::max(v / 6 + 0.5, 0.0), 1.0);
  if (act == "silu") return v / (1 + std::exp(-v));
  if (act == "swish") return v / (1 + std::exp(-1.702 * v));  // activation_alpha 1.702 below
  if (act == "gelu") return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
  if (act == "gelu_tanh") {
    return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
  }
  return v;
}

Reference ConvReference(const ConvParams& p, const std::string& act = "none") {
  return [p, act](const std::vector<Tensor>& in, const std::vector<int64_t>& yd) {
    bool one_d = p.x.size() == 3;
    const Tensor& x = in[0];
    const Tensor& w = in[1];
    int64_t n = p.x[0], c = p.x[1], m = p.w[0], cg = p.w[1], g = p.group, mg = m / g;
    int64_t ih = one_d ? 1 : p.x[2], iw = p.x.back();
    int64_t oh = one_d ? 1 : yd[2], ow = yd.back();
    int64_t kh = one_d ? 1 : p.w[2], kw = p.w.back();
    size_t wi = one_d ? 0 : 1;
    int64_t sh = one_d || p.strides.empty() ? 1 : p.strides[0];
    int64_t sw = p.strides.empty() ? 1 : p.strides[wi];
    int64_t dh = one_d || p.dilations.empty() ? 1 : p.dilations[0];
    int64_t dw = p.dilations.empty() ? 1 : p.dilations[wi];
    int64_t ph = one_d ? 0 : PadBegin(p, 0, ih, oh), pw = PadBegin(p, wi, iw, ow);
    std::vector<double> y(static_cast<size_t>(n * m * oh * ow));
    for (int64_t b = 0; b < n; ++b)
      for (int64_t oc = 0; oc < m; ++oc)
        for (int64_t oy = 0; oy < oh; ++oy)
          for (int64_t ox = 0; ox < ow; ++ox) {
            double acc = in.size() > 2 && !in[2].empty() ? in[2].GetDouble(oc) : 0.0;
            int64_t grp = oc / mg;
            for (int64_t ic = 0; ic < cg; ++ic)
              for (int64_t ky = 0; ky < kh; ++ky)
                for (int64_t kx = 0; kx < kw; ++kx) {
                  int64_t yy = oy * sh - ph + ky * dh, xx = ox * sw - pw + kx * dw;
                  if (yy < 0 || yy >= ih || xx < 0 || xx >= iw) continue;
                  int64_t ci = grp * cg + ic;
                  acc += x.GetDouble(((b * c + ci) * ih + yy) * iw + xx) *
                         w.GetDouble(((oc * cg + ic) * kh + ky) * kw + kx);
                }
            int64_t o = ((b * m + oc) * oh + oy) * ow + ox;
            if (in.size() > 3 && !in[3].empty()) acc += in[3].GetDouble(o);
            y[o] = Activate(act, acc);
          }
    return y;
  };
}

OpCase MakeConv(const ConvParams& p, std::mt19937& rng) {
  OpCase c;
  c.op = "Conv";
  c.attrs = ConvAttrs(p);
  c.inputs = {RandomTensor(p.x, rng), RandomTensor(p.w, rng)};
  c.constant = {false, true, true, false};
  if (p.bias) c.inputs.push_back(RandomTensor({p.w[0]}, rng));
  return c;
}

std::set<std::string> RunConv(const ConvParams& p, uint32_t seed) {
  std::mt19937 rng(seed);
  OpCase c = MakeConv(p, rng);
  std::set<std::string> names;
  for (const auto& r : CheckAllTactics(c, ConvReference(p), 1e-4, 1e-4)) names.insert(r.tactic);
  return names;
}

TEST(CpuConv, Basic3x3AllTactics) {
  auto names = RunConv({{2, 3, 7, 9}, {5, 3, 3, 3}, {}, {}, {1, 1, 1, 1}}, 1);
  EXPECT_TRUE(names.count("f32-conv-cpu-im2col-openblas"));
  EXPECT_TRUE(names.count("f32-conv-cpu-im2col-blocked-8x8"));
  EXPECT_TRUE(names.count("f32-conv-cpu-onednn"));
}

TEST(CpuConv, StridesDilationsAsymmetricPads) {
  RunConv({{1, 4, 13, 11}, {6, 4, 3, 2}, {2, 3}, {2, 1}, {1, 0, 2, 1}, "NOTSET", 1, false}, 2);
  RunConv({{2, 3, 10, 9}, {4, 3, 5, 3}, {3, 2}, {1, 2}, {2, 2, 0, 1}}, 3);
}

TEST(CpuConv, AutoPad) {
  for (std::string pad : {"SAME_UPPER", "SAME_LOWER", "VALID"}) {
    RunConv({{1, 3, 9, 8}, {4, 3, 4, 3}, {2, 3}, {}, {}, pad}, 4);
  }
}

TEST(CpuConv, Groups) {
  RunConv({{2, 4, 9, 7}, {6, 2, 3, 2}, {1, 2}, {}, {1, 1, 1, 0}, "NOTSET", 2}, 5);
  RunConv({{1, 6, 8, 8}, {9, 2, 3, 3}, {}, {2, 2}, {2, 2, 2, 2}, "NOTSET", 3}, 6);
}

TEST(CpuConv, DepthwiseUsesDirectTactic) {
  auto names = RunConv({{2, 8, 11, 10}, {8, 1, 3, 3}, {2, 2}, {}, {}, "SAME_UPPER", 8}, 7);
  EXPECT_TRUE(names.count("f32-conv-cpu-direct-dw3x3"));
  // Channel multiplier 2, dilation and stride 1.
  names = RunConv({{1, 4, 9, 9}, {8, 1, 5, 5}, {}, {2, 2}, {4, 4, 4, 4}, "NOTSET", 4}, 8);
  EXPECT_TRUE(names.count("f32-conv-cpu-direct-dw5x5"));
}

TEST(CpuConv, OneByOne) {
  auto names = RunConv({{2, 16, 5, 7}, {8, 16, 1, 1}, {}, {}, {}}, 9);
  EXPECT_TRUE(names.count("f32-conv-cpu-1x1-gemm"));
  names = RunConv({{1, 16, 9, 7}, {8, 16, 1, 1}, {2, 2}, {}, {}}, 10);  // stride 2: im2col
  EXPECT_FALSE(names.count("f32-conv-cpu-1x1-gemm"));
}

TEST(CpuConv, StemAndChunkedIm2col) {
  RunConv({{1, 3, 23, 21}, {8, 3, 7, 7}, {2, 2}, {}, {3, 3, 3, 3}}, 11);
  auto names = RunConv({{1, 64, 40, 40}, {8, 64, 3, 3}, {}, {}, {1, 1, 1, 1}}, 12);
  bool chunked = false;
  for (const auto& n : names) chunked |= n.starts_with("f32-conv-cpu-im2col-openblas-rows");
  EXPECT_TRUE(chunked);
}

TEST(CpuConv, ChunkedTacticNeedsLessWorkspace) {
  std::mt19937 rng(13);
  ConvParams p{{1, 64, 40, 40}, {8, 64, 3, 3}, {}, {}, {1, 1, 1, 1}};
  auto results = CheckAllTactics(MakeConv(p, rng), ConvReference(p), 1e-4, 1e-4);
  size_t full = 0, chunked = 0;
  for (const auto& r : results) {
    if (r.tactic == "f32-conv-cpu-im2col-openblas") full = r.workspace;
    if (r.tactic.starts_with("f32-conv-cpu-im2col-openblas-rows")) chunked = r.workspace;
  }
  // Full im2col: K = 64*9 rows of 40*40 columns.
  EXPECT_EQ(full, static_cast<size_t>(64 * 9 * 40 * 40 * 4));
  EXPECT_GT(chunked, 0u);
  EXPECT_LT(chunked, full / 2);
}

TEST(CpuConv, RuntimeWeightsSkipOneDnn) {
  ConvParams p{{1, 4, 9, 8}, {6, 4, 3, 3}, {}, {}, {1, 1, 1, 1}};
  std::mt19937 rng(18);
  OpCase c = MakeConv(p, rng);
  c.constant = {false, false, false};  // weights computed at run time
  std::set<std::string> names;
  for (const auto& r : CheckAllTactics(c, ConvReference(p), 1e-4, 1e-4)) names.insert(r.tactic);
  EXPECT_FALSE(names.count("f32-conv-cpu-onednn"));  // it prepacks constant weights only
  EXPECT_TRUE(names.count("f32-conv-cpu-im2col-openblas"));
}

TEST(CpuConv, OneD) {
  RunConv({{2, 3, 17}, {4, 3, 3}, {2}, {}, {}, "SAME_LOWER"}, 14);
  RunConv({{1, 4, 12}, {6, 2, 4}, {1}, {2}, {1, 2}, "NOTSET", 2}, 15);
}

TEST(CpuConv, HalfAndBFloat16ThroughTheWrapper) {
  ConvParams p{{1, 3, 7, 9}, {5, 3, 3, 3}, {}, {}, {1, 1, 1, 1}};
  for (DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
    std::mt19937 rng(16);
    auto results = CheckAllTactics(MakeConv(p, rng), ConvReference(p),
                                   t == DataType::kFloat16 ? 2e-2 : 1e-1, 2e-2, t);
    ASSERT_FALSE(results.empty());
    EXPECT_TRUE(results[0].tactic.starts_with(std::string(ToString(t)) + "-conv-cpu-"))
        << results[0].tactic;
  }
}

// 3-D convolution (rank-5 operands): a naive reference of its own, per axis from the ONNX spec.
Reference Conv3dReference(const ConvParams& p, const std::string& act = "none") {
  return [p, act](const std::vector<Tensor>& in, const std::vector<int64_t>& yd) {
    const Tensor& x = in[0];
    const Tensor& w = in[1];
    const int64_t n = p.x[0], c = p.x[1], m = p.w[0], cg = p.w[1], mg = m / p.group;
    int64_t id[3], od[3], k[3], s[3], d[3], pb[3];
    for (size_t i = 0; i < 3; ++i) {
      id[i] = p.x[2 + i];
      od[i] = yd[2 + i];
      k[i] = p.w[2 + i];
      s[i] = p.strides.empty() ? 1 : p.strides[i];
      d[i] = p.dilations.empty() ? 1 : p.dilations[i];
      pb[i] = PadBegin(p, i, id[i], od[i]);
    }
    std::vector<double> y(static_cast<size_t>(n * m * od[0] * od[1] * od[2]));
    for (int64_t b = 0; b < n; ++b)
      for (int64_t oc = 0; oc < m; ++oc)
        for (int64_t oz = 0; oz < od[0]; ++oz)
          for (int64_t oy = 0; oy < od[1]; ++oy)
            for (int64_t ox = 0; ox < od[2]; ++ox) {
              double acc = in.size() > 2 && !in[2].empty() ? in[2].GetDouble(oc) : 0.0;
              const int64_t grp = oc / mg;
              for (int64_t ic = 0; ic < cg; ++ic)
                for (int64_t kz = 0; kz < k[0]; ++kz)
                  for (int64_t ky = 0; ky < k[1]; ++ky)
                    for (int64_t kx = 0; kx < k[2]; ++kx) {
                      const int64_t zz = oz * s[0] - pb[0] + kz * d[0];
                      const int64_t yy = oy * s[1] - pb[1] + ky * d[1];
                      const int64_t xx = ox * s[2] - pb[2] + kx * d[2];
                      if (zz < 0 || zz >= id[0] || yy < 0 || yy >= id[1] || xx < 0 || xx >= id[2]) {
                        continue;
                      }
                      const int64_t ci = grp * cg + ic;
                      acc += x.GetDouble((((b * c + ci) * id[0] + zz) * id[1] + yy) * id[2] + xx) *
                             w.GetDouble((((oc * cg + ic) * k[0] + kz) * k[1] + ky) * k[2] + kx);
                    }
              const int64_t o = (((b * m + oc) * od[0] + oz) * od[1] + oy) * od[2] + ox;
              if (in.size() > 3 && !in[3].empty()) acc += in[3].GetDouble(o);
              y[o] = Activate(act, acc);
            }
    return y;
  };
}

std::set<std::string> RunConv3d(const ConvParams& p, uint32_t seed) {
  std::mt19937 rng(seed);
  std::set<std::string> names;
  for (const auto& r : CheckAllTactics(MakeConv(p, rng), Conv3dReference(p), 1e-4, 1e-4)) {
    names.insert(r.tactic);
  }
  return names;
}

TEST(CpuConv3d, PaddedStridedDilatedGroupedAndAutoPad) {
  auto names = RunConv3d({{2, 3, 5, 7, 6}, {4, 3, 3, 3, 3}, {}, {}, {1, 1, 1, 1, 1, 1}}, 21);
  EXPECT_EQ(names, std::set<std::string>{"f32-conv3d-cpu-vol2col-openblas"});
  // R3D-18's stem: 3x7x7, stride 1x2x2, pads 1x3x3.
  RunConv3d({{1, 3, 4, 17, 15}, {8, 3, 3, 7, 7}, {1, 2, 2}, {}, {1, 3, 3, 1, 3, 3}}, 22);
  // Asymmetric pads, strides and dilations per axis, no bias.
  RunConv3d({{1, 4, 9, 8, 7},
             {5, 4, 2, 3, 2},
             {2, 1, 3},
             {1, 2, 1},
             {0, 1, 2, 1, 0, 1},
             "NOTSET",
             1,
             false},
            23);
  // Groups and depthwise (channel multiplier 2).
  RunConv3d({{1, 6, 4, 5, 6}, {4, 3, 1, 3, 3}, {}, {}, {0, 1, 1, 0, 1, 1}, "NOTSET", 2}, 24);
  RunConv3d({{1, 4, 5, 5, 5}, {8, 1, 3, 3, 3}, {}, {}, {1, 1, 1, 1, 1, 1}, "NOTSET", 4}, 25);
  for (std::string pad : {"SAME_UPPER", "SAME_LOWER", "VALID"}) {
    RunConv3d({{1, 2, 6, 7, 5}, {3, 2, 2, 3, 2}, {2, 2, 1}, {}, {}, pad}, 26);
  }
}

TEST(CpuConv3d, FusedBiasResidualActivation) {
  for (std::string act : {"none", "relu", "silu"}) {
    ConvParams p{{2, 3, 4, 6, 5}, {4, 3, 3, 3, 3}, {1, 2, 1}, {}, {1, 1, 1, 1, 1, 1}};
    std::mt19937 rng(27);
    OpCase c = MakeConv(p, rng);
    c.op = "FusedConv";
    c.attrs.Set("activation", act);
    auto y = InferOutputDims(c);
    ASSERT_TRUE(y.ok()) << y.status().ToString();
    c.inputs.push_back(RandomTensor(*y, rng, -2.f, 2.f));  // residual Z
    auto results = CheckAllTactics(c, Conv3dReference(p, act), 1e-4, 1e-4);
    EXPECT_EQ(results.size(), 1u) << act;
  }
}

TEST(CpuFusedConv, BiasResidualAndEveryActivation) {
  for (std::string act : {"none", "relu", "relu6", "clip", "sigmoid", "hardswish", "silu", "swish",
                          "gelu", "gelu_tanh"}) {
    for (bool depthwise : {false, true}) {
      ConvParams p = depthwise
                         ? ConvParams{{1, 6, 9, 8}, {6, 1, 3, 3}, {}, {}, {1, 1, 1, 1}, "NOTSET", 6}
                         : ConvParams{{2, 4, 9, 8}, {6, 4, 3, 3}, {}, {}, {1, 1, 1, 1}};
      std::mt19937 rng(17);
      OpCase c = MakeConv(p, rng);
      c.op = "FusedConv";
      c.attrs.Set("activation", act);
      if (act == "clip") {
        c.attrs.Set("activation_min", -0.5f);
        c.attrs.Set("activation_max", 0.75f);
      }
      if (act == "swish") c.attrs.Set("activation_alpha", 1.702f);
      auto y = InferOutputDims(c);
      ASSERT_TRUE(y.ok()) << y.status().ToString();
      c.inputs.push_back(RandomTensor(*y, rng, -2.f, 2.f));  // residual Z
      auto results = CheckAllTactics(c, ConvReference(p, act), 1e-4, 1e-4);
      EXPECT_GE(results.size(), 3u) << act;
    }
  }
}

// ---- ConvTranspose ---------------------------------------------------------------------------

struct DeconvParams {
  std::vector<int64_t> x{}, w{};  // w: [C, M/group, k...]
  std::vector<int64_t> strides{}, dilations{}, pads{}, output_padding{}, output_shape{};
  std::string auto_pad = "NOTSET";
  int64_t group = 1;
};

Reference DeconvReference(const DeconvParams& p) {
  return [p](const std::vector<Tensor>& in, const std::vector<int64_t>& yd) {
    size_t r = p.x.size() - 2;
    bool one_d = r == 1;
    int64_t n = p.x[0], c = p.x[1], g = p.group, cg = c / g, mg = p.w[1], m = mg * g;
    int64_t ih = one_d ? 1 : p.x[2], iw = p.x.back(), oh = one_d ? 1 : yd[2], ow = yd.back();
    int64_t kh = one_d ? 1 : p.w[2], kw = p.w.back();
    auto at = [](const std::vector<int64_t>& v, size_t i, int64_t def) {
      return v.empty() ? def : v[i];
    };
    auto pad_begin = [&](size_t i, int64_t in_size, int64_t out_size) -> int64_t {
      int64_t k = p.w[i + 2], s = at(p.strides, i, 1), d = at(p.dilations, i, 1);
      bool computed = !p.output_shape.empty() || p.auto_pad.starts_with("SAME");
      if (!computed) return p.auto_pad == "VALID" ? 0 : at(p.pads, i, 0);
      int64_t total = s * (in_size - 1) + at(p.output_padding, i, 0) + (k - 1) * d + 1 - out_size;
      int64_t half = total >= 0 ? total / 2 : -((1 - total) / 2);  // floor division
      return p.auto_pad == "SAME_UPPER" ? half : total - half;
    };
    size_t wi = r - 1;
    int64_t sh = one_d ? 1 : at(p.strides, 0, 1), sw = at(p.strides, wi, 1);
    int64_t dh = one_d ? 1 : at(p.dilations, 0, 1), dw = at(p.dilations, wi, 1);
    int64_t ph = one_d ? 0 : pad_begin(0, ih, oh), pw = pad_begin(wi, iw, ow);
    std::vector<double> y(static_cast<size_t>(n * m * oh * ow), 0.0);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t oc = 0; oc < m; ++oc)
        for (int64_t i = 0; i < oh * ow; ++i) {
          y[(b * m + oc) * oh * ow + i] = in.size() > 2 && !in[2].empty() ? in[2].GetDouble(oc) : 0;
        }
    for (int64_t b = 0; b < n; ++b)
      for (int64_t ci = 0; ci < c; ++ci)
        for (int64_t yy = 0; yy < ih; ++yy)
          for (int64_t xx = 0; xx < iw; ++xx) {
            double xv = in[0].GetDouble(((b * c + ci) * ih + yy) * iw + xx);
            int64_t grp = ci / cg;
            for (int64_t oc = 0; oc < mg; ++oc)
              for (int64_t ky = 0; ky < kh; ++ky)
                for (int64_t kx = 0; kx < kw; ++kx) {
                  int64_t oy = yy * sh - ph + ky * dh, ox = xx * sw - pw + kx * dw;
                  if (oy < 0 || oy >= oh || ox < 0 || ox >= ow) continue;
                  y[((b * m + grp * mg + oc) * oh + oy) * ow + ox] +=
                      xv * in[1].GetDouble(((ci * mg + oc) * kh + ky) * kw + kx);
                }
          }
    return y;
  };
}

// `reference`: DeconvReference (1-D, 2-D) by default; the 3-D tests pass Deconv3dReference.
std::vector<int64_t> RunDeconv(const DeconvParams& p, uint32_t seed, bool bias = true,
                               const Reference& reference = nullptr) {
  std::mt19937 rng(seed);
  OpCase c;
  c.op = "ConvTranspose";
  if (!p.strides.empty()) c.attrs.Set("strides", p.strides);
  if (!p.dilations.empty()) c.attrs.Set("dilations", p.dilations);
  if (!p.pads.empty()) c.attrs.Set("pads", p.pads);
  if (!p.output_padding.empty()) c.attrs.Set("output_padding", p.output_padding);
  if (!p.output_shape.empty()) c.attrs.Set("output_shape", p.output_shape);
  if (p.auto_pad != "NOTSET") c.attrs.Set("auto_pad", p.auto_pad);
  c.attrs.Set("group", p.group);
  c.inputs = {RandomTensor(p.x, rng), RandomTensor(p.w, rng)};
  if (bias) c.inputs.push_back(RandomTensor({p.w[1] * p.group}, rng));
  c.constant = {false, true, true};
  auto results = CheckAllTactics(c, reference ? reference : DeconvReference(p), 1e-4, 1e-4);
  EXPECT_EQ(results.size(), 2u);
  auto dims = InferOutputDims(c);
  return dims.ok() ? *dims : std::vector<int64_t>{};
}

TEST(CpuConvTranspose, StridesPadsOutputPadding) {
  EXPECT_EQ(RunDeconv({{1, 3, 5, 4}, {3, 2, 3, 3}, {2, 2}, {}, {1, 1, 1, 1}, {1, 0}}, 20),
            (std::vector<int64_t>{1, 2, 10, 7}));
  RunDeconv({{2, 4, 4, 5}, {4, 3, 3, 2}, {3, 2}, {2, 1}, {0, 1, 2, 0}}, 21, false);
}

TEST(CpuConvTranspose, GroupsAndOutputShape) {
  RunDeconv({{1, 4, 5, 5}, {4, 3, 3, 3}, {2, 2}, {}, {}, {}, {}, "NOTSET", 2}, 22);
  EXPECT_EQ(RunDeconv({{1, 2, 4, 4}, {2, 3, 3, 3}, {2, 2}, {}, {}, {}, {8, 9}}, 23),
            (std::vector<int64_t>{1, 3, 8, 9}));
  // Beyond the full extent (9 x 9): the extra row is zero plus bias.
  EXPECT_EQ(RunDeconv({{1, 2, 4, 4}, {2, 3, 3, 3}, {2, 2}, {}, {}, {}, {10, 9}}, 27),
            (std::vector<int64_t>{1, 3, 10, 9}));
}

TEST(CpuConvTranspose, AutoPadAndOneD) {
  EXPECT_EQ(RunDeconv({{1, 2, 5, 3}, {2, 2, 3, 4}, {2, 3}, {}, {}, {}, {}, "SAME_UPPER"}, 24),
            (std::vector<int64_t>{1, 2, 10, 9}));
  RunDeconv({{1, 2, 5, 3}, {2, 2, 4, 3}, {2, 2}, {}, {}, {}, {}, "SAME_LOWER"}, 25);
  RunDeconv({{2, 3, 7}, {3, 2, 4}, {3}, {}, {1, 2}}, 26);
}

// 3-D: a reference of its own over (depth, height, width), with the same begin-padding rules.
Reference Deconv3dReference(const DeconvParams& p) {
  return [p](const std::vector<Tensor>& in, const std::vector<int64_t>& yd) {
    auto at = [](const std::vector<int64_t>& v, size_t i, int64_t def) {
      return v.empty() ? def : v[i];
    };
    const int64_t n = p.x[0], c = p.x[1], g = p.group, cg = c / g, mg = p.w[1], m = mg * g;
    int64_t id[3], od[3], k[3], s[3], d[3], pb[3];
    for (size_t i = 0; i < 3; ++i) {
      id[i] = p.x[2 + i];
      od[i] = yd[2 + i];
      k[i] = p.w[2 + i];
      s[i] = at(p.strides, i, 1);
      d[i] = at(p.dilations, i, 1);
      const bool computed = !p.output_shape.empty() || p.auto_pad.starts_with("SAME");
      if (!computed) {
        pb[i] = p.auto_pad == "VALID" ? 0 : at(p.pads, i, 0);
      } else {
        int64_t total =
            s[i] * (id[i] - 1) + at(p.output_padding, i, 0) + (k[i] - 1) * d[i] + 1 - od[i];
        int64_t half = total >= 0 ? total / 2 : -((1 - total) / 2);
        pb[i] = p.auto_pad == "SAME_UPPER" ? half : total - half;
      }
    }
    const int64_t ovol = od[0] * od[1] * od[2];
    std::vector<double> y(static_cast<size_t>(n * m * ovol), 0.0);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t oc = 0; oc < m; ++oc)
        for (int64_t i = 0; i < ovol; ++i) {
          y[(b * m + oc) * ovol + i] = in.size() > 2 && !in[2].empty() ? in[2].GetDouble(oc) : 0;
        }
    for (int64_t b = 0; b < n; ++b)
      for (int64_t ci = 0; ci < c; ++ci)
        for (int64_t z = 0; z < id[0]; ++z)
          for (int64_t yy = 0; yy < id[1]; ++yy)
            for (int64_t xx = 0; xx < id[2]; ++xx) {
              const double xv =
                  in[0].GetDouble((((b * c + ci) * id[0] + z) * id[1] + yy) * id[2] + xx);
              const int64_t grp = ci / cg;
              for (int64_t oc = 0; oc < mg; ++oc)
                for (int64_t kz = 0; kz < k[0]; ++kz)
                  for (int64_t ky = 0; ky < k[1]; ++ky)
                    for (int64_t kx = 0; kx < k[2]; ++kx) {
                      const int64_t oz = z * s[0] - pb[0] + kz * d[0];
                      const int64_t oy = yy * s[1] - pb[1] + ky * d[1];
                      const int64_t ox = xx * s[2] - pb[2] + kx * d[2];
                      if (oz < 0 || oz >= od[0] || oy < 0 || oy >= od[1] || ox < 0 || ox >= od[2])
                        continue;
                      y[(((b * m + grp * mg + oc) * od[0] + oz) * od[1] + oy) * od[2] + ox] +=
                          xv *
                          in[1].GetDouble((((ci * mg + oc) * k[0] + kz) * k[1] + ky) * k[2] + kx);
                    }
            }
    return y;
  };
}

std::vector<int64_t> RunDeconv3d(const DeconvParams& p, uint32_t seed, bool bias = true) {
  return RunDeconv(p, seed, bias, Deconv3dReference(p));
}

TEST(CpuConvTranspose, ThreeD) {
  // A 3-D U-Net's 2x2x2 stride-2 upsampling.
  EXPECT_EQ(RunDeconv3d({{1, 4, 3, 4, 5}, {4, 2, 2, 2, 2}, {2, 2, 2}}, 30),
            (std::vector<int64_t>{1, 2, 6, 8, 10}));
  // Pads, output_padding and dilations per axis, no bias.
  RunDeconv3d(
      {{2, 3, 4, 3, 5}, {3, 2, 3, 2, 3}, {2, 1, 3}, {1, 2, 1}, {1, 0, 1, 0, 1, 2}, {1, 0, 2}}, 31,
      false);
  // Groups, and automatic padding to an output_shape.
  RunDeconv3d({{1, 4, 3, 3, 3}, {4, 3, 3, 3, 3}, {2, 2, 2}, {}, {}, {}, {}, "NOTSET", 2}, 32);
  EXPECT_EQ(
      RunDeconv3d({{1, 2, 3, 4, 3}, {2, 2, 3, 3, 3}, {2, 2, 2}, {}, {}, {}, {}, "SAME_UPPER"}, 33),
      (std::vector<int64_t>{1, 2, 6, 8, 6}));
}

}  // namespace
}  // namespace kiln::testing
