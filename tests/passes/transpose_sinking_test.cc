// Transpose sinking (transpose_sinking.cc) and MatMul scale folding (matmul_scale_folding.cc):
// the model's own permutes and the layout pass's boundary Transposes cancel, a per-column scale
// after a product goes into its weights, and every rewritten graph computes what the original
// does on fresh random inputs.
#include <gtest/gtest.h>

#include <functional>

#include "kiln/ir/weight_program.h"
#include "pass_test_util.h"

namespace kiln::passes {
namespace {

using namespace testing;

Value* Transpose(Graph& g, Value* x, std::vector<int64_t> perm) {
  return Op(g, "Transpose", {x}, Attrs(std::pair{"perm", std::move(perm)}));
}

// ConvNeXt's block as torchvision writes it: depthwise 7x7 conv (NCHW), permute to NHWC,
// LayerNorm, Linear, GELU, Linear, permute back, layer scale gamma [C, 1, 1], residual add.
Value* ConvNextBlock(Graph& g, Value* x, int64_t c, uint32_t seed) {
  Value* dw = Op(g, "Conv", {x, Const(g, RandomTensor(DataType::kFloat32, {c, 1, 7, 7}, seed))},
                 Attrs(std::pair{"group", c}, std::pair{"pads", std::vector<int64_t>{3, 3, 3, 3}}));
  Value* t = Transpose(g, dw, {0, 2, 3, 1});
  Value* ln = Op(g, "LayerNormalization",
                 {t, Const(g, RandomTensor(DataType::kFloat32, {c}, seed + 1, 0.5, 1.5)),
                  Const(g, RandomTensor(DataType::kFloat32, {c}, seed + 2))},
                 Attrs(std::pair{"axis", int64_t{-1}}));
  Value* h =
      Op(g, "MatMul", {ln, Const(g, RandomTensor(DataType::kFloat32, {c, 4 * c}, seed + 3))});
  h = Op(g, "Add", {h, Const(g, RandomTensor(DataType::kFloat32, {4 * c}, seed + 4))});
  h = Op(g, "Gelu", {h});
  h = Op(g, "MatMul", {h, Const(g, RandomTensor(DataType::kFloat32, {4 * c, c}, seed + 5))});
  h = Op(g, "Add", {h, Const(g, RandomTensor(DataType::kFloat32, {c}, seed + 6))});
  Value* back = Transpose(g, h, {0, 3, 1, 2});
  Value* scaled =
      Op(g, "Mul", {Const(g, RandomTensor(DataType::kFloat32, {c, 1, 1}, seed + 7)), back});
  return Op(g, "Add", {scaled, x});
}

std::unique_ptr<Graph> ConvNext(int blocks) {
  auto g = std::make_unique<Graph>();
  const int64_t c = 8;
  Value* x = g->AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), c, 9, 10});
  for (int b = 0; b < blocks; ++b) x = ConvNextBlock(*g, x, c, 10 * static_cast<uint32_t>(b) + 1);
  // A 1x1 convolution ends the stack (the next stage's downsampling, here without a stride).
  g->MarkOutput(Op(*g, "Conv", {x, Const(*g, RandomTensor(DataType::kFloat32, {4, c, 1, 1}, 99))}));
  return g;
}

TEST(TransposeSinking, ConvNextBlocksKeepOnlyTheStackBoundaryTransposes) {
  for (int blocks : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << blocks << " block(s)");
    auto before = ConvNext(blocks);
    auto after = ConvNext(blocks);
    auto report = RunDefaultPasses(*after, NhwcOptions());
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    SCOPED_TRACE(report->ToString());
    // Into NHWC once after x and back once for the graph output; each block's two permutes and
    // the layout pass's transposes around them cancel.
    EXPECT_EQ(CountOps(*after, "Transpose"), 2);
    EXPECT_GT(report->rewrites("transpose_sinking"), 0);
    // Each block's layer scale went into its second Linear.
    EXPECT_EQ(report->rewrites("matmul_scale_folding"), blocks);
    EXPECT_EQ(CountOps(*after, "Mul"), 0);
    ExpectSameOutputs(*before, *after, {{"n", 2}}, 1e-4);
  }
}

TEST(TransposeSinking, WithoutTheLayoutTheScaleStillFolds) {
  auto before = ConvNext(2);
  auto after = ConvNext(2);
  auto report = RunDefaultPasses(*after, TestOptions());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  SCOPED_TRACE(report->ToString());
  // The permute back sinks below the layer scale, which then folds; the residual input has no
  // NHWC twin, so the two permutes per block stay.
  EXPECT_EQ(CountOps(*after, "Transpose"), 4);
  EXPECT_EQ(report->rewrites("matmul_scale_folding"), 2);
  ExpectSameOutputs(*before, *after, {{"n", 2}}, 1e-4);
}

TEST(TransposeSinking, InverseTransposesCancelAndOthersCompose) {
  struct Case {
    std::vector<int64_t> p, q;
    int transposes_left;
  };
  for (const Case& c : {Case{{0, 2, 1}, {0, 2, 1}, 0}, Case{{1, 2, 0}, {2, 0, 1}, 0},
                        Case{{0, 2, 1}, {1, 0, 2}, 1}, Case{{2, 1, 0}, {2, 1, 0}, 0}}) {
    SCOPED_TRACE(::testing::PrintToString(c.p) + " then " + ::testing::PrintToString(c.q));
    auto make = [&] {
      auto g = std::make_unique<Graph>();
      Value* x = g->AddInput("x", DataType::kFloat32, {2, 3, 4});
      // The Relu keeps the graph input from becoming the graph output.
      g->MarkOutput(Transpose(*g, Transpose(*g, Op(*g, "Relu", {x}), c.p), c.q));
      return g;
    };
    auto before = make();
    auto after = make();
    auto report = RunDefaultPasses(*after, TestOptions());
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(CountOps(*after, "Transpose"), c.transposes_left);
    EXPECT_EQ(after->outputs()[0]->name(), before->outputs()[0]->name());
    ExpectSameOutputs(*before, *after);
  }
}

TEST(TransposeSinking, ATransposeReadElsewhereStaysAndTheSecondComposesPastIt) {
  auto make = [] {
    auto g = std::make_unique<Graph>();
    Value* x = g->AddInput("x", DataType::kFloat32, {2, 3, 4});
    Value* t = Transpose(*g, Op(*g, "Relu", {x}), {0, 2, 1});
    g->MarkOutput(Op(*g, "Sigmoid", {t}));  // a second reader of t
    g->MarkOutput(Transpose(*g, t, {0, 2, 1}));
    return g;
  };
  auto before = make();
  auto after = make();
  auto report = RunDefaultPasses(*after, TestOptions());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(CountOps(*after, "Transpose"), 1);  // the Sigmoid's; the pair cancelled
  ExpectSameOutputs(*before, *after);
}

TEST(TransposeSinking, NeverAddsTransposes) {
  // Add(Transpose(a), b): b has no transposed twin and the sum is not transposed back, so moving
  // the Transpose below the Add would need a second one for b.
  {
    Graph g;
    Value* a = g.AddInput("a", DataType::kFloat32, {2, 3, 4});
    Value* b = g.AddInput("b", DataType::kFloat32, {2, 4, 3});
    g.MarkOutput(Op(g, "Add", {Transpose(g, a, {0, 2, 1}), b}));
    auto report = RunDefaultPasses(g, TestOptions());
    ASSERT_TRUE(report.ok());
    EXPECT_EQ(report->rewrites("transpose_sinking"), 0);
    EXPECT_EQ(CountOps(g, "Transpose"), 1);
  }
  // A transposed value that is also a graph output stays where it is.
  {
    Graph g;
    Value* a = g.AddInput("a", DataType::kFloat32, {2, 3, 4});
    Value* t = Transpose(g, Op(g, "Relu", {a}), {0, 2, 1});
    g.MarkOutput(t);
    g.MarkOutput(Op(g, "Mul", {t, Const(g, RandomTensor(DataType::kFloat32, {3}, 1))}));
    auto report = RunDefaultPasses(g, TestOptions());
    ASSERT_TRUE(report.ok());
    EXPECT_EQ(report->rewrites("transpose_sinking"), 0);
  }
}

TEST(TransposeSinking, ConstantsOfEveryRankArePermuted) {
  // Mul(Transpose(x, p), c) for constants of rank 0..4 (broadcast with leading ones), each
  // followed by a Relu so that the Transpose really moves below the Mul.
  const std::vector<std::vector<int64_t>> consts = {{},     {5},       {1, 5},
                                                    {4, 1}, {3, 4, 5}, {2, 3, 4, 5}};
  for (const auto& dims : consts) {
    SCOPED_TRACE(::testing::PrintToString(dims));
    auto make = [&] {
      auto g = std::make_unique<Graph>();
      Value* x = g->AddInput("x", DataType::kFloat32, {2, 5, 3, 4});
      Value* t = Transpose(*g, Op(*g, "Relu", {x}), {0, 2, 3, 1});  // [2, 3, 4, 5]
      Value* m = Op(*g, "Mul", {t, Const(*g, RandomTensor(DataType::kFloat32, dims, 3))});
      g->MarkOutput(Op(*g, "Sigmoid", {m}));
      return g;
    };
    auto before = make();
    auto after = make();
    auto report = RunDefaultPasses(*after, TestOptions());
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_GE(report->rewrites("transpose_sinking"), 2);  // below the Mul, then the Sigmoid
    ExpectSameOutputs(*before, *after);
  }
}

// Mul(product, gamma) for the four products, with and without bias, transB, scalar gammas and
// the cases that must not fold.
TEST(MatMulScaleFolding, FoldsPerColumnScalesIntoTheWeights) {
  struct Case {
    std::string name;
    std::function<Value*(Graph&, Value*)> product;  // x [6, 5] -> [6, 7]
    std::vector<int64_t> gamma_dims;
    bool folds;
  };
  auto w = [](Graph& g, std::vector<int64_t> d, uint32_t s) {  // an initializer
    Value* v = Const(g, RandomTensor(DataType::kFloat32, d, s));
    v->set_provenance(InitializerExpr(v->name(), *v->constant()));
    return v;
  };
  const std::vector<Case> cases = {
      {"matmul",
       [&](Graph& g, Value* x) {
         return Op(g, "MatMul", {x, w(g, {5, 7}, 1)});
       },
       {7},
       true},
      {"matmul+bias",
       [&](Graph& g, Value* x) {
         return Op(g, "Add", {Op(g, "MatMul", {x, w(g, {5, 7}, 1)}), w(g, {7}, 2)});
       },
       {1, 7},
       true},
      {"matmul, scalar",
       [&](Graph& g, Value* x) {
         return Op(g, "MatMul", {x, w(g, {5, 7}, 1)});
       },
       {},
       true},
      {"gemm transB with C",
       [&](Graph& g, Value* x) {
         return Op(g, "Gemm", {x, w(g, {7, 5}, 1), w(g, {7}, 2)},
                   Attrs(std::pair{"transB", int64_t{1}}, std::pair{"alpha", 0.5f},
                         std::pair{"beta", 2.0f}));
       },
       {7},
       true},
      {"gemm with a full C",
       [&](Graph& g, Value* x) {
         return Op(g, "Gemm", {x, w(g, {5, 7}, 1), w(g, {6, 7}, 2)});
       },
       {7},
       true},
      {"after an activation",
       [&](Graph& g, Value* x) {
         return Op(g, "Relu",
                   {Op(g, "Add", {Op(g, "MatMul", {x, w(g, {5, 7}, 1)}), w(g, {7}, 2)})});
       },
       {7},
       false},
      {"per row",
       [&](Graph& g, Value* x) {
         return Op(g, "MatMul", {x, w(g, {5, 7}, 1)});
       },
       {6, 1},
       false},
      {"activation weights",
       [&](Graph& g, Value* x) {
         return Op(g, "MatMul", {x, Transpose(g, Op(g, "Relu", {x}), {1, 0})});  // [6, 6]
       },
       {6},
       false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto make = [&] {
      auto g = std::make_unique<Graph>();
      Value* x = g->AddInput("x", DataType::kFloat32, {6, 5});
      Value* y = c.product(*g, x);
      g->MarkOutput(Op(*g, "Mul", {y, w(*g, c.gamma_dims, 9)}));
      return g;
    };
    auto before = make();
    auto after = make();
    auto report = RunDefaultPasses(*after, TestOptions());
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    SCOPED_TRACE(report->ToString());
    EXPECT_EQ(report->rewrites("matmul_scale_folding"), c.folds ? 1 : 0);
    EXPECT_EQ(CountOps(*after, "Mul"), c.folds ? 0 : 1);
    if (c.folds) {
      // The scaled weights remember how they were made, so refit can renew them.
      for (Node* n : after->nodes()) {
        if (n->num_inputs() < 2 || !n->input(1) || !n->input(1)->is_constant()) continue;
        EXPECT_EQ(ProvenanceOf(*n->input(1))->kind, WeightExpr::Kind::kStep) << n->name();
      }
    }
    ExpectSameOutputs(*before, *after, {}, 1e-5);
  }
}

}  // namespace
}  // namespace kiln::passes
