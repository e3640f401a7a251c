// RMSNormalization and SkipRMSNormalization on every backend against a double-precision reference
// (the CUDA cases run where a GPU is), the CPU kernel with a scale that broadcasts, and the fused
// residual form against the unfused Add + RMSNormalization, on fresh random inputs.
#include <cmath>
#include <map>
#include <random>

#include "kiln/backends/cpu/cpu_eval.h"
#include "op_tester.h"

namespace kiln::testing {
namespace {

using enum DataType;
const std::vector<DataType> kAllFloats = {kFloat32, kFloat16, kBFloat16};

AttributeMap RmsAttrs(int64_t axis, float eps) {
  AttributeMap m;
  m.Set("axis", axis);
  m.Set("epsilon", eps);
  return m;
}

// (x, scale) -> y; scale broadcast to the normalized shape.
ReferenceFn RmsRef(int64_t axis, double eps) {
  return [=](const std::vector<RefTensor>& in) {
    const RefTensor& x = in[0];
    const RefTensor& g = in[1];
    int64_t rank = static_cast<int64_t>(x.dims.size());
    int64_t a = axis < 0 ? axis + rank : axis;
    std::vector<int64_t> norm(x.dims.begin() + a, x.dims.end());
    int64_t n = 1;
    for (int64_t d : norm) n *= d;
    RefTensor y = x;
    for (int64_t r = 0; r < x.size() / n; ++r) {
      double sq = 0;
      for (int64_t j = 0; j < n; ++j) sq += x[r * n + j] * x[r * n + j];
      double inv = 1 / std::sqrt(sq / n + eps);
      for (int64_t j = 0; j < n; ++j) {
        y[r * n + j] = x[r * n + j] * inv * g[BroadcastIndex(g.dims, norm, j)];
      }
    }
    return std::vector<RefTensor>{y};
  };
}

// (x, skip, scale) -> (y of x + skip, x + skip); scale of the full normalized size.
ReferenceFn SkipRmsRef(int64_t axis, double eps, int outputs) {
  auto rms = RmsRef(axis, eps);
  return [=](const std::vector<RefTensor>& in) {
    RefTensor sum = in[0];
    for (int64_t i = 0; i < sum.size(); ++i) sum[i] += in[1][i];
    std::vector<RefTensor> out = rms({sum, in[2]});
    out.push_back(sum);
    out.resize(static_cast<size_t>(outputs));
    return out;
  };
}

class RmsNormOp : public BackendTest {};

TEST_P(RmsNormOp, SkipFormMatchesReferenceWithAndWithoutSum) {
  for (std::vector<int64_t> dims : {std::vector<int64_t>{4, 7, 33}, std::vector<int64_t>{3, 768},
                                    std::vector<int64_t>{2, 4096}}) {
    for (int outputs : {1, 2}) {
      SCOPED_TRACE(::testing::Message() << "n " << dims.back() << " outputs " << outputs);
      OpTester t("SkipRMSNormalization", RmsAttrs(-1, 1e-6f));
      t.Input(kFloat32, dims, -3, 3).Input(kFloat32, dims, -3, 3);
      t.Input(kFloat32, {dims.back()}, 0.5, 1.5).Outputs(outputs);
      t.Reference(SkipRmsRef(-1, 1e-6, outputs)).Tolerance(1e-4, 1e-4).FloatTypes(kAllFloats);
      EXPECT_GT(t.Run(GetParam()), 0);
    }
  }
}

TEST_P(RmsNormOp, MatchesReference) {
  struct Case {
    std::vector<int64_t> dims;
    int64_t axis;
  };
  // Odd rows (no vector loads), 768 (a warp per row, vector loads), Llama-7B's 4096 and an odd
  // 1500 (a block per row), a normalization over two axes.
  for (const Case& c : std::vector<Case>{{{4, 7, 33}, -1},
                                         {{3, 768}, -1},
                                         {{2, 4096}, -1},
                                         {{2, 1500}, -1},
                                         {{2, 3, 8}, 1},
                                         {{300, 64}, -1}}) {
    SCOPED_TRACE(::testing::Message() << "n " << c.dims.back() << " axis " << c.axis);
    std::vector<int64_t> norm(c.dims.begin() + (c.axis < 0 ? c.dims.size() + c.axis : c.axis),
                              c.dims.end());
    OpTester t("RMSNormalization", RmsAttrs(c.axis, 1e-6f));
    t.Input(kFloat32, c.dims, -3, 3).Input(kFloat32, norm, 0.5, 1.5);
    t.Reference(RmsRef(c.axis, 1e-6)).Tolerance(1e-4, 1e-4).FloatTypes(kAllFloats);
    EXPECT_GT(t.Run(GetParam()), 0);
  }
}

KILN_INSTANTIATE_BACKENDS(RmsNormOp);

// ONNX lets Scale broadcast ([1, n] for a last-axis norm); the CPU kernel expands it.
TEST(RmsNormCpu, ScaleThatBroadcasts) {
  OpTester t("RMSNormalization", RmsAttrs(1, 1e-5f));
  t.Input(kFloat32, {5, 4, 6}).Input(kFloat32, {1, 6}, 0.5, 1.5);
  t.Reference(RmsRef(1, 1e-5)).Tolerance(1e-5, 1e-5);
  EXPECT_GT(t.Run(BackendKind::kCpu), 0);
}

Tensor Random(DataType t, std::vector<int64_t> dims, uint32_t seed, double lo, double hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> uni(lo, hi);
  Tensor out(t, std::move(dims));
  for (int64_t i = 0; i < out.num_elements(); ++i) StoreFromDouble(out.view(), i, uni(rng));
  return out;
}

// The fused op computes what Add + RMSNormalization compute: y and the sum, on the CPU.
TEST(SkipRmsNormCpu, MatchesTheUnfusedAddAndRmsNorm) {
  const std::vector<int64_t> dims = {3, 9, 64};
  for (DataType t : kAllFloats) {
    SCOPED_TRACE(std::string(ToString(t)));
    Tensor gamma = Random(t, {64}, 3, 0.5, 1.5);
    auto attrs = RmsAttrs(-1, 1e-6f);
    Graph unfused, fused;
    {
      Value* x = unfused.AddInput("x", t, MakeShape(dims));
      Value* s = unfused.AddInput("skip", t, MakeShape(dims));
      Value* sum = unfused.AddValue("sum");
      Value* y = unfused.AddValue("y");
      unfused.AddNode("Add", "add", {x, s}, {sum}, {});
      unfused.AddNode("RMSNormalization", "rms", {sum, unfused.AddConstant("gamma", gamma)}, {y},
                      attrs);
      unfused.MarkOutput(y);
      unfused.MarkOutput(sum);
    }
    {
      Value* x = fused.AddInput("x", t, MakeShape(dims));
      Value* s = fused.AddInput("skip", t, MakeShape(dims));
      Value* sum = fused.AddValue("sum");
      Value* y = fused.AddValue("y");
      fused.AddNode("SkipRMSNormalization", "srms", {x, s, fused.AddConstant("gamma", gamma)},
                    {y, sum}, attrs);
      fused.MarkOutput(y);
      fused.MarkOutput(sum);
    }
    for (uint32_t seed : {11u, 12u}) {
      std::map<std::string, Tensor> in = {{"x", Random(t, dims, seed, -3, 3)},
                                          {"skip", Random(t, dims, seed + 100, -3, 3)}};
      auto want = cpu::EvaluateGraph(unfused, in);
      ASSERT_TRUE(want.ok()) << want.status().ToString();
      auto got = cpu::EvaluateGraph(fused, in);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      // The sum is the same rounding of the same FP32 sum; y differs by the fused kernel
      // normalizing the FP32 sum rather than its f16/bf16 rounding.
      const Tensor& ws = want->at("sum");
      const Tensor& gs = got->at("sum");
      ASSERT_EQ(gs.dims(), dims);
      for (int64_t i = 0; i < ws.num_elements(); ++i) {
        ASSERT_EQ(gs.GetDouble(i), ws.GetDouble(i)) << "sum " << i;
      }
      double tol = t == kFloat32 ? 1e-5 : (t == kFloat16 ? 1e-2 : 6e-2);
      const Tensor& wy = want->at("y");
      const Tensor& gy = got->at("y");
      double max_diff = 0, sq = 0;
      for (int64_t i = 0; i < wy.num_elements(); ++i) {
        max_diff = std::max(max_diff, std::abs(gy.GetDouble(i) - wy.GetDouble(i)));
        sq += gy.GetDouble(i) * gy.GetDouble(i);
      }
      EXPECT_LE(max_diff, tol);
      EXPECT_GT(sq / gy.num_elements(), 0.1);  // normalized values, not zeros
    }
  }
}

}  // namespace
}  // namespace kiln::testing
