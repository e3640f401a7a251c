// The op conformance tester: builds a one-node graph, infers its shapes, and runs every tactic of
// every kernel provider of one backend on fresh random inputs, comparing each output with a
// double-precision reference written in the test (or, for device backends, with the CPU
// backend's result). Parameterise tests by BackendKind; Run() skips (GTEST_SKIP) when the
// backend is not available here. Float inputs can be run as f32, f16 and bf16 in one go.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/backends/backend.h"
#include "kiln/ir/graph.h"

namespace kiln::testing {

// A tensor as the reference sees it: dims and elements as double.
struct RefTensor {
  std::vector<int64_t> dims;
  std::vector<double> data;
  int64_t size() const { return static_cast<int64_t>(data.size()); }
  double& operator[](int64_t i) { return data[static_cast<size_t>(i)]; }
  double operator[](int64_t i) const { return data[static_cast<size_t>(i)]; }
  static RefTensor Zeros(std::vector<int64_t> dims);
  // Row-major strides.
  std::vector<int64_t> Strides() const;
};

// Inputs (omitted optional ones have no dims and no data) -> expected outputs.
using ReferenceFn = std::function<std::vector<RefTensor>(const std::vector<RefTensor>& inputs)>;

class OpTester {
 public:
  explicit OpTester(std::string op_type, AttributeMap attrs = {});

  // A graph input filled with random values uniform in [lo, hi] (rounded for integers; never
  // all zeros).
  OpTester& Input(DataType dtype, std::vector<int64_t> dims, double lo = -2.0, double hi = 2.0);
  // A graph input with given contents.
  OpTester& Input(Tensor value);
  // A graph constant (shape/axes inputs, weights): the provider sees it in the request.
  OpTester& Constant(Tensor value);
  // An omitted optional input.
  OpTester& Omitted();
  OpTester& Outputs(int n);
  OpTester& Reference(ReferenceFn fn);
  // Tolerance for f32 outputs: |got - want| <= abs + rel * |want|. f16/bf16 use 1e-2/2e-2 rel.
  OpTester& Tolerance(double abs, double rel);
  // Float storage types to run (float graph inputs and constants are cast to each). Default f32.
  OpTester& FloatTypes(std::vector<DataType> types);
  OpTester& Seed(uint32_t seed);

  // Runs every provider and tactic of `backend`; expects each to match the reference. Returns the
  // number of (type, tactic) combinations run; 0 with GTEST_SKIP when the backend is absent.
  int Run(BackendKind backend);

  // The one-node graph and kernel request Run builds for float storage `float_type` (float
  // operands in that type; random inputs as graph inputs, constants in the request), without
  // inputs or a device: what a provider's Tactics/Supports is asked about.
  struct Layer {
    Graph graph;
    KernelRequest request;
  };
  StatusOr<std::unique_ptr<Layer>> Request(DataType float_type) const;

  const std::string& op_type() const { return op_type_; }
  const std::vector<DataType>& float_types() const { return float_types_; }

 private:
  struct InputSpec {
    enum Kind { kRandom, kGiven, kConstant, kOmitted } kind;
    DataType dtype = DataType::kUndefined;
    std::vector<int64_t> dims;
    double lo = 0, hi = 0;
    Tensor value;
  };
  int RunType(BackendKind backend, DataType float_type);

  std::string op_type_;
  AttributeMap attrs_;
  std::vector<InputSpec> inputs_;
  int num_outputs_ = 1;
  ReferenceFn reference_;
  double abs_tol_ = 1e-5, rel_tol_ = 1e-5;
  std::vector<DataType> float_types_ = {DataType::kFloat32};
  std::mt19937 rng_{1234};
};

// Helpers for references.
RefTensor ToRef(const Tensor& t);
Tensor MakeTensor(DataType dtype, std::vector<int64_t> dims, const std::vector<double>& values);
Tensor Int64s(std::vector<int64_t> dims, const std::vector<int64_t>& values);
// The input index in `dims` of output index `i` under numpy broadcasting to `out_dims`.
int64_t BroadcastIndex(const std::vector<int64_t>& dims, const std::vector<int64_t>& out_dims,
                       int64_t i);
std::vector<int64_t> BroadcastDims(const std::vector<int64_t>& a, const std::vector<int64_t>& b);

// Conformance suites are TEST_P over this fixture, instantiated for every backend.
// SetUp skips the whole test when the backend is not available here.
class BackendTest : public ::testing::TestWithParam<BackendKind> {
 protected:
  void SetUp() override {
    auto backend = GetBackend(GetParam());
    if (!backend.ok()) GTEST_SKIP() << "backend unavailable: " << backend.status().ToString();
  }
};

}  // namespace kiln::testing

#define KILN_INSTANTIATE_BACKENDS(Suite)                                                         \
  INSTANTIATE_TEST_SUITE_P(                                                                      \
      Backends, Suite, ::testing::Values(::kiln::BackendKind::kCpu, ::kiln::BackendKind::kCuda), \
      [](const ::testing::TestParamInfo<::kiln::BackendKind>& info) {                            \
        return std::string(::kiln::ToString(info.param));                                        \
      })
