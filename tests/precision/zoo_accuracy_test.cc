// FP16 and BF16 engines of every zoo model against the FP32 reference outputs stored with the
// model (PyTorch FP32), through the whole engine path. Tolerances: docs/precision.md.
#include <gtest/gtest.h>

#include "kiln/app/conformance.h"
#include "tests/precision/test_util.h"

namespace kiln {
namespace {

// Relative L2 error of every output (||actual - expected|| / ||expected||). Storage rounding is
// 2^-11 (FP16) and 2^-9 (BF16) per layer; the deepest zoo model (efficientnet_tiny) measures
// 1.2e-2 and 6.9e-2 (docs/precision.md lists every model).
constexpr double kFp16MaxRelL2 = 2e-2;
constexpr double kBf16MaxRelL2 = 1e-1;

class ZooPrecision : public ::testing::TestWithParam<std::string> {};

void Check(const std::string& model, bool fp16, bool bf16, double tolerance) {
  app::ConformanceOptions o;
  o.fp16 = fp16;
  o.bf16 = bf16;
  o.max_rel_l2 = tolerance;
  app::CaseResult r = app::RunConformanceCase(testing::ZooDir(model), o);
  EXPECT_TRUE(r.passed) << model << ": " << r.stage << ": " << r.error;
  EXPECT_LE(r.rel_l2, tolerance) << model;
  // A reduced engine that matched FP32 exactly would mean nothing ran reduced.
  EXPECT_GT(r.rel_l2, 0.0) << model;
  ::testing::Test::RecordProperty("rel_l2", std::to_string(r.rel_l2));
  std::printf("%s %s rel_l2 %.3g\n", model.c_str(), fp16 ? "fp16" : "bf16", r.rel_l2);
}

TEST_P(ZooPrecision, Fp16MatchesFp32) { Check(GetParam(), true, false, kFp16MaxRelL2); }
TEST_P(ZooPrecision, Bf16MatchesFp32) { Check(GetParam(), false, true, kBf16MaxRelL2); }

INSTANTIATE_TEST_SUITE_P(Zoo, ZooPrecision,
                         ::testing::Values("resnet_tiny", "mobilenetv3_tiny", "efficientnet_tiny",
                                           "squeezenet_tiny", "vit_tiny", "bert_tiny", "gpt_tiny",
                                           "unet_tiny"));

}  // namespace
}  // namespace kiln
