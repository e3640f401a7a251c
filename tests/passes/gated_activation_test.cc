// The gated-activation fusion on the gated MLPs exporters emit (Llama's SwiGLU with SiLU as
// x * Sigmoid(x), GeGLU with a Gelu op): one GatedActivation, the projections still fused by
// gemm_fusion, the same outputs on fresh random inputs. A plain SiLU, a broadcast Mul
// (squeeze-excite) and a constant scale stay unfused.
#include <gtest/gtest.h>

#include "pass_test_util.h"

namespace kiln::passes {
namespace {

using namespace testing;

// down(act(x @ Wg) * (x @ Wu)), x [n, 5, 16], hidden 24.
void GatedMlp(Graph& g, const std::string& act) {
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 5, 16});
  Value* gate = Op(g, "MatMul", {x, Const(g, RandomTensor(DataType::kFloat32, {16, 24}, 1))});
  Value* up = Op(g, "MatMul", {x, Const(g, RandomTensor(DataType::kFloat32, {16, 24}, 2))});
  Value* a = nullptr;
  if (act == "silu") {
    a = Op(g, "Mul", {gate, Op(g, "Sigmoid", {gate})});
  } else if (act == "swish") {
    a = Op(g, "Mul", {gate, Op(g, "Sigmoid", {Op(g, "Mul", {Const(g, Scalar(0.75f)), gate})})});
  } else {
    a = Op(g, "Gelu", {gate}, Attrs(std::pair{"approximate", std::string(act)}));
  }
  Value* h = Op(g, "Mul", {up, a});
  g.MarkOutput(Op(g, "MatMul", {h, Const(g, RandomTensor(DataType::kFloat32, {24, 16}, 3))}));
}

std::vector<std::unique_ptr<Pass>> Passes() {
  std::vector<std::unique_ptr<Pass>> p;
  p.push_back(MakeGatedActivationFusionPass());
  p.push_back(MakeGemmFusionPass());
  p.push_back(MakeDeadNodeEliminationPass());
  return p;
}

TEST(GatedActivationFusion, SwiGluAndGeGlu) {
  for (const char* act : {"silu", "swish", "none", "tanh"}) {
    SCOPED_TRACE(act);
    Graph before, after;
    GatedMlp(before, act);
    GatedMlp(after, act);
    PassReport r = RunPasses(after, Passes());
    EXPECT_EQ(r.rewrites("gated_activation_fusion"), 1);
    ASSERT_EQ(CountOps(after, "GatedActivation"), 1);
    EXPECT_EQ(CountOps(after, "Sigmoid"), 0);
    EXPECT_EQ(CountOps(after, "Gelu"), 0);
    EXPECT_EQ(CountOps(after, "Mul"), 0);
    for (Node* n : after.nodes()) {
      if (n->op_type() != "GatedActivation") continue;
      std::string want = std::string(act) == "silu"    ? "silu"
                         : std::string(act) == "swish" ? "swish"
                         : std::string(act) == "none"  ? "gelu"
                                                       : "gelu_tanh";
      EXPECT_EQ(n->attrs().GetString("activation", ""), want);
      if (want == "swish") {
        EXPECT_FLOAT_EQ(n->attrs().GetFloat("activation_alpha", 0.f), 0.75f);
      }
      // The projections feed it directly (their activation stays unfused into them).
      for (Value* in : n->inputs()) {
        ASSERT_TRUE(in->producer());
        EXPECT_EQ(in->producer()->attrs().GetString("activation", ""), "");
      }
    }
    ExpectSameOutputs(before, after, {{"n", 2}}, 1e-5, 31);
  }
}

// After gemm_fusion the gate and up projections (one input, constant weights) merge into one
// GEMM of twice the width, read packed.
TEST(GatedActivationFusion, GateAndUpBecomeOneGemm) {
  Graph before, after;
  GatedMlp(before, "silu");
  GatedMlp(after, "silu");
  auto passes = Passes();
  passes.push_back(MakeGatedProjectionMergePass());
  passes.push_back(MakeDeadNodeEliminationPass());
  PassReport r = RunPasses(after, std::move(passes));
  EXPECT_EQ(r.rewrites("gated_projection_merge"), 1);
  ASSERT_EQ(CountOps(after, "GatedActivation"), 1);
  EXPECT_EQ(CountOps(after, "FusedMatMul") + CountOps(after, "MatMul"), 2);  // gate+up, down
  for (Node* n : after.nodes()) {
    if (n->op_type() != "GatedActivation") continue;
    ASSERT_EQ(n->num_inputs(), 1u);
    const Value* packed = n->input(0);
    ASSERT_EQ(packed->shape().size(), 3u);
    EXPECT_EQ(packed->shape()[2], Dim(48));
    EXPECT_EQ(n->output(0)->shape()[2], Dim(24));
  }
  ExpectSameOutputs(before, after, {{"n", 3}}, 1e-5, 41);
}

// CLIP's MLP: fc2(quick_gelu(fc1(x))), quick_gelu(h) = h * Sigmoid(1.702 * h). The Swish is no
// gate (its Mul's other input is the Sigmoid's own input, scaled): it becomes fc1's epilogue,
// with the alpha, and the Mul-Sigmoid-Mul chain is gone.
void QuickGeluMlp(Graph& g, bool scale_first) {
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 5, 16});
  Value* h = Op(g, "Add",
                {Op(g, "MatMul", {x, Const(g, RandomTensor(DataType::kFloat32, {16, 24}, 7))}),
                 Const(g, RandomTensor(DataType::kFloat32, {24}, 8))});
  Value* c = Const(g, Scalar(1.702f));
  Value* scaled = scale_first ? Op(g, "Mul", {c, h}) : Op(g, "Mul", {h, c});
  Value* a = scale_first ? Op(g, "Mul", {Op(g, "Sigmoid", {scaled}), h})
                         : Op(g, "Mul", {h, Op(g, "Sigmoid", {scaled})});
  g.MarkOutput(Op(g, "MatMul", {a, Const(g, RandomTensor(DataType::kFloat32, {24, 16}, 9))}));
}

TEST(GatedActivationFusion, QuickGeluIsAnEpilogueNotAGate) {
  for (bool scale_first : {false, true}) {
    SCOPED_TRACE(scale_first);
    Graph before, after;
    QuickGeluMlp(before, scale_first);
    QuickGeluMlp(after, scale_first);
    PassReport r = RunPasses(after, Passes());
    EXPECT_EQ(r.rewrites("gated_activation_fusion"), 0);
    EXPECT_EQ(CountOps(after, "GatedActivation"), 0);
    EXPECT_EQ(CountOps(after, "Sigmoid"), 0);
    EXPECT_EQ(CountOps(after, "Mul"), 0);
    int swish = 0;
    for (Node* n : after.nodes()) {
      if (n->attrs().GetString("activation", "") != "swish") continue;
      ++swish;
      EXPECT_FLOAT_EQ(n->attrs().GetFloat("activation_alpha", 0.f), 1.702f);
    }
    EXPECT_EQ(swish, 1);
    ExpectSameOutputs(before, after, {{"n", 2}}, 1e-5, 43);
  }
}

// A Swish whose scale is not one constant splat stays as it is (no alpha to carry).
TEST(GatedActivationFusion, SwishWithPerElementScaleStays) {
  Graph before, after;
  for (Graph* g : {&before, &after}) {
    Value* x = g->AddInput("x", DataType::kFloat32, {2, 24});
    Value* h = Op(*g, "MatMul", {x, Const(*g, RandomTensor(DataType::kFloat32, {24, 24}, 11))});
    Value* c = Const(*g, RandomTensor(DataType::kFloat32, {24}, 12));
    g->MarkOutput(Op(*g, "Mul", {h, Op(*g, "Sigmoid", {Op(*g, "Mul", {h, c})})}));
  }
  RunPasses(after, Passes());
  for (Node* n : after.nodes()) EXPECT_NE(n->attrs().GetString("activation", ""), "swish");
  ExpectSameOutputs(before, after, {}, 1e-5, 44);
}

TEST(GatedActivationFusion, PlainSiluBroadcastAndConstantsStay) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {2, 8, 4, 4});
  Value* silu = Op(g, "Mul", {x, Op(g, "Sigmoid", {x})});
  // Squeeze-excite: a per-channel sigmoid scale broadcast over the spatial dims.
  Value* pooled = Op(g, "ReduceMean", {silu, Const(g, Ints({2, 3}))});
  Value* se = Op(g, "Mul", {silu, Op(g, "Sigmoid", {pooled})});
  // A constant times an activation is a scaled activation, not a gate.
  Value* scaled = Op(
      g, "Mul", {Op(g, "Relu", {se}), Const(g, RandomTensor(DataType::kFloat32, {2, 8, 4, 4}, 5))});
  g.MarkOutput(scaled);
  PassReport r = RunPasses(g, [] {
    std::vector<std::unique_ptr<Pass>> p;
    p.push_back(MakeGatedActivationFusionPass());
    return p;
  }());
  EXPECT_EQ(r.rewrites("gated_activation_fusion"), 0);
  EXPECT_EQ(CountOps(g, "GatedActivation"), 0);
}

}  // namespace
}  // namespace kiln::passes
