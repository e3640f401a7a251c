// The decoder-layer fusions Llama-style models need, on graphs written the way the exporters
// write Hugging Face's Llama: rotary embeddings (rotate_half with two Slices or a Split, the
// negation as Neg or Mul by -1, either Add order, and GPT-J's interleaved form) become one
// RotaryEmbedding; grouped-query attention reads K and V un-repeated (repeat_kv's Unsqueeze ->
// Expand -> Reshape is bypassed through rank-5 views) with causal, additive and per-head masks;
// the residual Add before an RMSNorm joins it. Every rewrite is checked against the unfused graph
// on fresh random inputs, and the near misses stay unfused.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>

#include "pass_test_util.h"

namespace kiln::passes {
namespace {

using namespace testing;

using Passes = std::vector<std::unique_ptr<Pass>>;

constexpr int64_t kSeq = 6, kHeadDim = 8, kHeads = 4, kKvHeads = 2, kHidden = kHeads * kHeadDim;

Passes Only(std::unique_ptr<Pass> p) {
  Passes v;
  v.push_back(std::move(p));
  v.push_back(MakeDeadNodeEliminationPass());
  return v;
}

Value* LastAxisSlice(Graph& g, Value* x, int64_t start, int64_t end, int64_t step = 1) {
  return Op(g, "Slice",
            {x, Const(g, Ints({start})), Const(g, Ints({end})), Const(g, Ints({-1})),
             Const(g, Ints({step}))});
}

Value* Concat(Graph& g, std::vector<Value*> in, int64_t axis = -1) {
  return Op(g, "Concat", std::move(in), Attrs(std::pair{"axis", axis}));
}

enum class Rope {
  kSlices,
  kSlicesMulMinusOne,
  kSlicesSumSwapped,
  kSplit,
  kSplitSizes,
  kInterleaved
};

// x * cos + rotate(x) * sin over x's last axis (d), as the exporters write it.
Value* ApplyRope(Graph& g, Value* x, Value* cos, Value* sin, Rope form, int64_t d = kHeadDim) {
  const int64_t h = d / 2;
  Value* rot = nullptr;
  auto neg = [&](Value* v) {
    return form == Rope::kSlicesMulMinusOne ? Op(g, "Mul", {v, Const(g, Scalar(-1.f))})
                                            : Op(g, "Neg", {v});
  };
  switch (form) {
    case Rope::kSlices:
    case Rope::kSlicesMulMinusOne:
    case Rope::kSlicesSumSwapped: {
      Value* x1 = LastAxisSlice(g, x, 0, h);
      Value* x2 = LastAxisSlice(g, x, h, std::numeric_limits<int64_t>::max());
      rot = Concat(g, {neg(x2), x1});
      break;
    }
    case Rope::kSplit:
    case Rope::kSplitSizes: {
      std::vector<Value*> in = {x};
      AttributeMap a;
      a.Set("axis", int64_t{-1});
      if (form == Rope::kSplitSizes) {
        in.push_back(Const(g, Ints({h, h})));
      } else {
        a.Set("num_outputs", int64_t{2});
      }
      Value* x1 = g.AddValue(g.UniqueName("x1"));
      Value* x2 = g.AddValue(g.UniqueName("x2"));
      g.AddNode("Split", g.UniqueName("split"), in, {x1, x2}, a);
      rot = Concat(g, {neg(x2), x1});
      break;
    }
    case Rope::kInterleaved: {
      // torch.stack((-x[..., 1::2], x[..., ::2]), -1).flatten(-2)
      Value* even = LastAxisSlice(g, x, 0, std::numeric_limits<int64_t>::max(), 2);
      Value* odd = LastAxisSlice(g, x, 1, std::numeric_limits<int64_t>::max(), 2);
      Value* a = Op(g, "Unsqueeze", {neg(odd), Const(g, Ints({-1}))});
      Value* b = Op(g, "Unsqueeze", {even, Const(g, Ints({-1}))});
      rot = Op(g, "Reshape", {Concat(g, {a, b}), Const(g, Ints({-1, kHeads, kSeq, d}))});
      break;
    }
  }
  Value* xc = Op(g, "Mul", {x, cos});
  Value* rs = Op(g, "Mul", {rot, sin});
  return form == Rope::kSlicesSumSwapped ? Op(g, "Add", {rs, xc}) : Op(g, "Add", {xc, rs});
}

// [b, kHeads, kSeq, kHeadDim] through rope; cos/sin constants [1, 1, S, D] or graph inputs [S, D].
void RopeGraph(Graph& g, Rope form, bool tables_are_inputs) {
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("b"), kHeads, kSeq, kHeadDim});
  Value *cos, *sin;
  if (tables_are_inputs) {
    cos = g.AddInput("cos", DataType::kFloat32, {kSeq, kHeadDim});
    sin = g.AddInput("sin", DataType::kFloat32, {kSeq, kHeadDim});
  } else {
    cos = Const(g, RandomTensor(DataType::kFloat32, {1, 1, kSeq, kHeadDim}, 3));
    sin = Const(g, RandomTensor(DataType::kFloat32, {1, 1, kSeq, kHeadDim}, 4));
  }
  g.MarkOutput(Op(g, "Relu", {ApplyRope(g, x, cos, sin, form)}));
}

TEST(RotaryFusion, EveryExportedFormBecomesOneOp) {
  for (Rope form : {Rope::kSlices, Rope::kSlicesMulMinusOne, Rope::kSlicesSumSwapped, Rope::kSplit,
                    Rope::kSplitSizes, Rope::kInterleaved}) {
    for (bool inputs : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "form " << static_cast<int>(form) << " tables "
                                        << (inputs ? "inputs" : "constants"));
      Graph before, after;
      RopeGraph(before, form, inputs);
      RopeGraph(after, form, inputs);
      PassReport r = RunPasses(after, Only(MakeRotaryFusionPass()));
      EXPECT_EQ(r.rewrites("rotary_fusion"), 1);
      Node* rope = Find(after, "RotaryEmbedding");
      ASSERT_NE(rope, nullptr);
      EXPECT_EQ(rope->attrs().GetInt("interleaved", -1), form == Rope::kInterleaved ? 1 : 0);
      EXPECT_EQ(after.num_nodes(), 2u);  // RotaryEmbedding and Relu
      ExpectSameOutputs(before, after, {{"b", 2}});
    }
  }
}

// Rotations that are not rotate_half: the wrong half negated, a split off the middle, and the
// product with cos taken of another tensor.
TEST(RotaryFusion, NearMissesStay) {
  enum class Miss { kWrongHalfNegated, kOffCentre, kOtherTensorTimesCos };
  for (Miss miss : {Miss::kWrongHalfNegated, Miss::kOffCentre, Miss::kOtherTensorTimesCos}) {
    SCOPED_TRACE(static_cast<int>(miss));
    Graph g;
    Value* x = g.AddInput("x", DataType::kFloat32, {2, kHeads, kSeq, kHeadDim});
    Value* other = g.AddInput("o", DataType::kFloat32, {2, kHeads, kSeq, kHeadDim});
    Value* cos = Const(g, RandomTensor(DataType::kFloat32, {kSeq, kHeadDim}, 3));
    Value* sin = Const(g, RandomTensor(DataType::kFloat32, {kSeq, kHeadDim}, 4));
    int64_t cut = miss == Miss::kOffCentre ? 3 : kHeadDim / 2;
    Value* x1 = LastAxisSlice(g, x, 0, cut);
    Value* x2 = LastAxisSlice(g, x, cut, kHeadDim);
    Value* rot = miss == Miss::kWrongHalfNegated ? Concat(g, {x2, Op(g, "Neg", {x1})})
                                                 : Concat(g, {Op(g, "Neg", {x2}), x1});
    Value* xc = Op(g, "Mul", {miss == Miss::kOtherTensorTimesCos ? other : x, cos});
    g.MarkOutput(Op(g, "Add", {xc, Op(g, "Mul", {rot, sin})}));
    RunPasses(g, Only(MakeRotaryFusionPass()));
    EXPECT_EQ(CountOps(g, "RotaryEmbedding"), 0);
  }
}

// Partial rotary as HF's GPT-NeoX (rotate-half) and GPT-J (interleaved) export it: the first r of
// each head's D elements rotate, Concat(rope(x[..., :r]), x[..., r:]). One RotaryEmbedding with
// rotary_embedding_dim r, checked against the unfused graph (the CPU kernel's partial path).
constexpr int64_t kWideHead = 12, kRot = 8;

void PartialRopeGraph(Graph& g, Rope form, bool tables_are_inputs, int64_t rot = kRot,
                      bool pass_first = false) {
  Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("b"), kHeads, kSeq, kWideHead});
  Value *cos, *sin;
  if (tables_are_inputs) {
    cos = g.AddInput("cos", DataType::kFloat32, {kSeq, rot});
    sin = g.AddInput("sin", DataType::kFloat32, {kSeq, rot});
  } else {
    cos = Const(g, RandomTensor(DataType::kFloat32, {1, 1, kSeq, rot}, 3));
    sin = Const(g, RandomTensor(DataType::kFloat32, {1, 1, kSeq, rot}, 4));
  }
  Value* x_rot = LastAxisSlice(g, x, 0, rot);
  Value* x_pass = LastAxisSlice(g, x, rot, std::numeric_limits<int64_t>::max());
  Value* r = ApplyRope(g, x_rot, cos, sin, form, rot);
  g.MarkOutput(Op(g, "Relu", {pass_first ? Concat(g, {x_pass, r}) : Concat(g, {r, x_pass})}));
}

TEST(RotaryFusion, PartialRotaryBecomesOneOpWithItsDim) {
  for (Rope form : {Rope::kSlices, Rope::kSplit, Rope::kInterleaved}) {
    for (bool inputs : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "form " << static_cast<int>(form) << " tables "
                                        << (inputs ? "inputs" : "constants"));
      Graph before, after;
      PartialRopeGraph(before, form, inputs);
      PartialRopeGraph(after, form, inputs);
      PassReport r = RunPasses(after, Only(MakeRotaryFusionPass()));
      EXPECT_EQ(r.rewrites("rotary_fusion"), 2);  // the rotation, then the partial fold
      Node* rope = Find(after, "RotaryEmbedding");
      ASSERT_NE(rope, nullptr);
      EXPECT_EQ(rope->attrs().GetInt("rotary_embedding_dim", -1), kRot);
      EXPECT_EQ(rope->attrs().GetInt("interleaved", -1), form == Rope::kInterleaved ? 1 : 0);
      EXPECT_EQ(rope->input(0)->name(), "x");
      EXPECT_EQ(after.num_nodes(), 2u);  // RotaryEmbedding and Relu
      ExpectSameOutputs(before, after, {{"b", 2}});
    }
  }
}

// The pass-through part first, and a rotation whose result is read elsewhere too: the rotation
// fuses over its slice, the Concat stays.
TEST(RotaryFusion, PartialNearMissesKeepTheConcat) {
  {
    Graph before, after;
    PartialRopeGraph(before, Rope::kSlices, false, kRot, /*pass_first=*/true);
    PartialRopeGraph(after, Rope::kSlices, false, kRot, /*pass_first=*/true);
    RunPasses(after, Only(MakeRotaryFusionPass()));
    ASSERT_NE(Find(after, "RotaryEmbedding"), nullptr);
    EXPECT_EQ(Find(after, "RotaryEmbedding")->attrs().GetInt("rotary_embedding_dim", 0), 0);
    EXPECT_EQ(CountOps(after, "Concat"), 1);
    ExpectSameOutputs(before, after, {{"b", 2}});
  }
  {
    Graph g;
    Value* x = g.AddInput("x", DataType::kFloat32, {2, kHeads, kSeq, kWideHead});
    Value* cos = Const(g, RandomTensor(DataType::kFloat32, {kSeq, kRot}, 3));
    Value* sin = Const(g, RandomTensor(DataType::kFloat32, {kSeq, kRot}, 4));
    Value* r = ApplyRope(g, LastAxisSlice(g, x, 0, kRot), cos, sin, Rope::kSlices, kRot);
    g.MarkOutput(Op(g, "Relu", {Concat(g, {r, LastAxisSlice(g, x, kRot, kWideHead)})}));
    g.MarkOutput(Op(g, "Neg", {r}));
    RunPasses(g, Only(MakeRotaryFusionPass()));
    EXPECT_EQ(Find(g, "RotaryEmbedding")->attrs().GetInt("rotary_embedding_dim", 0), 0);
    EXPECT_EQ(CountOps(g, "Concat"), 1);
  }
}

TEST(RotaryShapeRule, PartialDimMustBeEvenAndFitX) {
  for (const auto& [rot, table, ok] : std::vector<std::tuple<int64_t, int64_t, bool>>{
           {8, 8, true}, {12, 12, true}, {7, 7, false}, {14, 14, false}, {8, 12, false}}) {
    SCOPED_TRACE(::testing::Message() << "rot " << rot << " table " << table);
    Graph g;
    Value* x = g.AddInput("x", DataType::kFloat32, {2, kSeq, kWideHead});
    Value* c = g.AddInput("c", DataType::kFloat32, {kSeq, table});
    Value* y = g.AddValue("y");
    AttributeMap a;
    a.Set("rotary_embedding_dim", rot);
    g.AddNode("RotaryEmbedding", "rope", {x, c, c}, {y}, a);
    auto r = InferShapes(g);
    EXPECT_EQ(r.ok(), ok) << (r.ok() ? "" : r.status().ToString());
    if (ok) EXPECT_EQ(y->shape(), x->shape());
  }
}

// ---- grouped-query attention

enum class Mask { kCausalConstant, kAdditiveInput, kPerHeadInput, kRank2Input, kNone };

// [b, kv, S, D] -> [b, kv * n, S, D] as repeat_kv exports it (Unsqueeze -> Expand -> Reshape).
Value* RepeatKv(Graph& g, Value* x) {
  const int64_t n = kHeads / kKvHeads;
  Value* u = Op(g, "Unsqueeze", {x, Const(g, Ints({2}))});
  Value* e = Op(g, "Expand", {u, Const(g, Ints({1, kKvHeads, n, kSeq, kHeadDim}))});
  return Op(g, "Reshape", {e, Const(g, Ints({-1, kHeads, kSeq, kHeadDim}))});
}

Value* CausalMask(Graph& g) {
  Tensor m(DataType::kFloat32, {1, 1, kSeq, kSeq});
  for (int64_t i = 0; i < kSeq; ++i) {
    for (int64_t j = 0; j < kSeq; ++j) {
      StoreFromDouble(m.view(), i * kSeq + j, j > i ? -std::numeric_limits<double>::infinity() : 0);
    }
  }
  return Const(g, m);
}

// softmax(q k^T / sqrt(D) + mask) v with K and V repeated, then the head merge: [b, S, hidden].
void GqaGraph(Graph& g, Mask mask) {
  Dim b = Dim::Symbol("b");
  Value* q = g.AddInput("q", DataType::kFloat32, {b, kHeads, kSeq, kHeadDim});
  Value* k = g.AddInput("k", DataType::kFloat32, {b, kKvHeads, kSeq, kHeadDim});
  Value* v = g.AddInput("v", DataType::kFloat32, {b, kKvHeads, kSeq, kHeadDim});
  Value* kt = Op(g, "Transpose", {RepeatKv(g, k)},
                 Attrs(std::pair{"perm", std::vector<int64_t>{0, 1, 3, 2}}));
  Value* s = Op(g, "Div", {Op(g, "MatMul", {q, kt}), Const(g, Scalar(std::sqrt(8.f)))});
  switch (mask) {
    case Mask::kCausalConstant:
      s = Op(g, "Add", {s, CausalMask(g)});
      break;
    case Mask::kAdditiveInput:
      s = Op(g, "Add", {s, g.AddInput("m", DataType::kFloat32, {b, 1, kSeq, kSeq})});
      break;
    case Mask::kPerHeadInput:
      s = Op(g, "Add", {s, g.AddInput("m", DataType::kFloat32, {1, kHeads, kSeq, kSeq})});
      break;
    case Mask::kRank2Input:
      s = Op(g, "Add", {s, g.AddInput("m", DataType::kFloat32, {kSeq, kSeq})});
      break;
    case Mask::kNone:
      break;
  }
  Value* p = Op(g, "Softmax", {s}, Attrs(std::pair{"axis", int64_t{-1}}));
  Value* o = Op(g, "MatMul", {p, RepeatKv(g, v)});
  Value* z = Op(g, "Transpose", {o}, Attrs(std::pair{"perm", std::vector<int64_t>{0, 2, 1, 3}}));
  g.MarkOutput(Op(g, "Reshape", {z, Const(g, Ints({-1, kSeq, kHidden}))}));
}

TEST(AttentionFusion, GroupedQueryAttentionReadsKAndVUnrepeated) {
  for (Mask mask : {Mask::kCausalConstant, Mask::kAdditiveInput, Mask::kPerHeadInput,
                    Mask::kRank2Input, Mask::kNone}) {
    SCOPED_TRACE(static_cast<int>(mask));
    Graph before, after;
    GqaGraph(before, mask);
    GqaGraph(after, mask);
    PassReport r = RunPasses(after, Only(MakeAttentionFusionPass()));
    EXPECT_EQ(r.rewrites("attention_fusion"), 1);
    Node* a = Find(after, "Attention");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(CountOps(after, "Expand"), 0);  // no repeated copy of K or V is made
    EXPECT_EQ(CountOps(after, "Softmax"), 0);
    // K and V as [b, kv, 1, S, D]: the Unsqueeze's output, read directly.
    for (int i = 1; i < 3; ++i) {
      ASSERT_TRUE(a->input(i)->has_shape());
      EXPECT_EQ(a->input(i)->shape(), (Shape{Dim::Symbol("b"), kKvHeads, 1, kSeq, kHeadDim}));
    }
    EXPECT_EQ(a->attrs().GetString("mask_kind", ""), mask == Mask::kCausalConstant ? "causal"
                                                     : mask == Mask::kNone         ? "none"
                                                                                   : "additive");
    ExpectSameOutputs(before, after, {{"b", 3}});
  }
}

// Batch and sequence both dynamic: repeat_kv's Expand to [1, kv, n, 1, 1] (broadcasting the
// rest) and a [b, 1, s, s] mask, which the fused Attention reads through an Unsqueeze (a Reshape
// could not express two dynamic dims); checked at two sequence lengths.
TEST(AttentionFusion, GroupedQueryAttentionWithDynamicSequence) {
  const int64_t n = kHeads / kKvHeads;
  auto make = [&](Graph& g) {
    Dim b = Dim::Symbol("b"), s = Dim::Symbol("s");
    Value* q = g.AddInput("q", DataType::kFloat32, {b, kHeads, s, kHeadDim});
    Value* mask = g.AddInput("m", DataType::kFloat32, {b, 1, s, s});
    auto repeat = [&](Value* x) {
      Value* u = Op(g, "Unsqueeze", {x, Const(g, Ints({2}))});
      Value* e = Op(g, "Expand", {u, Const(g, Ints({1, kKvHeads, n, 1, 1}))});
      return Op(g, "Reshape", {e, Const(g, Ints({0, kHeads, -1, kHeadDim}))});
    };
    Value* k = repeat(g.AddInput("k", DataType::kFloat32, {b, kKvHeads, s, kHeadDim}));
    Value* v = repeat(g.AddInput("v", DataType::kFloat32, {b, kKvHeads, s, kHeadDim}));
    Value* kt = Op(g, "Transpose", {k}, Attrs(std::pair{"perm", std::vector<int64_t>{0, 1, 3, 2}}));
    Value* sc =
        Op(g, "Add", {Op(g, "Mul", {Op(g, "MatMul", {q, kt}), Const(g, Scalar(0.3f))}), mask});
    Value* p = Op(g, "Softmax", {sc}, Attrs(std::pair{"axis", int64_t{-1}}));
    g.MarkOutput(Op(g, "MatMul", {p, v}));
  };
  Graph before, after;
  make(before);
  make(after);
  PassReport r = RunPasses(after, Only(MakeAttentionFusionPass()));
  EXPECT_EQ(r.rewrites("attention_fusion"), 1);
  Node* a = Find(after, "Attention");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->input(0)->shape().size(), 5u);
  EXPECT_EQ(CountOps(after, "Expand"), 0);
  EXPECT_EQ(CountOps(after, "Unsqueeze"), 3);  // K's, V's and the mask's
  for (int64_t seq : {5, 9}) {
    SCOPED_TRACE(seq);
    ExpectSameOutputs(before, after, {{"b", 2}, {"s", seq}});
  }
}

// K repeated and V not (or repeated differently) is not grouped attention: the plain fusion.
TEST(AttentionFusion, OnlyKRepeatedStaysPlain) {
  Graph g;
  Value* q = g.AddInput("q", DataType::kFloat32, {2, kHeads, kSeq, kHeadDim});
  Value* k = g.AddInput("k", DataType::kFloat32, {2, kKvHeads, kSeq, kHeadDim});
  Value* v = g.AddInput("v", DataType::kFloat32, {2, kHeads, kSeq, kHeadDim});
  Value* kt = Op(g, "Transpose", {RepeatKv(g, k)},
                 Attrs(std::pair{"perm", std::vector<int64_t>{0, 1, 3, 2}}));
  Value* p = Op(g, "Softmax", {Op(g, "MatMul", {q, kt})}, Attrs(std::pair{"axis", int64_t{-1}}));
  g.MarkOutput(Op(g, "MatMul", {p, v}));
  RunPasses(g, Only(MakeAttentionFusionPass()));
  Node* a = Find(g, "Attention");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->input(0)->shape().size(), 4u);
  EXPECT_EQ(CountOps(g, "Expand"), 1);
}

// A constant additive mask is causal only when it is exactly 0 on and below the diagonal and very
// negative above it (Llama's export: float32's lowest above the diagonal); a mask that also hides
// a key below the diagonal, or shows one above it, stays an additive input.
TEST(AttentionFusion, ConstantAdditiveMaskIsCausalOnlyWhenItIsTheCausalMask) {
  enum class Form { kLowest, kHidesABelowDiagonalKey, kShowsAnAboveDiagonalKey };
  for (Form form : {Form::kLowest, Form::kHidesABelowDiagonalKey, Form::kShowsAnAboveDiagonalKey}) {
    SCOPED_TRACE(static_cast<int>(form));
    auto make = [&](Graph& g) {
      Tensor mask(DataType::kFloat32, {1, 1, kSeq, kSeq});
      for (int64_t i = 0; i < kSeq; ++i) {
        for (int64_t j = 0; j < kSeq; ++j) {
          double v = j > i ? std::numeric_limits<float>::lowest() : 0.0;
          if (form == Form::kHidesABelowDiagonalKey && i == 3 && j == 1) v = -1e9;
          if (form == Form::kShowsAnAboveDiagonalKey && i == 1 && j == 4) v = 0.0;
          StoreFromDouble(mask.view(), i * kSeq + j, v);
        }
      }
      Value* q = g.AddInput("q", DataType::kFloat32, {2, kHeads, kSeq, kHeadDim});
      Value* k = g.AddInput("k", DataType::kFloat32, {2, kHeads, kSeq, kHeadDim});
      Value* v = g.AddInput("v", DataType::kFloat32, {2, kHeads, kSeq, kHeadDim});
      Value* kt =
          Op(g, "Transpose", {k}, Attrs(std::pair{"perm", std::vector<int64_t>{0, 1, 3, 2}}));
      Value* sc = Op(g, "Add", {Op(g, "MatMul", {q, kt}), Const(g, mask)});
      g.MarkOutput(
          Op(g, "MatMul", {Op(g, "Softmax", {sc}, Attrs(std::pair{"axis", int64_t{-1}})), v}));
    };
    Graph before, after;
    make(before);
    make(after);
    RunPasses(after, Only(MakeAttentionFusionPass()));
    Node* a = Find(after, "Attention");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->attrs().GetString("mask_kind", ""), form == Form::kLowest ? "causal" : "additive");
    EXPECT_EQ(a->num_inputs(), form == Form::kLowest ? 3u : 4u);
    ExpectSameOutputs(before, after);
  }
}

// ---- residual Add + RMSNorm

Value* Rms(Graph& g, Value* x, uint32_t seed) {
  Value* ms = Op(g, "ReduceMean", {Op(g, "Pow", {x, Const(g, Scalar(2.f))}), Const(g, Ints({-1}))});
  Value* root = Op(g, "Sqrt", {Op(g, "Add", {ms, Const(g, Scalar(1e-6f))})});
  Value* n = Op(g, "Mul", {x, Op(g, "Div", {Const(g, Scalar(1.f)), root})});
  return Op(g, "Mul", {Const(g, RandomTensor(DataType::kFloat32, {kHidden}, seed, 0.5, 1.5)), n});
}

Value* Linear(Graph& g, Value* x, int64_t in, int64_t out, uint32_t seed) {
  return Op(g, "MatMul",
            {x, Const(g, RandomTensor(DataType::kFloat32, {in, out}, seed, -0.3, 0.3))});
}

// Pre-norm residual stream: h1 = x + f(rms(x)); h2 = h1 + f(rms(h1)); y = rms(h2).
TEST(SkipRmsNormFusion, ResidualStreamKeepsTheSum) {
  auto make = [](Graph& g) {
    Value* x = g.AddInput("x", DataType::kFloat32, {Dim::Symbol("b"), kSeq, kHidden});
    Value* h1 = Op(g, "Add", {x, Linear(g, Rms(g, x, 1), kHidden, kHidden, 2)});
    Value* h2 = Op(g, "Add", {h1, Linear(g, Rms(g, h1, 3), kHidden, kHidden, 4)});
    g.MarkOutput(Rms(g, h2, 5));
  };
  Graph before, after;
  make(before);
  make(after);
  Passes p;
  p.push_back(MakeRmsNormFusionPass());
  p.push_back(MakeSkipLayerNormFusionPass());
  p.push_back(MakeDeadNodeEliminationPass());
  PassReport r = RunPasses(after, std::move(p));
  EXPECT_EQ(r.rewrites("skip_layernorm_fusion"), 2);
  EXPECT_EQ(CountOps(after, "RMSNormalization"), 1);  // the first norm has no residual before it
  EXPECT_EQ(CountOps(after, "Add"), 0);
  int with_sum = 0;
  for (Node* n : after.nodes()) {
    if (n->op_type() == "SkipRMSNormalization") with_sum += n->num_outputs() == 2;
  }
  EXPECT_EQ(with_sum, 1);  // h1 is read again by the second residual Add; h2 is not
  ExpectSameOutputs(before, after, {{"b", 2}});
}

// ---- a whole decoder layer through the default pipeline

void DecoderLayer(Graph& g) {
  Dim b = Dim::Symbol("b");
  Value* x = g.AddInput("x", DataType::kFloat32, {b, kSeq, kHidden});
  Value* cos = Const(g, RandomTensor(DataType::kFloat32, {1, 1, kSeq, kHeadDim}, 7));
  Value* sin = Const(g, RandomTensor(DataType::kFloat32, {1, 1, kSeq, kHeadDim}, 8));
  auto heads = [&](Value* t, int64_t n) {
    Value* r = Op(g, "Reshape", {t, Const(g, Ints({-1, kSeq, n, kHeadDim}))});
    return Op(g, "Transpose", {r}, Attrs(std::pair{"perm", std::vector<int64_t>{0, 2, 1, 3}}));
  };
  Value* h = Rms(g, x, 1);
  Value* q =
      ApplyRope(g, heads(Linear(g, h, kHidden, kHidden, 2), kHeads), cos, sin, Rope::kSlices);
  Value* k = heads(Linear(g, h, kHidden, kKvHeads * kHeadDim, 3), kKvHeads);
  // K's rope on [b, kv, S, D]: the tables broadcast the same way.
  {
    const int64_t hd = kHeadDim / 2;
    Value* x1 = LastAxisSlice(g, k, 0, hd);
    Value* x2 = LastAxisSlice(g, k, hd, std::numeric_limits<int64_t>::max());
    Value* rot = Concat(g, {Op(g, "Neg", {x2}), x1});
    k = Op(g, "Add", {Op(g, "Mul", {k, cos}), Op(g, "Mul", {rot, sin})});
  }
  Value* v = heads(Linear(g, h, kHidden, kKvHeads * kHeadDim, 4), kKvHeads);
  Value* kt = Op(g, "Transpose", {RepeatKv(g, k)},
                 Attrs(std::pair{"perm", std::vector<int64_t>{0, 1, 3, 2}}));
  Value* s = Op(g, "Div", {Op(g, "MatMul", {q, kt}), Const(g, Scalar(std::sqrt(8.f)))});
  Value* p =
      Op(g, "Softmax", {Op(g, "Add", {s, CausalMask(g)})}, Attrs(std::pair{"axis", int64_t{-1}}));
  Value* o = Op(g, "Transpose", {Op(g, "MatMul", {p, RepeatKv(g, v)})},
                Attrs(std::pair{"perm", std::vector<int64_t>{0, 2, 1, 3}}));
  o = Op(g, "Reshape", {o, Const(g, Ints({-1, kSeq, kHidden}))});
  Value* x2 = Op(g, "Add", {x, Linear(g, o, kHidden, kHidden, 5)});
  Value* h2 = Rms(g, x2, 6);
  Value* gate = Linear(g, h2, kHidden, 24, 9);
  Value* act = Op(g, "Mul", {gate, Op(g, "Sigmoid", {gate})});
  Value* mlp = Linear(g, Op(g, "Mul", {act, Linear(g, h2, kHidden, 24, 10)}), 24, kHidden, 11);
  g.MarkOutput(Rms(g, Op(g, "Add", {x2, mlp}), 12));
}

TEST(DecoderLayer, DefaultPipelineFusesRopeGqaAndResidualNorms) {
  Graph before, after;
  DecoderLayer(before);
  DecoderLayer(after);
  auto r = RunDefaultPasses(after, TestOptions());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  SCOPED_TRACE(r->ToString());
  EXPECT_EQ(CountOps(after, "RotaryEmbedding"), 2);
  EXPECT_EQ(CountOps(after, "Attention"), 1);
  EXPECT_EQ(CountOps(after, "SkipRMSNormalization"), 2);
  EXPECT_EQ(CountOps(after, "RMSNormalization"), 1);
  for (const char* gone : {"Expand", "Slice", "Neg", "Concat", "Softmax", "Add", "Mul"}) {
    EXPECT_EQ(CountOps(after, gone), 0) << gone;
  }
  Node* a = Find(after, "Attention");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->attrs().GetString("mask_kind", ""), "causal");
  // The head split moved below the rotations, and the attention reads Q [b, S, kv, n, D], K and
  // V [b, S, kv, 1, D] and writes Y [b, S, kv, n, D] in place: no Transpose is left.
  EXPECT_EQ(a->attrs().GetString("layout", ""), "bshd");
  EXPECT_EQ(CountOps(after, "Transpose"), 0);
  const int64_t n = kHeads / kKvHeads;
  ASSERT_TRUE(a->input(0)->has_shape() && a->input(1)->has_shape() && a->output(0)->has_shape());
  EXPECT_EQ(a->input(0)->shape(), (Shape{Dim::Symbol("b"), kSeq, kKvHeads, n, kHeadDim}));
  EXPECT_EQ(a->input(1)->shape(), (Shape{Dim::Symbol("b"), kSeq, kKvHeads, 1, kHeadDim}));
  EXPECT_EQ(a->output(0)->shape(), (Shape{Dim::Symbol("b"), kSeq, kKvHeads, n, kHeadDim}));
  ExpectSameOutputs(before, after, {{"b", 2}}, 1e-4);
}

// ---- the head split below the rotations: attention reads the projections in place

enum class Tables { kConstant, kPerBatchInputs, kSeqInputs };

struct RopeAttentionCase {
  int64_t kv_heads;
  Tables tables;
  bool q_rotation_is_an_output;  // something besides the attention reads rotated Q
  Rope q_form = Rope::kSplit;    // (kInterleaved reshapes to kHeads heads: Q only)
};

// Projections -> head split -> rotary on Q and K -> attention (K and V repeated when kv_heads <
// kHeads) -> head merge, with the tables constant [1, 1, S, D], computed [b, 1, S, D] (graph
// inputs here) or [S, D].
void RopeAttention(Graph& g, const RopeAttentionCase& c) {
  Dim b = Dim::Symbol("b");
  Value* x = g.AddInput("x", DataType::kFloat32, {b, kSeq, kHidden});
  Value *cos = nullptr, *sin = nullptr;
  switch (c.tables) {
    case Tables::kConstant:
      cos = Const(g, RandomTensor(DataType::kFloat32, {1, 1, kSeq, kHeadDim}, 7));
      sin = Const(g, RandomTensor(DataType::kFloat32, {1, 1, kSeq, kHeadDim}, 8));
      break;
    case Tables::kPerBatchInputs:
      cos = g.AddInput("cos", DataType::kFloat32, {b, 1, kSeq, kHeadDim});
      sin = g.AddInput("sin", DataType::kFloat32, {b, 1, kSeq, kHeadDim});
      break;
    case Tables::kSeqInputs:
      cos = g.AddInput("cos", DataType::kFloat32, {kSeq, kHeadDim});
      sin = g.AddInput("sin", DataType::kFloat32, {kSeq, kHeadDim});
      break;
  }
  auto heads = [&](Value* t, int64_t n) {
    Value* r = Op(g, "Reshape", {t, Const(g, Ints({-1, kSeq, n, kHeadDim}))});
    return Op(g, "Transpose", {r}, Attrs(std::pair{"perm", std::vector<int64_t>{0, 2, 1, 3}}));
  };
  const int64_t kv = c.kv_heads;
  Value* q = ApplyRope(g, heads(Linear(g, x, kHidden, kHidden, 2), kHeads), cos, sin, c.q_form);
  Value* k =
      ApplyRope(g, heads(Linear(g, x, kHidden, kv * kHeadDim, 3), kv), cos, sin, Rope::kSlices);
  Value* v = heads(Linear(g, x, kHidden, kv * kHeadDim, 4), kv);
  if (kv != kHeads) {
    k = RepeatKv(g, k);
    v = RepeatKv(g, v);
  }
  Value* kt = Op(g, "Transpose", {k}, Attrs(std::pair{"perm", std::vector<int64_t>{0, 1, 3, 2}}));
  Value* s = Op(g, "Div", {Op(g, "MatMul", {q, kt}), Const(g, Scalar(std::sqrt(8.f)))});
  Value* p =
      Op(g, "Softmax", {Op(g, "Add", {s, CausalMask(g)})}, Attrs(std::pair{"axis", int64_t{-1}}));
  Value* o = Op(g, "Transpose", {Op(g, "MatMul", {p, v})},
                Attrs(std::pair{"perm", std::vector<int64_t>{0, 2, 1, 3}}));
  o = Op(g, "Reshape", {o, Const(g, Ints({-1, kSeq, kHidden}))});
  g.MarkOutput(Linear(g, o, kHidden, kHidden, 5));
  if (c.q_rotation_is_an_output) g.MarkOutput(q);
}

TEST(AttentionLayout, HeadSplitMovesBelowTheRotationsForGroupedAndPlainHeads) {
  std::vector<RopeAttentionCase> cases;
  for (int64_t kv : {kKvHeads, kHeads}) {
    for (Tables t : {Tables::kConstant, Tables::kPerBatchInputs, Tables::kSeqInputs}) {
      cases.push_back({kv, t, false});
    }
  }
  cases.push_back({kHeads, Tables::kSeqInputs, false, Rope::kInterleaved});  // GPT-J's rotation
  for (const RopeAttentionCase& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "kv heads " << c.kv_heads << ", tables " << static_cast<int>(c.tables)
                 << ", form " << static_cast<int>(c.q_form));
    Graph before, after;
    RopeAttention(before, c);
    RopeAttention(after, c);
    auto r = RunDefaultPasses(after, TestOptions());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    SCOPED_TRACE(r->ToString());
    EXPECT_EQ(CountOps(after, "RotaryEmbedding"), 2);
    EXPECT_EQ(CountOps(after, "Transpose"), 0);
    Node* a = Find(after, "Attention");
    ASSERT_NE(a, nullptr);
    const std::string layout = a->attrs().GetString("layout", "");
    EXPECT_TRUE(layout == "bshd" || layout == "bsd") << layout;
    for (Node* n : after.nodes()) {
      if (n->op_type() != "RotaryEmbedding") continue;
      ASSERT_TRUE(n->output(0)->has_shape());
      EXPECT_EQ(n->output(0)->shape()[1], Dim(kSeq));  // [b, S, heads, D]: rotated unsplit
    }
    ExpectSameOutputs(before, after, {{"b", 3}}, 1e-4);
  }
}

// Rotated Q is also a graph output: the rotation keeps its [b, H, S, D] input, and the attention
// its head split.
TEST(AttentionLayout, RotationReadByMoreThanTheAttentionStays) {
  const RopeAttentionCase c{kKvHeads, Tables::kConstant, true};
  Graph before, after;
  RopeAttention(before, c);
  RopeAttention(after, c);
  auto r = RunDefaultPasses(after, TestOptions());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Node* a = Find(after, "Attention");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->attrs().GetString("layout", "bhsd"), "bhsd");
  EXPECT_GE(CountOps(after, "Transpose"), 1);
  ExpectSameOutputs(before, after, {{"b", 2}}, 1e-4);
}

}  // namespace
}  // namespace kiln::passes
