// ONNX's own single-operator test models (1700+, every op and opset; installed with the onnx
// package by scripts/python_env.sh): each imports, or fails with a model-import catalog error
// that names its cause. Skipped when .venv is absent (set KILN_ONNX_NODE_TESTS to the folder).
#include <gtest/gtest.h>

#include "tests/onnx/model_builder.h"

namespace kiln {
namespace {

using namespace kiln::testing;  // NOLINT
namespace fs = std::filesystem;

fs::path NodeTestsDir() {
  if (const char* d = std::getenv("KILN_ONNX_NODE_TESTS")) return d;
  fs::path lib = SourceDir() / ".venv" / "lib";
  if (!fs::exists(lib)) return {};
  for (const auto& e : fs::directory_iterator(lib)) {
    fs::path p = e.path() / "site-packages/onnx/backend/test/data/node";
    if (fs::exists(p)) return p;
  }
  return {};
}

TEST(OnnxNodeTests, EveryModelImportsOrFailsWithAnImportError) {
  fs::path dir = NodeTestsDir();
  if (dir.empty() || !fs::exists(dir)) GTEST_SKIP() << "no ONNX node tests (.venv missing)";
  std::map<std::string, int> outcomes;
  int total = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    fs::path model = e.path() / "model.onnx";
    if (!fs::exists(model)) continue;
    ++total;
    ImportOptions opts;
    opts.allow_unsupported_ops = true;
    auto g = ImportOnnxFile(model.string(), opts);
    if (g.ok()) {
      ++outcomes["ok"];
      continue;
    }
    const ErrorInfo& info = LookupError(g.status().code());
    ++outcomes[info.Id()];
    // Opsets, types and attributes kiln lacks are expected; anything else names a real problem.
    EXPECT_TRUE(info.number >= 2000 && info.number < 3000)
        << e.path().filename() << ": " << g.status().ToString();
    EXPECT_NE(g.status().code(), ErrorCode::kModelNotProtobuf) << e.path().filename();
    EXPECT_NE(g.status().code(), ErrorCode::kModelTruncated) << e.path().filename();
    EXPECT_NE(g.status().code(), ErrorCode::kGraphCycle) << e.path().filename();
  }
  std::string summary;
  for (const auto& [k, v] : outcomes) summary += fmt::format(" {}={}", k, v);
  std::cout << "[ node tests ] " << total << " models:" << summary << "\n";
  EXPECT_GT(total, 1000);
  EXPECT_GT(outcomes["ok"], total / 3);
}

}  // namespace
}  // namespace kiln
