// Health detectors on scripted samples with an explicit clock.
#include "kiln/obs/detectors.h"

#include <gtest/gtest.h>

namespace kiln::obs {
namespace {

using Clock = HealthDetectors::Clock;
using std::chrono::seconds;

GpuSample Util(int device, double ratio) {
  GpuSample s;
  s.device = device;
  s.utilization_gpu_ratio = ratio;
  return s;
}

TEST(Detectors, UtilizationCollapseAfterTheWindowOnce) {
  DetectorConfig c;
  c.collapse_window = seconds(30);
  HealthDetectors d(c);
  Clock::time_point t0{};
  // Five "epochs" of work, then near zero.
  for (int i = 0; i < 50; ++i) EXPECT_TRUE(d.Observe(Util(0, 0.9), t0 + seconds(i)).empty());
  EXPECT_TRUE(d.Observe(Util(0, 0.01), t0 + seconds(50)).empty());
  EXPECT_TRUE(d.Observe(Util(0, 0.0), t0 + seconds(79)).empty());  // 29 s idle: not yet
  auto ev = d.Observe(Util(0, 0.02), t0 + seconds(80));            // 30 s idle
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, HealthKind::kUtilizationCollapse);
  EXPECT_TRUE(ev[0].active);
  EXPECT_EQ(ev[0].device, 0);
  EXPECT_NE(ev[0].detail.find("30 s"), std::string::npos);
  EXPECT_TRUE(d.Active(HealthKind::kUtilizationCollapse, 0));
  // Still idle: no second event.
  EXPECT_TRUE(d.Observe(Util(0, 0.0), t0 + seconds(200)).empty());
  // Working again: cleared once.
  ev = d.Observe(Util(0, 0.7), t0 + seconds(201));
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_FALSE(ev[0].active);
  EXPECT_FALSE(d.Active(HealthKind::kUtilizationCollapse, 0));
}

TEST(Detectors, AGpuThatNeverWorkedDoesNotCollapse) {
  HealthDetectors d(DetectorConfig{});
  Clock::time_point t0{};
  for (int i = 0; i < 600; i += 10) EXPECT_TRUE(d.Observe(Util(3, 0.0), t0 + seconds(i)).empty());
  EXPECT_FALSE(d.Active(HealthKind::kUtilizationCollapse, 3));
}

TEST(Detectors, ShortDipsDoNotCollapse) {
  DetectorConfig c;
  c.collapse_window = seconds(60);
  HealthDetectors d(c);
  Clock::time_point t0{};
  d.Observe(Util(0, 0.95), t0);
  for (int i = 1; i < 600; ++i) {
    // 40 s idle, 1 s busy, repeat: never 60 s in a row.
    double u = (i % 41 == 0) ? 0.9 : 0.0;
    EXPECT_TRUE(d.Observe(Util(0, u), t0 + seconds(i)).empty()) << "at " << i;
  }
}

TEST(Detectors, MissingUtilizationNeitherStartsNorEndsIdleness) {
  DetectorConfig c;
  c.collapse_window = seconds(10);
  HealthDetectors d(c);
  Clock::time_point t0{};
  d.Observe(Util(0, 0.9), t0);
  d.Observe(Util(0, 0.0), t0 + seconds(1));
  GpuSample missing;
  missing.device = 0;
  EXPECT_TRUE(d.Observe(missing, t0 + seconds(5)).empty());
  EXPECT_EQ(d.Observe(Util(0, 0.0), t0 + seconds(11)).size(), 1u);
}

TEST(Detectors, MemoryPressureWithHysteresis) {
  DetectorConfig c;
  c.memory_pressure_ratio = 0.9;
  c.memory_hysteresis = 0.05;
  HealthDetectors d(c);
  Clock::time_point t0{};
  auto mem = [](uint64_t used) {
    GpuSample s;
    s.device = 1;
    s.memory_total_bytes = 1000;
    s.memory_used_bytes = used;
    return s;
  };
  EXPECT_TRUE(d.Observe(mem(899), t0).empty());
  auto ev = d.Observe(mem(900), t0 + seconds(1));
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, HealthKind::kMemoryPressure);
  EXPECT_TRUE(ev[0].active);
  EXPECT_NE(ev[0].detail.find("900 of 1000 bytes"), std::string::npos);
  EXPECT_TRUE(d.Observe(mem(990), t0 + seconds(2)).empty());
  EXPECT_TRUE(d.Observe(mem(860), t0 + seconds(3)).empty());  // inside the hysteresis band
  ev = d.Observe(mem(840), t0 + seconds(4));
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_FALSE(ev[0].active);
}

TEST(Detectors, ThrottlingIgnoresPowerCapAndHonoursItsWindow) {
  DetectorConfig c;
  c.throttle_window = seconds(5);
  HealthDetectors d(c);
  Clock::time_point t0{};
  auto reasons = [](uint64_t bits) {
    GpuSample s;
    s.device = 0;
    s.clock_event_reasons = bits;
    return s;
  };
  EXPECT_TRUE(d.Observe(reasons(clock_event::kSwPowerCap | clock_event::kGpuIdle), t0).empty());
  EXPECT_TRUE(d.Observe(reasons(clock_event::kHwThermalSlowdown), t0 + seconds(1)).empty());
  EXPECT_TRUE(d.Observe(reasons(clock_event::kHwThermalSlowdown), t0 + seconds(5)).empty());
  auto ev = d.Observe(reasons(clock_event::kHwThermalSlowdown | clock_event::kHwSlowdown),
                      t0 + seconds(6));
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].kind, HealthKind::kThrottling);
  EXPECT_NE(ev[0].detail.find("hw_slowdown,hw_thermal_slowdown"), std::string::npos);
  ev = d.Observe(reasons(0), t0 + seconds(7));
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_FALSE(ev[0].active);
}

TEST(Detectors, XidEventNamesTheXid) {
  HealthDetectors d(DetectorConfig{});
  HealthEvent e = d.OnXid({2, 79, {}});
  EXPECT_EQ(e.kind, HealthKind::kXid);
  EXPECT_EQ(e.device, 2);
  EXPECT_EQ(e.xid, 79u);
  EXPECT_NE(e.detail.find("Xid 79"), std::string::npos);
  EXPECT_NE(e.detail.find("fallen off the bus"), std::string::npos);
  EXPECT_EQ(CodeOf(HealthKind::kXid), ErrorCode::kGpuXid);
}

TEST(Detectors, ConfigIsValidated) {
  DetectorConfig c;
  EXPECT_TRUE(Validate(c).ok());
  c.idle_ratio = 0.6;
  EXPECT_EQ(Validate(c).code(), ErrorCode::kOutOfRange);
  c = DetectorConfig{};
  c.memory_pressure_ratio = 1.5;
  EXPECT_EQ(Validate(c).code(), ErrorCode::kOutOfRange);
}

}  // namespace
}  // namespace kiln::obs
