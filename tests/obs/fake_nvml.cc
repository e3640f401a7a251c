// A stand-in for libnvidia-ml.so.1 with NVML's symbol names and ABI, so the real dlopen/dlsym
// wrapper (kiln/obs/nvml.cc) is tested on machines without a GPU. Tests script it through the
// fake_nvml_* functions. It deliberately lacks nvmlDeviceGetCurrentClocksEventReasons, so the
// wrapper's fallback to the older ...ThrottleReasons name is exercised too.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace {

struct Device {
  int index;
};
Device g_devices[2] = {{0}, {1}};

struct EventData {
  void* device;
  unsigned long long eventType;
  unsigned long long eventData;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

std::mutex g_mu;
int g_init_result = 0;
int g_init_calls = 0;
int g_shutdown_calls = 0;
std::map<std::string, int> g_fail;  // function name -> return code
std::deque<std::pair<int, unsigned long long>> g_xids;
unsigned int g_util[2] = {87, 40};

int Fail(const char* fn) {
  std::lock_guard lock(g_mu);
  auto it = g_fail.find(fn);
  return it == g_fail.end() ? 0 : it->second;
}

int Index(void* device) { return static_cast<Device*>(device)->index; }

}  // namespace

extern "C" {

// ---- control (not NVML) ----
void fake_nvml_reset() {
  std::lock_guard lock(g_mu);
  g_init_result = 0;
  g_fail.clear();
  g_xids.clear();
  g_util[0] = 87;
  g_util[1] = 40;
}
void fake_nvml_set_init_result(int rc) {
  std::lock_guard lock(g_mu);
  g_init_result = rc;
}
void fake_nvml_fail(const char* fn, int rc) {
  std::lock_guard lock(g_mu);
  if (rc == 0) {
    g_fail.erase(fn);
  } else {
    g_fail[fn] = rc;
  }
}
void fake_nvml_push_xid(int device, unsigned long long xid) {
  std::lock_guard lock(g_mu);
  g_xids.emplace_back(device, xid);
}
void fake_nvml_set_util(int device, unsigned int util) {
  std::lock_guard lock(g_mu);
  g_util[device] = util;
}
int fake_nvml_shutdown_calls() {
  std::lock_guard lock(g_mu);
  return g_shutdown_calls;
}

// ---- NVML ----
int nvmlInit_v2() {
  std::lock_guard lock(g_mu);
  ++g_init_calls;
  return g_init_result;
}
int nvmlShutdown() {
  std::lock_guard lock(g_mu);
  ++g_shutdown_calls;
  return 0;
}
const char* nvmlErrorString(int rc) {
  switch (rc) {
    case 0:
      return "Success";
    case 3:
      return "Not Supported";
    case 9:
      return "Driver Not Loaded";
    case 10:
      return "Timeout";
    case 15:
      return "GPU is lost";
    default:
      return "Unknown Error";
  }
}
int nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = 2;
  return 0;
}
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void** device) {
  if (i >= 2) return 2;
  *device = &g_devices[i];
  return 0;
}
int nvmlSystemGetDriverVersion(char* buf, unsigned int len) {
  std::strncpy(buf, "550.54.15", len);
  return 0;
}
int nvmlDeviceGetName(void* d, char* buf, unsigned int len) {
  std::strncpy(buf, "Fake H200", len);
  return 0;
}
int nvmlDeviceGetUUID(void* d, char* buf, unsigned int len) {
  std::snprintf(buf, len, "GPU-fake-%d", Index(d));
  return 0;
}
struct PciInfo {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
int nvmlDeviceGetPciInfo_v3(void* d, PciInfo* p) {
  std::memset(p, 0, sizeof(*p));
  std::snprintf(p->busId, sizeof(p->busId), "00000000:%02X:00.0", 0xC6 + Index(d));
  return 0;
}
struct Memory {
  unsigned long long total, free, used;
};
int nvmlDeviceGetMemoryInfo(void* d, Memory* m) {
  if (int rc = Fail("nvmlDeviceGetMemoryInfo")) return rc;
  m->total = 141ull << 30;
  m->used = (Index(d) == 0 ? 100ull : 10ull) << 30;
  m->free = m->total - m->used;
  return 0;
}
struct Utilization {
  unsigned int gpu, memory;
};
int nvmlDeviceGetUtilizationRates(void* d, Utilization* u) {
  if (int rc = Fail("nvmlDeviceGetUtilizationRates")) return rc;
  std::lock_guard lock(g_mu);
  u->gpu = g_util[Index(d)];
  u->memory = 25;
  return 0;
}
int nvmlDeviceGetTemperature(void* d, int sensor, unsigned int* t) {
  if (int rc = Fail("nvmlDeviceGetTemperature")) return rc;
  if (sensor != 0) return 2;
  *t = 61;
  return 0;
}
int nvmlDeviceGetPowerUsage(void* d, unsigned int* mw) {
  if (int rc = Fail("nvmlDeviceGetPowerUsage")) return rc;
  *mw = 512345;
  return 0;
}
int nvmlDeviceGetCurrentClocksThrottleReasons(void* d, unsigned long long* r) {
  if (int rc = Fail("nvmlDeviceGetCurrentClocksThrottleReasons")) return rc;
  *r = Index(d) == 0 ? 0x4ull : 0x48ull;  // dev 0: power cap; dev 1: + HW slowdown + HW thermal
  return 0;
}
int nvmlDeviceGetTotalEccErrors(void* d, int type, int counter, unsigned long long* n) {
  if (int rc = Fail("nvmlDeviceGetTotalEccErrors")) return rc;
  // Aggregate (counter 1): 7 corrected, 1 uncorrected; volatile (counter 0): 3 and 1 on device 0,
  // nothing since the last reset on device 1.
  if (counter == 1) {
    *n = type == 0 ? 7 : 1;
  } else if (counter == 0) {
    *n = Index(d) == 1 ? 0 : (type == 0 ? 3 : 1);
  } else {
    return 2;
  }
  return 0;
}
int nvmlDeviceGetEccMode(void* d, int* current, int* pending) {
  if (int rc = Fail("nvmlDeviceGetEccMode")) return rc;
  *current = 1;
  *pending = Index(d) == 1 ? 0 : 1;  // device 1: ECC turned off at the next reboot
  return 0;
}
// Device 0 is pre-Ampere-like here: 2 single-bit and 1 double-bit retired pages, one pending.
int nvmlDeviceGetRetiredPages(void* d, int cause, unsigned int* count, unsigned long long* addr) {
  if (int rc = Fail("nvmlDeviceGetRetiredPages")) return rc;
  if (Index(d) == 1) return 3;
  unsigned int have = cause == 0 ? 2 : 1;
  if (*count < have) {
    *count = have;
    return 7;  // NVML_ERROR_INSUFFICIENT_SIZE
  }
  for (unsigned int i = 0; i < have; ++i) addr[i] = 0x1000ull * (i + 1);
  *count = have;
  return 0;
}
int nvmlDeviceGetRetiredPagesPendingStatus(void* d, int* pending) {
  if (int rc = Fail("nvmlDeviceGetRetiredPagesPendingStatus")) return rc;
  if (Index(d) == 1) return 3;
  *pending = 1;
  return 0;
}
int nvmlDeviceGetRemappedRows(void* d, unsigned int* corr, unsigned int* unc, unsigned int* pending,
                              unsigned int* failed) {
  if (Index(d) == 1) return 3;  // not supported on device 1
  *corr = 2;
  *unc = 1;
  *pending = 1;
  *failed = 0;
  return 0;
}
int nvmlEventSetCreate(void** set) {
  static int dummy;
  *set = &dummy;
  return 0;
}
int nvmlEventSetFree(void* set) { return 0; }
int nvmlDeviceRegisterEvents(void* d, unsigned long long types, void* set) {
  return (types & 0x8ull) ? 0 : 2;
}
int nvmlEventSetWait_v2(void* set, EventData* data, unsigned int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    {
      std::lock_guard lock(g_mu);
      if (!g_xids.empty()) {
        auto [dev, xid] = g_xids.front();
        g_xids.pop_front();
        data->device = &g_devices[dev];
        data->eventType = 0x8ull;
        data->eventData = xid;
        data->gpuInstanceId = 0xFFFFFFFFu;
        data->computeInstanceId = 0xFFFFFFFFu;
        return 0;
      }
    }
    if (std::chrono::steady_clock::now() >= deadline) return 10;  // NVML_ERROR_TIMEOUT
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // extern "C"
