// BatchNormalization (inference form) on the CPU: y = x * a[c] + b[c] with
// a = scale / sqrt(var + epsilon) and b = B - mean * a, computed per run into member vectors
// sized at Prepare (the statistics may be runtime inputs). Parallel over the N*C planes.
#include <cmath>

#include "kiln/backends/cpu/cpu_kernel.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

class BatchNormKernel final : public Kernel {
 public:
  explicit BatchNormKernel(float epsilon) : epsilon_(epsilon) {}

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    const auto& x = inputs[0].dims;
    if (x.size() < 2) return MakeError(ErrorCode::kShapeMismatch, "BatchNormalization of rank < 2");
    channels_ = x[1];
    for (size_t i = 1; i < 5; ++i) {
      if (inputs[i].num_elements() != channels_) {
        return MakeError(ErrorCode::kShapeMismatch,
                         "BatchNormalization input {} has {} elements; expected {}", i,
                         inputs[i].num_elements(), channels_);
      }
    }
    planes_ = x[0] * x[1];
    plane_size_ = planes_ == 0 ? 0 : inputs[0].num_elements() / planes_;
    a_.assign(channels_, 0.f);
    b_.assign(channels_, 0.f);
    return size_t{0};
  }

  Status Run(const KernelRunArgs& args) override {
    const float* scale = args.inputs[1].as<const float>();
    const float* bias = args.inputs[2].as<const float>();
    const float* mean = args.inputs[3].as<const float>();
    const float* var = args.inputs[4].as<const float>();
    for (int64_t c = 0; c < channels_; ++c) {
      a_[c] = scale[c] / std::sqrt(var[c] + epsilon_);
      b_[c] = bias[c] - mean[c] * a_[c];
    }
    const float* x = args.inputs[0].as<const float>();
    float* y = args.outputs[0].as<float>();
    ThreadPool::Default().ParallelFor(planes_, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        float a = a_[p % channels_], b = b_[p % channels_];
        const float* src = x + p * plane_size_;
        float* dst = y + p * plane_size_;
        for (int64_t i = 0; i < plane_size_; ++i) dst[i] = src[i] * a + b;
      }
    });
    return OkStatus();
  }

 private:
  float epsilon_;
  int64_t channels_ = 0, planes_ = 0, plane_size_ = 0;
  std::vector<float> a_, b_;
};

class BatchNormProvider final : public CpuFloatProvider {
 public:
  std::string_view id() const override { return "cpu.batchnorm"; }
  std::string_view op_type() const override { return "BatchNormalization"; }

 protected:
  std::vector<TacticConfig> F32Tactics(const KernelRequest& request) const override {
    // Training mode (batch statistics) is misc_ops.cc's kernel.
    if (request.outputs.size() != 1 ||
        attrs::BatchNormalization::training_mode(*request.node) != 0) {
      return {};
    }
    return {{"f32-batchnorm-cpu", {}, 0}};
  }
  StatusOr<std::unique_ptr<Kernel>> CreateF32(const KernelRequest& request,
                                              const TacticConfig&) const override {
    if (request.outputs.size() != 1 ||
        attrs::BatchNormalization::training_mode(*request.node) != 0) {
      return MakeError(ErrorCode::kUnimplemented,
                       "node '{}': training-mode BatchNormalization is not supported",
                       request.node->name());
    }
    return std::unique_ptr<Kernel>(
        std::make_unique<BatchNormKernel>(attrs::BatchNormalization::epsilon(*request.node)));
  }
};
KILN_REGISTER_KERNEL_PROVIDER(BatchNormProvider);

}  // namespace
}  // namespace kiln::cpu
