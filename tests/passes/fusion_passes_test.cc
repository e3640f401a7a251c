// Fusions: Conv+BatchNormalization folding, Gemm/MatMul + bias + activation, Conv + bias +
// residual + activation, LayerNormalization and GELU patterns. Graphs are written in the shapes
// the zoo's exporters produce (see zoo/README.md); each test checks that the rewrite happened, that
// outputs agree before and after, and a negative case (an intermediate read elsewhere, an op
// in the wrong place) that must not fuse.
#include <gtest/gtest.h>

#include "pass_test_util.h"

namespace kiln::passes {
namespace {

using namespace testing;

using Passes = std::vector<std::unique_ptr<Pass>>;

Passes Just(std::unique_ptr<Pass> p) {
  Passes v;
  v.push_back(std::move(p));
  v.push_back(MakeDeadNodeEliminationPass());
  return v;
}

AttributeMap ConvAttrs() {
  return Attrs(std::pair{"kernel_shape", std::vector<int64_t>{3, 3}},
               std::pair{"pads", std::vector<int64_t>{1, 1, 1, 1}});
}

// ---- Conv + BatchNormalization

enum class BnInput { kConv, kConvWithSecondReader, kRelu };

void ConvBn(Graph& g, BnInput where) {
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 3, 8, 8});
  Value* w = Const(g, RandomTensor(DataType::kFloat32, {4, 3, 3, 3}, 11));
  Value* b = Const(g, RandomTensor(DataType::kFloat32, {4}, 12));
  Value* c = Op(g, "Conv", {x, w, b}, ConvAttrs());
  if (where == BnInput::kRelu) c = Op(g, "Relu", {c});
  if (where == BnInput::kConvWithSecondReader) g.MarkOutput(c);
  Value* y = Op(g, "BatchNormalization",
                {c, Const(g, RandomTensor(DataType::kFloat32, {4}, 13)),
                 Const(g, RandomTensor(DataType::kFloat32, {4}, 14)),
                 Const(g, RandomTensor(DataType::kFloat32, {4}, 15)),
                 Const(g, RandomTensor(DataType::kFloat32, {4}, 16, 0.5, 1.5))},
                Attrs(std::pair{"epsilon", 1e-3f}));
  g.MarkOutput(y);
}

TEST(ConvBatchNormFolding, FoldsIntoTheConvWeightsAndBias) {
  Graph before, after;
  ConvBn(before, BnInput::kConv);
  ConvBn(after, BnInput::kConv);
  PassReport r = RunPasses(after, Just(MakeConvBatchNormFoldingPass()));
  EXPECT_EQ(r.rewrites("conv_bn_folding"), 1);
  EXPECT_EQ(CountOps(after, "BatchNormalization"), 0);
  EXPECT_EQ(CountOps(after, "Conv"), 1);
  ExpectSameOutputs(before, after, {{"n", 2}});
}

TEST(ConvBatchNormFolding, ABatchNormAfterAnotherOpStays) {
  Graph g;
  ConvBn(g, BnInput::kRelu);
  RunPasses(g, Just(MakeConvBatchNormFoldingPass()));
  EXPECT_EQ(CountOps(g, "BatchNormalization"), 1);
}

TEST(ConvBatchNormFolding, AConvOutputReadElsewhereStays) {
  Graph g;
  ConvBn(g, BnInput::kConvWithSecondReader);
  RunPasses(g, Just(MakeConvBatchNormFoldingPass()));
  EXPECT_EQ(CountOps(g, "BatchNormalization"), 1);
}

void ConvTransposeBn(Graph& g, int64_t group) {
  // W is [C_in, C_out / group, k, k]: the BN channel is W's dim 1 within each group.
  Value* x = g.AddInput("x", DataType::kFloat32, {1, 4, 5, 5});
  Value* w = Const(g, RandomTensor(DataType::kFloat32, {4, 3, 2, 2}, 17));
  Value* c = Op(g, "ConvTranspose", {x, w},
                Attrs(std::pair{"kernel_shape", std::vector<int64_t>{2, 2}},
                      std::pair{"strides", std::vector<int64_t>{2, 2}}, std::pair{"group", group}));
  int64_t m = 3 * group;
  Value* y = Op(g, "BatchNormalization",
                {c, Const(g, RandomTensor(DataType::kFloat32, {m}, 13)),
                 Const(g, RandomTensor(DataType::kFloat32, {m}, 14)),
                 Const(g, RandomTensor(DataType::kFloat32, {m}, 15)),
                 Const(g, RandomTensor(DataType::kFloat32, {m}, 16, 0.5, 1.5))});
  g.MarkOutput(y);
}

class ConvTransposeBnTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(ConvTransposeBnTest, FoldsPerOutputChannelWithinGroups) {
  Graph before, after;
  ConvTransposeBn(before, GetParam());
  ConvTransposeBn(after, GetParam());
  RunPasses(after, Just(MakeConvBatchNormFoldingPass()));
  EXPECT_EQ(CountOps(after, "BatchNormalization"), 0);
  EXPECT_EQ(CountOps(after, "ConvTranspose"), 1);
  ExpectSameOutputs(before, after);
}

INSTANTIATE_TEST_SUITE_P(Groups, ConvTransposeBnTest, ::testing::Values(1, 2));

// ---- MatMul / Gemm + bias + activation

void MatMulBiasRelu(Graph& g, bool second_reader) {
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 5, 8});
  Value* mm = Op(g, "MatMul", {x, Const(g, RandomTensor(DataType::kFloat32, {8, 6}, 21))});
  // Bias first, as BERT's exporter writes it.
  Value* add = Op(g, "Add", {Const(g, RandomTensor(DataType::kFloat32, {6}, 22)), mm});
  g.MarkOutput(Op(g, "Relu", {add}));
  if (second_reader) g.MarkOutput(mm);
}

TEST(GemmFusion, MatMulBiasReluBecomesFusedMatMul) {
  Graph before, after;
  MatMulBiasRelu(before, false);
  MatMulBiasRelu(after, false);
  PassReport r = RunPasses(after, Just(MakeGemmFusionPass()));
  EXPECT_EQ(r.rewrites("gemm_fusion"), 1);
  ASSERT_EQ(after.num_nodes(), 1u);
  Node* n = after.nodes()[0];
  EXPECT_EQ(n->op_type(), "FusedMatMul");
  EXPECT_EQ(n->attrs().GetString("activation", ""), "relu");
  EXPECT_EQ(n->num_inputs(), 3u);
  ExpectSameOutputs(before, after, {{"n", 2}});
}

TEST(GemmFusion, AMatMulReadElsewhereFusesOnlyWhatIsPrivate) {
  Graph g;
  MatMulBiasRelu(g, true);
  RunPasses(g, Just(MakeGemmFusionPass()));
  EXPECT_EQ(CountOps(g, "FusedMatMul"), 0);
  EXPECT_EQ(CountOps(g, "MatMul"), 1);
}

void GemmBiasSigmoid(Graph& g) {
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 8});
  Value* gm = Op(g, "Gemm", {x, Const(g, RandomTensor(DataType::kFloat32, {6, 8}, 31))},
                 Attrs(std::pair{"transB", int64_t{1}}));
  Value* add = Op(g, "Add", {gm, Const(g, RandomTensor(DataType::kFloat32, {6}, 32))});
  g.MarkOutput(Op(g, "Sigmoid", {add}));
}

TEST(GemmFusion, GemmPlusBiasPlusSigmoidBecomesFusedGemm) {
  Graph before, after;
  GemmBiasSigmoid(before);
  GemmBiasSigmoid(after);
  RunPasses(after, Just(MakeGemmFusionPass()));
  ASSERT_EQ(after.num_nodes(), 1u);
  Node* n = after.nodes()[0];
  EXPECT_EQ(n->op_type(), "FusedGemm");
  EXPECT_EQ(n->attrs().GetString("activation", ""), "sigmoid");
  EXPECT_EQ(n->attrs().GetInt("transB", 0), 1);
  ExpectSameOutputs(before, after, {{"n", 3}});
}

void Gpt2Mlp(Graph& g) {
  // HF GPT-2 Conv1D: Reshape to 2-D, Gemm with bias, Reshape back, then the activation.
  Value* x = g.AddInput("x", DataType::kFloat32, {2, 3, 8});
  Value* flat = Op(g, "Reshape", {x, Const(g, Ints({-1, 8}))});
  Value* gm = Op(g, "Gemm",
                 {flat, Const(g, RandomTensor(DataType::kFloat32, {8, 6}, 33)),
                  Const(g, RandomTensor(DataType::kFloat32, {6}, 34))});
  Value* back = Op(g, "Reshape", {gm, Const(g, Ints({2, 3, 6}))});
  g.MarkOutput(Op(g, "Gelu", {back}, Attrs(std::pair{"approximate", std::string("tanh")})));
}

TEST(GemmFusion, AnActivationAfterAReshapeMovesIntoTheGemm) {
  Graph before, after;
  Gpt2Mlp(before);
  Gpt2Mlp(after);
  RunPasses(after, Just(MakeGemmFusionPass()));
  EXPECT_EQ(CountOps(after, "Gelu"), 0);
  EXPECT_EQ(CountOps(after, "Gemm"), 0);
  EXPECT_EQ(CountOps(after, "Reshape"), 2);
  Node* fused = nullptr;
  for (Node* n : after.nodes()) {
    if (n->op_type() == "FusedGemm") fused = n;
  }
  ASSERT_NE(fused, nullptr);
  EXPECT_EQ(fused->attrs().GetString("activation", ""), "gelu_tanh");
  ExpectSameOutputs(before, after);
}

// ---- Conv + bias + residual + activation

void ResidualBlockTail(Graph& g) {
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 4, 8, 8});
  Value* c = Op(g, "Conv",
                {x, Const(g, RandomTensor(DataType::kFloat32, {4, 4, 3, 3}, 41)),
                 Const(g, RandomTensor(DataType::kFloat32, {4}, 42))},
                ConvAttrs());
  g.MarkOutput(Op(g, "Relu", {Op(g, "Add", {x, c})}));
}

TEST(ConvFusion, ConvPlusResidualPlusReluBecomesFusedConv) {
  Graph before, after;
  ResidualBlockTail(before);
  ResidualBlockTail(after);
  PassReport r = RunPasses(after, Just(MakeConvFusionPass()));
  EXPECT_EQ(r.rewrites("conv_fusion"), 1);
  ASSERT_EQ(after.num_nodes(), 1u);
  Node* n = after.nodes()[0];
  EXPECT_EQ(n->op_type(), "FusedConv");
  EXPECT_EQ(n->num_inputs(), 4u);
  EXPECT_EQ(n->input(3)->name(), "x");
  EXPECT_EQ(n->attrs().GetString("activation", ""), "relu");
  ExpectSameOutputs(before, after, {{"n", 2}});
}

void ConvSilu(Graph& g) {
  Value* x = g.AddInput("x", DataType::kFloat32, {1, 3, 8, 8});
  Value* c =
      Op(g, "Conv", {x, Const(g, RandomTensor(DataType::kFloat32, {4, 3, 3, 3}, 51))}, ConvAttrs());
  Value* biased = Op(g, "Add", {c, Const(g, RandomTensor(DataType::kFloat32, {4, 1, 1}, 52))});
  g.MarkOutput(Op(g, "Mul", {biased, Op(g, "Sigmoid", {biased})}));
}

TEST(ConvFusion, PerChannelAddAndSiluFold) {
  Graph before, after;
  ConvSilu(before);
  ConvSilu(after);
  RunPasses(after, Just(MakeConvFusionPass()));
  ASSERT_EQ(after.num_nodes(), 1u);
  Node* n = after.nodes()[0];
  EXPECT_EQ(n->op_type(), "FusedConv");
  EXPECT_EQ(n->attrs().GetString("activation", ""), "silu");
  ASSERT_NE(n->input(2), nullptr);
  EXPECT_EQ(n->input(2)->constant()->dims(), (std::vector<int64_t>{4}));
  ExpectSameOutputs(before, after);
}

// ---- LayerNormalization

enum class LnForm { kPowDiv, kMulReciprocal, kSubReadElsewhere };

void DecomposedLayerNorm(Graph& g, LnForm form) {
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 5, 16});
  Value* axes = Const(g, Ints({-1}));
  Value* mean = Op(g, "ReduceMean", {x, axes});
  Value* d = Op(g, "Sub", {x, mean});
  Value* sq = form == LnForm::kMulReciprocal ? Op(g, "Mul", {d, d})
                                             : Op(g, "Pow", {d, Const(g, Scalar(2.f))});
  Value* var = Op(g, "ReduceMean", {sq, axes});
  Value* sd = Op(g, "Sqrt", {Op(g, "Add", {var, Const(g, Scalar(1e-5f))})});
  Value* n = form == LnForm::kMulReciprocal ? Op(g, "Mul", {d, Op(g, "Reciprocal", {sd})})
                                            : Op(g, "Div", {d, sd});
  Value* gamma = Const(g, RandomTensor(DataType::kFloat32, {16}, 61));
  Value* beta = Const(g, RandomTensor(DataType::kFloat32, {16}, 62));
  g.MarkOutput(Op(g, "Add", {beta, Op(g, "Mul", {gamma, n})}));
  if (form == LnForm::kSubReadElsewhere) g.MarkOutput(d);
}

class LayerNormFusionTest : public ::testing::TestWithParam<LnForm> {};

TEST_P(LayerNormFusionTest, DecomposedFormBecomesLayerNormalization) {
  Graph before, after;
  DecomposedLayerNorm(before, GetParam());
  DecomposedLayerNorm(after, GetParam());
  RunPasses(after, Just(MakeLayerNormFusionPass()));
  ASSERT_EQ(after.num_nodes(), 1u);
  Node* n = after.nodes()[0];
  EXPECT_EQ(n->op_type(), "LayerNormalization");
  EXPECT_EQ(n->attrs().GetInt("axis", 0), -1);
  EXPECT_FLOAT_EQ(n->attrs().GetFloat("epsilon", 0), 1e-5f);
  ExpectSameOutputs(before, after, {{"n", 3}});
}

INSTANTIATE_TEST_SUITE_P(Forms, LayerNormFusionTest,
                         ::testing::Values(LnForm::kPowDiv, LnForm::kMulReciprocal));

TEST(LayerNormFusion, ADifferenceReadElsewhereDoesNotFuse) {
  Graph g;
  DecomposedLayerNorm(g, LnForm::kSubReadElsewhere);
  RunPasses(g, Just(MakeLayerNormFusionPass()));
  EXPECT_EQ(CountOps(g, "LayerNormalization"), 0);
  EXPECT_EQ(CountOps(g, "ReduceMean"), 2);
}

// ---- GELU

enum class GeluForm { kErfTorch, kErfHalfFirst, kTanhGpt2, kTanhBloom, kErfReadElsewhere };

void DecomposedGelu(Graph& g, GeluForm form) {
  Value* in = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 32});
  Value* x = Op(g, "Add", {in, Const(g, RandomTensor(DataType::kFloat32, {32}, 71))});
  Value* y = nullptr;
  switch (form) {
    case GeluForm::kErfTorch:
    case GeluForm::kErfReadElsewhere: {  // (x * (erf(x / sqrt2) + 1)) * 0.5, as PyTorch exports
      Value* e = Op(g, "Erf", {Op(g, "Div", {x, Const(g, Scalar(1.4142135f))})});
      if (form == GeluForm::kErfReadElsewhere) g.MarkOutput(e);
      y = Op(g, "Mul",
             {Op(g, "Mul", {x, Op(g, "Add", {e, Const(g, Scalar(1.f))})}), Const(g, Scalar(0.5f))});
      break;
    }
    case GeluForm::kErfHalfFirst: {  // (0.5 * x) * (1 + erf(x * 1/sqrt2))
      Value* e = Op(g, "Erf", {Op(g, "Mul", {Const(g, Scalar(0.70710678f)), x})});
      y = Op(g, "Mul",
             {Op(g, "Mul", {Const(g, Scalar(0.5f)), x}), Op(g, "Add", {Const(g, Scalar(1.f)), e})});
      break;
    }
    case GeluForm::kTanhGpt2: {  // HF gelu_new: 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3)))
      Value* half_x = Op(g, "Mul", {x, Const(g, Scalar(0.5f))});
      Value* cube = Op(g, "Pow", {x, Const(g, Scalar(3.f))});
      Value* inner = Op(g, "Add", {x, Op(g, "Mul", {cube, Const(g, Scalar(0.044715f))})});
      Value* t = Op(g, "Tanh", {Op(g, "Mul", {inner, Const(g, Scalar(0.7978845608f))})});
      y = Op(g, "Mul", {half_x, Op(g, "Add", {t, Const(g, Scalar(1.f))})});
      break;
    }
    case GeluForm::kTanhBloom: {  // x*0.5*(1.0+tanh(0.79788456*x*(1+0.044715*x*x)))
      Value* half_x = Op(g, "Mul", {x, Const(g, Scalar(0.5f))});
      Value* sq = Op(g, "Mul", {Op(g, "Mul", {Const(g, Scalar(0.044715f)), x}), x});
      Value* arg = Op(g, "Mul",
                      {Op(g, "Mul", {Const(g, Scalar(0.79788456f)), x}),
                       Op(g, "Add", {Const(g, Scalar(1.f)), sq})});
      y = Op(g, "Mul", {half_x, Op(g, "Add", {Const(g, Scalar(1.f)), Op(g, "Tanh", {arg})})});
      break;
    }
  }
  g.MarkOutput(y);
}

class GeluFusionTest : public ::testing::TestWithParam<GeluForm> {};

TEST_P(GeluFusionTest, DecomposedFormBecomesGelu) {
  Graph before, after;
  DecomposedGelu(before, GetParam());
  DecomposedGelu(after, GetParam());
  RunPasses(after, Just(MakeGeluFusionPass()));
  ASSERT_EQ(after.num_nodes(), 2u);  // the Add that makes x, and the Gelu
  EXPECT_EQ(CountOps(after, "Gelu"), 1);
  bool tanh = GetParam() == GeluForm::kTanhGpt2 || GetParam() == GeluForm::kTanhBloom;
  for (Node* n : after.nodes()) {
    if (n->op_type() == "Gelu") {
      EXPECT_EQ(n->attrs().GetString("approximate", ""), tanh ? "tanh" : "none");
    }
  }
  ExpectSameOutputs(before, after, {{"n", 4}});
}

INSTANTIATE_TEST_SUITE_P(Forms, GeluFusionTest,
                         ::testing::Values(GeluForm::kErfTorch, GeluForm::kErfHalfFirst,
                                           GeluForm::kTanhGpt2, GeluForm::kTanhBloom));

TEST(GeluFusion, AnErfReadElsewhereDoesNotFuse) {
  Graph g;
  DecomposedGelu(g, GeluForm::kErfReadElsewhere);
  RunPasses(g, Just(MakeGeluFusionPass()));
  EXPECT_EQ(CountOps(g, "Gelu"), 0);
  EXPECT_EQ(CountOps(g, "Erf"), 1);
}

TEST(GeluFusion, ThenMatMulBiasGeluBecomesOneFusedMatMul) {
  // The default pipeline: GELU fusion first, then MatMul + bias + Gelu.
  auto build = [](Graph& g) {
    Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 8});
    Value* mm = Op(g, "MatMul", {x, Const(g, RandomTensor(DataType::kFloat32, {8, 16}, 81))});
    Value* h = Op(g, "Add", {Const(g, RandomTensor(DataType::kFloat32, {16}, 82)), mm});
    Value* e = Op(g, "Erf", {Op(g, "Div", {h, Const(g, Scalar(1.4142135f))})});
    g.MarkOutput(
        Op(g, "Mul",
           {Op(g, "Mul", {h, Op(g, "Add", {e, Const(g, Scalar(1.f))})}), Const(g, Scalar(0.5f))}));
  };
  Graph before, after;
  build(before);
  build(after);
  auto r = RunDefaultPasses(after, TestOptions());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->rewrites("gelu_fusion"), 1);
  EXPECT_EQ(r->rewrites("gemm_fusion"), 1);
  ASSERT_EQ(after.num_nodes(), 1u);
  EXPECT_EQ(after.nodes()[0]->op_type(), "FusedMatMul");
  EXPECT_EQ(after.nodes()[0]->attrs().GetString("activation", ""), "gelu");
  ExpectSameOutputs(before, after, {{"n", 3}});
}

}  // namespace
}  // namespace kiln::passes
