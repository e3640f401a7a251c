// SkipLayerNormalization on the CPU (the reference for other backends): per row, s = x + skip in
// FP32, then LayerNormalization of s with a two-pass mean/variance, as layernorm.cc computes it.
// The optional second output is s. f16/bf16 storage comes from CpuFloatProvider (FP32 math).
#include <cmath>

#include "kiln/backends/cpu/op_util.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

// Scale or B as a full row: the input itself when it has the row's size, else broadcast into
// `buf` (n floats of workspace); nullptr if absent.
const float* RowParam(const KernelRunArgs& a, size_t i, std::span<const int64_t> norm, int64_t n,
                      float* buf) {
  if (a.inputs.size() <= i || !a.inputs[i].data) return nullptr;
  const TensorView& p = a.inputs[i];
  if (p.num_elements() == n) return p.as<const float>();
  BroadcastIndexer idx(p.dims, norm);
  for (int64_t j = 0; j < n; ++j) buf[j] = p.as<const float>()[idx(j)];
  return buf;
}

int64_t NormAxis(int64_t axis_attr, size_t rank) {
  return axis_attr < 0 ? axis_attr + static_cast<int64_t>(rank) : axis_attr;
}

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "SkipLayerNormalization",
      .variant = "row",
      .accepts =
          [](const KernelRequest& r) {
            return r.inputs.size() >= 3 && InType(r, 0) == DataType::kFloat32 &&
                   InType(r, 1) == DataType::kFloat32;
          },
      .create =
          [](const KernelRequest& r) {
            int64_t axis_attr = attrs::SkipLayerNormalization::axis(*r.node);
            float eps = attrs::SkipLayerNormalization::epsilon(*r.node);
            // Workspace: room to broadcast Scale and B to a full row each.
            auto prepare = [=](std::span<const TensorView> in,
                               std::span<const TensorView>) -> StatusOr<size_t> {
              if (in[1].dims.size() != in[0].dims.size() ||
                  !std::equal(in[0].dims.begin(), in[0].dims.end(), in[1].dims.begin())) {
                return MakeError(ErrorCode::kShapeMismatch,
                                 "SkipLayerNormalization needs Skip of X's shape ({} vs {} "
                                 "elements)",
                                 in[1].num_elements(), in[0].num_elements());
              }
              int64_t axis = NormAxis(axis_attr, in[0].dims.size());
              if (axis < 0 || axis > static_cast<int64_t>(in[0].dims.size())) {
                return MakeError(ErrorCode::kShapeMismatch,
                                 "SkipLayerNormalization axis {} of rank {}", axis_attr,
                                 in[0].dims.size());
              }
              int64_t n = 1;
              for (int64_t d : in[0].dims.subspan(static_cast<size_t>(axis))) n *= d;
              size_t row = static_cast<size_t>(n) * sizeof(float);
              return 2 * ((row + 63) / 64 * 64);
            };
            auto run = [=](const KernelRunArgs& a) {
              const TensorView& x = a.inputs[0];
              int64_t axis = NormAxis(axis_attr, x.dims.size());
              std::span<const int64_t> norm = x.dims.subspan(static_cast<size_t>(axis));
              int64_t n = 1;
              for (int64_t d : norm) n *= d;
              int64_t rows = n == 0 ? 0 : x.num_elements() / n;
              auto* ws = static_cast<float*>(a.workspace);
              size_t row = (static_cast<size_t>(n) * sizeof(float) + 63) / 64 * 64 / sizeof(float);
              const float* scale = RowParam(a, 2, norm, n, ws);
              const float* bias = RowParam(a, 3, norm, n, ws + row);
              const float* px = x.as<const float>();
              const float* ps = a.inputs[1].as<const float>();
              float* py = a.outputs[0].as<float>();
              float* psum =
                  a.outputs.size() > 1 && a.outputs[1].data ? a.outputs[1].as<float>() : nullptr;
              ParallelRows(rows, n * 4, [&](int64_t b, int64_t e) {
                for (int64_t r = b; r < e; ++r) {
                  const float* p = px + r * n;
                  const float* k = ps + r * n;
                  float* q = py + r * n;
                  // y's row holds the sum until it is normalized in place (no extra buffer).
                  float total = 0.f;
                  for (int64_t j = 0; j < n; ++j) {
                    q[j] = p[j] + k[j];
                    total += q[j];
                  }
                  if (psum) std::copy(q, q + n, psum + r * n);
                  float mean = total / static_cast<float>(n);
                  float var = 0.f;
                  for (int64_t j = 0; j < n; ++j) var += (q[j] - mean) * (q[j] - mean);
                  float inv = 1.f / std::sqrt(var / static_cast<float>(n) + eps);
                  for (int64_t j = 0; j < n; ++j) {
                    float v = (q[j] - mean) * inv;
                    if (scale) v *= scale[j];
                    if (bias) v += bias[j];
                    q[j] = v;
                  }
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
