// The RMSNorm fusion on the decomposed forms exporters emit (Pow or x*x; Div, Reciprocal or
// 1/Sqrt; with and without the weight): the graph becomes
// one RMSNormalization and computes what it computed before on fresh random inputs (ReduceMean's
// axes are an input in kiln's IR: the importer moves older opsets' attribute there). Near misses
// (a non-trailing axis, the square of another tensor, a weight along the batch) stay unfused.
#include <gtest/gtest.h>

#include "pass_test_util.h"

namespace kiln::passes {
namespace {

using namespace testing;

enum class Square { kPow, kMul };
enum class Inverse { kDiv, kReciprocal, kOneOver };

struct Form {
  Square square = Square::kPow;
  Inverse inverse = Inverse::kReciprocal;
  bool weight = true;
};

Value* MeanOver(Graph& g, Value* v, std::vector<int64_t> axes) {
  return Op(g, "ReduceMean", {v, Const(g, Ints(std::move(axes)))});
}

// y = x * 1/sqrt(mean(x^2, axis -1) + eps) * w, x [n, 5, 64] (Llama's RMSNorm as torch exports it).
void RmsGraph(Graph& g, const Form& f, std::vector<int64_t> axes = {-1}) {
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 5, 64});
  Value* sq =
      f.square == Square::kPow ? Op(g, "Pow", {x, Const(g, Scalar(2.f))}) : Op(g, "Mul", {x, x});
  Value* ms = MeanOver(g, sq, axes);
  Value* root = Op(g, "Sqrt", {Op(g, "Add", {ms, Const(g, Scalar(1e-6f))})});
  Value* n = nullptr;
  switch (f.inverse) {
    case Inverse::kDiv:
      n = Op(g, "Div", {x, root});
      break;
    case Inverse::kReciprocal:
      n = Op(g, "Mul", {x, Op(g, "Reciprocal", {root})});
      break;
    case Inverse::kOneOver:
      n = Op(g, "Mul", {Op(g, "Div", {Const(g, Scalar(1.f)), root}), x});
      break;
  }
  Value* y = f.weight
                 ? Op(g, "Mul", {Const(g, RandomTensor(DataType::kFloat32, {64}, 9, 0.5, 1.5)), n})
                 : n;
  g.MarkOutput(Op(g, "Relu", {y}));  // a reader after the norm: the fused op feeds it
}

std::vector<std::unique_ptr<Pass>> FusionPasses() {
  std::vector<std::unique_ptr<Pass>> p;
  p.push_back(MakeRmsNormFusionPass());
  p.push_back(MakeDeadNodeEliminationPass());
  return p;
}

TEST(RmsNormFusion, EveryExportedFormBecomesOneOp) {
  for (Square sq : {Square::kPow, Square::kMul}) {
    for (Inverse inv : {Inverse::kDiv, Inverse::kReciprocal, Inverse::kOneOver}) {
      for (bool weight : {true, false}) {
        {
          Form f{sq, inv, weight};
          SCOPED_TRACE(::testing::Message()
                       << "square " << int(sq) << " inverse " << int(inv) << " weight " << weight);
          Graph before, after;
          RmsGraph(before, f);
          RmsGraph(after, f);
          PassReport r = RunPasses(after, FusionPasses());
          EXPECT_EQ(r.rewrites("rms_norm_fusion"), 1);
          EXPECT_EQ(CountOps(after, "RMSNormalization"), 1);
          EXPECT_EQ(after.num_nodes(), 2u);  // RMSNormalization, Relu
          for (Node* n : after.nodes()) {
            if (n->op_type() != "RMSNormalization") continue;
            EXPECT_EQ(n->attrs().GetInt("axis", 0), -1);
            EXPECT_FLOAT_EQ(n->attrs().GetFloat("epsilon", 0.f), 1e-6f);
          }
          ExpectSameOutputs(before, after, {{"n", 3}}, 1e-5, 21);
          ExpectSameOutputs(before, after, {{"n", 1}}, 1e-5, 22);
        }
      }
    }
  }
}

TEST(RmsNormFusion, NearMissesStay) {
  {
    // The mean over a non-trailing axis is not a row norm.
    Graph g;
    RmsGraph(g, Form{}, {1});
    RunPasses(g, FusionPasses());
    EXPECT_EQ(CountOps(g, "RMSNormalization"), 0);
  }
  {
    // The square of another tensor: x / sqrt(mean(z^2)) is not x's RMSNorm.
    Graph g;
    Value* x = g.AddInput("x", DataType::kFloat32, {2, 8});
    Value* z = g.AddInput("z", DataType::kFloat32, {2, 8});
    Value* ms = MeanOver(g, Op(g, "Mul", {z, z}), {-1});
    Value* root = Op(g, "Sqrt", {Op(g, "Add", {ms, Const(g, Scalar(1e-6f))})});
    g.MarkOutput(Op(g, "Div", {x, root}));
    RunPasses(g, FusionPasses());
    EXPECT_EQ(CountOps(g, "RMSNormalization"), 0);
  }
  {
    // A weight that varies along a non-normalized axis is not a norm weight: the Mul stays,
    // the norm under it still fuses.
    Graph before, after;
    for (Graph* g : {&before, &after}) {
      Value* x = g->AddInput("x", DataType::kFloat32, {4, 8});
      Value* ms = MeanOver(*g, Op(*g, "Pow", {x, Const(*g, Scalar(2.f))}), {-1});
      Value* root = Op(*g, "Sqrt", {Op(*g, "Add", {ms, Const(*g, Scalar(1e-5f))})});
      Value* w = Const(*g, RandomTensor(DataType::kFloat32, {4, 1}, 3, 0.5, 1.5));
      g->MarkOutput(Op(*g, "Mul", {Op(*g, "Div", {x, root}), w}));
    }
    RunPasses(after, FusionPasses());
    EXPECT_EQ(CountOps(after, "RMSNormalization"), 1);
    EXPECT_EQ(CountOps(after, "Mul"), 1);
    ExpectSameOutputs(before, after);
  }
}

}  // namespace
}  // namespace kiln::passes
