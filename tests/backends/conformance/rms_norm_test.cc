// RMSNormalization on every backend against a double-precision reference (the CUDA cases run
// where a GPU is), and the CPU kernel with a scale that broadcasts, on fresh random inputs.
#include <cmath>

#include "op_tester.h"

namespace kiln::testing {
namespace {

using enum DataType;
const std::vector<DataType> kAllFloats = {kFloat32, kFloat16, kBFloat16};

AttributeMap RmsAttrs(int64_t axis, float eps) {
  AttributeMap m;
  m.Set("axis", axis);
  m.Set("epsilon", eps);
  return m;
}

// (x, scale) -> y; scale broadcast to the normalized shape.
ReferenceFn RmsRef(int64_t axis, double eps) {
  return [=](const std::vector<RefTensor>& in) {
    const RefTensor& x = in[0];
    const RefTensor& g = in[1];
    int64_t rank = static_cast<int64_t>(x.dims.size());
    int64_t a = axis < 0 ? axis + rank : axis;
    std::vector<int64_t> norm(x.dims.begin() + a, x.dims.end());
    int64_t n = 1;
    for (int64_t d : norm) n *= d;
    RefTensor y = x;
    for (int64_t r = 0; r < x.size() / n; ++r) {
      double sq = 0;
      for (int64_t j = 0; j < n; ++j) sq += x[r * n + j] * x[r * n + j];
      double inv = 1 / std::sqrt(sq / n + eps);
      for (int64_t j = 0; j < n; ++j) {
        y[r * n + j] = x[r * n + j] * inv * g[BroadcastIndex(g.dims, norm, j)];
      }
    }
    return std::vector<RefTensor>{y};
  };
}

class RmsNormOp : public BackendTest {};

TEST_P(RmsNormOp, MatchesReference) {
  struct Case {
    std::vector<int64_t> dims;
    int64_t axis;
  };
  // Odd rows (no vector loads), 768 (a warp per row, vector loads), Llama-7B's 4096 and an odd
  // 1500 (a block per row), a normalization over two axes.
  for (const Case& c : std::vector<Case>{{{4, 7, 33}, -1},
                                         {{3, 768}, -1},
                                         {{2, 4096}, -1},
                                         {{2, 1500}, -1},
                                         {{2, 3, 8}, 1},
                                         {{300, 64}, -1}}) {
    SCOPED_TRACE(::testing::Message() << "n " << c.dims.back() << " axis " << c.axis);
    std::vector<int64_t> norm(c.dims.begin() + (c.axis < 0 ? c.dims.size() + c.axis : c.axis),
                              c.dims.end());
    OpTester t("RMSNormalization", RmsAttrs(c.axis, 1e-6f));
    t.Input(kFloat32, c.dims, -3, 3).Input(kFloat32, norm, 0.5, 1.5);
    t.Reference(RmsRef(c.axis, 1e-6)).Tolerance(1e-4, 1e-4).FloatTypes(kAllFloats);
    EXPECT_GT(t.Run(GetParam()), 0);
  }
}

KILN_INSTANTIATE_BACKENDS(RmsNormOp);

// ONNX lets Scale broadcast ([1, n] for a last-axis norm); the CPU kernel expands it.
TEST(RmsNormCpu, ScaleThatBroadcasts) {
  OpTester t("RMSNormalization", RmsAttrs(1, 1e-5f));
  t.Input(kFloat32, {5, 4, 6}).Input(kFloat32, {1, 6}, 0.5, 1.5);
  t.Reference(RmsRef(1, 1e-5)).Tolerance(1e-5, 1e-5);
  EXPECT_GT(t.Run(BackendKind::kCpu), 0);
}

}  // namespace
}  // namespace kiln::testing
