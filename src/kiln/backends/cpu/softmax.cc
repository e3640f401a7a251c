// Softmax and LogSoftmax on the CPU (FP32 compute; f16/bf16 through the wrapper). The tensor is
// [outer, n, inner] around the axis; inner == 1 (the last axis, the common case) runs row by row
// over contiguous memory, other axes over strided columns.
#include <cmath>

#include "kiln/backends/cpu/op_util.h"

namespace kiln::cpu {
namespace {

void SoftmaxColumn(const float* x, float* y, int64_t n, int64_t stride, bool log) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, x[j * stride]);
  float sum = 0.f;
  if (log) {
    for (int64_t j = 0; j < n; ++j) sum += std::exp(x[j * stride] - mx);
    float lse = mx + std::log(sum);
    for (int64_t j = 0; j < n; ++j) y[j * stride] = x[j * stride] - lse;
    return;
  }
  for (int64_t j = 0; j < n; ++j) {
    float e = std::exp(x[j * stride] - mx);
    y[j * stride] = e;
    sum += e;
  }
  float inv = 1.f / sum;
  for (int64_t j = 0; j < n; ++j) y[j * stride] *= inv;
}

const bool kRegistered = [] {
  for (bool log : {false, true}) {
    for (bool row : {true, false}) {
      RegisterOpKernel({
          .op_type = log ? "LogSoftmax" : "Softmax",
          .variant = row ? "row" : "strided",
          .accepts =
              [row](const KernelRequest& r) {
                if (InType(r, 0) != DataType::kFloat32) return false;
                // The row tactic needs the last axis (inner == 1).
                int64_t rank = static_cast<int64_t>(r.inputs[0].shape.size());
                int64_t axis = r.node->attrs().GetInt("axis", -1);
                bool last = axis == -1 || axis == rank - 1;
                return row ? last : !last;
              },
          .create =
              [log](const KernelRequest& r) {
                int64_t axis_attr = r.node->attrs().GetInt("axis", -1);
                return KernelOr([=](const KernelRunArgs& a) {
                  const TensorView& x = a.inputs[0];
                  int64_t rank = static_cast<int64_t>(x.dims.size());
                  int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
                  int64_t outer = 1, n = 1, inner = 1;
                  for (int64_t i = 0; i < rank; ++i) {
                    (i < axis ? outer : (i == axis ? n : inner)) *= x.dims[i];
                  }
                  const float* src = x.as<const float>();
                  float* dst = a.outputs[0].as<float>();
                  ParallelRows(outer * inner, n * 4, [&](int64_t b, int64_t e) {
                    for (int64_t t = b; t < e; ++t) {
                      int64_t off = (t / inner) * n * inner + t % inner;
                      SoftmaxColumn(src + off, dst + off, n, inner, log);
                    }
                  });
                  return OkStatus();
                });
              },
      });
    }
  }
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
