// Simplification passes and the pass manager: constant folding, dead-node elimination, identity
// elimination, shape-subgraph simplification. Each checks the rewrite (op counts) and that the
// outputs before and after agree on random inputs.
#include <gtest/gtest.h>

#include <functional>

#include "kiln/ir/weight_program.h"
#include "pass_test_util.h"

namespace kiln::passes {
namespace {

using namespace testing;

void FoldableGraph(Graph& g) {
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 4});
  Value* c1 = Const(g, RandomTensor(DataType::kFloat32, {4}, 1));
  Value* c2 = Const(g, RandomTensor(DataType::kFloat32, {4}, 2));
  Value* folded = Op(g, "Relu", {Op(g, "Add", {c1, c2})});
  Value* y = Op(g, "Add", {x, folded});
  g.MarkOutput(y);
}

TEST(ConstantFolding, FoldsNodesWhoseInputsAreConstants) {
  Graph before, after;
  FoldableGraph(before);
  FoldableGraph(after);
  std::vector<std::unique_ptr<Pass>> passes;
  passes.push_back(MakeConstantFoldingPass());
  PassReport r = RunPasses(after, std::move(passes));
  EXPECT_EQ(after.num_nodes(), 1u);
  EXPECT_EQ(r.rewrites("constant_folding"), 2);
  ExpectSameOutputs(before, after, {{"n", 3}});
}

TEST(ConstantFolding, RespectsTheSizeLimit) {
  Graph g;
  FoldableGraph(g);
  PassOptions o = TestOptions();
  o.fold_size_limit_bytes = 8;  // each folded output is 16 bytes
  std::vector<std::unique_ptr<Pass>> passes;
  passes.push_back(MakeConstantFoldingPass());
  PassReport r = RunPasses(g, std::move(passes), o);
  EXPECT_EQ(g.num_nodes(), 3u);
  EXPECT_EQ(r.rewrites("constant_folding"), 0);
}

TEST(ConstantFolding, WithoutAnEvaluatorDoesNothing) {
  Graph g;
  FoldableGraph(g);
  std::vector<std::unique_ptr<Pass>> passes;
  passes.push_back(MakeConstantFoldingPass());
  RunPasses(g, std::move(passes), PassOptions{});
  EXPECT_EQ(g.num_nodes(), 3u);
}

void DeadBranchGraph(Graph& g) {
  Value* x = g.AddInput("x", DataType::kFloat32, {2, 3});
  Value* dead = Op(g, "Relu", {Op(g, "Relu", {x})});
  (void)dead;
  g.MarkOutput(Op(g, "Add", {x, x}));
}

TEST(DeadNodeElimination, RemovesUnreadChains) {
  Graph before, after;
  DeadBranchGraph(before);
  DeadBranchGraph(after);
  std::vector<std::unique_ptr<Pass>> passes;
  passes.push_back(MakeDeadNodeEliminationPass());
  PassReport r = RunPasses(after, std::move(passes));
  EXPECT_EQ(after.num_nodes(), 1u);
  EXPECT_EQ(CountOps(after, "Relu"), 0);
  EXPECT_EQ(r.rewrites("dead_node_elimination"), 2);
  ExpectSameOutputs(before, after);
}

void IdentityGraph(Graph& g) {
  Value* x = g.AddInput("x", DataType::kFloat32, {2, 3});
  Value* r = Op(g, "Relu", {Op(g, "Identity", {x})});
  Value* y = g.AddValue("y");
  g.AddNode("Identity", "last", {r}, {y});
  g.MarkOutput(y);
}

// Twins (one op, the same inputs in order, the same attributes) become one, and what reads them
// then becomes twins too; near misses stay: other attributes, other input order, a twin whose
// output is a graph output.
TEST(CommonSubexpression, TwinsMergeAndNearMissesStay) {
  auto make = [](Graph& g) {
    Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 6});
    Value* w = g.AddInput("w", DataType::kFloat32, {Dim::Symbol("n"), 6});
    Value* a = Op(g, "Add", {Op(g, "Relu", {x}), w});
    Value* b = Op(g, "Add", {Op(g, "Relu", {x}), w});  // twin of a, through a twin Relu
    Value* c = Op(g, "Sub", {x, w});
    Value* d = Op(g, "Sub", {w, x});  // other order: not a twin
    Value* e = Op(g, "LeakyRelu", {x}, Attrs(std::pair{"alpha", 0.1f}));
    Value* f = Op(g, "LeakyRelu", {x}, Attrs(std::pair{"alpha", 0.2f}));  // other attribute
    Value* h =
        Op(g, "Mul",
           {Op(g, "Mul", {a, b}), Op(g, "Add", {Op(g, "Add", {c, d}), Op(g, "Add", {e, f})})});
    g.MarkOutput(h);
    g.MarkOutput(Op(g, "Sub", {x, w}));  // c's twin, but a graph output: keeps its name
  };
  Graph before, after;
  make(before);
  make(after);
  std::vector<std::unique_ptr<Pass>> passes;
  passes.push_back(MakeCommonSubexpressionPass());
  passes.push_back(MakeDeadNodeEliminationPass());
  PassReport r = RunPasses(after, std::move(passes));
  EXPECT_EQ(r.rewrites("common_subexpression"), 2);  // b's Relu, then b
  EXPECT_EQ(CountOps(after, "Relu"), 1);
  EXPECT_EQ(CountOps(after, "Sub"), 3);
  EXPECT_EQ(CountOps(after, "LeakyRelu"), 2);
  ExpectSameOutputs(before, after, {{"n", 3}});
}

// Inputs that are separate small constants of equal bytes are one input where refit cannot make
// them differ: a literal (DistilBERT's per-layer copy of a Reshape target), an integer
// initializer (refit checks it unchanged); a float weight may differ after refit, so not that.
TEST(CommonSubexpression, EqualLiteralConstantsAreOneInput) {
  auto make = [](Graph& g) {
    Value* x = g.AddInput("x", DataType::kFloat32, {2, 6});
    auto literal = [&](Tensor t) {
      Value* c = Const(g, std::move(t));
      c->set_provenance(LiteralExpr(*c->constant()));
      return c;
    };
    auto weight = [&](Tensor t) {
      Value* c = Const(g, std::move(t));
      c->set_provenance(InitializerExpr(c->name(), *c->constant()));
      return c;
    };
    Value* r1 = Op(g, "Reshape", {x, literal(Ints({3, 4}))});
    Value* r2 = Op(g, "Reshape", {x, literal(Ints({3, 4}))});  // twin
    Value* r3 = Op(g, "Reshape", {x, weight(Ints({3, 4}))});   // an int initializer: twin too
    Value* m1 = Op(g, "Mul", {r1, weight(Scalar(2.f))});
    Value* m2 = Op(g, "Mul", {r2, weight(Scalar(2.f))});  // float weights: may differ
    g.MarkOutput(Op(g, "Add", {Op(g, "Add", {m1, m2}), r3}));
  };
  Graph before, after;
  make(before);
  make(after);
  std::vector<std::unique_ptr<Pass>> passes;
  passes.push_back(MakeCommonSubexpressionPass());
  passes.push_back(MakeDeadNodeEliminationPass());
  RunPasses(after, std::move(passes));
  EXPECT_EQ(CountOps(after, "Reshape"), 1);
  EXPECT_EQ(CountOps(after, "Mul"), 2);
  ExpectSameOutputs(before, after);
}

TEST(IdentityElimination, BypassesIdentitiesAndKeepsOutputNames) {
  Graph before, after;
  IdentityGraph(before);
  IdentityGraph(after);
  std::vector<std::unique_ptr<Pass>> passes;
  passes.push_back(MakeIdentityEliminationPass());
  RunPasses(after, std::move(passes));
  EXPECT_EQ(CountOps(after, "Identity"), 0);
  EXPECT_EQ(after.num_nodes(), 1u);
  ASSERT_EQ(after.outputs().size(), 1u);
  EXPECT_EQ(after.outputs()[0]->name(), "y");
  ExpectSameOutputs(before, after);
}

TEST(IdentityElimination, KeepsAnIdentityBetweenAGraphInputAndOutput) {
  // Removing it would rename the graph output to the input's name.
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {2});
  Value* y = g.AddValue("y");
  g.AddNode("Identity", "id", {x}, {y});
  g.MarkOutput(y);
  std::vector<std::unique_ptr<Pass>> passes;
  passes.push_back(MakeIdentityEliminationPass());
  RunPasses(g, std::move(passes));
  EXPECT_EQ(CountOps(g, "Identity"), 1);
  EXPECT_EQ(g.outputs()[0]->name(), "y");
}

void CastAndReshapeNoOps(Graph& g) {
  Value* x = g.AddInput("x", DataType::kFloat32, {2, 6});
  Value* c = Op(g, "Cast", {x}, Attrs(std::pair{"to", int64_t{1}}));  // f32 -> f32
  Value* r = Op(g, "Reshape", {c, Const(g, Ints({2, 6}))});
  Value* t = Op(g, "Transpose", {r}, Attrs(std::pair{"perm", std::vector<int64_t>{0, 1}}));
  g.MarkOutput(Op(g, "Relu", {t}));
}

TEST(IdentityElimination, CastToTheSameTypeReshapeToTheSameShapeIdentityTranspose) {
  Graph before, after;
  CastAndReshapeNoOps(before);
  CastAndReshapeNoOps(after);
  std::vector<std::unique_ptr<Pass>> passes;
  passes.push_back(MakeIdentityEliminationPass());
  passes.push_back(MakeDeadNodeEliminationPass());
  RunPasses(after, std::move(passes));
  EXPECT_EQ(after.num_nodes(), 1u);
  EXPECT_EQ(CountOps(after, "Relu"), 1);
  ExpectSameOutputs(before, after);
}

// Swin's window padding and the crop after it: Pad by zeros and a Slice of every element are
// bypassed; a Pad by anything else, a Slice that drops an element, reverses or strides stays.
TEST(IdentityElimination, ZeroPadAndWholeSlice) {
  struct Case {
    std::string name;
    std::function<Value*(Graph&, Value*)> op;  // on x [2, 6, 5]
    bool bypassed;
  };
  auto i64 = [](std::vector<int64_t> v) { return Ints(std::move(v)); };
  const std::vector<Case> cases = {
      {"pad zeros",
       [&](Graph& g, Value* x) {
         return Op(g, "Pad", {x, Const(g, i64({0, 0, 0, 0, 0, 0}))});
       },
       true},
      {"pad zeros, reflect",
       [&](Graph& g, Value* x) {
         return Op(g, "Pad", {x, Const(g, i64({0, 0, 0, 0, 0, 0}))},
                   Attrs(std::pair{"mode", std::string("reflect")}));
       },
       true},
      {"pad one",
       [&](Graph& g, Value* x) {
         return Op(g, "Pad", {x, Const(g, i64({0, 0, 0, 0, 1, 0}))});
       },
       false},
      {"pad in and out",  // +1 on the left, -1 on the right: a shift, same shape
       [&](Graph& g, Value* x) {
         return Op(g, "Pad", {x, Const(g, i64({0, 0, 1, 0, 0, -1}))});
       },
       false},
      {"slice all",
       [&](Graph& g, Value* x) {
         return Op(g, "Slice",
                   {x, Const(g, i64({0, 0})), Const(g, i64({6, 5})), Const(g, i64({1, 2}))});
       },
       true},
      {"slice all, huge end and negative start",
       [&](Graph& g, Value* x) {
         return Op(g, "Slice",
                   {x, Const(g, i64({-6})), Const(g, i64({INT64_MAX})), Const(g, i64({1})),
                    Const(g, i64({1}))});
       },
       true},
      {"slice one less",
       [&](Graph& g, Value* x) {
         return Op(g, "Slice", {x, Const(g, i64({1})), Const(g, i64({6})), Const(g, i64({1}))});
       },
       false},
      {"slice reversed",
       [&](Graph& g, Value* x) {
         return Op(g, "Slice",
                   {x, Const(g, i64({-1})), Const(g, i64({INT64_MIN})), Const(g, i64({2})),
                    Const(g, i64({-1}))});
       },
       false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto make = [&](Graph& g) {
      Value* x = g.AddInput("x", DataType::kFloat32, {2, 6, 5});
      g.MarkOutput(Op(g, "Relu", {c.op(g, Op(g, "Sigmoid", {x}))}));
    };
    Graph before, after;
    make(before);
    make(after);
    std::vector<std::unique_ptr<Pass>> passes;
    passes.push_back(MakeIdentityEliminationPass());
    passes.push_back(MakeDeadNodeEliminationPass());
    RunPasses(after, std::move(passes));
    EXPECT_EQ(after.num_nodes(), c.bypassed ? 2u : 3u);
    ExpectSameOutputs(before, after);
  }
}

// Reshape(x, Concat([-1], Unsqueeze(Gather(Shape(x), 2)))) with x [n, 4, 6]: dim 2 is static, so
// the whole target folds to [-1, 6]; Gather(Shape(x), 0) = n cannot fold.
void ShapeChainGraph(Graph& g) {
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 4, 6});
  Value* shape = Op(g, "Shape", {x});
  Value* d2 =
      Op(g, "Gather", {shape, Const(g, Tensor::FromVector<int64_t>(DataType::kInt64, {}, {2}))},
         Attrs(std::pair{"axis", int64_t{0}}));
  Value* u2 = Op(g, "Unsqueeze", {d2, Const(g, Ints({0}))});
  Value* target = Op(g, "Concat", {Const(g, Ints({-1})), u2}, Attrs(std::pair{"axis", int64_t{0}}));
  g.MarkOutput(Op(g, "Reshape", {x, target}));
  // The symbolic batch dim stays computed.
  Value* d0 =
      Op(g, "Gather", {shape, Const(g, Tensor::FromVector<int64_t>(DataType::kInt64, {}, {0}))},
         Attrs(std::pair{"axis", int64_t{0}}));
  Value* u0 = Op(g, "Unsqueeze", {d0, Const(g, Ints({0}))});
  Value* target2 =
      Op(g, "Concat", {u0, Const(g, Ints({24}))}, Attrs(std::pair{"axis", int64_t{0}}));
  g.MarkOutput(Op(g, "Reshape", {x, target2}));
}

TEST(ShapeSimplification, StaticDimsBecomeConstantsSymbolicOnesStay) {
  Graph before, after;
  ShapeChainGraph(before);
  ShapeChainGraph(after);
  std::vector<std::unique_ptr<Pass>> passes;
  passes.push_back(MakeShapeSimplificationPass());
  passes.push_back(MakeDeadNodeEliminationPass());
  PassReport r = RunPasses(after, std::move(passes));
  EXPECT_GT(r.rewrites("shape_simplification"), 0);
  // Left: Shape, Gather(0), Unsqueeze, Concat for the batch dim and the two Reshapes.
  EXPECT_EQ(CountOps(after, "Reshape"), 2);
  EXPECT_EQ(CountOps(after, "Gather"), 1);
  EXPECT_EQ(CountOps(after, "Concat"), 1);
  EXPECT_EQ(after.num_nodes(), 6u);
  ExpectSameOutputs(before, after, {{"n", 3}});
}

TEST(PassManager, RunsToAFixedPointAndReportsPerPass) {
  Graph g;
  FoldableGraph(g);
  auto r = RunDefaultPasses(g, TestOptions());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->reached_fixed_point);
  EXPECT_EQ(r->nodes_before, 3);
  EXPECT_EQ(r->nodes_after, 1);
  EXPECT_EQ(r->rewrites("constant_folding"), 2);
  EXPECT_NE(r->ToString().find("constant_folding"), std::string::npos);
  // The last round changed nothing: at least two rounds ran.
  EXPECT_GE(r->iterations, 2);
}

TEST(PassManager, DisabledPassesDoNotRun) {
  Graph g;
  FoldableGraph(g);
  PassOptions o = TestOptions();
  o.disabled = {"constant_folding"};
  auto r = RunDefaultPasses(g, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(g.num_nodes(), 3u);
  EXPECT_EQ(r->rewrites("constant_folding"), 0);
}

TEST(PassManager, StopsAtTheIterationBound) {
  // A pass that always claims a rewrite never reaches a fixed point; the bound ends the run.
  class Restless final : public Pass {
   public:
    std::string_view name() const override { return "restless"; }
    Status Run(Graph&, PassContext& ctx) override {
      ctx.stats().rewrites += 1;
      return OkStatus();
    }
  };
  Graph g;
  FoldableGraph(g);
  PassOptions o = TestOptions();
  o.max_iterations = 3;
  PassManager pm(o);
  pm.Add(std::make_unique<Restless>());
  auto r = pm.Run(g);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->reached_fixed_point);
  EXPECT_EQ(r->iterations, 3);
  EXPECT_EQ(r->rewrites("restless"), 3);
}

TEST(PassManager, APassErrorNamesThePass) {
  class Failing final : public Pass {
   public:
    std::string_view name() const override { return "failing"; }
    Status Run(Graph&, PassContext&) override {
      return MakeError(ErrorCode::kInternal, "broken on purpose");
    }
  };
  Graph g;
  FoldableGraph(g);
  PassManager pm(TestOptions());
  pm.Add(std::make_unique<Failing>());
  auto r = pm.Run(g);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInternal);
  EXPECT_NE(r.status().ToString().find("failing"), std::string::npos);
}

}  // namespace
}  // namespace kiln::passes
