// Explicit quantization (QDQ models): qdq_fusion makes Conv/Gemm/MatMul between the model's
// Q/DQ one INT8 layer with the model's scales, the CPU INT8 kernels run it, and the engine agrees
// with the literal Q/DQ execution of the same graph (--disable-pass qdq_fusion) to float rounding;
// what cannot be fused stays float between its Q/DQ, and bad quantization parameters are refused
// with KILN-E2016.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <span>
#include <tuple>

#include "kiln/builder/builder.h"
#include "kiln/onnx/onnx_import.h"
#include "kiln/onnx/onnx_internal.h"
#include "kiln/ops/int8_layer.h"
#include "kiln/ops/op_schema.h"
#include "tests/precision/test_util.h"

namespace kiln {
namespace {

using testing::BuildAndRun;
using testing::RelL2;

Tensor Scalar(DataType t, double v) {
  Tensor s(t, {});
  StoreFromDouble(s.view(), 0, v);
  return s;
}

// Deterministic integers in [lo, hi] as a tensor of type t.
Tensor RandomInts(DataType t, std::vector<int64_t> dims, int lo, int hi, uint64_t seed) {
  Tensor x(t, std::move(dims));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  for (int64_t i = 0; i < x.num_elements(); ++i) StoreFromDouble(x.view(), i, d(rng));
  return x;
}

Tensor RandomFloats(std::vector<int64_t> dims, uint64_t seed, float scale = 2.f) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return Tensor::FromVector<float>(DataType::kFloat32, std::move(dims),
                                   testing::Random(n, seed, scale));
}

Value* Add(Graph& g, const std::string& op, std::vector<Value*> in, AttributeMap attrs = {}) {
  Value* out = g.AddValue(g.UniqueName(op + "_out"));
  g.AddNode(op, g.UniqueName(op), std::move(in), {out}, std::move(attrs));
  return out;
}
Value* Const(Graph& g, Tensor t) { return g.AddConstant(g.UniqueName("c"), std::move(t)); }

// How a test layer is quantized.
struct Qdq {
  DataType act = DataType::kInt8;  // the activation's quantized type
  double scale = 0.015;            // saturates part of inputs in [-2, 2]
  int zero_point = 9;
  bool per_channel = true;
  int weight_zero_point = 0;
};

// DQ(Q(x)) with the activation's parameters.
Value* QdqActivation(Graph& g, Value* x, const Qdq& q) {
  Value* s = Const(g, Scalar(DataType::kFloat32, q.scale));
  Value* z = Const(g, Scalar(q.act, q.zero_point));
  return Add(g, "DequantizeLinear", {Add(g, "QuantizeLinear", {x, s, z}), s, z});
}

// DQ of an int8 constant weight of `dims` with scales along `axis` (or one scale).
Value* QdqWeight(Graph& g, std::vector<int64_t> dims, int64_t axis, const Qdq& q, uint64_t seed,
                 std::vector<float>* scales_out = nullptr) {
  const int64_t channels = dims[static_cast<size_t>(axis)];
  std::vector<float> scales;
  for (int64_t c = 0; c < (q.per_channel ? channels : 1); ++c) {
    scales.push_back(0.002f + 0.0005f * static_cast<float>(c));
  }
  if (scales_out) *scales_out = scales;
  const int64_t n = static_cast<int64_t>(scales.size());
  Value* w = Const(g, RandomInts(DataType::kInt8, dims, -127, 127, seed));
  Value* s = Const(g, q.per_channel ? Tensor::FromVector<float>(DataType::kFloat32, {n}, scales)
                                    : Scalar(DataType::kFloat32, scales[0]));
  Tensor zeros(DataType::kInt8, q.per_channel ? std::vector<int64_t>{n} : std::vector<int64_t>{});
  for (int64_t i = 0; i < zeros.num_elements(); ++i) {
    StoreFromDouble(zeros.view(), i, q.weight_zero_point);
  }
  AttributeMap a;
  a.Set("axis", axis);
  return Add(g, "DequantizeLinear", {w, s, Const(g, std::move(zeros))}, std::move(a));
}

// x [2, 3, 9, 9] -> Q/DQ -> Conv 3x3 (int32 bias through its DQ, scale s_x * s_w) -> Relu.
std::unique_ptr<Graph> ConvGraph(const Qdq& q) {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, {Dim(2), Dim(3), Dim(9), Dim(9)});
  std::vector<float> ws;
  Value* w = QdqWeight(*g, {4, 3, 3, 3}, 0, q, 11, &ws);
  std::vector<float> bs;
  for (int c = 0; c < 4; ++c) bs.push_back(static_cast<float>(q.scale) * ws[q.per_channel ? c : 0]);
  AttributeMap axis0;
  axis0.Set("axis", int64_t{0});
  Value* b = Add(*g, "DequantizeLinear",
                 {Const(*g, RandomInts(DataType::kInt32, {4}, -2000, 2000, 12)),
                  Const(*g, Tensor::FromVector<float>(DataType::kFloat32, {4}, bs))},
                 std::move(axis0));
  AttributeMap conv;
  conv.Set("pads", std::vector<int64_t>{1, 1, 1, 1});
  Value* y = Add(*g, "Relu", {Add(*g, "Conv", {QdqActivation(*g, x, q), w, b}, std::move(conv))});
  g->MarkOutput(y);
  return g;
}

// x [2, 5, 16] -> Q/DQ -> MatMul with B [16, 8] (per column) -> + float bias.
std::unique_ptr<Graph> MatMulGraph(const Qdq& q) {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, {Dim(2), Dim(5), Dim(16)});
  Value* y = Add(*g, "MatMul", {QdqActivation(*g, x, q), QdqWeight(*g, {16, 8}, 1, q, 21)});
  y = Add(*g, "Add", {y, Const(*g, RandomFloats({8}, 22, 0.5f))});
  g->MarkOutput(y);
  return g;
}

// x [4, 16] -> Q/DQ -> Gemm with B [8, 16] under transB (per row: the output channels), C [8].
std::unique_ptr<Graph> GemmGraph(const Qdq& q) {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, {Dim(4), Dim(16)});
  AttributeMap t;
  t.Set("transB", int64_t{1});
  t.Set("alpha", 0.5f);
  Value* y = Add(*g, "Gemm",
                 {QdqActivation(*g, x, q), QdqWeight(*g, {8, 16}, 0, q, 31),
                  Const(*g, RandomFloats({8}, 32, 0.5f))},
                 std::move(t));
  g->MarkOutput(y);
  return g;
}

std::map<std::string, Tensor> Inputs(const Graph& g) {
  std::map<std::string, Tensor> in;
  uint64_t seed = 100;
  for (const Value* v : g.inputs()) {
    std::vector<int64_t> dims;
    for (const Dim& d : v->shape()) dims.push_back(d.value());
    in.emplace(v->name(), RandomFloats(dims, seed++));
  }
  return in;
}

struct Built {
  std::map<std::string, Tensor> outputs;
  BuildReport report;
};

Built Build(const std::function<std::unique_ptr<Graph>()>& make, bool fuse,
            BuilderConfig config = {}) {
  if (!fuse) config.disabled_passes.push_back("qdq_fusion");
  std::unique_ptr<Graph> g = make();
  auto inputs = Inputs(*g);
  Built b;
  auto out = BuildAndRun(std::move(g), config, inputs, &b.report);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  if (out.ok()) b.outputs = std::move(*out);
  return b;
}

// The layers computing in INT8 with the model's scales (QuantizeLinear's int8 output is "i8"
// storage too, so they are told apart by their reason), each checked for an INT8 tactic.
int Int8Layers(const BuildReport& r) {
  int n = 0;
  for (const LayerReport& l : r.layer_reports) {
    if (l.precision_reason.find("from the model's Q/DQ scales") == std::string::npos) continue;
    EXPECT_EQ(l.precision, "i8") << l.name;
    EXPECT_EQ(l.tactic.rfind("i8-", 0), 0u) << l.name << ": " << l.tactic;
    ++n;
  }
  return n;
}

void ExpectFusedMatchesLiteral(const std::function<std::unique_ptr<Graph>()>& make,
                               const std::string& what) {
  SCOPED_TRACE(what);
  Built fused = Build(make, true);
  Built literal = Build(make, false);
  EXPECT_EQ(Int8Layers(fused.report), 1);
  EXPECT_EQ(Int8Layers(literal.report), 0);
  EXPECT_NE(fused.report.calibration.find("from the model's Q/DQ scales"), std::string::npos)
      << fused.report.calibration;
  ASSERT_EQ(fused.outputs.size(), 1u);
  for (const auto& [name, t] : literal.outputs) {
    // Integer products against float products of the dequantized values: float rounding only.
    EXPECT_LT(RelL2(fused.outputs.at(name), t), 1e-5) << name;
  }
}

TEST(QdqInt8, ConvGemmMatMulRunInt8WithTheModelsScales) {
  for (bool per_channel : {true, false}) {
    for (DataType act : {DataType::kInt8, DataType::kUInt8}) {
      Qdq q;
      q.per_channel = per_channel;
      q.act = act;
      q.zero_point = act == DataType::kUInt8 ? 140 : -20;
      const std::string what = fmt::format("{} activations, {} weights", ToString(act),
                                           per_channel ? "per-channel" : "per-tensor");
      ExpectFusedMatchesLiteral([&] { return ConvGraph(q); }, "conv, " + what);
      ExpectFusedMatchesLiteral([&] { return MatMulGraph(q); }, "matmul, " + what);
      ExpectFusedMatchesLiteral([&] { return GemmGraph(q); }, "gemm, " + what);
    }
  }
  // Zero points at the ends of the range (ReLU outputs quantized to int8 use -128).
  for (int zp : {-128, 127, 0}) {
    Qdq q;
    q.zero_point = zp;
    ExpectFusedMatchesLiteral([&] { return ConvGraph(q); }, fmt::format("conv, zero point {}", zp));
  }
}

TEST(QdqInt8, NoCalibrationDataIsNeeded) {
  BuilderConfig config;
  config.int8 = true;  // no --calib-dir: the QDQ layers carry their scales
  Built b = Build([] { return ConvGraph(Qdq{}); }, true, config);
  EXPECT_EQ(Int8Layers(b.report), 1);
  EXPECT_NE(b.report.calibration.find("model's Q/DQ scales"), std::string::npos)
      << b.report.calibration;
  EXPECT_EQ(b.report.calibration_batches_run, 0);
}

TEST(QdqInt8, WhatCannotBeFusedStaysFloatBetweenItsQdq) {
  struct Case {
    std::string what, note;
    std::function<std::unique_ptr<Graph>()> make;
  };
  Qdq zp;
  zp.weight_zero_point = 3;
  std::vector<Case> cases = {
      {"weight zero point", "weight zero point is 3", [=] { return ConvGraph(zp); }},
      {"per-axis MatMul weights along K", "quantized per axis 0",
       [] {
         auto g = std::make_unique<Graph>();
         Value* x = g->AddInput("x", DataType::kFloat32, {Dim(4), Dim(16)});
         g->MarkOutput(
             Add(*g, "MatMul", {QdqActivation(*g, x, Qdq{}), QdqWeight(*g, {16, 8}, 0, Qdq{}, 5)}));
         return g;
       }},
      {"activation quantized per axis", "per axis",
       [] {
         auto g = std::make_unique<Graph>();
         Value* x = g->AddInput("x", DataType::kFloat32, {Dim(4), Dim(16)});
         Value* s = Const(*g, Tensor::FromVector<float>(DataType::kFloat32, {16},
                                                        std::vector<float>(16, 0.02f)));
         Value* z = Const(*g, Tensor(DataType::kInt8, {16}));
         Value* dq = Add(*g, "DequantizeLinear", {Add(*g, "QuantizeLinear", {x, s, z}), s, z});
         g->MarkOutput(Add(*g, "MatMul", {dq, QdqWeight(*g, {16, 8}, 1, Qdq{}, 6)}));
         return g;
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Built fused = Build(c.make, true);
    Built literal = Build(c.make, false);
    EXPECT_EQ(Int8Layers(fused.report), 0);
    bool noted = false;
    for (const std::string& n : fused.report.pass_notes) {
      noted |= n.find("stays float between its Q/DQ") != std::string::npos &&
               n.find(c.note) != std::string::npos;
    }
    EXPECT_TRUE(noted) << fmt::format("{}", fmt::join(fused.report.pass_notes, " | "));
    // The same graph but for the pass's visit (tactics may differ in summation order).
    for (const auto& [name, t] : literal.outputs) {
      EXPECT_LT(RelL2(fused.outputs.at(name), t), 1e-6) << name;
    }
  }
}

// A layer that carries the model's scales but whose float weight is not the model's integers
// times them (as if something had changed the weight) is not run in INT8: its Q/DQ come back and
// it computes in float, exactly as the literal graph.
TEST(QdqInt8, ALayerNoKernelTakesGetsItsQdqBack) {
  const Qdq q;
  auto make = [&](bool annotated) {
    auto g = std::make_unique<Graph>();
    Value* x = g->AddInput("x", DataType::kFloat32, {Dim(4), Dim(16)});
    Value* in = annotated ? x : QdqActivation(*g, x, q);
    Value* w = Const(*g, RandomFloats({16, 8}, 7, 0.3f));  // not integers times the scales
    Value* y = Add(*g, "MatMul", {in, w});
    if (annotated) {
      ModelInt8Scales s;
      s.input_scale = static_cast<float>(q.scale);
      s.input_zero_point = q.zero_point;
      s.weight_scales.assign(8, 0.01f);
      SetModelInt8Attrs(*y->producer(), s);
    }
    g->MarkOutput(y);
    return g;
  };
  Built fallback = Build([&] { return make(true); }, true);
  Built literal = Build([&] { return make(false); }, true);
  EXPECT_EQ(Int8Layers(fallback.report), 0);
  bool explained = false;
  for (const LayerReport& l : fallback.report.layer_reports) {
    explained |=
        l.precision_reason.find("not int8 with the model's Q/DQ scales") != std::string::npos;
  }
  EXPECT_TRUE(explained);
  ASSERT_EQ(fallback.outputs.size(), 1u);
  ASSERT_EQ(literal.outputs.size(), 1u);
  EXPECT_LT(RelL2(fallback.outputs.begin()->second, literal.outputs.begin()->second), 1e-6);
}

// ---- bad quantization parameters in the ONNX file: KILN-E2016 at import

std::string QdqModel(float scale, int zero_point_int32_data) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  auto* opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(19);
  onnx::GraphProto& g = *m.mutable_graph();
  g.set_name("qdq");
  auto* in = g.add_input();
  in->set_name("x");
  in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  in->mutable_type()->mutable_tensor_type()->mutable_shape()->add_dim()->set_dim_value(4);
  auto* s = g.add_initializer();
  s->set_name("s");
  s->set_data_type(onnx::TensorProto::FLOAT);
  s->add_float_data(scale);
  auto* z = g.add_initializer();
  z->set_name("z");
  z->set_data_type(onnx::TensorProto::UINT8);
  z->add_int32_data(zero_point_int32_data);  // ONNX widens uint8 into int32_data
  for (auto [op, from, to] :
       {std::tuple{"QuantizeLinear", "x", "q"}, std::tuple{"DequantizeLinear", "q", "y"}}) {
    auto* n = g.add_node();
    n->set_op_type(op);
    n->add_input(from);
    n->add_input("s");
    n->add_input("z");
    n->add_output(to);
  }
  auto* out = g.add_output();
  out->set_name("y");
  out->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  return m.SerializeAsString();
}

std::span<const std::byte> AsBytes(const std::string& s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

// Import, then the shape rules (which check constant scales), as a build does.
Status ImportAndInfer(const std::string& bytes) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> g, ImportOnnxBytes(AsBytes(bytes), ""));
  return InferShapes(*g).status();
}

TEST(QdqInt8, BadScalesAndZeroPointsAreRefused) {
  EXPECT_TRUE(ImportAndInfer(QdqModel(0.1f, 128)).ok());
  for (float bad : {0.f, -0.1f, std::nanf(""), INFINITY}) {
    Status s = ImportAndInfer(QdqModel(bad, 128));
    EXPECT_EQ(s.code(), ErrorCode::kInvalidQuantization) << bad << ": " << s.ToString();
    EXPECT_NE(s.message().find("finite and positive"), std::string::npos) << s.ToString();
  }
  for (int bad : {256, 300, -1}) {
    Status s = ImportAndInfer(QdqModel(0.1f, bad));
    EXPECT_EQ(s.code(), ErrorCode::kInvalidQuantization) << bad << ": " << s.ToString();
    EXPECT_NE(s.message().find("outside the type's range [0, 255]"), std::string::npos)
        << s.ToString();
  }
}

}  // namespace
}  // namespace kiln
