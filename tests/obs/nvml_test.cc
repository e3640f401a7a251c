// The NVML wrapper through dlopen, against a stand-in library with NVML's symbols and ABI
// (fake_nvml.cc), and against no library at all (the CPU machine case).
#include "kiln/obs/nvml.h"

#include <dlfcn.h>
#include <gtest/gtest.h>

namespace kiln::obs {
namespace {

// Control functions of the stand-in library, found in the copy the wrapper loaded.
struct FakeNvmlControl {
  void (*reset)() = nullptr;
  void (*set_init_result)(int) = nullptr;
  void (*fail)(const char*, int) = nullptr;
  void (*push_xid)(int, unsigned long long) = nullptr;
  int (*shutdown_calls)() = nullptr;
  void* handle = nullptr;

  FakeNvmlControl() {
    handle = ::dlopen(KILN_FAKE_NVML_PATH, RTLD_NOW | RTLD_LOCAL);
    if (!handle) return;
    reset = reinterpret_cast<void (*)()>(::dlsym(handle, "fake_nvml_reset"));
    set_init_result = reinterpret_cast<void (*)(int)>(::dlsym(handle, "fake_nvml_set_init_result"));
    fail = reinterpret_cast<void (*)(const char*, int)>(::dlsym(handle, "fake_nvml_fail"));
    push_xid =
        reinterpret_cast<void (*)(int, unsigned long long)>(::dlsym(handle, "fake_nvml_push_xid"));
    shutdown_calls = reinterpret_cast<int (*)()>(::dlsym(handle, "fake_nvml_shutdown_calls"));
    reset();
  }
  ~FakeNvmlControl() {
    if (handle) {
      reset();
      ::dlclose(handle);
    }
  }
};

TEST(Nvml, MissingLibraryIsNotAvailableNotACrash) {
  auto nvml = Nvml::Load("libkiln-no-such-nvml.so.1");
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), ErrorCode::kNvmlUnavailable);
  EXPECT_NE(nvml.status().message().find("libkiln-no-such-nvml.so.1"), std::string::npos);
}

TEST(Nvml, DefaultLibraryLoadsOrSaysWhy) {
  // On a GPU node this loads the driver's NVML; on CI (no driver) it must fail cleanly.
  auto nvml = Nvml::Load();
  if (nvml.ok()) {
    EXPECT_GE((*nvml)->DeviceCount(), 0);
  } else {
    EXPECT_EQ(nvml.status().code(), ErrorCode::kNvmlUnavailable);
  }
}

// On a GPU node: the real driver's values are in range (checks the declared struct layouts
// against a real NVML). Skipped where no NVML is installed (CI).
TEST(Nvml, RealGpuSampleIsPlausible) {
  auto nvml = Nvml::Load();
  if (!nvml.ok() || (*nvml)->DeviceCount() == 0) GTEST_SKIP() << "no NVML or no GPU here";
  auto info = (*nvml)->Info(0);
  ASSERT_TRUE(info.ok());
  EXPECT_FALSE(info->name.empty());
  EXPECT_EQ(info->uuid.rfind("GPU-", 0), 0u) << info->uuid;
  EXPECT_EQ(info->pci_bus_id.size(), 16u) << info->pci_bus_id;  // "00000000:C6:00.0"
  auto s = (*nvml)->Sample(0);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  for (const CallError& e : s->errors) ADD_FAILURE() << e.call << ": " << e.message;
  ASSERT_TRUE(s->memory_total_bytes && s->memory_used_bytes);
  EXPECT_GT(*s->memory_total_bytes, 1ull << 30);
  EXPECT_LE(*s->memory_used_bytes, *s->memory_total_bytes);
  ASSERT_TRUE(s->utilization_gpu_ratio);
  EXPECT_GE(*s->utilization_gpu_ratio, 0.0);
  EXPECT_LE(*s->utilization_gpu_ratio, 1.0);
  ASSERT_TRUE(s->temperature_celsius);
  EXPECT_GT(*s->temperature_celsius, 0.0);
  EXPECT_LT(*s->temperature_celsius, 120.0);
  ASSERT_TRUE(s->power_watts);
  EXPECT_GT(*s->power_watts, 1.0);
  EXPECT_LT(*s->power_watts, 2000.0);
  ASSERT_TRUE(s->clock_event_reasons);
  EXPECT_EQ(*s->clock_event_reasons >> 32, 0u);  // only low bits are defined
  auto xids = (*nvml)->WaitXid(std::chrono::milliseconds(100));
  if (xids.ok()) {
    EXPECT_TRUE(xids->empty());  // a healthy GPU: the wait ends at its bound
  } else {
    EXPECT_EQ(xids.status().code(), ErrorCode::kNvmlNotSupported);
  }
}

TEST(Nvml, InitFailureIsNotAvailable) {
  FakeNvmlControl fake;
  ASSERT_NE(fake.handle, nullptr);
  fake.set_init_result(9);  // NVML_ERROR_DRIVER_NOT_LOADED
  auto nvml = Nvml::Load(KILN_FAKE_NVML_PATH);
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), ErrorCode::kNvmlUnavailable);
  EXPECT_NE(nvml.status().message().find("Driver Not Loaded"), std::string::npos);
}

TEST(Nvml, MemoryHealthReadsEccRemapAndRetiredPages) {
  FakeNvmlControl fake;
  auto loaded = Nvml::Load(KILN_FAKE_NVML_PATH);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  Nvml& nvml = **loaded;
  auto h0 = nvml.MemoryHealth(0);
  ASSERT_TRUE(h0.ok()) << h0.status().ToString();
  EXPECT_TRUE(h0->errors.empty());
  EXPECT_EQ(h0->ecc_enabled, true);
  EXPECT_EQ(h0->ecc_enabled_pending, true);
  EXPECT_EQ(h0->ecc_uncorrected_volatile, 1u);
  EXPECT_EQ(h0->ecc_uncorrected_aggregate, 1u);
  EXPECT_EQ(h0->ecc_corrected_volatile, 3u);
  EXPECT_EQ(h0->ecc_corrected_aggregate, 7u);
  EXPECT_EQ(h0->remapped_rows_correctable, 2u);
  EXPECT_EQ(h0->remapped_rows_uncorrectable, 1u);
  EXPECT_EQ(h0->remap_pending, true);
  EXPECT_EQ(h0->remap_failed, false);
  // Counted with a zero-sized buffer: NVML_ERROR_INSUFFICIENT_SIZE carries the count.
  EXPECT_EQ(h0->retired_pages_sbe, 2u);
  EXPECT_EQ(h0->retired_pages_dbe, 1u);
  EXPECT_EQ(h0->retired_pages_pending, true);

  auto h1 = nvml.MemoryHealth(1);
  ASSERT_TRUE(h1.ok());
  EXPECT_EQ(h1->ecc_enabled_pending, false);
  EXPECT_EQ(h1->ecc_uncorrected_volatile, 0u);
  // Not supported on this device: absent, not an error.
  EXPECT_FALSE(h1->remapped_rows_correctable.has_value());
  EXPECT_FALSE(h1->retired_pages_sbe.has_value());
  EXPECT_FALSE(h1->retired_pages_pending.has_value());
  EXPECT_TRUE(h1->errors.empty());

  fake.fail("nvmlDeviceGetEccMode", 999);
  auto h2 = nvml.MemoryHealth(0);
  ASSERT_TRUE(h2.ok());
  EXPECT_FALSE(h2->ecc_enabled.has_value());
  ASSERT_EQ(h2->errors.size(), 1u);
  EXPECT_EQ(h2->errors[0].call, "nvmlDeviceGetEccMode");
  EXPECT_EQ(h2->errors[0].code, 999);
  EXPECT_EQ(nvml.MemoryHealth(5).status().code(), ErrorCode::kOutOfRange);
}

TEST(Nvml, SampleMapsEveryFieldToBaseUnits) {
  FakeNvmlControl fake;
  auto loaded = Nvml::Load(KILN_FAKE_NVML_PATH);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  Nvml& nvml = **loaded;
  EXPECT_EQ(nvml.DeviceCount(), 2);
  EXPECT_EQ(nvml.DriverVersion(), "550.54.15");
  auto info = nvml.Info(1);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->name, "Fake H200");
  EXPECT_EQ(info->uuid, "GPU-fake-1");
  EXPECT_EQ(info->pci_bus_id, "00000000:C7:00.0");

  auto s0 = nvml.Sample(0);
  ASSERT_TRUE(s0.ok());
  EXPECT_TRUE(s0->errors.empty());
  EXPECT_EQ(s0->memory_total_bytes, 141ull << 30);
  EXPECT_EQ(s0->memory_used_bytes, 100ull << 30);
  EXPECT_DOUBLE_EQ(*s0->utilization_gpu_ratio, 0.87);
  EXPECT_DOUBLE_EQ(*s0->utilization_memory_ratio, 0.25);
  EXPECT_EQ(s0->temperature_celsius, 61.0);
  EXPECT_DOUBLE_EQ(*s0->power_watts, 512.345);
  // Only the older ...ThrottleReasons symbol exists in the stand-in: the fallback was used.
  EXPECT_EQ(s0->clock_event_reasons, clock_event::kSwPowerCap);
  EXPECT_EQ(s0->ecc_corrected_total, 7u);
  EXPECT_EQ(s0->ecc_uncorrected_total, 1u);
  EXPECT_EQ(s0->remapped_rows_correctable, 2u);
  EXPECT_EQ(s0->remapped_rows_uncorrectable, 1u);
  EXPECT_EQ(s0->remap_pending, true);
  EXPECT_EQ(s0->remap_failed, false);

  auto s1 = nvml.Sample(1);
  ASSERT_TRUE(s1.ok());
  EXPECT_EQ(s1->clock_event_reasons, clock_event::kHwSlowdown | clock_event::kHwThermalSlowdown);
  // "Not supported" is an absent value, not an error.
  EXPECT_FALSE(s1->remapped_rows_correctable.has_value());
  EXPECT_TRUE(s1->errors.empty());

  EXPECT_EQ(nvml.Sample(2).status().code(), ErrorCode::kOutOfRange);
}

TEST(Nvml, FailedCallMidRunIsRecordedAndTheRestOfTheSampleSurvives) {
  FakeNvmlControl fake;
  auto loaded = Nvml::Load(KILN_FAKE_NVML_PATH);
  ASSERT_TRUE(loaded.ok());
  fake.fail("nvmlDeviceGetPowerUsage", 15);  // NVML_ERROR_GPU_IS_LOST
  auto s = (*loaded)->Sample(0);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->errors.size(), 1u);
  EXPECT_EQ(s->errors[0].call, "nvmlDeviceGetPowerUsage");
  EXPECT_EQ(s->errors[0].code, 15);
  EXPECT_EQ(s->errors[0].message, "GPU is lost");
  EXPECT_FALSE(s->power_watts.has_value());
  EXPECT_EQ(s->memory_used_bytes, 100ull << 30);
  fake.fail("nvmlDeviceGetPowerUsage", 0);
  auto again = (*loaded)->Sample(0);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->errors.empty());
  EXPECT_TRUE(again->power_watts.has_value());
}

TEST(Nvml, XidEventsArriveWithDeviceAndNumber) {
  FakeNvmlControl fake;
  auto loaded = Nvml::Load(KILN_FAKE_NVML_PATH);
  ASSERT_TRUE(loaded.ok());
  fake.push_xid(1, 79);
  auto events = (*loaded)->WaitXid(std::chrono::milliseconds(1000));
  ASSERT_TRUE(events.ok()) << events.status().ToString();
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].device, 1);
  EXPECT_EQ((*events)[0].xid, 79u);
}

TEST(Nvml, XidWaitReturnsEmptyAtItsBound) {
  FakeNvmlControl fake;
  auto loaded = Nvml::Load(KILN_FAKE_NVML_PATH);
  ASSERT_TRUE(loaded.ok());
  auto start = std::chrono::steady_clock::now();
  auto events = (*loaded)->WaitXid(std::chrono::milliseconds(50));
  auto waited = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(events.ok());
  EXPECT_TRUE(events->empty());
  EXPECT_GE(waited, std::chrono::milliseconds(50));
}

TEST(Nvml, ShutdownOnDestruction) {
  FakeNvmlControl fake;
  int before = fake.shutdown_calls();
  {
    auto loaded = Nvml::Load(KILN_FAKE_NVML_PATH);
    ASSERT_TRUE(loaded.ok());
  }
  EXPECT_EQ(fake.shutdown_calls(), before + 1);
}

TEST(Nvml, XidMeaningsFollowTheDesignTable) {
  EXPECT_NE(XidMeaning(79).find("fallen off the bus"), std::string_view::npos);
  EXPECT_NE(XidMeaning(48).find("double-bit ECC"), std::string_view::npos);
  EXPECT_NE(XidMeaning(31).find("application"), std::string_view::npos);
  EXPECT_NE(XidMeaning(119).find("reset the GPU"), std::string_view::npos);
}

}  // namespace
}  // namespace kiln::obs
