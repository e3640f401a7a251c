// RunSummary: the four figures as a table and JSON, "not measured" for missing ones.
#include "kiln/obs/run_summary.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace kiln::obs {
namespace {

TEST(RunSummary, UnmeasuredFiguresSayNotMeasuredNeverZero) {
  KilnMetrics m;
  RunSummary s = RunSummary::FromMetrics(m);
  EXPECT_EQ(s.ToTable(),
            "metric               value\n"
            "engine build time    not measured\n"
            "max kernel time      not measured\n"
            "NCCL init latency    not measured\n"
            "peak GPU memory      not measured\n");
  auto j = nlohmann::json::parse(s.ToJson());
  EXPECT_TRUE(j["engine_build_seconds"].is_null());
  EXPECT_TRUE(j["kernel_max_seconds"].is_null());
  EXPECT_TRUE(j["nccl_init_seconds"].is_null());
  EXPECT_TRUE(j["device_memory_peak_bytes"].is_null());
}

TEST(RunSummary, MeasuredFiguresWithUnits) {
  KilnMetrics m;
  m.ObserveEngineBuild(94.5);
  m.ObserveKernel(0.0042);
  m.ObserveDeviceMemory(0, 3ull << 30);
  RunSummary s = RunSummary::FromMetrics(m);
  EXPECT_EQ(s.ToTable(),
            "metric               value\n"
            "engine build time    94.500 s\n"
            "max kernel time      4.200 ms\n"
            "NCCL init latency    not measured\n"
            "peak GPU memory      3.00 GiB\n");
  auto j = nlohmann::json::parse(s.ToJson());
  EXPECT_DOUBLE_EQ(j["engine_build_seconds"].get<double>(), 94.5);
  EXPECT_DOUBLE_EQ(j["kernel_max_seconds"].get<double>(), 0.0042);
  EXPECT_EQ(j["device_memory_peak_bytes"].get<uint64_t>(), 3ull << 30);
}

TEST(RunSummary, JsonRoundTripAndComparison) {
  RunSummary before;
  before.figures.engine_build_seconds = 1800;
  before.figures.nccl_init_seconds = 120;
  before.figures.device_memory_peak_bytes = 40ull << 30;
  auto parsed = RunSummary::FromJson(before.ToJson());
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->figures.engine_build_seconds, 1800.0);
  EXPECT_FALSE(parsed->figures.kernel_max_seconds.has_value());
  EXPECT_EQ(parsed->figures.device_memory_peak_bytes, 40ull << 30);

  RunSummary after;
  after.figures.engine_build_seconds = 90;
  after.figures.kernel_max_seconds = 0.003;
  after.figures.nccl_init_seconds = 2.4;
  after.figures.device_memory_peak_bytes = 20ull << 30;
  std::string table = RunSummary::CompareTable(*parsed, after);
  EXPECT_NE(table.find("engine build time    1800.000 s       90.000 s         0.05x"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("max kernel time      not measured     3.000 ms         -"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("0.50x"), std::string::npos) << table;
}

TEST(RunSummary, BadJsonIsRejected) {
  EXPECT_EQ(RunSummary::FromJson("[1,2]").status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(RunSummary::FromJson("{\"kernel_max_seconds\": \"fast\"}").status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(RunSummary::FromJson("not json").status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace kiln::obs
