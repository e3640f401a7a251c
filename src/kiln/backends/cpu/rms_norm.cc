// RMSNormalization and SkipRMSNormalization on the CPU (the reference for other backends): per row
// of the normalized axes, y = x / sqrt(mean(x^2) + epsilon) * scale, the mean of squares in FP32;
// the skip form normalizes s = x + skip (FP32) and may write s too. f16/bf16 storage comes from
// CpuFloatProvider (FP32 math).
#include <cmath>

#include "kiln/backends/cpu/op_util.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

int64_t NormAxis(int64_t axis_attr, size_t rank) {
  return axis_attr < 0 ? axis_attr + static_cast<int64_t>(rank) : axis_attr;
}

// y = x / sqrt(mean(x^2) + eps) * scale over one row of n (in place allowed).
void RmsRow(const float* p, const float* scale, float* q, int64_t n, float eps) {
  float sq = 0.f;
  for (int64_t j = 0; j < n; ++j) sq += p[j] * p[j];
  float inv = 1.f / std::sqrt(sq / static_cast<float>(n) + eps);
  for (int64_t j = 0; j < n; ++j) q[j] = p[j] * inv * scale[j];
}

// Prepare of both ops: the workspace is the scale broadcast to a full row.
StatusOr<size_t> RowWorkspace(std::span<const TensorView> in, int64_t axis_attr, const char* op) {
  int64_t axis = NormAxis(axis_attr, in[0].dims.size());
  if (axis < 0 || axis > static_cast<int64_t>(in[0].dims.size())) {
    return MakeError(ErrorCode::kShapeMismatch, "{} axis {} of rank {}", op, axis_attr,
                     in[0].dims.size());
  }
  int64_t n = 1;
  for (int64_t d : in[0].dims.subspan(static_cast<size_t>(axis))) n *= d;
  return static_cast<size_t>(n) * sizeof(float);
}

// The scale as a full row of n: the input itself, or broadcast into `buf`.
const float* ScaleRow(const TensorView& g, std::span<const int64_t> norm, int64_t n, float* buf) {
  const float* scale = g.as<const float>();
  if (g.num_elements() == n) return scale;
  BroadcastIndexer idx(g.dims, norm);
  for (int64_t j = 0; j < n; ++j) buf[j] = scale[idx(j)];
  return buf;
}

const bool kSkipRegistered = [] {
  RegisterOpKernel({
      .op_type = "SkipRMSNormalization",
      .variant = "row",
      .accepts =
          [](const KernelRequest& r) {
            return r.inputs.size() == 3 && InType(r, 0) == DataType::kFloat32 &&
                   InType(r, 1) == DataType::kFloat32 && InType(r, 2) == DataType::kFloat32;
          },
      .create =
          [](const KernelRequest& r) {
            int64_t axis_attr = attrs::SkipRMSNormalization::axis(*r.node);
            float eps = attrs::SkipRMSNormalization::epsilon(*r.node);
            auto prepare = [=](std::span<const TensorView> in,
                               std::span<const TensorView>) -> StatusOr<size_t> {
              if (!std::equal(in[0].dims.begin(), in[0].dims.end(), in[1].dims.begin(),
                              in[1].dims.end())) {
                return MakeError(ErrorCode::kShapeMismatch,
                                 "SkipRMSNormalization needs Skip of X's shape ({} vs {} "
                                 "elements)",
                                 in[1].num_elements(), in[0].num_elements());
              }
              return RowWorkspace(in, axis_attr, "SkipRMSNormalization");
            };
            auto run = [=](const KernelRunArgs& a) {
              const TensorView& x = a.inputs[0];
              int64_t axis = NormAxis(axis_attr, x.dims.size());
              std::span<const int64_t> norm = x.dims.subspan(static_cast<size_t>(axis));
              int64_t n = 1;
              for (int64_t d : norm) n *= d;
              int64_t rows = n == 0 ? 0 : x.num_elements() / n;
              const float* scale = ScaleRow(a.inputs[2], norm, n, static_cast<float*>(a.workspace));
              const float* px = x.as<const float>();
              const float* pk = a.inputs[1].as<const float>();
              float* py = a.outputs[0].as<float>();
              float* psum =
                  a.outputs.size() > 1 && a.outputs[1].data ? a.outputs[1].as<float>() : nullptr;
              ParallelRows(rows, n * 4, [&](int64_t b, int64_t e) {
                for (int64_t r = b; r < e; ++r) {
                  // y's row holds the sum until it is normalized in place.
                  float* q = py + r * n;
                  for (int64_t j = 0; j < n; ++j) q[j] = px[r * n + j] + pk[r * n + j];
                  if (psum) std::copy(q, q + n, psum + r * n);
                  RmsRow(q, scale, q, n, eps);
                }
              });
              return OkStatus();
            };
            return StatusOr<std::unique_ptr<Kernel>>(std::make_unique<FnKernel>(run, prepare));
          },
  });
  return true;
}();

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
              return RowWorkspace(in, axis_attr, "RMSNormalization");
            };
            auto run = [=](const KernelRunArgs& a) {
              const TensorView& x = a.inputs[0];
              const TensorView& g = a.inputs[1];
              int64_t axis = NormAxis(axis_attr, x.dims.size());
              std::span<const int64_t> norm = x.dims.subspan(static_cast<size_t>(axis));
              int64_t n = 1;
              for (int64_t d : norm) n *= d;
              int64_t rows = n == 0 ? 0 : x.num_elements() / n;
              const float* scale = ScaleRow(g, norm, n, static_cast<float*>(a.workspace));
              const float* px = x.as<const float>();
              float* py = a.outputs[0].as<float>();
              ParallelRows(rows, n * 3, [&](int64_t b, int64_t e) {
                for (int64_t r = b; r < e; ++r) RmsRow(px + r * n, scale, py + r * n, n, eps);
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
