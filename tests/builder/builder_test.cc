#include "kiln/builder/builder.h"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "kiln/engine/engine_file.h"
#include "kiln/onnx/onnx_import.h"
#include "scoped_env.h"

namespace kiln {
namespace {

std::string Zoo(const std::string& model) {
  const char* root = std::getenv("KILN_SOURCE_DIR");
  return std::string(root ? root : ".") + "/zoo/" + model + "/model.onnx";
}

StatusOr<std::unique_ptr<EngineDesc>> BuildZoo(const std::string& model, BuilderConfig config,
                                               BuildReport* report = nullptr) {
  KILN_ASSIGN_OR_RETURN(auto graph, ImportOnnxFile(Zoo(model)));
  return BuildEngine({std::move(graph), model, HashString(model)}, config, report);
}

BuilderConfig ResnetConfig(int max_batch = 4) {
  BuilderConfig c;
  EXPECT_TRUE(
      ParseProfileSpec(fmt::format("input:1x3x64x64,2x3x64x64,{}x3x64x64", max_batch), &c.profile)
          .ok());
  return c;
}

TEST(BuilderConfig, ParsesSizesFractionsDurationsAndProfiles) {
  EXPECT_EQ(*MemoryBudget::Parse("512M")->bytes, 512LL << 20);
  EXPECT_EQ(*MemoryBudget::Parse("8G")->bytes, 8LL << 30);
  EXPECT_DOUBLE_EQ(*MemoryBudget::Parse("0.5")->fraction, 0.5);
  EXPECT_EQ(MemoryBudget::Parse("1.5").status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(MemoryBudget::Parse("lots").status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ParseDuration("30s")->count(), 30000);
  EXPECT_EQ(ParseDuration("1500ms")->count(), 1500);
  EXPECT_EQ(ParseDuration("2m")->count(), 120000);
  EXPECT_EQ(ParseDuration("0s").status().code(), ErrorCode::kInvalidDeadline);
  EXPECT_EQ(ParseDuration("-5s").status().code(), ErrorCode::kInvalidDeadline);
  OptimizationProfile p;
  ASSERT_TRUE(ParseProfileSpec("x:1x3,2x3,4x3", &p).ok());
  EXPECT_EQ(p.inputs[0].max, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(ParseProfileSpec("x:1x3,2x3", &p).code(), ErrorCode::kInvalidProfile);
  EXPECT_EQ(ParseProfileSpec("noshape", &p).code(), ErrorCode::kInvalidProfile);
  EXPECT_EQ(ParseProfileSpec("x:1x3x", &p).code(), ErrorCode::kInvalidProfile);  // issue 17
  EXPECT_EQ(ParseProfileSpec("x:1x3,2x3x,4x3", &p).code(), ErrorCode::kInvalidProfile);
}

TEST(Builder, DynamicInputWithoutProfileDefaultsToOneWithAWarning) {
  BuildReport report;
  auto engine = BuildZoo("resnet_tiny", BuilderConfig(), &report);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  const InputProfile* p = (*engine)->profile.Find("input");
  ASSERT_NE(p, nullptr);
  const std::vector<int64_t> one{1, 3, 64, 64};
  EXPECT_EQ(p->min, one);
  EXPECT_EQ(p->opt, one);
  EXPECT_EQ(p->max, one);
  ASSERT_EQ(report.warnings.size(), 1u);
  const std::string& w = report.warnings[0];
  EXPECT_NE(w.find("KILN-E3001"), std::string::npos) << w;
  EXPECT_NE(w.find("building for 1x3x64x64"), std::string::npos) << w;
  EXPECT_NE(w.find("--profile input:MIN,OPT,MAX"), std::string::npos) << w;
}

TEST(Builder, ProfileOfAStaticInputMustEqualItsShape) {
  // resnet_tiny with its dynamic batch fixed at 2: a model whose input is static, 2x3x64x64.
  auto build = [&](const std::string& spec) {
    auto g = ImportOnnxFile(Zoo("resnet_tiny"));
    (*g)->inputs()[0]->set_shape(Shape{Dim(2), Dim(3), Dim(64), Dim(64)});
    BuilderConfig c;
    EXPECT_TRUE(ParseProfileSpec(spec, &c.profile).ok());
    BuildReport report;
    auto e = BuildEngine({std::move(*g), "static", HashString("static")}, c, &report);
    if (e.ok()) EXPECT_TRUE(report.warnings.empty());
    return e;
  };
  auto same = build("input:2x3x64x64,2x3x64x64,2x3x64x64");
  ASSERT_TRUE(same.ok()) << same.status().ToString();
  EXPECT_EQ((*same)->profile.Find("input"), nullptr);  // a static input needs none

  auto other = build("input:1x3x64x64,2x3x64x64,4x3x64x64");
  EXPECT_EQ(other.status().code(), ErrorCode::kInvalidProfile);
  EXPECT_NE(other.status().message().find("static shape 2x3x64x64"), std::string::npos)
      << other.status().ToString();
  EXPECT_NE(other.status().message().find("1x3x64x64,2x3x64x64,4x3x64x64"), std::string::npos)
      << other.status().ToString();
}

TEST(Builder, ReportSaysWhereTheTacticSecondsWent) {
  BuildReport report;
  auto engine = BuildZoo("resnet_tiny", ResnetConfig(), &report);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  const BuildTimeBreakdown& b = report.time_breakdown;
  ASSERT_FALSE(b.signatures.empty());
  int64_t layers = 0, timed = 0;
  double generate = 0, timing = 0;
  for (size_t i = 0; i < b.signatures.size(); ++i) {
    const SignatureTime& t = b.signatures[i];
    layers += t.layers;
    timed += t.timed;
    generate += t.generate_seconds;
    timing += t.timing_seconds;
    EXPECT_GE(t.candidates, 1) << t.signature;
    EXPECT_FALSE(t.first_layer.empty());
    if (i) EXPECT_GE(b.signatures[i - 1].total_seconds(), t.total_seconds());  // slowest first
  }
  EXPECT_EQ(layers, report.layers);  // every layer belongs to exactly one signature
  EXPECT_EQ(timed, report.tactics_timed);
  EXPECT_GT(report.tactics_timed, 0);
  EXPECT_GT(b.timing_seconds, 0);
  EXPECT_GT(b.generate_seconds, 0);
  EXPECT_DOUBLE_EQ(b.timing_seconds, timing);
  EXPECT_DOUBLE_EQ(b.generate_seconds, generate);
  EXPECT_LE(b.listing_wall_seconds + b.setup_wall_seconds + b.timing_seconds,
            report.phase_seconds_tactics + 1e-3);
  const std::string text = report.ToText(true);
  EXPECT_NE(text.find("tactics: listing candidates"), std::string::npos) << text;
  EXPECT_NE(text.find("tactic seconds per layer signature"), std::string::npos) << text;
  EXPECT_EQ(report.ToText(false).find("per layer signature"), std::string::npos);
  EXPECT_NE(report.ToJson().find("\"time_breakdown\""), std::string::npos);
  // The engine's stored report has no wall-clock figures (warm builds stay byte-identical).
  EXPECT_EQ((*engine)->build_report_json.find("\"signatures\": [\n"), std::string::npos)
      << (*engine)->build_report_json;
}

// `kiln build --disable-pass`: a named pass is skipped (and the engine is another engine: the
// config hash differs); a name that is no pass is refused with the list of names.
TEST(Builder, DisabledPassIsSkippedAndUnknownNamesAreRefused) {
  BuilderConfig c = ResnetConfig();
  BuildReport on, off;
  ASSERT_TRUE(BuildZoo("resnet_tiny", c, &on).ok());
  EXPECT_NE(on.passes.find("conv_fusion "), std::string::npos) << on.passes;
  BuilderConfig d = c;
  d.disabled_passes = {"conv_fusion"};
  EXPECT_NE(c.Hash(), d.Hash());
  auto engine = BuildZoo("resnet_tiny", d, &off);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_EQ(off.passes.find("conv_fusion "), std::string::npos) << off.passes;
  for (const LayerReport& l : off.layer_reports) EXPECT_NE(l.op_type, "FusedConv") << l.name;
  EXPECT_GT(off.layer_reports.size(), on.layer_reports.size());

  BuilderConfig bad = c;
  bad.disabled_passes = {"transpose_sinkin"};
  auto st = BuildZoo("resnet_tiny", bad).status();
  EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'transpose_sinkin'"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("transpose_sinking"), std::string::npos) << st.message();
}

using testing_env::ScopedEnv;

// The stem rewrite (passes/stem_space_to_depth.cc) is the build's for an INT8 build on CUDA with
// the quantized tactics on, and for no other unless KILN_STEM_SPACE_TO_DEPTH asks; the calibration
// graph is the build's. resnet_tiny's stem: 7x7 stride 2 from 3 channels, then 4x4 stride 1.
TEST(Builder, StemSpaceToDepthIsForCudaInt8BuildsWithTheQuantizedTactics) {
  struct Case {
    const char* what;
    BackendKind backend;
    bool int8;
    const char* quant_tactics;  // KILN_CUDA_QUANT_TACTICS
    const char* force;          // KILN_STEM_SPACE_TO_DEPTH
    bool disabled;
    bool rewritten;
  };
  for (const Case& c : {
           Case{"cuda int8", BackendKind::kCuda, true, "1", nullptr, false, true},
           Case{"cuda int8, tactics off", BackendKind::kCuda, true, nullptr, nullptr, false, false},
           Case{"cuda fp32", BackendKind::kCuda, false, "1", nullptr, false, false},
           Case{"cpu int8", BackendKind::kCpu, true, "1", nullptr, false, false},
           Case{"cpu, asked", BackendKind::kCpu, false, nullptr, "1", false, true},
           Case{"cuda int8, refused", BackendKind::kCuda, true, "1", "0", false, false},
           Case{"cuda int8, disabled", BackendKind::kCuda, true, "1", nullptr, true, false},
       }) {
    SCOPED_TRACE(c.what);
    ScopedEnv quant("KILN_CUDA_QUANT_TACTICS", c.quant_tactics);
    ScopedEnv force("KILN_STEM_SPACE_TO_DEPTH", c.force);
    BuilderConfig config = ResnetConfig();
    config.backend = c.backend;
    config.int8 = c.int8;
    if (c.disabled) config.disabled_passes = {"stem_space_to_depth"};
    auto graph = ImportOnnxFile(Zoo("resnet_tiny"));
    ASSERT_TRUE(graph.ok()) << graph.status().ToString();
    auto calib = CalibrationGraph({std::move(graph).value(), "resnet_tiny", 1}, config);
    ASSERT_TRUE(calib.ok()) << calib.status().ToString();
    int seven = 0, four = 0;
    for (const Node* n : (*calib)->nodes()) {
      if (n->is_dead() || (n->op_type() != "Conv" && n->op_type() != "FusedConv")) continue;
      const std::vector<int64_t> k = n->attrs().GetInts("kernel_shape");
      seven += k == std::vector<int64_t>{7, 7};
      four += k == std::vector<int64_t>{4, 4};
    }
    EXPECT_EQ(seven, c.rewritten ? 0 : 1);
    EXPECT_EQ(four, c.rewritten ? 1 : 0);
  }
}

TEST(Builder, ProfileErrorsSayWhatToChange) {
  BuilderConfig inverted;
  ASSERT_TRUE(ParseProfileSpec("input:4x3x64x64,2x3x64x64,8x3x64x64", &inverted.profile).ok());
  auto bad = BuildZoo("resnet_tiny", inverted);
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidProfile);
  EXPECT_NE(bad.status().message().find("min <= opt <= max"), std::string::npos);

  BuilderConfig fixed_dim;
  ASSERT_TRUE(ParseProfileSpec("input:1x3x32x64,2x3x64x64,4x3x64x64", &fixed_dim.profile).ok());
  EXPECT_EQ(BuildZoo("resnet_tiny", fixed_dim).status().code(), ErrorCode::kInvalidProfile);

  BuilderConfig unknown = ResnetConfig();
  ASSERT_TRUE(ParseProfileSpec("nope:1x3,1x3,1x3", &unknown.profile).ok());
  EXPECT_EQ(BuildZoo("resnet_tiny", unknown).status().code(), ErrorCode::kInvalidProfile);
}

// A profile past the size limits is refused before shapes are inferred or anything is timed,
// naming the input and the value (the plan would otherwise be sized from a wrapped figure).
TEST(Builder, ProfilePastTheSizeLimitsIsE3008BeforeAnythingRuns) {
  for (std::string max : {"4611686018427387904x3x64x64", "4294967296x3x64x64"}) {
    BuilderConfig huge;
    ASSERT_TRUE(ParseProfileSpec("input:1x3x64x64,2x3x64x64," + max, &huge.profile).ok());
    BuildReport report;
    auto engine = BuildZoo("resnet_tiny", huge, &report);
    ASSERT_FALSE(engine.ok());
    EXPECT_EQ(engine.status().code(), ErrorCode::kProfileTooLarge) << engine.status().ToString();
    EXPECT_NE(engine.status().message().find("max shape of input 'input'"), std::string::npos)
        << engine.status().message();
    EXPECT_NE(engine.status().message().find(max.substr(0, max.find('x'))), std::string::npos)
        << engine.status().message();
    EXPECT_EQ(report.phase_seconds_passes, 0.0);  // refused before the passes ran
  }
}

TEST(BuilderConfig, MemoryBudgetThatOverflowsIsRefused) {
  auto b = MemoryBudget::Parse("9999999999T");
  EXPECT_EQ(b.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("9999999999T"), std::string::npos);
  EXPECT_EQ(*MemoryBudget::Parse("8388607T")->bytes, int64_t{8388607} << 40);
}

TEST(Builder, Fp16BuildReportsEveryLayersPrecisionAndReason) {
  BuilderConfig c = ResnetConfig();
  c.fp16 = true;
  c.deadline = std::chrono::milliseconds(1);
  BuildReport report;
  auto engine = BuildZoo("resnet_tiny", c, &report);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  int64_t counted = 0;
  for (const auto& [label, n] : report.precision_counts) counted += n;
  EXPECT_EQ(counted, report.layers);
  EXPECT_GT(report.precision_counts["f16"], report.layers / 2);
  EXPECT_EQ(report.casts_inserted, 2);  // the input in, the logits out
  for (const LayerDesc& l : (*engine)->layers) EXPECT_FALSE(l.precision_reason.empty());
  EXPECT_NE(report.ToJson().find("\"casts_inserted\": 2"), std::string::npos);
  EXPECT_NE(report.ToText(true).find("precision: f16"), std::string::npos);
}

TEST(Builder, PassesFuseAndThePlanIsReported) {
  BuildReport report;
  auto engine = BuildZoo("resnet_tiny", ResnetConfig(), &report);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_EQ(report.nodes_before_passes, 41);
  EXPECT_LT(report.nodes_after_passes, 20);  // BN folded, conv+add+relu fused
  EXPECT_EQ(report.layers, static_cast<int64_t>((*engine)->layers.size()));
  EXPECT_EQ(report.peak_bytes, report.weights_bytes + report.arena_bytes + report.workspace_bytes);
  EXPECT_GT(report.naive_activation_bytes, report.arena_bytes);  // liveness reuse saves memory
  EXPECT_EQ((*engine)->plan.peak_bytes, report.peak_bytes);
}

TEST(Builder, BudgetBetweenLeanestAndDefaultIsRespected) {
  // At batch 16 the heuristic convolutions' workspaces grow with the batch; chunked im2col's do
  // not. A 1 ms deadline keeps timing out of it, so the choices are the heuristic ones whatever
  // the machine's load.
  BuilderConfig base = ResnetConfig(16);
  base.deadline = std::chrono::milliseconds(1);
  BuildReport unlimited;
  ASSERT_TRUE(BuildZoo("resnet_tiny", base, &unlimited).ok());
  int64_t fixed = unlimited.weights_bytes + unlimited.arena_bytes;
  ASSERT_GT(unlimited.workspace_bytes, 0);
  // Shrinking budgets: each build either fits under its budget (planned peak) or stops early with
  // KILN-E3002; at least one lies between the leanest and the default plan and fits.
  int fitted_leaner = 0;
  for (double share : {0.9, 0.75, 0.5, 0.25, 0.1, 0.01}) {
    BuilderConfig c = ResnetConfig(16);
    c.memory_budget.bytes =
        fixed + static_cast<int64_t>(share * static_cast<double>(unlimited.workspace_bytes));
    BuildReport lean;
    auto engine = BuildZoo("resnet_tiny", c, &lean);
    if (engine.ok()) {
      EXPECT_LE(lean.peak_bytes, *c.memory_budget.bytes) << share;
      EXPECT_LE((*engine)->plan.peak_bytes, *c.memory_budget.bytes) << share;
      if (lean.peak_bytes < unlimited.peak_bytes) ++fitted_leaner;
    } else {
      EXPECT_EQ(engine.status().code(), ErrorCode::kMemoryBudgetExceeded)
          << engine.status().ToString();
    }
  }
  EXPECT_GT(fitted_leaner, 0);
}

TEST(Builder, BudgetBelowTheWeightsFailsEarlyWithBothFigures) {
  BuilderConfig c = ResnetConfig();
  c.memory_budget.bytes = 1000;
  auto r = BuildZoo("resnet_tiny", c);
  ASSERT_EQ(r.status().code(), ErrorCode::kMemoryBudgetExceeded);
  EXPECT_NE(r.status().message().find("weights alone need"), std::string::npos);
  EXPECT_NE(r.status().message().find("allows 1000 bytes"), std::string::npos);
}

TEST(Builder, DeadlineBoundsTheBuildAndTheEngineIsStillValid) {
  BuilderConfig c = ResnetConfig();
  c.deadline = std::chrono::milliseconds(1);
  BuildReport report;
  auto start = std::chrono::steady_clock::now();
  auto engine = BuildZoo("resnet_tiny", c, &report);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_TRUE(report.deadline_hit);
  EXPECT_LT(seconds, 5.0);  // the bound plus import, passes and planning, far below a timed build
  EXPECT_EQ((*engine)->layers.size(), static_cast<size_t>(report.layers));
}

TEST(Builder, WarmTimingCacheSkipsTimingAndGivesByteIdenticalEngines) {
  std::string cache = (std::filesystem::temp_directory_path() / "kiln_builder_test.cache").string();
  std::filesystem::remove(cache);
  BuilderConfig c = ResnetConfig();
  c.timing_cache_path = cache;
  BuildReport cold, warm1, warm2;
  ASSERT_TRUE(BuildZoo("resnet_tiny", c, &cold).ok());
  EXPECT_GT(cold.tactics_timed, 0);
  EXPECT_EQ(cold.timing_cache_hits, 0);
  auto a = BuildZoo("resnet_tiny", c, &warm1);
  auto b = BuildZoo("resnet_tiny", c, &warm2);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(warm1.tactics_timed, 0);
  EXPECT_GT(warm1.timing_cache_hits, 0);
  EXPECT_EQ(*SerializeEngine(**a), *SerializeEngine(**b));
  std::filesystem::remove(cache);
}

// Two layers with one signature (same op, shapes, dtypes, attributes; weights differ): the second
// takes the first's timing instead of timing its candidates again, without any cache file.
TEST(Builder, IdenticalLayersAreTimedOnce) {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, MakeShape({8, 64}));
  auto weight = [&](const std::string& name, float v) {
    return g->AddConstant(name, Tensor::FromVector<float>(DataType::kFloat32, {64, 64},
                                                          std::vector<float>(64 * 64, v)));
  };
  Value *h = g->AddValue("h"), *r = g->AddValue("r"), *y = g->AddValue("y");
  g->AddNode("MatMul", "mm1", {x, weight("w1", 0.01f)}, {h});
  g->AddNode("Relu", "relu", {h}, {r});
  g->AddNode("MatMul", "mm2", {r, weight("w2", 0.02f)}, {y});
  g->MarkOutput(y);
  BuilderConfig c;
  c.optimize = false;  // keep the two MatMuls as written
  BuildReport report;
  auto engine = BuildEngine({std::move(g), "twins", HashString("twins")}, c, &report);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_EQ(report.tactics_reused, 1);
  ASSERT_EQ((*engine)->layers.size(), 3u);
  EXPECT_EQ((*engine)->layers[0].tactic.name, (*engine)->layers[2].tactic.name);
  EXPECT_EQ((*engine)->layers[0].provider_id, (*engine)->layers[2].provider_id);
}

// A warm build that times nothing leaves the cache file alone (no lock, merge and rename): the
// file is the same inode with the same bytes afterwards.
TEST(Builder, WarmBuildDoesNotRewriteTheTimingCache) {
  std::string cache =
      (std::filesystem::temp_directory_path() / "kiln_builder_untouched.cache").string();
  std::filesystem::remove(cache);
  BuilderConfig c = ResnetConfig();
  c.timing_cache_path = cache;
  ASSERT_TRUE(BuildZoo("resnet_tiny", c).ok());
  auto read = [&] {
    std::ifstream f(cache);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  auto inode = [&] {
    struct stat st {};
    EXPECT_EQ(::stat(cache.c_str(), &st), 0);
    return st.st_ino;
  };
  const std::string before = read();
  const auto inode_before = inode();
  ASSERT_FALSE(before.empty());
  BuildReport warm;
  ASSERT_TRUE(BuildZoo("resnet_tiny", c, &warm).ok());
  EXPECT_EQ(warm.tactics_timed, 0);
  EXPECT_EQ(inode(), inode_before);
  EXPECT_EQ(read(), before);
  std::filesystem::remove(cache);
}

// bert_tiny's two encoder layers have the same signatures: the cold build times each signature
// once and the second layer takes the first one's choice, so the cold engine has the tactics a
// rebuild from the timing cache gives.
TEST(Builder, RepeatedLayersAreTimedOnceAndColdMatchesWarm) {
  std::string cache =
      (std::filesystem::temp_directory_path() / "kiln_builder_repeated.cache").string();
  std::filesystem::remove(cache);
  BuilderConfig c;
  for (const char* input : {"input_ids", "attention_mask", "token_type_ids"}) {
    ASSERT_TRUE(ParseProfileSpec(fmt::format("{}:1x1,4x32,8x128", input), &c.profile).ok());
  }
  c.timing_cache_path = cache;
  BuildReport cold, warm;
  auto a = BuildZoo("bert_tiny", c, &cold);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_GT(cold.tactics_timed, 0);
  EXPECT_GT(cold.tactics_reused, 0);
  auto b = BuildZoo("bert_tiny", c, &warm);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(warm.tactics_timed, 0);
  // Every layer the cold build timed or reused (a measured time) is a cache hit now; view layers
  // that share their input's memory report time 0 without being searched (no kernel at all).
  const auto measured = std::count_if(
      cold.layer_reports.begin(), cold.layer_reports.end(),
      [](const LayerReport& l) { return l.time_ms >= 0 && !l.tactic.ends_with("-view"); });
  EXPECT_EQ(warm.timing_cache_hits, measured);
  ASSERT_EQ(cold.layer_reports.size(), warm.layer_reports.size());
  for (size_t i = 0; i < cold.layer_reports.size(); ++i) {
    EXPECT_EQ(cold.layer_reports[i].tactic, warm.layer_reports[i].tactic)
        << cold.layer_reports[i].name;
  }
  std::filesystem::remove(cache);
}

TEST(Builder, CorruptTimingCacheIsIgnoredWithAWarning) {
  std::string cache =
      (std::filesystem::temp_directory_path() / "kiln_builder_corrupt.cache").string();
  { std::ofstream(cache) << "{ not json"; }
  BuilderConfig c = ResnetConfig();
  c.timing_cache_path = cache;
  BuildReport report;
  ASSERT_TRUE(BuildZoo("resnet_tiny", c, &report).ok());
  ASSERT_FALSE(report.warnings.empty());
  EXPECT_NE(report.warnings[0].find("KILN-E3005"), std::string::npos);
  EXPECT_GT(report.tactics_timed, 0);
  std::filesystem::remove(cache);
}

}  // namespace
}  // namespace kiln
