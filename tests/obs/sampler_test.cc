// The sampler over a scripted GPU source: exported metrics, detector events and counters, and
// failures mid-run that are counted while sampling continues.
#include "kiln/obs/sampler.h"

#include <gtest/gtest.h>

#include <mutex>

#include "kiln/core/logging.h"
#include "kiln/obs/fake_gpu_source.h"
#include "tests/obs/metrics_text.h"

namespace kiln::obs {
namespace {

using std::chrono::seconds;
using testing::SampleValue;
using Clock = Sampler::Clock;

// Captures log events for the test's duration (and keeps the test output quiet).
class CapturedLogs {
 public:
  CapturedLogs() {
    old_ = SetLogSink([this](const LogEvent& e) {
      std::lock_guard lock(mu_);
      events_.push_back(e);
    });
  }
  ~CapturedLogs() { SetLogSink(old_); }
  std::vector<LogEvent> events() {
    std::lock_guard lock(mu_);
    return events_;
  }
  int CountWithField(const std::string& key, const std::string& value) {
    int n = 0;
    for (const auto& e : events()) {
      for (const auto& [k, v] : e.fields) n += (k == key && v == value);
    }
    return n;
  }

 private:
  LogSink old_;
  std::mutex mu_;
  std::vector<LogEvent> events_;
};

GpuSample Busy(int device, double util) {
  GpuSample s;
  s.device = device;
  s.utilization_gpu_ratio = util;
  s.utilization_memory_ratio = util / 2;
  s.memory_total_bytes = 1000;
  s.memory_used_bytes = 400;
  s.temperature_celsius = 55;
  s.power_watts = 300.5;
  s.clock_event_reasons = clock_event::kSwPowerCap;
  s.ecc_corrected_total = 10;
  s.ecc_uncorrected_total = 0;
  return s;
}

TEST(Sampler, ExportsSamplesAsGpuMetrics) {
  CapturedLogs logs;
  FakeGpuSource gpus(2);
  gpus.Set(Busy(0, 0.8));
  gpus.Set(Busy(1, 0.3));
  KilnMetrics m;
  Sampler sampler(&gpus, &m, SamplerOptions{});
  sampler.SampleOnce(Clock::now());
  std::string t = m.Serialize();
  EXPECT_EQ(SampleValue(t, "kiln_nvml_up"), 1.0);
  EXPECT_EQ(SampleValue(t, "kiln_gpu_devices"), 2.0);
  EXPECT_EQ(SampleValue(t, "kiln_gpu_utilization_ratio{gpu=\"0\"}"), 0.8);
  EXPECT_EQ(SampleValue(t, "kiln_gpu_utilization_ratio{gpu=\"1\"}"), 0.3);
  EXPECT_EQ(SampleValue(t, "kiln_gpu_memory_used_bytes{gpu=\"0\"}"), 400.0);
  EXPECT_EQ(SampleValue(t, "kiln_gpu_memory_total_bytes{gpu=\"0\"}"), 1000.0);
  EXPECT_EQ(SampleValue(t, "kiln_gpu_temperature_celsius{gpu=\"1\"}"), 55.0);
  EXPECT_EQ(SampleValue(t, "kiln_gpu_power_watts{gpu=\"1\"}"), 300.5);
  EXPECT_EQ(SampleValue(t, "kiln_gpu_clock_event_active{gpu=\"0\",reason=\"sw_power_cap\"}"), 1.0);
  EXPECT_EQ(SampleValue(t, "kiln_gpu_clock_event_active{gpu=\"0\",reason=\"hw_slowdown\"}"), 0.0);
  EXPECT_EQ(SampleValue(t, "kiln_gpu_samples_total"), 2.0);
  EXPECT_EQ(SampleValue(t, "kiln_gpu_sample_duration_seconds_count"), 1.0);
  // Never reported by these GPUs: absent rather than 0.
  EXPECT_FALSE(SampleValue(t, "kiln_gpu_remap_failed{gpu=\"0\"}").has_value());
  // ECC counters count from the first sample on.
  EXPECT_EQ(SampleValue(t, "kiln_gpu_ecc_errors_total{gpu=\"0\",type=\"corrected\"}"), 0.0);
  GpuSample more = Busy(0, 0.8);
  more.ecc_corrected_total = 13;
  gpus.Set(more);
  sampler.SampleOnce(Clock::now());
  t = m.Serialize();
  EXPECT_EQ(SampleValue(t, "kiln_gpu_ecc_errors_total{gpu=\"0\",type=\"corrected\"}"), 3.0);
  EXPECT_NE(t.find("kiln_gpu_info{gpu=\"1\",name=\"Fake GPU\",pci_bus_id=\"00000000:02:00.0\","
                   "uuid=\"GPU-fake-1\"} 1"),
            std::string::npos);
}

TEST(Sampler, NoSourceExportsNvmlDownAndSamplesNothing) {
  KilnMetrics m;
  Sampler sampler(nullptr, &m, SamplerOptions{});
  EXPECT_TRUE(sampler.Start().ok());
  sampler.SampleOnce(Clock::now());
  sampler.Stop();
  std::string t = m.Serialize();
  EXPECT_EQ(SampleValue(t, "kiln_nvml_up"), 0.0);
  EXPECT_EQ(SampleValue(t, "kiln_gpu_samples_total"), 0.0);
  EXPECT_EQ(sampler.stats().rounds, 0u);
}

TEST(Sampler, FailuresMidRunAreCountedAndSamplingContinues) {
  CapturedLogs logs;
  FakeGpuSource gpus(2);
  gpus.Set(Busy(0, 0.8));
  gpus.Set(Busy(1, 0.8));
  KilnMetrics m;
  Sampler sampler(&gpus, &m, SamplerOptions{});
  Clock::time_point t0 = Clock::now();
  sampler.SampleOnce(t0);
  gpus.FailNextSamples(1, 3, MakeError(ErrorCode::kNvmlCallFailed, "GPU is lost"));
  gpus.FailNextCalls(0, 2, CallError{"nvmlDeviceGetPowerUsage", 999, "Unknown Error"});
  for (int i = 1; i <= 5; ++i) sampler.SampleOnce(t0 + seconds(i));
  SamplerStats st = sampler.stats();
  EXPECT_EQ(st.rounds, 6u);
  EXPECT_EQ(st.sample_failures, 3u);
  EXPECT_EQ(st.samples, 12u - 3u);
  EXPECT_EQ(st.call_failures, 2u);
  std::string t = m.Serialize();
  EXPECT_EQ(SampleValue(t, "kiln_nvml_errors_total{call=\"sample\"}"), 3.0);
  EXPECT_EQ(SampleValue(t, "kiln_nvml_errors_total{call=\"nvmlDeviceGetPowerUsage\"}"), 2.0);
  // One warning per failure streak, not one per poll, each with its catalog code.
  EXPECT_EQ(logs.CountWithField("event", "gpu_sample_failed"), 1);
  EXPECT_EQ(logs.CountWithField("event", "nvml_call_failed"), 1);
  EXPECT_EQ(logs.CountWithField("code", "KILN-E8004"), 2);
  // Device 1 is sampled again after its failures.
  EXPECT_EQ(SampleValue(t, "kiln_gpu_samples_total"), 9.0);
}

TEST(Sampler, DetectorEventsBecomeCountersConditionsAndLogs) {
  CapturedLogs logs;
  FakeGpuSource gpus(1);
  SamplerOptions o;
  o.detectors.collapse_window = seconds(10);
  o.detectors.memory_pressure_ratio = 0.9;
  KilnMetrics m;
  Sampler sampler(&gpus, &m, o);
  std::vector<HealthEvent> seen;
  sampler.SetEventCallback([&](const HealthEvent& e) { seen.push_back(e); });
  Clock::time_point t0 = Clock::now();
  gpus.Set(Busy(0, 0.9));
  for (int i = 0; i < 5; ++i) sampler.SampleOnce(t0 + seconds(i));
  GpuSample idle = Busy(0, 0.0);
  idle.memory_used_bytes = 950;  // and memory pressure
  idle.clock_event_reasons = clock_event::kHwPowerBrakeSlowdown;
  gpus.Set(idle);
  for (int i = 5; i <= 20; ++i) sampler.SampleOnce(t0 + seconds(i));
  std::string t = m.Serialize();
  EXPECT_EQ(SampleValue(t, "kiln_gpu_health_events_total{gpu=\"0\",kind=\"utilization_collapse\"}"),
            1.0);
  EXPECT_EQ(SampleValue(t, "kiln_gpu_health_events_total{gpu=\"0\",kind=\"memory_pressure\"}"),
            1.0);
  EXPECT_EQ(SampleValue(t, "kiln_gpu_health_events_total{gpu=\"0\",kind=\"throttling\"}"), 1.0);
  EXPECT_EQ(SampleValue(t, "kiln_gpu_health_condition{gpu=\"0\",kind=\"utilization_collapse\"}"),
            1.0);
  EXPECT_EQ(sampler.stats().health_events, 3u);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(logs.CountWithField("code", "KILN-E8006"), 1);
  EXPECT_EQ(logs.CountWithField("code", "KILN-E8007"), 1);
  EXPECT_EQ(logs.CountWithField("code", "KILN-E8009"), 1);

  gpus.Set(Busy(0, 0.9));
  sampler.SampleOnce(t0 + seconds(21));
  t = m.Serialize();
  EXPECT_EQ(SampleValue(t, "kiln_gpu_health_condition{gpu=\"0\",kind=\"utilization_collapse\"}"),
            0.0);
  EXPECT_EQ(logs.CountWithField("state", "cleared"), 3);
}

TEST(Sampler, ThreadsSampleAndReportXidsUntilStopped) {
  CapturedLogs logs;
  FakeGpuSource gpus(2);
  gpus.Set(Busy(0, 0.5));
  gpus.Set(Busy(1, 0.5));
  SamplerOptions o;
  o.interval = std::chrono::milliseconds(10);
  o.xid_wait = std::chrono::milliseconds(50);
  KilnMetrics m;
  Sampler sampler(&gpus, &m, o);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<HealthEvent> seen;
  sampler.SetEventCallback([&](const HealthEvent& e) {
    std::lock_guard lock(mu);
    seen.push_back(e);
    cv.notify_all();
  });
  ASSERT_TRUE(sampler.Start().ok());
  EXPECT_FALSE(sampler.Start().ok());  // already running
  gpus.PushXid(1, 48);
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, seconds(10), [&] { return !seen.empty(); }));
  }
  // Let the polling thread run a few rounds (bounded wait).
  for (int i = 0; i < 500 && gpus.samples_taken() < 6; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto stop_start = Clock::now();
  sampler.Stop();
  // Stop is bounded by the Xid wait (50 ms); allow generous scheduling slack on loaded CI.
  EXPECT_LT(Clock::now() - stop_start, seconds(5));
  EXPECT_GE(gpus.samples_taken(), 6);
  EXPECT_EQ(seen[0].kind, HealthKind::kXid);
  EXPECT_EQ(seen[0].xid, 48u);
  std::string t = m.Serialize();
  EXPECT_EQ(SampleValue(t, "kiln_gpu_xid_events_total{gpu=\"1\",xid=\"48\"}"), 1.0);
  EXPECT_EQ(logs.CountWithField("code", "KILN-E8008"), 1);
  int after_stop = gpus.samples_taken();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(gpus.samples_taken(), after_stop);
}

TEST(Sampler, XidThreadEndsWhenTheSourceCannotReportXids) {
  CapturedLogs logs;
  FakeGpuSource gpus(1);
  gpus.DisableXid();
  KilnMetrics m;
  Sampler sampler(&gpus, &m, SamplerOptions{});
  EXPECT_FALSE(sampler.PollXidOnce(std::chrono::milliseconds(10)));
}

TEST(Sampler, InvalidOptionsAreRejected) {
  FakeGpuSource gpus(1);
  KilnMetrics m;
  SamplerOptions o;
  o.interval = std::chrono::milliseconds(0);
  Sampler sampler(&gpus, &m, o);
  EXPECT_EQ(sampler.Start().code(), ErrorCode::kOutOfRange);
}

}  // namespace
}  // namespace kiln::obs
