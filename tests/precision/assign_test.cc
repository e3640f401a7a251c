// Per-layer precision on small graphs: the op table, Cast placement and counts, the FP16 range
// guard (weights and calibrated activations), BF16 as the fallback, and INT8 through a test-only
// provider that honours the kiln_int8_input_amax contract.
#include "kiln/precision/precision.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kiln/backends/cpu/cpu_eval.h"
#include "kiln/builder/builder.h"
#include "kiln/ops/op_schema.h"
#include "tests/precision/test_util.h"

namespace kiln::precision {
namespace {

using kiln::testing::F32;
using kiln::testing::Random;

Value* Weight(Graph& g, const std::string& name, std::vector<int64_t> dims, uint64_t seed,
              float scale = 0.5f) {
  return g.AddConstant(name, F32(dims, Random(NumElements(dims), seed, scale)));
}

const LayerReport* FindLayer(const BuildReport& r, const std::string& name) {
  for (const auto& l : r.layer_reports) {
    if (l.name == name) return &l;
  }
  return nullptr;
}

int CountOp(const Graph& g, const std::string& op) {
  int n = 0;
  for (const Node* node : g.nodes()) n += node->op_type() == op;
  return n;
}

BuilderConfig Fp16() {
  BuilderConfig c;
  c.fp16 = true;
  c.deadline = std::chrono::milliseconds(1);  // heuristic tactics: no timing in unit tests
  c.optimize = false;  // keep the layers as written (fusion would rename them)
  return c;
}

// x -> MatMul(W1) -> Relu -> MatMul(W2) -> y: every layer FP16, so only the graph's edges cast.
std::unique_ptr<Graph> Chain() {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, MakeShape({4, 16}));
  Value *h = g->AddValue("h"), *r = g->AddValue("r"), *y = g->AddValue("y");
  g->AddNode("MatMul", "mm1", {x, Weight(*g, "w1", {16, 16}, 1)}, {h});
  g->AddNode("Relu", "relu", {h}, {r});
  g->AddNode("MatMul", "mm2", {r, Weight(*g, "w2", {16, 8}, 2)}, {y});
  g->MarkOutput(y);
  EXPECT_TRUE(InferShapes(*g).ok());
  return g;
}

std::map<std::string, Tensor> Reference(const Graph& g, const std::map<std::string, Tensor>& in) {
  auto out = cpu::EvaluateGraph(g, in);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return *out;
}

TEST(PrecisionAssign, Fp16ChainCastsOnlyAtTheGraphEdges) {
  auto g = Chain();
  std::map<std::string, Tensor> in = {{"x", F32({4, 16}, Random(64, 9))}};
  auto ref = Reference(*g, in);
  BuildReport report;
  std::unique_ptr<EngineDesc> engine;
  auto out = kiln::testing::BuildAndRun(std::move(g), Fp16(), in, &report, &engine);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(report.casts_inserted, 2);  // x f32->f16 in, y f16->f32 out
  EXPECT_EQ(report.weights_converted, 2);
  EXPECT_EQ(CountOp(*engine->graph, "Cast"), 2);
  EXPECT_EQ(report.precision_counts["f16"], 4);  // three layers and the Cast that writes f16
  EXPECT_EQ(report.precision_counts["f32"], 1);  // the Cast back to the output's f32
  EXPECT_EQ(FindLayer(report, "mm1")->precision, "f16");
  EXPECT_EQ(FindLayer(report, "relu")->precision_reason, "f16: allowed and a cpu kernel exists");
  // Graph inputs and outputs keep their ONNX types; weights are stored in FP16.
  EXPECT_EQ(engine->graph->inputs()[0]->dtype(), DataType::kFloat32);
  EXPECT_EQ(engine->graph->outputs()[0]->dtype(), DataType::kFloat32);
  EXPECT_EQ(engine->graph->FindNode("mm1")->input(1)->dtype(), DataType::kFloat16);
  EXPECT_EQ(engine->graph->FindNode("relu")->output(0)->dtype(), DataType::kFloat16);
  EXPECT_EQ(out->at("y").dtype(), DataType::kFloat32);
  EXPECT_LT(kiln::testing::RelL2(out->at("y"), ref.at("y")), 1e-2);
  EXPECT_GT(kiln::testing::RelL2(out->at("y"), ref.at("y")), 0.0);  // really ran in FP16
}

// The tactic phase's fallback (issue 19): a layer given FP16 from static capability whose FP16
// kernel could not be built computes in FP32 afterwards, between Casts, with the reason recorded,
// and the graph still computes the model.
TEST(PrecisionAssign, DemotedLayerComputesInFp32BetweenCasts) {
  auto g = Chain();
  std::map<std::string, Tensor> in = {{"x", F32({4, 16}, Random(64, 9))}};
  auto ref = Reference(*g, in);
  PrecisionOptions po;
  po.fp16 = true;
  po.make_request = [](const Node& node) { return MakeKernelRequest(node, {}); };
  auto assigned = AssignPrecision(*g, po);
  ASSERT_TRUE(assigned.ok()) << assigned.status().ToString();
  ASSERT_EQ(assigned->layers.at("relu").dtype, DataType::kFloat16);
  const int64_t casts = assigned->casts_inserted;
  Node* relu = g->FindNode("relu");
  ASSERT_TRUE(DemoteToFp32(*g, *relu, "fp32: no f16 kernel was built", *assigned).ok());
  EXPECT_EQ(assigned->layers.at("relu").dtype, DataType::kFloat32);
  EXPECT_EQ(assigned->layers.at("relu").reason, "fp32: no f16 kernel was built");
  EXPECT_EQ(assigned->casts_inserted, casts + 2);  // f16 -> f32 in front, f32 -> f16 after
  EXPECT_EQ(relu->input(0)->dtype(), DataType::kFloat32);
  EXPECT_EQ(relu->output(0)->dtype(), DataType::kFloat32);
  EXPECT_EQ(relu->input(0)->producer()->op_type(), "Cast");
  ASSERT_EQ(relu->output(0)->consumers().size(), 1u);
  EXPECT_EQ(relu->output(0)->consumers()[0]->op_type(), "Cast");
  EXPECT_EQ(g->FindNode("mm2")->input(0)->dtype(), DataType::kFloat16);  // mm2 stays FP16
  EXPECT_TRUE(Verify(*g).ok());
  auto out = cpu::EvaluateGraph(*g, in);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_LT(kiln::testing::RelL2(out->at("y"), ref.at("y")), 1e-2);
  // Only a layer given FP16/BF16 can be demoted.
  EXPECT_EQ(DemoteToFp32(*g, *relu, "again", *assigned).code(), ErrorCode::kInternal);
}

TEST(PrecisionAssign, OneCastPerValueAndTargetSharedByConsumers) {
  // h (f16) feeds two FP32-only Exps and a Relu; both Exps share one Cast of h to f32; each Exp
  // output goes back to f16 once for the Adds.
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, MakeShape({4, 16}));
  Value *h = g->AddValue("h"), *e1 = g->AddValue("e1"), *e2 = g->AddValue("e2"),
        *r = g->AddValue("r"), *s1 = g->AddValue("s1"), *s2 = g->AddValue("s2"),
        *y = g->AddValue("y");
  g->AddNode("MatMul", "mm1", {x, Weight(*g, "w1", {16, 16}, 1, 0.1f)}, {h});
  g->AddNode("Exp", "exp1", {h}, {e1});
  g->AddNode("Exp", "exp2", {h}, {e2});
  g->AddNode("Relu", "relu", {h}, {r});
  g->AddNode("Add", "add1", {e1, r}, {s1});
  g->AddNode("Add", "add2", {s1, e2}, {s2});
  g->AddNode("MatMul", "mm2", {s2, Weight(*g, "w2", {16, 8}, 2)}, {y});
  g->MarkOutput(y);
  ASSERT_TRUE(InferShapes(*g).ok());
  std::map<std::string, Tensor> in = {{"x", F32({4, 16}, Random(64, 5))}};
  auto ref = Reference(*g, in);
  BuildReport report;
  std::unique_ptr<EngineDesc> engine;
  auto out = kiln::testing::BuildAndRun(std::move(g), Fp16(), in, &report, &engine);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  // x->f16, h->f32 (shared), e1->f16, e2->f16, y->f32.
  EXPECT_EQ(report.casts_inserted, 5);
  EXPECT_EQ(CountOp(*engine->graph, "Cast"), 5);
  const Graph& eg = *engine->graph;
  const Value* eh = eg.FindNode("mm1")->output(0);
  int casts_of_h = 0;
  for (const Node* c : eh->consumers()) casts_of_h += c->op_type() == "Cast";
  EXPECT_EQ(casts_of_h, 1);
  EXPECT_EQ(eg.FindNode("exp1")->input(0), eg.FindNode("exp2")->input(0));
  EXPECT_EQ(FindLayer(report, "exp1")->precision, "f32");
  EXPECT_NE(FindLayer(report, "exp1")->precision_reason.find("exp overflows FP16"),
            std::string::npos);
  EXPECT_EQ(FindLayer(report, "add1")->precision, "f16");
  EXPECT_LT(kiln::testing::RelL2(out->at("y"), ref.at("y")), 1e-2);
}

TEST(PrecisionAssign, IntegerAndShapeOpsAreUntouched) {
  // x -> Relu -> r; Shape(r) -> s (i64); Reshape(r, s) -> y. Shape keeps i64 and reads the f16 r
  // as it is (it reads the shape only: no Cast); Relu and Reshape run f16.
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, MakeShape({2, 3}));
  Value *s = g->AddValue("s"), *r = g->AddValue("r"), *y = g->AddValue("y");
  g->AddNode("Relu", "relu", {x}, {r});
  g->AddNode("Shape", "shape", {r}, {s});
  g->AddNode("Reshape", "reshape", {r, s}, {y});
  g->MarkOutput(y);
  ASSERT_TRUE(InferShapes(*g).ok());
  BuilderConfig c = Fp16();  // no passes: keeps the Shape node (folding would remove it)
  BuildReport report;
  auto out = kiln::testing::BuildAndRun(std::move(g), c, {{"x", F32({2, 3}, {-1, 2, -3, 4, 5, 6})}},
                                        &report);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(FindLayer(report, "shape")->precision, "i64");
  EXPECT_EQ(FindLayer(report, "shape")->precision_reason,
            "integer/shape op: keeps the model's types");
  EXPECT_EQ(FindLayer(report, "relu")->precision, "f16");
  EXPECT_EQ(FindLayer(report, "reshape")->precision, "f16");
  EXPECT_EQ(report.casts_inserted, 2);  // x in, y out; none for the Shape
  EXPECT_EQ(out->at("y").ToFloatVector(), (std::vector<float>{0, 2, 0, 4, 5, 6}));
}

TEST(PrecisionGuard, OverflowingWeightsKeepTheLayerFp32) {
  auto g = Chain();
  // One weight of mm2 beyond FP16's range: mm2 stays FP32, the rest is FP16.
  Tensor w = F32({16, 8}, Random(128, 2));
  w.mutable_data<float>()[5] = 1.5e5f;
  g->FindNode("mm2")->input(1)->set_constant(w);
  BuildReport report;
  std::map<std::string, Tensor> in = {{"x", F32({4, 16}, Random(64, 9))}};
  auto ref = Reference(*g, in);
  auto out = kiln::testing::BuildAndRun(std::move(g), Fp16(), in, &report);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const LayerReport* mm2 = FindLayer(report, "mm2");
  EXPECT_EQ(mm2->precision, "f32");
  EXPECT_NE(mm2->precision_reason.find("weight 'w2' reaches |x| = 1.5e+05, beyond the "
                                       "FP16 range"),
            std::string::npos)
      << mm2->precision_reason;
  EXPECT_EQ(FindLayer(report, "relu")->precision, "f16");
  // f32 in -> f16 for mm1, relu's f16 output -> f32 for mm2; mm2 writes y in f32: two Casts.
  EXPECT_EQ(report.casts_inserted, 2);
  EXPECT_LT(kiln::testing::RelL2(out->at("y"), ref.at("y")), 1e-2);
  EXPECT_TRUE(std::isfinite(out->at("y").ToFloatVector()[0]));
}

TEST(PrecisionGuard, BF16TakesLayersFP16Refuses) {
  auto g = Chain();
  Tensor w = F32({16, 8}, Random(128, 2));
  w.mutable_data<float>()[5] = 1.5e5f;
  g->FindNode("mm2")->input(1)->set_constant(w);
  BuilderConfig c = Fp16();
  c.bf16 = true;
  BuildReport report;
  auto engine = BuildEngine({std::move(g), "t", HashString("t")}, c, &report);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_EQ(FindLayer(report, "mm2")->precision, "bf16");
  EXPECT_NE(FindLayer(report, "mm2")->precision_reason.find("bf16: f16 refused (weight 'w2'"),
            std::string::npos);
  EXPECT_EQ(FindLayer(report, "relu")->precision, "f16");
  // relu (f16) -> mm2 (bf16): one Cast between, plus the graph's edges.
  EXPECT_EQ(report.casts_inserted, 3);
}

TEST(PrecisionGuard, CalibratedActivationsBeyondFp16KeepTheLayerFp32) {
  // x -> Mul(x, 4) -> m -> Relu -> y. Calibration sees |x| up to 1e4, so m reaches 4e4: beyond
  // 65504/2. Mul and Relu stay FP32 (m is their output/input); without calibration data both
  // would be FP16.
  auto make = [] {
    auto g = std::make_unique<Graph>();
    Value* x = g->AddInput("x", DataType::kFloat32, MakeShape({1, 8}));
    Value *m = g->AddValue("m"), *y = g->AddValue("y");
    g->AddNode("Mul", "mul", {x, g->AddConstant("four", F32({1}, {4.0f}))}, {m});
    g->AddNode("Relu", "relu", {m}, {y});
    g->MarkOutput(y);
    EXPECT_TRUE(InferShapes(*g).ok());
    return g;
  };
  std::string dir = kiln::testing::TempDir("guard_calib");
  kiln::testing::WriteDataSets(dir, {{F32({1, 8}, {1, -2, 3, 1e4f, 5, 6, 7, 8})}});
  BuilderConfig c = Fp16();
  c.calibration_dir = dir;
  BuildReport report;
  ASSERT_TRUE(BuildEngine({make(), "t", HashString("t")}, c, &report).ok());
  EXPECT_EQ(FindLayer(report, "mul")->precision, "f32");
  EXPECT_NE(FindLayer(report, "mul")
                ->precision_reason.find(
                    "output 'm' reaches |x| = 4e+04 in calibration, beyond the FP16 range"),
            std::string::npos)
      << FindLayer(report, "mul")->precision_reason;
  EXPECT_EQ(FindLayer(report, "relu")->precision, "f32");
  EXPECT_EQ(report.casts_inserted, 0);

  BuildReport plain;
  ASSERT_TRUE(BuildEngine({make(), "t", HashString("t")}, Fp16(), &plain).ok());
  EXPECT_EQ(FindLayer(plain, "mul")->precision, "f16");
}

TEST(PrecisionAssign, Fp32BuildsSayWhy) {
  BuilderConfig c = Fp16();
  c.fp16 = false;
  BuildReport report;
  ASSERT_TRUE(BuildEngine({Chain(), "t", HashString("t")}, c, &report).ok());
  EXPECT_EQ(report.precision_counts["f32"], 3);
  EXPECT_EQ(report.casts_inserted, 0);
  EXPECT_EQ(FindLayer(report, "mm1")->precision_reason,
            "fp32: reduced precision not enabled (--fp16/--bf16/--int8/--fp8)");
  EXPECT_NE(report.PrecisionTable().find("mm1"), std::string::npos);
  EXPECT_NE(report.PrecisionJson().find("\"reason\""), std::string::npos);
}

TEST(PrecisionTable, OpRules) {
  EXPECT_EQ(LookupOpPrecision("Conv").kind, OpPrecision::kReducible);
  EXPECT_EQ(LookupOpPrecision("Softmax").kind, OpPrecision::kReducible);
  EXPECT_EQ(LookupOpPrecision("Exp").kind, OpPrecision::kKeepFp32);
  EXPECT_EQ(LookupOpPrecision("ReduceSum").kind, OpPrecision::kKeepFp32);
  EXPECT_EQ(LookupOpPrecision("Shape").kind, OpPrecision::kUntouched);
  EXPECT_EQ(LookupOpPrecision("Cast").kind, OpPrecision::kUntouched);
  EXPECT_EQ(LookupOpPrecision("Resize").fixed_inputs, (std::vector<int>{1, 2}));
}

}  // namespace
}  // namespace kiln::precision
