// Calibration methods on known distributions, the cache's round trip and its checks, and the
// checks on calibration inputs.
#include "kiln/precision/calibration.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "kiln/backends/cpu/cpu_eval.h"
#include "kiln/onnx/calibration_data.h"
#include "kiln/onnx/onnx_import.h"
#include "kiln/ops/op_schema.h"
#include "tests/precision/test_util.h"

namespace kiln::precision {
namespace {

using kiln::testing::F32;

TEST(Calibration, MinMaxIsTheAbsMax) {
  std::vector<float> v = {-3.0f, 1.0f, 2.5f, 0.0f, -0.5f};
  EXPECT_DOUBLE_EQ(ComputeAmax(v, CalibrationMethod::kMinMax, 99.99), 3.0);
  std::vector<float> zeros(10, 0.0f);
  EXPECT_DOUBLE_EQ(ComputeAmax(zeros, CalibrationMethod::kMinMax, 99.99), 0.0);
}

TEST(Calibration, PercentileOnAKnownSet) {
  // |x| = 1..10000 once each: the p-th percentile is 100*p (within one of the 2048 bins).
  std::vector<float> v;
  for (int i = 1; i <= 10000; ++i) v.push_back(i % 2 ? float(i) : -float(i));
  const double bin = 10000.0 / AbsHistogram::kBins;
  EXPECT_NEAR(ComputeAmax(v, CalibrationMethod::kPercentile, 99.0), 9900.0, bin);
  EXPECT_NEAR(ComputeAmax(v, CalibrationMethod::kPercentile, 50.0), 5000.0, bin);
  EXPECT_NEAR(ComputeAmax(v, CalibrationMethod::kPercentile, 99.99), 9999.0, bin);
  EXPECT_DOUBLE_EQ(ComputeAmax(v, CalibrationMethod::kPercentile, 100.0), 10000.0);
}

TEST(Calibration, EntropyClipsOutliersBelowTheAbsMax) {
  // A unit Gaussian with a few far outliers: min-max would spend the INT8 range on the outliers;
  // the KL-optimal threshold stays near the bulk of the distribution.
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(200000);
  for (float& x : v) x = normal(rng);
  for (int i = 0; i < 10; ++i) v.push_back(i % 2 ? 100.0f : -100.0f);
  double amax = ComputeAmax(v, CalibrationMethod::kEntropy, 99.99);
  EXPECT_LT(amax, 20.0);  // well below the absmax of 100
  EXPECT_GT(amax, 2.5);   // but keeps most of the Gaussian (|x| < 2.5 holds 98.8%)
  EXPECT_DOUBLE_EQ(ComputeAmax(v, CalibrationMethod::kMinMax, 99.99), 100.0);

  // Without outliers a uniform distribution keeps (almost) its whole range.
  std::vector<float> u = kiln::testing::Random(100000, 3, 4.0f);
  double uamax = ComputeAmax(u, CalibrationMethod::kEntropy, 99.99);
  EXPECT_GT(uamax, 3.5);
  EXPECT_LE(uamax, 4.0);
}

TEST(Calibration, MethodNamesParse) {
  EXPECT_EQ(*ParseCalibrationMethod("minmax"), CalibrationMethod::kMinMax);
  EXPECT_EQ(*ParseCalibrationMethod("entropy"), CalibrationMethod::kEntropy);
  EXPECT_EQ(*ParseCalibrationMethod("percentile"), CalibrationMethod::kPercentile);
  auto bad = ParseCalibrationMethod("kl");
  EXPECT_EQ(bad.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("minmax, entropy or percentile"), std::string::npos);
}

// x[2,4] -> Relu -> y
std::unique_ptr<Graph> ReluGraph() {
  auto g = std::make_unique<Graph>();
  Value* x = g->AddInput("x", DataType::kFloat32, MakeShape({2, 4}));
  Value* y = g->AddValue("y", DataType::kFloat32);
  g->AddNode("Relu", "relu", {x}, {y});
  g->MarkOutput(y);
  EXPECT_TRUE(InferShapes(*g).ok());
  return g;
}

TEST(Calibration, StatisticsComeFromTheReference) {
  auto g = ReluGraph();
  std::vector<std::map<std::string, Tensor>> data = {
      {{"x", F32({2, 4}, {-9, 1, 2, 3, 4, 5, 6, 7})}},
      {{"x", F32({2, 4}, {0, 0, 0, 0, 0, 0, 0, 8})}}};
  const int64_t before = CalibrationBatchesRun();
  auto table = Calibrate(*g, cpu::EvaluateNode, data, CalibrationMethod::kMinMax, 99.99);
  ASSERT_TRUE(table.ok()) << table.status().ToString();
  EXPECT_EQ(CalibrationBatchesRun() - before, 2);
  EXPECT_DOUBLE_EQ(table->Find("x")->absmax, 9.0);
  EXPECT_DOUBLE_EQ(table->Find("y")->absmax, 8.0);  // Relu drops the -9
  EXPECT_DOUBLE_EQ(table->Find("y")->amax, 8.0);
  EXPECT_EQ(table->data_sets, 2);
}

TEST(CalibrationCache, RoundTripAndRejections) {
  auto g = ReluGraph();
  std::string dir = kiln::testing::TempDir("cache_round_trip");
  std::string path = dir + "/calib.json";
  CalibrationTable t;
  t.method = CalibrationMethod::kPercentile;
  t.percentile = 99.9;
  t.data_sets = 3;
  t.ranges["x"] = {9.0, 7.123456789012345};
  t.ranges["y"] = {8.0, 8.0};
  t.int8_sensitivity["mm"] = 0.0123456789012345;
  t.int8_sensitivity["bad"] = HUGE_VAL;  // a layer whose INT8 output was not finite
  t.int8_all_rel_l2 = 0.25;
  std::string key = CalibrationCacheKey("modelhash", *g, t.method, t.percentile);
  ASSERT_TRUE(SaveCalibrationCache(path, key, t).ok());
  auto back = LoadCalibrationCache(path, key);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->from_cache);
  EXPECT_EQ(back->method, CalibrationMethod::kPercentile);
  EXPECT_EQ(back->data_sets, 3);
  EXPECT_EQ(back->Find("x")->amax, 7.123456789012345);  // exact: doubles round-trip
  EXPECT_EQ(back->Find("y")->absmax, 8.0);
  EXPECT_EQ(back->int8_sensitivity, t.int8_sensitivity);  // exact, +inf included
  EXPECT_EQ(back->int8_all_rel_l2, 0.25);

  // Another model, another method: foreign.
  for (const std::string& other :
       {CalibrationCacheKey("othermodel", *g, t.method, t.percentile),
        CalibrationCacheKey("modelhash", *g, CalibrationMethod::kEntropy, t.percentile)}) {
    auto foreign = LoadCalibrationCache(path, other);
    EXPECT_EQ(foreign.status().code(), ErrorCode::kCalibrationCacheInvalid);
    EXPECT_NE(foreign.status().message().find("key differs"), std::string::npos);
  }
  // Corrupt bytes, another version, an impossible range.
  std::ofstream(path) << "{\"format\": \"kiln-calibration-cache\", \"vers";
  EXPECT_EQ(LoadCalibrationCache(path, key).status().code(), ErrorCode::kCalibrationCacheInvalid);
  std::ofstream(path) << R"({"format": "kiln-calibration-cache", "version": 99, "key": ")" << key
                      << R"("})";
  auto version = LoadCalibrationCache(path, key);
  EXPECT_NE(version.status().message().find("format version"), std::string::npos);
  std::ofstream(path) << R"({"format": "kiln-calibration-cache", "version": 2, "key": ")" << key
                      << R"(", "method": "minmax", "tensors": {"x": {"absmax": 1, "amax": 5}}})";
  auto impossible = LoadCalibrationCache(path, key);
  EXPECT_NE(impossible.status().message().find("impossible range for 'x'"), std::string::npos);
  // Version 1 (before the INT8 sensitivity) is another version: recalibrated, never half-used.
  std::ofstream(path) << R"({"format": "kiln-calibration-cache", "version": 1, "key": ")" << key
                      << R"(", "method": "minmax", "tensors": {"x": {"absmax": 1, "amax": 1}}})";
  EXPECT_NE(LoadCalibrationCache(path, key).status().message().find("format version"),
            std::string::npos);
  std::ofstream(path) << R"({"format": "kiln-calibration-cache", "version": 2, "key": ")" << key
                      << R"(", "method": "minmax", "tensors": {}, "int8_all_rel_l2": 0.1, )"
                      << R"("int8_sensitivity": {"mm": -1}})";
  EXPECT_NE(LoadCalibrationCache(path, key).status().message().find("impossible sensitivity"),
            std::string::npos);
}

TEST(CalibrationData, WrongShapeDtypeOrCountNamesTheInput) {
  auto g = ReluGraph();
  OptimizationProfile none;
  std::string good = kiln::testing::TempDir("data_good");
  kiln::testing::WriteDataSets(good, {{F32({2, 4}, std::vector<float>(8, 1.0f))}});
  auto ok = LoadCalibrationData(*g, none, good);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->size(), 1u);

  std::string shape = kiln::testing::TempDir("data_shape");
  kiln::testing::WriteDataSets(shape, {{F32({2, 5}, std::vector<float>(10, 1.0f))}});
  auto bad_shape = LoadCalibrationData(*g, none, shape);
  EXPECT_EQ(bad_shape.status().code(), ErrorCode::kCalibrationInputInvalid);
  EXPECT_NE(bad_shape.status().message().find("model input 'x': expected shape [2,4], got [2,5]"),
            std::string::npos)
      << bad_shape.status().message();

  std::string dtype = kiln::testing::TempDir("data_dtype");
  kiln::testing::WriteDataSets(
      dtype, {{Tensor::FromVector(DataType::kInt64, {2, 4}, std::vector<int64_t>(8, 1))}});
  auto bad_dtype = LoadCalibrationData(*g, none, dtype);
  EXPECT_EQ(bad_dtype.status().code(), ErrorCode::kCalibrationInputInvalid);
  EXPECT_NE(bad_dtype.status().message().find("expected dtype f32, got i64"), std::string::npos)
      << bad_dtype.status().message();

  std::string count = kiln::testing::TempDir("data_count");
  kiln::testing::WriteDataSets(count, {{F32({2, 4}, std::vector<float>(8, 1.0f)),
                                        F32({2, 4}, std::vector<float>(8, 1.0f))}});
  auto bad_count = LoadCalibrationData(*g, none, count);
  EXPECT_EQ(bad_count.status().code(), ErrorCode::kCalibrationInputInvalid);
  EXPECT_NE(bad_count.status().message().find("has 2 input file(s); the model has 1 input(s) (x)"),
            std::string::npos)
      << bad_count.status().message();

  std::string empty = kiln::testing::TempDir("data_empty");
  EXPECT_EQ(LoadCalibrationData(*g, none, empty).status().code(),
            ErrorCode::kCalibrationInputInvalid);
}

TEST(CalibrationData, TheDigestIsWhatTheSetsHoldNotWhereTheyLie) {
  std::vector<std::vector<Tensor>> sets = {{F32({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8})},
                                           {F32({2, 4}, {8, 7, 6, 5, 4, 3, 2, 1})}};
  std::string a = kiln::testing::TempDir("digest_a");
  std::string b = kiln::testing::TempDir("digest_b");
  kiln::testing::WriteDataSets(a, sets);
  kiln::testing::WriteDataSets(b, sets);
  std::optional<Hash128> da = CalibrationDataDigest(a);
  ASSERT_TRUE(da.has_value());
  EXPECT_EQ(CalibrationDataDigest(b), da);  // another directory, the same tensors
  std::ofstream(std::filesystem::path(b) / "README.txt") << "not a data set";
  EXPECT_EQ(CalibrationDataDigest(b), da);  // files the loader does not read do not count

  sets[1][0] = F32({2, 4}, {8, 7, 6, 5, 4, 3, 2, 0});  // one value of the second set
  kiln::testing::WriteDataSets(b, sets);
  ASSERT_TRUE(CalibrationDataDigest(b).has_value());
  EXPECT_NE(CalibrationDataDigest(b), da);

  std::string one = kiln::testing::TempDir("digest_one");  // the first set alone
  kiln::testing::WriteDataSets(one, {sets[0]});
  EXPECT_NE(CalibrationDataDigest(one), da);

  EXPECT_FALSE(CalibrationDataDigest(kiln::testing::TempDir("digest_empty")).has_value());
  EXPECT_FALSE(CalibrationDataDigest(a + "/no-such-directory").has_value());
  EXPECT_FALSE(CalibrationDataDigest("").has_value());
}

}  // namespace
}  // namespace kiln::precision
