// SkipLayerNormalization (residual Add + LayerNormalization, kiln-internal) on every backend
// against a double-precision reference, and the CPU kernel against the unfused Add +
// LayerNormalization graph it replaces, on fresh random inputs.
#include <cmath>
#include <map>
#include <random>

#include "kiln/backends/cpu/cpu_eval.h"
#include "op_tester.h"

namespace kiln::testing {
namespace {

using enum DataType;
const std::vector<DataType> kAllFloats = {kFloat32, kFloat16, kBFloat16};

AttributeMap LnAttrs(int64_t axis, float eps) {
  AttributeMap m;
  m.Set("axis", axis);
  m.Set("epsilon", eps);
  return m;
}

// (x, skip, scale, bias?) -> (y, sum?); scale/bias of the full normalized size.
ReferenceFn SkipLnRef(int64_t axis, double eps, int outputs) {
  return [=](const std::vector<RefTensor>& in) {
    const RefTensor& x = in[0];
    const RefTensor& k = in[1];
    const RefTensor& g = in[2];
    bool has_bias = in.size() > 3 && !in[3].data.empty();
    int64_t rank = static_cast<int64_t>(x.dims.size());
    int64_t a = axis < 0 ? axis + rank : axis;
    int64_t n = 1;
    for (int64_t i = a; i < rank; ++i) n *= x.dims[i];
    RefTensor y = x, sum = x;
    for (int64_t i = 0; i < x.size(); ++i) sum[i] = x[i] + k[i];
    for (int64_t r = 0; r < x.size() / n; ++r) {
      double m = 0, v = 0;
      for (int64_t j = 0; j < n; ++j) m += sum[r * n + j];
      m /= n;
      for (int64_t j = 0; j < n; ++j) v += (sum[r * n + j] - m) * (sum[r * n + j] - m);
      double is = 1 / std::sqrt(v / n + eps);
      for (int64_t j = 0; j < n; ++j) {
        y[r * n + j] = (sum[r * n + j] - m) * is * g[j] + (has_bias ? in[3][j] : 0.0);
      }
    }
    std::vector<RefTensor> out = {y, sum};
    out.resize(static_cast<size_t>(outputs));
    return out;
  };
}

class SkipLayerNormOp : public BackendTest {};

TEST_P(SkipLayerNormOp, MatchesReferenceWithAndWithoutSum) {
  struct Shape {
    std::vector<int64_t> dims;
    int64_t axis;
  };
  // Odd rows, BERT's 768, a row longer than a warp's registers, a multi-axis normalization.
  for (const Shape& s :
       std::vector<Shape>{{{4, 7, 33}, -1}, {{3, 768}, -1}, {{2, 1500}, -1}, {{2, 3, 8}, 1}}) {
    std::vector<int64_t> norm(s.dims.begin() + (s.axis < 0 ? s.dims.size() + s.axis : s.axis),
                              s.dims.end());
    for (int outputs : {1, 2}) {
      for (bool bias : {true, false}) {
        SCOPED_TRACE(::testing::Message()
                     << "dims " << s.dims.back() << " outputs " << outputs << " bias " << bias);
        OpTester t("SkipLayerNormalization", LnAttrs(s.axis, 1e-5f));
        t.Input(kFloat32, s.dims).Input(kFloat32, s.dims).Input(kFloat32, norm, 0.5, 1.5);
        if (bias) t.Input(kFloat32, norm);
        t.Outputs(outputs).Reference(SkipLnRef(s.axis, 1e-5, outputs)).Tolerance(1e-4, 1e-4);
        t.FloatTypes(kAllFloats);
        t.Run(GetParam());
      }
    }
  }
}

KILN_INSTANTIATE_BACKENDS(SkipLayerNormOp);

Tensor Random(DataType t, std::vector<int64_t> dims, uint32_t seed, double lo, double hi) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> uni(lo, hi);
  Tensor out(t, std::move(dims));
  for (int64_t i = 0; i < out.num_elements(); ++i) StoreFromDouble(out.view(), i, uni(rng));
  return out;
}

// The fused op computes what Add + LayerNormalization compute: y and the sum, on the CPU.
TEST(SkipLayerNormCpu, MatchesTheUnfusedAddAndLayerNorm) {
  const std::vector<int64_t> dims = {3, 9, 64};
  for (DataType t : kAllFloats) {
    SCOPED_TRACE(std::string(ToString(t)));
    Tensor gamma = Random(t, {64}, 3, 0.5, 1.5), beta = Random(t, {64}, 4, -1, 1);
    auto attrs = LnAttrs(-1, 1e-5f);
    Graph unfused, fused;
    {
      Value* x = unfused.AddInput("x", t, MakeShape(dims));
      Value* s = unfused.AddInput("skip", t, MakeShape(dims));
      Value* sum = unfused.AddValue("sum");
      Value* y = unfused.AddValue("y");
      unfused.AddNode("Add", "add", {x, s}, {sum}, {});
      unfused.AddNode("LayerNormalization", "ln",
                      {sum, unfused.AddConstant("gamma", gamma), unfused.AddConstant("beta", beta)},
                      {y}, attrs);
      unfused.MarkOutput(y);
      unfused.MarkOutput(sum);
    }
    {
      Value* x = fused.AddInput("x", t, MakeShape(dims));
      Value* s = fused.AddInput("skip", t, MakeShape(dims));
      Value* sum = fused.AddValue("sum");
      Value* y = fused.AddValue("y");
      fused.AddNode("SkipLayerNormalization", "sln",
                    {x, s, fused.AddConstant("gamma", gamma), fused.AddConstant("beta", beta)},
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
      double max_diff = 0;
      for (int64_t i = 0; i < wy.num_elements(); ++i) {
        max_diff = std::max(max_diff, std::abs(gy.GetDouble(i) - wy.GetDouble(i)));
      }
      EXPECT_LE(max_diff, tol);
      // Not vacuous: the outputs are normalized values, not zeros.
      double sq = 0;
      for (int64_t i = 0; i < gy.num_elements(); ++i) sq += gy.GetDouble(i) * gy.GetDouble(i);
      EXPECT_GT(sq / gy.num_elements(), 0.1);
    }
  }
}

}  // namespace
}  // namespace kiln::testing
