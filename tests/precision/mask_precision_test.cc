// Attention masks under --fp16: a mask's huge negative values (exporters write finfo.min or
// -1e9 where a key is hidden) do not keep the layer FP32; they saturate to FP16's lowest finite
// value, and the engine's outputs still match FP32 within the FP16 tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kiln/backends/cpu/cpu_eval.h"
#include "kiln/builder/builder.h"
#include "kiln/ops/op_schema.h"
#include "kiln/precision/precision.h"
#include "tests/precision/test_util.h"

namespace kiln::precision {
namespace {

using kiln::testing::F32;
using kiln::testing::Random;
using kiln::testing::RelL2;

const LayerReport* FindLayer(const BuildReport& r, const std::string& name) {
  for (const auto& l : r.layer_reports) {
    if (l.name == name) return &l;
  }
  return nullptr;
}

BuilderConfig Fp16() {
  BuilderConfig c;
  c.fp16 = true;
  c.deadline = std::chrono::milliseconds(1);
  c.optimize = false;
  return c;
}

// Q, K, V [1, 2, 6, 8]; mask [1, 1, 6, 6] with FP32's lowest above the diagonal (HF's causal
// mask as a constant) -> Attention(additive).
std::unique_ptr<Graph> MaskedAttention() {
  auto g = std::make_unique<Graph>();
  std::vector<float> m(36);
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 6; ++j) m[i * 6 + j] = j <= i ? 0.f : std::numeric_limits<float>::lowest();
  }
  Value* q = g->AddInput("q", DataType::kFloat32, MakeShape({1, 2, 6, 8}));
  Value* mask = g->AddConstant("mask", F32({1, 1, 6, 6}, m));
  Value* y = g->AddValue("y");
  AttributeMap a;
  a.Set("mask_kind", std::string("additive"));
  g->AddNode("Attention", "attn", {q, q, q, mask}, {y}, a);
  g->MarkOutput(y);
  EXPECT_TRUE(InferShapes(*g).ok());
  return g;
}

// Where(keep, scores, -1e9) -> Softmax, as older exporters write it.
std::unique_ptr<Graph> WhereFill(float fill) {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, MakeShape({2, 6, 6}));
  std::vector<uint8_t> keep(36);
  for (int i = 0; i < 6; ++i) {
    for (int j = 0; j < 6; ++j) keep[i * 6 + j] = j <= i;
  }
  Value* cond = g->AddConstant("keep", Tensor::FromVector<uint8_t>(DataType::kBool, {6, 6}, keep));
  Value* w = g->AddValue("w");
  Value* y = g->AddValue("y");
  g->AddNode("Where", "where", {cond, x, g->AddConstant("fill", F32({}, {fill}))}, {w});
  AttributeMap a;
  a.Set("axis", int64_t{-1});
  g->AddNode("Softmax", "softmax", {w}, {y}, a);
  g->MarkOutput(y);
  EXPECT_TRUE(InferShapes(*g).ok());
  return g;
}

TEST(PrecisionMasks, AdditiveAttentionMaskBeyondFp16StaysFp16) {
  auto g = MaskedAttention();
  std::map<std::string, Tensor> in = {{"q", F32({1, 2, 6, 8}, Random(96, 3))}};
  auto ref = cpu::EvaluateGraph(*g, in);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  BuildReport report;
  std::unique_ptr<EngineDesc> engine;
  auto out = kiln::testing::BuildAndRun(std::move(g), Fp16(), in, &report, &engine);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const LayerReport* attn = FindLayer(report, "attn");
  ASSERT_NE(attn, nullptr);
  EXPECT_EQ(attn->precision, "f16") << attn->precision_reason;
  // The mask reached the engine saturated (finite), not as -inf.
  bool found = false;
  for (const Value* v : engine->graph->values()) {
    if (!v->constant() || v->dtype() != DataType::kFloat16 || v->constant()->num_elements() != 36) {
      continue;
    }
    found = true;
    EXPECT_EQ(v->constant()->GetDouble(1), -65504.0);  // row 0, key 1: hidden
    EXPECT_EQ(v->constant()->GetDouble(0), 0.0);
  }
  EXPECT_TRUE(found);
  EXPECT_LT(RelL2(out->at("y"), ref->at("y")), 2e-2);
}

TEST(PrecisionMasks, WhereFillIsAMaskButAnOrdinaryHugeValueIsNot) {
  for (float fill : {std::numeric_limits<float>::lowest(), 1e9f}) {
    SCOPED_TRACE(fill);
    auto g = WhereFill(fill);
    std::map<std::string, Tensor> in = {{"x", F32({2, 6, 6}, Random(72, 5))}};
    auto ref = cpu::EvaluateGraph(*g, in);
    ASSERT_TRUE(ref.ok());
    BuildReport report;
    auto out = kiln::testing::BuildAndRun(std::move(g), Fp16(), in, &report, nullptr);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    const LayerReport* where = FindLayer(report, "where");
    ASSERT_NE(where, nullptr);
    if (fill < 0) {
      EXPECT_EQ(where->precision, "f16") << where->precision_reason;
      EXPECT_LT(RelL2(out->at("y"), ref->at("y")), 2e-2);
    } else {  // +1e9 is data, not a mask: FP32 with the range guard's reason
      EXPECT_EQ(where->precision, "f32");
      EXPECT_NE(where->precision_reason.find("beyond the FP16 range"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace kiln::precision
