// A BatchNormalization after a Linear (LeViT's Linear -> flatten -> BatchNorm1d -> reshape back;
// BatchNorm1d after a Linear in MLP heads) folds into the product's weight columns and bias; the
// activation after it then joins the product. Compared with the unfolded graph on random inputs.
#include <gtest/gtest.h>

#include "pass_test_util.h"

namespace kiln::passes {
namespace {

using namespace testing;

Value* BatchNorm(Graph& g, Value* x, int64_t c, uint32_t seed) {
  Value* scale = Const(g, RandomTensor(DataType::kFloat32, {c}, seed, 0.5, 1.5));
  Value* bias = Const(g, RandomTensor(DataType::kFloat32, {c}, seed + 1));
  Value* mean = Const(g, RandomTensor(DataType::kFloat32, {c}, seed + 2));
  Value* var = Const(g, RandomTensor(DataType::kFloat32, {c}, seed + 3, 0.5, 2.0));
  return Op(g, "BatchNormalization", {x, scale, bias, mean, var},
            Attrs(std::pair{"epsilon", 1e-5f}));
}

enum class Form { kTokens, kTokensWithBias, kRows, kViewMovesTheChannels };

void LinearBn(Graph& g, Form form) {
  const bool tokens = form != Form::kRows;
  Value* x = tokens ? g.AddInput("x", DataType::kFloat32, {2, 5, 8})
                    : g.AddInput("x", DataType::kFloat32, {4, 8});
  Value* y = Op(g, "MatMul", {x, Const(g, RandomTensor(DataType::kFloat32, {8, 6}, 1))});
  if (form == Form::kTokensWithBias) {
    y = Op(g, "Add", {y, Const(g, RandomTensor(DataType::kFloat32, {6}, 2))});
  }
  if (form == Form::kRows) {
    g.MarkOutput(Op(g, "HardSwish", {BatchNorm(g, y, 6, 10)}));
    return;
  }
  if (form == Form::kViewMovesTheChannels) {
    // [2, 5, 6] -> [12, 5]: the BatchNorm's channels are not the product's columns.
    Value* flat = Op(g, "Reshape", {y, Const(g, Ints({12, 5}))});
    g.MarkOutput(Op(g, "Relu", {BatchNorm(g, flat, 5, 10)}));
    return;
  }
  Value* flat = Op(g, "Flatten", {y}, Attrs(std::pair{"axis", int64_t{2}}));
  Value* bn = BatchNorm(g, flat, 6, 10);
  g.MarkOutput(Op(g, "HardSwish", {Op(g, "Reshape", {bn, Const(g, Ints({2, 5, 6}))})}));
}

TEST(LinearBatchNorm, FoldsIntoTheProductAndTheActivationJoinsIt) {
  for (Form form : {Form::kTokens, Form::kTokensWithBias, Form::kRows}) {
    SCOPED_TRACE(static_cast<int>(form));
    Graph before, after;
    LinearBn(before, form);
    LinearBn(after, form);
    auto r = RunDefaultPasses(after, TestOptions());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(CountOps(after, "BatchNormalization"), 0);
    // The product with the folded bias and the Hardswish, the views merged away.
    EXPECT_EQ(after.num_nodes(), 1u);
    ASSERT_EQ(CountOps(after, "FusedMatMul"), 1);
    for (Node* n : after.nodes()) {
      EXPECT_EQ(n->attrs().GetString("activation", ""), "hardswish");
      EXPECT_EQ(n->num_inputs(), 3u);
    }
    ExpectSameOutputs(before, after);
  }
}

TEST(LinearBatchNorm, ChannelsThatAreNotTheColumnsStay) {
  Graph before, after;
  LinearBn(before, Form::kViewMovesTheChannels);
  LinearBn(after, Form::kViewMovesTheChannels);
  auto r = RunDefaultPasses(after, TestOptions());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(CountOps(after, "BatchNormalization"), 1);
  ExpectSameOutputs(before, after);
}

}  // namespace
}  // namespace kiln::passes
