// slice_concat_fusion: a Concat fed by Slices of ranges of its own axis reads them in place
// (ConcatSlices). torch.roll's export (Swin's shifted windows) over one and two axes, with
// negative and past-the-end bounds and a symbolic batch, a plain input beside the ranges, a Slice
// another node also reads; near misses (another axis, a step of 2, two axes in one Slice, a
// symbolic dim on the axis) stay. Each rewrite gives the unfused graph's outputs exactly, on fresh
// random inputs.
#include <gtest/gtest.h>

#include <limits>

#include "pass_test_util.h"

namespace kiln::passes {
namespace {

using namespace testing;

using Passes = std::vector<std::unique_ptr<Pass>>;
constexpr int64_t kEnd = std::numeric_limits<int64_t>::max();

Passes Only() {
  Passes v;
  v.push_back(MakeSliceConcatFusionPass());
  v.push_back(MakeDeadNodeEliminationPass());
  return v;
}

Value* SliceOf(Graph& g, Value* x, std::vector<int64_t> starts, std::vector<int64_t> ends,
               std::vector<int64_t> axes, std::vector<int64_t> steps = {}) {
  std::vector<Value*> in = {x, Const(g, Ints(std::move(starts))), Const(g, Ints(std::move(ends))),
                            Const(g, Ints(std::move(axes)))};
  if (!steps.empty()) in.push_back(Const(g, Ints(std::move(steps))));
  return Op(g, "Slice", std::move(in));
}

Value* Cat(Graph& g, std::vector<Value*> in, int64_t axis) {
  return Op(g, "Concat", std::move(in), Attrs(std::pair{"axis", axis}));
}

// torch.roll(x, shift, axis) as exported: Concat(x[-shift:], x[:-shift]) along the axis.
Value* Roll(Graph& g, Value* x, int64_t shift, int64_t axis) {
  return Cat(g, {SliceOf(g, x, {-shift}, {kEnd}, {axis}), SliceOf(g, x, {0}, {-shift}, {axis})},
             axis);
}

void RollGraph(Graph& g, Dim batch) {
  Value* x = g.AddInput("x", DataType::kFloat32, {batch, Dim(7), Dim(6), Dim(3)});
  Value* r = Roll(g, Roll(g, x, 3, 1), -2, -2);  // Swin's roll over H, then W
  g.MarkOutput(Op(g, "Relu", {r}));
}

TEST(SliceConcatFusion, RollOverTwoAxesReadsInPlace) {
  for (bool symbolic : {false, true}) {
    SCOPED_TRACE(symbolic ? "symbolic batch" : "static batch");
    const Dim batch = symbolic ? Dim::Symbol("b") : Dim(2);
    Graph before, after;
    RollGraph(before, batch);
    RollGraph(after, batch);
    PassReport r = RunPasses(after, Only());
    EXPECT_EQ(r.rewrites("slice_concat_fusion"), 2);
    EXPECT_EQ(CountOps(after, "ConcatSlices"), 2);
    EXPECT_EQ(CountOps(after, "Slice"), 0);
    EXPECT_EQ(CountOps(after, "Concat"), 0);
    ExpectSameOutputs(before, after, {{"b", 3}}, 0.0);
  }
}

TEST(SliceConcatFusion, RangesAndAPlainInputAndASharedSlice) {
  auto make = [](Graph& g) {
    Value* x = g.AddInput("x", DataType::kFloat32, {Dim(2), Dim(10), Dim(4)});
    Value* y = g.AddInput("y", DataType::kFloat32, {Dim(2), Dim(3), Dim(4)});
    Value* head = SliceOf(g, x, {-100}, {2}, {1});  // clamped to [0, 2)
    Value* tail = SliceOf(g, x, {7}, {kEnd}, {-2});
    g.MarkOutput(Cat(g, {tail, y, head, x}, 1));
    g.MarkOutput(Op(g, "Neg", {head}));  // the Slice has another reader: it stays for it
  };
  Graph before, after;
  make(before);
  make(after);
  PassReport r = RunPasses(after, Only());
  EXPECT_EQ(r.rewrites("slice_concat_fusion"), 1);
  EXPECT_EQ(CountOps(after, "ConcatSlices"), 1);
  EXPECT_EQ(CountOps(after, "Slice"), 1);
  ExpectSameOutputs(before, after, {}, 0.0);
}

TEST(SliceConcatFusion, NearMissesStay) {
  auto make = [](Graph& g, int which) {
    Value* x = g.AddInput("x", DataType::kFloat32, {Dim(2), Dim::Symbol("s"), Dim(6)});
    Value* a = nullptr;
    Value* b = nullptr;
    int64_t axis = 2;
    switch (which) {
      case 0:  // a range of another axis than the Concat's
        a = SliceOf(g, x, {0}, {1}, {0});
        b = SliceOf(g, x, {1}, {2}, {0});
        break;
      case 1:  // a step of 2
        a = SliceOf(g, x, {0}, {kEnd}, {2}, {2});
        b = SliceOf(g, x, {1}, {kEnd}, {2}, {2});
        break;
      case 2:  // one Slice over two axes
        a = SliceOf(g, x, {0, 0}, {1, 3}, {0, 2});
        b = SliceOf(g, x, {0, 3}, {1, 6}, {0, 2});
        break;
      default:  // the Concat's axis is symbolic
        axis = 1;
        a = SliceOf(g, x, {1}, {kEnd}, {1});
        b = SliceOf(g, x, {0}, {1}, {1});
        break;
    }
    g.MarkOutput(Cat(g, {a, b}, axis));
  };
  for (int which = 0; which < 4; ++which) {
    SCOPED_TRACE(which);
    Graph g;
    make(g, which);
    PassReport r = RunPasses(g, Only());
    EXPECT_EQ(r.rewrites("slice_concat_fusion"), 0);
    EXPECT_EQ(CountOps(g, "ConcatSlices"), 0);
  }
}

// A shape computed from slices of Shape (ViT's dynamic-batch reshape) keeps its Concat, whose
// dims-value the Reshape reads.
TEST(SliceConcatFusion, ShapeComputationsStay) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("b"), Dim(4), Dim(6)});
  Value* shape = Op(g, "Shape", {x});
  Value* target = Cat(g, {SliceOf(g, shape, {0}, {1}, {0}), Const(g, Ints({-1}))}, 0);
  g.MarkOutput(Op(g, "Reshape", {x, target}));
  PassReport r = RunPasses(g, Only());
  EXPECT_EQ(r.rewrites("slice_concat_fusion"), 0);
  EXPECT_EQ(CountOps(g, "ConcatSlices"), 0);
}

TEST(SliceConcatFusion, DefaultPipelineFusesARoll) {
  Graph before, after;
  RollGraph(before, Dim(2));
  RollGraph(after, Dim(2));
  auto r = RunDefaultPasses(after, TestOptions());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(CountOps(after, "ConcatSlices"), 2);
  ExpectSameOutputs(before, after, {}, 0.0);
}

}  // namespace
}  // namespace kiln::passes
