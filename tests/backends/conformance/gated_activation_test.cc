// GatedActivation (SwiGLU, GeGLU: act(a) * b, two inputs or the packed halves of one) on every
// backend against a double-precision reference (the CUDA cases run where a GPU is), on fresh
// random inputs.
#include <cmath>
#include <string>

#include "op_tester.h"

namespace kiln::testing {
namespace {

using enum DataType;
const std::vector<DataType> kAllFloats = {kFloat32, kFloat16, kBFloat16};

double Act(const std::string& act, double x) {
  if (act == "silu") return x / (1 + std::exp(-x));
  if (act == "sigmoid") return 1 / (1 + std::exp(-x));
  if (act == "relu") return x > 0 ? x : 0;
  if (act == "gelu") return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
  // gelu_tanh
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

ReferenceFn GatedRef(const std::string& act, bool packed) {
  return [=](const std::vector<RefTensor>& in) {
    const RefTensor& a = in[0];
    if (!packed) {
      RefTensor y = a;
      for (int64_t i = 0; i < a.size(); ++i) y[i] = Act(act, a[i]) * in[1][i];
      return std::vector<RefTensor>{y};
    }
    std::vector<int64_t> dims = a.dims;
    int64_t n = dims.back() / 2;
    dims.back() = n;
    RefTensor y = RefTensor::Zeros(dims);
    for (int64_t r = 0; r < y.size() / n; ++r) {
      for (int64_t j = 0; j < n; ++j)
        y[r * n + j] = Act(act, a[r * 2 * n + j]) * a[r * 2 * n + n + j];
    }
    return std::vector<RefTensor>{y};
  };
}

AttributeMap ActAttrs(const std::string& act) {
  AttributeMap m;
  m.Set("activation", act);
  return m;
}

class GatedActivationOp : public BackendTest {};

TEST_P(GatedActivationOp, TwoInputs) {
  for (const char* act : {"silu", "gelu", "gelu_tanh", "relu", "sigmoid"}) {
    // Odd sizes (one element per thread), Llama-like rows (16-byte accesses).
    for (std::vector<int64_t> dims :
         {std::vector<int64_t>{4, 7, 33}, std::vector<int64_t>{2, 5, 688}}) {
      SCOPED_TRACE(::testing::Message() << act << " n " << dims.back());
      OpTester t("GatedActivation", ActAttrs(act));
      t.Input(kFloat32, dims, -4, 4).Input(kFloat32, dims, -2, 2);
      t.Reference(GatedRef(act, false)).Tolerance(1e-5, 1e-5).FloatTypes(kAllFloats);
      EXPECT_GT(t.Run(GetParam()), 0);
    }
  }
}

TEST_P(GatedActivationOp, PackedHalves) {
  for (const char* act : {"silu", "gelu_tanh"}) {
    // 2 x 688: halves of 688 (vector accesses); 2 x 35: odd halves (scalar).
    for (std::vector<int64_t> dims :
         {std::vector<int64_t>{3, 4, 1376}, std::vector<int64_t>{5, 70}}) {
      SCOPED_TRACE(::testing::Message() << act << " packed " << dims.back());
      OpTester t("GatedActivation", ActAttrs(act));
      t.Input(kFloat32, dims, -4, 4);
      t.Reference(GatedRef(act, true)).Tolerance(1e-5, 1e-5).FloatTypes(kAllFloats);
      EXPECT_GT(t.Run(GetParam()), 0);
    }
  }
}

KILN_INSTANTIATE_BACKENDS(GatedActivationOp);

}  // namespace
}  // namespace kiln::testing
