// RotaryEmbedding on the CPU (the reference for other backends): y = x * cos + rotate(x) * sin per
// row of the last axis, rotate-half or interleaved (src/kiln/ops/rotary.cc), cos and sin broadcast
// to x through the n-ary row plan. FP32 math; f16/bf16 storage comes from CpuFloatProvider.
#include "kiln/backends/cpu/op_util.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

// One row of d elements (d even): c and s step by `cs` (1, or 0 when broadcast along the row).
void RotateRow(const float* x, const float* c, const float* s, int64_t cs, float* y, int64_t d,
               bool interleaved) {
  if (interleaved) {
    for (int64_t j = 0; j < d; j += 2) {
      const float a = x[j], b = x[j + 1];
      y[j] = a * c[j * cs] - b * s[j * cs];
      y[j + 1] = b * c[(j + 1) * cs] + a * s[(j + 1) * cs];
    }
    return;
  }
  const int64_t h = d / 2;
  for (int64_t j = 0; j < h; ++j) {
    const float a = x[j], b = x[j + h];
    y[j] = a * c[j * cs] - b * s[j * cs];
    y[j + h] = b * c[(j + h) * cs] + a * s[(j + h) * cs];
  }
}

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "RotaryEmbedding",
      .variant = "rows",
      .accepts =
          [](const KernelRequest& r) {
            return r.inputs.size() == 3 && InType(r, 0) == DataType::kFloat32 &&
                   InType(r, 1) == DataType::kFloat32 && InType(r, 2) == DataType::kFloat32;
          },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        const bool interleaved = attrs::RotaryEmbedding::interleaved(*r.node) != 0;
        auto run = [interleaved](const KernelRunArgs& a) {
          const TensorView& x = a.inputs[0];
          if (x.dims.empty() || x.dims.back() % 2 != 0) {
            return MakeError(ErrorCode::kShapeMismatch,
                             "RotaryEmbedding needs X with an even last dim (rank {})",
                             x.dims.size());
          }
          const int64_t d = x.dims.back();
          // The plan's inner run always holds whole rows: every operand is complete or broadcast
          // along the last axis, which has d > 1 elements.
          BroadcastPlan plan(a.inputs, x.dims);
          const float* px = x.as<const float>();
          const float* pc = a.inputs[1].as<const float>();
          const float* ps = a.inputs[2].as<const float>();
          float* py = a.outputs[0].as<float>();
          const int64_t inner = plan.inner;
          const int64_t cs = plan.inner_stride[1], ss = plan.inner_stride[2];
          if (cs != ss) {
            // Cos and Sin broadcast differently along the row: a rare layout, one element at a
            // time through the indexers.
            ParallelRows(
                x.num_elements() / std::max<int64_t>(d, 1), d * 4, [&](int64_t r0, int64_t r1) {
                  std::vector<float> c(d), s(d);
                  for (int64_t r = r0; r < r1; ++r) {
                    for (int64_t j = 0; j < d; ++j) {
                      c[j] = pc[plan.indexers[1](r * d + j)];
                      s[j] = ps[plan.indexers[2](r * d + j)];
                    }
                    RotateRow(px + r * d, c.data(), s.data(), 1, py + r * d, d, interleaved);
                  }
                });
            return OkStatus();
          }
          ParallelRows(plan.rows, inner * 4, [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r) {
              const float* c = pc + plan.offset(1, r);
              const float* s = ps + plan.offset(2, r);
              for (int64_t j = 0; j < inner; j += d) {
                RotateRow(px + r * inner + j, c + j * cs, s + j * cs, cs, py + r * inner + j, d,
                          interleaved);
              }
            }
          });
          return OkStatus();
        };
        return KernelOr(run);
      },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
