// The canonical kiln metrics: names, types, values, run figures, textfile output.
#include "kiln/obs/metrics.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>

#include "tests/obs/metrics_text.h"

namespace kiln::obs {
namespace {

using testing::SampleValue;

TEST(Metrics, CanonicalNamesAndTypesAreExported) {
  KilnMetrics m;
  std::string text = m.Serialize();
  EXPECT_NE(text.find("# TYPE kiln_up gauge"), std::string::npos);
  EXPECT_NE(text.find("# TYPE kiln_engine_build_seconds histogram"), std::string::npos);
  EXPECT_NE(text.find("# TYPE kiln_build_tactics_timed_total counter"), std::string::npos);
  EXPECT_NE(text.find("# TYPE kiln_nccl_init_seconds histogram"), std::string::npos);
  EXPECT_NE(text.find("# TYPE kiln_kernel_seconds histogram"), std::string::npos);
  EXPECT_EQ(SampleValue(text, "kiln_up"), 1.0);
  // Not measured yet: absent, never a misleading 0.
  EXPECT_FALSE(SampleValue(text, "kiln_kernel_max_seconds").has_value());
  EXPECT_FALSE(SampleValue(text, "kiln_device_memory_peak_bytes{device=\"0\"}").has_value());
}

TEST(Metrics, ObservationsShowUpWithTheirValues) {
  KilnMetrics m;
  m.ObserveEngineBuild(42.0);
  m.AddTacticsTimed(17);
  m.ObserveKernel(0.002);
  m.ObserveKernel(0.009);
  m.ObserveKernel(0.001);
  m.ObserveNcclInit(3.5);
  m.ObserveDeviceMemory(0, 1000);
  m.ObserveDeviceMemory(0, 5000);
  m.ObserveDeviceMemory(0, 2000);
  m.ObserveDeviceMemory(1, 7000);
  m.CountError("KILN-E3002");
  m.CountError("KILN-E3002");
  m.CountError("KILN-E7001");
  m.ObservePhase("tactics", 12.0);
  m.SetUp(false);
  std::string t = m.Serialize();
  EXPECT_EQ(SampleValue(t, "kiln_engine_build_seconds_count"), 1.0);
  EXPECT_EQ(SampleValue(t, "kiln_engine_build_seconds_sum"), 42.0);
  EXPECT_EQ(SampleValue(t, "kiln_engine_build_seconds_bucket{le=\"30\"}"), 0.0);
  EXPECT_EQ(SampleValue(t, "kiln_engine_build_seconds_bucket{le=\"60\"}"), 1.0);
  EXPECT_EQ(SampleValue(t, "kiln_build_tactics_timed_total"), 17.0);
  EXPECT_EQ(SampleValue(t, "kiln_kernel_max_seconds"), 0.009);
  EXPECT_EQ(SampleValue(t, "kiln_kernel_seconds_count"), 3.0);
  EXPECT_EQ(SampleValue(t, "kiln_nccl_init_seconds_sum"), 3.5);
  EXPECT_EQ(SampleValue(t, "kiln_device_memory_peak_bytes{device=\"0\"}"), 5000.0);
  EXPECT_EQ(SampleValue(t, "kiln_device_memory_peak_bytes{device=\"1\"}"), 7000.0);
  EXPECT_EQ(SampleValue(t, "kiln_errors_total{code=\"KILN-E3002\"}"), 2.0);
  EXPECT_EQ(SampleValue(t, "kiln_errors_total{code=\"KILN-E7001\"}"), 1.0);
  EXPECT_EQ(SampleValue(t, "kiln_phase_seconds_count{phase=\"tactics\"}"), 1.0);
  EXPECT_EQ(SampleValue(t, "kiln_up"), 0.0);

  RunFigures f = m.Figures();
  EXPECT_EQ(f.engine_build_seconds, 42.0);
  EXPECT_EQ(f.kernel_max_seconds, 0.009);
  EXPECT_EQ(f.nccl_init_seconds, 3.5);
  EXPECT_EQ(f.device_memory_peak_bytes, 7000u);
}

TEST(Metrics, FiguresStartUnmeasured) {
  KilnMetrics m;
  RunFigures f = m.Figures();
  EXPECT_FALSE(f.engine_build_seconds);
  EXPECT_FALSE(f.kernel_max_seconds);
  EXPECT_FALSE(f.nccl_init_seconds);
  EXPECT_FALSE(f.device_memory_peak_bytes);
}

TEST(Metrics, TextfileIsWrittenWholeAndReplaced) {
  KilnMetrics m;
  std::string path = ::testing::TempDir() + "/kiln_metrics_test.prom";
  m.AddTacticsTimed(3);
  ASSERT_TRUE(m.WriteTextfile(path).ok());
  m.AddTacticsTimed(2);
  ASSERT_TRUE(m.WriteTextfile(path).ok());
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(SampleValue(ss.str(), "kiln_build_tactics_timed_total"), 5.0);
  EXPECT_EQ(ss.str(), m.Serialize());
  // No temporary file is left behind.
  std::ifstream tmp(path + ".tmp." + std::to_string(::getpid()));
  EXPECT_FALSE(tmp.good());
  std::remove(path.c_str());
}

TEST(Metrics, TextfileInMissingDirectoryIsACatalogError) {
  KilnMetrics m;
  Status s = m.WriteTextfile("/nonexistent-kiln-dir/metrics.prom");
  EXPECT_EQ(s.code(), ErrorCode::kMetricsFileWriteFailed);
  EXPECT_NE(s.message().find("/nonexistent-kiln-dir/metrics.prom"), std::string::npos);
}

TEST(Metrics, ProcessWideRegistryIsOneObject) {
  EXPECT_EQ(&Metrics(), &Metrics());
  EXPECT_NE(Metrics().Serialize().find("kiln_up"), std::string::npos);
}

}  // namespace
}  // namespace kiln::obs
