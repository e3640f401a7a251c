// Relu on the CPU: the smallest complete example of a kernel file (provider + registration).
#include "kiln/backends/cpu/cpu_kernel.h"

namespace kiln::cpu {
namespace {

class ReluProvider final : public CpuFloatProvider {
 public:
  std::string_view id() const override { return "cpu.relu"; }
  std::string_view op_type() const override { return "Relu"; }

 protected:
  std::vector<TacticConfig> F32Tactics(const KernelRequest&) const override {
    return {{"f32-relu-cpu", {}, 0}};
  }
  StatusOr<std::unique_ptr<Kernel>> CreateF32(const KernelRequest&,
                                              const TacticConfig&) const override {
    return std::unique_ptr<Kernel>(std::make_unique<LambdaKernel>([](const KernelRunArgs& a) {
      const float* x = a.inputs[0].as<const float>();
      float* y = a.outputs[0].as<float>();
      int64_t n = a.outputs[0].num_elements();
      ThreadPool::Default().ParallelFor(
          n,
          [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) y[i] = x[i] > 0.f ? x[i] : 0.f;
          },
          1 << 14);
      return OkStatus();
    }));
  }
};
KILN_REGISTER_KERNEL_PROVIDER(ReluProvider);

}  // namespace
}  // namespace kiln::cpu
