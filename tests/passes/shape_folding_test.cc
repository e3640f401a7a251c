// Shape arithmetic folded while shapes are inferred (InferShapes with an evaluator): the
// exporters' pad and slice computations that go through multi-dimensional tensors (a Reshape to
// [-1, 2], a reversed Slice, a Transpose: torch's F.pad in Swin's window attention) or through
// ops without a dims-value rule. Without folding such a Pad is KILN-E2011; with it the Pad's
// pads are a constant, and the graph computes what it computed before.
#include <gtest/gtest.h>

#include <climits>

#include "kiln/ir/weight_program.h"
#include "kiln/ops/op_schema.h"
#include "pass_test_util.h"

namespace kiln::passes {
namespace {

using namespace testing;

using Passes = std::vector<std::unique_ptr<Pass>>;

ShapeEvaluator CpuEvaluator() {
  return [](const Node& n, std::span<const Tensor* const> in) { return cpu::EvaluateNode(n, in); };
}

Value* Scalar64(Graph& g, int64_t v) {
  return Const(g, Tensor::FromVector<int64_t>(DataType::kInt64, {}, {v}));
}

// (window - d % window) % window for dim `axis` of x, as a [1] tensor.
Value* PadTo(Graph& g, Value* shape, int64_t axis, int64_t window) {
  Value* d = Op(g, "Gather", {shape, Scalar64(g, axis)}, Attrs(std::pair{"axis", int64_t{0}}));
  Value* w = Scalar64(g, window);
  Value* r = Op(g, "Mod", {Op(g, "Sub", {w, Op(g, "Mod", {d, w})}), w});
  return Op(g, "Unsqueeze", {r, Const(g, Ints({0}))});
}

// x [n, c, h, w] padded at the end of h and w up to multiples of `window`, with the pads built
// the way torch's F.pad exports them: [pw_begin, pw_end, ph_begin, ph_end] (last dim first),
// reshaped to [-1, 2], reversed along axis 0, transposed, flattened, cast.
void SwinPadGraph(Graph& g, int64_t h, int64_t w, int64_t window) {
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 3, h, w});
  Value* s = Op(g, "Shape", {x});
  Value* zero = Const(g, Ints({0}));
  Value* torch_pads = Op(g, "Concat", {zero, PadTo(g, s, 3, window), zero, PadTo(g, s, 2, window)},
                         Attrs(std::pair{"axis", int64_t{0}}));
  // Padded with zeros for the two leading dims (ConstantOfShape of 8 - 4 elements).
  Value* rest =
      Op(g, "ConstantOfShape", {Const(g, Ints({4}))},
         Attrs(std::pair{"value", Tensor::FromVector<int64_t>(DataType::kInt64, {1}, {0})}));
  Value* all = Op(g, "Concat", {torch_pads, rest}, Attrs(std::pair{"axis", int64_t{0}}));
  Value* pairs = Op(g, "Reshape", {all, Const(g, Ints({-1, 2}))});
  Value* reversed = Op(g, "Slice",
                       {pairs, Const(g, Ints({-1})), Const(g, Ints({INT64_MIN})),
                        Const(g, Ints({0})), Const(g, Ints({-1}))});
  Value* t = Op(g, "Transpose", {reversed}, Attrs(std::pair{"perm", std::vector<int64_t>{1, 0}}));
  Value* flat = Op(g, "Reshape", {t, Const(g, Ints({-1}))});
  Value* pads = Op(g, "Cast", {flat}, Attrs(std::pair{"to", int64_t{7}}));
  g.MarkOutput(Op(g, "Pad", {x, pads}));
}

TEST(ShapeFolding, WithoutFoldingAComputedPadIsDataDependent) {
  Graph g;
  SwinPadGraph(g, 5, 9, 7);
  auto r = InferShapes(g);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kDataDependentShape) << r.status().ToString();
}

TEST(ShapeFolding, FoldsTheChainAndThePadGetsConstantPads) {
  for (auto [h, w] : {std::pair<int64_t, int64_t>{5, 9}, {7, 14}, {1, 8}}) {
    Graph before, after;
    SwinPadGraph(before, h, w, 7);
    SwinPadGraph(after, h, w, 7);
    auto r = InferShapes(after, CpuEvaluator());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    // Only the Pad is left computing; everything before it became constants. The Shape of the
    // input (symbolic batch) stays, unread, for dead-node elimination.
    EXPECT_EQ(after.num_nodes(), 2u);
    EXPECT_EQ(CountOps(after, "Shape"), 1);
    ASSERT_EQ(CountOps(after, "Pad"), 1);
    Node* pad = after.outputs()[0]->producer();
    ASSERT_TRUE(pad->input(1)->is_constant());
    const int64_t ph = (7 - h % 7) % 7, pw = (7 - w % 7) % 7;
    EXPECT_EQ(pad->input(1)->constant()->ToInt64Vector(),
              (std::vector<int64_t>{0, 0, 0, 0, 0, 0, ph, pw}));
    const Shape& out = after.outputs()[0]->shape();
    ASSERT_EQ(out.size(), 4u);
    EXPECT_EQ(out[2], Dim(h + ph));
    EXPECT_EQ(out[3], Dim(w + pw));
    ExpectSameOutputs(before, after, {{"n", 2}});
  }
}

// ViT's TorchScript export: Slice bounds from the sequence length through Min and Where (ops
// whose rules keep no dims-value).
void SliceFromShapesGraph(Graph& g) {
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 10, 4});
  Value* len = Op(g, "Gather", {Op(g, "Shape", {x}), Const(g, Ints({1}))},
                  Attrs(std::pair{"axis", int64_t{0}}));
  Value* end = Op(g, "Min", {len, Const(g, Ints({6}))});
  Value* cond = Op(g, "Greater", {len, Const(g, Ints({3}))});
  Value* start = Op(g, "Where", {cond, Const(g, Ints({1})), Const(g, Ints({0}))});
  g.MarkOutput(Op(g, "Slice", {x, start, end, Const(g, Ints({1}))}));
}

TEST(ShapeFolding, SliceBoundsThroughMinAndWhere) {
  Graph before, after;
  SliceFromShapesGraph(before);
  SliceFromShapesGraph(after);
  auto r = InferShapes(after, CpuEvaluator());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(CountOps(after, "Slice"), 1);
  EXPECT_EQ(CountOps(after, "Where"), 0);
  EXPECT_EQ(CountOps(after, "Min"), 0);
  const Shape& out = after.outputs()[0]->shape();
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[1], Dim(5));
  ExpectSameOutputs(before, after, {{"n", 3}});
}

TEST(ShapeFolding, SymbolicDimsAndLargeOutputsStay) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 4});
  Value* s = Op(g, "Shape", {x});
  // The batch dim is symbolic: Mod of it cannot fold.
  Value* m = Op(g, "Mod", {s, Const(g, Ints({3}))});
  // A large integer tensor from constants is not shape arithmetic: it stays.
  Value* big =
      Op(g, "ConstantOfShape", {Const(g, Ints({5000}))},
         Attrs(std::pair{"value", Tensor::FromVector<int64_t>(DataType::kInt64, {1}, {2})}));
  g.MarkOutput(m);
  g.MarkOutput(big);
  auto r = InferShapes(g, CpuEvaluator());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(CountOps(g, "Mod"), 1);
  EXPECT_EQ(CountOps(g, "Shape"), 1);
  EXPECT_EQ(CountOps(g, "ConstantOfShape"), 1);
}

// torchvision's detection transform: the resized size is floor(h * scale) through float ops
// (scale = min(800 / min(h, w), 1333 / max(h, w)) from the image's constant size), cast back to
// int64. Small float results of constants fold too, so the Resize gets constant sizes.
// Every constant here is a literal (as the importer records ONNX Constant nodes and shape
// arithmetic), not a weight: float results made from weights are not folded (next test).
Value* Literal(Graph& g, Tensor t) {
  Value* v = Const(g, t);
  v->set_provenance(LiteralExpr(t));
  return v;
}

void FloatScaleResizeGraph(Graph& g) {
  Value* x = g.AddInput("x", DataType::kFloat32, {1, 1, 4, 6});
  Value* hw = Literal(g, Tensor::FromVector<float>(DataType::kFloat32, {2}, {4, 6}));
  Value* lo = Op(g, "ReduceMin", {hw}, Attrs(std::pair{"keepdims", int64_t{0}}));
  Value* hi = Op(g, "ReduceMax", {hw}, Attrs(std::pair{"keepdims", int64_t{0}}));
  auto f = [&](float v) {
    return Literal(g, Tensor::FromVector<float>(DataType::kFloat32, {}, {v}));
  };
  Value* scale = Op(g, "Min",
                    {Op(g, "Mul", {Op(g, "Reciprocal", {lo}), f(6.f)}),
                     Op(g, "Mul", {Op(g, "Reciprocal", {hi}), f(15.f)})});  // min(1.5, 2.5)
  Value* sized = Op(g, "Floor", {Op(g, "Mul", {hw, scale})});               // [6, 9]
  Value* hw64 = Op(g, "Cast", {sized}, Attrs(std::pair{"to", int64_t{7}}));
  Value* sizes =
      Op(g, "Concat", {Const(g, Ints({1, 1})), hw64}, Attrs(std::pair{"axis", int64_t{0}}));
  Value* empty = Const(g, Tensor::FromVector<float>(DataType::kFloat32, {0}, {}));
  g.MarkOutput(Op(g, "Resize", {x, empty, empty, sizes}));
}

TEST(ShapeFolding, ResizeSizesThroughAFloatScaleFold) {
  Graph g;
  FloatScaleResizeGraph(g);
  auto r = InferShapes(g, CpuEvaluator());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(CountOps(g, "Resize"), 1);
  EXPECT_EQ(g.num_nodes(), 1u);
  Node* resize = g.outputs()[0]->producer();
  ASSERT_TRUE(resize->input(3)->is_constant());
  EXPECT_EQ(resize->input(3)->constant()->ToInt64Vector(), (std::vector<int64_t>{1, 1, 6, 9}));
  EXPECT_EQ(g.outputs()[0]->shape(), (Shape{1, 1, 6, 9}));
}

TEST(ShapeFolding, SmallFloatResultsOfWeightsStay) {
  // A DequantizeLinear of an INT8 weight of 16 elements (a QDQ model's small kernel) stays for
  // qdq_fusion, and so does a Mul of a float weight; the same Mul of a literal folds.
  for (bool weight : {true, false}) {
    SCOPED_TRACE(weight);
    Graph g;
    g.AddInput("x", DataType::kFloat32, {2});
    Tensor q = Tensor::FromVector<int8_t>(DataType::kInt8, {16}, std::vector<int8_t>(16, 3));
    Tensor w = Tensor::FromVector<float>(DataType::kFloat32, {16}, std::vector<float>(16, 0.5f));
    Value* qv = Const(g, q);
    Value* wv = Const(g, w);
    qv->set_provenance(weight ? InitializerExpr("q", q) : LiteralExpr(q));
    wv->set_provenance(weight ? InitializerExpr("w", w) : LiteralExpr(w));
    g.MarkOutput(Op(g, "DequantizeLinear",
                    {qv, Literal(g, Tensor::FromVector<float>(DataType::kFloat32, {}, {0.25f}))}));
    g.MarkOutput(
        Op(g, "Mul", {wv, Literal(g, Tensor::FromVector<float>(DataType::kFloat32, {}, {2.f}))}));
    auto r = InferShapes(g, CpuEvaluator());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(CountOps(g, "DequantizeLinear"), weight ? 1 : 0);
    EXPECT_EQ(CountOps(g, "Mul"), weight ? 1 : 0);
  }
}

TEST(ShapeFolding, LargeFloatResultsOfConstantsStay) {
  Graph g;
  g.AddInput("x", DataType::kFloat32, {2});
  Value* big =
      Const(g, Tensor::FromVector<float>(DataType::kFloat32, {100}, std::vector<float>(100, 1.5f)));
  g.MarkOutput(Op(g, "Floor", {big}));  // 100 floats: not a size, not folded
  auto r = InferShapes(g, CpuEvaluator());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(CountOps(g, "Floor"), 1);
}

// The Shape of an intermediate tensor with symbolic dims (torch's unflatten reads the shape of
// the value it reshapes; a Transpose read only for its shape) becomes a computation from the
// graph inputs' shapes: the Transpose dies, and the outputs stay as they were for batches the
// build never saw. Each dim a polynomial: b, 30 * b, and c of another input.
TEST(ShapeDetach, ShapesOfIntermediatesComeFromTheInputsShapes) {
  auto build = [](Graph& g) {
    Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("b"), 5, 6});
    Value* z = g.AddInput("z", DataType::kFloat32, {Dim::Symbol("c"), 2});
    Value* t = Op(g, "Transpose", {x}, Attrs(std::pair{"perm", std::vector<int64_t>{1, 0, 2}}));
    Value* s = Op(g, "Shape", {t});  // [5, b, 6]
    // Reshape x to [b * 5, 6] from the transposed shape: Gather dims 0 and 1, Mul, Concat.
    Value* d0 = Op(g, "Gather", {s, Const(g, Ints({0}))}, Attrs(std::pair{"axis", int64_t{0}}));
    Value* d1 = Op(g, "Gather", {s, Const(g, Ints({1}))}, Attrs(std::pair{"axis", int64_t{0}}));
    Value* rows = Op(g, "Mul", {d0, d1});
    Value* target =
        Op(g, "Concat", {rows, Const(g, Ints({6}))}, Attrs(std::pair{"axis", int64_t{0}}));
    g.MarkOutput(Op(g, "Reshape", {x, target}));
    // A shape of two inputs' symbols: an outer product's [30 * b, c, 2].
    Value* flat = Op(g, "Reshape", {x, Const(g, Ints({-1, 1, 1}))});
    Value* outer = Op(g, "Mul", {flat, Op(g, "Unsqueeze", {z, Const(g, Ints({0}))})});
    g.MarkOutput(Op(g, "Shape", {outer}));
  };
  Graph before, after;
  build(before);
  build(after);
  Passes v;
  v.push_back(MakeShapeSimplificationPass());
  v.push_back(MakeDeadNodeEliminationPass());
  RunPasses(after, std::move(v));
  EXPECT_EQ(CountOps(after, "Transpose"), 0);
  for (Node* n : after.nodes()) {
    if (n->op_type() == "Shape") {
      EXPECT_TRUE(n->input(0)->name() == "x" || n->input(0)->name() == "z") << n->input(0)->name();
    }
  }
  for (int64_t b : {1, 3}) {
    ExpectSameOutputs(before, after, {{"b", b}, {"c", 4}});
  }
}

}  // namespace
}  // namespace kiln::passes
