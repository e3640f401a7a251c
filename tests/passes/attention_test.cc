// Attention: the fused op's CPU kernel against a direct double-precision reference, and the
// attention fusion on the three exported forms in the zoo (BERT: K^T by Transpose(0,2,3,1), Div
// by a scale, additive mask; ViT: Mul by a scale, no mask; GPT-2: Where on a sliced
// lower-triangular buffer).
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kiln/ops/op_schema.h"
#include "pass_test_util.h"

namespace kiln::passes {
namespace {

using namespace testing;

using Passes = std::vector<std::unique_ptr<Pass>>;

Passes AttentionOnly() {
  Passes v;
  v.push_back(MakeAttentionFusionPass());
  v.push_back(MakeDeadNodeEliminationPass());
  return v;
}

// softmax(scale * q k^T + mask) v for [B, Sq, D] x [B, Sk, D] x [B, Sk, Dv], in double.
std::vector<double> Reference(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                              const Tensor* additive, bool causal) {
  int64_t b = q.dims()[0], sq = q.dims()[1], d = q.dims()[2], sk = k.dims()[1], dv = v.dims()[2];
  std::vector<double> out(b * sq * dv, 0.0);
  for (int64_t n = 0; n < b; ++n) {
    for (int64_t i = 0; i < sq; ++i) {
      std::vector<double> s(sk);
      double mx = -1e300;
      for (int64_t j = 0; j < sk; ++j) {
        double acc = 0;
        for (int64_t t = 0; t < d; ++t) {
          acc += q.GetDouble((n * sq + i) * d + t) * k.GetDouble((n * sk + j) * d + t);
        }
        s[j] = acc * scale;
        if (additive) s[j] += additive->GetDouble(j);  // mask [1, 1, Sk]
        if (causal && j > i + (sk - sq)) s[j] = -1e300;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int64_t j = 0; j < sk; ++j) {
        for (int64_t t = 0; t < dv; ++t) {
          out[(n * sq + i) * dv + t] += s[j] / sum * v.GetDouble((n * sk + j) * dv + t);
        }
      }
    }
  }
  return out;
}

void ExpectKernelMatchesReference(const std::string& kind, bool with_mask) {
  Graph g;
  AttributeMap attrs;
  attrs.Set("scale", 0.35f);
  attrs.Set("mask_kind", kind);
  std::vector<Value*> ins = {g.AddValue("q"), g.AddValue("k"), g.AddValue("v")};
  if (with_mask) ins.push_back(g.AddValue("m"));
  Node* n = g.AddNode("Attention", "attn", ins, {g.AddValue("y")}, attrs);
  Tensor q = RandomTensor(DataType::kFloat32, {2, 3, 4}, 1);
  Tensor k = RandomTensor(DataType::kFloat32, {2, 5, 4}, 2);
  Tensor v = RandomTensor(DataType::kFloat32, {2, 5, 6}, 3);
  Tensor m = RandomTensor(DataType::kFloat32, {1, 1, 5}, 4, -3, 0);
  std::vector<const Tensor*> in = {&q, &k, &v};
  if (with_mask) in.push_back(&m);
  auto out = cpu::EvaluateNode(*n, in);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ((*out)[0].dims(), (std::vector<int64_t>{2, 3, 6}));
  auto want = Reference(q, k, v, 0.35, with_mask ? &m : nullptr, kind == "causal");
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR((*out)[0].GetDouble(static_cast<int64_t>(i)), want[i], 1e-5) << i;
  }
}

TEST(AttentionKernel, NoMask) { ExpectKernelMatchesReference("none", false); }
TEST(AttentionKernel, AdditiveMask) { ExpectKernelMatchesReference("additive", true); }
TEST(AttentionKernel, CausalBottomRightAligned) { ExpectKernelMatchesReference("causal", false); }

// A query row whose every key is masked with -inf (an FP16 engine's mask of the lowest float)
// gives zeros, as the CUDA kernels do, not NaN; the other rows are untouched.
TEST(AttentionKernel, RowMaskedWholeGivesZeros) {
  Graph g;
  AttributeMap attrs;
  attrs.Set("mask_kind", std::string("additive"));
  Node* n = g.AddNode("Attention", "attn",
                      {g.AddValue("q"), g.AddValue("k"), g.AddValue("v"), g.AddValue("m")},
                      {g.AddValue("y")}, attrs);
  Tensor q = RandomTensor(DataType::kFloat32, {1, 3, 4}, 1);
  Tensor k = RandomTensor(DataType::kFloat32, {1, 5, 4}, 2);
  Tensor v = RandomTensor(DataType::kFloat32, {1, 5, 6}, 3);
  std::vector<float> mask(15, 0.f);
  for (int j = 0; j < 5; ++j) mask[5 + j] = -std::numeric_limits<float>::infinity();  // row 1
  Tensor m = Tensor::FromVector<float>(DataType::kFloat32, {1, 3, 5}, mask);
  std::vector<const Tensor*> in = {&q, &k, &v, &m};
  auto out = cpu::EvaluateNode(*n, in);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  auto want = Reference(q, k, v, 0.5, nullptr, false);
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t c = 0; c < 6; ++c) {
      const double got = (*out)[0].GetDouble(i * 6 + c);
      if (i == 1) {
        EXPECT_EQ(got, 0.0) << c;
      } else {
        EXPECT_NEAR(got, want[i * 6 + c], 1e-5) << i << "," << c;
      }
    }
  }
}

TEST(AttentionShapeRule, RejectsAMaskKindWithoutItsMask) {
  Graph g;
  Value* q = g.AddInput("q", DataType::kFloat32, {2, 3, 4});
  Value* y = g.AddValue("y");
  AttributeMap attrs;
  attrs.Set("mask_kind", std::string("additive"));
  g.AddNode("Attention", "attn", {q, q, q}, {y}, attrs);
  auto r = InferShapes(g);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidModel);
}

// [2, S, 8] -> [2, S, 2, 4] -> heads-first by `perm`.
Value* Heads(Graph& g, Value* x, std::vector<int64_t> perm) {
  Value* r = Op(g, "Reshape", {x, Const(g, Ints({2, 5, 2, 4}))});
  return Op(g, "Transpose", {r}, Attrs(std::pair{"perm", perm}));
}

enum class Form { kBert, kBertSoftmaxReadElsewhere, kVit, kGptCausal, kBooleanMask };

void AttentionGraph(Graph& g, Form form) {
  Value* scores = nullptr;
  Value* v = nullptr;
  if (form == Form::kVit) {
    Value* q = g.AddInput("q", DataType::kFloat32, {2, 2, 5, 4});
    Value* k = g.AddInput("k", DataType::kFloat32, {2, 2, 5, 4});
    v = g.AddInput("v", DataType::kFloat32, {2, 2, 5, 4});
    Value* kt = Op(g, "Transpose", {k}, Attrs(std::pair{"perm", std::vector<int64_t>{0, 1, 3, 2}}));
    scores = Op(g, "Mul", {Op(g, "MatMul", {q, kt}), Const(g, Scalar(0.5f))});
  } else if (form == Form::kGptCausal || form == Form::kBooleanMask) {
    Value* q = g.AddInput("q", DataType::kFloat32, {1, 2, 6, 4});
    Value* k = g.AddInput("k", DataType::kFloat32, {1, 2, 6, 4});
    v = g.AddInput("v", DataType::kFloat32, {1, 2, 6, 4});
    Value* kt = Op(g, "Transpose", {k}, Attrs(std::pair{"perm", std::vector<int64_t>{0, 1, 3, 2}}));
    Value* s = Op(g, "Div", {Op(g, "MatMul", {q, kt}), Const(g, Scalar(2.f))});
    Value* cond = nullptr;
    if (form == Form::kGptCausal) {
      // HF GPT-2: bias[:, :, k-q:k, :k] of a [1, 1, 8, 8] tril buffer.
      std::vector<uint8_t> tril(64);
      for (int i = 0; i < 8; ++i) {
        for (int j = 0; j < 8; ++j) tril[i * 8 + j] = j <= i;
      }
      Value* buf = Const(g, Tensor::FromVector<uint8_t>(DataType::kBool, {1, 1, 8, 8}, tril));
      Value* rows =
          Op(g, "Slice", {buf, Const(g, Ints({0})), Const(g, Ints({6})), Const(g, Ints({2}))});
      cond = Op(g, "Slice", {rows, Const(g, Ints({0})), Const(g, Ints({6})), Const(g, Ints({3}))});
    } else {
      cond = g.AddInput("keep", DataType::kBool, {1, 1, 6, 6});
    }
    float lowest = std::numeric_limits<float>::lowest();
    scores = Op(g, "Where", {cond, s, Const(g, Scalar(lowest))});
  } else {
    Value* hq = g.AddInput("hq", DataType::kFloat32, {2, 5, 8});
    Value* hk = g.AddInput("hk", DataType::kFloat32, {2, 5, 8});
    Value* hv = g.AddInput("hv", DataType::kFloat32, {2, 5, 8});
    Value* mask = g.AddInput("mask", DataType::kFloat32, {2, 1, 1, 5});
    Value* q = Heads(g, hq, {0, 2, 1, 3});
    Value* kt = Heads(g, hk, {0, 2, 3, 1});
    v = Heads(g, hv, {0, 2, 1, 3});
    Value* s = Op(g, "Div", {Op(g, "MatMul", {q, kt}), Const(g, Scalar(2.f))});
    scores = Op(g, "Add", {s, mask});
  }
  Value* p = Op(g, "Softmax", {scores}, Attrs(std::pair{"axis", int64_t{-1}}));
  if (form == Form::kBertSoftmaxReadElsewhere) g.MarkOutput(p);
  g.MarkOutput(Op(g, "MatMul", {p, v}));
}

TEST(AttentionFusion, BertFormWithAdditiveMask) {
  Graph before, after;
  AttentionGraph(before, Form::kBert);
  AttentionGraph(after, Form::kBert);
  PassReport r = RunPasses(after, AttentionOnly());
  EXPECT_EQ(r.rewrites("attention_fusion"), 1);
  Node* a = Find(after, "Attention");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(CountOps(after, "Softmax"), 0);
  EXPECT_EQ(CountOps(after, "MatMul"), 0);
  EXPECT_EQ(a->attrs().GetString("mask_kind", ""), "additive");
  EXPECT_FLOAT_EQ(a->attrs().GetFloat("scale", 0), 0.5f);
  EXPECT_EQ(a->input(3)->name(), "mask");
  // K reaches the op as [B, H, S, D]: the K^T transpose became perm (0, 2, 1, 3).
  Node* kt = a->input(1)->producer();
  ASSERT_NE(kt, nullptr);
  EXPECT_EQ(kt->attrs().GetInts("perm"), (std::vector<int64_t>{0, 2, 1, 3}));
  ExpectSameOutputs(before, after);
}

// T5's attention layers (`layers` of them): no scale, a relative position bias [1, H, S, S]
// added, then the padding mask [B, 1, 1, S], both shared by every layer.
void T5Layers(Graph& g, int layers) {
  Value* pad = g.AddInput("mask", DataType::kFloat32, {2, 1, 1, 5});
  Value* bias = Const(g, RandomTensor(DataType::kFloat32, {1, 2, 5, 5}, 3));
  for (int layer = 0; layer < layers; ++layer) {
    auto in = [&](const char* n) {
      return g.AddInput(fmt::format("{}{}", n, layer), DataType::kFloat32, {2, 5, 8});
    };
    Value* hq = in("hq");
    Value* hk = in("hk");
    Value* hv = in("hv");
    Value* s = Op(g, "MatMul", {Heads(g, hq, {0, 2, 1, 3}), Heads(g, hk, {0, 2, 3, 1})});
    Value* scores = Op(g, "Add", {Op(g, "Add", {s, bias}), pad});
    Value* p = Op(g, "Softmax", {scores}, Attrs(std::pair{"axis", int64_t{-1}}));
    g.MarkOutput(Op(g, "MatMul", {p, Heads(g, hv, {0, 2, 1, 3})}));
  }
}

// One Attention whose mask is the sum of T5's two.
TEST(AttentionFusion, T5FormSumsItsTwoAdditiveMasks) {
  Graph before, after;
  T5Layers(before, 1);
  T5Layers(after, 1);
  PassReport r = RunPasses(after, AttentionOnly());
  EXPECT_EQ(r.rewrites("attention_fusion"), 1);
  Node* a = Find(after, "Attention");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(CountOps(after, "Softmax"), 0);
  EXPECT_EQ(a->attrs().GetString("mask_kind", ""), "additive");
  EXPECT_FLOAT_EQ(a->attrs().GetFloat("scale", 0), 1.0f);
  ASSERT_EQ(a->num_inputs(), 4u);
  EXPECT_EQ(a->input(3)->producer()->op_type(), "Add");
  ExpectSameOutputs(before, after);
}

// The layers share the position bias and the padding mask: the default pipeline sums them once
// for all the attention layers, not once per layer.
TEST(AttentionFusion, LayersSharingTheirMasksShareOneSum) {
  Graph before, after;
  T5Layers(before, 3);
  T5Layers(after, 3);
  auto r = RunDefaultPasses(after, TestOptions());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(CountOps(after, "Attention"), 3);
  EXPECT_EQ(CountOps(after, "Add"), 1);
  const Value* mask = nullptr;
  for (Node* n : after.nodes()) {
    if (n->op_type() != "Attention") continue;
    ASSERT_EQ(n->num_inputs(), 4u);
    if (!mask) mask = n->input(3);
    EXPECT_EQ(n->input(3), mask);
  }
  ExpectSameOutputs(before, after);
}

TEST(AttentionFusion, VitFormReadsKDirectly) {
  Graph before, after;
  AttentionGraph(before, Form::kVit);
  AttentionGraph(after, Form::kVit);
  RunPasses(after, AttentionOnly());
  ASSERT_EQ(after.num_nodes(), 1u);
  Node* a = after.nodes()[0];
  EXPECT_EQ(a->op_type(), "Attention");
  EXPECT_EQ(a->input(1)->name(), "k");
  EXPECT_EQ(a->attrs().GetString("mask_kind", ""), "none");
  ExpectSameOutputs(before, after);
}

// torch's scaled_dot_product_attention export (nn.MultiheadAttention in torch 2): Q and K^T are
// each scaled by sqrt(scale) before the product; both join the Attention's scale and K is read
// directly.
TEST(AttentionFusion, SdpaFormScalesQAndKTransposed) {
  auto make = [](Graph& g) {
    Value* q = g.AddInput("q", DataType::kFloat32, {2, 2, 5, 4});
    Value* k = g.AddInput("k", DataType::kFloat32, {2, 2, 5, 4});
    Value* v = g.AddInput("v", DataType::kFloat32, {2, 2, 5, 4});
    Value* kt = Op(g, "Transpose", {k}, Attrs(std::pair{"perm", std::vector<int64_t>{0, 1, 3, 2}}));
    Value* s =
        Op(g, "MatMul",
           {Op(g, "Mul", {q, Const(g, Scalar(0.7f))}), Op(g, "Mul", {kt, Const(g, Scalar(0.6f))})});
    Value* p = Op(g, "Softmax", {s}, Attrs(std::pair{"axis", int64_t{-1}}));
    g.MarkOutput(Op(g, "MatMul", {p, v}));
  };
  Graph before, after;
  make(before);
  make(after);
  PassReport r = RunPasses(after, AttentionOnly());
  EXPECT_EQ(r.rewrites("attention_fusion"), 1);
  ASSERT_EQ(after.num_nodes(), 1u);
  Node* a = after.nodes()[0];
  EXPECT_EQ(a->op_type(), "Attention");
  EXPECT_EQ(a->input(0)->name(), "q");
  EXPECT_EQ(a->input(1)->name(), "k");
  EXPECT_NEAR(a->attrs().GetFloat("scale", 0), 0.42f, 1e-6);
  ExpectSameOutputs(before, after);
}

TEST(AttentionFusion, Gpt2WhereOnATrilBufferBecomesCausal) {
  Graph before, after;
  AttentionGraph(before, Form::kGptCausal);
  AttentionGraph(after, Form::kGptCausal);
  RunPasses(after, AttentionOnly());
  ASSERT_EQ(after.num_nodes(), 1u);
  Node* a = after.nodes()[0];
  EXPECT_EQ(a->op_type(), "Attention");
  EXPECT_EQ(a->attrs().GetString("mask_kind", ""), "causal");
  EXPECT_EQ(a->num_inputs(), 3u);
  ExpectSameOutputs(before, after);
}

TEST(AttentionFusion, AnyOtherBooleanMaskStaysAnInput) {
  Graph before, after;
  AttentionGraph(before, Form::kBooleanMask);
  AttentionGraph(after, Form::kBooleanMask);
  RunPasses(after, AttentionOnly());
  Node* a = Find(after, "Attention");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->attrs().GetString("mask_kind", ""), "boolean");
  EXPECT_EQ(a->input(3)->name(), "keep");
  ExpectSameOutputs(before, after);
}

// ---- The attention layout pass: heads read in place.

Passes FusionAndLayout() {
  Passes v;
  v.push_back(MakeAttentionFusionPass());
  v.push_back(MakeAttentionLayoutPass());
  v.push_back(MakeDeadNodeEliminationPass());
  return v;
}

// BERT's whole head split and merge: hq/hk/hv [2, 5, 8] -> heads -> attention -> merge ->
// [2, 5, 8]. q_rank4: Q arrives already split ([2, 5, 2, 4]: only its Transpose can go).
// merged_is_output: the [2, 5, 2, 4] merge result is itself a graph output (its Reshape stays).
void SplitMergeGraph(Graph& g, bool q_rank4, bool merged_is_output) {
  Value* hq = q_rank4 ? g.AddInput("hq", DataType::kFloat32, {2, 5, 2, 4})
                      : g.AddInput("hq", DataType::kFloat32, {2, 5, 8});
  Value* hk = g.AddInput("hk", DataType::kFloat32, {2, 5, 8});
  Value* hv = g.AddInput("hv", DataType::kFloat32, {2, 5, 8});
  Value* mask = g.AddInput("mask", DataType::kFloat32, {2, 1, 1, 5});
  Value* q =
      q_rank4 ? Op(g, "Transpose", {hq}, Attrs(std::pair{"perm", std::vector<int64_t>{0, 2, 1, 3}}))
              : Heads(g, hq, {0, 2, 1, 3});
  Value* kt = Heads(g, hk, {0, 2, 3, 1});
  Value* v = Heads(g, hv, {0, 2, 1, 3});
  Value* s = Op(g, "Div", {Op(g, "MatMul", {q, kt}), Const(g, Scalar(2.f))});
  Value* p = Op(g, "Softmax", {Op(g, "Add", {s, mask})}, Attrs(std::pair{"axis", int64_t{-1}}));
  Value* y = Op(g, "MatMul", {p, v});
  Value* z = Op(g, "Transpose", {y}, Attrs(std::pair{"perm", std::vector<int64_t>{0, 2, 1, 3}}));
  if (merged_is_output) g.MarkOutput(z);
  g.MarkOutput(Op(g, "Relu", {Op(g, "Reshape", {z, Const(g, Ints({2, 5, 8}))})}));
}

TEST(AttentionLayout, BertSplitAndMergeBecomeOneBsdLayer) {
  Graph before, after;
  SplitMergeGraph(before, false, false);
  SplitMergeGraph(after, false, false);
  PassReport r = RunPasses(after, FusionAndLayout());
  EXPECT_EQ(r.rewrites("attention_layout"), 1);
  Node* a = Find(after, "Attention");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->attrs().GetString("layout", ""), "bsd");
  EXPECT_EQ(a->attrs().GetInt("num_heads", 0), 2);
  EXPECT_EQ(a->input(0)->name(), "hq");
  EXPECT_EQ(a->input(1)->name(), "hk");
  EXPECT_EQ(a->input(2)->name(), "hv");
  EXPECT_EQ(a->input(3)->name(), "mask");
  // Nothing but the attention and the Relu is left: every split and merge copy is gone.
  EXPECT_EQ(CountOps(after, "Transpose"), 0);
  EXPECT_EQ(CountOps(after, "Reshape"), 0);
  EXPECT_EQ(after.num_nodes(), 2u);
  ExpectSameOutputs(before, after);
}

TEST(AttentionLayout, PreSplitQGivesBshd) {
  Graph before, after;
  SplitMergeGraph(before, true, false);
  SplitMergeGraph(after, true, false);
  RunPasses(after, FusionAndLayout());
  Node* a = Find(after, "Attention");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->attrs().GetString("layout", ""), "bshd");
  EXPECT_EQ(CountOps(after, "Transpose"), 0);
  // The Reshapes that split K and V stay (bshd reads [B, S, H, D]); the merge one too.
  EXPECT_EQ(CountOps(after, "Reshape"), 3);
  ExpectSameOutputs(before, after);
}

// The merged [B, S, H, Dv] value is a graph output: the attention writes [B, S, H*Dv] rows and a
// Reshape (a view) gives the output its shape; the operands are read as [B, S, H*D] rows.
TEST(AttentionLayout, MergedOutputIsWrittenThroughAView) {
  Graph before, after;
  SplitMergeGraph(before, false, true);
  SplitMergeGraph(after, false, true);
  RunPasses(after, FusionAndLayout());
  Node* a = Find(after, "Attention");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->attrs().GetString("layout", ""), "bsd");
  EXPECT_EQ(a->input(0)->name(), "hq");
  EXPECT_EQ(CountOps(after, "Transpose"), 0);
  // The view to the output's [2, 5, 2, 4] and the model's own Reshape to [2, 5, 8] after it.
  EXPECT_EQ(CountOps(after, "Reshape"), 2);
  ExpectSameOutputs(before, after);
}

// GPT-2: one projection [2, 5, 24] split into Q, K, V thirds, then the head split and merge.
TEST(AttentionLayout, Gpt2SplitOfOneProjectionIsReadPacked) {
  for (bool sizes_given : {false, true}) {
    SCOPED_TRACE(sizes_given ? "split sizes as an input" : "equal split");
    auto make = [&](Graph& g) {
      Value* x = g.AddInput("qkv", DataType::kFloat32, {2, 5, 24});
      std::vector<Value*> ins = {x};
      if (sizes_given) ins.push_back(Const(g, Ints({8, 8, 8})));
      Value *q3 = g.AddValue("q3"), *k3 = g.AddValue("k3"), *v3 = g.AddValue("v3");
      AttributeMap a;
      a.Set("axis", int64_t{-1});
      if (!sizes_given) a.Set("num_outputs", int64_t{3});
      g.AddNode("Split", "split", ins, {q3, k3, v3}, a);
      Value* q = Heads(g, q3, {0, 2, 1, 3});
      Value* kt = Heads(g, k3, {0, 2, 3, 1});
      Value* v = Heads(g, v3, {0, 2, 1, 3});
      Value* s = Op(g, "Div", {Op(g, "MatMul", {q, kt}), Const(g, Scalar(2.f))});
      Value* p = Op(g, "Softmax", {s}, Attrs(std::pair{"axis", int64_t{-1}}));
      Value* z = Op(g, "Transpose", {Op(g, "MatMul", {p, v})},
                    Attrs(std::pair{"perm", std::vector<int64_t>{0, 2, 1, 3}}));
      g.MarkOutput(Op(g, "Relu", {Op(g, "Reshape", {z, Const(g, Ints({2, 5, 8}))})}));
    };
    Graph before, after;
    make(before);
    make(after);
    RunPasses(after, FusionAndLayout());
    Node* a = Find(after, "Attention");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->attrs().GetString("layout", ""), "bsd");
    EXPECT_EQ(a->attrs().GetInt("qkv_packed", 0), 1);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(a->input(i)->name(), "qkv");
    EXPECT_EQ(CountOps(after, "Split"), 0);
    EXPECT_EQ(after.num_nodes(), 2u);  // Attention and Relu
    ExpectSameOutputs(before, after);
  }
}

// BERT: three Linear projections (MatMul + bias) of one hidden state feed the heads; after the
// layout pass they become one [8, 24] projection read with qkv_packed. Whisper's form: Q scaled
// after its projection (q_proj(x) * scaling, before the head split) and a key projection without
// a bias; the scale goes into Q's weights and the key gets zeros beside the other biases.
enum class QkvForm { kBert, kWhisper, kNoBiases };

void QkvGraph(Graph& g, QkvForm form) {
  Value* x = g.AddInput("x", DataType::kFloat32, {2, 5, 8});
  Value* mask = g.AddInput("mask", DataType::kFloat32, {2, 1, 1, 5});
  auto proj = [&](uint64_t seed, bool bias) {
    Value* w = Const(g, RandomTensor(DataType::kFloat32, {8, 8}, seed));
    Value* y = Op(g, "MatMul", {x, w});
    if (!bias) return y;
    return Op(g, "Add", {y, Const(g, RandomTensor(DataType::kFloat32, {8}, seed + 10))});
  };
  Value* hq = proj(1, form != QkvForm::kNoBiases);
  if (form == QkvForm::kWhisper) hq = Op(g, "Mul", {hq, Const(g, Scalar(0.5f))});
  Value* q = Heads(g, hq, {0, 2, 1, 3});
  Value* kt = Heads(g, proj(2, form == QkvForm::kBert), {0, 2, 3, 1});
  Value* v = Heads(g, proj(3, form != QkvForm::kNoBiases), {0, 2, 1, 3});
  Value* s = Op(g, "MatMul", {q, kt});
  if (form != QkvForm::kWhisper) s = Op(g, "Div", {s, Const(g, Scalar(2.f))});
  Value* p = Op(g, "Softmax", {Op(g, "Add", {s, mask})}, Attrs(std::pair{"axis", int64_t{-1}}));
  Value* z = Op(g, "Transpose", {Op(g, "MatMul", {p, v})},
                Attrs(std::pair{"perm", std::vector<int64_t>{0, 2, 1, 3}}));
  g.MarkOutput(Op(g, "Relu", {Op(g, "Reshape", {z, Const(g, Ints({2, 5, 8}))})}));
}

TEST(QkvFusion, ThreeProjectionsOfOneInputBecomeOne) {
  for (QkvForm form : {QkvForm::kBert, QkvForm::kWhisper, QkvForm::kNoBiases}) {
    SCOPED_TRACE(static_cast<int>(form));
    Graph before, after;
    QkvGraph(before, form);
    QkvGraph(after, form);
    // In the default pipeline's order.
    Passes v;
    v.push_back(MakeAttentionFusionPass());
    v.push_back(MakeGemmFusionPass());
    v.push_back(MakeMatMulScaleFoldingPass());
    v.push_back(MakeAttentionLayoutPass());
    v.push_back(MakeQkvFusionPass());
    v.push_back(MakeDeadNodeEliminationPass());
    PassReport r = RunPasses(after, std::move(v));
    EXPECT_EQ(r.rewrites("qkv_fusion"), 1);
    Node* a = Find(after, "Attention");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->attrs().GetInt("qkv_packed", 0), 1);
    EXPECT_EQ(a->input(0), a->input(1));
    EXPECT_EQ(a->input(1), a->input(2));
    Node* proj = a->input(0)->producer();
    ASSERT_NE(proj, nullptr);
    EXPECT_EQ(proj->input(1)->constant()->dims(), (std::vector<int64_t>{8, 24}));
    ASSERT_EQ(proj->op_type(), "FusedMatMul");
    if (form == QkvForm::kNoBiases) {
      EXPECT_EQ(proj->num_inputs(), 2);
    } else {
      const Tensor& bias = *proj->input(2)->constant();
      EXPECT_EQ(bias.dims(), (std::vector<int64_t>{24}));
      if (form == QkvForm::kWhisper) {
        for (int64_t i = 8; i < 16; ++i) EXPECT_EQ(bias.GetDouble(i), 0.0) << i;  // K's zeros
      }
    }
    EXPECT_EQ(CountOps(after, "Mul"), 0);
    EXPECT_EQ(after.num_nodes(), 3u);  // projection, attention, Relu
    ExpectSameOutputs(before, after);
    // The default pipeline gets there too.
    Graph full;
    QkvGraph(full, form);
    auto report = RunDefaultPasses(full, TestOptions());
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(CountOps(full, "FusedMatMul"), 1);
    EXPECT_EQ(CountOps(full, "Attention"), 1);
    EXPECT_EQ(full.num_nodes(), 3u);
    ExpectSameOutputs(before, full);
  }
}

TEST(AttentionLayout, OutputReadByAnythingButTheMergeStaysBhsd) {
  Graph g;
  AttentionGraph(g, Form::kBert);  // Y is the graph output itself: no merge to absorb
  RunPasses(g, FusionAndLayout());
  Node* a = Find(g, "Attention");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->attrs().GetString("layout", "bhsd"), "bhsd");
}

TEST(AttentionShapeRule, InterleavedLayouts) {
  for (std::string layout : {"bshd", "bsd"}) {
    SCOPED_TRACE(layout);
    Graph g;
    bool packed = layout == "bsd";
    std::vector<int64_t> qd =
        packed ? std::vector<int64_t>{3, 7, 12} : std::vector<int64_t>{3, 7, 2, 6};
    std::vector<int64_t> kd =
        packed ? std::vector<int64_t>{3, 9, 12} : std::vector<int64_t>{3, 9, 2, 6};
    std::vector<int64_t> vd =
        packed ? std::vector<int64_t>{3, 9, 10} : std::vector<int64_t>{3, 9, 2, 5};
    Value* q = g.AddInput("q", DataType::kFloat32, Shape(qd.begin(), qd.end()));
    Value* k = g.AddInput("k", DataType::kFloat32, Shape(kd.begin(), kd.end()));
    Value* v = g.AddInput("v", DataType::kFloat32, Shape(vd.begin(), vd.end()));
    Value* m = g.AddInput("m", DataType::kFloat32, {3, 1, 1, 9});
    Value* y = g.AddValue("y");
    AttributeMap attrs;
    attrs.Set("mask_kind", std::string("additive"));
    attrs.Set("layout", layout);
    if (packed) attrs.Set("num_heads", int64_t{2});
    g.AddNode("Attention", "attn", {q, k, v, m}, {y}, attrs);
    ASSERT_TRUE(InferShapes(g).ok());
    std::vector<int64_t> want =
        packed ? std::vector<int64_t>{3, 7, 10} : std::vector<int64_t>{3, 7, 2, 5};
    EXPECT_EQ(y->shape(), Shape(want.begin(), want.end()));
    if (packed) {  // 12 columns are not 5 heads
      Graph bad;
      Value* bq = bad.AddInput("q", DataType::kFloat32, {3, 7, 12});
      AttributeMap b = attrs;
      b.Set("num_heads", int64_t{5});
      b.Set("mask_kind", std::string("none"));
      bad.AddNode("Attention", "attn", {bq, bq, bq}, {bad.AddValue("y")}, b);
      auto r = InferShapes(bad);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), ErrorCode::kShapeMismatch);
    }
  }
}

// Grouped-query attention in layout bshd: Q [B, S, G, R, D], K and V [B, S, G, 1, D]; Y takes Q's
// heads and V's head size; the mask broadcasts to [B, G, R, Sq, Sk]. K with R query heads of its
// own is fine; K with another group count, rank 5 beside rank 4, or a rank-4 K of one head
// against Q's several is not.
TEST(AttentionShapeRule, GroupedHeadsInLayoutBshd) {
  auto infer = [](std::vector<int64_t> qd, std::vector<int64_t> kd, std::vector<int64_t> vd,
                  std::vector<int64_t> md, Shape* out) {
    Graph g;
    Value* q = g.AddInput("q", DataType::kFloat32, Shape(qd.begin(), qd.end()));
    Value* k = g.AddInput("k", DataType::kFloat32, Shape(kd.begin(), kd.end()));
    Value* v = g.AddInput("v", DataType::kFloat32, Shape(vd.begin(), vd.end()));
    AttributeMap attrs;
    attrs.Set("layout", std::string("bshd"));
    std::vector<Value*> in{q, k, v};
    if (!md.empty()) {
      attrs.Set("mask_kind", std::string("additive"));
      in.push_back(g.AddInput("m", DataType::kFloat32, Shape(md.begin(), md.end())));
    }
    Value* y = g.AddValue("y");
    g.AddNode("Attention", "attn", in, {y}, attrs);
    auto r = InferShapes(g);
    if (r.ok() && out) *out = y->shape();
    return r.ok() ? OkStatus() : r.status();
  };
  Shape y;
  ASSERT_TRUE(infer({2, 7, 4, 3, 8}, {2, 9, 4, 1, 8}, {2, 9, 4, 1, 6}, {1, 4, 3, 7, 9}, &y).ok());
  EXPECT_EQ(y, (Shape{2, 7, 4, 3, 6}));
  ASSERT_TRUE(infer({2, 7, 4, 3, 8}, {1, 9, 4, 3, 8}, {1, 9, 4, 3, 8}, {}, &y).ok());
  EXPECT_EQ(y, (Shape{2, 7, 4, 3, 8}));
  for (auto [k, v] :
       {std::pair{std::vector<int64_t>{2, 9, 2, 1, 8}, std::vector<int64_t>{2, 9, 2, 1, 8}},
        std::pair{std::vector<int64_t>{2, 9, 4, 2, 8}, std::vector<int64_t>{2, 9, 4, 2, 8}},
        std::pair{std::vector<int64_t>{2, 9, 4, 8}, std::vector<int64_t>{2, 9, 4, 8}}}) {
    Status st = infer({2, 7, 4, 3, 8}, k, v, {}, nullptr);
    ASSERT_FALSE(st.ok()) << fmt::format("K [{}]", fmt::join(k, ","));
    EXPECT_EQ(st.code(), ErrorCode::kShapeMismatch);
  }
  Status st = infer({2, 7, 4, 8}, {2, 9, 1, 8}, {2, 9, 1, 8}, {}, nullptr);
  ASSERT_FALSE(st.ok());  // rank 4 keeps equal heads
  EXPECT_EQ(st.code(), ErrorCode::kShapeMismatch);
  st = infer({2, 7, 4, 3, 8}, {2, 9, 4, 1, 8}, {2, 9, 4, 1, 8}, {2, 4, 2, 7, 9}, nullptr);
  ASSERT_FALSE(st.ok());  // a mask of 2 query heads against 3
  EXPECT_EQ(st.code(), ErrorCode::kShapeMismatch);
}

// Swin's shifted-window attention: Q scaled before the product, a relative-position bias over
// [1, H, S, S], then the scores split into [N/P, P, H, S, S] windows for a per-window mask and
// merged back before the Softmax. `window_mask_dims` is the second mask's shape (rank 5).
void WindowGraph(Graph& g, std::vector<int64_t> window_mask_dims, bool with_bias) {
  const int64_t n = 6, heads = 2, s = 5, d = 4, p = 3;  // N = 6 windows-by-batch, P = 3
  Value* q = g.AddInput("q", DataType::kFloat32, {n, heads, s, d});
  Value* k = g.AddInput("k", DataType::kFloat32, {n, heads, s, d});
  Value* v = g.AddInput("v", DataType::kFloat32, {n, heads, s, d});
  Value* qs = Op(g, "Mul", {q, Const(g, Scalar(0.5f))});
  Value* kt = Op(g, "Transpose", {k}, Attrs(std::pair{"perm", std::vector<int64_t>{0, 1, 3, 2}}));
  Value* scores = Op(g, "MatMul", {qs, kt});
  if (with_bias) {
    scores = Op(g, "Add",
                {scores, Const(g, RandomTensor(DataType::kFloat32, {1, heads, s, s}, 11, -1, 1))});
  }
  Value* w = Op(g, "Reshape", {scores, Const(g, Ints({n / p, p, heads, s, s}))});
  w = Op(g, "Add", {w, Const(g, RandomTensor(DataType::kFloat32, window_mask_dims, 12, -4, 0))});
  Value* merged = Op(g, "Reshape", {w, Const(g, Ints({n, heads, s, s}))});
  Value* probs = Op(g, "Softmax", {merged}, Attrs(std::pair{"axis", int64_t{-1}}));
  Value* y = Op(g, "MatMul", {probs, v});
  g.MarkOutput(y);
  ASSERT_TRUE(InferShapes(g).ok());
}

TEST(AttentionFusion, ShiftedWindowMaskRunsOnRankFiveViews) {
  for (bool with_bias : {true, false}) {
    SCOPED_TRACE(with_bias ? "relative-position bias and window mask" : "window mask only");
    Graph before, after;
    WindowGraph(before, {1, 3, 1, 5, 5}, with_bias);
    WindowGraph(after, {1, 3, 1, 5, 5}, with_bias);
    PassReport r = RunPasses(after, AttentionOnly());
    EXPECT_EQ(r.rewrites("attention_fusion"), 1);
    Node* a = Find(after, "Attention");
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(CountOps(after, "Softmax"), 0);
    EXPECT_EQ(CountOps(after, "MatMul"), 0);
    EXPECT_EQ(CountOps(after, "Mul"), 0);  // Q's scale joined the op's
    EXPECT_FLOAT_EQ(a->attrs().GetFloat("scale", 0), 0.5f);
    EXPECT_EQ(a->attrs().GetString("mask_kind", ""), "additive");
    ASSERT_TRUE(a->input(0)->has_shape());
    EXPECT_EQ(a->input(0)->shape().size(), 5u);
    ExpectSameOutputs(before, after);
  }
}

TEST(AttentionFusion, WindowSplitThatIsNotOfTheLeadingDimStays) {
  // The same graph with a Reshape that regroups other dims ([6, 2, 5, 5] -> [2, 3, 2, 5, 5] is
  // the window split; [6, 2, 25] -> [6, 2, 5, 5, 1] is not): fusion needs N = N/P x P exactly.
  Graph g;
  Value* q = g.AddInput("q", DataType::kFloat32, {6, 2, 5, 4});
  Value* k = g.AddInput("k", DataType::kFloat32, {6, 2, 5, 4});
  Value* kt = Op(g, "Transpose", {k}, Attrs(std::pair{"perm", std::vector<int64_t>{0, 1, 3, 2}}));
  Value* w = Op(g, "Reshape", {Op(g, "MatMul", {q, kt}), Const(g, Ints({6, 2, 5, 5, 1}))});
  w = Op(g, "Add", {w, Const(g, RandomTensor(DataType::kFloat32, {1, 1, 1, 5, 1}, 3))});
  Value* merged = Op(g, "Reshape", {w, Const(g, Ints({6, 2, 5, 5}))});
  Value* y =
      Op(g, "MatMul", {Op(g, "Softmax", {merged}, Attrs(std::pair{"axis", int64_t{-1}})), q});
  g.MarkOutput(y);
  ASSERT_TRUE(InferShapes(g).ok());
  RunPasses(g, AttentionOnly());
  EXPECT_EQ(CountOps(g, "Attention"), 0);
}

TEST(AttentionFusion, SoftmaxReadElsewhereDoesNotFuse) {
  Graph g;
  AttentionGraph(g, Form::kBertSoftmaxReadElsewhere);
  RunPasses(g, AttentionOnly());
  EXPECT_EQ(CountOps(g, "Attention"), 0);
  EXPECT_EQ(CountOps(g, "Softmax"), 1);
}

}  // namespace
}  // namespace kiln::passes
