// Kernels that only tests register: Relu and Add (so tests do not depend on the CPU backend's
// kernels) and an Identity that needs workspace, so engine and runtime tests can exercise binary
// ops and workspace planning. Ids start with "test." so they never collide with a real provider.
#include <cstring>

#include "kiln/backends/cpu/cpu_kernel.h"

namespace kiln::testing {
namespace {

// y = a + b with numpy broadcasting; the indexers are built in Prepare so Run never allocates.
class AddKernel final : public Kernel {
 public:
  StatusOr<size_t> Prepare(std::span<const TensorView> in,
                           std::span<const TensorView> out) override {
    a_.emplace(in[0].dims, out[0].dims);
    b_.emplace(in[1].dims, out[0].dims);
    return size_t{0};
  }
  Status Run(const KernelRunArgs& args) override {
    const float* a = args.inputs[0].as<const float>();
    const float* b = args.inputs[1].as<const float>();
    float* y = args.outputs[0].as<float>();
    const int64_t n = args.outputs[0].num_elements();
    for (int64_t i = 0; i < n; ++i) y[i] = a[(*a_)(i)] + b[(*b_)(i)];
    return OkStatus();
  }

 private:
  std::optional<cpu::BroadcastIndexer> a_, b_;
};

class TestAddProvider final : public cpu::CpuFloatProvider {
 public:
  std::string_view id() const override { return "test.add"; }
  std::string_view op_type() const override { return "Add"; }

 protected:
  std::vector<TacticConfig> F32Tactics(const KernelRequest&) const override {
    return {{"f32-add-cpu-test", {}, 0}};
  }
  StatusOr<std::unique_ptr<Kernel>> CreateF32(const KernelRequest&,
                                              const TacticConfig&) const override {
    return std::unique_ptr<Kernel>(std::make_unique<AddKernel>());
  }
};
KILN_REGISTER_KERNEL_PROVIDER(TestAddProvider);

// Relu without the thread pool: the runtime's allocation test must measure the runtime, not the
// kernels (std::function captures in ParallelFor may allocate).
class TestReluProvider final : public cpu::CpuFloatProvider {
 public:
  std::string_view id() const override { return "test.relu"; }
  std::string_view op_type() const override { return "Relu"; }

 protected:
  std::vector<TacticConfig> F32Tactics(const KernelRequest&) const override {
    return {{"f32-relu-cpu-test", {}, 0}};
  }
  StatusOr<std::unique_ptr<Kernel>> CreateF32(const KernelRequest&,
                                              const TacticConfig&) const override {
    return std::unique_ptr<Kernel>(std::make_unique<FnKernel>([](const KernelRunArgs& a) {
      const float* x = a.inputs[0].as<const float>();
      float* y = a.outputs[0].as<float>();
      const int64_t n = a.outputs[0].num_elements();
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
      return OkStatus();
    }));
  }
};
KILN_REGISTER_KERNEL_PROVIDER(TestReluProvider);

// Identity through the workspace: input -> workspace -> output. Workspace = the input's bytes.
class CopyViaWorkspaceKernel final : public Kernel {
 public:
  StatusOr<size_t> Prepare(std::span<const TensorView> in, std::span<const TensorView>) override {
    return in[0].size_bytes();
  }
  Status Run(const KernelRunArgs& args) override {
    const size_t bytes = args.inputs[0].size_bytes();
    if (args.workspace_bytes < bytes) {
      return MakeError(ErrorCode::kKernelFailed, "workspace has {} bytes, {} needed",
                       args.workspace_bytes, bytes);
    }
    if (bytes == 0) return OkStatus();  // empty tensors: no workspace, nothing to copy
    std::memcpy(args.workspace, args.inputs[0].data, bytes);
    std::memcpy(args.outputs[0].data, args.workspace, bytes);
    return OkStatus();
  }
};

class TestCopyProvider final : public KernelProvider {
 public:
  std::string_view id() const override { return "test.copy_ws"; }
  std::string_view op_type() const override { return "Identity"; }
  BackendKind backend() const override { return BackendKind::kCpu; }
  std::vector<TacticConfig> Tactics(const KernelRequest& r) const override {
    const OperandDesc& in = r.inputs[0];
    return {{"any-copy-cpu-via-workspace", {}, NumElements(in.max_dims) * SizeOf(in.dtype)}};
  }
  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest&,
                                           const TacticConfig&) const override {
    return std::unique_ptr<Kernel>(std::make_unique<CopyViaWorkspaceKernel>());
  }
};
KILN_REGISTER_KERNEL_PROVIDER(TestCopyProvider);

}  // namespace

// Referenced by test_engines.cc so a linker never drops this file's registrations.
int TestKernelsAnchor() { return 1; }

}  // namespace kiln::testing
