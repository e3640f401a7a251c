// Preflight checks over synthetic machine facts (no GPU needed), the NVML facts check, and the
// live probe on whatever machine runs the test.
#include <gtest/gtest.h>

#include "kiln/doctor/preflight.h"
#include "kiln/obs/fake_gpu_source.h"

namespace kiln::doctor {
namespace {

const KnownProblems& Kp() {
  static auto kp = *KnownProblems::Default();
  return *kp;
}

const Finding* Find(const std::vector<Finding>& fs, std::string_view check) {
  for (const Finding& f : fs) {
    if (f.check == check) return &f;
  }
  return nullptr;
}

MachineFacts H100Node(int gpus) {
  MachineFacts m;
  m.kiln_version = "0.1.0";
  m.driver_version = "580.65.06";
  m.cuda_driver_api = 13000;
  for (int i = 0; i < gpus; ++i) {
    GpuFacts g;
    g.index = i;
    g.name = "NVIDIA H100 80GB HBM3";
    g.pci_bus = fmt::format("0000:{:02x}:00", 0x18 + i);
    g.cc_major = 9;
    g.total_bytes = 80ull << 30;
    g.free_bytes = 60ull << 30;
    g.kernel_exec_timeout = 0;
    m.gpus.push_back(g);
  }
  m.peer.assign(gpus, std::vector<int>(gpus, 1));
  m.libraries = {{"cudart", true, "13.0", "libcudart.so.13"},
                 {"cudnn", true, "9.19.0", "libcudnn.so.9"},
                 {"cublasLt", true, "13.1.0", "libcublasLt.so.13"},
                 {"nccl", true, "2.28.9", "libnccl.so.2"}};
  return m;
}

TEST(Preflight, HealthyNodeHasOnlyFacts) {
  auto f = CheckMachine(H100Node(8), Kp(), {});
  EXPECT_EQ(ExitCodeFor(f), 0);
  ASSERT_NE(Find(f, "gpu0.watchdog"), nullptr);
  EXPECT_NE(Find(f, "gpu0.watchdog")->what.find("no kernel-execution watchdog"), std::string::npos);
  ASSERT_NE(Find(f, "peer"), nullptr);
}

TEST(Preflight, NoGpuSaysSoAndChecksTheRest) {
  MachineFacts m;
  m.gpu_error = "libcuda.so.1 (the NVIDIA driver library) not found";
  m.libraries = {{"nccl", false, "", "libnccl.so.2 is not in the library path"}};
  auto f = CheckMachine(m, Kp(), {});
  ASSERT_NE(Find(f, "gpu.none"), nullptr);
  EXPECT_EQ(Find(f, "gpu.none")->severity, Severity::kWarning);
  EXPECT_NE(Find(f, "gpu.none")->what.find("libcuda.so.1"), std::string::npos);
  ASSERT_NE(Find(f, "lib.nccl"), nullptr);
  EXPECT_EQ(Find(f, "lib.nccl")->severity, Severity::kInfo);  // no GPU: missing NCCL is a fact
  EXPECT_NE(Find(f, "lib.nccl")->what.find("not found"), std::string::npos);
  EXPECT_EQ(ExitCodeFor(f), 1);
  MemoryPlan plan{true, 0.5, 1};
  EXPECT_EQ(Find(CheckMachine(m, Kp(), plan), "gpu.none")->severity, Severity::kError);
}

TEST(Preflight, WatchdogComputeModeAndArchitecture) {
  MachineFacts m = H100Node(2);
  m.gpus[0].kernel_exec_timeout = 1;
  m.gpus[1].compute_mode = 3;
  m.gpus[1].cc_major = 8;
  m.gpus[1].cc_minor = 6;
  m.cuda_archs = "90-real;90-virtual";  // a Hopper-only build: nothing an A10 can run
  auto f = CheckMachine(m, Kp(), {});
  EXPECT_EQ(Find(f, "gpu0.watchdog")->severity, Severity::kWarning);
  EXPECT_NE(Find(f, "gpu0.watchdog")->why.find("702"), std::string::npos);
  EXPECT_EQ(Find(f, "gpu1.compute-mode")->severity, Severity::kWarning);
  EXPECT_EQ(Find(f, "gpu0.arch")->severity, Severity::kInfo);
  EXPECT_NE(Find(f, "gpu0.arch")->what.find("sm_90 machine code"), std::string::npos);
  EXPECT_EQ(Find(f, "gpu1.arch")->severity, Severity::kError);
  EXPECT_NE(Find(f, "gpu1.arch")->todo.find("-DKILN_CUDA_ARCHS=\"90-real;90-virtual;86-real\""),
            std::string::npos)
      << Find(f, "gpu1.arch")->todo;
  m.cuda_archs = "80-virtual";  // PTX only: the driver compiles it for both
  f = CheckMachine(m, Kp(), {});
  EXPECT_EQ(Find(f, "gpu1.arch")->severity, Severity::kWarning);
  EXPECT_NE(Find(f, "gpu1.arch")->what.find("compute_80 PTX"), std::string::npos);
  m.cuda_archs.clear();  // no CUDA backend in this kiln: nothing to say per GPU
  EXPECT_EQ(Find(CheckMachine(m, Kp(), {}), "gpu1.arch"), nullptr);
  MemoryPlan two{true, 0.3, 2};
  EXPECT_EQ(Find(CheckMachine(m, Kp(), two), "gpu1.compute-mode")->severity, Severity::kError);
}

TEST(Preflight, CudaCodeForEachComputeCapability) {
  const char* kDefault = "80-real;86-real;89-real;90-real;90-virtual";
  auto sass = [&](const char* archs, int ma, int mi) { return CudaCodeFor(archs, ma, mi).sass; };
  auto ptx = [&](const char* archs, int ma, int mi) { return CudaCodeFor(archs, ma, mi).ptx; };
  EXPECT_EQ(sass(kDefault, 8, 0), "sm_80");       // A100
  EXPECT_EQ(sass(kDefault, 8, 6), "sm_86");       // A10, A40
  EXPECT_EQ(sass(kDefault, 8, 7), "sm_86");       // Orin: sm_86 code runs on 8.7
  EXPECT_EQ(sass(kDefault, 8, 9), "sm_89");       // L4, L40
  EXPECT_EQ(sass(kDefault, 9, 0), "sm_90");       // H100, H200
  EXPECT_EQ(sass(kDefault, 10, 0), "");           // Blackwell: no machine code...
  EXPECT_EQ(ptx(kDefault, 10, 0), "compute_90");  // ...but PTX the driver compiles
  EXPECT_EQ(ptx(kDefault, 8, 0), "");             // compute_90 PTX cannot run on an older GPU
  EXPECT_EQ(sass(kDefault, 7, 5), "");
  EXPECT_EQ(ptx("80-virtual", 9, 0), "compute_80");  // the PTX-only build checked on the H200
  EXPECT_EQ(sass("80-virtual", 9, 0), "");
  EXPECT_EQ(sass("80", 8, 6), "sm_80");  // "80" is real and virtual
  EXPECT_EQ(ptx("80", 8, 6), "compute_80");
  EXPECT_EQ(sass("90a-real", 9, 0), "sm_90a");
  EXPECT_EQ(ptx("90a-real;90a-virtual", 10, 0), "");  // arch-specific PTX is not forward-compatible
  EXPECT_EQ(sass("all", 9, 0), "");
}

TEST(Preflight, MemoryPlanAgainstFreeMemory) {
  MachineFacts m = H100Node(1);  // 60 GiB free
  auto sev = [&](MemoryPlan p) { return Find(CheckMachine(m, Kp(), p), "gpu0.memory")->severity; };
  EXPECT_EQ(sev({true, 0.4, 2}), Severity::kInfo);                   // 80% of free
  EXPECT_EQ(sev({true, 0.5, 2}), Severity::kWarning);                // 100%: no headroom
  EXPECT_EQ(sev({true, 0.6, 2}), Severity::kError);                  // 120%
  EXPECT_EQ(sev({true, 40.0 * (1ull << 30), 2}), Severity::kError);  // 80 GiB > 60 GiB
  EXPECT_EQ(sev({true, 20.0 * (1ull << 30), 2}), Severity::kInfo);
  auto f = CheckMachine(m, Kp(), {true, 40.0 * (1ull << 30), 2});
  EXPECT_NE(Find(f, "gpu0.memory")->what.find("80.0 GiB"), std::string::npos);
  m.gpus[0].free_bytes.reset();
  EXPECT_EQ(sev({true, 0.5, 1}), Severity::kWarning);
}

TEST(Preflight, VersionsPeersAndLauncher) {
  MachineFacts m = H100Node(4);
  m.driver_version = "570.86.15";  // older than CUDA 13 needs
  m.libraries[3].version = "2.12.12";
  m.peer[1][2] = 0;
  m.env["LOCAL_WORLD_SIZE"] = "8";
  auto f = CheckMachine(m, Kp(), {});
  ASSERT_NE(Find(f, "version.driver-too-old-for-cuda13"), nullptr);
  EXPECT_EQ(Find(f, "version.driver-too-old-for-cuda12"), nullptr);
  ASSERT_NE(Find(f, "version.nccl-no-nonblocking-init"), nullptr);
  ASSERT_NE(Find(f, "peer.1-2"), nullptr);
  EXPECT_EQ(Find(f, "peer.1-2")->severity, Severity::kWarning);
  ASSERT_NE(Find(f, "launch.ranks-per-gpu"), nullptr);
  EXPECT_EQ(ExitCodeFor(f), 2);
  m.cuda_driver_api = 12040;  // driver API older than the 13.0 runtime
  EXPECT_NE(Find(CheckMachine(m, Kp(), {}), "version.cuda"), nullptr);
}

TEST(Preflight, NvmlFacts) {
  NvmlFacts none;
  none.reason = "libnvidia-ml.so.1 not found";
  auto f = CheckNvml(none);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].severity, Severity::kInfo);
  NvmlFacts n;
  n.available = true;
  NvmlGpuFacts g0{0, "0000:18:00", true, 2, 2, 1, false, false};
  NvmlGpuFacts g1{1, "0000:19:00", true, 0, 3, 0, true, false};
  NvmlGpuFacts g2{2, "0000:1a:00", false, 0, 0, 0, false, true};
  n.gpus = {g0, g1, g2};
  f = CheckNvml(n);
  EXPECT_EQ(Find(f, "gpu0.ecc")->severity, Severity::kError);
  EXPECT_EQ(Find(f, "gpu1.ecc")->severity, Severity::kWarning);
  EXPECT_EQ(Find(f, "gpu1.remap")->severity, Severity::kWarning);
  EXPECT_EQ(Find(f, "gpu2.remap")->severity, Severity::kError);
  EXPECT_EQ(Find(f, "gpu2.ecc-mode")->severity, Severity::kWarning);
  EXPECT_EQ(Find(f, "gpu0.remap"), nullptr);
}

// The live path (GatherNvmlFacts) reads the same GpuSource interface as the sampler; with the fake
// source every memory-health fact becomes the finding it should.
TEST(Preflight, NvmlMemoryHealthFromGpuSource) {
  obs::FakeGpuSource src(4);
  obs::GpuMemoryHealth healthy;
  healthy.device = 0;
  healthy.ecc_enabled = true;
  healthy.ecc_enabled_pending = true;
  healthy.ecc_uncorrected_volatile = 0;
  healthy.ecc_uncorrected_aggregate = 0;
  healthy.remapped_rows_correctable = 0;
  healthy.remapped_rows_uncorrectable = 0;
  healthy.remap_pending = false;
  healthy.remap_failed = false;
  src.SetMemoryHealth(healthy);
  obs::GpuMemoryHealth bad = healthy;  // errors since the last reset, a failed remap
  bad.device = 1;
  bad.ecc_uncorrected_volatile = 4;
  bad.ecc_uncorrected_aggregate = 9;
  bad.remapped_rows_uncorrectable = 3;
  bad.remap_failed = true;
  src.SetMemoryHealth(bad);
  obs::GpuMemoryHealth old;  // a pre-Ampere GPU: page retirement, one pending
  old.device = 2;
  old.ecc_enabled = true;
  old.ecc_enabled_pending = false;
  old.ecc_uncorrected_volatile = 0;
  old.ecc_uncorrected_aggregate = 2;
  old.retired_pages_sbe = 3;
  old.retired_pages_dbe = 2;
  old.retired_pages_pending = true;
  old.errors.push_back({"nvmlDeviceGetRemappedRows", 999, "Unknown Error"});
  src.SetMemoryHealth(old);
  src.FailNextSamples(3, 1, MakeError(ErrorCode::kNvmlCallFailed, "GPU is lost"));

  NvmlFacts facts = GatherNvmlFacts(src);
  ASSERT_TRUE(facts.available);
  ASSERT_EQ(facts.gpus.size(), 4u);
  EXPECT_EQ(facts.gpus[1].pci_bus, "00000000:02:00.0");
  EXPECT_EQ(facts.gpus[1].ecc_uncorrected_volatile, 4u);
  EXPECT_EQ(facts.gpus[1].remapped_rows_uncorrectable, 3u);
  EXPECT_EQ(facts.gpus[2].retired_pages_dbe, 2u);
  EXPECT_EQ(facts.gpus[2].failed_calls.size(), 1u);
  EXPECT_NE(facts.gpus[3].error.find("GPU is lost"), std::string::npos);

  auto f = CheckNvml(facts);
  // GPU 0: nothing wrong, one info line that says what was read.
  EXPECT_EQ(Find(f, "gpu0.ecc"), nullptr);
  EXPECT_EQ(Find(f, "gpu0.remap"), nullptr);
  ASSERT_NE(Find(f, "gpu0.memory-health"), nullptr);
  EXPECT_EQ(Find(f, "gpu0.memory-health")->severity, Severity::kInfo);
  EXPECT_NE(Find(f, "gpu0.memory-health")->what.find("uncorrected errors volatile 0 aggregate 0"),
            std::string::npos)
      << Find(f, "gpu0.memory-health")->what;
  // GPU 1: volatile uncorrected errors and a failed remap are errors, each with its remedy.
  ASSERT_NE(Find(f, "gpu1.ecc"), nullptr);
  EXPECT_EQ(Find(f, "gpu1.ecc")->severity, Severity::kError);
  EXPECT_NE(Find(f, "gpu1.ecc")->what.find("4 uncorrected"), std::string::npos);
  EXPECT_FALSE(Find(f, "gpu1.ecc")->todo.empty());
  EXPECT_EQ(Find(f, "gpu1.remap")->severity, Severity::kError);
  EXPECT_FALSE(Find(f, "gpu1.remap")->todo.empty());
  // GPU 2: lifetime errors only (warning), pending retirement, ECC off after reboot, a failed call.
  EXPECT_EQ(Find(f, "gpu2.ecc")->severity, Severity::kWarning);
  EXPECT_EQ(Find(f, "gpu2.retired-pages")->severity, Severity::kWarning);
  EXPECT_NE(Find(f, "gpu2.retired-pages")->todo.find("reset"), std::string::npos);
  EXPECT_EQ(Find(f, "gpu2.ecc-mode")->severity, Severity::kWarning);
  ASSERT_NE(Find(f, "gpu2.nvml"), nullptr);
  EXPECT_NE(Find(f, "gpu2.nvml")->what.find("nvmlDeviceGetRemappedRows"), std::string::npos);
  // GPU 3 could not be read at all: said so, not silently healthy.
  EXPECT_EQ(Find(f, "gpu3.nvml")->severity, Severity::kWarning);
  EXPECT_EQ(Find(f, "gpu3.memory-health"), nullptr);
  EXPECT_EQ(ExitCodeFor(f), 2);
}

TEST(Preflight, RetiredPagesPastTheBudgetAreAnError) {
  NvmlFacts n;
  n.available = true;
  NvmlGpuFacts g;
  g.index = 0;
  g.pci_bus = "0000:18:00";
  g.retired_pages_sbe = 50;
  g.retired_pages_dbe = 12;
  g.retired_pages_pending = false;
  n.gpus = {g};
  auto f = CheckNvml(n);
  ASSERT_NE(Find(f, "gpu0.retired-pages"), nullptr);
  EXPECT_EQ(Find(f, "gpu0.retired-pages")->severity, Severity::kError);
  EXPECT_NE(Find(f, "gpu0.retired-pages")->what.find("62 page(s)"), std::string::npos);
  g.retired_pages_sbe = 1;
  g.retired_pages_dbe = 0;
  n.gpus = {g};
  f = CheckNvml(n);
  EXPECT_EQ(Find(f, "gpu0.retired-pages")->severity, Severity::kInfo);
}

TEST(Preflight, ParseMemoryBudget) {
  EXPECT_DOUBLE_EQ(*ParseMemoryBudget("0.5"), 0.5);
  EXPECT_DOUBLE_EQ(*ParseMemoryBudget("8GiB"), 8.0 * (1ull << 30));
  EXPECT_DOUBLE_EQ(*ParseMemoryBudget("512MiB"), 512.0 * (1 << 20));
  EXPECT_DOUBLE_EQ(*ParseMemoryBudget("8589934592"), 8589934592.0);
  EXPECT_EQ(ParseMemoryBudget("1.5").status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ParseMemoryBudget("-1").status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ParseMemoryBudget("8 furlongs").status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(ParseMemoryBudget("").status().code(), ErrorCode::kInvalidArgument);
}

TEST(Preflight, LiveProbeNeverFailsAndExplainsAbsence) {
  std::map<std::string, std::string> env = {{"NCCL_IB_TIMEOUT", "30"}, {"HOME", "/root"}};
  MachineFacts m = ProbeMachine(env);
  if (m.gpus.empty()) {
    EXPECT_FALSE(m.gpu_error.empty());
  } else {
    EXPECT_TRUE(m.gpu_error.empty());
    EXPECT_GT(m.gpus[0].total_bytes, 0u);
    EXPECT_EQ(m.peer.size(), m.gpus.size());
  }
  ASSERT_EQ(m.libraries.size(), 4u);
  for (const auto& l : m.libraries)
    EXPECT_TRUE(l.found ? !l.version.empty() : !l.detail.empty()) << l.name;
  EXPECT_EQ(m.env.count("HOME"), 0u);  // only the variables the checks care about
  EXPECT_EQ(m.env.at("NCCL_IB_TIMEOUT"), "30");
  PreflightReport r = RunPreflight(Kp(), {}, env);
  ASSERT_FALSE(r.findings.empty());
  EXPECT_GE(r.ExitCode(), 1);  // NCCL_IB_TIMEOUT=30 is a warning everywhere
  EXPECT_NE(Find(r.findings, "nvml"), nullptr);
  ASSERT_NE(Find(r.findings, "param.KILN_LOG_LEVEL"), nullptr);  // kiln's own knobs are listed
  EXPECT_NE(Find(r.findings, "param.KILN_LOG_LEVEL")->what.find("unset, default 'INFO'"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln::doctor
