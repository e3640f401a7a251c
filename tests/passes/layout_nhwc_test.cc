// The layout pass (layout_nhwc.cc): convolution stacks go channels-last with the fewest
// Transposes at their boundaries, and the rewritten graph computes what the original does (on the
// CPU, whose NHWC adapter runs the tagged nodes).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "kiln/onnx/onnx_import.h"
#include "kiln/ops/op_schema.h"
#include "pass_test_util.h"

namespace kiln::passes {
namespace {

using namespace testing;

int CountTagged(const Graph& g) {
  int n = 0;
  for (Node* node : g.nodes()) n += node->attrs().GetString("kiln_layout", "") == "NHWC";
  return n;
}

// Runs both graphs on the same random inputs and expects equal outputs.
void ExpectSameOutputs(const Graph& a, const Graph& b, const std::map<std::string, int64_t>& bind,
                       double tol) {
  auto inputs = RandomInputs(a, bind, 7);
  auto want = cpu::EvaluateGraph(a, inputs);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  auto got = cpu::EvaluateGraph(b, inputs);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(want->size(), got->size());
  for (const auto& [name, w] : *want) {
    auto it = got->find(name);
    ASSERT_NE(it, got->end()) << "output " << name << " missing";
    const Tensor& g = it->second;
    ASSERT_EQ(w.dims(), g.dims()) << name;
    double max_err = 0;
    for (int64_t i = 0; i < w.num_elements(); ++i) {
      max_err = std::max(
          max_err, std::abs(w.GetDouble(i) - g.GetDouble(i)) / (1.0 + std::abs(w.GetDouble(i))));
    }
    EXPECT_LE(max_err, tol) << name;
  }
}

// conv -> relu -> (+ per-channel constant) -> maxpool -> conv -> GAP -> flatten -> gemm
std::unique_ptr<Graph> SmallCnn() {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 3, 13, 13});
  Value* w1 = Const(*g, RandomTensor(DataType::kFloat32, {8, 3, 3, 3}, 1));
  Value* c1 = Op(*g, "Conv", {x, w1}, Attrs(std::pair{"pads", std::vector<int64_t>{1, 1, 1, 1}}));
  Value* r1 = Op(*g, "Relu", {c1});
  Value* shift = Const(*g, RandomTensor(DataType::kFloat32, {8, 1, 1}, 2));
  Value* a1 = Op(*g, "Add", {r1, shift});
  Value* s1 = Op(*g, "Mul", {a1, Const(*g, Scalar(0.5f))});
  Value* p1 = Op(*g, "MaxPool", {s1},
                 Attrs(std::pair{"kernel_shape", std::vector<int64_t>{2, 2}},
                       std::pair{"strides", std::vector<int64_t>{2, 2}}));
  Value* w2 = Const(*g, RandomTensor(DataType::kFloat32, {6, 8, 3, 3}, 3));
  Value* c2 = Op(*g, "Conv", {p1, w2}, Attrs(std::pair{"strides", std::vector<int64_t>{2, 2}}));
  Value* gap = Op(*g, "GlobalAveragePool", {c2});
  Value* flat = Op(*g, "Flatten", {gap});
  Value* wg = Const(*g, RandomTensor(DataType::kFloat32, {6, 4}, 4));
  Value* y = Op(*g, "Gemm", {flat, wg});
  g->MarkOutput(y);
  g->MarkOutput(c2);  // a channels-last value that is also a graph output
  return g;
}

TEST(LayoutNhwc, SmallCnnGetsOneTransposeEachWayAndAgrees) {
  auto before = SmallCnn();
  auto after = SmallCnn();
  auto report = RunDefaultPasses(*after, NhwcOptions());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  SCOPED_TRACE(report->ToString());
  // Into NHWC after x; back to NCHW for the graph output c2 (GAP's 1x1 output needs only a
  // Reshape before Flatten).
  EXPECT_EQ(CountOps(*after, "Transpose"), 2);
  EXPECT_EQ(CountOps(*after, "Reshape"), 1);
  EXPECT_EQ(CountTagged(*after), 4);  // 2 convs, the pool, GAP
  // The report says how many and where.
  EXPECT_NE(report->ToString().find("2 transpose(s) inserted: x -> NHWC"), std::string::npos);
  EXPECT_NE(report->ToString().find("1 1x1 map(s) back to NCHW by Reshape"), std::string::npos);
  // The graph outputs keep their names.
  ASSERT_EQ(after->outputs().size(), 2u);
  EXPECT_EQ(after->outputs()[1]->name(), before->outputs()[1]->name());
  ExpectSameOutputs(*before, *after, {{"n", 2}}, 1e-4);
}

TEST(LayoutNhwc, DoesNothingWithoutTheOption) {
  auto g = SmallCnn();
  auto report = RunDefaultPasses(*g, TestOptions());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(CountOps(*g, "Transpose"), 0);
  EXPECT_EQ(CountTagged(*g), 0);
}

// A squeeze-excite block as the dynamo exporter writes it: the spatial mean is ReduceMean over
// axes 2 and 3. The global_pool pass makes it GlobalAveragePool, so the whole block stays NHWC
// (before, the layout pass put a transpose pair around the reduction).
std::unique_ptr<Graph> SqueezeExcite(std::vector<int64_t> axes, int64_t keepdims) {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, {Dim::Symbol("n"), 4, 9, 11});
  Value* w1 = Const(*g, RandomTensor(DataType::kFloat32, {16, 4, 3, 3}, 1));
  Value* c1 = Op(*g, "Conv", {x, w1}, Attrs(std::pair{"pads", std::vector<int64_t>{1, 1, 1, 1}}));
  Value* mean =
      Op(*g, "ReduceMean", {c1, Const(*g, Ints(axes))}, Attrs(std::pair{"keepdims", keepdims}));
  if (keepdims == 0) mean = Op(*g, "Unsqueeze", {mean, Const(*g, Ints({2, 3}))});
  Value* w2 = Const(*g, RandomTensor(DataType::kFloat32, {16, 16, 1, 1}, 2));
  Value* gate = Op(*g, "Sigmoid", {Op(*g, "Conv", {mean, w2})});
  Value* scaled = Op(*g, "Mul", {c1, gate});
  Value* w3 = Const(*g, RandomTensor(DataType::kFloat32, {8, 16, 1, 1}, 3));
  g->MarkOutput(Op(*g, "Conv", {scaled, w3}));
  return g;
}

TEST(GlobalPool, SpatialReduceMeanBecomesGlobalAveragePoolAndStaysChannelsLast) {
  for (std::vector<int64_t> axes : {std::vector<int64_t>{2, 3}, std::vector<int64_t>{-1, -2}}) {
    auto before = SqueezeExcite(axes, 1);
    auto after = SqueezeExcite(axes, 1);
    auto report = RunDefaultPasses(*after, NhwcOptions());
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    SCOPED_TRACE(report->ToString());
    EXPECT_EQ(report->rewrites("global_pool"), 1);
    EXPECT_EQ(CountOps(*after, "ReduceMean"), 0);
    EXPECT_EQ(CountOps(*after, "GlobalAveragePool"), 1);
    EXPECT_EQ(CountOps(*after, "Transpose"), 2);  // into NHWC after x, back for the output
    ExpectSameOutputs(*before, *after, {{"n", 2}}, 1e-4);
  }
}

TEST(GlobalPool, OtherReductionsStay) {
  struct Case {
    DataType dtype;
    std::vector<int64_t> dims, axes;
    int64_t keepdims;
  };
  const std::vector<Case> cases = {
      {DataType::kFloat32, {2, 4, 6, 5}, {3}, 1},        // not every spatial axis
      {DataType::kFloat32, {2, 4, 6, 5}, {1, 2, 3}, 1},  // the channels too
      {DataType::kFloat32, {2, 4, 6, 5}, {2, 3}, 0},     // spatial axes dropped
      {DataType::kInt64, {2, 4, 6, 5}, {2, 3}, 1},       // integers (the pool is float only)
      {DataType::kFloat32, {2, 5, 8}, {2}, 1},           // rank 3: a transformer's hidden axis
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::PrintToString(c.axes) + " of " + ::testing::PrintToString(c.dims));
    Graph g;
    Value* x = g.AddInput("x", c.dtype, MakeShape(c.dims));
    g.MarkOutput(
        Op(g, "ReduceMean", {x, Const(g, Ints(c.axes))}, Attrs(std::pair{"keepdims", c.keepdims})));
    auto report = RunDefaultPasses(g, NhwcOptions());
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->rewrites("global_pool"), 0);
    EXPECT_EQ(CountOps(g, "ReduceMean"), 1);
    EXPECT_EQ(CountOps(g, "GlobalAveragePool"), 0);
  }
}

TEST(LayoutNhwc, ShapeRuleHonoursTheAttribute) {
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, {2, 9, 7, 3});  // N, H, W, C
  Value* w = Const(g, RandomTensor(DataType::kFloat32, {8, 3, 3, 3}, 1));
  AttributeMap attrs = Attrs(std::pair{"strides", std::vector<int64_t>{2, 1}});
  attrs.Set("kiln_layout", std::string("NHWC"));
  Value* y = Op(g, "Conv", {x, w}, attrs);
  g.MarkOutput(y);
  ASSERT_TRUE(InferShapes(g).ok());
  EXPECT_EQ(ToString(y->shape()), ToString(Shape{2, 4, 5, 8}));
}

std::filesystem::path ZooDir() {
  const char* src = std::getenv("KILN_SOURCE_DIR");
  return std::filesystem::path(src ? src : ".") / "zoo";
}

struct ZooLayoutCase {
  std::string model;
  int transposes;  // the minimum: see the comments in the instantiation
  int reshapes;    // NHWC -> NCHW of a 1x1 map (free: no data movement)
};
std::ostream& operator<<(std::ostream& os, const ZooLayoutCase& c) { return os << c.model; }

class ZooLayout : public ::testing::TestWithParam<ZooLayoutCase> {};

TEST_P(ZooLayout, FewestTransposesAndSameOutputs) {
  const ZooLayoutCase& c = GetParam();
  std::string path = (ZooDir() / c.model / "model.onnx").string();
  auto before = ImportOnnxFile(path);
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  auto after = ImportOnnxFile(path);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  ASSERT_TRUE(RunDefaultPasses(**before, TestOptions()).ok());
  auto report = RunDefaultPasses(**after, NhwcOptions());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  SCOPED_TRACE(report->ToString());
  EXPECT_EQ(CountOps(**after, "Transpose"), c.transposes);
  EXPECT_EQ(CountOps(**after, "Reshape") - CountOps(**before, "Reshape"), c.reshapes);
  int convs = CountOps(**after, "Conv") + CountOps(**after, "FusedConv") +
              CountOps(**after, "ConvTranspose");
  EXPECT_GT(convs, 0);
  EXPECT_EQ(CountTagged(**after) >= convs, true);  // every convolution went channels-last
  ExpectSameOutputs(**before, **after, {{"batch", 2}}, 1e-4);
}

// Each model has one NCHW graph input feeding its first convolution: one transpose in is the
// least any layout change can do. ResNet and MobileNet end in GlobalAveragePool -> Flatten:
// the pooled map is N x 1 x 1 x C, so going back to NCHW is a Reshape, not a transpose. U-Net's
// NCHW output map needs one transpose out; its Concats and Resizes stay channels-last.
INSTANTIATE_TEST_SUITE_P(Zoo, ZooLayout,
                         ::testing::Values(ZooLayoutCase{"resnet_tiny", 1, 1},
                                           ZooLayoutCase{"mobilenetv3_tiny", 1, 1},
                                           ZooLayoutCase{"unet_tiny", 2, 0}),
                         [](const auto& info) { return info.param.model; });

}  // namespace
}  // namespace kiln::passes
