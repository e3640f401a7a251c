// The INT8 sensitivity fallback: fake quantization that mirrors the kernels, the fallback plan's
// arithmetic, and builds where a layer made sensitive on purpose falls back to FP16 with its
// measured figure while an insensitive one stays INT8, deterministically and through the cache.
#include "kiln/precision/sensitivity.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "kiln/backends/cpu/cpu_eval.h"
#include "kiln/builder/builder.h"
#include "kiln/engine/engine_file.h"
#include "kiln/onnx/calibration_data.h"
#include "kiln/ops/op_schema.h"
#include "kiln/precision/precision.h"
#include "tests/precision/test_util.h"

namespace kiln {
namespace {

using precision::CalibrationTable;
using testing::F32;
using testing::Random;

TEST(Int8Sensitivity, FakeQuantizationIsTheKernelsArithmetic) {
  // Scale amax/127, round to nearest, saturate at +-127 (-2 clips to -amax).
  Tensor a = precision::FakeQuantizeActivations(F32({4}, {0.3f, -2.f, 1.f, 0.004f}), 1.f);
  const float s = 1.f / 127.f;
  EXPECT_NEAR(a.data<float>()[0], 38 * s, 1e-7);
  EXPECT_NEAR(a.data<float>()[1], -1.f, 1e-7);
  EXPECT_NEAR(a.data<float>()[2], 1.f, 1e-7);
  EXPECT_NEAR(a.data<float>()[3], 1 * s, 1e-7);

  // The same two channels {1, 0.3} and {0.02, -0.005} as Conv (dim 0), MatMul [K, N] (columns)
  // and Gemm transB [N, K] (rows): each quantized with its own absmax.
  Graph g;
  Value* x = g.AddInput("x", DataType::kFloat32, MakeShape({1, 2}));
  auto expect = [](const Tensor& w, std::vector<int> at) {
    EXPECT_NEAR(w.data<float>()[at[0]], 1.f, 1e-7);
    EXPECT_NEAR(w.data<float>()[at[1]], 38 / 127.f, 1e-7);
    EXPECT_NEAR(w.data<float>()[at[2]], 0.02f, 1e-7);
    EXPECT_NEAR(w.data<float>()[at[3]], -32 * 0.02f / 127.f, 1e-7);  // -31.75 rounds to -32
  };
  Node* conv = g.AddNode("Conv", "c", {x, x}, {g.AddValue("y1")});
  auto wc = precision::FakeQuantizeWeights(*conv, F32({2, 1, 1, 2}, {1, 0.3f, 0.02f, -0.005f}));
  ASSERT_TRUE(wc.has_value());
  expect(*wc, {0, 1, 2, 3});
  Node* mm = g.AddNode("MatMul", "m", {x, x}, {g.AddValue("y2")});
  auto wm = precision::FakeQuantizeWeights(*mm, F32({2, 2}, {1, 0.02f, 0.3f, -0.005f}));
  ASSERT_TRUE(wm.has_value());
  expect(*wm, {0, 2, 1, 3});
  AttributeMap trans;
  trans.Set("transB", int64_t{1});
  Node* gemm = g.AddNode("Gemm", "g", {x, x}, {g.AddValue("y3")}, trans);
  auto wg = precision::FakeQuantizeWeights(*gemm, F32({2, 2}, {1, 0.3f, 0.02f, -0.005f}));
  ASSERT_TRUE(wg.has_value());
  expect(*wg, {0, 1, 2, 3});
  // A batched MatMul weight has no INT8 kernel: not analysed.
  EXPECT_FALSE(precision::FakeQuantizeWeights(*mm, F32({1, 2, 2}, {1, 2, 3, 4})).has_value());
}

TEST(Int8Sensitivity, ToleranceParses) {
  EXPECT_DOUBLE_EQ(*precision::ParseInt8Tolerance("0.05"), 0.05);
  EXPECT_TRUE(std::isinf(*precision::ParseInt8Tolerance("off")));
  for (const char* bad : {"0", "-1", "abc", "0.1x", "", "inf"}) {
    auto r = precision::ParseInt8Tolerance(bad);
    EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument) << bad;
  }
}

TEST(Int8Sensitivity, PlanFallsBackTheMostSensitiveUntilTheEstimateFits) {
  CalibrationTable t;
  t.int8_sensitivity = {{"a", 0.08}, {"b", 0.03}, {"c", 0.03}, {"d", 0.01}};
  t.int8_all_rel_l2 = 0.2;  // more than the quadrature sum 0.0911: errors compound, c = 2.195
  const std::vector<std::string> layers = {"d", "c", "b", "a"};
  const double c = 0.2 / std::sqrt(0.0083);

  auto p = precision::PlanInt8Fallback(t, layers, 0.1);
  EXPECT_NEAR(p.scale, c, 1e-12);
  ASSERT_EQ(p.fall_back.size(), 1u);
  EXPECT_DOUBLE_EQ(p.fall_back.at("a").sensitivity, 0.08);
  EXPECT_NEAR(p.fall_back.at("a").estimate, 0.2, 1e-12);
  EXPECT_NEAR(p.estimate, c * std::sqrt(0.0019), 1e-12);  // 0.0957 <= 0.1

  // b and c tie: b (by name) goes first; then c is still needed.
  p = precision::PlanInt8Fallback(t, layers, 0.05);
  EXPECT_EQ(p.fall_back.size(), 3u);
  EXPECT_NEAR(p.fall_back.at("b").estimate, c * std::sqrt(0.0019), 1e-12);
  EXPECT_NEAR(p.fall_back.at("c").estimate, c * std::sqrt(0.0010), 1e-12);
  EXPECT_FALSE(p.fall_back.count("d"));
  EXPECT_NEAR(p.estimate, c * 0.01, 1e-12);

  // Only the layers that would run INT8 count; 'off' keeps them all.
  p = precision::PlanInt8Fallback(t, {"b", "d"}, 0.1);
  EXPECT_TRUE(p.fall_back.empty());
  EXPECT_TRUE(precision::PlanInt8Fallback(t, layers, HUGE_VAL).fall_back.empty());

  // Errors that cancel never make the estimate smaller than the quadrature sum.
  t.int8_all_rel_l2 = 0.01;
  EXPECT_DOUBLE_EQ(precision::PlanInt8Fallback(t, layers, 0.1).scale, 1.0);
}

// With benefits (the FP8 fallback's K x N), the layer that costs the most error for what it saves
// goes first: here the small one, though the large one is a little more sensitive.
TEST(Int8Sensitivity, FallbackWithBenefitsSendsBackWhatPaysLeast) {
  const std::map<std::string, double> s = {{"small", 0.03}, {"large", 0.04}, {"mid", 0.01}};
  const std::vector<std::string> layers = {"small", "large", "mid"};
  // 0.051 together: one must go to get under 0.045.
  auto by_error = precision::PlanFallback(s, -1, layers, 0.045);
  ASSERT_EQ(by_error.fall_back.size(), 1u);
  EXPECT_TRUE(by_error.fall_back.contains("large"));
  auto by_benefit = precision::PlanFallback(s, -1, layers, 0.045,
                                            {{"small", 1.0}, {"large", 16.0}, {"mid", 4.0}});
  ASSERT_EQ(by_benefit.fall_back.size(), 1u);
  EXPECT_TRUE(by_benefit.fall_back.contains("small"));
  EXPECT_NEAR(by_benefit.estimate, std::sqrt(0.04 * 0.04 + 0.01 * 0.01), 1e-12);
  EXPECT_NEAR(by_benefit.fall_back.at("small").sensitivity, 0.03, 1e-12);
  // A layer with no benefit given goes first.
  auto missing = precision::PlanFallback(s, -1, layers, 0.045, {{"large", 16.0}, {"mid", 4.0}});
  EXPECT_TRUE(missing.fall_back.contains("small"));
}

// A layer whose input range differs between calibration batches: scales fitted to one batch clip
// the other. In-sample (every batch quantized with the scale fitted to all of them) it looks
// harmless; measured leave one batch out, which Calibrate does, it is not.
TEST(Int8Sensitivity, LeaveOneOutSeesRangesThatChangeBetweenBatches) {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, MakeShape({4, 16}));
  Value* y = g->AddValue("y");
  g->AddNode("MatMul", "mm", {x, g->AddConstant("w", F32({16, 8}, Random(128, 3, 0.5f)))}, {y});
  g->MarkOutput(y);
  ASSERT_TRUE(InferShapes(*g).ok());
  std::vector<std::map<std::string, Tensor>> data = {{{"x", F32({4, 16}, Random(64, 1, 1.0f))}},
                                                     {{"x", F32({4, 16}, Random(64, 2, 4.0f))}}};
  auto table = precision::Calibrate(*g, cpu::EvaluateNode, data,
                                    precision::CalibrationMethod::kMinMax, 99.99);
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  const double held_out = table->int8_sensitivity.at("mm");
  std::vector<std::map<std::string, Tensor>> activations;
  for (const auto& feed : data) {
    auto values = precision::EvaluateCalibrationBatch(*g, feed, cpu::EvaluateNode);
    ASSERT_TRUE(values.ok());
    activations.push_back(std::move(*values));
  }
  auto in_sample = precision::MeasureInt8Sensitivity(*g, cpu::EvaluateNode, activations, *table);
  ASSERT_TRUE(in_sample.ok());
  EXPECT_EQ(in_sample->evaluations, 2);  // the layer alone, then all (the same one) together
  // In-sample: the small batch gets a quarter of the levels, a few percent. Held out: the large
  // batch clips at a quarter of its range.
  EXPECT_LT(in_sample->layers.at("mm"), 5e-2);
  EXPECT_GT(held_out, 0.3);
  EXPECT_DOUBLE_EQ(table->int8_all_rel_l2, held_out);
  // One data set: nothing to hold out, the figure is in-sample.
  auto one = precision::Calibrate(*g, cpu::EvaluateNode, std::span(data).first(1),
                                  precision::CalibrationMethod::kMinMax, 99.99);
  ASSERT_TRUE(one.ok());
  EXPECT_LT(one->int8_sensitivity.at("mm"), 3e-2);
}

// Whole-graph reruns with the layers' operands quantized (what a device evaluator does) give the
// partial evaluations' figures: here over the host walk, where both compute the same numbers.
TEST(Int8Sensitivity, RerunsGiveThePartialEvaluationsFigures) {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, MakeShape({4, 16}));
  Value *h = g->AddValue("h"), *r = g->AddValue("r"), *y = g->AddValue("y");
  Value* side = g->AddValue("side");
  g->AddNode("MatMul", "mm1", {x, g->AddConstant("w1", F32({16, 16}, Random(256, 5, 0.5f)))}, {h});
  g->AddNode("Relu", "relu", {h}, {r});
  g->AddNode("MatMul", "mm2", {r, g->AddConstant("w2", F32({16, 8}, Random(128, 6, 0.5f)))}, {y});
  g->AddNode("Sigmoid", "side", {h}, {side});  // a second output, not downstream of mm2
  g->MarkOutput(y);
  g->MarkOutput(side);
  ASSERT_TRUE(InferShapes(*g).ok());
  std::vector<std::map<std::string, Tensor>> data = {{{"x", F32({4, 16}, Random(64, 1, 1.0f))}},
                                                     {{"x", F32({4, 16}, Random(64, 2, 3.0f))}}};
  auto table = precision::Calibrate(*g, cpu::EvaluateNode, data,
                                    precision::CalibrationMethod::kEntropy, 99.99);
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  std::vector<std::map<std::string, Tensor>> activations, outputs;
  for (const auto& feed : data) {
    auto values = precision::EvaluateCalibrationBatch(*g, feed, cpu::EvaluateNode);
    ASSERT_TRUE(values.ok());
    outputs.push_back({{"y", values->at("y")}, {"side", values->at("side")}});
    activations.push_back(std::move(*values));
  }
  std::vector<std::map<std::string, double>> held_out = {{{"x", 2.5}, {"r", 4.0}},
                                                         {{"x", 1.5}, {"r", 2.0}}};
  auto partial =
      precision::MeasureInt8Sensitivity(*g, cpu::EvaluateNode, activations, *table, held_out);
  ASSERT_TRUE(partial.ok()) << partial.status().ToString();
  GraphStatsEvaluator host_walk = [](const Graph& graph, const std::map<std::string, Tensor>& feed,
                                     const ValueStatsRequest& request) {
    return EvaluateValueStats(graph, feed, cpu::EvaluateNode, request);
  };
  auto rerun =
      precision::MeasureInt8SensitivityByRerun(*g, host_walk, data, outputs, *table, held_out);
  ASSERT_TRUE(rerun.ok()) << rerun.status().ToString();
  ASSERT_EQ(partial->layers.size(), 2u);
  ASSERT_EQ(rerun->layers.size(), 2u);
  for (const auto& [layer, e] : partial->layers) {
    EXPECT_GT(e, 1e-4) << layer;  // quantization moved the outputs
    EXPECT_NEAR(rerun->layers.at(layer), e, 1e-12) << layer;
  }
  EXPECT_NEAR(rerun->all_int8, partial->all_int8, 1e-12);
  EXPECT_EQ(rerun->evaluations, partial->evaluations);

  // The FP8 scheme the same way (E4M3 per tensor: inputs by their absmax, weights by theirs).
  auto partial8 = precision::MeasureInt8Sensitivity(*g, cpu::EvaluateNode, activations, *table,
                                                    held_out, precision::QuantScheme::kFp8);
  auto rerun8 = precision::MeasureInt8SensitivityByRerun(*g, host_walk, data, outputs, *table,
                                                         held_out, precision::QuantScheme::kFp8);
  ASSERT_TRUE(partial8.ok() && rerun8.ok());
  ASSERT_EQ(rerun8->layers.size(), 2u);
  for (const auto& [layer, e] : partial8->layers) {
    EXPECT_GT(e, 1e-4) << layer;
    EXPECT_NE(e, partial->layers.at(layer)) << layer;  // not the INT8 figure
    EXPECT_NEAR(rerun8->layers.at(layer), e, 1e-12) << layer;
  }
  EXPECT_NEAR(rerun8->all_int8, partial8->all_int8, 1e-12);

  // Calibrate with the walk takes that path and agrees with the one without.
  auto walked = precision::Calibrate(
      *g, cpu::EvaluateNode, data, precision::CalibrationMethod::kEntropy, 99.99, true, host_walk);
  ASSERT_TRUE(walked.ok()) << walked.status().ToString();
  ASSERT_EQ(walked->int8_sensitivity.size(), table->int8_sensitivity.size());
  for (const auto& [layer, e] : table->int8_sensitivity) {
    EXPECT_NEAR(walked->int8_sensitivity.at(layer), e, 1e-12) << layer;
  }
  EXPECT_NEAR(walked->int8_all_rel_l2, table->int8_all_rel_l2, 1e-12);
  EXPECT_TRUE(walked->fp8_sensitivity.empty());
  EXPECT_EQ(walked->fp8_all_rel_l2, -1);
  // With the FP8 figures asked for, both paths give them too.
  auto both = precision::Calibrate(*g, cpu::EvaluateNode, data,
                                   precision::CalibrationMethod::kEntropy, 99.99, true, {}, true);
  auto both_walked =
      precision::Calibrate(*g, cpu::EvaluateNode, data, precision::CalibrationMethod::kEntropy,
                           99.99, true, host_walk, true);
  ASSERT_TRUE(both.ok() && both_walked.ok());
  ASSERT_EQ(both->fp8_sensitivity.size(), 2u);
  for (const auto& [layer, e] : both->fp8_sensitivity) {
    EXPECT_GT(e, 1e-4) << layer;
    EXPECT_NEAR(both_walked->fp8_sensitivity.at(layer), e, 1e-12) << layer;
  }
  EXPECT_GT(both->fp8_all_rel_l2, 0);
  EXPECT_NEAR(both_walked->fp8_all_rel_l2, both->fp8_all_rel_l2, 1e-12);
  // Bad arguments are an internal error, not a wrong answer.
  EXPECT_EQ(
      precision::MeasureInt8SensitivityByRerun(*g, host_walk, data, {}, *table).status().code(),
      ErrorCode::kInternal);
}

// Without the sensitivity (FP8 alone, --int8-tolerance off): the same ranges from the first pass's
// node runs only, no sensitivity figures.
TEST(Int8Sensitivity, CalibrationCanSkipItWithTheSameRanges) {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, MakeShape({4, 16}));
  Value *h = g->AddValue("h"), *y = g->AddValue("y");
  g->AddNode("MatMul", "mm1", {x, g->AddConstant("w1", F32({16, 16}, Random(256, 5, 0.5f)))}, {h});
  g->AddNode("MatMul", "mm2", {h, g->AddConstant("w2", F32({16, 8}, Random(128, 6, 0.5f)))}, {y});
  g->MarkOutput(y);
  ASSERT_TRUE(InferShapes(*g).ok());
  std::vector<std::map<std::string, Tensor>> data = {{{"x", F32({4, 16}, Random(64, 1, 1.0f))}},
                                                     {{"x", F32({4, 16}, Random(64, 2, 2.0f))}}};
  int runs = 0;
  NodeEvaluator counting = [&](const Node& n, std::span<const Tensor* const> in) {
    ++runs;
    return cpu::EvaluateNode(n, in);
  };
  auto with =
      precision::Calibrate(*g, counting, data, precision::CalibrationMethod::kMinMax, 99.99);
  ASSERT_TRUE(with.ok()) << with.status().ToString();
  const int runs_with = runs;
  runs = 0;
  auto without = precision::Calibrate(*g, counting, data, precision::CalibrationMethod::kMinMax,
                                      99.99, /*int8_sensitivity=*/false);
  ASSERT_TRUE(without.ok()) << without.status().ToString();
  EXPECT_EQ(runs, 4);  // two nodes, two data sets, one pass (minmax)
  EXPECT_GT(runs_with, runs);
  EXPECT_EQ(with->int8_sensitivity.size(), 2u);
  EXPECT_TRUE(without->int8_sensitivity.empty());
  EXPECT_EQ(without->int8_all_rel_l2, -1);
  ASSERT_EQ(with->ranges.size(), without->ranges.size());
  for (const auto& [name, r] : with->ranges) {
    EXPECT_EQ(without->ranges.at(name).absmax, r.absmax) << name;
    EXPECT_EQ(without->ranges.at(name).amax, r.amax) << name;
  }
}

// x[4,16] -> MatMul "sensitive" -> h -> MatMul "robust" -> y. The calibration inputs' column 0 is
// zero and w1's row 0 is 1000x the others: every column's per-channel scale is set by that row,
// so the weights that matter quantize to zero and "sensitive" alone loses the whole output.
// "robust" has plain weights: about 1% error.
std::unique_ptr<Graph> SensitiveThenRobust() {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, MakeShape({4, 16}));
  Value *h = g->AddValue("h"), *y = g->AddValue("y");
  std::vector<float> w1 = Random(256, 11, 0.5f);
  for (int n = 0; n < 16; ++n) w1[n] = (n % 2 ? 1000.f : -1000.f) * (0.5f + 0.01f * n);
  g->AddNode("MatMul", "sensitive", {x, g->AddConstant("w1", F32({16, 16}, w1))}, {h});
  g->AddNode("MatMul", "robust", {h, g->AddConstant("w2", F32({16, 8}, Random(128, 12, 0.5f)))},
             {y});
  g->MarkOutput(y);
  EXPECT_TRUE(InferShapes(*g).ok());
  return g;
}

// Rows 0-2 random; row 3 the same in every batch and larger, so that every batch has the same
// ranges and scales fitted to one batch fit the others (the sensitivity is measured leave one
// batch out).
Tensor InputWithDeadColumn(uint64_t seed) {
  std::vector<float> v = Random(48, seed, 1.0f);
  std::vector<float> shared = Random(16, 7, 2.0f);
  v.insert(v.end(), shared.begin(), shared.end());
  for (int r = 0; r < 4; ++r) v[r * 16] = 0.f;
  return F32({4, 16}, v);
}

struct Built {
  BuildReport report;
  std::vector<std::byte> bytes;
  double rel_l2 = 0;  // against the FP32 reference on a fresh input
};

Built Build(const BuilderConfig& c) {
  Built b;
  std::map<std::string, Tensor> in = {{"x", InputWithDeadColumn(99)}};
  auto ref = cpu::EvaluateGraph(*SensitiveThenRobust(), in);
  EXPECT_TRUE(ref.ok());
  std::unique_ptr<EngineDesc> engine;
  auto out = testing::BuildAndRun(SensitiveThenRobust(), c, in, &b.report, &engine);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  if (!out.ok() || !ref.ok()) return b;
  b.rel_l2 = testing::RelL2(out->at("y"), ref->at("y"));
  auto bytes = SerializeEngine(*engine);
  EXPECT_TRUE(bytes.ok());
  if (bytes.ok()) b.bytes = std::move(*bytes);
  return b;
}

const LayerReport& Layer(const BuildReport& r, const std::string& name) {
  for (const auto& l : r.layer_reports) {
    if (l.name == name) return l;
  }
  static const LayerReport kNone;
  ADD_FAILURE() << "no layer " << name;
  return kNone;
}

BuilderConfig Int8Config(const std::string& calib_dir) {
  BuilderConfig c;
  c.int8 = true;
  c.calibration_dir = calib_dir;
  c.int8_tolerance = 0.05;  // "robust" measures about 1%, "sensitive" about 100%
  c.optimize = false;
  // Nothing timed: the same inputs must give the same bytes (timings would differ run to run).
  c.search_tactics = false;
  return c;
}

std::string CalibrationDir() {
  std::string dir = testing::TempDir("int8_sensitivity_calib");
  testing::WriteDataSets(dir, {{InputWithDeadColumn(1)}, {InputWithDeadColumn(2)}});
  return dir;
}

TEST(Int8Sensitivity, SensitiveLayerFallsBackInsensitiveOneStaysInt8) {
  const std::string dir = CalibrationDir();
  // The measured figures, as the build sees them.
  auto g = SensitiveThenRobust();
  auto data = LoadCalibrationData(*g, {}, dir);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  auto table = precision::Calibrate(*g, cpu::EvaluateNode, *data,
                                    precision::CalibrationMethod::kMinMax, 99.99);
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  ASSERT_EQ(table->int8_sensitivity.size(), 2u);
  const double sensitive = table->int8_sensitivity.at("sensitive");
  const double robust = table->int8_sensitivity.at("robust");
  EXPECT_GT(sensitive, 0.5);
  EXPECT_GT(robust, 1e-4);
  EXPECT_LT(robust, 3e-2);
  EXPECT_GE(table->int8_all_rel_l2, sensitive * 0.9);
  const auto plan = precision::PlanInt8Fallback(*table, {"sensitive", "robust"}, 0.05);
  EXPECT_GE(plan.estimate, robust);

  Built b = Build(Int8Config(dir));
  const LayerReport& s = Layer(b.report, "sensitive");
  EXPECT_EQ(s.precision, "f16");
  EXPECT_EQ(s.precision_reason.rfind(
                fmt::format("f16: int8 sensitivity rel-L2 {:.3g} alone; ", sensitive), 0),
            0u)
      << s.precision_reason;
  EXPECT_NE(s.precision_reason.find("> tolerance 0.05"), std::string::npos) << s.precision_reason;
  const LayerReport& r = Layer(b.report, "robust");
  EXPECT_EQ(r.precision, "i8");
  EXPECT_TRUE(r.tactic.starts_with("i8-")) << r.tactic;
  EXPECT_NE(r.precision_reason.find(fmt::format("int8 sensitivity rel-L2 {:.3g}, INT8 layers' "
                                                "estimated rel-L2 {:.3g} <= tolerance 0.05",
                                                robust, plan.estimate)),
            std::string::npos)
      << r.precision_reason;
  EXPECT_EQ(b.report.precision_counts["i8"], 1);
  // The engine keeps the accuracy the plan promised; with every layer INT8 it is lost.
  EXPECT_LT(b.rel_l2, 3e-2);
  EXPECT_GT(b.rel_l2, 1e-5);

  BuilderConfig off = Int8Config(dir);
  off.int8_tolerance = HUGE_VAL;
  Built all = Build(off);
  EXPECT_EQ(Layer(all.report, "sensitive").precision, "i8");
  EXPECT_EQ(Layer(all.report, "robust").precision, "i8");
  EXPECT_GT(all.rel_l2, 0.5);

  // A tolerance above the all-INT8 figure keeps both too; the config hash tells them apart.
  BuilderConfig loose = Int8Config(dir);
  loose.int8_tolerance = 2 * table->int8_all_rel_l2;
  EXPECT_EQ(Build(loose).report.precision_counts["i8"], 2);
  EXPECT_NE(loose.Hash(), Int8Config(dir).Hash());
  EXPECT_NE(off.Hash(), Int8Config(dir).Hash());
}

TEST(Int8Sensitivity, BuildsAreByteIdenticalWithAndWithoutTheCache) {
  const std::string dir = CalibrationDir();
  BuilderConfig c = Int8Config(dir);
  c.calibration_cache_path = testing::TempDir("int8_sensitivity_cache") + "/calib.json";
  Built first = Build(c);   // calibrates, writes the cache
  Built second = Build(c);  // from the cache: no reference run at all
  std::filesystem::remove(c.calibration_cache_path);
  Built third = Build(c);  // calibrates again
  EXPECT_EQ(first.report.calibration_batches_run, 2);
  EXPECT_EQ(third.report.calibration_batches_run, 2);
  EXPECT_EQ(second.report.calibration_batches_run, 0);
  EXPECT_EQ(Layer(second.report, "sensitive").precision, "f16");
  ASSERT_FALSE(first.bytes.empty());
  EXPECT_TRUE(first.bytes == second.bytes);
  EXPECT_TRUE(first.bytes == third.bytes);
}

}  // namespace
}  // namespace kiln
