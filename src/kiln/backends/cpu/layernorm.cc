// LayerNormalization on the CPU: per row over the normalized axes (axis..rank-1), FP32
// accumulation with a two-pass mean/variance, optional Scale and B (broadcast to the normalized
// shape) and optional Mean / InvStdDev outputs (FP32).
#include <cmath>

#include "kiln/backends/cpu/op_util.h"

namespace kiln::cpu {
namespace {

// Expands an optional per-row parameter (Scale or B) to the full row length; empty if absent.
std::vector<float> ExpandParam(const KernelRunArgs& a, size_t i, std::span<const int64_t> norm) {
  if (a.inputs.size() <= i || !a.inputs[i].data) return {};
  const TensorView& p = a.inputs[i];
  int64_t n = 1;
  for (int64_t d : norm) n *= d;
  if (p.num_elements() == n) {
    const float* s = p.as<const float>();
    return std::vector<float>(s, s + n);
  }
  BroadcastIndexer idx(p.dims, norm);
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) out[j] = p.as<const float>()[idx(j)];
  return out;
}

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "LayerNormalization",
      .variant = "row",
      .accepts =
          [](const KernelRequest& r) {
            for (size_t i = 1; i < r.outputs.size(); ++i) {
              if (OutType(r, i) != DataType::kFloat32 && OutType(r, i) != DataType::kUndefined) {
                return false;
              }
            }
            return InType(r, 0) == DataType::kFloat32;
          },
      .create =
          [](const KernelRequest& r) {
            int64_t axis_attr = r.node->attrs().GetInt("axis", -1);
            float eps = r.node->attrs().GetFloat("epsilon", 1e-5f);
            return KernelOr([=](const KernelRunArgs& a) {
              const TensorView& x = a.inputs[0];
              int64_t rank = static_cast<int64_t>(x.dims.size());
              int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
              std::span<const int64_t> norm = x.dims.subspan(axis);
              int64_t n = 1;
              for (int64_t d : norm) n *= d;
              int64_t rows = n == 0 ? 0 : x.num_elements() / n;
              std::vector<float> scale = ExpandParam(a, 1, norm), bias = ExpandParam(a, 2, norm);
              const float* src = x.as<const float>();
              float* dst = a.outputs[0].as<float>();
              float* mean_out = a.outputs.size() > 1 ? a.outputs[1].as<float>() : nullptr;
              float* inv_out = a.outputs.size() > 2 ? a.outputs[2].as<float>() : nullptr;
              ParallelRows(rows, n * 3, [&](int64_t b, int64_t e) {
                for (int64_t r = b; r < e; ++r) {
                  const float* p = src + r * n;
                  float* q = dst + r * n;
                  float sum = 0.f;
                  for (int64_t j = 0; j < n; ++j) sum += p[j];
                  float mean = sum / static_cast<float>(n);
                  float var = 0.f;
                  for (int64_t j = 0; j < n; ++j) var += (p[j] - mean) * (p[j] - mean);
                  float inv = 1.f / std::sqrt(var / static_cast<float>(n) + eps);
                  for (int64_t j = 0; j < n; ++j) {
                    float v = (p[j] - mean) * inv;
                    if (!scale.empty()) v *= scale[j];
                    if (!bias.empty()) v += bias[j];
                    q[j] = v;
                  }
                  if (mean_out) mean_out[r] = mean;
                  if (inv_out) inv_out[r] = inv;
                }
              });
              return OkStatus();
            });
          },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
