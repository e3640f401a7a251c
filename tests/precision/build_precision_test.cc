// Precision through BuildEngine: INT8 and FP8 assignment with test-only providers, the calibration
// cache across builds (reuse, corrupt and foreign files), calibration input errors, and
// determinism with --fp16.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "kiln/backends/cpu/cpu_eval.h"
#include "kiln/backends/fp8_quant.h"
#include "kiln/builder/builder.h"
#include "kiln/engine/engine_file.h"
#include "kiln/onnx/onnx_import.h"
#include "kiln/ops/op_schema.h"
#include "kiln/precision/precision.h"
#include "tests/precision/test_util.h"

namespace kiln {
namespace {

using testing::F32;
using testing::Random;

// A reference INT8 MatMul [M,K] x const [K,N] following the contract: input 0 quantized with
// scale amax/127 (symmetric, saturating), weights per output channel (column) with their own
// absmax/127, int32 accumulation, float (f32/f16) in and out.
class FakeInt8MatMul final : public KernelProvider {
 public:
  std::string_view id() const override { return "test.i8.matmul"; }
  std::string_view op_type() const override { return "MatMul"; }
  BackendKind backend() const override { return BackendKind::kCpu; }
  std::vector<TacticConfig> Tactics(const KernelRequest& r) const override {
    if (!r.node->attrs().Has(std::string(precision::kInt8InputAmaxAttr))) return {};
    if (r.inputs.size() != 2 || !r.inputs[1].constant || r.inputs[0].shape.size() != 2 ||
        r.inputs[1].constant->dims().size() != 2) {
      return {};  // 2-D x and 2-D weights only, like the CPU backend's INT8 kernels
    }
    return {{"i8-matmul-cpu-test-reference", {}, 0}};
  }
  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& r,
                                           const TacticConfig&) const override {
    struct K final : Kernel {
      float in_scale = 1;
      int64_t k = 0, n = 0;
      std::vector<int8_t> w;
      std::vector<float> w_scale;
      Status Run(const KernelRunArgs& a) override {
        const TensorView& x = a.inputs[0];
        const int64_t m = x.dims[0];
        std::vector<int8_t> q(static_cast<size_t>(m * k));
        for (int64_t i = 0; i < m * k; ++i) {
          q[i] = static_cast<int8_t>(
              std::clamp(std::nearbyint(LoadAsDouble(x, i) / in_scale), -127.0, 127.0));
        }
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            int32_t acc = 0;
            for (int64_t p = 0; p < k; ++p) acc += int32_t(q[i * k + p]) * w[p * n + j];
            StoreFromDouble(a.outputs[0], i * n + j, double(acc) * in_scale * w_scale[j]);
          }
        }
        return OkStatus();
      }
    };
    auto kernel = std::make_unique<K>();
    kernel->in_scale =
        r.node->attrs().GetFloat(std::string(precision::kInt8InputAmaxAttr), 1.0f) / 127.0f;
    Tensor wf = r.inputs[1].constant->CastTo(DataType::kFloat32);
    kernel->k = wf.dims()[0];
    kernel->n = wf.dims()[1];
    kernel->w.resize(static_cast<size_t>(kernel->k * kernel->n));
    kernel->w_scale.assign(static_cast<size_t>(kernel->n), 0.0f);
    const float* wd = wf.data<float>();
    for (int64_t j = 0; j < kernel->n; ++j) {
      float mx = 0;
      for (int64_t p = 0; p < kernel->k; ++p) mx = std::max(mx, std::fabs(wd[p * kernel->n + j]));
      kernel->w_scale[j] = mx > 0 ? mx / 127.0f : 1.0f;
      for (int64_t p = 0; p < kernel->k; ++p) {
        kernel->w[p * kernel->n + j] =
            static_cast<int8_t>(std::nearbyint(wd[p * kernel->n + j] / kernel->w_scale[j]));
      }
    }
    return std::unique_ptr<Kernel>(std::move(kernel));
  }
};
KILN_REGISTER_KERNEL_PROVIDER(FakeInt8MatMul);

// A reference FP8 MatMul [M,K] x const [K,N] following the FP8 contract (backends/fp8_quant.h):
// input 0 and the weights each quantized per tensor to E4M3 with scale absmax/448, FP32
// accumulation, float (f32/f16) in and out. The CPU backend has no FP8 kernel of its own.
class FakeFp8MatMul final : public KernelProvider {
 public:
  std::string_view id() const override { return "test.f8.matmul"; }
  std::string_view op_type() const override { return "MatMul"; }
  BackendKind backend() const override { return BackendKind::kCpu; }
  std::vector<TacticConfig> Tactics(const KernelRequest& r) const override {
    if (!Fp8InputAmax(*r.node)) return {};
    if (r.inputs.size() != 2 || !r.inputs[1].constant || r.inputs[0].shape.size() != 2 ||
        r.inputs[1].constant->dims().size() != 2) {
      return {};
    }
    return {{"f8-matmul-cpu-test-reference", {}, 0}};
  }
  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& r,
                                           const TacticConfig&) const override {
    struct K final : Kernel {
      float in_scale = 1, w_scale = 1;
      int64_t k = 0, n = 0;
      std::vector<float> w;  // E4M3 values
      Status Run(const KernelRunArgs& a) override {
        const TensorView& x = a.inputs[0];
        const int64_t m = x.dims[0];
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            float acc = 0;
            for (int64_t p = 0; p < k; ++p) {
              const float q = FromE4M3(ToE4M3(float(LoadAsDouble(x, i * k + p)) / in_scale));
              acc += q * w[p * n + j];
            }
            StoreFromDouble(a.outputs[0], i * n + j, double(acc) * in_scale * w_scale);
          }
        }
        return OkStatus();
      }
    };
    auto kernel = std::make_unique<K>();
    kernel->in_scale = Fp8Scale(*Fp8InputAmax(*r.node));
    Tensor wf = r.inputs[1].constant->CastTo(DataType::kFloat32);
    kernel->k = wf.dims()[0];
    kernel->n = wf.dims()[1];
    float mx = 0;
    for (float v : wf.ToFloatVector()) mx = std::max(mx, std::fabs(v));
    kernel->w_scale = mx > 0 ? Fp8Scale(mx) : 1.f;
    for (float v : wf.ToFloatVector()) kernel->w.push_back(FromE4M3(ToE4M3(v / kernel->w_scale)));
    return std::unique_ptr<Kernel>(std::move(kernel));
  }
};
KILN_REGISTER_KERNEL_PROVIDER(FakeFp8MatMul);

// A deliberately slow INT8 MatMul, for the race between a layer's INT8 and float tactics
// (BuilderConfig::quantized_if_faster): offered only for nodes named "slow_*" with a batched
// constant weight (which the CPU's own INT8 kernels do not take), it computes the float product
// and then waits 20 ms, far slower than any float MatMul of that size.
class SlowInt8MatMul final : public KernelProvider {
 public:
  std::string_view id() const override { return "test.i8.slow_matmul"; }
  std::string_view op_type() const override { return "MatMul"; }
  BackendKind backend() const override { return BackendKind::kCpu; }
  std::vector<TacticConfig> Tactics(const KernelRequest& r) const override {
    if (!r.node->name().starts_with("slow_") ||
        !r.node->attrs().Has(std::string(precision::kInt8InputAmaxAttr))) {
      return {};
    }
    return {{"i8-matmul-cpu-test-slow", {}, 0}};
  }
  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& r,
                                           const TacticConfig&) const override {
    struct K final : Kernel {
      Tensor w;  // [B, K, N]
      Status Run(const KernelRunArgs& a) override {
        const int64_t batches = w.dims()[0], k = w.dims()[1], n = w.dims()[2];
        const int64_t m = a.inputs[0].dims[0];
        const float* wd = w.data<float>();
        for (int64_t b = 0; b < batches; ++b) {
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double acc = 0;
              for (int64_t p = 0; p < k; ++p) {
                acc += LoadAsDouble(a.inputs[0], i * k + p) * wd[(b * k + p) * n + j];
              }
              StoreFromDouble(a.outputs[0], (b * m + i) * n + j, acc);
            }
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        return OkStatus();
      }
    };
    auto kernel = std::make_unique<K>();
    kernel->w = r.inputs[1].constant->CastTo(DataType::kFloat32);
    return std::unique_ptr<Kernel>(std::move(kernel));
  }
};
KILN_REGISTER_KERNEL_PROVIDER(SlowInt8MatMul);

const LayerReport* FindLayer(const BuildReport& r, const std::string& name) {
  for (const auto& l : r.layer_reports) {
    if (l.name == name) return &l;
  }
  return nullptr;
}

// x[4,16] -> MatMul(W1) -> h -> MatMul(W2[2,16,8]) -> y[2,4,8]: the first has INT8 kernels (the
// fake one above and the CPU backend's oneDNN one); the second, a batched constant weight, has
// none (the CPU INT8 kernels take 2-D weights only), so it falls back.
std::unique_ptr<Graph> MatMulGemm() {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, MakeShape({4, 16}));
  Value *h = g->AddValue("h"), *y = g->AddValue("y");
  g->AddNode("MatMul", "mm", {x, g->AddConstant("w1", F32({16, 16}, Random(256, 1, 0.5f)))}, {h});
  g->AddNode("MatMul", "bmm", {h, g->AddConstant("w2", F32({2, 16, 8}, Random(256, 2, 0.5f)))},
             {y});
  g->MarkOutput(y);
  EXPECT_TRUE(InferShapes(*g).ok());
  return g;
}

TEST(PrecisionInt8, AnnotatedLayerTakesTheInt8KernelOthersFallBack) {
  std::string dir = testing::TempDir("int8_calib");
  std::vector<std::vector<Tensor>> sets;
  for (uint64_t s = 0; s < 4; ++s) sets.push_back({F32({4, 16}, Random(64, 100 + s, 2.0f))});
  sets[2][0].mutable_data<float>()[7] = 3.0f;  // the absmax over every set
  testing::WriteDataSets(dir, sets);
  BuilderConfig c;
  c.int8 = true;
  c.calibration_dir = dir;
  c.calibration_method = precision::CalibrationMethod::kMinMax;
  // Not the sensitivity fallback's test (sensitivity_test.cc): the outlier in set 2 alone would
  // make "mm" look sensitive to scales fitted without it.
  c.int8_tolerance = HUGE_VAL;
  c.deadline = std::chrono::milliseconds(1);
  c.optimize = false;
  std::map<std::string, Tensor> in = {{"x", F32({4, 16}, Random(64, 77, 2.0f))}};
  auto g = MatMulGemm();
  auto ref = cpu::EvaluateGraph(*g, in);
  ASSERT_TRUE(ref.ok());
  BuildReport report;
  std::unique_ptr<EngineDesc> engine;
  auto out = testing::BuildAndRun(std::move(g), c, in, &report, &engine);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const LayerReport* mm = FindLayer(report, "mm");
  EXPECT_EQ(mm->precision, "i8");
  EXPECT_TRUE(mm->tactic.starts_with("i8-matmul-cpu-")) << mm->tactic;
  EXPECT_NE(mm->precision_reason.find("i8: input 'x' amax 3 (minmax), f16 storage"),
            std::string::npos)
      << mm->precision_reason;
  const Node* node = engine->graph->FindNode("mm");
  EXPECT_FLOAT_EQ(node->attrs().GetFloat("kiln_int8_input_amax", -1), 3.0f);
  EXPECT_EQ(node->input(0)->dtype(), DataType::kFloat16);  // --int8 implies FP16 storage
  const LayerReport* bmm = FindLayer(report, "bmm");
  EXPECT_EQ(bmm->precision, "f16");
  EXPECT_EQ(bmm->precision_reason, "f16: no int8 kernel on cpu");
  EXPECT_FALSE(engine->graph->FindNode("bmm")->attrs().Has("kiln_int8_input_amax"));
  EXPECT_EQ(report.precision_counts["i8"], 1);
  // Symmetric INT8 with per-channel weights: about 1% relative error here.
  double err = testing::RelL2(out->at("y"), ref->at("y"));
  EXPECT_LT(err, 3e-2);
  EXPECT_GT(err, 1e-4);
}

TEST(PrecisionInt8, WithoutCalibrationDataInt8FallsBackWithAWarning) {
  BuilderConfig c;
  c.int8 = true;
  c.deadline = std::chrono::milliseconds(1);
  c.optimize = false;
  BuildReport report;
  ASSERT_TRUE(BuildEngine({MatMulGemm(), "t", HashString("t")}, c, &report).ok());
  EXPECT_EQ(FindLayer(report, "mm")->precision, "f16");
  EXPECT_NE(FindLayer(report, "mm")->precision_reason.find("no calibration data"),
            std::string::npos);
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_NE(report.warnings[0].find("KILN-E3007"), std::string::npos);
}

// Calibration data for MatMulGemm's x: the absmax over every set is 3.
std::string MatMulCalibration(const std::string& name) {
  std::string dir = testing::TempDir(name);
  std::vector<std::vector<Tensor>> sets;
  for (uint64_t s = 0; s < 4; ++s) sets.push_back({F32({4, 16}, Random(64, 100 + s, 2.0f))});
  sets[2][0].mutable_data<float>()[7] = 3.0f;
  testing::WriteDataSets(dir, sets);
  return dir;
}

TEST(PrecisionFp8, AnnotatedLayerTakesTheFp8KernelOthersStayFp16) {
  BuilderConfig c;
  c.fp8 = true;
  c.fp8_tolerance = HUGE_VAL;  // every FP8 layer stays (the fallback: the test below)
  c.calibration_dir = MatMulCalibration("fp8_calib");
  c.deadline = std::chrono::milliseconds(1);
  c.optimize = false;
  std::map<std::string, Tensor> in = {{"x", F32({4, 16}, Random(64, 77, 2.0f))}};
  auto g = MatMulGemm();
  auto ref = cpu::EvaluateGraph(*g, in);
  ASSERT_TRUE(ref.ok());
  BuildReport report;
  std::unique_ptr<EngineDesc> engine;
  auto out = testing::BuildAndRun(std::move(g), c, in, &report, &engine);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const LayerReport* mm = FindLayer(report, "mm");
  EXPECT_EQ(mm->precision, "f8");
  EXPECT_EQ(mm->tactic, "f8-matmul-cpu-test-reference");
  EXPECT_EQ(mm->precision_reason, "f8: input 'x' absmax 3, E4M3 per tensor, f16 storage");
  const Node* node = engine->graph->FindNode("mm");
  EXPECT_FLOAT_EQ(node->attrs().GetFloat("kiln_fp8_input_amax", -1), 3.0f);
  EXPECT_FALSE(node->attrs().Has("kiln_int8_input_amax"));
  EXPECT_EQ(node->input(0)->dtype(), DataType::kFloat16);  // --fp8 implies FP16 storage
  // The batched weight has no FP8 kernel: FP16 with the reason.
  const LayerReport* bmm = FindLayer(report, "bmm");
  EXPECT_EQ(bmm->precision, "f16");
  EXPECT_EQ(bmm->precision_reason, "f16: no fp8 kernel on cpu");
  EXPECT_FALSE(engine->graph->FindNode("bmm")->attrs().Has("kiln_fp8_input_amax"));
  EXPECT_EQ(report.precision_counts["f8"], 1);
  // E4M3 per tensor: a few percent relative error, and not none.
  double err = testing::RelL2(out->at("y"), ref->at("y"));
  EXPECT_LT(err, 8e-2);
  EXPECT_GT(err, 1e-3);
}

// The FP8 sensitivity fallback (--fp8-tolerance): measured leave one out over the four sets, the
// FP8 layer moves the output by more than the default 5e-2 and goes back to FP16 with its
// figures; a looser tolerance keeps it FP8 and says so. The table with the FP8 figures is cached
// under a key of its own.
TEST(PrecisionFp8, SensitiveLayersFallBackWithinTheTolerance) {
  BuilderConfig c;
  c.fp8 = true;
  c.calibration_dir = MatMulCalibration("fp8_fallback_calib");
  c.calibration_cache_path = testing::TempDir("fp8_fallback_cache") + "/model.calib";
  c.deadline = std::chrono::milliseconds(1);
  c.optimize = false;
  std::map<std::string, Tensor> in = {{"x", F32({4, 16}, Random(64, 78, 2.0f))}};
  auto ref = cpu::EvaluateGraph(*MatMulGemm(), in);
  ASSERT_TRUE(ref.ok());

  BuildReport strict;
  std::unique_ptr<EngineDesc> engine;
  auto out = testing::BuildAndRun(MatMulGemm(), c, in, &strict, &engine);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const LayerReport* mm = FindLayer(strict, "mm");
  EXPECT_EQ(mm->precision, "f16");
  EXPECT_TRUE(mm->precision_reason.starts_with("f16: fp8 sensitivity rel-L2 "))
      << mm->precision_reason;
  EXPECT_NE(mm->precision_reason.find("> tolerance 0.05"), std::string::npos)
      << mm->precision_reason;
  EXPECT_FALSE(engine->graph->FindNode("mm")->attrs().Has("kiln_fp8_input_amax"));
  EXPECT_EQ(strict.precision_counts["f8"], 0);
  EXPECT_LT(testing::RelL2(out->at("y"), ref->at("y")), 1e-2);  // FP16 again
  EXPECT_GT(strict.calibration_batches_run, 0);

  // The same build again takes the cache, FP8 figures and all.
  BuildReport cached;
  ASSERT_TRUE(BuildEngine({MatMulGemm(), "test", HashString("test")}, c, &cached).ok());
  EXPECT_EQ(cached.calibration_batches_run, 0)
      << (cached.warnings.empty() ? "" : cached.warnings[0]);
  EXPECT_EQ(FindLayer(cached, "mm")->precision_reason, mm->precision_reason);

  c.fp8_tolerance = 0.5;
  BuildReport loose;
  ASSERT_TRUE(BuildEngine({MatMulGemm(), "test", HashString("test")}, c, &loose).ok());
  const LayerReport* kept = FindLayer(loose, "mm");
  EXPECT_EQ(kept->precision, "f8");
  EXPECT_NE(kept->precision_reason.find("; fp8 sensitivity rel-L2 "), std::string::npos)
      << kept->precision_reason;
  EXPECT_NE(kept->precision_reason.find("<= tolerance 0.5"), std::string::npos)
      << kept->precision_reason;

  // Without the fallback the build reads no FP8 figures: the cached table, which has more than
  // it reads, serves it.
  c.fp8_tolerance = HUGE_VAL;
  BuildReport off;
  ASSERT_TRUE(BuildEngine({MatMulGemm(), "test", HashString("test")}, c, &off).ok());
  EXPECT_EQ(off.calibration_batches_run, 0);
  EXPECT_TRUE(off.warnings.empty()) << off.warnings[0];
  EXPECT_EQ(FindLayer(off, "mm")->precision, "f8");
  // The other way round a table without the FP8 figures cannot serve a fallback: it calibrates
  // (and warns that the cache is for another key).
  std::filesystem::remove(c.calibration_cache_path);
  ASSERT_TRUE(BuildEngine({MatMulGemm(), "test", HashString("test")}, c, &off).ok());
  c.fp8_tolerance = 0.05;
  BuildReport again;
  ASSERT_TRUE(BuildEngine({MatMulGemm(), "test", HashString("test")}, c, &again).ok());
  EXPECT_GT(again.calibration_batches_run, 0);
  EXPECT_EQ(FindLayer(again, "mm")->precision_reason, mm->precision_reason);
}

TEST(PrecisionFp8, WithInt8TheInt8KernelComesFirst) {
  BuilderConfig c;
  c.int8 = true;
  c.fp8 = true;
  c.int8_tolerance = HUGE_VAL;
  c.calibration_dir = MatMulCalibration("int8_fp8_calib");
  c.deadline = std::chrono::milliseconds(1);
  c.optimize = false;
  BuildReport report;
  ASSERT_TRUE(BuildEngine({MatMulGemm(), "t", HashString("t")}, c, &report).ok());
  EXPECT_EQ(FindLayer(report, "mm")->precision, "i8");
  EXPECT_EQ(FindLayer(report, "bmm")->precision, "f16");
  EXPECT_EQ(FindLayer(report, "bmm")->precision_reason,
            "f16: no int8 kernel on cpu; no fp8 kernel on cpu");
}

// x [4, 16] -> MatMul "slow_bmm" (W [2, 16, 8]) -> y: its only INT8 tactic is SlowInt8MatMul's.
std::unique_ptr<Graph> SlowBatchedMatMul() {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, MakeShape({4, 16}));
  Value* y = g->AddValue("y");
  g->AddNode("MatMul", "slow_bmm", {x, g->AddConstant("w", F32({2, 16, 8}, Random(256, 3, 0.5f)))},
             {y});
  g->MarkOutput(y);
  EXPECT_TRUE(InferShapes(*g).ok());
  return g;
}

// --quantized-if-faster: on, the INT8 layer's slow tactic races its float ones and loses, so the
// layer runs float and says why, without its INT8 attribute; off (the CPU's default), it stays
// INT8 on the slow tactic. A build without a search keeps the INT8 tactic either way.
TEST(PrecisionInt8, AFasterFloatTacticWinsWhenQuantizedIfFaster) {
  BuilderConfig c;
  c.int8 = true;
  c.int8_tolerance = HUGE_VAL;
  c.calibration_dir = MatMulCalibration("slow_int8_calib");
  c.optimize = false;
  c.quantized_if_faster = true;
  BuildReport report;
  auto raced = BuildEngine({SlowBatchedMatMul(), "t", HashString("t")}, c, &report);
  ASSERT_TRUE(raced.ok()) << raced.status().ToString();
  const LayerReport* l = FindLayer(report, "slow_bmm");
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->precision, "f16");
  EXPECT_FALSE(l->tactic.starts_with("i8-")) << l->tactic;
  EXPECT_NE(l->precision_reason.find("f16: its i8 tactics were slower here"), std::string::npos)
      << l->precision_reason;
  EXPECT_FALSE((*raced)->graph->FindNode("slow_bmm")->attrs().Has("kiln_int8_input_amax"));
  EXPECT_EQ(report.precision_counts.count("i8"), 0u);

  c.quantized_if_faster = false;
  BuildReport forced;
  auto kept = BuildEngine({SlowBatchedMatMul(), "t", HashString("t")}, c, &forced);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(FindLayer(forced, "slow_bmm")->precision, "i8");
  EXPECT_EQ(FindLayer(forced, "slow_bmm")->tactic, "i8-matmul-cpu-test-slow");

  c.quantized_if_faster = true;
  c.search_tactics = false;
  BuildReport unsearched;
  ASSERT_TRUE(BuildEngine({SlowBatchedMatMul(), "t", HashString("t")}, c, &unsearched).ok());
  EXPECT_EQ(FindLayer(unsearched, "slow_bmm")->precision, "i8");
}

TEST(PrecisionFp8, WithoutCalibrationDataFp8FallsBackWithAWarning) {
  BuilderConfig c;
  c.fp8 = true;
  c.deadline = std::chrono::milliseconds(1);
  c.optimize = false;
  BuildReport report;
  ASSERT_TRUE(BuildEngine({MatMulGemm(), "t", HashString("t")}, c, &report).ok());
  EXPECT_EQ(FindLayer(report, "mm")->precision, "f16");
  EXPECT_NE(FindLayer(report, "mm")->precision_reason.find("not fp8: no calibration data"),
            std::string::npos);
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_NE(report.warnings[0].find("--fp8 without calibration data"), std::string::npos);
}

BuilderConfig ZooInt8(const std::string& model, const std::string& cache) {
  BuilderConfig c;
  c.int8 = true;
  c.calibration_dir = testing::ZooDir(model);
  c.calibration_cache_path = cache;
  c.deadline = std::chrono::milliseconds(1);
  EXPECT_TRUE(ParseProfileSpec("input:1x3x64x64,2x3x64x64,4x3x64x64", &c.profile).ok());
  return c;
}

StatusOr<std::vector<std::byte>> BuildZooBytes(const std::string& model, const BuilderConfig& c,
                                               BuildReport* report) {
  KILN_ASSIGN_OR_RETURN(auto graph, ImportOnnxFile(testing::ZooDir(model) + "/model.onnx"));
  KILN_ASSIGN_OR_RETURN(auto desc,
                        BuildEngine({std::move(graph), model, HashString(model)}, c, report));
  return SerializeEngine(*desc);
}

TEST(PrecisionCalibrationCache, SecondBuildRunsNoCalibration) {
  std::string cache = testing::TempDir("cache_reuse") + "/resnet.calib.json";
  BuildReport first, second;
  int64_t before = precision::CalibrationBatchesRun();
  auto a = BuildZooBytes("resnet_tiny", ZooInt8("resnet_tiny", cache), &first);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_GT(precision::CalibrationBatchesRun(), before);
  EXPECT_GT(first.calibration_batches_run, 0);
  ASSERT_TRUE(std::filesystem::exists(cache));

  before = precision::CalibrationBatchesRun();
  auto b = BuildZooBytes("resnet_tiny", ZooInt8("resnet_tiny", cache), &second);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(precision::CalibrationBatchesRun(), before);  // nothing ran
  EXPECT_EQ(second.calibration_batches_run, 0);
  EXPECT_EQ(second.calibration.rfind("from cache", 0), 0u) << second.calibration;
  EXPECT_TRUE(second.warnings.empty());
  // The cached ranges are the computed ones: the engines are the same bytes.
  EXPECT_TRUE(*a == *b);
}

TEST(PrecisionCalibrationCache, CorruptOrForeignCacheWarnsAndRecalibrates) {
  std::string dir = testing::TempDir("cache_bad");
  std::string cache = dir + "/calib.json";
  std::ofstream(cache) << "not a cache {";
  BuildReport report;
  int64_t before = precision::CalibrationBatchesRun();
  ASSERT_TRUE(BuildZooBytes("resnet_tiny", ZooInt8("resnet_tiny", cache), &report).ok());
  EXPECT_GT(precision::CalibrationBatchesRun(), before);  // recalibrated, cache not trusted
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_NE(report.warnings[0].find("KILN-E3006"), std::string::npos) << report.warnings[0];
  EXPECT_NE(report.warnings[0].find("not JSON"), std::string::npos);
  // The rewritten cache is valid now; but it is foreign to another method.
  BuilderConfig other = ZooInt8("resnet_tiny", cache);
  other.calibration_method = precision::CalibrationMethod::kEntropy;
  BuildReport foreign;
  before = precision::CalibrationBatchesRun();
  ASSERT_TRUE(BuildZooBytes("resnet_tiny", other, &foreign).ok());
  EXPECT_GT(precision::CalibrationBatchesRun(), before);
  ASSERT_EQ(foreign.warnings.size(), 1u);
  EXPECT_NE(foreign.warnings[0].find("key differs"), std::string::npos) << foreign.warnings[0];
}

TEST(PrecisionCalibrationData, WrongShapeStopsTheBuildNamingTheInput) {
  std::string dir = testing::TempDir("wrong_shape");
  testing::WriteDataSets(dir, {{F32({1, 3, 32, 32}, std::vector<float>(3 * 32 * 32, 0.5f))}});
  BuilderConfig c = ZooInt8("resnet_tiny", "");
  c.calibration_dir = dir;
  BuildReport report;
  auto r = BuildZooBytes("resnet_tiny", c, &report);
  EXPECT_EQ(r.status().code(), ErrorCode::kCalibrationInputInvalid);
  EXPECT_NE(r.status().message().find("model input 'input': expected shape [batch,3,64,64] "
                                      "within the profile [1,3,64,64]..[4,3,64,64], got "
                                      "[1,3,32,32]"),
            std::string::npos)
      << r.status().message();
}

TEST(PrecisionDeterminism, Fp16BuildsAreByteIdentical) {
  BuilderConfig c;
  c.fp16 = true;
  c.deadline = std::chrono::milliseconds(1);
  ASSERT_TRUE(ParseProfileSpec("input:1x3x64x64,2x3x64x64,4x3x64x64", &c.profile).ok());
  BuildReport r1, r2;
  auto a = BuildZooBytes("resnet_tiny", c, &r1);
  auto b = BuildZooBytes("resnet_tiny", c, &r2);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(*a == *b);
  EXPECT_GT(r1.precision_counts["f16"], 5);
}

TEST(PrecisionConfig, HashCoversPrecisionAndCalibration) {
  BuilderConfig base;
  std::vector<BuilderConfig> variants(7, base);
  variants[0].fp16 = true;
  variants[1].bf16 = true;
  variants[2].int8 = true;
  variants[3].calibration_dir = "calib";
  variants[4].calibration_method = precision::CalibrationMethod::kEntropy;
  variants[5].calibration_cache_path = "c.json";
  variants[6].fp8 = true;
  for (const BuilderConfig& v : variants) EXPECT_NE(v.Hash(), base.Hash());
  BuilderConfig p1 = base, p2 = base;
  ASSERT_TRUE(ParseCalibrationMethodSpec("percentile=99.9", 99.99, &p1).ok());
  ASSERT_TRUE(ParseCalibrationMethodSpec("percentile", 99.99, &p2).ok());
  EXPECT_DOUBLE_EQ(p1.calibration_percentile, 99.9);
  EXPECT_NE(p1.Hash(), p2.Hash());
  EXPECT_EQ(ParseCalibrationMethodSpec("percentile", 0, &p1).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ParseCalibrationMethodSpec("entropy=3", 99.99, &p1).code(),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln
