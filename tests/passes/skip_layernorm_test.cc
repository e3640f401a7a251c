// The skip-layernorm fusion (residual Add + LayerNormalization) on transformer-shaped graphs:
// BERT's post-LN block (the sum is read only by the LayerNorm), GPT-2's pre-LN residual stream
// (the sum is read again by the next residual Add, so it stays an output of the fused node), and
// cases that must not fuse. Outputs are compared before and after on the CPU reference.
#include <gtest/gtest.h>

#include "kiln/ops/op_schema.h"
#include "pass_test_util.h"

namespace kiln::passes {
namespace {

using namespace testing;

using Passes = std::vector<std::unique_ptr<Pass>>;

constexpr int64_t kHidden = 16;

Passes SkipLnOnly() {
  Passes v;
  v.push_back(MakeSkipLayerNormFusionPass());
  v.push_back(MakeDeadNodeEliminationPass());
  return v;
}

Value* Linear(Graph& g, Value* x, uint32_t seed) {
  Value* w = Const(g, RandomTensor(DataType::kFloat32, {kHidden, kHidden}, seed, -0.5, 0.5));
  Value* b = Const(g, RandomTensor(DataType::kFloat32, {kHidden}, seed + 1));
  return Op(g, "Add", {Op(g, "MatMul", {x, w}), b});
}

Value* LayerNorm(Graph& g, Value* x, uint32_t seed, bool with_bias = true) {
  std::vector<Value*> in = {x,
                            Const(g, RandomTensor(DataType::kFloat32, {kHidden}, seed, 0.5, 1.5))};
  if (with_bias) in.push_back(Const(g, RandomTensor(DataType::kFloat32, {kHidden}, seed + 1)));
  return Op(g, "LayerNormalization", in,
            Attrs(std::pair{"axis", int64_t{-1}}, std::pair{"epsilon", 1e-5f}));
}

// BERT (post-LN): y = LN(x + Linear(x)), twice.
void BertBlocks(Graph& g) {
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 5, kHidden});
  Value* h = LayerNorm(g, Op(g, "Add", {Linear(g, x, 10), x}), 20);
  Value* y = LayerNorm(g, Op(g, "Add", {h, Linear(g, h, 30)}), 40, /*with_bias=*/false);
  g.MarkOutput(y);
}

// GPT-2 (pre-LN): h1 = x + Linear(LN(x)); h2 = h1 + Linear(LN(h1)); y = LN(h2).
void GptBlocks(Graph& g, bool h2_is_output) {
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 5, kHidden});
  Value* h1 = Op(g, "Add", {x, Linear(g, LayerNorm(g, x, 50), 60)});
  Value* h2 = Op(g, "Add", {h1, Linear(g, LayerNorm(g, h1, 70), 80)});
  g.MarkOutput(LayerNorm(g, h2, 90));
  if (h2_is_output) g.MarkOutput(h2);
}

std::vector<Node*> NodesOf(const Graph& g, const std::string& op) {
  std::vector<Node*> out;
  for (Node* n : g.nodes()) {
    if (n->op_type() == op) out.push_back(n);
  }
  return out;
}

TEST(SkipLayerNormFusion, BertPostLnFusesWithoutTheSum) {
  Graph before, after;
  BertBlocks(before);
  BertBlocks(after);
  PassReport r = RunPasses(after, SkipLnOnly());
  EXPECT_EQ(r.rewrites("skip_layernorm_fusion"), 2);
  EXPECT_EQ(CountOps(after, "LayerNormalization"), 0);
  auto fused = NodesOf(after, "SkipLayerNormalization");
  ASSERT_EQ(fused.size(), 2u);
  for (Node* n : fused) {
    EXPECT_EQ(n->num_outputs(), 1u) << n->name();
    EXPECT_EQ(n->attrs().GetInt("axis", 0), -1);
    EXPECT_FLOAT_EQ(n->attrs().GetFloat("epsilon", 0), 1e-5f);
  }
  // The second LayerNorm had no B: the fused node has three inputs.
  int with_bias = 0;
  for (Node* n : fused) with_bias += n->num_inputs() == 4;
  EXPECT_EQ(with_bias, 1);
  // Only the two bias Adds remain (the residual Adds are inside the fused nodes).
  EXPECT_EQ(CountOps(after, "Add"), 2);
  ExpectSameOutputs(before, after, {{"n", 3}});
}

TEST(SkipLayerNormFusion, GptPreLnKeepsTheResidualStreamAsSecondOutput) {
  Graph before, after;
  GptBlocks(before, false);
  GptBlocks(after, false);
  PassReport r = RunPasses(after, SkipLnOnly());
  EXPECT_EQ(r.rewrites("skip_layernorm_fusion"), 2);
  // The first LayerNorm reads the input directly: nothing to fuse there.
  EXPECT_EQ(CountOps(after, "LayerNormalization"), 1);
  auto fused = NodesOf(after, "SkipLayerNormalization");
  ASSERT_EQ(fused.size(), 2u);
  int with_sum = 0;
  for (Node* n : fused) {
    if (n->num_outputs() == 2) {
      ++with_sum;
      // h1: read by the next residual Add, now the second fused node's input.
      ASSERT_NE(n->output(1), nullptr);
      bool read_by_fused = false;
      for (Node* c : n->output(1)->consumers()) {
        read_by_fused |= c->op_type() == "SkipLayerNormalization";
      }
      EXPECT_TRUE(read_by_fused);
    }
  }
  EXPECT_EQ(with_sum, 1);
  ExpectSameOutputs(before, after, {{"n", 2}});
}

TEST(SkipLayerNormFusion, ASumThatIsAGraphOutputStaysOne) {
  Graph before, after;
  GptBlocks(before, true);
  GptBlocks(after, true);
  RunPasses(after, SkipLnOnly());
  auto fused = NodesOf(after, "SkipLayerNormalization");
  ASSERT_EQ(fused.size(), 2u);
  for (Node* n : fused) EXPECT_EQ(n->num_outputs(), 2u) << n->name();
  ExpectSameOutputs(before, after, {{"n", 2}});
}

TEST(SkipLayerNormFusion, DefaultPipelineFusesAfterLayerNormFusion) {
  Graph before, after;
  GptBlocks(before, false);
  GptBlocks(after, false);
  auto r = RunDefaultPasses(after, TestOptions());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->rewrites("skip_layernorm_fusion"), 2);
  EXPECT_EQ(CountOps(after, "SkipLayerNormalization"), 2);
  // The bias Adds still go to the MatMuls.
  EXPECT_EQ(CountOps(after, "FusedMatMul"), 2);
  EXPECT_EQ(CountOps(after, "Add"), 0);
  ExpectSameOutputs(before, after, {{"n", 2}});
}

TEST(SkipLayerNormFusion, ABroadcastAddIsABiasNotAResidual) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {2, 5, kHidden});
  Value* b = Const(g, RandomTensor(DataType::kFloat32, {kHidden}, 3));
  g.MarkOutput(LayerNorm(g, Op(g, "Add", {x, b}), 4));
  RunPasses(g, SkipLnOnly());
  EXPECT_EQ(CountOps(g, "SkipLayerNormalization"), 0);
  EXPECT_EQ(CountOps(g, "LayerNormalization"), 1);
}

TEST(SkipLayerNormFusion, ALayerNormWhoseStatisticsAreReadStays) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {2, kHidden});
  Value* s = g.AddInput("s", DataType::kFloat32, {2, kHidden});
  Value* sum = Op(g, "Add", {x, s});
  Value* y = g.AddValue("y");
  Value* mean = g.AddValue("mean");
  g.AddNode("LayerNormalization", "ln",
            {sum, Const(g, RandomTensor(DataType::kFloat32, {kHidden}, 5))}, {y, mean}, {});
  g.MarkOutput(y);
  g.MarkOutput(mean);
  RunPasses(g, SkipLnOnly());
  EXPECT_EQ(CountOps(g, "SkipLayerNormalization"), 0);
  EXPECT_EQ(CountOps(g, "Add"), 1);
}

TEST(SkipLayerNormFusion, ShapeRuleRejectsMismatchedSkip) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {2, 4, kHidden});
  Value* s = g.AddInput("s", DataType::kFloat32, {1, 4, kHidden});
  Value* y = g.AddValue("y");
  g.AddNode("SkipLayerNormalization", "sln",
            {x, s, Const(g, RandomTensor(DataType::kFloat32, {kHidden}, 5))}, {y}, {});
  g.MarkOutput(y);
  auto st = InferShapes(g);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), ErrorCode::kShapeMismatch) << st.status().ToString();
}

TEST(SkipLayerNormFusion, ShapeRuleGivesBothOutputsXsShapeAndType) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat16, {Dim::Symbol("b"), 4, kHidden});
  Value* s = g.AddInput("s", DataType::kFloat16, {Dim::Symbol("b"), 4, kHidden});
  Value* y = g.AddValue("y");
  Value* sum = g.AddValue("sum");
  Tensor gamma = RandomTensor(DataType::kFloat16, {kHidden}, 5);
  g.AddNode("SkipLayerNormalization", "sln", {x, s, Const(g, gamma)}, {y, sum}, {});
  g.MarkOutput(y);
  g.MarkOutput(sum);
  ASSERT_TRUE(InferShapes(g).ok());
  for (Value* v : {y, sum}) {
    EXPECT_EQ(v->dtype(), DataType::kFloat16);
    EXPECT_EQ(v->shape(), x->shape());
  }
}

}  // namespace
}  // namespace kiln::passes
