// RMSNormalization on the CPU (the reference for other backends): per row of the normalized axes,
// y = x / sqrt(mean(x^2) + epsilon) * scale, the mean of squares in FP32. f16/bf16 storage comes
// from CpuFloatProvider (FP32 math).
#include <cmath>

#include "kiln/backends/cpu/op_util.h"

namespace kiln::cpu {
namespace {

int64_t NormAxis(int64_t axis_attr, size_t rank) {
  return axis_attr < 0 ? axis_attr + static_cast<int64_t>(rank) : axis_attr;
}

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "RMSNormalization",
      .variant = "row",
      .accepts =
          [](const KernelRequest& r) {
            return r.inputs.size() == 2 && InType(r, 0) == DataType::kFloat32 &&
                   InType(r, 1) == DataType::kFloat32;
          },
      .create =
          [](const KernelRequest& r) {
            int64_t axis_attr = r.node->attrs().GetInt("axis", -1);
            float eps = r.node->attrs().GetFloat("epsilon", 1e-5f);
            // Workspace: the scale broadcast to a full row when it is smaller than one.
            auto prepare = [=](std::span<const TensorView> in,
                               std::span<const TensorView>) -> StatusOr<size_t> {
              int64_t axis = NormAxis(axis_attr, in[0].dims.size());
              if (axis < 0 || axis > static_cast<int64_t>(in[0].dims.size())) {
                return MakeError(ErrorCode::kShapeMismatch, "RMSNormalization axis {} of rank {}",
                                 axis_attr, in[0].dims.size());
              }
              int64_t n = 1;
              for (int64_t d : in[0].dims.subspan(static_cast<size_t>(axis))) n *= d;
              return static_cast<size_t>(n) * sizeof(float);
            };
            auto run = [=](const KernelRunArgs& a) {
              const TensorView& x = a.inputs[0];
              const TensorView& g = a.inputs[1];
              int64_t axis = NormAxis(axis_attr, x.dims.size());
              std::span<const int64_t> norm = x.dims.subspan(static_cast<size_t>(axis));
              int64_t n = 1;
              for (int64_t d : norm) n *= d;
              int64_t rows = n == 0 ? 0 : x.num_elements() / n;
              const float* scale = g.as<const float>();
              if (g.num_elements() != n) {
                auto* buf = static_cast<float*>(a.workspace);
                BroadcastIndexer idx(g.dims, norm);
                for (int64_t j = 0; j < n; ++j) buf[j] = scale[idx(j)];
                scale = buf;
              }
              const float* px = x.as<const float>();
              float* py = a.outputs[0].as<float>();
              ParallelRows(rows, n * 3, [&](int64_t b, int64_t e) {
                for (int64_t r = b; r < e; ++r) {
                  const float* p = px + r * n;
                  float* q = py + r * n;
                  float sq = 0.f;
                  for (int64_t j = 0; j < n; ++j) sq += p[j] * p[j];
                  float inv = 1.f / std::sqrt(sq / static_cast<float>(n) + eps);
                  for (int64_t j = 0; j < n; ++j) q[j] = p[j] * inv * scale[j];
                }
              });
              return OkStatus();
            };
            return StatusOr<std::unique_ptr<Kernel>>(std::make_unique<FnKernel>(run, prepare));
          },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
