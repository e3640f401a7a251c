// Strided-view analysis (view_analysis.h) and the passes that use it on nn.MultiheadAttention's
// exports: the composed view of a chain over symbolic dims, modes that a Reshape merges and a
// later one splits, the failures (a reshape no strides express); row_transpose moving the rows'
// Transpose above the out-projection; attention_layout reading Q, K and V in place from the
// packed in-projection of a batch_first module, on fresh random inputs against the unfused graph.
#include <gtest/gtest.h>

#include "kiln/passes/view_analysis.h"
#include "pass_test_util.h"

namespace kiln::passes {
namespace {

using namespace testing;

using Passes = std::vector<std::unique_ptr<Pass>>;

const Dim kB = Dim::Symbol("b");

std::vector<int64_t> StaticStrides(const StridedView& v) {
  std::vector<int64_t> out;
  for (size_t k = 0; k < v.shape.size(); ++k) {
    std::optional<Dim> s = v.stride(k);
    out.push_back(s && s->is_static() ? s->value() : -1);
  }
  return out;
}

TEST(ViewAnalysis, ContiguousStridesOverSymbolicDims) {
  StridedView v = ContiguousView(Shape{kB, 4, 6});
  EXPECT_EQ(*v.stride(0), Dim(24));
  EXPECT_EQ(*v.stride(1), Dim(6));
  EXPECT_EQ(*v.stride(2), Dim(1));
  EXPECT_TRUE(IsRowMajor(v, Shape{kB, 4, 6}));
}

// torch's q.view(S, B*H, D) of one third of a packed [S, B, 3E] projection merges B (stride 3E)
// and H (stride D): one dim of two modes, which the later view(B, H, S, D) splits again.
TEST(ViewAnalysis, MergedDimsOfDifferentStridesSplitAgain) {
  const int64_t s = 5, h = 2, d = 4, e = h * d;
  StridedView p = ContiguousView(Shape{s, kB, 3 * e});
  // Q: the first E of each row, as [S, B, E].
  std::optional<StridedView> q = ReshapeView(p, Shape{s, kB, 3, e});
  ASSERT_TRUE(q);
  q = ReshapeView(*q, Shape{s, kB * 3 * e});  // and back: the same memory
  ASSERT_TRUE(q);
  EXPECT_EQ(*q->stride(1), Dim(1));
  StridedView third = ContiguousView(Shape{s, kB, 3 * e});
  third.shape = {s, kB, e};
  third.modes[2][0].size = e;  // Slice [0, E) of the rows
  std::optional<StridedView> m = ReshapeView(third, Shape{s, kB * h, d});
  ASSERT_TRUE(m);
  EXPECT_EQ(m->modes[1].size(), 2u);  // B at stride 3E, H at stride D
  EXPECT_FALSE(m->stride(1).has_value());
  StridedView t = TransposeView(*m, {1, 0, 2});  // [B*H, S, D]
  std::optional<StridedView> bhsd = ReshapeView(t, Shape{kB, h, s, d});
  ASSERT_TRUE(bhsd);
  EXPECT_EQ(*bhsd->stride(0), Dim(3 * e));
  EXPECT_EQ(*bhsd->stride(1), Dim(d));
  EXPECT_EQ(*bhsd->stride(2), kB * Dim(3 * e));
  EXPECT_EQ(*bhsd->stride(3), Dim(1));
}

TEST(ViewAnalysis, ReshapesNoStridesExpressFail) {
  // [2, 3] transposed is [3, 2] with strides (1, 3); flattened it is two modes; [2, 3] of that
  // would need the first 2 elements along a mode of size 3.
  StridedView t = TransposeView(ContiguousView(Shape{2, 3}), {1, 0});
  std::optional<StridedView> flat = ReshapeView(t, Shape{6});
  ASSERT_TRUE(flat);
  EXPECT_FALSE(flat->stride(0).has_value());
  EXPECT_FALSE(ReshapeView(*flat, Shape{2, 3}).has_value());
  EXPECT_TRUE(ReshapeView(*flat, Shape{3, 2}).has_value());
  // Different element counts.
  EXPECT_FALSE(ReshapeView(ContiguousView(Shape{kB, 4}), Shape{kB, 5}).has_value());
  // A symbolic dim split by another symbol.
  EXPECT_FALSE(ReshapeView(ContiguousView(Shape{kB * 4}), Shape{Dim::Symbol("c"), 4}).has_value());
}

// A pass that records ViewsOf(value named `name`) during a pass run (shapes inferred).
class RecordViews final : public Pass {
 public:
  RecordViews(std::string name, std::vector<StridedView>* out)
      : name_(std::move(name)), out_(out) {}
  std::string_view name() const override { return "record_views"; }
  Status Run(Graph& graph, PassContext& ctx) override {
    if (Value* v = graph.FindValue(name_)) *out_ = ViewsOf(v, ctx);
    return OkStatus();
  }

 private:
  std::string name_;
  std::vector<StridedView>* out_;
};

// nn.MultiheadAttention's in-projection unpacking in torch 2.x's export, for part `part`:
// P [S, B, 3E] -> Reshape [S, B, 3, E] -> Unsqueeze(0) -> Transpose(0, -2) -> Squeeze(-2)
// -> Gather(part) -> Reshape [S, B*H, D] -> Transpose(1, 0, 2) -> Reshape [B, H, S, D].
Value* Unpacked(Graph& g, Value* p, int part, int64_t s, int64_t b, int64_t h, int64_t d) {
  const int64_t e = h * d;
  Value* r = Op(g, "Reshape", {p, Const(g, Ints({s, b, 3, e}))});
  Value* u = Op(g, "Unsqueeze", {r, Const(g, Ints({0}))});
  Value* t = Op(g, "Transpose", {u}, Attrs(std::pair{"perm", std::vector<int64_t>{3, 1, 2, 0, 4}}));
  Value* sq = Op(g, "Squeeze", {t, Const(g, Ints({3}))});
  Value* idx = Const(g, Tensor::FromVector<int64_t>(DataType::kInt64, {}, {part}));
  Value* gq = Op(g, "Gather", {sq, idx}, Attrs(std::pair{"axis", int64_t{0}}));
  Value* heads = Op(g, "Reshape", {gq, Const(g, Ints({s, b * h, d}))});
  Value* ht = Op(g, "Transpose", {heads}, Attrs(std::pair{"perm", std::vector<int64_t>{1, 0, 2}}));
  return Op(g, "Reshape", {ht, Const(g, Ints({b, h, s, d}))});
}

TEST(ViewAnalysis, MultiheadAttentionUnpackingIsOneStridedRead) {
  const int64_t s = 5, b = 3, h = 2, d = 4, e = h * d;
  for (int part = 0; part < 3; ++part) {
    SCOPED_TRACE(part);
    Graph g;
    Value* p = g.AddInput("p", DataType::kFloat32, {s, b, 3 * e});
    Value* q = Unpacked(g, p, part, s, b, h, d);
    g.MarkOutput(Op(g, "Relu", {q}));
    std::vector<StridedView> views;
    Passes passes;
    passes.push_back(std::make_unique<RecordViews>(q->name(), &views));
    RunPasses(g, std::move(passes));
    ASSERT_FALSE(views.empty());
    const StridedView& over_p = views.front();
    EXPECT_EQ(over_p.source, p);
    // q[b, h, s, d] = P[s, b, part*E + h*D + d].
    EXPECT_EQ(StaticStrides(over_p), (std::vector<int64_t>{3 * e, d, b * 3 * e, 1}));
    EXPECT_EQ(over_p.offset, Dim(part * e));
    EXPECT_TRUE(IsRowMajor(views.back(), q->shape()));  // q over itself
  }
}

// A batch_first nn.MultiheadAttention block as torch 2.x's TorchScript exporter writes it:
// x [B, S, E] -> Transpose(1, 0, 2) -> in-projection (MatMul + Add) -> unpacking -> attention
// (MatMul, Mul, Softmax, MatMul) -> Transpose(2, 0, 1, 3) -> Reshape [S*B, E] -> Gemm
// -> Reshape [S, B, E] -> Transpose(1, 0, 2). batch_first = false drops both outer Transposes.
// masked: an additive [S, S] mask (a causal one, as nn.MultiheadAttention's attn_mask).
void MhaGraph(Graph& g, bool batch_first, int64_t b, bool masked = false) {
  const int64_t s = 5, h = 2, d = 4, e = h * d;
  Value* x = batch_first ? g.AddInput("x", DataType::kFloat32, {b, s, e})
                         : g.AddInput("x", DataType::kFloat32, {s, b, e});
  Value* xs = batch_first
                  ? Op(g, "Transpose", {x}, Attrs(std::pair{"perm", std::vector<int64_t>{1, 0, 2}}))
                  : x;
  Value* w_in = Const(g, RandomTensor(DataType::kFloat32, {e, 3 * e}, 11));
  Value* b_in = Const(g, RandomTensor(DataType::kFloat32, {3 * e}, 12));
  Value* proj = Op(g, "Add", {Op(g, "MatMul", {xs, w_in}), b_in});
  Value* q = Unpacked(g, proj, 0, s, b, h, d);
  Value* k = Unpacked(g, proj, 1, s, b, h, d);
  Value* v = Unpacked(g, proj, 2, s, b, h, d);
  Value* kt = Op(g, "Transpose", {k}, Attrs(std::pair{"perm", std::vector<int64_t>{0, 1, 3, 2}}));
  Value* scores = Op(g, "Mul", {Op(g, "MatMul", {q, kt}), Const(g, Scalar(0.5f))});
  if (masked) {
    std::vector<float> causal(s * s);
    for (int64_t i = 0; i < s; ++i) {
      for (int64_t j = 0; j < s; ++j) causal[i * s + j] = j <= i ? 0.f : -1e4f;
    }
    scores = Op(g, "Add",
                {scores, Const(g, Tensor::FromVector<float>(DataType::kFloat32, {s, s}, causal))});
  }
  Value* probs = Op(g, "Softmax", {scores}, Attrs(std::pair{"axis", int64_t{-1}}));
  Value* y = Op(g, "MatMul", {probs, v});
  Value* merged =
      Op(g, "Transpose", {y}, Attrs(std::pair{"perm", std::vector<int64_t>{2, 0, 1, 3}}));
  Value* rows = Op(g, "Reshape", {merged, Const(g, Ints({s * b, e}))});
  Value* w_out = Const(g, RandomTensor(DataType::kFloat32, {e, e}, 13));
  Value* b_out = Const(g, RandomTensor(DataType::kFloat32, {e}, 14));
  Value* out = Op(g, "Gemm", {rows, w_out, b_out}, Attrs(std::pair{"transB", int64_t{1}}));
  Value* seq = Op(g, "Reshape", {out, Const(g, Ints({s, b, e}))});
  g.MarkOutput(batch_first ? Op(g, "Transpose", {seq},
                                Attrs(std::pair{"perm", std::vector<int64_t>{1, 0, 2}}))
                           : seq);
}

// As the default pipeline orders them (identity_elimination turns batch 1's Transposes of
// size-1 axes into views).
Passes MhaPasses() {
  Passes v;
  v.push_back(MakeIdentityEliminationPass());
  v.push_back(MakeAttentionFusionPass());
  v.push_back(MakeGemmFusionPass());
  v.push_back(MakeRowTransposePass());
  v.push_back(MakeAttentionLayoutPass());
  v.push_back(MakeDeadNodeEliminationPass());
  return v;
}

// Batch 3: the rows' Transposes move (row_transpose, the in-projection recomputed on x) and the
// attention reads [B, S, 3E] rows. Batch 1: the Transposes only move size-1 axes and become views
// (identity_elimination); [S, 1, 3E] rows are read as sbd, the same memory. No copy either way.
TEST(AttentionLayout, BatchFirstMultiheadAttentionReadsThePackedProjectionInPlace) {
  for (int64_t b : {1, 3}) {
    SCOPED_TRACE(b);
    Graph before, after;
    MhaGraph(before, true, b);
    MhaGraph(after, true, b);
    PassReport r = RunPasses(after, MhaPasses());
    Node* a = nullptr;
    for (Node* n : after.nodes()) {
      if (n->op_type() == "Attention") a = n;
    }
    ASSERT_NE(a, nullptr);
    if (b == 3) {
      EXPECT_EQ(r.rewrites("row_transpose"), 1);
      EXPECT_EQ(a->attrs().GetString("layout", ""), "bsd");
      // The projection runs on x itself ([B, S, 3E]).
      EXPECT_EQ(a->input(0)->producer()->input(0)->name(), "x");
    } else {
      EXPECT_EQ(a->attrs().GetString("layout", ""), "sbd");
    }
    EXPECT_EQ(a->attrs().GetInt("qkv_packed", 0), 1);
    EXPECT_EQ(a->input(0), a->input(1));
    EXPECT_EQ(a->input(0), a->input(2));
    EXPECT_EQ(CountOps(after, "Transpose"), 0);
    EXPECT_EQ(CountOps(after, "Gather"), 0);
    EXPECT_EQ(CountOps(after, "Squeeze"), 0);
    ExpectSameOutputs(before, after);
  }
}

// Sequence-first (nn.MultiheadAttention's default) with a batch above 1: the projection's rows
// are [S, B] ordered; the attention reads them as layout sbd, packed, and writes [S, B, E] rows
// for the out-projection: no copy is left.
TEST(AttentionLayout, SequenceFirstMultiheadAttentionReadsSbdInPlace) {
  for (bool masked : {false, true}) {
    SCOPED_TRACE(masked);
    Graph before, after;
    MhaGraph(before, false, 3, masked);
    MhaGraph(after, false, 3, masked);
    RunPasses(after, MhaPasses());
    Node* a = nullptr;
    for (Node* n : after.nodes()) {
      if (n->op_type() == "Attention") a = n;
    }
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(a->attrs().GetString("layout", "bhsd"), "sbd");
    EXPECT_EQ(a->attrs().GetInt("qkv_packed", 0), 1);
    EXPECT_EQ(a->attrs().GetInt("num_heads", 0), 2);
    EXPECT_EQ(CountOps(after, "Transpose"), 0);
    EXPECT_EQ(CountOps(after, "Gather"), 0);
    ExpectSameOutputs(before, after);
  }
}

// row_transpose alone: the rows' Transpose after Reshape -> Gemm -> Reshape moves above the
// Gemm when the input is itself a Transpose (which it merges with), and not otherwise.
void OutProjection(Graph& g, bool input_transposed) {
  const int64_t s = 4, b = 3, e = 6;
  Value* y = g.AddInput("y", DataType::kFloat32, {b, s, e});
  Value* u = input_transposed
                 ? Op(g, "Transpose", {y}, Attrs(std::pair{"perm", std::vector<int64_t>{1, 0, 2}}))
                 : Op(g, "Relu", {y});
  Value* rows = Op(g, "Reshape", {u, Const(g, Ints({-1, e}))});
  Value* w = Const(g, RandomTensor(DataType::kFloat32, {e, e}, 3));
  Value* c = Const(g, RandomTensor(DataType::kFloat32, {e}, 4));
  Value* out = Op(g, "Gemm", {rows, w, c}, Attrs(std::pair{"transB", int64_t{1}}));
  Value* seq = Op(g, "Reshape",
                  {out, Const(g, Ints({input_transposed ? s : b, input_transposed ? b : s, e}))});
  g.MarkOutput(Op(g, "Transpose", {seq}, Attrs(std::pair{"perm", std::vector<int64_t>{1, 0, 2}})));
}

TEST(RowTranspose, MovesAboveTheProductToMeetAnotherTranspose) {
  for (bool transposed : {true, false}) {
    SCOPED_TRACE(transposed);
    Graph before, after;
    OutProjection(before, transposed);
    OutProjection(after, transposed);
    Passes v;
    v.push_back(MakeRowTransposePass());
    v.push_back(MakeTransposeSinkingPass());  // merges the two Transposes
    v.push_back(MakeDeadNodeEliminationPass());
    PassReport r = RunPasses(after, std::move(v));
    EXPECT_EQ(r.rewrites("row_transpose"), transposed ? 1 : 0);
    // Transposed: the two cancel (1, 0, 2 twice) and none is left.
    EXPECT_EQ(CountOps(after, "Transpose"), transposed ? 0 : 1);
    ExpectSameOutputs(before, after);
  }
}

}  // namespace
}  // namespace kiln::passes
