// Stem space-to-depth (stem_space_to_depth.cc): a strided convolution of a few-channel input
// becomes a stride-1 convolution over the input's blocks moved into channels, only when the
// options ask for it and only where the implicit GEMM's depth (taps x channels padded to 16)
// shrinks. Every rewritten graph computes what the original does on fresh random inputs.
#include <gtest/gtest.h>

#include "kiln/ir/weight_program.h"
#include "pass_test_util.h"

namespace kiln::passes {
namespace {

using namespace testing;

struct StemSpec {
  int64_t c = 3, k = 8, kh = 7, kw = 7, stride_h = 2, stride_w = 2, group = 1, dilation = 1;
  std::vector<int64_t> pads = {3, 3, 3, 3};
  bool bias = true;
};

// A model initializer: a constant that refit can renew.
Value* Initializer(Graph& g, Tensor t) {
  Value* v = Const(g, std::move(t));
  v->set_provenance(InitializerExpr(v->name(), *v->constant()));
  return v;
}

std::unique_ptr<Graph> StemGraph(Dim batch, int64_t h, int64_t w, const StemSpec& s) {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, {batch, s.c, h, w});
  std::vector<Value*> in{
      x, Initializer(*g, RandomTensor(DataType::kFloat32, {s.k, s.c / s.group, s.kh, s.kw}, 3))};
  if (s.bias) in.push_back(Initializer(*g, RandomTensor(DataType::kFloat32, {s.k}, 4)));
  AttributeMap a = Attrs(std::pair{"strides", std::vector<int64_t>{s.stride_h, s.stride_w}},
                         std::pair{"kernel_shape", std::vector<int64_t>{s.kh, s.kw}},
                         std::pair{"pads", s.pads}, std::pair{"group", s.group},
                         std::pair{"dilations", std::vector<int64_t>{s.dilation, s.dilation}});
  Value* y = Op(*g, "Conv", std::move(in), std::move(a));
  g->MarkOutput(Op(*g, "Relu", {y}));
  return g;
}

PassOptions WithRewrite(PassOptions o) {
  o.stem_space_to_depth = true;
  return o;
}

// The convolution left in the graph (plain or fused with its ReLU).
const Node* TheConv(const Graph& g) {
  const Node* conv = Find(g, "Conv");
  return conv ? conv : Find(g, "FusedConv");
}

struct Rewritten {
  const char* what;
  StemSpec spec;
  int64_t h, w;
  std::vector<int64_t> kernel, pads;  // the stride-1 convolution's
};

TEST(StemSpaceToDepth, StridedFewChannelConvolutionsBecomeStrideOneOverBlocks) {
  StemSpec resnet;  // 7x7 stride 2, pad 3, from 3 channels
  StemSpec mobilenet;
  mobilenet.kh = mobilenet.kw = 3, mobilenet.pads = {1, 1, 1, 1};
  StemSpec odd;  // a 5x3 window, strides 2 and 1, uneven pads, one channel
  odd.c = 1, odd.kh = 5, odd.kw = 3, odd.stride_w = 1, odd.pads = {2, 1, 1, 0}, odd.bias = false;
  StemSpec wide;  // stride 3 (blocks of 9 channels), the taps shifted by 1
  wide.c = 1, wide.kh = wide.kw = 7, wide.stride_h = wide.stride_w = 3, wide.pads = {2, 2, 2, 2};
  for (const Rewritten& c : {
           // 32 -> 16 outputs: 16 blocks of 2 plus 2 before and 1 after, 4 taps.
           Rewritten{"resnet", resnet, 32, 32, {4, 4}, {2, 2, 1, 1}},
           Rewritten{"mobilenet", mobilenet, 16, 24, {2, 2}, {1, 1, 0, 0}},
           Rewritten{"odd", odd, 12, 10, {3, 3}, {1, 1, 1, 0}},
           Rewritten{"wide", wide, 18, 21, {3, 3}, {1, 1, 1, 1}},
       }) {
    for (Dim batch : {Dim(2), Dim::Symbol("n")}) {
      for (bool nhwc : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << c.what << (batch.is_static() ? ", batch 2" : ", batch n")
                     << (nhwc ? ", NHWC" : ""));
        auto before = StemGraph(batch, c.h, c.w, c.spec);
        auto after = StemGraph(batch, c.h, c.w, c.spec);
        auto report = RunDefaultPasses(*after, WithRewrite(nhwc ? NhwcOptions() : TestOptions()));
        ASSERT_TRUE(report.ok()) << report.status().ToString();
        SCOPED_TRACE(report->ToString());
        EXPECT_EQ(report->rewrites("stem_space_to_depth"), 1);
        const Node* conv = TheConv(*after);
        ASSERT_NE(conv, nullptr);
        EXPECT_EQ(conv->attrs().GetInts("kernel_shape"), c.kernel);
        EXPECT_EQ(conv->attrs().GetInts("strides"), (std::vector<int64_t>{1, 1}));
        EXPECT_EQ(conv->attrs().GetInts("pads"), c.pads);
        // Its weight remembers how it was made, so refit can renew it.
        ASSERT_TRUE(conv->input(1)->is_constant());
        EXPECT_EQ(ProvenanceOf(*conv->input(1))->kind, WeightExpr::Kind::kStep);
        EXPECT_EQ(conv->input(1)->constant()->dims()[1],
                  c.spec.c * c.spec.stride_h * c.spec.stride_w);
        ExpectSameOutputs(*before, *after, {{"n", 3}}, 1e-5);
        // Under the NHWC layout the input is moved once, as without the rewrite: the blocks'
        // Transpose takes the place of the layout's (and the output's stays).
        if (nhwc) {
          auto plain = StemGraph(batch, c.h, c.w, c.spec);
          ASSERT_TRUE(RunDefaultPasses(*plain, NhwcOptions()).ok());
          EXPECT_EQ(CountOps(*after, "Transpose"), CountOps(*plain, "Transpose"));
        }
      }
    }
  }
}

TEST(StemSpaceToDepth, OtherConvolutionsStay) {
  struct Case {
    const char* what;
    StemSpec spec;
    int64_t hw;
    bool ask = true;
  };
  StemSpec many;  // 16 channels: blocks of 64 make the depth larger (9 x 16 -> 4 x 64)
  many.c = 16, many.kh = many.kw = 3, many.pads = {1, 1, 1, 1};
  StemSpec pointwise;  // a 1x1 stride-2 downsampling: no window to share
  pointwise.kh = pointwise.kw = 1, pointwise.pads = {0, 0, 0, 0};
  StemSpec grouped;
  grouped.c = 4, grouped.group = 2;
  StemSpec dilated;
  dilated.dilation = 2;
  StemSpec unstrided;
  unstrided.stride_h = unstrided.stride_w = 1;
  for (const Case& c :
       {Case{"not asked", StemSpec{}, 32, false}, Case{"many channels", many, 32},
        Case{"1x1", pointwise, 32}, Case{"grouped", grouped, 32}, Case{"dilated", dilated, 32},
        Case{"stride 1", unstrided, 32}, Case{"odd extent", StemSpec{}, 31}}) {
    SCOPED_TRACE(c.what);
    auto before = StemGraph(Dim(2), c.hw, c.hw, c.spec);
    auto after = StemGraph(Dim(2), c.hw, c.hw, c.spec);
    auto report = RunDefaultPasses(*after, c.ask ? WithRewrite(TestOptions()) : TestOptions());
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->rewrites("stem_space_to_depth"), 0);
    ASSERT_NE(TheConv(*after), nullptr);
    EXPECT_EQ(TheConv(*after)->attrs().GetInts("kernel_shape"),
              (std::vector<int64_t>{c.spec.kh, c.spec.kw}));
    ExpectSameOutputs(*before, *after, {}, 1e-5);
  }
}

// An input whose last row no window reads (7x7 stride 2 over 34 rows, no padding: 14 outputs
// read rows 0..32): the stride-1 form over 17 blocks needs no end padding either.
TEST(StemSpaceToDepth, UnreadRowsAtTheEndNeedNoPadding) {
  StemSpec s;
  s.pads = {0, 0, 0, 0};
  auto before = StemGraph(Dim(1), 34, 34, s);
  auto after = StemGraph(Dim(1), 34, 34, s);
  auto report = RunDefaultPasses(*after, WithRewrite(TestOptions()));
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->rewrites("stem_space_to_depth"), 1);
  ASSERT_NE(TheConv(*after), nullptr);
  EXPECT_EQ(TheConv(*after)->attrs().GetInts("pads"), (std::vector<int64_t>{0, 0, 0, 0}));
  ExpectSameOutputs(*before, *after, {}, 1e-5);
}

}  // namespace
}  // namespace kiln::passes
