// Issue 19's builder speed work: optimisation levels, the early stop, the bounded set-up pool, the
// deadline with it, and warm builds that set up nothing (counted through the build report).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <random>
#include <set>
#include <thread>

#include "kiln/backends/backend.h"
#include "kiln/backends/cpu/cpu_eval.h"
#include "kiln/builder/builder.h"
#include "kiln/builder/tactic_search.h"
#include "kiln/engine/engine_file.h"
#include "kiln/onnx/onnx_import.h"
#include "kiln/runtime/runtime.h"

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

BuilderConfig ResnetConfig() {
  BuilderConfig c;
  EXPECT_TRUE(ParseProfileSpec("input:1x3x64x64,2x3x64x64,4x3x64x64", &c.profile).ok());
  return c;
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / name).string();
}

// Runs the engine on x (2x3x64x64) and returns its one output.
std::vector<float> RunEngine(std::unique_ptr<EngineDesc> desc, std::vector<float>& x,
                             const std::string& out_name, size_t out_elems) {
  auto runtime = Runtime::Create(BackendKind::kCpu);
  EXPECT_TRUE(runtime.ok()) << runtime.status().ToString();
  auto engine = (*runtime)->CreateEngine(std::shared_ptr<const EngineDesc>(std::move(desc)));
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  auto ctx = (*engine)->CreateExecutionContext();
  EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
  std::vector<float> y(out_elems, -1e30f);
  EXPECT_TRUE((*ctx)->SetInputShape("input", {2, 3, 64, 64}).ok());
  EXPECT_TRUE((*ctx)->SetTensorAddress("input", x.data()).ok());
  EXPECT_TRUE((*ctx)->SetTensorAddress(out_name, y.data()).ok());
  Status s = (*ctx)->Execute();
  EXPECT_TRUE(s.ok()) << s.ToString();
  return y;
}

double RelL2(const std::vector<float>& a, const float* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    num += (a[i] - ref[i]) * double(a[i] - ref[i]);
    den += ref[i] * double(ref[i]);
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Level 0 (heuristic tactics, nothing timed) and level 5 (every tactic, timed fully) both give
// engines whose outputs match the CPU reference interpreter on the same input.
TEST(BuildSpeed, OptLevelsZeroAndFiveBothMatchTheCpuReference) {
  auto graph = ImportOnnxFile(Zoo("resnet_tiny"));
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  ASSERT_EQ((*graph)->outputs().size(), 1u);
  const std::string out_name = (*graph)->outputs()[0]->name();
  std::vector<float> x(2 * 3 * 64 * 64);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  for (float& v : x) v = dist(rng);
  std::map<std::string, Tensor> inputs;
  inputs.emplace("input", Tensor::FromVector<float>(DataType::kFloat32, {2, 3, 64, 64}, x));
  auto ref = cpu::EvaluateGraph(**graph, inputs);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  const Tensor& y_ref = ref->at(out_name);
  const size_t n = static_cast<size_t>(y_ref.num_elements());

  std::map<int, std::vector<std::string>> tactics;
  for (int level : {0, 5}) {
    BuilderConfig c = ResnetConfig();
    c.opt_level = level;
    BuildReport report;
    auto engine = BuildZoo("resnet_tiny", c, &report);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    EXPECT_EQ(report.time_breakdown.opt_level, level);
    if (level == 0) {
      EXPECT_EQ(report.tactics_timed, 0);
      EXPECT_EQ(report.time_breakdown.setups, 0);
    } else {
      EXPECT_GT(report.tactics_timed, 0);
      EXPECT_EQ(report.time_breakdown.early_stops, 0);  // level 5 times every candidate fully
    }
    for (const auto& l : report.layer_reports) tactics[level].push_back(l.tactic);
    std::vector<float> y = RunEngine(std::move(*engine), x, out_name, n);
    EXPECT_LT(RelL2(y, y_ref.data<float>(), n), 1e-4) << "opt level " << level;
  }
  EXPECT_EQ(tactics[0].size(), tactics[5].size());
}

// A provider's offer as a search takes it: the prefix filters, and the bound applies to each
// kernel family of the provider (TacticConfig::family) in the provider's order.
TEST(BuildSpeed, TakeTacticsBoundsEachFamily) {
  auto tactic = [](std::string name, std::string family) {
    TacticConfig t;
    t.name = std::move(name);
    t.family = std::move(family);
    return t;
  };
  const std::vector<TacticConfig> offered = {
      tactic("i8-lt-0", "cublaslt"), tactic("i8-mma-0", "mma"),     tactic("i8-lt-1", "cublaslt"),
      tactic("i8-mma-1", "mma"),     tactic("i8-lt-2", "cublaslt"), tactic("f16-x", ""),
      tactic("i8-mma-2", "mma")};
  auto names = [](const std::vector<TacticConfig>& ts) {
    std::vector<std::string> n;
    for (const TacticConfig& t : ts) n.push_back(t.name);
    return n;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(names(TakeTactics(offered, "i8-", 1)), (V{"i8-lt-0", "i8-mma-0"}));
  EXPECT_EQ(names(TakeTactics(offered, "i8-", 2)),
            (V{"i8-lt-0", "i8-mma-0", "i8-lt-1", "i8-mma-1"}));
  EXPECT_EQ(names(TakeTactics(offered, "i8-", 0)).size(), 6u);  // no bound
  EXPECT_EQ(names(TakeTactics(offered, "", 1)), (V{"i8-lt-0", "i8-mma-0", "f16-x"}));
  // One family (the empty one): the provider's first N, as before families existed.
  std::vector<TacticConfig> plain = offered;
  for (TacticConfig& t : plain) t.family.clear();
  EXPECT_EQ(names(TakeTactics(plain, "i8-", 2)), (V{"i8-lt-0", "i8-mma-0"}));
}

// The level bounds the candidates each provider offers a layer: level 1 takes one per provider,
// level 5 all of them (at least as many as level 2).
TEST(BuildSpeed, OptLevelBoundsTheCandidatesPerProvider) {
  std::map<int, int64_t> candidates;
  for (int level : {1, 2, 5}) {
    BuilderConfig c = ResnetConfig();
    c.opt_level = level;
    BuildReport report;
    ASSERT_TRUE(BuildZoo("resnet_tiny", c, &report).ok());
    for (const SignatureTime& t : report.time_breakdown.signatures) {
      candidates[level] += t.candidates;
      if (level == 1) {
        EXPECT_LE(t.candidates, 4) << t.signature;  // resnet_tiny's ops have <= 4 CPU providers
      }
    }
  }
  EXPECT_LE(candidates[1], candidates[2]);
  EXPECT_LE(candidates[2], candidates[5]);
  EXPECT_LT(candidates[1], candidates[5]);
  BuilderConfig bad = ResnetConfig();
  bad.opt_level = 6;
  EXPECT_EQ(BuildZoo("resnet_tiny", bad).status().code(), ErrorCode::kInvalidArgument);
}

// A kernel that sleeps: its time is known whatever the machine's load (sleeps only get longer).
class SleepKernel final : public Kernel {
 public:
  explicit SleepKernel(int us) : us_(us) {}
  Status Run(const KernelRunArgs&) override {
    std::this_thread::sleep_for(std::chrono::microseconds(us_));
    ++runs;
    return OkStatus();
  }
  int runs = 0;

 private:
  int us_;
};

TEST(BuildSpeed, EarlyStopEndsACandidateClearlySlowerThanTheBest) {
  auto backend = GetBackend(BackendKind::kCpu);
  ASSERT_TRUE(backend.ok());
  TimingInputs inputs;
  TacticSearchOptions o;
  o.early_stop = true;
  o.min_runs = 5;
  o.min_total_ms = 0;
  PreparedTactic slow;
  slow.kernel = std::make_unique<SleepKernel>(3000);  // 3 ms against a best of 0.5 ms
  auto t = RunTiming(**backend, slow, inputs, o, /*best_ms=*/0.5);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE(t->stopped_early);
  EXPECT_EQ(t->runs, 1);  // stopped by its first timed run
  EXPECT_EQ(static_cast<SleepKernel*>(slow.kernel.get())->runs, 2);  // the warm-up, then that run
  EXPECT_GE(t->median_ms, 3.0);

  PreparedTactic fast;
  fast.kernel = std::make_unique<SleepKernel>(200);
  t = RunTiming(**backend, fast, inputs, o, /*best_ms=*/1000);  // far faster than the best
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->stopped_early);
  EXPECT_GE(t->runs, 5);

  o.early_stop = false;  // level 5: no early stop whatever the best
  PreparedTactic full;
  full.kernel = std::make_unique<SleepKernel>(3000);
  t = RunTiming(**backend, full, inputs, o, /*best_ms=*/0.5);
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->stopped_early);
  EXPECT_GE(t->runs, 5);
}

// Two timed runs that agree end a candidate's timing before min_runs; without settle_ratio (the
// widest level) it runs min_runs times. Sleeps of 10 ms: a loaded machine stretches them by far
// less than the 1.5x allowed here.
TEST(BuildSpeed, SettledRunsEndTimingBeforeMinRuns) {
  auto backend = GetBackend(BackendKind::kCpu);
  ASSERT_TRUE(backend.ok());
  TimingInputs inputs;
  TacticSearchOptions o;
  o.min_runs = 4;
  o.min_total_ms = 0;
  // Wide bounds on both sides: on a loaded machine a 10 ms sleep can take 15 or 30 ms, which a
  // ratio of 1.5 or a total of 50 ms would count as unsettled or settled by chance.
  o.settle_ratio = 20;
  PreparedTactic settled;
  settled.kernel = std::make_unique<SleepKernel>(10000);
  auto t = RunTiming(**backend, settled, inputs, o, /*best_ms=*/0);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->runs, 2);
  EXPECT_GE(t->median_ms, 10.0);

  o.min_total_ms = 1000;  // two 10 ms runs are not enough samples yet
  PreparedTactic short_total;
  short_total.kernel = std::make_unique<SleepKernel>(10000);
  t = RunTiming(**backend, short_total, inputs, o, /*best_ms=*/0);
  ASSERT_TRUE(t.ok());
  EXPECT_GE(t->runs, 4);

  o.min_total_ms = 0;
  o.settle_ratio = 0;  // off
  PreparedTactic full;
  full.kernel = std::make_unique<SleepKernel>(10000);
  t = RunTiming(**backend, full, inputs, o, /*best_ms=*/0);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->runs, 4);
}

// A kernel whose first launch is slow (the CUDA driver loads a module at a kernel's first launch)
// and later ones fast: the early stop must not judge it by that first launch.
class ColdStartKernel final : public Kernel {
 public:
  Status Run(const KernelRunArgs&) override {
    std::this_thread::sleep_for(std::chrono::microseconds(runs == 0 ? 800000 : 100));
    ++runs;
    return OkStatus();
  }
  int runs = 0;
};

TEST(BuildSpeed, EarlyStopNeverJudgesACandidateByItsFirstLaunch) {
  auto backend = GetBackend(BackendKind::kCpu);
  ASSERT_TRUE(backend.ok());
  TimingInputs inputs;
  TacticSearchOptions o;
  o.early_stop = true;
  o.min_runs = 3;
  o.min_total_ms = 0;
  for (int warmups : {1, 2}) {
    SCOPED_TRACE(warmups);
    o.warmup_runs = warmups;
    PreparedTactic cold;
    cold.kernel = std::make_unique<ColdStartKernel>();
    // 800 ms at its first launch (4x the best: the old rule stopped it there), 0.1 ms after,
    // against a best of 200 ms: wide margins, because a loaded CI machine stretches a 0.1 ms
    // sleep to tens of ms.
    auto t = RunTiming(**backend, cold, inputs, o, /*best_ms=*/200.0);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    EXPECT_FALSE(t->stopped_early);
    EXPECT_GE(t->runs, 3);
    EXPECT_LT(t->median_ms, 200.0);  // it would win the layer
  }
}

// The set-up pool never runs more set-ups at once than its bound, and the engines it gives are
// valid engines of the same layers.
TEST(BuildSpeed, SetUpPoolRespectsItsBound) {
  for (int threads : {1, 3}) {
    BuilderConfig c;
    c.setup_threads = threads;
    BuildReport report;
    auto engine = BuildZoo("efficientnet_tiny", c, &report);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    const BuildTimeBreakdown& b = report.time_breakdown;
    EXPECT_EQ(b.setup_threads, threads);
    EXPECT_GE(b.setup_max_concurrency, 1);
    EXPECT_LE(b.setup_max_concurrency, threads);
    EXPECT_GT(b.setups, 0);
    EXPECT_GE(b.setups, report.tactics_timed);  // every timed candidate was set up first
    EXPECT_EQ((*engine)->layers.size(), static_cast<size_t>(report.layers));
  }
}

// With several set-up threads the deadline still bounds the build, and the engine is valid.
TEST(BuildSpeed, DeadlineHoldsWithTheSetUpPool) {
  BuilderConfig c;
  c.setup_threads = 4;
  c.opt_level = 5;
  c.deadline = std::chrono::milliseconds(1);
  BuildReport report;
  const auto start = std::chrono::steady_clock::now();
  auto engine = BuildZoo("efficientnet_tiny", c, &report);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_TRUE(report.deadline_hit);
  EXPECT_LT(seconds, 5.0);  // the bound plus import, passes and planning
  EXPECT_EQ((*engine)->layers.size(), static_cast<size_t>(report.layers));
}

// A warm build takes each known signature's winner from the timing cache without listing or
// setting up any candidate, and gives the engine of a warm build that listed them.
TEST(BuildSpeed, WarmBuildSetsUpNothing) {
  const std::string cache = TempPath("kiln_build_speed_warm.cache");
  std::filesystem::remove(cache);
  BuilderConfig c = ResnetConfig();
  c.timing_cache_path = cache;
  BuildReport cold, warm;
  auto a = BuildZoo("resnet_tiny", c, &cold);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_GT(cold.time_breakdown.setups, 0);
  EXPECT_EQ(cold.time_breakdown.layers_from_cache, 0);
  EXPECT_EQ(cold.time_breakdown.layers_listed, cold.layers);
  auto b = BuildZoo("resnet_tiny", c, &warm);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  const BuildTimeBreakdown& w = warm.time_breakdown;
  EXPECT_EQ(w.setups, 0);
  EXPECT_EQ(warm.tactics_timed, 0);
  EXPECT_GT(w.layers_from_cache, 0);
  EXPECT_EQ(w.layers_from_cache, warm.timing_cache_hits);
  EXPECT_EQ(w.layers_listed + w.layers_from_cache, warm.layers);
  ASSERT_EQ(cold.layer_reports.size(), warm.layer_reports.size());
  for (size_t i = 0; i < cold.layer_reports.size(); ++i) {
    EXPECT_EQ(cold.layer_reports[i].tactic, warm.layer_reports[i].tactic)
        << cold.layer_reports[i].name;
  }
  // A second warm build is byte-identical to the first.
  BuildReport warm2;
  auto d = BuildZoo("resnet_tiny", c, &warm2);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(*SerializeEngine(**b), *SerializeEngine(**d));
  std::filesystem::remove(cache);
}

}  // namespace
}  // namespace kiln
