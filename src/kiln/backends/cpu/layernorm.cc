// LayerNormalization on the CPU: per row over the normalized axes (axis..rank-1), FP32
// accumulation with a two-pass mean/variance, optional Scale and B (broadcast to the normalized
// shape) and optional Mean / InvStdDev outputs (FP32).
#include <cmath>

#include "kiln/backends/cpu/op_util.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

// An optional per-row parameter (Scale or B) as a full row: the input itself when it has the
// row's size, else broadcast into `buf` (n floats of workspace); nullptr if absent.
const float* ExpandParam(const KernelRunArgs& a, size_t i, std::span<const int64_t> norm,
                         float* buf) {
  if (a.inputs.size() <= i || !a.inputs[i].data) return nullptr;
  const TensorView& p = a.inputs[i];
  int64_t n = 1;
  for (int64_t d : norm) n *= d;
  if (p.num_elements() == n) return p.as<const float>();
  BroadcastIndexer idx(p.dims, norm);
  for (int64_t j = 0; j < n; ++j) buf[j] = p.as<const float>()[idx(j)];
  return buf;
}

// Row length of the normalized axes.
int64_t RowLength(std::span<const int64_t> dims, int64_t axis_attr) {
  int64_t rank = static_cast<int64_t>(dims.size());
  int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
  int64_t n = 1;
  for (int64_t d : dims.subspan(axis)) n *= d;
  return n;
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
            int64_t axis_attr = attrs::LayerNormalization::axis(*r.node);
            float eps = attrs::LayerNormalization::epsilon(*r.node);
            // Workspace: room to broadcast Scale and B to a full row.
            auto prepare = [=](std::span<const TensorView> in,
                               std::span<const TensorView>) -> StatusOr<size_t> {
              size_t row = static_cast<size_t>(RowLength(in[0].dims, axis_attr)) * sizeof(float);
              return 2 * ((row + 63) / 64 * 64);
            };
            auto run = [=](const KernelRunArgs& a) {
              const TensorView& x = a.inputs[0];
              int64_t rank = static_cast<int64_t>(x.dims.size());
              int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
              std::span<const int64_t> norm = x.dims.subspan(axis);
              int64_t n = 1;
              for (int64_t d : norm) n *= d;
              int64_t rows = n == 0 ? 0 : x.num_elements() / n;
              auto* ws = static_cast<float*>(a.workspace);
              size_t row = (static_cast<size_t>(n) * sizeof(float) + 63) / 64 * 64 / sizeof(float);
              const float* scale = ExpandParam(a, 1, norm, ws);
              const float* bias = ExpandParam(a, 2, norm, ws + row);
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
                    if (scale) v *= scale[j];
                    if (bias) v += bias[j];
                    q[j] = v;
                  }
                  if (mean_out) mean_out[r] = mean;
                  if (inv_out) inv_out[r] = inv;
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
