// A BatchNormalization after a Linear (LeViT's Linear -> flatten -> BatchNorm1d -> reshape back;
// BatchNorm1d after a Linear in MLP heads) folds into the product's weight columns and bias; the
// activation after it then joins the product. Compared with the unfolded graph on random inputs.
#include <gtest/gtest.h>

#include "pass_test_util.h"

namespace kiln::passes {
namespace {

using namespace testing;

Value* BatchNorm(Graph& g, Value* x, int64_t c, uint32_t seed) {
  Value* scale = Const(g, RandomTensor(DataType::kFloat32, {c}, seed, 0.5, 1.5));
  Value* bias = Const(g, RandomTensor(DataType::kFloat32, {c}, seed + 1));
  Value* mean = Const(g, RandomTensor(DataType::kFloat32, {c}, seed + 2));
  Value* var = Const(g, RandomTensor(DataType::kFloat32, {c}, seed + 3, 0.5, 2.0));
  return Op(g, "BatchNormalization", {x, scale, bias, mean, var},
            Attrs(std::pair{"epsilon", 1e-5f}));
}

enum class Form { kTokens, kTokensWithBias, kRows, kViewMovesTheChannels };

void LinearBn(Graph& g, Form form) {
  const bool tokens = form != Form::kRows;
  Value* x = tokens ? g.AddInput("x", DataType::kFloat32, {2, 5, 8})
                    : g.AddInput("x", DataType::kFloat32, {4, 8});
  Value* y = Op(g, "MatMul", {x, Const(g, RandomTensor(DataType::kFloat32, {8, 6}, 1))});
  if (form == Form::kTokensWithBias) {
    y = Op(g, "Add", {y, Const(g, RandomTensor(DataType::kFloat32, {6}, 2))});
  }
  if (form == Form::kRows) {
    g.MarkOutput(Op(g, "HardSwish", {BatchNorm(g, y, 6, 10)}));
    return;
  }
  if (form == Form::kViewMovesTheChannels) {
    // [2, 5, 6] -> [12, 5]: the BatchNorm's channels are not the product's columns.
    Value* flat = Op(g, "Reshape", {y, Const(g, Ints({12, 5}))});
    g.MarkOutput(Op(g, "Relu", {BatchNorm(g, flat, 5, 10)}));
    return;
  }
  Value* flat = Op(g, "Flatten", {y}, Attrs(std::pair{"axis", int64_t{2}}));
  Value* bn = BatchNorm(g, flat, 6, 10);
  g.MarkOutput(Op(g, "HardSwish", {Op(g, "Reshape", {bn, Const(g, Ints({2, 5, 6}))})}));
}

TEST(LinearBatchNorm, FoldsIntoTheProductAndTheActivationJoinsIt) {
  for (Form form : {Form::kTokens, Form::kTokensWithBias, Form::kRows}) {
    SCOPED_TRACE(static_cast<int>(form));
    Graph before, after;
    LinearBn(before, form);
    LinearBn(after, form);
    auto r = RunDefaultPasses(after, TestOptions());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(CountOps(after, "BatchNormalization"), 0);
    // The product with the folded bias and the Hardswish, the views merged away.
    EXPECT_EQ(after.num_nodes(), 1u);
    ASSERT_EQ(CountOps(after, "FusedMatMul"), 1);
    for (Node* n : after.nodes()) {
      EXPECT_EQ(n->attrs().GetString("activation", ""), "hardswish");
      EXPECT_EQ(n->num_inputs(), 3u);
    }
    ExpectSameOutputs(before, after);
  }
}

TEST(LinearBatchNorm, ChannelsThatAreNotTheColumnsStay) {
  Graph before, after;
  LinearBn(before, Form::kViewMovesTheChannels);
  LinearBn(after, Form::kViewMovesTheChannels);
  auto r = RunDefaultPasses(after, TestOptions());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(CountOps(after, "BatchNormalization"), 1);
  ExpectSameOutputs(before, after);
}

// A zero Pad of the spatial axes before a Conv (TensorFlow-ported CNNs pad explicitly: HF's
// MobileNetV2, "same" padding) goes into the Conv's pads, asymmetric ones too; a Pad that is not
// zeros, pads the channels or reflects stays.
enum class PadForm { kSymmetric, kAsymmetricWithAxes, kReflect, kChannels, kNonZero };

void PadConv(Graph& g, PadForm form) {
  Value* x = g.AddInput("x", DataType::kFloat32, {2, 3, 9, 9});
  std::vector<Value*> ins = {x};
  AttributeMap attrs;
  switch (form) {
    case PadForm::kSymmetric:
      ins.push_back(Const(g, Ints({0, 0, 1, 1, 0, 0, 1, 1})));
      break;
    case PadForm::kAsymmetricWithAxes:  // stride-2 "same": nothing before, one after
      ins.push_back(Const(g, Ints({0, 0, 1, 1})));
      ins.push_back(Const(g, Scalar(0.f)));
      ins.push_back(Const(g, Ints({2, -1})));
      break;
    case PadForm::kReflect:
      ins.push_back(Const(g, Ints({0, 0, 1, 1, 0, 0, 1, 1})));
      attrs.Set("mode", std::string("reflect"));
      break;
    case PadForm::kChannels:
      ins.push_back(Const(g, Ints({0, 1, 0, 0, 0, 0, 0, 0})));
      break;
    case PadForm::kNonZero:
      ins.push_back(Const(g, Ints({0, 0, 1, 1, 0, 0, 1, 1})));
      ins.push_back(Const(g, Scalar(0.5f)));
      break;
  }
  Value* padded = g.AddValue("padded");
  g.AddNode("Pad", "pad", ins, {padded}, attrs);
  const int64_t c = form == PadForm::kChannels ? 4 : 3;
  Value* w = Const(g, RandomTensor(DataType::kFloat32, {5, c, 3, 3}, 3));
  AttributeMap conv;
  conv.Set("strides", std::vector<int64_t>{2, 2});
  conv.Set("pads", std::vector<int64_t>{0, 1, 0, 0});
  g.MarkOutput(Op(g, "Conv", {padded, w}, conv));
}

TEST(PadConvFolding, ZeroSpatialPadsGoIntoTheConv) {
  for (PadForm form : {PadForm::kSymmetric, PadForm::kAsymmetricWithAxes, PadForm::kReflect,
                       PadForm::kChannels, PadForm::kNonZero}) {
    SCOPED_TRACE(static_cast<int>(form));
    Graph before, after;
    PadConv(before, form);
    PadConv(after, form);
    std::vector<std::unique_ptr<Pass>> v;
    v.push_back(MakeConvFusionPass());
    v.push_back(MakeDeadNodeEliminationPass());
    RunPasses(after, std::move(v));
    const bool folds = form == PadForm::kSymmetric || form == PadForm::kAsymmetricWithAxes;
    EXPECT_EQ(CountOps(after, "Pad"), folds ? 0 : 1);
    if (form == PadForm::kAsymmetricWithAxes) {
      for (Node* n : after.nodes()) {
        if (n->op_type() == "Conv") {
          EXPECT_EQ(n->attrs().GetInts("pads"), (std::vector<int64_t>{0, 1, 1, 1}));
        }
      }
    }
    ExpectSameOutputs(before, after);
  }
}

// HF ConvNeXt's channels-first LayerNorm (statistics over axis 1 of NCHW, gamma and beta
// [C, 1, 1]) between two convolutions: one LayerNormalization over the last axis between
// Transposes; under the channels-last layout (CUDA at FP16) those meet the layout's and cancel.
void ChannelsFirstLn(Graph& g) {
  Value* x = g.AddInput("x", DataType::kFloat32, {2, 3, 6, 6});
  Value* y = Op(g, "Conv", {x, Const(g, RandomTensor(DataType::kFloat32, {8, 3, 3, 3}, 1))},
                Attrs(std::pair{"pads", std::vector<int64_t>{1, 1, 1, 1}}));
  auto mean = [&](Value* v) {
    return Op(g, "ReduceMean", {v, Const(g, Ints({1}))}, Attrs(std::pair{"keepdims", int64_t{1}}));
  };
  Value* d = Op(g, "Sub", {y, mean(y)});
  Value* var = mean(Op(g, "Pow", {d, Const(g, Scalar(2.f))}));
  Value* n = Op(g, "Div", {d, Op(g, "Sqrt", {Op(g, "Add", {var, Const(g, Scalar(1e-6f))})})});
  Value* gamma = Const(g, RandomTensor(DataType::kFloat32, {8, 1, 1}, 2, 0.5, 1.5));
  Value* beta = Const(g, RandomTensor(DataType::kFloat32, {8, 1, 1}, 3));
  Value* ln = Op(g, "Add", {Op(g, "Mul", {n, gamma}), beta});
  g.MarkOutput(Op(g, "Conv", {ln, Const(g, RandomTensor(DataType::kFloat32, {4, 8, 1, 1}, 4))}));
}

TEST(ChannelsFirstLayerNorm, BecomesOneNormalizationAndItsTransposesCancelChannelsLast) {
  for (bool nhwc : {false, true}) {
    SCOPED_TRACE(nhwc);
    Graph before, after;
    ChannelsFirstLn(before);
    ChannelsFirstLn(after);
    auto r = RunDefaultPasses(after, nhwc ? NhwcOptions() : TestOptions());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(CountOps(after, "LayerNormalization"), 1);
    EXPECT_EQ(CountOps(after, "ReduceMean"), 0);
    // Channels-first: the two around the normalization. Channels-last: the layout's two at the
    // graph's input and output, nothing around the normalization.
    EXPECT_EQ(CountOps(after, "Transpose"), 2);
    ExpectSameOutputs(before, after);
  }
}

}  // namespace
}  // namespace kiln::passes
