// Decoders' attention as their exports write it, beyond the forms attention_fusion matches
// directly: GPT-J scales after the causal Where, GPT-Neo and GPT-NeoX add the padding mask after
// it, GPT-NeoX (baddbmm), OPT and BLOOM compute the scores as torch.bmm over [B*H, S, D] views.
// attention_canonicalization, batch_unflatten and identity_elimination's Add-of-zero bring each
// to MatMul -> scale -> mask -> Softmax over the [B, H, S, D] heads; the default pipeline then
// fuses it. Every graph is compared with the unfused one on random inputs.
#include <gtest/gtest.h>

#include <limits>

#include "kiln/ir/weight_program.h"
#include "pass_test_util.h"

namespace kiln::passes {
namespace {

using namespace testing;

constexpr int64_t kB = 2, kH = 2, kS = 6, kD = 4;

// The [1, 1, 8, 8] lower-triangular buffer that decoders slice to [1, 1, S, S].
Value* CausalCond(Graph& g) {
  std::vector<uint8_t> tril(64);
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) tril[i * 8 + j] = j <= i;
  }
  Value* buf = Const(g, Tensor::FromVector<uint8_t>(DataType::kBool, {1, 1, 8, 8}, tril));
  Value* rows =
      Op(g, "Slice", {buf, Const(g, Ints({0})), Const(g, Ints({kS})), Const(g, Ints({2}))});
  return Op(g, "Slice", {rows, Const(g, Ints({0})), Const(g, Ints({kS})), Const(g, Ints({3}))});
}

Value* Lowest(Graph& g) { return Const(g, Scalar(std::numeric_limits<float>::lowest())); }

Value* KTransposed(Graph& g, Value* k) {
  return Op(g, "Transpose", {k}, Attrs(std::pair{"perm", std::vector<int64_t>{0, 1, 3, 2}}));
}

enum class Form {
  kScaleAfterWhere,  // GPT-J: Div(Where(causal, q k^T, min), c)
  kMaskAfterWhere,   // GPT-Neo: Add(Where(causal, q k^T, min), mask)
  kBmmBaddbmm,       // GPT-NeoX: Reshape(Add(Mul(bmm(q3, k3^T), a), zeros), 4-D), Where, Add mask
  kBmmBothProducts,  // both products as bmm over [B*H, ., .] views
  kOpt,              // OPT: bmm, 4-D view, Add mask, Max(., lowest), 3-D view, Softmax, bmm
  kBloom,            // BLOOM: baddbmm onto ALiBi [B*H, 1, S], 4-D view, Add mask, Softmax, bmm
};

void DecoderGraph(Graph& g, Form form) {
  Value* q = g.AddInput("q", DataType::kFloat32, {kB, kH, kS, kD});
  Value* k = g.AddInput("k", DataType::kFloat32, {kB, kH, kS, kD});
  Value* v = g.AddInput("v", DataType::kFloat32, {kB, kH, kS, kD});
  Value* mask = form == Form::kScaleAfterWhere
                    ? nullptr
                    : g.AddInput("mask", DataType::kFloat32, {kB, 1, 1, kS});
  Value* scores = nullptr;
  if (form == Form::kBmmBaddbmm || form == Form::kBmmBothProducts || form == Form::kOpt ||
      form == Form::kBloom) {
    Value* q3 = Op(g, "Reshape", {q, Const(g, Ints({kB * kH, kS, kD}))});
    Value* k3 = Op(g, "Reshape", {k, Const(g, Ints({kB * kH, kS, kD}))});
    Value* kt3 = Op(g, "Transpose", {k3}, Attrs(std::pair{"perm", std::vector<int64_t>{0, 2, 1}}));
    Value* s3 = Op(g, "Mul", {Op(g, "MatMul", {q3, kt3}), Const(g, Scalar(0.5f))});
    if (form == Form::kBmmBaddbmm) {
      Value* zeros = AddLiteralConstant(g, "zeros", Tensor(DataType::kFloat32, {kB * kH, kS, kS}));
      s3 = Op(g, "Add", {s3, zeros});
    }
    if (form == Form::kBloom) {
      s3 = Op(g, "Add", {s3, Const(g, RandomTensor(DataType::kFloat32, {kB * kH, 1, kS}, 5))});
    }
    scores = Op(g, "Reshape", {s3, Const(g, Ints({kB, kH, kS, kS}))});
  } else {
    scores = Op(g, "MatMul", {q, KTransposed(g, k)});
  }
  if (form == Form::kOpt || form == Form::kBloom) {
    Value* masked = Op(g, "Add", {scores, mask});
    if (form == Form::kOpt) masked = Op(g, "Max", {masked, Lowest(g)});
    masked = Op(g, "Reshape", {masked, Const(g, Ints({kB * kH, kS, kS}))});
    Value* p = Op(g, "Softmax", {masked}, Attrs(std::pair{"axis", int64_t{-1}}));
    Value* v3 = Op(g, "Reshape", {v, Const(g, Ints({kB * kH, kS, kD}))});
    Value* y = Op(g, "Reshape", {Op(g, "MatMul", {p, v3}), Const(g, Ints({kB, kH, kS, kD}))});
    g.MarkOutput(Op(g, "Relu", {y}));
    return;
  }
  Value* masked = Op(g, "Where", {CausalCond(g), scores, Lowest(g)});
  if (form == Form::kScaleAfterWhere) masked = Op(g, "Div", {masked, Const(g, Scalar(2.f))});
  if (mask) masked = Op(g, "Add", {masked, mask});
  Value* p = Op(g, "Softmax", {masked}, Attrs(std::pair{"axis", int64_t{-1}}));
  Value* y = nullptr;
  if (form == Form::kBmmBothProducts) {
    Value* p3 = Op(g, "Reshape", {p, Const(g, Ints({kB * kH, kS, kS}))});
    Value* v3 = Op(g, "Reshape", {v, Const(g, Ints({kB * kH, kS, kD}))});
    y = Op(g, "Reshape", {Op(g, "MatMul", {p3, v3}), Const(g, Ints({kB, kH, kS, kD}))});
  } else {
    y = Op(g, "MatMul", {p, v});
  }
  g.MarkOutput(Op(g, "Relu", {y}));
}

TEST(DecoderAttention, EveryFormFusesInTheDefaultPipeline) {
  for (Form form : {Form::kScaleAfterWhere, Form::kMaskAfterWhere, Form::kBmmBaddbmm,
                    Form::kBmmBothProducts, Form::kOpt, Form::kBloom}) {
    SCOPED_TRACE(static_cast<int>(form));
    Graph before, after;
    DecoderGraph(before, form);
    DecoderGraph(after, form);
    auto r = RunDefaultPasses(after, TestOptions());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    Node* a = Find(after, "Attention");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(CountOps(after, "Softmax"), 0);
    EXPECT_EQ(CountOps(after, "MatMul"), 0);
    if (form == Form::kScaleAfterWhere) {
      // The causal buffer is recognised once the scale sits above the Where.
      EXPECT_EQ(a->attrs().GetString("mask_kind", ""), "causal");
      EXPECT_FLOAT_EQ(a->attrs().GetFloat("scale", 0.f), 0.5f);
    } else {
      // The causal gate and the padding mask are one additive mask.
      EXPECT_EQ(a->attrs().GetString("mask_kind", ""), "additive");
    }
    if (form == Form::kBmmBaddbmm || form == Form::kBmmBothProducts || form == Form::kOpt ||
        form == Form::kBloom) {
      EXPECT_FLOAT_EQ(a->attrs().GetFloat("scale", 0.f), 0.5f);
      EXPECT_EQ(CountOps(after, "Reshape"), 0);  // every flattening view met its unflattening
    }
    ExpectSameOutputs(before, after);
  }
}

// OPT's clamp: a row whose mask is the lowest float everywhere (a query masked whole) is uniform
// in OPT (every entry clamped to the lowest float) and in the fused layer (every entry is the
// mask clamped to half of it, plus a score far below that value's ulp), never NaN.
TEST(DecoderAttention, RowMaskedWholeStaysUniformUnderTheClampedMask) {
  Graph before, after;
  DecoderGraph(before, Form::kOpt);
  DecoderGraph(after, Form::kOpt);
  auto r = RunDefaultPasses(after, TestOptions());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_NE(Find(after, "Attention"), nullptr);
  auto inputs = RandomInputs(before, {}, 3);
  // Batch 1's keys all masked, and scores in the thousands.
  float* md = inputs.at("mask").mutable_data<float>();
  for (int64_t j = 0; j < kS; ++j) md[kS + j] = std::numeric_limits<float>::lowest();
  Tensor& qt = inputs.at("q");
  float* q = qt.mutable_data<float>();
  for (int64_t i = 0; i < qt.num_elements(); ++i) q[i] *= 1e3f;
  auto a = cpu::EvaluateGraph(before, inputs);
  auto b = cpu::EvaluateGraph(after, inputs);
  ASSERT_TRUE(a.ok() && b.ok());
  const Tensor& ta = a->begin()->second;
  const Tensor& tb = b->begin()->second;
  for (int64_t i = 0; i < ta.num_elements(); ++i) {
    ASSERT_FALSE(std::isnan(tb.GetDouble(i))) << i;
    EXPECT_NEAR(ta.GetDouble(i), tb.GetDouble(i), 1e-3 * (1 + std::abs(ta.GetDouble(i)))) << i;
  }
}

// A target whose fused attention takes smaller heads (CUDA's: 128) keeps the products and the
// softmax as they are, on that target, rather than an Attention it would run on the host.
TEST(DecoderAttention, HeadsAboveTheTargetsLimitStayUnfused) {
  for (int64_t limit : {kD - 1, kD}) {
    SCOPED_TRACE(limit);
    Graph before, after;
    DecoderGraph(before, Form::kMaskAfterWhere);
    DecoderGraph(after, Form::kMaskAfterWhere);
    PassOptions o = TestOptions();
    o.attention_max_head_dim = limit;
    auto r = RunDefaultPasses(after, o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(CountOps(after, "Attention"), limit < kD ? 0 : 1);
    ExpectSameOutputs(before, after);
  }
}

// DistilBERT: Q divided by sqrt(d) before the product, the masked positions (c true) filled with
// the lowest float through masked_fill, c expanded to the scores' shape; two layers share the
// padding mask. Each becomes an Attention keeping Not(c), one Not for both after the late passes.
TEST(DecoderAttention, MaskedFillOfTheMaskedPositionsFuses) {
  auto make = [](Graph& g) {
    Value* mask = g.AddInput("mask", DataType::kFloat32, {kB, kS});
    Value* c = Op(g, "Less", {mask, Const(g, Scalar(0.f))});  // about half masked
    Value* x = g.AddInput("q", DataType::kFloat32, {kB, kH, kS, kD});
    for (int layer = 0; layer < 2; ++layer) {
      Value* masked_pos = Op(g, "Reshape", {c, Const(g, Ints({kB, 1, 1, kS}))});
      Value* q = Op(g, "Div", {x, Const(g, Scalar(2.f))});
      Value* s = Op(g, "MatMul", {q, KTransposed(g, x)});
      Value* e = Op(g, "Expand", {masked_pos, Const(g, Ints({kB, kH, kS, kS}))});
      Value* w = Op(g, "Where", {e, Lowest(g), s});
      Value* p = Op(g, "Softmax", {w}, Attrs(std::pair{"axis", int64_t{-1}}));
      x = Op(g, "MatMul", {p, x});
    }
    g.MarkOutput(Op(g, "Relu", {x}));
  };
  Graph before, after;
  make(before);
  make(after);
  auto r = RunDefaultPasses(after, TestOptions());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(CountOps(after, "Attention"), 2);
  EXPECT_EQ(CountOps(after, "Softmax"), 0);
  EXPECT_EQ(CountOps(after, "Expand"), 0);
  EXPECT_EQ(CountOps(after, "Not"), 1);
  for (Node* n : after.nodes()) {
    if (n->op_type() != "Attention") continue;
    EXPECT_EQ(n->attrs().GetString("mask_kind", ""), "boolean");
    EXPECT_FLOAT_EQ(n->attrs().GetFloat("scale", 0.f), 0.5f);
  }
  ExpectSameOutputs(before, after);
}

// A symbolic batch (an export with a dynamic batch axis): the flattening targets are computed from
// Q's shape at run time, [b*H, S, D], and the products still run on the heads. The zeros GPT-NeoX's
// baddbmm adds are a ConstantOfShape of the scores' runtime shape.
TEST(DecoderAttention, SymbolicBatchUnflattens) {
  auto make = [](Graph& g) {
    const Dim b = Dim::Symbol("b");
    Value* q = g.AddInput("q", DataType::kFloat32, {b, kH, kS, kD});
    Value* k = g.AddInput("k", DataType::kFloat32, {b, kH, kS, kD});
    Value* v = g.AddInput("v", DataType::kFloat32, {b, kH, kS, kD});
    Value* batch = Op(g, "Slice", {Op(g, "Shape", {q}), Const(g, Ints({0})), Const(g, Ints({1}))});
    Value* bh = Op(g, "Mul", {batch, Const(g, Ints({kH}))});
    auto target = [&](Value* lead, std::vector<int64_t> rest) {
      return Op(g, "Concat", {lead, Const(g, Ints(std::move(rest)))},
                Attrs(std::pair{"axis", int64_t{0}}));
    };
    Value* q3 = Op(g, "Reshape", {q, target(bh, {kS, kD})});
    Value* k3 = Op(g, "Reshape", {k, target(bh, {kS, kD})});
    Value* kt3 = Op(g, "Transpose", {k3}, Attrs(std::pair{"perm", std::vector<int64_t>{0, 2, 1}}));
    Value* s3 = Op(g, "Mul", {Op(g, "MatMul", {q3, kt3}), Const(g, Scalar(0.5f))});
    Value* zeros = Op(g, "ConstantOfShape", {Op(g, "Shape", {s3})});
    s3 = Op(g, "Add", {s3, zeros});
    Value* s4 = Op(g, "Reshape", {s3, target(batch, {kH, kS, kS})});
    Value* p = Op(g, "Softmax", {Op(g, "Where", {CausalCond(g), s4, Lowest(g)})},
                  Attrs(std::pair{"axis", int64_t{-1}}));
    Value* p3 = Op(g, "Reshape", {p, target(bh, {kS, kS})});
    Value* v3 = Op(g, "Reshape", {v, target(bh, {kS, kD})});
    Value* y = Op(g, "Reshape", {Op(g, "MatMul", {p3, v3}), target(batch, {kH, kS, kD})});
    g.MarkOutput(Op(g, "Relu", {y}));
  };
  Graph before, after;
  make(before);
  make(after);
  auto r = RunDefaultPasses(after, TestOptions());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Node* a = Find(after, "Attention");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->attrs().GetString("mask_kind", ""), "causal");
  EXPECT_EQ(CountOps(after, "Softmax"), 0);
  EXPECT_EQ(CountOps(after, "MatMul"), 0);
  ExpectSameOutputs(before, after, {{"b", 3}});
}

// GPT-BigCode's multi-query attention: the H query heads of each position as rows of
// [B, S*H, D] against one K/V head [B, S, D], the causal gate on the [B, S, H, S] view
// ([1, S, 1, S], from its tril buffer). batch_unflatten runs it head-major with K and V as one
// head broadcast over the query heads, and the default pipeline fuses it (static and symbolic
// batch). Heads split the other way ([B, H, S, S] views of [B, S*H, .] rows) stay.
void MultiQueryGraph(Graph& g, const Dim& b, bool heads_outer = false) {
  constexpr int64_t h = 3;
  Value* q = g.AddInput("q", DataType::kFloat32, {b, kS, h * kD});
  Value* k = g.AddInput("k", DataType::kFloat32, {b, kS, kD});
  Value* v = g.AddInput("v", DataType::kFloat32, {b, kS, kD});
  Value* q3 = Op(g, "Reshape", {q, Const(g, Ints({0, kS * h, kD}))});
  Value* kt = Op(g, "Transpose", {k}, Attrs(std::pair{"perm", std::vector<int64_t>{0, 2, 1}}));
  Value* s3 = Op(g, "Mul", {Op(g, "MatMul", {q3, kt}), Const(g, Scalar(0.5f))});
  Value* s4 = Op(g, "Reshape",
                 {s3, Const(g, Ints(heads_outer ? std::vector<int64_t>{0, h, kS, kS}
                                                : std::vector<int64_t>{0, kS, h, kS}))});
  // The [1, 1, S, S] causal gate viewed [1, S, 1, S] (GPT-BigCode's unsqueeze(2)).
  Value* cond = Op(g, "Reshape", {CausalCond(g), Const(g, Ints({1, kS, 1, kS}))});
  if (heads_outer) cond = CausalCond(g);
  Value* p = Op(g, "Softmax", {Op(g, "Where", {cond, s4, Lowest(g)})},
                Attrs(std::pair{"axis", int64_t{-1}}));
  Value* p3 = Op(g, "Reshape", {p, Const(g, Ints({0, kS * h, kS}))});
  Value* y = Op(g, "Reshape", {Op(g, "MatMul", {p3, v}), Const(g, Ints({0, kS, h * kD}))});
  g.MarkOutput(Op(g, "Relu", {y}));
}

TEST(DecoderAttention, MultiQueryRowsOfPositionsAndHeadsFuse) {
  for (const Dim& b : {Dim(2), Dim::Symbol("b")}) {
    SCOPED_TRACE(b.is_static() ? "static batch" : "symbolic batch");
    Graph before, after;
    MultiQueryGraph(before, b);
    MultiQueryGraph(after, b);
    auto r = RunDefaultPasses(after, TestOptions());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    Node* a = Find(after, "Attention");
    ASSERT_NE(a, nullptr);
    EXPECT_FLOAT_EQ(a->attrs().GetFloat("scale", 0.f), 0.5f);
    EXPECT_EQ(CountOps(after, "Softmax"), 0);
    EXPECT_EQ(CountOps(after, "MatMul"), 0);
    // The group of one (K and V [B, 1, 1, S, D]) read in place: no head Transposes are left.
    EXPECT_EQ(a->attrs().GetString("layout", "bhsd"), "bshd");
    EXPECT_EQ(a->input(0)->shape().size(), 5u);
    EXPECT_EQ(CountOps(after, "Transpose"), 0);
    ExpectSameOutputs(before, after, {{"b", 3}});
  }
}

TEST(DecoderAttention, MultiQueryWithHeadsOuterStays) {
  Graph before, after;
  MultiQueryGraph(before, Dim(2), /*heads_outer=*/true);
  MultiQueryGraph(after, Dim(2), /*heads_outer=*/true);
  auto r = RunDefaultPasses(after, TestOptions());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Find(after, "Attention"), nullptr);
  ExpectSameOutputs(before, after);
}

// Only the scores before a Softmax are reordered, and only very negative fills: a Where that
// selects ordinary values stays as it is.
TEST(DecoderAttention, WhereWithAnOrdinaryFillStays) {
  Graph g;
  Value* q = g.AddInput("q", DataType::kFloat32, {kB, kH, kS, kD});
  Value* k = g.AddInput("k", DataType::kFloat32, {kB, kH, kS, kD});
  Value* mask = g.AddInput("mask", DataType::kFloat32, {kB, 1, 1, kS});
  Value* w = Op(g, "Where",
                {CausalCond(g), Op(g, "MatMul", {q, KTransposed(g, k)}), Const(g, Scalar(0.f))});
  g.MarkOutput(Op(g, "Softmax", {Op(g, "Add", {w, mask})}, Attrs(std::pair{"axis", int64_t{-1}})));
  std::vector<std::unique_ptr<Pass>> v;
  v.push_back(MakeAttentionCanonicalizationPass());
  PassReport r = RunPasses(g, std::move(v));
  EXPECT_EQ(r.rewrites("attention_canonicalization"), 0);
}

// A product over flattened batch dims outside attention: computed on the 4-D operands, the
// flattening now a view of the result.
TEST(BatchUnflatten, ProductOfFlattenedOperandsRunsOnTheOperands) {
  auto make = [](Graph& g, bool transposed) {
    Value* a = g.AddInput("a", DataType::kFloat32, {2, 3, 5, 4});
    Value* b = transposed ? g.AddInput("b", DataType::kFloat32, {2, 3, 7, 4})
                          : g.AddInput("b", DataType::kFloat32, {2, 3, 4, 7});
    Value* a3 = Op(g, "Reshape", {a, Const(g, Ints({6, 5, 4}))});
    Value* b3 = Op(g, "Reshape",
                   {b, Const(g, Ints(transposed ? std::vector<int64_t>{6, 7, 4}
                                                : std::vector<int64_t>{6, 4, 7}))});
    if (transposed) {
      b3 = Op(g, "Transpose", {b3}, Attrs(std::pair{"perm", std::vector<int64_t>{0, 2, 1}}));
    }
    g.MarkOutput(Op(g, "Relu", {Op(g, "MatMul", {a3, b3})}));
  };
  for (bool transposed : {false, true}) {
    SCOPED_TRACE(transposed);
    Graph before, after;
    make(before, transposed);
    make(after, transposed);
    std::vector<std::unique_ptr<Pass>> v;
    v.push_back(MakeBatchUnflattenPass());
    v.push_back(MakeDeadNodeEliminationPass());
    PassReport r = RunPasses(after, std::move(v));
    EXPECT_EQ(r.rewrites("batch_unflatten"), 1);
    Node* mm = Find(after, "MatMul");
    ASSERT_NE(mm, nullptr);
    EXPECT_EQ(mm->input(0)->name(), "a");
    EXPECT_EQ(mm->output(0)->shape().size(), 4u);
    ExpectSameOutputs(before, after);
  }
}

// Different leading dims (a [6, ...] merged from [2, 3], b from [3, 2]) are not one batch.
TEST(BatchUnflatten, OperandsWithOtherLeadingDimsStay) {
  Graph g;
  Value* a = g.AddInput("a", DataType::kFloat32, {2, 3, 5, 4});
  Value* b = g.AddInput("b", DataType::kFloat32, {3, 2, 4, 7});
  Value* a3 = Op(g, "Reshape", {a, Const(g, Ints({6, 5, 4}))});
  Value* b3 = Op(g, "Reshape", {b, Const(g, Ints({6, 4, 7}))});
  g.MarkOutput(Op(g, "MatMul", {a3, b3}));
  std::vector<std::unique_ptr<Pass>> v;
  v.push_back(MakeBatchUnflattenPass());
  PassReport r = RunPasses(g, std::move(v));
  EXPECT_EQ(r.rewrites("batch_unflatten"), 0);
}

// Add of a literal zero that broadcasts nothing goes; a zero that is a model weight (a bias
// refit may change) or that broadcasts the other operand stays.
TEST(IdentityElimination, AddOfALiteralZeroGoes) {
  struct Case {
    const char* what;
    std::vector<int64_t> zero_dims;
    bool literal;
    int adds_left;
  };
  for (const Case& c :
       {Case{"literal, same shape", {2, 3}, true, 0}, Case{"literal scalar", {}, true, 0},
        Case{"weight", {2, 3}, false, 1}, Case{"broadcasts x", {4, 2, 3}, true, 1}}) {
    SCOPED_TRACE(c.what);
    Graph g;
    Value* x = g.AddInput("x", DataType::kFloat32, {2, 3});
    Value* z = Const(g, Tensor(DataType::kFloat32, c.zero_dims));
    z->set_provenance(c.literal ? LiteralExpr(*z->constant())
                                : InitializerExpr(z->name(), *z->constant()));
    g.MarkOutput(Op(g, "Relu", {Op(g, "Add", {z, x})}));
    std::vector<std::unique_ptr<Pass>> v;
    v.push_back(MakeIdentityEliminationPass());
    RunPasses(g, std::move(v));
    EXPECT_EQ(CountOps(g, "Add"), c.adds_left);
  }
}

}  // namespace
}  // namespace kiln::passes
