#include "kiln/core/logging.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace kiln {
namespace {

TEST(Logging, SinkReceivesEventsAboveLevel) {
  std::vector<LogEvent> seen;
  LogSink old = SetLogSink([&](const LogEvent& e) { seen.push_back(e); });
  SetLogLevel(LogLevel::kWarn);
  KILN_LOG(Info, BUILD, "hidden {}", 1);
  KILN_LOG(Warn, BUILD, "shown {}", 2);
  SetLogSink(old);
  SetLogLevel(LogLevel::kInfo);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].message, "shown 2");
  EXPECT_EQ(seen[0].subsystem, Subsystem::kBUILD);
}

TEST(Logging, JsonFormatIsParseable) {
  LogEvent e{std::chrono::system_clock::now(),
             LogLevel::kError,
             Subsystem::kDIST,
             "a \"quoted\" msg",
             {{"code", "KILN-E7001"}}};
  auto j = nlohmann::json::parse(FormatLogEvent(e, LogFormat::kJson));
  EXPECT_EQ(j["level"], "ERROR");
  EXPECT_EQ(j["subsystem"], "DIST");
  EXPECT_EQ(j["msg"], "a \"quoted\" msg");
  EXPECT_EQ(j["code"], "KILN-E7001");
  EXPECT_EQ(FormatLogEvent(e, LogFormat::kText),
            "[kiln ERROR DIST] a \"quoted\" msg code=KILN-E7001");
}

}  // namespace
}  // namespace kiln
