// Coverage of the op table by the backends: every op kiln declares (ops.inc) has a kernel on the
// CPU (the reference) and on CUDA where that backend is built, unless ops.inc declares the
// reason it has none (KILN_OP_NO_KERNEL). Registration is static, so no device is needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>

#include "kiln/backends/backend.h"
#include "kiln/ops/op_table.h"

namespace kiln {
namespace {

std::vector<std::string> OpsWithoutKernel(BackendKind backend) {
  std::vector<std::string> missing;
  for (const OpSchema& s : AllOpSchemas()) {
    if (!NoKernelReason(s.type, ToString(backend)).empty()) continue;
    if (KernelRegistry::Get().NativeProviders(backend, s.type).empty())
      missing.emplace_back(s.name);
  }
  return missing;
}

TEST(OpCoverage, EveryOpHasACpuKernel) {
  std::vector<std::string> missing = OpsWithoutKernel(BackendKind::kCpu);
  EXPECT_TRUE(missing.empty()) << "no CPU kernel (and no KILN_OP_NO_KERNEL reason) for: "
                               << ::testing::PrintToString(missing);
}

TEST(OpCoverage, EveryOpHasACudaKernelOrADeclaredReason) {
#if KILN_TEST_CUDA_BUILT
  std::vector<std::string> missing = OpsWithoutKernel(BackendKind::kCuda);
  EXPECT_TRUE(missing.empty()) << "no CUDA kernel (and no KILN_OP_NO_KERNEL reason) for: "
                               << ::testing::PrintToString(missing);
#else
  GTEST_SKIP() << "the CUDA backend is not built into this kiln";
#endif
}

// Every kernel provider is for a declared op: the registry indexes providers by OpType, so one
// whose op is misspelt or not in ops.inc would never be asked.
TEST(OpCoverage, EveryKernelIsForADeclaredOp) {
  std::vector<std::string> stray;
  for (const KernelProvider* p : KernelRegistry::Get().Undeclared()) {
    stray.push_back(std::string(ToString(p->backend())) + ":" + std::string(p->op_type()));
  }
  EXPECT_TRUE(stray.empty()) << ::testing::PrintToString(stray);
  for (const KernelProvider* p : KernelRegistry::Get().All()) {
    std::optional<OpType> op = LookupOpType(p->op_type());
    if (!op) continue;
    auto listed = KernelRegistry::Get().Providers(p->backend(), *op);
    EXPECT_NE(std::find(listed.begin(), listed.end(), p), listed.end()) << p->id();
  }
}

// A declared reason must name a backend kiln has and an op the backend indeed lacks.
// The CUDA backend's host fallback: one provider per op, none on the CPU.
TEST(OpCoverage, HostFallbackCoversEveryOpOnCudaOnly) {
  for (const OpSchema& s : AllOpSchemas()) {
    int host_cpu = 0, host_cuda = 0;
    for (const KernelProvider* p : KernelRegistry::Get().Providers(BackendKind::kCpu, s.type)) {
      host_cpu += p->runs_on_host();
    }
    for (const KernelProvider* p : KernelRegistry::Get().Providers(BackendKind::kCuda, s.type)) {
      host_cuda += p->runs_on_host();
    }
    EXPECT_EQ(host_cpu, 0) << s.name;
#if KILN_TEST_CUDA_BUILT
    EXPECT_EQ(host_cuda, 1) << s.name;
#else
    EXPECT_EQ(host_cuda, 0) << s.name;
#endif
  }
}

TEST(OpCoverage, NoKernelReasonsAreCurrent) {
  for (const OpSchema& s : AllOpSchemas()) {
    for (BackendKind b : {BackendKind::kCpu, BackendKind::kCuda}) {
      if (NoKernelReason(s.type, ToString(b)).empty()) continue;
      EXPECT_TRUE(KernelRegistry::Get().NativeProviders(b, s.type).empty())
          << s.name << " on " << ToString(b) << " has a kernel now; drop its KILN_OP_NO_KERNEL row";
    }
  }
}

}  // namespace
}  // namespace kiln
