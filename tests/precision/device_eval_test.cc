// backends/device_eval.h on every backend built here (the CPU; CUDA, which skips without a GPU):
// values against the reference evaluator, what stays resident and what is uploaded again, the
// residency bound, copy-on-write safety, and calibration through it against the reference's.
#include "kiln/backends/device_eval.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "kiln/backends/cpu/cpu_eval.h"
#include "kiln/ir/evaluator.h"
#include "kiln/onnx/calibration_data.h"
#include "kiln/onnx/onnx_import.h"
#include "kiln/ops/op_schema.h"
#include "kiln/passes/pass.h"
#include "kiln/precision/calibration.h"
#include "tests/precision/test_util.h"

namespace kiln {
namespace {

using testing::F32;
using testing::Random;

// conv -> relu -> global pool -> flatten -> gemm -> softmax, plus a reshape from a shape operand.
std::unique_ptr<Graph> SmallNet() {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, MakeShape({2, 3, 8, 8}));
  Value* c = g->AddValue("c");
  Value* r = g->AddValue("r");
  Value* p = g->AddValue("p");
  Value* f = g->AddValue("f");
  Value* y = g->AddValue("y");
  Value* s = g->AddValue("s");
  Value* t = g->AddValue("t");
  Node* conv = g->AddNode("Conv", "conv",
                          {x, g->AddConstant("w", F32({4, 3, 3, 3}, Random(108, 11, 0.5f))),
                           g->AddConstant("b", F32({4}, Random(4, 12, 0.1f)))},
                          {c});
  conv->mutable_attrs().Set("pads", Attribute(std::vector<int64_t>{1, 1, 1, 1}));
  g->AddNode("Relu", "relu", {c}, {r});
  g->AddNode("GlobalAveragePool", "pool", {r}, {p});
  g->AddNode("Flatten", "flatten", {p}, {f});
  g->AddNode("Gemm", "fc",
             {f, g->AddConstant("fw", F32({4, 5}, Random(20, 13, 0.5f))),
              g->AddConstant("fb", F32({5}, Random(5, 14, 0.1f)))},
             {y});
  g->AddNode("Softmax", "softmax", {y}, {s});
  g->AddNode(
      "Reshape", "reshape",
      {s, g->AddConstant("shape", Tensor::FromVector<int64_t>(DataType::kInt64, {2}, {5, 2}))},
      {t});
  g->MarkOutput(t);
  g->MarkOutput(y);
  EXPECT_TRUE(InferShapes(*g).ok());
  return g;
}

std::map<std::string, Tensor> Feed(uint64_t seed) {
  return {{"x", F32({2, 3, 8, 8}, Random(384, seed, 2.0f))}};
}

// FP32 on a device sums in another order than the CPU reference.
constexpr double kTol = 1e-5;

void ExpectClose(const std::map<std::string, Tensor>& got,
                 const std::map<std::string, Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.contains(name)) << name;
    const Tensor& a = got.at(name);
    ASSERT_EQ(a.dims(), w.dims()) << name;
    ASSERT_EQ(a.dtype(), w.dtype()) << name;
    if (IsFloat(w.dtype())) {
      EXPECT_LE(testing::RelL2(a, w), kTol) << name;
    } else {
      EXPECT_EQ(a.ToInt64Vector(), w.ToInt64Vector()) << name;
    }
  }
}

// A zoo model after the build's passes, and its calibration data sets.
void LoadOptimizedZooModel(const std::string& model, std::unique_ptr<Graph>* graph,
                           std::vector<std::map<std::string, Tensor>>* data) {
  auto imported = ImportOnnxFile(testing::ZooDir(model) + "/model.onnx");
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  passes::PassOptions po;
  po.evaluator = cpu::EvaluateNode;
  ASSERT_TRUE(passes::RunDefaultPasses(**imported, po).ok());
  auto sets = LoadCalibrationData(**imported, {}, testing::ZooDir(model));
  ASSERT_TRUE(sets.ok()) << sets.status().ToString();
  *graph = std::move(*imported);
  *data = std::move(*sets);
}

class DeviceEvaluatorTest : public ::testing::TestWithParam<BackendKind> {
 protected:
  std::unique_ptr<DeviceEvaluator> Make(DeviceEvalOptions options = {}) {
    auto dev = DeviceEvaluator::Create(GetParam(), options);
    if (!dev.ok()) return nullptr;
    return std::move(*dev);
  }
};

#define MAKE_OR_SKIP(dev, ...)                                                      \
  auto dev = Make(__VA_ARGS__);                                                     \
  if (!dev) {                                                                       \
    if (GetParam() == BackendKind::kCpu) FAIL() << "the CPU backend must be there"; \
    GTEST_SKIP() << "no " << ToString(GetParam()) << " device here";                \
  }

TEST_P(DeviceEvaluatorTest, ValuesMatchTheReferenceAndStayResidentBetweenBatches) {
  auto g = SmallNet();
  MAKE_OR_SKIP(dev);
  NodeEvaluator eval = dev->AsNodeEvaluator();

  auto want = EvaluateAllValues(*g, Feed(1), cpu::EvaluateNode);
  ASSERT_TRUE(want.ok());
  auto got = EvaluateAllValues(*g, Feed(1), eval);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ExpectClose(*got, *want);

  const DeviceEvalStats first = dev->stats();
  EXPECT_EQ(first.nodes_on_device, 7) << "on the host: " << first.nodes_on_host;
  EXPECT_EQ(first.nodes_on_host, 0);
  EXPECT_EQ(first.kernels_created, 7);
  // Uploaded: x and the five constants (the small shape operand too, as data); every activation
  // a node read came from the node before it.
  EXPECT_EQ(first.uploads, 6);
  EXPECT_EQ(first.resident_hits, 6);  // c, r, p, f, y, s
  EXPECT_EQ(first.downloads, 7);

  // A second batch: the kernels and the weights are reused; only x is uploaded.
  auto want2 = EvaluateAllValues(*g, Feed(2), cpu::EvaluateNode);
  auto got2 = EvaluateAllValues(*g, Feed(2), eval);
  ASSERT_TRUE(got2.ok()) << got2.status().ToString();
  ExpectClose(*got2, *want2);
  const DeviceEvalStats& second = dev->stats();
  EXPECT_EQ(second.kernels_created, 7);
  EXPECT_EQ(second.kernel_cache_hits, 7);
  EXPECT_EQ(second.uploads, 7);
  EXPECT_EQ(second.resident_hits, 6 + 11);  // the weights too, now
}

TEST_P(DeviceEvaluatorTest, ABoundOnResidentBytesEvictsAndKeepsTheValues) {
  auto g = SmallNet();
  DeviceEvalOptions options;
  options.max_resident_bytes = 1024;  // less than x alone (1536 bytes)
  MAKE_OR_SKIP(dev, options);
  for (uint64_t seed : {3, 4, 5}) {
    auto want = EvaluateAllValues(*g, Feed(seed), cpu::EvaluateNode);
    auto got = EvaluateAllValues(*g, Feed(seed), dev->AsNodeEvaluator());
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ExpectClose(*got, *want);
    // Only the operands of the node being run may go past the bound, and not beyond the call.
    EXPECT_LE(dev->resident_bytes(), options.max_resident_bytes + 1536 + 512);
  }
  EXPECT_GT(dev->stats().evictions, 0);
}

// A tensor it computed, written afterwards by its holder, is read as written: the host write goes
// to a fresh buffer (copy on write, since the evaluator holds the storage), never past the device
// copy.
TEST_P(DeviceEvaluatorTest, AHostWriteAfterwardsIsNotHiddenByTheDeviceCopy) {
  auto g = SmallNet();
  MAKE_OR_SKIP(dev);
  const Node* relu = nullptr;
  const Node* conv = nullptr;
  for (const Node* n : g->nodes()) {
    if (n->name() == "relu") relu = n;
    if (n->name() == "conv") conv = n;
  }
  ASSERT_TRUE(relu && conv);
  Tensor x = Feed(6).at("x");
  std::vector<const Tensor*> conv_in = {&x, conv->input(1)->constant(), conv->input(2)->constant()};
  auto c = dev->Evaluate(*conv, conv_in);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Tensor changed = (*c)[0];
  float* data = static_cast<float*>(changed.mutable_raw());
  for (int64_t i = 0; i < changed.num_elements(); ++i) data[i] = (i % 2 ? -1.f : 3.f);
  ASSERT_NE(changed.raw(), (*c)[0].raw());
  const Tensor* relu_in[] = {&changed};
  auto r = dev->Evaluate(*relu, relu_in);
  ASSERT_TRUE(r.ok());
  const float* out = (*r)[0].data<float>();
  for (int64_t i = 0; i < changed.num_elements(); ++i) {
    ASSERT_EQ(out[i], i % 2 ? 0.f : 3.f) << i;
  }
}

// Two tensors at the same host bytes with different lengths (a borrowed prefix): each is read as
// itself, and the copy kept is the latest one (the older is replaced, not leaked beside it).
TEST_P(DeviceEvaluatorTest, ABorrowedPrefixOfAKeptTensorIsReadAsItself) {
  auto g = SmallNet();
  MAKE_OR_SKIP(dev);
  const Node* relu = nullptr;
  for (const Node* n : g->nodes()) {
    if (n->name() == "relu") relu = n;
  }
  ASSERT_TRUE(relu);
  Tensor whole = F32({8}, {-1, 2, -3, 4, -5, 6, -7, 8});
  Tensor prefix = Tensor::Borrow(DataType::kFloat32, {4}, whole.raw(), whole.storage());
  const Tensor* in_whole[] = {&whole};
  const Tensor* in_prefix[] = {&prefix};
  auto a = dev->Evaluate(*relu, in_whole);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(dev->resident_bytes(), 64u);  // whole and its output
  auto b = dev->Evaluate(*relu, in_prefix);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*b)[0].ToFloatVector(), (std::vector<float>{0, 2, 0, 4}));
  EXPECT_EQ(dev->resident_bytes(), 64u);  // the prefix replaced whole (16), and its output (16)
  auto c = dev->Evaluate(*relu, in_whole);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[0].ToFloatVector(), (std::vector<float>{0, 2, 0, 4, 0, 6, 0, 8}));
}

// Calibration (statistics, then INT8 sensitivity's partial evaluations) through the device
// evaluator gives the reference's table on a zoo model after the build's passes.
TEST_P(DeviceEvaluatorTest, CalibrationOfAZooModelMatchesTheReference) {
  MAKE_OR_SKIP(dev);
  std::unique_ptr<Graph> graph;
  std::vector<std::map<std::string, Tensor>> data;
  ASSERT_NO_FATAL_FAILURE(LoadOptimizedZooModel("resnet_tiny", &graph, &data));
  ASSERT_GE(data.size(), 2u);

  auto want = precision::Calibrate(*graph, cpu::EvaluateNode, data,
                                   precision::CalibrationMethod::kEntropy, 99.99);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  auto got = precision::Calibrate(*graph, dev->AsNodeEvaluator(), data,
                                  precision::CalibrationMethod::kEntropy, 99.99);
  ASSERT_TRUE(got.ok()) << got.status().ToString();

  ASSERT_EQ(got->ranges.size(), want->ranges.size());
  for (const auto& [name, r] : want->ranges) {
    const precision::TensorRange* g = got->Find(name);
    ASSERT_NE(g, nullptr) << name;
    EXPECT_NEAR(g->absmax, r.absmax, 1e-5 * std::max(1.0, r.absmax)) << name;
    EXPECT_NEAR(g->amax, r.amax, 1e-3 * std::max(1.0, r.amax)) << name;
  }
  ASSERT_FALSE(want->int8_sensitivity.empty());
  ASSERT_EQ(got->int8_sensitivity.size(), want->int8_sensitivity.size());
  for (const auto& [layer, s] : want->int8_sensitivity) {
    EXPECT_NEAR(got->int8_sensitivity.at(layer), s, 1e-4 + 1e-3 * s) << layer;
  }
  EXPECT_NEAR(got->int8_all_rel_l2, want->int8_all_rel_l2, 1e-4 + 1e-3 * want->int8_all_rel_l2);
  // The partial evaluations reused the first pass's kernels and device copies.
  const DeviceEvalStats& st = dev->stats();
  EXPECT_EQ(st.nodes_on_host, 0);
  EXPECT_GT(st.kernel_cache_hits, st.kernels_created);
  EXPECT_GT(st.resident_hits, st.uploads);
}

// The same with the passes run by the device's graph walk (what the builder does), with and
// without the sensitivity (which keeps every activation of the first pass on the host).
TEST_P(DeviceEvaluatorTest, CalibrationThroughTheGraphWalkMatchesTheReference) {
  MAKE_OR_SKIP(dev);
  std::unique_ptr<Graph> graph;
  std::vector<std::map<std::string, Tensor>> data;
  ASSERT_NO_FATAL_FAILURE(LoadOptimizedZooModel("resnet_tiny", &graph, &data));

  for (bool sensitivity : {true, false}) {
    SCOPED_TRACE(sensitivity ? "with the sensitivity" : "without");
    auto want = precision::Calibrate(*graph, cpu::EvaluateNode, data,
                                     precision::CalibrationMethod::kEntropy, 99.99, sensitivity);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    auto got = precision::Calibrate(*graph, dev->AsNodeEvaluator(), data,
                                    precision::CalibrationMethod::kEntropy, 99.99, sensitivity,
                                    dev->AsGraphStatsEvaluator());
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->ranges.size(), want->ranges.size());
    for (const auto& [name, r] : want->ranges) {
      const precision::TensorRange* g = got->Find(name);
      ASSERT_NE(g, nullptr) << name;
      EXPECT_NEAR(g->absmax, r.absmax, 1e-5 * std::max(1.0, r.absmax)) << name;
      EXPECT_NEAR(g->amax, r.amax, 1e-3 * std::max(1.0, r.amax)) << name;
    }
    ASSERT_EQ(got->int8_sensitivity.size(), want->int8_sensitivity.size());
    EXPECT_EQ(got->int8_sensitivity.empty(), !sensitivity);
    for (const auto& [layer, s] : want->int8_sensitivity) {
      EXPECT_NEAR(got->int8_sensitivity.at(layer), s, 1e-4 + 1e-3 * s) << layer;
    }
  }
  EXPECT_EQ(dev->stats().nodes_on_host, 0);
}

// What calibration's passes ask of a whole graph (GraphStatsEvaluator), against the host walk
// over the reference; a second call reuses the first one's buffers, and on a device only the
// numbers and the kept values come back.
TEST_P(DeviceEvaluatorTest, GraphStatsMatchTheHostWalk) {
  auto g = SmallNet();
  MAKE_OR_SKIP(dev);
  ValueStatsRequest request;
  request.absmax = {"x", "c", "r", "p", "f", "y", "s", "t"};
  request.keep = {"t", "y"};
  request.bins = 64;
  auto want_range = EvaluateValueStats(*g, Feed(7), cpu::EvaluateNode, request);
  ASSERT_TRUE(want_range.ok()) << want_range.status().ToString();
  for (const char* name : {"c", "r", "f"}) request.histograms[name] = want_range->absmax.at(name);

  for (uint64_t seed : {7, 8}) {
    const int64_t downloaded = dev->stats().download_bytes;
    auto want = EvaluateValueStats(*g, Feed(seed), cpu::EvaluateNode, request);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    auto got = dev->EvaluateStats(*g, Feed(seed), request);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->absmax.size(), 8u);
    for (const auto& [name, m] : want->absmax) {
      EXPECT_NEAR(got->absmax.at(name), m, 1e-5 * std::max(1.0, m)) << name;
    }
    ASSERT_EQ(got->histograms.size(), 3u);
    for (const auto& [name, counts] : want->histograms) {
      const std::vector<double>& h = got->histograms.at(name);
      ASSERT_EQ(h.size(), 64u) << name;
      double total = 0, off = 0;
      for (size_t b = 0; b < h.size(); ++b) {
        total += h[b];
        off += std::fabs(h[b] - counts[b]);
      }
      // Every element counted (none is NaN here); a value on a bin edge may round to either side.
      EXPECT_EQ(total, std::accumulate(counts.begin(), counts.end(), 0.0)) << name;
      EXPECT_LE(off, 4) << name;
    }
    ExpectClose(got->kept, want->kept);
    if (GetParam() != BackendKind::kCpu) {
      // The two kept values (t: 10 floats, y: 10) and the numbers: 8 absmax slots, 3 x 64 counts.
      EXPECT_LE(dev->stats().download_bytes - downloaded, 80 + 8 * 4 + 3 * 64 * 8);
    }
  }
  EXPECT_GT(dev->stats().pool_hits, 0);
  EXPECT_EQ(dev->stats().nodes_on_host, 0);
}

// The reductions themselves: on values a device computes bit for bit as the host (a copy and
// casts), NaN, infinities, zeros and values past the range included, the device's absmax and
// counts equal the host's exactly, in every float type, and so does the INT8 sensitivity's
// quantize-dequantize.
TEST_P(DeviceEvaluatorTest, DeviceReductionsEqualTheHostsExactly) {
  constexpr int64_t kN = 100003;
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, MakeShape({kN}));
  Value* a = g->AddValue("a");
  Value* h = g->AddValue("h");
  Value* b = g->AddValue("b");
  g->AddNode("Identity", "copy", {x}, {a});
  g->AddNode("Cast", "to_f16", {a}, {h})
      ->mutable_attrs()
      .Set("to", static_cast<int64_t>(10));  // FLOAT16
  g->AddNode("Cast", "to_bf16", {a}, {b})
      ->mutable_attrs()
      .Set("to", static_cast<int64_t>(16));  // BFLOAT16
  // The INT8 sensitivity's quantized operand: the copy's input quantized with amax 2.5 (so 3.0 and
  // past it saturate), in FP32 and FP16.
  Value* q = g->AddValue("q");
  Value* qh = g->AddValue("qh");
  const Node* fq = g->AddNode("Identity", "fq", {a}, {q});
  const Node* fqh = g->AddNode("Identity", "fqh", {h}, {qh});
  // And the FP8 sensitivity's: E4M3 per tensor with amax 2.5 (past it: 448 * scale = 2.5).
  Value* q8 = g->AddValue("q8");
  const Node* fq8 = g->AddNode("Identity", "fq8", {a}, {q8});
  g->MarkOutput(q8);
  g->MarkOutput(q);
  g->MarkOutput(qh);
  g->MarkOutput(h);
  g->MarkOutput(b);
  ASSERT_TRUE(InferShapes(*g).ok());

  std::vector<float> v = Random(kN, 21, 4.0f);
  const float inf = std::numeric_limits<float>::infinity();
  v[0] = std::numeric_limits<float>::quiet_NaN();
  v[1] = inf;
  v[2] = -inf;
  v[3] = 0.0f;
  v[4] = -0.0f;
  v[5] = 1e-40f;  // subnormal
  v[6] = 3.0f;    // exactly the range: the last bin
  v[kN - 1] = -1e30f;
  std::map<std::string, Tensor> feed = {{"x", F32({kN}, v)}};

  MAKE_OR_SKIP(dev);
  ValueStatsRequest request;
  request.absmax = {"x", "a", "h", "b"};
  request.bins = 2048;
  for (const char* name : {"a", "h", "b"}) request.histograms[name] = 3.0;
  request.keep = {"q", "qh"};
  request.overrides[fq].int8_amax = 2.5f;
  request.overrides[fqh].int8_amax = 2.5f;
  request.overrides[fq8].fp8_amax = 2.5f;
  request.keep.insert("q8");
  auto want = EvaluateValueStats(*g, feed, cpu::EvaluateNode, request);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  auto got = dev->EvaluateStats(*g, feed, request);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->absmax, want->absmax);
  EXPECT_TRUE(std::isinf(got->absmax.at("a")));
  for (const char* name : {"q", "qh", "q8"}) {
    const Tensor& w = want->kept.at(name);
    const Tensor& d = got->kept.at(name);
    ASSERT_EQ(d.dtype(), w.dtype()) << name;
    ASSERT_EQ(d.size_bytes(), w.size_bytes()) << name;
    EXPECT_EQ(std::memcmp(d.raw(), w.raw(), w.size_bytes()), 0) << name;
  }
  EXPECT_FLOAT_EQ(want->kept.at("q").ToFloatVector()[0], 2.5f);  // NaN saturates to 127 * scale
  EXPECT_FLOAT_EQ(want->kept.at("q").ToFloatVector()[kN - 1], -2.5f);
  EXPECT_TRUE(std::isnan(want->kept.at("q8").ToFloatVector()[0]));  // NaN stays NaN in E4M3
  EXPECT_FLOAT_EQ(want->kept.at("q8").ToFloatVector()[kN - 1], -2.5f);
  for (const char* name : {"a", "h", "b"}) {
    const std::vector<double>& counts = want->histograms.at(name);
    EXPECT_EQ(got->histograms.at(name), counts) << name;
    // NaN and the infinities are not counted (in FP16, -1e30 is one more); 3.0 and the values
    // past it are in the last bin.
    const double counted = std::string(name) == "h" ? kN - 4.0 : kN - 3.0;
    EXPECT_EQ(std::accumulate(counts.begin(), counts.end(), 0.0), counted) << name;
    EXPECT_GE(counts.back(), 2.0) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceEvaluatorTest,
                         ::testing::Values(BackendKind::kCpu, BackendKind::kCuda),
                         [](const ::testing::TestParamInfo<BackendKind>& info) {
                           return std::string(ToString(info.param));
                         });

}  // namespace
}  // namespace kiln
