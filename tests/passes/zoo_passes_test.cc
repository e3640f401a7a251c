// The default pipeline on the model zoo (zoo/README.md): the expected fusions fire on the graphs
// the exporters really produce, and the optimized graph computes what the imported one does (and
// what PyTorch did, within the zoo's tolerance) on the committed test inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "kiln/onnx/onnx_import.h"
#include "pass_test_util.h"

namespace kiln::passes {
namespace {

using namespace testing;

struct ZooCase {
  std::string model;
  std::map<std::string, int64_t> min_rewrites;  // pass -> at least this many rewrites
  std::map<std::string, int> ops_after;         // op type -> exact count after the passes
};

std::ostream& operator<<(std::ostream& os, const ZooCase& c) { return os << c.model; }

std::filesystem::path ZooDir() {
  const char* src = std::getenv("KILN_SOURCE_DIR");
  return std::filesystem::path(src ? src : ".") / "zoo";
}

class ZooPasses : public ::testing::TestWithParam<ZooCase> {};

TEST_P(ZooPasses, FusionsFireAndOutputsAgree) {
  const ZooCase& c = GetParam();
  std::filesystem::path dir = ZooDir() / c.model;
  auto before = ImportOnnxFile((dir / "model.onnx").string());
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  auto after = ImportOnnxFile((dir / "model.onnx").string());
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  auto report = RunDefaultPasses(**after, TestOptions());
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  SCOPED_TRACE(report->ToString());
  EXPECT_TRUE(report->reached_fixed_point);
  for (const auto& [pass, n] : c.min_rewrites) {
    EXPECT_GE(report->rewrites(pass), n) << pass;
  }
  for (const auto& [op, n] : c.ops_after) EXPECT_EQ(CountOps(**after, op), n) << op;
  EXPECT_LT(report->nodes_after, report->nodes_before);

  // The committed inputs and PyTorch references.
  std::map<std::string, Tensor> inputs, want;
  std::filesystem::path data = dir / "test_data_set_0";
  for (int i = 0; std::filesystem::exists(data / ("input_" + std::to_string(i) + ".pb")); ++i) {
    std::string name;
    auto t = LoadTensorProto((data / ("input_" + std::to_string(i) + ".pb")).string(), &name);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    inputs[name] = *t;
  }
  for (int i = 0; std::filesystem::exists(data / ("output_" + std::to_string(i) + ".pb")); ++i) {
    std::string name;
    auto t = LoadTensorProto((data / ("output_" + std::to_string(i) + ".pb")).string(), &name);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    want[name] = *t;
  }
  auto got_before = cpu::EvaluateGraph(**before, inputs);
  ASSERT_TRUE(got_before.ok()) << got_before.status().ToString();
  auto got_after = cpu::EvaluateGraph(**after, inputs);
  ASSERT_TRUE(got_after.ok()) << got_after.status().ToString();
  for (const auto& [name, ref] : want) {
    ASSERT_TRUE(got_after->count(name)) << name;
    const Tensor& a = got_before->at(name);
    const Tensor& b = got_after->at(name);
    ASSERT_EQ(b.dims(), ref.dims()) << name;
    // Relative L2 error: after vs before (the passes' own change) and after vs PyTorch.
    double d_ab = 0, n_a = 0, d_ref = 0, n_ref = 0;
    for (int64_t i = 0; i < ref.num_elements(); ++i) {
      d_ab += std::pow(a.GetDouble(i) - b.GetDouble(i), 2);
      n_a += std::pow(a.GetDouble(i), 2);
      d_ref += std::pow(ref.GetDouble(i) - b.GetDouble(i), 2);
      n_ref += std::pow(ref.GetDouble(i), 2);
    }
    EXPECT_LE(std::sqrt(d_ab / std::max(n_a, 1e-30)), 1e-5) << name << ": before vs after";
    EXPECT_LE(std::sqrt(d_ref / std::max(n_ref, 1e-30)), 1e-4) << name << ": vs PyTorch";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Zoo, ZooPasses,
    ::testing::Values(
        ZooCase{"resnet_tiny",
                {{"conv_bn_folding", 12}, {"conv_fusion", 9}},
                {{"BatchNormalization", 0}, {"Relu", 0}}},
        ZooCase{"mobilenetv3_tiny", {{"conv_bn_folding", 34}}, {{"BatchNormalization", 0}}},
        ZooCase{"efficientnet_tiny", {{"conv_bn_folding", 31}}, {{"BatchNormalization", 0}}},
        ZooCase{"unet_tiny", {{"conv_bn_folding", 14}}, {{"BatchNormalization", 0}}},
        ZooCase{"bert_tiny",
                {{"gelu_fusion", 2},
                 {"attention_fusion", 2},
                 {"gemm_fusion", 12},
                 {"skip_layernorm_fusion", 4}},
                {{"Attention", 2}, {"Softmax", 0}, {"Erf", 0}, {"SkipLayerNormalization", 4}}},
        ZooCase{"vit_tiny",
                {{"gelu_fusion", 2}, {"attention_fusion", 2}, {"skip_layernorm_fusion", 4}},
                {{"Attention", 2}, {"Softmax", 0}, {"Erf", 0}, {"SkipLayerNormalization", 4}}},
        ZooCase{"gpt_tiny",
                {{"gelu_fusion", 2},
                 {"attention_fusion", 2},
                 {"gemm_fusion", 2},
                 {"skip_layernorm_fusion", 4}},
                {{"Attention", 2},
                 {"Softmax", 0},
                 {"Tanh", 0},
                 {"Where", 0},
                 {"Gelu", 0},
                 {"SkipLayerNormalization", 4}}}),
    [](const auto& info) { return info.param.model; });

// What shape inference left on a graph, node by node in topological order: op, names, and each
// output's dtype and shape.
std::vector<std::string> Describe(const Graph& g) {
  std::vector<std::string> out;
  auto order = g.TopologicalOrder();
  EXPECT_TRUE(order.ok());
  if (!order.ok()) return out;
  for (const Node* n : *order) {
    std::string line = n->op_type() + " " + n->name() + " (";
    for (const Value* v : n->inputs()) line += (v ? v->name() : std::string("-")) + ",";
    line += ") ->";
    for (const Value* v : n->outputs()) {
      if (!v) continue;
      line += " " + v->name() + ":" + std::string(ToString(v->dtype())) +
              (v->has_shape() ? ToString(v->shape()) : std::string("?"));
    }
    out.push_back(std::move(line));
  }
  return out;
}

// The pass manager infers shapes incrementally (only what each pass touched, InferNewShapes);
// on every zoo model, with and without the NHWC layout pass, the optimized graph and every
// inferred shape are exactly what re-inferring the whole graph after each pass gives.
class ZooIncrementalShapes : public ::testing::TestWithParam<std::string> {};

TEST_P(ZooIncrementalShapes, MatchFullReinferenceAfterEveryPass) {
  std::filesystem::path model = ZooDir() / GetParam() / "model.onnx";
  for (const char* layout : {"", "NHWC"}) {
    SCOPED_TRACE(std::string("conv_layout '") + layout + "'");
    auto incremental = ImportOnnxFile(model.string());
    auto full = ImportOnnxFile(model.string());
    ASSERT_TRUE(incremental.ok() && full.ok());
    PassOptions options = TestOptions();
    options.conv_layout = layout;
    auto r1 = RunDefaultPasses(**incremental, options);
    options.full_shape_inference = true;
    auto r2 = RunDefaultPasses(**full, options);
    ASSERT_TRUE(r1.ok()) << r1.status().ToString();
    ASSERT_TRUE(r2.ok()) << r2.status().ToString();
    EXPECT_EQ(r1->ToString(), r2->ToString());
    std::vector<std::string> a = Describe(**incremental), b = Describe(**full);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "node " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Zoo, ZooIncrementalShapes,
                         ::testing::Values("resnet_tiny", "mobilenetv3_tiny", "efficientnet_tiny",
                                           "squeezenet_tiny", "unet_tiny", "bert_tiny", "vit_tiny",
                                           "gpt_tiny"));

}  // namespace
}  // namespace kiln::passes
