// RotaryEmbedding (kiln-internal RoPE) on every backend against a double-precision reference
// written from the formula (the CUDA cases run where a GPU is), and the CPU kernel against the
// unfused Mul/Slice/Neg/Concat/Add graph it replaces, on fresh random inputs.
#include <map>
#include <random>

#include "kiln/backends/cpu/cpu_eval.h"
#include "op_tester.h"

namespace kiln::testing {
namespace {

using enum DataType;
const std::vector<DataType> kAllFloats = {kFloat32, kFloat16, kBFloat16};

// (x, cos, sin) -> x * cos + rotate(x) * sin over the last axis, or over its first `partial`
// elements (the rest copied; cos and sin then broadcast to x's dims with that last dim).
ReferenceFn RotaryRef(bool interleaved, int64_t partial = 0) {
  return [=](const std::vector<RefTensor>& in) {
    const RefTensor& x = in[0];
    const int64_t full = x.dims.back(), d = partial > 0 ? partial : full, h = d / 2;
    std::vector<int64_t> rotated = x.dims;
    rotated.back() = d;
    RefTensor y = x;
    for (int64_t i = 0; i < x.size(); ++i) {
      const int64_t j = i % full, row = i - j;
      if (j >= d) continue;  // passes through
      double rot;
      if (interleaved) {
        rot = j % 2 == 0 ? -x[row + j + 1] : x[row + j - 1];
      } else {
        rot = j < h ? -x[row + j + h] : x[row + j - h];
      }
      const int64_t k = row / full * d + j;  // the element's index in the rotated part
      y[i] = x[i] * in[1][BroadcastIndex(in[1].dims, rotated, k)] +
             rot * in[2][BroadcastIndex(in[2].dims, rotated, k)];
    }
    return std::vector<RefTensor>{y};
  };
}

class RotaryOp : public BackendTest {};

TEST_P(RotaryOp, MatchesTheFormula) {
  struct Case {
    std::vector<int64_t> x, cos, sin;
    int64_t interleaved;
  };
  for (const Case& c : std::vector<Case>{{{2, 4, 9, 64}, {1, 1, 9, 64}, {1, 1, 9, 64}, 0},
                                         {{2, 3, 5, 6}, {5, 6}, {5, 6}, 0},
                                         {{2, 7, 4, 32}, {7, 1, 32}, {7, 1, 32}, 0},
                                         {{3, 5, 16}, {5, 16}, {5, 1}, 0},
                                         {{2, 4, 9, 64}, {9, 64}, {9, 64}, 1},
                                         {{3, 5, 6}, {1, 6}, {5, 6}, 1}}) {
    SCOPED_TRACE(::testing::Message() << "d " << c.x.back() << " interleaved " << c.interleaved
                                      << " cos rank " << c.cos.size());
    AttributeMap attrs;
    attrs.Set("interleaved", c.interleaved);
    OpTester t("RotaryEmbedding", attrs);
    t.Input(kFloat32, c.x, -3, 3).Input(kFloat32, c.cos, -1, 1).Input(kFloat32, c.sin, -1, 1);
    t.Reference(RotaryRef(c.interleaved != 0)).Tolerance(1e-5, 1e-5).FloatTypes(kAllFloats);
    EXPECT_GT(t.Run(GetParam()), 0);
  }
}

// Partial rotary (rotary_embedding_dim r < D: GPT-NeoX/Pythia rotate a quarter of each head, GPT-J
// 64 of 256 interleaved): the first r elements rotate against tables of last dim r, the rest pass
// through. 16-byte rows and chunks (D 64, r 32 or 16), odd halves (r 6), a row-broadcast table and
// r = D (the whole row, as without the attribute).
TEST_P(RotaryOp, PartialRotatesTheFirstElementsOnly) {
  struct Case {
    std::vector<int64_t> x, cos;
    int64_t rot, interleaved;
  };
  for (const Case& c : std::vector<Case>{{{2, 4, 9, 64}, {1, 1, 9, 32}, 32, 0},
                                         {{2, 3, 5, 10}, {5, 6}, 6, 0},
                                         {{2, 7, 4, 64}, {7, 1, 16}, 16, 0},
                                         {{3, 5, 12}, {5, 1}, 8, 0},
                                         {{2, 4, 9, 64}, {9, 16}, 16, 1},
                                         {{3, 5, 14}, {1, 6}, 6, 1},
                                         {{2, 3, 5, 8}, {5, 8}, 8, 0}}) {
    SCOPED_TRACE(::testing::Message()
                 << "d " << c.x.back() << " rot " << c.rot << " interleaved " << c.interleaved);
    AttributeMap attrs;
    attrs.Set("interleaved", c.interleaved);
    attrs.Set("rotary_embedding_dim", c.rot);
    OpTester t("RotaryEmbedding", attrs);
    t.Input(kFloat32, c.x, -3, 3).Input(kFloat32, c.cos, -1, 1).Input(kFloat32, c.cos, -1, 1);
    t.Reference(RotaryRef(c.interleaved != 0, c.rot)).Tolerance(1e-5, 1e-5).FloatTypes(kAllFloats);
    EXPECT_GT(t.Run(GetParam()), 0);
  }
}

KILN_INSTANTIATE_BACKENDS(RotaryOp);

Tensor Random(DataType t, std::vector<int64_t> dims, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> uni(-2, 2);
  Tensor out(t, std::move(dims));
  for (int64_t i = 0; i < out.num_elements(); ++i) StoreFromDouble(out.view(), i, uni(rng));
  return out;
}

Value* Ints(Graph& g, const std::string& name, std::vector<int64_t> v) {
  int64_t n = static_cast<int64_t>(v.size());
  return g.AddConstant(name, Tensor::FromVector(DataType::kInt64, {n}, v));
}

// The fused op computes what Llama's rotate_half form computes, in f32 exactly up to rounding.
TEST(RotaryCpu, MatchesTheUnfusedRotateHalf) {
  const std::vector<int64_t> dims = {2, 3, 5, 8};
  Graph unfused, fused;
  {
    Graph& g = unfused;
    Value* x = g.AddInput("x", kFloat32, MakeShape(dims));
    Value* c = g.AddInput("cos", kFloat32, MakeShape({5, 8}));
    Value* s = g.AddInput("sin", kFloat32, MakeShape({5, 8}));
    auto out = [&](const char* n) { return g.AddValue(n); };
    g.AddNode("Slice", "lo", {x, Ints(g, "s0", {0}), Ints(g, "e0", {4}), Ints(g, "a0", {-1})},
              {out("x1")});
    g.AddNode("Slice", "hi",
              {x, Ints(g, "s1", {4}), Ints(g, "e1", {INT64_MAX}), Ints(g, "a1", {-1})},
              {out("x2")});
    g.AddNode("Neg", "neg", {g.FindValue("x2")}, {out("nx2")});
    AttributeMap cat;
    cat.Set("axis", int64_t{-1});
    g.AddNode("Concat", "cat", {g.FindValue("nx2"), g.FindValue("x1")}, {out("rot")}, cat);
    g.AddNode("Mul", "mc", {x, c}, {out("xc")});
    g.AddNode("Mul", "ms", {g.FindValue("rot"), s}, {out("rs")});
    g.AddNode("Add", "add", {g.FindValue("xc"), g.FindValue("rs")}, {out("y")});
    g.MarkOutput(g.FindValue("y"));
  }
  {
    Value* x = fused.AddInput("x", kFloat32, MakeShape(dims));
    Value* c = fused.AddInput("cos", kFloat32, MakeShape({5, 8}));
    Value* s = fused.AddInput("sin", kFloat32, MakeShape({5, 8}));
    Value* y = fused.AddValue("y");
    fused.AddNode("RotaryEmbedding", "rope", {x, c, s}, {y}, {});
    fused.MarkOutput(y);
  }
  std::map<std::string, Tensor> in = {{"x", Random(kFloat32, dims, 1)},
                                      {"cos", Random(kFloat32, {5, 8}, 2)},
                                      {"sin", Random(kFloat32, {5, 8}, 3)}};
  auto want = cpu::EvaluateGraph(unfused, in);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  auto got = cpu::EvaluateGraph(fused, in);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  const Tensor& w = want->at("y");
  const Tensor& o = got->at("y");
  ASSERT_EQ(o.dims(), dims);
  double sq = 0;
  for (int64_t i = 0; i < w.num_elements(); ++i) {
    EXPECT_NEAR(o.GetDouble(i), w.GetDouble(i), 1e-5) << i;
    sq += o.GetDouble(i) * o.GetDouble(i);
  }
  EXPECT_GT(sq, 1.0);  // not vacuous
}

}  // namespace
}  // namespace kiln::testing
