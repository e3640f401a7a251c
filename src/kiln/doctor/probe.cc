// Probing the live machine without linking CUDA: libcuda.so.1 and the GPU libraries are opened
// with dlopen, so the same kiln binary runs (and reports "not found") on machines without them.
#include <dlfcn.h>
#include <ifaddrs.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "kiln/doctor/preflight.h"

namespace kiln::doctor {

namespace {

// Driver API constants (cuda.h), kept here so kiln builds without the CUDA toolkit.
constexpr int kAttrKernelExecTimeout = 17;
constexpr int kAttrComputeMode = 20;
constexpr int kAttrPciBusId = 33;
constexpr int kAttrPciDeviceId = 34;
constexpr int kAttrPciDomainId = 50;
constexpr int kAttrCcMajor = 75;
constexpr int kAttrCcMinor = 76;

using CuResult = int;
using CuDevice = int;
using CuContext = void*;

// A dlopen handle closed on scope exit. RTLD_NODELETE keeps the library mapped after dlclose:
// the GPU libraries keep internal state (allocations, atexit handlers) that must not be unloaded.
class Library {
 public:
  explicit Library(std::initializer_list<const char*> names) {
    for (const char* n : names) {
      handle_ = dlopen(n, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
      if (handle_) {
        name_ = n;
        return;
      }
      if (error_.empty()) {
        const char* e = dlerror();
        error_ = e ? e : n;
      }
    }
  }
  ~Library() {
    if (handle_) dlclose(handle_);
  }
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;
  explicit operator bool() const { return handle_ != nullptr; }
  template <typename F>
  F Get(const char* symbol) const {
    return handle_ ? reinterpret_cast<F>(dlsym(handle_, symbol)) : nullptr;
  }
  const std::string& name() const { return name_; }
  const std::string& error() const { return error_; }

 private:
  void* handle_ = nullptr;
  std::string name_, error_;
};

std::string DriverVersion() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  if (!std::getline(in, line)) return {};
  std::istringstream words(line);
  std::string w;
  while (words >> w) {
    if (w.size() >= 3 && std::isdigit(static_cast<unsigned char>(w[0])) &&
        w.find('.') != std::string::npos)
      return w;
  }
  return {};
}

std::string CuErrorText(const Library& cuda, CuResult r) {
  auto get_string = cuda.Get<CuResult (*)(CuResult, const char**)>("cuGetErrorString");
  const char* s = nullptr;
  if (get_string && get_string(r, &s) == 0 && s) return fmt::format("{} ({})", s, r);
  return fmt::format("CUresult {}", r);
}

void ProbeGpus(MachineFacts& f) {
  Library cuda({"libcuda.so.1", "libcuda.so"});
  if (!cuda) {
    f.gpu_error = "libcuda.so.1 (the NVIDIA driver library) not found";
    return;
  }
  auto cu_init = cuda.Get<CuResult (*)(unsigned)>("cuInit");
  auto driver_version = cuda.Get<CuResult (*)(int*)>("cuDriverGetVersion");
  auto count = cuda.Get<CuResult (*)(int*)>("cuDeviceGetCount");
  auto get = cuda.Get<CuResult (*)(CuDevice*, int)>("cuDeviceGet");
  auto name = cuda.Get<CuResult (*)(char*, int, CuDevice)>("cuDeviceGetName");
  auto attr = cuda.Get<CuResult (*)(int*, int, CuDevice)>("cuDeviceGetAttribute");
  auto total = cuda.Get<CuResult (*)(size_t*, CuDevice)>("cuDeviceTotalMem_v2");
  auto can_peer = cuda.Get<CuResult (*)(int*, CuDevice, CuDevice)>("cuDeviceCanAccessPeer");
  auto retain = cuda.Get<CuResult (*)(CuContext*, CuDevice)>("cuDevicePrimaryCtxRetain");
  auto release = cuda.Get<CuResult (*)(CuDevice)>("cuDevicePrimaryCtxRelease_v2");
  if (!release) release = cuda.Get<CuResult (*)(CuDevice)>("cuDevicePrimaryCtxRelease");
  auto set_current = cuda.Get<CuResult (*)(CuContext)>("cuCtxSetCurrent");
  auto mem_info = cuda.Get<CuResult (*)(size_t*, size_t*)>("cuMemGetInfo_v2");
  if (!cu_init || !driver_version || !count || !get || !name || !attr || !total) {
    f.gpu_error = fmt::format("{} lacks driver API entry points (a stub library?)", cuda.name());
    return;
  }
  if (CuResult r = cu_init(0); r != 0) {
    f.gpu_error = fmt::format("cuInit failed: {}", CuErrorText(cuda, r));
    return;
  }
  driver_version(&f.cuda_driver_api);
  int n = 0;
  if (CuResult r = count(&n); r != 0 || n == 0) {
    f.gpu_error = r != 0 ? fmt::format("cuDeviceGetCount failed: {}", CuErrorText(cuda, r))
                         : "the driver lists no GPU (check CUDA_VISIBLE_DEVICES)";
    return;
  }
  std::vector<CuDevice> devs(n);
  for (int i = 0; i < n; ++i) {
    GpuFacts g;
    g.index = i;
    if (get(&devs[i], i) != 0) continue;
    char buf[256] = {};
    name(buf, sizeof(buf) - 1, devs[i]);
    g.name = buf;
    int v = 0, bus = 0, dev = 0, dom = 0;
    if (attr(&v, kAttrKernelExecTimeout, devs[i]) == 0) g.kernel_exec_timeout = v;
    if (attr(&v, kAttrComputeMode, devs[i]) == 0) g.compute_mode = v;
    attr(&g.cc_major, kAttrCcMajor, devs[i]);
    attr(&g.cc_minor, kAttrCcMinor, devs[i]);
    attr(&bus, kAttrPciBusId, devs[i]);
    attr(&dev, kAttrPciDeviceId, devs[i]);
    attr(&dom, kAttrPciDomainId, devs[i]);
    g.pci_bus = fmt::format("{:04x}:{:02x}:{:02x}", dom, bus, dev);
    size_t bytes = 0;
    if (total(&bytes, devs[i]) == 0) g.total_bytes = bytes;
    // Free memory needs a context: retain the primary one (shared with any later user), release it.
    CuContext ctx = nullptr;
    if (retain && release && set_current && mem_info && retain(&ctx, devs[i]) == 0) {
      size_t free_b = 0, total_b = 0;
      if (set_current(ctx) == 0 && mem_info(&free_b, &total_b) == 0) g.free_bytes = free_b;
      set_current(nullptr);
      release(devs[i]);
    }
    f.gpus.push_back(std::move(g));
  }
  f.peer.assign(n, std::vector<int>(n, -1));
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      int ok = 0;
      if (i == j)
        f.peer[i][j] = 1;
      else if (can_peer && can_peer(&ok, devs[i], devs[j]) == 0)
        f.peer[i][j] = ok ? 1 : 0;
    }
  }
}

LibraryFacts ProbeIntVersion(const char* lib_name, std::initializer_list<const char*> files,
                             const char* symbol, bool by_pointer,
                             std::string (*decode)(long long)) {
  LibraryFacts l;
  l.name = lib_name;
  Library lib(files);
  if (!lib) {
    l.detail = fmt::format("{} is not in the library path", *files.begin());
    return l;
  }
  long long v = 0;
  if (by_pointer) {
    auto fn = lib.Get<int (*)(int*)>(symbol);
    int iv = 0;
    if (!fn || fn(&iv) != 0) {
      l.detail = fmt::format("{} loaded but {} failed", lib.name(), symbol);
      return l;
    }
    v = iv;
  } else {
    auto fn = lib.Get<size_t (*)()>(symbol);
    if (!fn) {
      l.detail = fmt::format("{} loaded but has no {}", lib.name(), symbol);
      return l;
    }
    v = static_cast<long long>(fn());
  }
  l.found = true;
  l.version = decode(v);
  l.detail = lib.name();
  return l;
}

std::vector<std::string> Interfaces() {
  std::set<std::string> names;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) == 0) {
    for (ifaddrs* a = list; a; a = a->ifa_next) {
      if (a->ifa_name) names.insert(a->ifa_name);
    }
    freeifaddrs(list);
  }
  return {names.begin(), names.end()};
}

}  // namespace

MachineFacts ProbeMachine(const std::map<std::string, std::string>& env) {
  MachineFacts f;
#ifdef KILN_VERSION
  f.kiln_version = KILN_VERSION;
#else
  f.kiln_version = "unknown";
#endif
#ifdef KILN_CUDA_ARCHS_BUILT
  f.cuda_archs = KILN_CUDA_ARCHS_BUILT;  // commas in the definition; CMake's ';' for the user
  std::replace(f.cuda_archs.begin(), f.cuda_archs.end(), ',', ';');
#endif
  f.driver_version = DriverVersion();
  ProbeGpus(f);
  // cudaRuntimeGetVersion: 1000*major + 10*minor. cudnnGetVersion: 9.x =
  // major*10000+minor*100+patch (8.x: major*1000+minor*100+patch). cublasLtGetVersion:
  // major*10000+minor*100+patch. ncclGetVersion: major*10000+minor*100+patch (2.9 and later).
  f.libraries.push_back(ProbeIntVersion(
      "cudart", {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"},
      "cudaRuntimeGetVersion", true,
      [](long long v) { return fmt::format("{}.{}", v / 1000, v % 1000 / 10); }));
  f.libraries.push_back(ProbeIntVersion(
      "cudnn", {"libcudnn.so.9", "libcudnn.so.8", "libcudnn.so"}, "cudnnGetVersion", false,
      [](long long v) {
        return v >= 90000 ? fmt::format("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100)
                          : fmt::format("{}.{}.{}", v / 1000, v % 1000 / 100, v % 100);
      }));
  f.libraries.push_back(ProbeIntVersion(
      "cublasLt", {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so.11", "libcublasLt.so"},
      "cublasLtGetVersion", false,
      [](long long v) { return fmt::format("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100); }));
  f.libraries.push_back(ProbeIntVersion(
      "nccl", {"libnccl.so.2", "libnccl.so"}, "ncclGetVersion", true, [](long long v) {
        return v >= 10000 ? fmt::format("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100)
                          : fmt::format("{}.{}.{}", v / 1000, v % 1000 / 100, v % 100);
      }));
  for (const auto& [k, v] : env) {
    static const std::string_view kPrefixes[] = {"NCCL_", "CUDA_",    "TORCH_",           "TRT_",
                                                 "KILN_", "PYTORCH_", "OMPI_COMM_WORLD_", "SLURM_"};
    bool keep = k == "RANK" || k == "WORLD_SIZE" || k == "LOCAL_RANK" || k == "LOCAL_WORLD_SIZE" ||
                k == "MASTER_ADDR" || k == "MASTER_PORT";
    for (auto p : kPrefixes) keep |= std::string_view(k).starts_with(p);
    if (keep) f.env.emplace(k, v);
  }
  f.interfaces = Interfaces();
  return f;
}

}  // namespace kiln::doctor
