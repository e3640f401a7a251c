// Issue 3, "Done means": a --deadline 1s build of the largest zoo model finishes within the
// deadline plus a fixed margin, and the engine it writes is correct against the model's
// reference outputs (zoo/<m>/test_data_set_0, PyTorch FP32).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "kiln/app/pipeline.h"
#include "kiln/engine/engine_file.h"
#include "kiln/onnx/onnx_import.h"

namespace kiln {
namespace {

namespace fs = std::filesystem;

constexpr std::chrono::milliseconds kDeadline{1000};
// The deadline bounds the tactic search, which checks it before and after every candidate run.
// What may run past it: the set-up and one launch of the candidate in flight (TimeTactic), then
// each chosen kernel's workspace query at the max shapes, the memory plan, engine assembly and
// serialization, and before the build the ONNX import (measured here too, since a user waits for
// it). Each is well under 100 ms on a developer machine. Measured on 2 cores at load 14: 1.36 s
// in all (it was 2.2 s while weight packing ran OpenMP regions that waited a scheduler tick each
// for a descheduled team thread, and a candidate in flight ran its warm-up plus a timed run).
// 1.5 s leaves room for a 2-core CI runner shared with other jobs, and is still far below a build
// that ignored the deadline (the full search takes several seconds on these models).
constexpr double kMarginSeconds = 1.5;

fs::path ZooRoot() {
  const char* root = std::getenv("KILN_SOURCE_DIR");
  return fs::path(root ? root : ".") / "zoo";
}

nlohmann::json Info(const fs::path& dir) {
  std::ifstream in(dir / "info.json");
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

// The committed zoo model (not zoo/generated) with the largest value of `key` in its info.json:
// "param_count" (weights) or the node count summed from "op_types" (layers).
fs::path LargestBy(const std::string& key) {
  fs::path best;
  int64_t best_value = -1;
  for (const auto& e : fs::directory_iterator(ZooRoot())) {
    if (!fs::exists(e.path() / "model.onnx")) continue;
    nlohmann::json info = Info(e.path());
    if (info.is_discarded()) continue;
    int64_t value = 0;
    if (key == "param_count") {
      value = info.value("param_count", int64_t{0});
    } else {
      for (const auto& [op, n] : info["op_types"].items()) value += n.get<int64_t>();
    }
    if (value > best_value) {
      best_value = value;
      best = e.path();
    }
  }
  return best;
}

OptimizationProfile ZooProfile(const nlohmann::json& info) {
  OptimizationProfile profile;
  for (const auto& [name, p] : info["profile"].items()) {
    profile.inputs.push_back({name, p["min"].get<std::vector<int64_t>>(),
                              p["opt"].get<std::vector<int64_t>>(),
                              p["max"].get<std::vector<int64_t>>()});
  }
  return profile;
}

void BuildWithDeadlineAndCheck(const fs::path& dir, std::chrono::milliseconds deadline,
                               bool search_outlasts_deadline) {
  ASSERT_FALSE(dir.empty()) << "no zoo model under " << ZooRoot();
  SCOPED_TRACE(dir.filename().string());
  const nlohmann::json info = Info(dir);
  BuilderConfig config;
  config.profile = ZooProfile(info);
  config.deadline = deadline;  // no timing cache: every candidate would have to be timed

  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<app::BuiltEngine> built = app::BuildFromOnnxFile((dir / "model.onnx").string(), config);
  ASSERT_TRUE(built.ok()) << built.status().ToString();
  StatusOr<std::vector<std::byte>> bytes = SerializeEngine(*built->desc);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::printf("%s: import + build + serialize %.3f s (deadline %.1f s, reached: %s)\n",
              dir.filename().c_str(), seconds, deadline.count() / 1000.0,
              built->report.deadline_hit ? "yes" : "no");
  // Where the full search needs longer than the deadline, the bound was actually reached, so the
  // test exercises the deadline and not merely a quick build.
  if (search_outlasts_deadline) {
    EXPECT_TRUE(built->report.deadline_hit)
        << "the search finished in " << built->report.build_seconds << " s, before the deadline";
  }
  EXPECT_LE(seconds, deadline.count() / 1000.0 + kMarginSeconds)
      << "import + build + serialize took " << seconds << " s; report:\n"
      << built->report.ToText(false);

  // The engine written at the deadline is correct: through the file format, like a user's.
  auto runtime = Runtime::Create(BackendKind::kCpu);
  ASSERT_TRUE(runtime.ok()) << runtime.status().ToString();
  auto engine = (*runtime)->DeserializeEngine(*bytes);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  auto runner = app::HostRunner::Create(*engine);
  ASSERT_TRUE(runner.ok()) << runner.status().ToString();
  auto graph = ImportOnnxFile((dir / "model.onnx").string());
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  const fs::path set = dir / "test_data_set_0";
  std::map<std::string, Tensor> feed;
  for (size_t i = 0; i < (*graph)->inputs().size(); ++i) {
    auto t = LoadTensorProto((set / fmt::format("input_{}.pb", i)).string());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    feed[(*graph)->inputs()[i]->name()] = std::move(*t);
  }
  ASSERT_TRUE((*runner)->SetInputs(feed).ok());
  ASSERT_TRUE((*runner)->Run().ok());
  const auto& outputs = (*graph)->outputs();
  ASSERT_FALSE(outputs.empty());
  for (size_t o = 0; o < outputs.size(); ++o) {
    auto want = LoadTensorProto((set / fmt::format("output_{}.pb", o)).string());
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    const app::Comparison c =
        app::CompareTensors((*runner)->outputs().at(outputs[o]->name()), *want, 1e-3, 1e-7);
    EXPECT_TRUE(c.shape_ok && c.dtype_ok) << outputs[o]->name() << ": " << c.ToString();
    EXPECT_EQ(c.nan_mismatch, 0) << outputs[o]->name();
    // The zoo's FP32 tolerance (zoo/README.md): relative L2 error below 1e-4 per output.
    EXPECT_LT(c.rel_l2, 1e-4) << outputs[o]->name() << ": " << c.ToString();
  }
}

// "The largest zoo model" of issue 3, by weight bytes: mobilenetv3_tiny (409,394 parameters;
// its convolutions have the most tactic candidates). With --deadline 1s the build stays within
// the bound and is correct; whether the search outlasts 1 s depends on the machine (0.44 s on an
// idle 2-core runner, several seconds under load), so a second build with a deadline well below
// the full search (100 ms) makes sure the bound is actually reached and the engine written at it
// is still correct.
TEST(DeadlineZooTest, LargestByWeightsBuildsWithinDeadlineAndIsCorrect) {
  const fs::path dir = LargestBy("param_count");
  EXPECT_EQ(dir.filename(), "mobilenetv3_tiny");
  BuildWithDeadlineAndCheck(dir, kDeadline, /*search_outlasts_deadline=*/false);
}

TEST(DeadlineZooTest, LargestByWeightsReachesAShortDeadlineAndIsCorrect) {
  const fs::path dir = LargestBy("param_count");
  EXPECT_EQ(dir.filename(), "mobilenetv3_tiny");
  BuildWithDeadlineAndCheck(dir, std::chrono::milliseconds(100),
                            /*search_outlasts_deadline=*/true);
}

// Also the largest by layers, gpt_tiny (479 ONNX nodes): the most layers to import, optimize and
// plan. Its search is short (about 0.1 s), so here the deadline need not be reached.
TEST(DeadlineZooTest, LargestByLayersBuildsWithinDeadlineAndIsCorrect) {
  const fs::path dir = LargestBy("nodes");
  EXPECT_EQ(dir.filename(), "gpt_tiny");
  BuildWithDeadlineAndCheck(dir, kDeadline, /*search_outlasts_deadline=*/false);
}

}  // namespace
}  // namespace kiln
