// Patchify (patchify.cc): a convolution whose windows tile a few-channel input becomes a Transpose
// of the patches and one Gemm, and the Transpose back to channels-first cancels against the model's
// own permute (transpose sinking's Reshape rule). Every rewritten graph computes what the original
// does on fresh random inputs.
#include <gtest/gtest.h>

#include "kiln/ir/weight_program.h"
#include "pass_test_util.h"

namespace kiln::passes {
namespace {

using namespace testing;

Value* Transpose(Graph& g, Value* x, std::vector<int64_t> perm) {
  return Op(g, "Transpose", {x}, Attrs(std::pair{"perm", std::move(perm)}));
}

struct ConvSpec {
  int64_t c = 3, k = 16, kh = 8, kw = 8, stride_h = 8, stride_w = 8, group = 1;
  std::vector<int64_t> pads;
  bool bias = true;
};

// A model initializer: a constant that refit can renew.
Value* Initializer(Graph& g, Tensor t) {
  Value* v = Const(g, std::move(t));
  v->set_provenance(InitializerExpr(v->name(), *v->constant()));
  return v;
}

Value* PatchConv(Graph& g, Value* x, const ConvSpec& s, uint32_t seed) {
  std::vector<Value*> in{
      x, Initializer(g, RandomTensor(DataType::kFloat32, {s.k, s.c / s.group, s.kh, s.kw}, seed))};
  if (s.bias) in.push_back(Initializer(g, RandomTensor(DataType::kFloat32, {s.k}, seed + 1)));
  AttributeMap a = Attrs(std::pair{"strides", std::vector<int64_t>{s.stride_h, s.stride_w}},
                         std::pair{"kernel_shape", std::vector<int64_t>{s.kh, s.kw}},
                         std::pair{"group", s.group});
  if (!s.pads.empty()) a.Set("pads", s.pads);
  return Op(g, "Conv", std::move(in), std::move(a));
}

// ViT's patch embedding: conv, flatten(2), transpose(1, 2), then a class token and positions.
std::unique_ptr<Graph> VitEmbedding(Dim batch, int64_t hw, const ConvSpec& s) {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, {batch, s.c, hw, hw});
  Value* y = PatchConv(*g, x, s, 1);
  const int64_t tokens = (hw / s.kh) * (hw / s.kw);
  Value* flat = Op(*g, "Reshape", {y, Const(*g, Ints({-1, s.k, tokens}))});
  Value* seq = Transpose(*g, flat, {0, 2, 1});
  Value* pos = Const(*g, RandomTensor(DataType::kFloat32, {1, tokens, s.k}, 5));
  g->MarkOutput(Op(*g, "Add", {seq, pos}));
  return g;
}

TEST(Patchify, VitPatchEmbeddingIsOneGemmAndOneTranspose) {
  for (Dim batch : {Dim(2), Dim::Symbol("n")}) {
    for (bool bias : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "batch " << (batch.is_static() ? "2" : "n")
                                        << (bias ? ", bias" : ", no bias"));
      ConvSpec s;
      s.bias = bias;
      auto before = VitEmbedding(batch, 32, s);
      auto after = VitEmbedding(batch, 32, s);
      auto report = RunDefaultPasses(*after, NhwcOptions());
      ASSERT_TRUE(report.ok()) << report.status().ToString();
      SCOPED_TRACE(report->ToString());
      EXPECT_EQ(report->rewrites("patchify"), 1);
      EXPECT_EQ(CountOps(*after, "Conv") + CountOps(*after, "FusedConv"), 0);
      // The patches' Transpose stays; the one back to channels-first met the model's permute.
      EXPECT_EQ(CountOps(*after, "Transpose"), 1);
      // The product's weights remember how they were made, so refit can renew them.
      bool found_product = false;
      for (Node* n : after->nodes()) {
        if (n->op_type() != "Gemm" && n->op_type() != "FusedGemm") continue;
        found_product = true;
        ASSERT_TRUE(n->input(1)->is_constant());
        EXPECT_EQ(ProvenanceOf(*n->input(1))->kind, WeightExpr::Kind::kStep);
      }
      EXPECT_TRUE(found_product);
      ExpectSameOutputs(*before, *after, {{"n", 3}}, 1e-5);
    }
  }
}

// Swin's and ConvNeXt's stem: a 4x4 stride-4 conv from 3 channels, then a permute to
// channels-last for the LayerNorm; a non-square window too.
TEST(Patchify, StemThenPermuteToChannelsLastNeedsNoTransposeBack) {
  for (auto [kh, kw] : {std::pair<int64_t, int64_t>{4, 4}, {2, 4}}) {
    SCOPED_TRACE(::testing::Message() << kh << "x" << kw);
    auto make = [&] {
      auto g = std::make_unique<Graph>();
      Value* x = g->AddInput("x", DataType::kFloat32, {2, 3, 16, 24});
      ConvSpec s;
      s.k = 12, s.kh = kh, s.kw = kw, s.stride_h = kh, s.stride_w = kw;
      Value* t = Transpose(*g, PatchConv(*g, x, s, 3), {0, 2, 3, 1});
      Value* ln = Op(*g, "LayerNormalization",
                     {t, Const(*g, RandomTensor(DataType::kFloat32, {12}, 4, 0.5, 1.5)),
                      Const(*g, RandomTensor(DataType::kFloat32, {12}, 5))},
                     Attrs(std::pair{"axis", int64_t{-1}}));
      g->MarkOutput(ln);
      return g;
    };
    auto before = make();
    auto after = make();
    auto report = RunDefaultPasses(*after, NhwcOptions());
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    SCOPED_TRACE(report->ToString());
    EXPECT_EQ(report->rewrites("patchify"), 1);
    EXPECT_EQ(CountOps(*after, "Transpose"), 1);
    ExpectSameOutputs(*before, *after, {}, 1e-5);
  }
}

// A conv read as channels-first keeps its value: the Transpose back stays and the result agrees.
TEST(Patchify, ChannelsFirstReadersStillSeeChannelsFirst) {
  auto make = [] {
    auto g = std::make_unique<Graph>();
    Value* x = g->AddInput("x", DataType::kFloat32, {2, 1, 12, 12});
    ConvSpec s;
    s.c = 1, s.k = 5, s.kh = s.kw = s.stride_h = s.stride_w = 3;
    g->MarkOutput(Op(*g, "Relu", {PatchConv(*g, x, s, 7)}));
    return g;
  };
  auto before = make();
  auto after = make();
  auto report = RunDefaultPasses(*after, TestOptions());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->rewrites("patchify"), 1);
  ExpectSameOutputs(*before, *after, {}, 1e-5);
}

TEST(Patchify, ConvolutionsThatAreNotPatchesStay) {
  struct Case {
    const char* what;
    ConvSpec spec;
    int64_t hw;
  };
  ConvSpec many;  // many channels: an implicit-GEMM convolution is as fast as the product
  many.c = 16;
  ConvSpec overlap;  // windows overlap
  overlap.stride_h = overlap.stride_w = 4;
  ConvSpec padded;
  padded.pads = {1, 1, 1, 1};
  ConvSpec grouped;
  grouped.c = 4, grouped.group = 2;
  ConvSpec tiny;  // a 1x1 window
  tiny.kh = tiny.kw = tiny.stride_h = tiny.stride_w = 1;
  for (const Case& c : {Case{"many channels", many, 32}, Case{"overlapping", overlap, 32},
                        Case{"padded", padded, 32}, Case{"grouped", grouped, 32},
                        Case{"1x1", tiny, 32}, Case{"not divisible", ConvSpec{}, 30}}) {
    SCOPED_TRACE(c.what);
    auto make = [&] {
      auto g = std::make_unique<Graph>();
      Value* x = g->AddInput("x", DataType::kFloat32, {2, c.spec.c, c.hw, c.hw});
      g->MarkOutput(Op(*g, "Relu", {PatchConv(*g, x, c.spec, 11)}));
      return g;
    };
    auto before = make();
    auto after = make();
    auto report = RunDefaultPasses(*after, TestOptions());
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->rewrites("patchify"), 0);
    EXPECT_EQ(CountOps(*after, "Conv") + CountOps(*after, "FusedConv"), 1);
    ExpectSameOutputs(*before, *after, {}, 1e-5);
  }
}

// Transpose sinking's Reshape rule on its own: a Reshape that merges runs of axes read in order
// lets the Transpose move below it and cancel; one that merges axes read out of order does not.
TEST(TransposeSinking, ATransposeMovesBelowAReshapeThatMergesRunsReadInOrder) {
  struct Case {
    std::vector<int64_t> p;
    std::vector<int64_t> merged;  // the Reshape's target
    std::vector<int64_t> q;       // the model's Transpose after it
    int transposes_left;
  };
  // x is [2, 3, 4, 5].
  for (const Case& c : {
           // [2,5,3,4] -> [2,5,12] -> [2,12,5]: x's [3,4] run merges; the two cancel.
           Case{{0, 3, 1, 2}, {2, 5, 12}, {0, 2, 1}, 0},
           // [4,5,2,3] -> [20,6] -> [6,20]: two runs swap places, and swap back.
           Case{{2, 3, 0, 1}, {20, 6}, {1, 0}, 0},
           // [2,4,3,5] -> [2,12,5]: merges 4 and 3, which x holds in the other order: stays.
           Case{{0, 2, 1, 3}, {2, 12, 5}, {0, 2, 1}, 2},
       }) {
    SCOPED_TRACE(::testing::PrintToString(c.p) + " then " + ::testing::PrintToString(c.merged));
    auto make = [&] {
      auto g = std::make_unique<Graph>();
      Value* x = g->AddInput("x", DataType::kFloat32, {2, 3, 4, 5});
      Value* t = Transpose(*g, Op(*g, "Relu", {x}), c.p);
      Value* r = Op(*g, "Reshape", {t, Const(*g, Ints(c.merged))});
      g->MarkOutput(Op(*g, "Sigmoid", {Transpose(*g, r, c.q)}));
      return g;
    };
    auto before = make();
    auto after = make();
    auto report = RunDefaultPasses(*after, TestOptions());
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    SCOPED_TRACE(report->ToString());
    EXPECT_EQ(CountOps(*after, "Transpose"), c.transposes_left);
    ExpectSameOutputs(*before, *after);
  }
}

// Conv1d lift (conv1d_lift.cc): Whisper's stem, two 1-D convolutions (the second of stride 2) with
// GELU, then the permute to [N, L, C]. Where the layout pass runs, both become channels-last 2-D
// convolutions of height 1, the stack stays 4-D between them, and the Transpose back cancels
// against the model's permute: one Transpose (into channels-last) is left.
std::unique_ptr<Graph> WhisperStem(Dim length) {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 8, length});
  auto conv = [&](Value* in, int64_t c, int64_t k, int64_t stride, uint32_t seed) {
    Value* w = Initializer(*g, RandomTensor(DataType::kFloat32, {k, c, 3}, seed));
    Value* b = Initializer(*g, RandomTensor(DataType::kFloat32, {k}, seed + 1));
    return Op(*g, "Gelu",
              {Op(*g, "Conv", {in, w, b},
                  Attrs(std::pair{"pads", std::vector<int64_t>{1, 1}},
                        std::pair{"strides", std::vector<int64_t>{stride}}))});
  };
  Value* h = conv(conv(x, 8, 16, 1, 1), 16, 16, 2, 3);
  g->MarkOutput(Op(*g, "Sigmoid", {Transpose(*g, h, {0, 2, 1})}));
  return g;
}

TEST(Conv1dLift, WhisperStemIsOneChannelsLastStack) {
  for (Dim length : {Dim(20), Dim::Symbol("t")}) {
    SCOPED_TRACE(length.is_static() ? "length 20" : "symbolic length");
    auto before = WhisperStem(length);
    auto after = WhisperStem(length);
    auto report = RunDefaultPasses(*after, NhwcOptions());
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    SCOPED_TRACE(report->ToString());
    EXPECT_EQ(report->rewrites("conv1d_lift"), 2);
    int convs = 0;
    for (Node* n : after->nodes()) {
      if (n->op_type() != "Conv" && n->op_type() != "FusedConv") continue;
      ++convs;
      EXPECT_EQ(n->input(0)->shape().size(), 4u) << n->name();
      EXPECT_EQ(n->attrs().GetString("kiln_layout", ""), "NHWC") << n->name();
    }
    EXPECT_EQ(convs, 2);
    EXPECT_EQ(CountOps(*after, "Transpose"), 1);
    ExpectSameOutputs(*before, *after, {{"n", 2}, {"t", 17}}, 1e-5);
  }
}

TEST(Conv1dLift, OnlyWhereTheLayoutPassRuns) {
  auto before = WhisperStem(20);
  auto after = WhisperStem(20);
  auto report = RunDefaultPasses(*after, TestOptions());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->rewrites("conv1d_lift"), 0);
  for (Node* n : after->nodes()) {
    if (n->op_type() == "Conv" || n->op_type() == "FusedConv") {
      EXPECT_EQ(n->input(0)->shape().size(), 3u);
    }
  }
  ExpectSameOutputs(*before, *after, {{"n", 2}}, 1e-5);
}

}  // namespace
}  // namespace kiln::passes
