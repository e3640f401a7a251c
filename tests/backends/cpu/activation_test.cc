// The CPU's fused activation epilogue (backends/cpu/activation.cc) against ops/activations.inc:
// every row has an epilogue, its own loop (where it has one) equals the row's formula, and the
// fused result equals the unfused ops the graph passes replace with it.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/backends/cpu/cpu_eval.h"
#include "kiln/backends/cpu/onednn_common.h"
#include "kiln/backends/cpu/sgemm.h"
#include "kiln/ops/fused.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

struct Row {
  FusedActivation kind;
  std::string_view name, source;
};
constexpr Row kRows[] = {
#define KILN_ACTIVATION(Kind, name, source, formula) {FusedActivation::k##Kind, name, source},
#include "kiln/ops/activations.inc"
#undef KILN_ACTIVATION
};

constexpr float kClipLo = -0.75f, kClipHi = 1.5f;
constexpr float kSwishAlpha = 1.702f;  // CLIP's QuickGELU

FusedActivationSpec SpecOf(FusedActivation kind) {
  FusedActivationSpec spec{kind};
  if (kind == FusedActivation::kClip) {
    spec.min = kClipLo;
    spec.max = kClipHi;
  } else if (kind == FusedActivation::kSwish) {
    spec.min = kSwishAlpha;
  }
  return spec;
}

// Random values over [-8, 8] and the points where formulas switch branches or saturate.
std::vector<float> Inputs() {
  std::vector<float> x = {0.f,  -0.f,  1e-30f, -1e-30f, 0.5f, -0.5f, 3.f,     -3.f,    6.f,  -6.f,
                          20.f, -20.f, 25.f,   -25.f,   88.f, -88.f, kClipLo, kClipHi, 1e4f, -1e4f};
  std::mt19937 rng(18);
  std::uniform_real_distribution<float> dist(-8.f, 8.f);
  for (int i = 0; i < 1000; ++i) x.push_back(dist(rng));
  return x;
}

std::vector<float> Apply(void (*fn)(const FusedActivationSpec&, float*, int64_t), const Row& row,
                         std::vector<float> x) {
  fn(SpecOf(row.kind), x.data(), static_cast<int64_t>(x.size()));
  return x;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 const std::vector<float>& x) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-6 * std::max(1.f, std::fabs(want[i]))) << "x = " << x[i];
  }
}

// The graph a fusion replaces with the row's activation, run by the CPU reference evaluator on
// x: the source op, or the pattern / attribute form passes/activation.cc turns into the kind.
std::vector<float> Unfused(const Row& row, const std::vector<float>& x) {
  Graph g;
  const int64_t n = static_cast<int64_t>(x.size());
  Value* in = g.AddInput("x", DataType::kFloat32, {n});
  Value* y = g.AddValue("y");
  std::map<std::string, Tensor> inputs = {
      {"x", Tensor::FromVector<float>(DataType::kFloat32, {n}, x)}};
  switch (row.kind) {
    case FusedActivation::kNone:
      return x;
    case FusedActivation::kClip: {
      Value* lo = g.AddInput("lo", DataType::kFloat32, {});
      Value* hi = g.AddInput("hi", DataType::kFloat32, {});
      inputs["lo"] = Tensor::FromVector<float>(DataType::kFloat32, {}, {kClipLo});
      inputs["hi"] = Tensor::FromVector<float>(DataType::kFloat32, {}, {kClipHi});
      g.AddNode("Clip", "clip", {in, lo, hi}, {y});
      break;
    }
    case FusedActivation::kSilu: {
      Value* s = g.AddValue("s");
      g.AddNode("Sigmoid", "sigmoid", {in}, {s});
      g.AddNode("Mul", "mul", {in, s}, {y});
      break;
    }
    case FusedActivation::kSwish: {
      Value* alpha = g.AddInput("alpha", DataType::kFloat32, {});
      inputs["alpha"] = Tensor::FromVector<float>(DataType::kFloat32, {}, {kSwishAlpha});
      Value* ax = g.AddValue("ax");
      Value* s = g.AddValue("s");
      g.AddNode("Mul", "scale", {in, alpha}, {ax});
      g.AddNode("Sigmoid", "sigmoid", {ax}, {s});
      g.AddNode("Mul", "mul", {in, s}, {y});
      break;
    }
    case FusedActivation::kGeluTanh: {
      AttributeMap attrs;
      attrs.Set("approximate", std::string("tanh"));
      g.AddNode("Gelu", "gelu", {in}, {y}, attrs);
      break;
    }
    default:
      // Every other row names its source op; a new pattern row needs its unfused form above.
      EXPECT_FALSE(row.source.empty()) << row.name << " has no unfused form in this test";
      if (row.source.empty()) return {};
      g.AddNode(std::string(row.source), "act", {in}, {y});
      break;
  }
  g.MarkOutput(y);
  auto out = EvaluateGraph(g, inputs);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  if (!out.ok()) return {};
  return out->at("y").ToFloatVector();
}

TEST(FusedActivation, EveryRowHasAnEpilogueThatEqualsItsListedFormula) {
  const std::vector<float> x = Inputs();
  for (const Row& row : kRows) {
    SCOPED_TRACE(std::string(row.name));
    const std::vector<float> listed = Apply(ApplyListedActivation, row, x);
    ExpectClose(Apply(ApplyActivation, row, x), listed, x);
    // The listed formula is the activation, not a pass-through (None excepted).
    if (row.kind != FusedActivation::kNone) {
      EXPECT_NE(listed, x);
    }
  }
}

TEST(FusedActivation, EveryRowEqualsTheUnfusedOps) {
  const std::vector<float> x = Inputs();
  for (const Row& row : kRows) {
    SCOPED_TRACE(std::string(row.name));
    const std::vector<float> unfused = Unfused(row, x);
    ASSERT_EQ(unfused.size(), x.size());
    ExpectClose(Apply(ApplyListedActivation, row, x), unfused, x);
    ExpectClose(Apply(ApplyActivation, row, x), unfused, x);
  }
}

// The list and the ops' kEpilogue trait agree: each source op is an epilogue op, and every
// epilogue op is some row's source (the passes absorb exactly those ops).
TEST(FusedActivation, SourcesAreTheEpilogueOps) {
  for (const Row& row : kRows) {
    if (row.source.empty()) continue;
    SCOPED_TRACE(std::string(row.name));
    std::optional<OpType> op = LookupOpType(row.source);
    ASSERT_TRUE(op.has_value());
    EXPECT_TRUE(HasTrait(*op, op_traits::kEpilogue));
  }
  for (const OpSchema& s : AllOpSchemas()) {
    if (!HasTrait(s.type, op_traits::kEpilogue)) continue;
    SCOPED_TRACE(std::string(s.name));
    EXPECT_TRUE(FusedActivationOf(s.type).has_value());
  }
}

// The oneDNN convolution and INT8 tactics hand the activation to oneDNN's post-ops
// (onednn_common.cc OneDnnEltwise): every kind but None needs one there, or those tactics would
// leave the activation out.
TEST(FusedActivation, EveryKindHasAOneDnnPostOp) {
  for (const Row& row : kRows) {
    SCOPED_TRACE(std::string(row.name));
    float alpha = 0, beta = 0;
    EXPECT_EQ(OneDnnEltwise(SpecOf(row.kind), &alpha, &beta).has_value(),
              row.kind != FusedActivation::kNone);
  }
}

}  // namespace
}  // namespace kiln::cpu
