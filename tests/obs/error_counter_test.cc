// The error-counting log sink and the duration parser used by obs's command-line options.
#include "kiln/obs/error_counter.h"

#include <gtest/gtest.h>

#include "kiln/obs/duration.h"
#include "tests/obs/metrics_text.h"

namespace kiln::obs {
namespace {

using testing::SampleValue;

TEST(ErrorCounter, CountsCodedWarningsAndErrorsAndForwardsEverything) {
  KilnMetrics m;
  std::vector<std::string> forwarded;
  LogSink next = [&](const LogEvent& e) { forwarded.push_back(e.message); };
  LogSink old = SetLogSink(MakeErrorCountingSink(&m, next, LogFormat::kText));
  Log(LogEvent{{}, LogLevel::kError, Subsystem::kBUILD, "no tactic", {{"code", "KILN-E3003"}}});
  Log(LogEvent{{}, LogLevel::kWarn, Subsystem::kOBS, "pressure", {{"code", "KILN-E8007"}}});
  Log(LogEvent{{}, LogLevel::kWarn, Subsystem::kOBS, "again", {{"code", "KILN-E8007"}}});
  Log(LogEvent{{}, LogLevel::kInfo, Subsystem::kOBS, "cleared", {{"code", "KILN-E8007"}}});
  Log(LogEvent{{}, LogLevel::kError, Subsystem::kCLI, "uncoded", {}});
  SetLogSink(old);
  std::string t = m.Serialize();
  EXPECT_EQ(SampleValue(t, "kiln_errors_total{code=\"KILN-E3003\"}"), 1.0);
  EXPECT_EQ(SampleValue(t, "kiln_errors_total{code=\"KILN-E8007\"}"), 2.0);
  EXPECT_EQ(forwarded.size(), 5u);
}

TEST(ErrorCounter, ScopedInstallRestoresThePreviousSink) {
  KilnMetrics m;
  std::vector<std::string> seen;
  LogSink old = SetLogSink([&](const LogEvent& e) { seen.push_back(e.message); });
  {
    ScopedErrorCounting counting(&m, LogFormat::kJson);
    Log(LogEvent{{}, LogLevel::kError, Subsystem::kDIST, "init timeout", {{"code", "KILN-E1004"}}});
  }
  Log(LogEvent{{}, LogLevel::kError, Subsystem::kDIST, "not counted", {{"code", "KILN-E1004"}}});
  SetLogSink(old);
  EXPECT_EQ(SampleValue(m.Serialize(), "kiln_errors_total{code=\"KILN-E1004\"}"), 1.0);
  EXPECT_EQ(seen, (std::vector<std::string>{"init timeout", "not counted"}));
}

TEST(Duration, Parses) {
  EXPECT_EQ(*ParseDuration("10s"), std::chrono::seconds(10));
  EXPECT_EQ(*ParseDuration("1500ms"), std::chrono::milliseconds(1500));
  EXPECT_EQ(*ParseDuration("2.5s"), std::chrono::milliseconds(2500));
  EXPECT_EQ(*ParseDuration("5m"), std::chrono::minutes(5));
  EXPECT_EQ(*ParseDuration("1h"), std::chrono::hours(1));
  EXPECT_EQ(*ParseDuration("30"), std::chrono::seconds(30));
  EXPECT_EQ(ParseDuration("fast").status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ParseDuration("10d").status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ParseDuration("-1s").status().code(), ErrorCode::kOutOfRange);
}

}  // namespace
}  // namespace kiln::obs
