// `kiln doctor` preflight: facts about the live machine (driver, CUDA, libraries, GPUs, peers,
// environment, network interfaces) and pure check functions over those facts, so every check is
// testable with synthetic facts on a machine without a GPU.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/doctor/finding.h"
#include "kiln/doctor/knowledge.h"
#include "kiln/obs/gpu_source.h"

namespace kiln::doctor {

struct GpuFacts {
  int index = 0;
  std::string name;
  std::string pci_bus;  // "0000:c6:00"
  int cc_major = 0, cc_minor = 0;
  uint64_t total_bytes = 0;
  std::optional<uint64_t> free_bytes;  // needs a context; absent when that failed
  int compute_mode = 0;          // CUcomputemode: 0 default, 2 prohibited, 3 exclusive process
  int kernel_exec_timeout = -1;  // 1: a display watchdog limits kernel run time; -1 unknown
};

struct LibraryFacts {
  std::string name;  // "cudart", "cudnn", "cublasLt", "nccl"
  bool found = false;
  std::string version;  // "13.0.48" style
  std::string detail;   // library file loaded, or why not found
};

struct MachineFacts {
  std::string kiln_version;
  // The CUDA architectures this kiln's kernels were compiled for, in CMake's syntax
  // ("80-real;86-real;89-real;90-real;90-virtual"); empty when built without the CUDA backend.
  std::string cuda_archs;
  std::string driver_version;  // from /proc/driver/nvidia/version; empty when no driver
  int cuda_driver_api = 0;     // cuDriverGetVersion: 13000 = CUDA 13.0; 0 unknown
  std::string gpu_error;       // why no GPU could be listed (empty when GPUs were probed)
  std::vector<GpuFacts> gpus;
  std::vector<std::vector<int>> peer;  // peer[i][j]: 1 can access, 0 cannot, -1 unknown
  std::vector<LibraryFacts> libraries;
  std::map<std::string, std::string> env;  // the variables the checks care about
  std::vector<std::string> interfaces;     // network interface names
};

// NVML facts (ECC, row remapping), gathered by the obs layer's NVML wrapper.
struct NvmlGpuFacts {
  int index = 0;
  std::string pci_bus;
  std::optional<bool> ecc_enabled;
  std::optional<uint64_t> ecc_uncorrected_volatile, ecc_uncorrected_aggregate;
  std::optional<uint64_t> remapped_rows_uncorrectable;
  std::optional<bool> remap_pending, remap_failure;
  // Page retirement (GPUs before Ampere; Ampere and later remap rows instead).
  std::optional<uint64_t> retired_pages_sbe, retired_pages_dbe;
  std::optional<bool> retired_pages_pending;
  std::optional<uint64_t> remapped_rows_correctable;
  std::optional<bool> ecc_enabled_pending;
  std::string error;                      // why this GPU could not be read (empty when it was)
  std::vector<std::string> failed_calls;  // NVML queries that failed (not "not supported")
};
struct NvmlFacts {
  bool available = false;
  std::string reason;  // why not available
  std::vector<NvmlGpuFacts> gpus;
};

// The job's memory plan: --memory-budget (bytes, or a share of free memory when <= 1) x ranks/GPU.
struct MemoryPlan {
  bool set = false;
  double budget = 0;  // bytes (> 1) or a share of free memory (0 < share <= 1)
  int ranks_per_gpu = 1;
};

// "0.5", "8GiB", "8G", "512MiB", "8589934592"; errors name the text.
StatusOr<double> ParseMemoryBudget(std::string_view text);
std::string FormatBytes(double bytes);

// What code this kiln carries for a GPU of compute capability major.minor, given the
// architectures it was compiled for (CMake syntax, ';' or ',' between entries:
// "80-real;90-virtual;86"; "NN" alone is both
// real and virtual). Machine code for sm_XY runs on X.Z with Z >= Y (same major; "90a" only on
// 9.0 itself); PTX of compute_XY is JIT-compiled by the driver for any GPU of X.Y or newer.
struct CudaCodeMatch {
  std::string sass;  // "sm_80": the best machine code that runs there; empty when none
  std::string ptx;   // "compute_90": the newest PTX the driver can compile for it; empty when none
};
CudaCodeMatch CudaCodeFor(std::string_view archs, int major, int minor);

// Reads the machine: dlopen of libcuda.so.1 and the GPU libraries; never fails, absent things
// are recorded as facts. `env` holds the process environment to record.
MachineFacts ProbeMachine(const std::map<std::string, std::string>& env);

std::vector<Finding> CheckMachine(const MachineFacts& facts, const KnownProblems& kp,
                                  const MemoryPlan& plan);
std::vector<Finding> CheckNvml(const NvmlFacts& nvml);
// Reads ECC, row-remapping and retired-page state of every GPU through NVML (not available: a
// reason).
NvmlFacts GatherNvmlFacts();
// The same from any GPU source (tests use obs::FakeGpuSource).
NvmlFacts GatherNvmlFacts(obs::GpuSource& source);

struct PreflightReport {
  MachineFacts facts;
  std::vector<Finding> findings;  // worst first
  int ExitCode() const { return ExitCodeFor(findings); }
};

// Everything: probe, machine checks, environment checks, NVML (not wired yet: see docs/doctor.md).
PreflightReport RunPreflight(const KnownProblems& kp, const MemoryPlan& plan,
                             const std::map<std::string, std::string>& env);

// The process environment as a map.
std::map<std::string, std::string> CurrentEnvironment();

}  // namespace kiln::doctor
