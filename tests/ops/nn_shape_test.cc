// Shape rules of the nn, matmul and fused ops over symbolic and static dims.
#include <gtest/gtest.h>

#include "kiln/ir/graph.h"
#include "kiln/ops/op_schema.h"

namespace kiln {
namespace {

// Builds a one-node graph whose inputs are graph inputs with the given shapes (or constants),
// runs shape inference and returns the output shape.
struct In {
  In(Shape s, DataType t = DataType::kFloat32, std::optional<Tensor> c = std::nullopt)
      : shape(std::move(s)), dtype(t), constant(std::move(c)) {}
  Shape shape;
  DataType dtype;
  std::optional<Tensor> constant;
};

StatusOr<Shape> Infer(const std::string& op, std::vector<In> ins, AttributeMap attrs = {},
                      size_t outputs = 1) {
  Graph g;
  std::vector<Value*> values;
  for (size_t i = 0; i < ins.size(); ++i) {
    std::string name = fmt::format("i{}", i);
    if (ins[i].constant) {
      values.push_back(g.AddConstant(name, *ins[i].constant));
    } else if (ins[i].dtype == DataType::kUndefined) {
      values.push_back(nullptr);
    } else {
      values.push_back(g.AddInput(name, ins[i].dtype, ins[i].shape));
    }
  }
  std::vector<Value*> outs;
  for (size_t i = 0; i < outputs; ++i) outs.push_back(g.AddValue(fmt::format("o{}", i)));
  g.AddNode(op, "n", values, outs, std::move(attrs));
  KILN_RETURN_IF_ERROR(InferShapes(g).status());
  return outs[0]->shape();
}

const Dim kBatch = Dim::Symbol("batch");

Tensor Weights(std::vector<int64_t> dims) { return Tensor(DataType::kFloat32, std::move(dims)); }

AttributeMap Attrs(std::initializer_list<std::pair<std::string, Attribute>> kv) {
  AttributeMap a;
  for (auto& [k, v] : kv) a.Set(k, v);
  return a;
}

TEST(NnShapes, ConvSymbolicBatchPadsStridesDilations) {
  auto y = Infer(
      "Conv", {{{kBatch, 3, 224, 224}}, {{}, {}, Weights({64, 3, 7, 7})}},
      Attrs({{"strides", std::vector<int64_t>{2, 2}}, {"pads", std::vector<int64_t>{3, 3, 3, 3}}}));
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  EXPECT_EQ(*y, (Shape{kBatch, 64, 112, 112}));
  // Dilation 2, asymmetric pads: (13 + 1 + 0 - 5) / 2 + 1 = 5; (11 + 2 + 1 - 2) / 3 + 1 = 5.
  y = Infer("Conv", {{{1, 4, 13, 11}}, {{}, {}, Weights({6, 4, 3, 2})}},
            Attrs({{"strides", std::vector<int64_t>{2, 3}},
                   {"dilations", std::vector<int64_t>{2, 1}},
                   {"pads", std::vector<int64_t>{1, 2, 0, 1}}}));
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(*y, (Shape{1, 6, 5, 5}));
}

TEST(NnShapes, ConvAutoPadAndSymbolicSpatial) {
  Dim h = Dim::Symbol("h");
  for (auto [pad, expect] : std::vector<std::pair<std::string, int64_t>>{
           {"SAME_UPPER", 5}, {"SAME_LOWER", 5}, {"VALID", 4}}) {
    auto y = Infer("Conv", {{{1, 3, 9, 9}}, {{}, {}, Weights({4, 3, 3, 3})}},
                   Attrs({{"auto_pad", pad}, {"strides", std::vector<int64_t>{2, 2}}}));
    ASSERT_TRUE(y.ok()) << pad;
    EXPECT_EQ((*y)[2], Dim(expect)) << pad;
  }
  auto y = Infer("Conv", {{{kBatch, 3, h, 8}}, {{}, {}, Weights({4, 3, 3, 3})}},
                 Attrs({{"auto_pad", std::string("SAME_UPPER")}}));
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(*y, (Shape{kBatch, 4, h, 8}));
}

TEST(NnShapes, ConvGroupsAndErrors) {
  auto y = Infer("Conv", {{{1, 32, 10, 10}}, {{}, {}, Weights({32, 1, 3, 3})}},
                 Attrs({{"group", int64_t{32}}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}}));
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(*y, (Shape{1, 32, 10, 10}));
  auto bad = Infer("Conv", {{{1, 5, 10, 10}}, {{}, {}, Weights({8, 2, 3, 3})}},
                   Attrs({{"group", int64_t{2}}}));
  EXPECT_EQ(bad.status().code(), ErrorCode::kShapeMismatch);
  bad = Infer("Conv", {{{1, 3, 10, 10}}, {{}, {}, Weights({8, 3, 3, 3})}},
              Attrs({{"auto_pad", std::string("SAME")}}));
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidAttribute);
  bad = Infer("Conv", {{{1, 3, 2, 2}}, {{}, {}, Weights({8, 3, 3, 3})}});
  EXPECT_EQ(bad.status().code(), ErrorCode::kShapeMismatch);
}

TEST(NnShapes, ConvTransposeOutputShapeAndPadding) {
  auto y = Infer("ConvTranspose", {{{kBatch, 3, 5, 4}}, {{}, {}, Weights({3, 2, 3, 3})}},
                 Attrs({{"strides", std::vector<int64_t>{2, 2}},
                        {"pads", std::vector<int64_t>{1, 1, 1, 1}},
                        {"output_padding", std::vector<int64_t>{1, 0}}}));
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  EXPECT_EQ(*y, (Shape{kBatch, 2, 10, 7}));
  y = Infer("ConvTranspose", {{{1, 4, 4, 4}}, {{}, {}, Weights({4, 3, 3, 3})}},
            Attrs({{"strides", std::vector<int64_t>{2, 2}},
                   {"group", int64_t{2}},
                   {"output_shape", std::vector<int64_t>{8, 9}}}));
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(*y, (Shape{1, 6, 8, 9}));
  y = Infer(
      "ConvTranspose", {{{1, 2, 5, 3}}, {{}, {}, Weights({2, 2, 3, 4})}},
      Attrs({{"strides", std::vector<int64_t>{2, 3}}, {"auto_pad", std::string("SAME_UPPER")}}));
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(*y, (Shape{1, 2, 10, 9}));
  // output_shape may exceed the full extent (ONNX pads the end with zeros).
  y = Infer("ConvTranspose", {{{1, 2, 4, 4}}, {{}, {}, Weights({2, 3, 3, 3})}},
            Attrs({{"strides", std::vector<int64_t>{2, 2}},
                   {"output_shape", std::vector<int64_t>{12, 9}}}));
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(*y, (Shape{1, 3, 12, 9}));
}

TEST(NnShapes, PoolsCeilModeAndIndices) {
  auto k3s2 = Attrs({{"kernel_shape", std::vector<int64_t>{3, 3}},
                     {"strides", std::vector<int64_t>{2, 2}},
                     {"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  auto y = Infer("MaxPool", {{{kBatch, 64, 112, 112}}}, k3s2);
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(*y, (Shape{kBatch, 64, 56, 56}));
  AttributeMap ceil = Attrs({{"kernel_shape", std::vector<int64_t>{3, 3}},
                             {"strides", std::vector<int64_t>{2, 2}},
                             {"ceil_mode", int64_t{1}}});
  y = Infer("AveragePool", {{{1, 1, 8, 9}}}, ceil);
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(*y, (Shape{1, 1, 4, 4}));
  ceil.Set("ceil_mode", int64_t{0});
  EXPECT_EQ(*Infer("AveragePool", {{{1, 1, 8, 9}}}, ceil), (Shape{1, 1, 3, 4}));
  // The last window may not start in the end padding: 8 + 1 pad, k 2, s 2 -> 4, not 5.
  y = Infer("MaxPool", {{{1, 1, 8, 8}}},
            Attrs({{"kernel_shape", std::vector<int64_t>{2, 2}},
                   {"strides", std::vector<int64_t>{2, 2}},
                   {"ceil_mode", int64_t{1}},
                   {"pads", std::vector<int64_t>{0, 0, 1, 1}}}));
  EXPECT_EQ(*y, (Shape{1, 1, 4, 4}));
  // MaxPool's Indices output has the values' shape (CPU only; pads 1: (8 + 2 - 3) / 2 + 1 = 4);
  // storage_order is 0 or 1.
  EXPECT_EQ(*Infer("MaxPool", {{{1, 1, 8, 8}}}, k3s2, 2), (Shape{1, 1, 4, 4}));
  AttributeMap order = k3s2;
  order.Set("storage_order", int64_t{2});
  auto bad = Infer("MaxPool", {{{1, 1, 8, 8}}}, order, 2);
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidAttribute);
  bad = Infer("MaxPool", {{{1, 1, 8, 8}}});
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidAttribute);
  EXPECT_EQ(*Infer("GlobalAveragePool", {{{kBatch, 2048, 7, 7}}}), (Shape{kBatch, 2048, 1, 1}));
  EXPECT_EQ(*Infer("GlobalMaxPool", {{{2, 5, 3}}}), (Shape{2, 5, 1}));
}

TEST(NnShapes, BatchNormalization) {
  std::vector<In> ins = {{{kBatch, 8, 4, 4}}, {{8}}, {{8}}, {{8}}, {{8}}};
  EXPECT_EQ(*Infer("BatchNormalization", ins), (Shape{kBatch, 8, 4, 4}));
  // Training mode (batch statistics; CPU only) may give the running mean and variance.
  EXPECT_EQ(*Infer("BatchNormalization", ins, Attrs({{"training_mode", int64_t{1}}}), 3),
            (Shape{kBatch, 8, 4, 4}));
  auto bad = Infer("BatchNormalization", ins, {}, 3);  // running outputs in inference mode
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidModel);
  bad = Infer("BatchNormalization", ins, Attrs({{"training_mode", int64_t{2}}}));
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidAttribute);
  ins[2].shape = {7};
  EXPECT_EQ(Infer("BatchNormalization", ins).status().code(), ErrorCode::kShapeMismatch);
}

TEST(NnShapes, ResizeScalesVersusSizes) {
  In none{{}, DataType::kUndefined};
  In scales{
      {}, DataType::kFloat32, Tensor::FromVector<float>(DataType::kFloat32, {4}, {1, 1, 2, 0.5f})};
  auto y = Infer("Resize", {{{kBatch, 3, 10, 9}}, none, scales});
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  EXPECT_EQ(*y, (Shape{kBatch, 3, 20, 4}));
  // Symbolic spatial dims with integral scales stay polynomial.
  Dim h = Dim::Symbol("h");
  EXPECT_EQ(*Infer("Resize", {{{1, 3, h, 9}}, none, scales}), (Shape{1, 3, h * 2, 4}));
  In sizes{{}, DataType::kInt64, Tensor::FromVector<int64_t>(DataType::kInt64, {2}, {7, 5})};
  y = Infer("Resize", {{{kBatch, 3, 10, 9}}, none, none, sizes},
            Attrs({{"axes", std::vector<int64_t>{2, -1}}}));
  ASSERT_TRUE(y.ok()) << y.status().ToString();
  EXPECT_EQ(*y, (Shape{kBatch, 3, 7, 5}));
  // not_larger keeps the aspect ratio: scale min(7/10, 5/9) = 0.555 -> 6 x 5.
  y = Infer("Resize", {{{1, 3, 10, 9}}, none, none, sizes},
            Attrs({{"axes", std::vector<int64_t>{2, 3}},
                   {"keep_aspect_ratio_policy", std::string("not_larger")}}));
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(*y, (Shape{1, 3, 6, 5}));
  EXPECT_EQ(Infer("Resize", {{{1, 3, 10, 9}}, none, scales, sizes}).status().code(),
            ErrorCode::kInvalidModel);
  EXPECT_EQ(Infer("Resize", {{{1, 3, 10, 9}}, none, {{4}, DataType::kFloat32}}).status().code(),
            ErrorCode::kDataDependentShape);
  EXPECT_EQ(Infer("Resize", {{{1, 3, 10, 9}}, none, scales}, Attrs({{"mode", std::string("area")}}))
                .status()
                .code(),
            ErrorCode::kInvalidAttribute);
}

TEST(NnShapes, MatMulBroadcastingAnd1D) {
  Dim seq = Dim::Symbol("seq");
  EXPECT_EQ(*Infer("MatMul", {{{kBatch, seq, 768}}, {{768, 3072}}}), (Shape{kBatch, seq, 3072}));
  EXPECT_EQ(*Infer("MatMul", {{{2, 1, 5, 7}}, {{3, 7, 4}}}), (Shape{2, 3, 5, 4}));
  EXPECT_EQ(*Infer("MatMul", {{{7}}, {{2, 7, 4}}}), (Shape{2, 4}));
  EXPECT_EQ(*Infer("MatMul", {{{3, 5, 7}}, {{7}}}), (Shape{3, 5}));
  EXPECT_EQ(*Infer("MatMul", {{{7}}, {{7}}}), (Shape{}));
  EXPECT_EQ(Infer("MatMul", {{{3, 5}}, {{4, 2}}}).status().code(), ErrorCode::kShapeMismatch);
  EXPECT_EQ(Infer("MatMul", {{{2, 3, 5}}, {{4, 5, 2}}}).status().code(), ErrorCode::kShapeMismatch);
}

TEST(NnShapes, GemmTransposesAndC) {
  auto t = Attrs({{"transA", int64_t{1}}, {"transB", int64_t{1}}});
  EXPECT_EQ(*Infer("Gemm", {{{kBatch, 9}}, {{16, kBatch}}}, t), (Shape{9, 16}));
  EXPECT_EQ(
      *Infer("Gemm", {{{kBatch, 512}}, {{1000, 512}}, {{1000}}}, Attrs({{"transB", int64_t{1}}})),
      (Shape{kBatch, 1000}));
  EXPECT_EQ(Infer("Gemm", {{{4, 5}}, {{5, 6}}, {{3, 6}}}).status().code(),
            ErrorCode::kShapeMismatch);
  EXPECT_EQ(Infer("Gemm", {{{4, 5}}, {{6, 6}}}).status().code(), ErrorCode::kShapeMismatch);
}

TEST(NnShapes, FusedOps) {
  auto conv =
      Attrs({{"pads", std::vector<int64_t>{1, 1, 1, 1}}, {"activation", std::string("relu")}});
  In w{{}, DataType::kFloat32, Weights({8, 4, 3, 3})};
  EXPECT_EQ(*Infer("FusedConv", {{{kBatch, 4, 6, 6}}, w, {{8}}, {{kBatch, 8, 6, 6}}}, conv),
            (Shape{kBatch, 8, 6, 6}));
  EXPECT_EQ(Infer("FusedConv", {{{1, 4, 6, 6}}, w, {{8}}, {{1, 8, 5, 6}}}, conv).status().code(),
            ErrorCode::kShapeMismatch);
  conv.Set("activation", std::string("no_such_activation"));  // ("swish" is one since session 16)
  EXPECT_EQ(Infer("FusedConv", {{{1, 4, 6, 6}}, w}, conv).status().code(),
            ErrorCode::kInvalidAttribute);
  EXPECT_EQ(*Infer("FusedGemm", {{{kBatch, 768}}, {{3072, 768}}, {{3072}}},
                   Attrs({{"transB", int64_t{1}}, {"activation", std::string("gelu")}})),
            (Shape{kBatch, 3072}));
  EXPECT_EQ(*Infer("FusedMatMul", {{{kBatch, 128, 768}}, {{3072, 768}}, {{3072}}},
                   Attrs({{"transB", int64_t{1}}, {"activation", std::string("gelu")}})),
            (Shape{kBatch, 128, 3072}));
  EXPECT_EQ(Infer("FusedMatMul", {{{2, 4, 6}}, {{6, 5}}, {{4}}}).status().code(),
            ErrorCode::kShapeMismatch);
  AttributeMap clip = Attrs(
      {{"activation", std::string("clip")}, {"activation_min", 2.f}, {"activation_max", 1.f}});
  EXPECT_EQ(Infer("FusedMatMul", {{{4, 6}}, {{6, 5}}}, clip).status().code(),
            ErrorCode::kInvalidAttribute);
}

// FP8 edges (ops/quant_edge.h): an E4M3 A stands for B's type where the node carries its FP8
// input amax, and the FP8 output amax makes Y E4M3; nothing else lets a product take E4M3.
StatusOr<DataType> InferType(const std::string& op, std::vector<In> ins, AttributeMap attrs) {
  Graph g;
  std::vector<Value*> values;
  for (size_t i = 0; i < ins.size(); ++i) {
    values.push_back(g.AddInput(fmt::format("i{}", i), ins[i].dtype, ins[i].shape));
  }
  Value* y = g.AddValue("y");
  g.AddNode(op, "n", values, {y}, std::move(attrs));
  KILN_RETURN_IF_ERROR(InferShapes(g).status());
  return y->dtype();
}

TEST(NnShapeTest, Fp8EdgeTypes) {
  const DataType f8 = DataType::kFloat8E4M3FN, f16 = DataType::kFloat16, bf16 = DataType::kBFloat16;
  const AttributeMap in = Attrs({{"kiln_fp8_input_amax", 3.f}});
  const AttributeMap out = Attrs({{"kiln_fp8_input_amax", 3.f}, {"kiln_fp8_output_amax", 5.f}});
  // The consumer: E4M3 A, the product and Y in B's type (and the bias's, C's).
  EXPECT_EQ(*InferType("MatMul", {{{2, 16, 64}, f8}, {{64, 32}, f16}}, in), f16);
  EXPECT_EQ(*InferType("FusedMatMul", {{{2, 16, 64}, f8}, {{64, 32}, bf16}, {{32}, bf16}}, in),
            bf16);
  EXPECT_EQ(*InferType("Gemm", {{{16, 64}, f8}, {{64, 32}, f16}, {{32}, f16}}, in), f16);
  // The producer: float A, E4M3 Y.
  EXPECT_EQ(*InferType("FusedMatMul", {{{2, 16, 64}, f16}, {{64, 32}, f16}, {{32}, f16}}, out), f8);
  EXPECT_EQ(*InferType("FusedGemm", {{{16, 64}, bf16}, {{64, 32}, bf16}}, out), f8);
  // Attention as a producer (its reader, the output projection, is an FP8 product).
  const AttributeMap attention = Attrs(
      {{"layout", std::string("bsd")}, {"num_heads", int64_t{2}}, {"kiln_fp8_output_amax", 5.f}});
  const In qkv({2, 16, 64}, f16);
  EXPECT_EQ(*InferType("Attention", {qkv, qkv, qkv}, attention), f8);
  // Refused: an E4M3 A without the amax, an E4M3 B, a bias of another type than B.
  EXPECT_EQ(InferType("MatMul", {{{16, 64}, f8}, {{64, 32}, f16}}, {}).status().code(),
            ErrorCode::kTypeMismatch);
  EXPECT_EQ(InferType("MatMul", {{{16, 64}, f16}, {{64, 32}, f8}}, in).status().code(),
            ErrorCode::kTypeMismatch);
  EXPECT_EQ(
      InferType("FusedMatMul", {{{16, 64}, f8}, {{64, 32}, f16}, {{32}, bf16}}, in).status().code(),
      ErrorCode::kShapeMismatch);
}

// INT8 edges (ops/quant_edge.h): the consumer, marked kiln_int8_input_edge, computes in B's type
// from an int8 A; the producer with kiln_int8_output_scale writes int8 Y. An unmarked int8 A
// stays refused (ONNX's Gemm and MatMul take none).
TEST(NnShapeTest, Int8EdgeTypes) {
  const DataType i8 = DataType::kInt8, f16 = DataType::kFloat16, f32 = DataType::kFloat32;
  const AttributeMap in =
      Attrs({{"kiln_int8_input_amax", 3.f}, {"kiln_int8_input_edge", int64_t{1}}});
  const AttributeMap out =
      Attrs({{"kiln_int8_input_amax", 3.f}, {"kiln_int8_output_scale", 0.05f}});
  EXPECT_EQ(*InferType("MatMul", {{{2, 16, 64}, i8}, {{64, 32}, f16}}, in), f16);
  EXPECT_EQ(*InferType("FusedGemm", {{{16, 64}, i8}, {{64, 32}, f32}, {{32}, f32}}, in), f32);
  EXPECT_EQ(*InferType("FusedMatMul", {{{2, 16, 64}, f16}, {{64, 32}, f16}, {{32}, f16}}, out), i8);
  EXPECT_EQ(*InferType("Gemm", {{{16, 64}, f32}, {{64, 32}, f32}}, out), i8);
  const AttributeMap amax_only = Attrs({{"kiln_int8_input_amax", 3.f}});
  EXPECT_EQ(InferType("MatMul", {{{16, 64}, i8}, {{64, 32}, f16}}, amax_only).status().code(),
            ErrorCode::kTypeMismatch);
  EXPECT_EQ(InferType("MatMul", {{{16, 64}, f16}, {{64, 32}, i8}}, in).status().code(),
            ErrorCode::kTypeMismatch);
  // Conv and FusedConv (NCHW here; conv_int8.cc's are NHWC): an int8 X computes in W's type, the
  // bias and a residual Z with it; an int8 Y for the output scale.
  EXPECT_EQ(*InferType("Conv", {{{1, 16, 8, 8}, i8}, {{32, 16, 1, 1}, f16}, {{32}, f16}}, in), f16);
  EXPECT_EQ(
      *InferType("FusedConv",
                 {{{1, 16, 8, 8}, i8}, {{32, 16, 1, 1}, f32}, {{32}, f32}, {{1, 32, 8, 8}, f32}},
                 in),
      f32);
  EXPECT_EQ(*InferType("Conv", {{{1, 16, 8, 8}, f16}, {{32, 16, 1, 1}, f16}}, out), i8);
  EXPECT_EQ(
      InferType("Conv", {{{1, 16, 8, 8}, i8}, {{32, 16, 1, 1}, f16}}, amax_only).status().code(),
      ErrorCode::kTypeMismatch);
  EXPECT_EQ(InferType("Conv", {{{1, 16, 8, 8}, i8}, {{32, 16, 1, 1}, f16}, {{32}, f32}}, in)
                .status()
                .code(),
            ErrorCode::kTypeMismatch);  // a bias not in W's type
  EXPECT_EQ(
      InferType("FusedConv",
                {{{1, 16, 8, 8}, i8}, {{32, 16, 1, 1}, f16}, {{32}, f16}, {{1, 32, 8, 8}, f32}}, in)
          .status()
          .code(),
      ErrorCode::kShapeMismatch);  // a residual not in W's type (FusedConv's Z rule)
}

}  // namespace
}  // namespace kiln
