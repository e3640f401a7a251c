// NVML through dlopen/dlsym. The few types kiln needs are declared here from NVML's documented
// ABI (nvml.h); every function is resolved by its real, versioned symbol name.
#include "kiln/obs/nvml.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <utility>

namespace kiln::obs {
namespace {

// ---- NVML ABI (nvml.h) -------------------------------------------------------------------
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
using nvmlEventSet_t = void*;
constexpr nvmlReturn_t NVML_SUCCESS = 0;
constexpr nvmlReturn_t NVML_ERROR_NOT_SUPPORTED = 3;
constexpr nvmlReturn_t NVML_ERROR_TIMEOUT = 10;
constexpr nvmlReturn_t NVML_ERROR_FUNCTION_NOT_FOUND = 13;
constexpr int NVML_TEMPERATURE_GPU = 0;
constexpr int NVML_MEMORY_ERROR_TYPE_CORRECTED = 0;
constexpr int NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1;
constexpr int NVML_VOLATILE_ECC = 0;
constexpr int NVML_AGGREGATE_ECC = 1;
constexpr nvmlReturn_t NVML_ERROR_INSUFFICIENT_SIZE = 7;
// nvmlPageRetirementCause_t
constexpr int NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0;
constexpr int NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1;
using nvmlEnableState_t = int;  // NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1
constexpr unsigned long long nvmlEventTypeXidCriticalError = 0x8ULL;
constexpr unsigned int kNameBufferSize = 96;    // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned int kUuidBufferSize = 96;    // NVML_DEVICE_UUID_V2_BUFFER_SIZE
constexpr unsigned int kDriverBufferSize = 80;  // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE

struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
// Layout of nvmlPciInfo_t used by nvmlDeviceGetPciInfo_v2/_v3.
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;
  unsigned int pciSubSystemId;
  char busId[32];
};
// The layout nvmlEventSetWait_v2 fills (the instance ids were added with MIG).
struct nvmlEventData_t {
  nvmlDevice_t device;
  unsigned long long eventType;
  unsigned long long eventData;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
};

}  // namespace

struct Nvml::Api {
  nvmlReturn_t (*Init)() = nullptr;
  nvmlReturn_t (*Shutdown)() = nullptr;
  const char* (*ErrorString)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*GetCount)(unsigned int*) = nullptr;
  nvmlReturn_t (*GetHandleByIndex)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*GetName)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*GetUuid)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*GetPciInfo)(nvmlDevice_t, nvmlPciInfo_t*) = nullptr;
  nvmlReturn_t (*DriverVersion)(char*, unsigned int) = nullptr;
  nvmlReturn_t (*GetMemoryInfo)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*GetUtilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*GetTemperature)(nvmlDevice_t, int, unsigned int*) = nullptr;
  nvmlReturn_t (*GetPowerUsage)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*GetClockEventReasons)(nvmlDevice_t, unsigned long long*) = nullptr;
  const char* clock_event_call = "nvmlDeviceGetCurrentClocksEventReasons";
  nvmlReturn_t (*GetTotalEccErrors)(nvmlDevice_t, int, int, unsigned long long*) = nullptr;
  nvmlReturn_t (*GetRemappedRows)(nvmlDevice_t, unsigned int*, unsigned int*, unsigned int*,
                                  unsigned int*) = nullptr;
  nvmlReturn_t (*GetEccMode)(nvmlDevice_t, nvmlEnableState_t*, nvmlEnableState_t*) = nullptr;
  nvmlReturn_t (*GetRetiredPages)(nvmlDevice_t, int, unsigned int*, unsigned long long*) = nullptr;
  nvmlReturn_t (*GetRetiredPagesPendingStatus)(nvmlDevice_t, nvmlEnableState_t*) = nullptr;
  nvmlReturn_t (*EventSetCreate)(nvmlEventSet_t*) = nullptr;
  nvmlReturn_t (*EventSetFree)(nvmlEventSet_t) = nullptr;
  nvmlReturn_t (*RegisterEvents)(nvmlDevice_t, unsigned long long, nvmlEventSet_t) = nullptr;
  nvmlReturn_t (*EventSetWait)(nvmlEventSet_t, nvmlEventData_t*, unsigned int) = nullptr;
};

namespace {

template <typename Fn>
void Resolve(void* lib, Fn* slot, const char* symbol) {
  *slot = reinterpret_cast<Fn>(::dlsym(lib, symbol));
}

}  // namespace

Nvml::Nvml() : api_(std::make_unique<Api>()) {}

StatusOr<std::unique_ptr<Nvml>> Nvml::Load(const std::string& library) {
  // dlopen would block on a FIFO named as the library (its open waits for a writer) and read a
  // device: a path (not a bare name searched by the loader) must be a regular file.
  struct stat st {};
  if (library.find('/') != std::string::npos && ::stat(library.c_str(), &st) == 0 &&
      !S_ISREG(st.st_mode)) {
    return MakeError(ErrorCode::kNvmlUnavailable,
                     "cannot load {}: not a regular file (a FIFO, device or directory)", library);
  }
  ::dlerror();
  void* lib = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = ::dlerror();
    return MakeError(ErrorCode::kNvmlUnavailable, "cannot load {}: {}", library,
                     why ? why : "unknown dlopen error");
  }
  std::unique_ptr<Nvml> nvml(new Nvml());
  nvml->lib_ = lib;
  Api& a = *nvml->api_;
  Resolve(lib, &a.Init, "nvmlInit_v2");
  Resolve(lib, &a.Shutdown, "nvmlShutdown");
  Resolve(lib, &a.ErrorString, "nvmlErrorString");
  Resolve(lib, &a.GetCount, "nvmlDeviceGetCount_v2");
  Resolve(lib, &a.GetHandleByIndex, "nvmlDeviceGetHandleByIndex_v2");
  Resolve(lib, &a.GetName, "nvmlDeviceGetName");
  Resolve(lib, &a.GetUuid, "nvmlDeviceGetUUID");
  Resolve(lib, &a.GetPciInfo, "nvmlDeviceGetPciInfo_v3");
  if (a.GetPciInfo == nullptr) Resolve(lib, &a.GetPciInfo, "nvmlDeviceGetPciInfo_v2");
  Resolve(lib, &a.DriverVersion, "nvmlSystemGetDriverVersion");
  Resolve(lib, &a.GetMemoryInfo, "nvmlDeviceGetMemoryInfo");
  Resolve(lib, &a.GetUtilization, "nvmlDeviceGetUtilizationRates");
  Resolve(lib, &a.GetTemperature, "nvmlDeviceGetTemperature");
  Resolve(lib, &a.GetPowerUsage, "nvmlDeviceGetPowerUsage");
  Resolve(lib, &a.GetClockEventReasons, "nvmlDeviceGetCurrentClocksEventReasons");
  if (a.GetClockEventReasons == nullptr) {
    // Drivers before 535 only have the older name for the same bits.
    Resolve(lib, &a.GetClockEventReasons, "nvmlDeviceGetCurrentClocksThrottleReasons");
    a.clock_event_call = "nvmlDeviceGetCurrentClocksThrottleReasons";
  }
  Resolve(lib, &a.GetTotalEccErrors, "nvmlDeviceGetTotalEccErrors");
  Resolve(lib, &a.GetRemappedRows, "nvmlDeviceGetRemappedRows");
  Resolve(lib, &a.GetEccMode, "nvmlDeviceGetEccMode");
  Resolve(lib, &a.GetRetiredPages, "nvmlDeviceGetRetiredPages");
  Resolve(lib, &a.GetRetiredPagesPendingStatus, "nvmlDeviceGetRetiredPagesPendingStatus");
  Resolve(lib, &a.EventSetCreate, "nvmlEventSetCreate");
  Resolve(lib, &a.EventSetFree, "nvmlEventSetFree");
  Resolve(lib, &a.RegisterEvents, "nvmlDeviceRegisterEvents");
  Resolve(lib, &a.EventSetWait, "nvmlEventSetWait_v2");

  if (a.Init == nullptr || a.GetCount == nullptr || a.GetHandleByIndex == nullptr) {
    // Keep lib_ so the destructor closes it; Shutdown is skipped because Init never ran.
    a.Shutdown = nullptr;
    return MakeError(ErrorCode::kNvmlUnavailable,
                     "{} lacks nvmlInit_v2/nvmlDeviceGetCount_v2/nvmlDeviceGetHandleByIndex_v2 "
                     "(driver too old or not NVML)",
                     library);
  }
  if (int rc = a.Init(); rc != NVML_SUCCESS) {
    a.Shutdown = nullptr;
    return MakeError(ErrorCode::kNvmlUnavailable, "nvmlInit_v2 failed: {} (NVML error {})",
                     a.ErrorString ? a.ErrorString(rc) : "unknown", rc);
  }
  unsigned int count = 0;
  KILN_RETURN_IF_ERROR(nvml->Check(a.GetCount(&count), "nvmlDeviceGetCount_v2"));
  for (unsigned int i = 0; i < count; ++i) {
    nvmlDevice_t handle = nullptr;
    KILN_RETURN_IF_ERROR_CTX(
        nvml->Check(a.GetHandleByIndex(i, &handle), "nvmlDeviceGetHandleByIndex_v2"),
        "while opening GPU {}", i);
    nvml->devices_.push_back(handle);
  }
  if (a.DriverVersion != nullptr) {
    char buf[kDriverBufferSize] = {};
    if (a.DriverVersion(buf, sizeof(buf)) == NVML_SUCCESS) nvml->driver_version_ = buf;
  }
  return nvml;
}

Nvml::~Nvml() {
  if (event_set_ != nullptr && api_->EventSetFree != nullptr) api_->EventSetFree(event_set_);
  if (api_->Shutdown != nullptr) api_->Shutdown();
  if (lib_ != nullptr) ::dlclose(lib_);
}

Status Nvml::Check(int rc, const char* call) const {
  if (rc == NVML_SUCCESS) return OkStatus();
  const char* text = api_->ErrorString ? api_->ErrorString(rc) : nullptr;
  if (rc == NVML_ERROR_NOT_SUPPORTED || rc == NVML_ERROR_FUNCTION_NOT_FOUND) {
    return MakeError(ErrorCode::kNvmlNotSupported, "{}: {} (NVML error {})", call,
                     text ? text : "not supported", rc);
  }
  return MakeError(ErrorCode::kNvmlCallFailed, "{} failed: {} (NVML error {})", call,
                   text ? text : "unknown", rc);
}

int Nvml::DeviceCount() const { return static_cast<int>(devices_.size()); }

StatusOr<GpuInfo> Nvml::Info(int device) {
  if (device < 0 || device >= DeviceCount()) {
    return MakeError(ErrorCode::kOutOfRange, "GPU {} does not exist (NVML sees {})", device,
                     DeviceCount());
  }
  nvmlDevice_t d = devices_[device];
  GpuInfo info;
  char buf[kNameBufferSize] = {};
  if (api_->GetName && api_->GetName(d, buf, sizeof(buf)) == NVML_SUCCESS) info.name = buf;
  char uuid[kUuidBufferSize] = {};
  if (api_->GetUuid && api_->GetUuid(d, uuid, sizeof(uuid)) == NVML_SUCCESS) info.uuid = uuid;
  nvmlPciInfo_t pci{};
  if (api_->GetPciInfo && api_->GetPciInfo(d, &pci) == NVML_SUCCESS) {
    pci.busId[sizeof(pci.busId) - 1] = '\0';
    info.pci_bus_id = pci.busId;
  }
  return info;
}

StatusOr<GpuSample> Nvml::Sample(int device) {
  if (device < 0 || device >= DeviceCount()) {
    return MakeError(ErrorCode::kOutOfRange, "GPU {} does not exist (NVML sees {})", device,
                     DeviceCount());
  }
  nvmlDevice_t d = devices_[device];
  GpuSample s;
  s.device = device;
  // Runs one query: "not supported" leaves the field absent; any other failure is recorded.
  auto query = [&](auto fn, const char* call, auto&&... args) -> bool {
    if (fn == nullptr) return false;  // symbol absent in this driver: not supported
    int rc = fn(d, args...);
    if (rc == NVML_SUCCESS) return true;
    if (rc != NVML_ERROR_NOT_SUPPORTED && rc != NVML_ERROR_FUNCTION_NOT_FOUND) {
      const char* text = api_->ErrorString ? api_->ErrorString(rc) : nullptr;
      s.errors.push_back({call, rc, text ? text : "unknown NVML error"});
    }
    return false;
  };
  nvmlMemory_t mem{};
  if (query(api_->GetMemoryInfo, "nvmlDeviceGetMemoryInfo", &mem)) {
    s.memory_total_bytes = mem.total;
    s.memory_used_bytes = mem.used;
  }
  nvmlUtilization_t util{};
  if (query(api_->GetUtilization, "nvmlDeviceGetUtilizationRates", &util)) {
    s.utilization_gpu_ratio = util.gpu / 100.0;
    s.utilization_memory_ratio = util.memory / 100.0;
  }
  unsigned int temp = 0;
  if (query(api_->GetTemperature, "nvmlDeviceGetTemperature", NVML_TEMPERATURE_GPU, &temp)) {
    s.temperature_celsius = temp;
  }
  unsigned int milliwatts = 0;
  if (query(api_->GetPowerUsage, "nvmlDeviceGetPowerUsage", &milliwatts)) {
    s.power_watts = milliwatts / 1000.0;
  }
  unsigned long long reasons = 0;
  if (query(api_->GetClockEventReasons, api_->clock_event_call, &reasons)) {
    s.clock_event_reasons = reasons;
  }
  unsigned long long ecc = 0;
  if (query(api_->GetTotalEccErrors, "nvmlDeviceGetTotalEccErrors",
            NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC, &ecc)) {
    s.ecc_corrected_total = ecc;
  }
  if (query(api_->GetTotalEccErrors, "nvmlDeviceGetTotalEccErrors",
            NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC, &ecc)) {
    s.ecc_uncorrected_total = ecc;
  }
  unsigned int corr = 0, unc = 0, pending = 0, failed = 0;
  if (query(api_->GetRemappedRows, "nvmlDeviceGetRemappedRows", &corr, &unc, &pending, &failed)) {
    s.remapped_rows_correctable = corr;
    s.remapped_rows_uncorrectable = unc;
    s.remap_pending = pending != 0;
    s.remap_failed = failed != 0;
  }
  return s;
}

StatusOr<GpuMemoryHealth> Nvml::MemoryHealth(int device) {
  if (device < 0 || device >= DeviceCount()) {
    return MakeError(ErrorCode::kOutOfRange, "GPU {} does not exist (NVML sees {})", device,
                     DeviceCount());
  }
  nvmlDevice_t d = devices_[device];
  GpuMemoryHealth h;
  h.device = device;
  // `ok` lists the return codes that still carry an answer (besides success).
  auto query = [&](auto fn, const char* call, std::initializer_list<int> ok,
                   auto&&... args) -> bool {
    if (fn == nullptr) return false;
    int rc = fn(d, args...);
    if (rc == NVML_SUCCESS || std::find(ok.begin(), ok.end(), rc) != ok.end()) return true;
    if (rc != NVML_ERROR_NOT_SUPPORTED && rc != NVML_ERROR_FUNCTION_NOT_FOUND) {
      const char* text = api_->ErrorString ? api_->ErrorString(rc) : nullptr;
      h.errors.push_back({call, rc, text ? text : "unknown NVML error"});
    }
    return false;
  };
  nvmlEnableState_t current = 0, pending = 0;
  if (query(api_->GetEccMode, "nvmlDeviceGetEccMode", {}, &current, &pending)) {
    h.ecc_enabled = current != 0;
    h.ecc_enabled_pending = pending != 0;
  }
  struct Counter {
    int type, counter;
    std::optional<uint64_t>* out;
  };
  for (const Counter& c :
       {Counter{NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, &h.ecc_uncorrected_volatile},
        Counter{NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC,
                &h.ecc_uncorrected_aggregate},
        Counter{NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC, &h.ecc_corrected_volatile},
        Counter{NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC,
                &h.ecc_corrected_aggregate}}) {
    unsigned long long n = 0;
    if (query(api_->GetTotalEccErrors, "nvmlDeviceGetTotalEccErrors", {}, c.type, c.counter, &n))
      *c.out = n;
  }
  unsigned int corr = 0, unc = 0, remap_pending = 0, failed = 0;
  if (query(api_->GetRemappedRows, "nvmlDeviceGetRemappedRows", {}, &corr, &unc, &remap_pending,
            &failed)) {
    h.remapped_rows_correctable = corr;
    h.remapped_rows_uncorrectable = unc;
    h.remap_pending = remap_pending != 0;
    h.remap_failed = failed != 0;
  }
  // A page count of 0 with no buffer asks for the count only: INSUFFICIENT_SIZE means "there are
  // pageCount of them".
  for (auto [cause, out] :
       {std::pair{NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS, &h.retired_pages_sbe},
        std::pair{NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR, &h.retired_pages_dbe}}) {
    unsigned int count = 0;
    if (query(api_->GetRetiredPages, "nvmlDeviceGetRetiredPages", {NVML_ERROR_INSUFFICIENT_SIZE},
              cause, &count, static_cast<unsigned long long*>(nullptr)))
      *out = count;
  }
  nvmlEnableState_t retire_pending = 0;
  if (query(api_->GetRetiredPagesPendingStatus, "nvmlDeviceGetRetiredPagesPendingStatus", {},
            &retire_pending))
    h.retired_pages_pending = retire_pending != 0;
  return h;
}

StatusOr<std::vector<XidEvent>> Nvml::WaitXid(std::chrono::milliseconds timeout) {
  if (!events_tried_) {
    events_tried_ = true;
    if (api_->EventSetCreate && api_->RegisterEvents && api_->EventSetWait &&
        api_->EventSetCreate(&event_set_) == NVML_SUCCESS) {
      for (nvmlDevice_t d : devices_) {
        if (api_->RegisterEvents(d, nvmlEventTypeXidCriticalError, event_set_) == NVML_SUCCESS) {
          events_supported_ = true;
        }
      }
    }
  }
  if (!events_supported_) {
    return MakeError(ErrorCode::kNvmlNotSupported,
                     "no GPU accepts Xid event registration (nvmlDeviceRegisterEvents)");
  }
  std::vector<XidEvent> events;
  nvmlEventData_t data{};
  auto ms = static_cast<unsigned int>(std::max<int64_t>(0, timeout.count()));
  int rc = api_->EventSetWait(event_set_, &data, ms);
  if (rc == NVML_ERROR_TIMEOUT) return events;
  KILN_RETURN_IF_ERROR(Check(rc, "nvmlEventSetWait_v2"));
  if (data.eventType & nvmlEventTypeXidCriticalError) {
    XidEvent e;
    e.xid = data.eventData;
    e.time = std::chrono::system_clock::now();
    for (size_t i = 0; i < devices_.size(); ++i) {
      if (devices_[i] == data.device) e.device = static_cast<int>(i);
    }
    events.push_back(e);
  }
  return events;
}

std::string_view XidMeaning(uint64_t xid) {
  switch (xid) {
    case 13:
      return "graphics engine exception (usually the application)";
    case 31:
      return "GPU memory page fault (usually the application: a bad pointer)";
    case 43:
      return "GPU stopped processing (usually the application)";
    case 45:
      return "preemptive cleanup after an earlier fault";
    case 48:
      return "double-bit ECC error (hardware)";
    case 63:
      return "row remapping event (ECC page retirement)";
    case 64:
      return "row remapping failure (hardware: drain the node)";
    case 74:
      return "NVLink error (hardware or cabling)";
    case 79:
      return "GPU has fallen off the bus (hardware: drain the node)";
    case 94:
      return "contained memory error (restart the application)";
    case 95:
      return "uncontained memory error (reset the GPU)";
    case 119:
      return "GSP RPC timeout (reset the GPU)";
    case 120:
      return "GSP error (reset the GPU)";
    case 999:
      return "unknown Xid (NVML could not decode it)";
    default:
      return "see NVIDIA's Xid catalog";
  }
}

}  // namespace kiln::obs
