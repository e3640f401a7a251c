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

// Partial rotary: the first `rot` elements of each row of x rotate (cos and sin broadcast to x's
// shape with last dim rot), the rest are copied.
Status RunPartial(const KernelRunArgs& a, int64_t rot, bool interleaved) {
  const TensorView& x = a.inputs[0];
  const int64_t d = x.dims.back();
  const int64_t rows = x.num_elements() / d;
  DimVec rotated(x.dims);
  rotated.back() = rot;
  // Cos's and sin's element (row, j) of the rotated part: offset(row) + j * step (step 0 when a
  // table's last dim is 1).
  const TensorView tables[2] = {a.inputs[1], a.inputs[2]};
  BroadcastPlan plan(tables, rotated);
  const int64_t cs = !tables[0].dims.empty() && tables[0].dims.back() == rot ? 1 : 0;
  const int64_t ss = !tables[1].dims.empty() && tables[1].dims.back() == rot ? 1 : 0;
  const float* px = x.as<const float>();
  const float* pc = tables[0].as<const float>();
  const float* ps = tables[1].as<const float>();
  float* py = a.outputs[0].as<float>();
  ParallelRows(rows, d * 4, [&](int64_t r0, int64_t r1) {
    // Tables that step alike along the row are read in place; otherwise (a rare layout) one row
    // at a time is gathered, as the whole-row kernel does.
    std::vector<float> c, s;
    if (cs != ss) {
      c.resize(static_cast<size_t>(rot));
      s.resize(static_cast<size_t>(rot));
    }
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t oc = plan.indexers[0](r * rot), os = plan.indexers[1](r * rot);
      if (cs == ss) {
        RotateRow(px + r * d, pc + oc, ps + os, cs, py + r * d, rot, interleaved);
      } else {
        for (int64_t j = 0; j < rot; ++j) {
          c[j] = pc[oc + j * cs];
          s[j] = ps[os + j * ss];
        }
        RotateRow(px + r * d, c.data(), s.data(), 1, py + r * d, rot, interleaved);
      }
      if (py != px) std::copy(px + r * d + rot, px + (r + 1) * d, py + r * d + rot);
    }
  });
  return OkStatus();
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
        const int64_t rot = attrs::RotaryEmbedding::rotary_embedding_dim(*r.node);
        auto run = [interleaved, rot](const KernelRunArgs& a) {
          const TensorView& x = a.inputs[0];
          if (x.dims.empty() || x.dims.back() % 2 != 0 || rot % 2 != 0 || rot > x.dims.back()) {
            return MakeError(ErrorCode::kShapeMismatch,
                             "RotaryEmbedding needs X with an even last dim of at least "
                             "rotary_embedding_dim {} (rank {})",
                             rot, x.dims.size());
          }
          if (rot > 0 && rot < x.dims.back()) return RunPartial(a, rot, interleaved);
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
