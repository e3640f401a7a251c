// A minimal single-op harness for the CPU nn/matmul kernel tests: builds a one-node graph,
// infers its output shape, and runs every tactic of every provider of the op against a
// double-precision reference. (A shared op tester is being written separately; this one is
// local until they are unified.)
#pragma once

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kiln/backends/kernel.h"
#include "kiln/ir/attribute.h"
#include "kiln/ir/tensor.h"

namespace kiln::testing {

struct OpCase {
  std::string op;
  AttributeMap attrs;
  std::vector<Tensor> inputs;  // an empty Tensor is an omitted optional input
  std::vector<bool> constant;  // per input: a constant (weights) rather than a graph input
  size_t num_outputs = 1;
};

// Uniform random floats in [lo, hi), never all zeros.
Tensor RandomTensor(std::vector<int64_t> dims, std::mt19937& rng, float lo = -1.f, float hi = 1.f);

// The values of the case's first output computed by `reference` from the inputs as doubles.
using Reference = std::function<std::vector<double>(const std::vector<Tensor>& inputs,
                                                    const std::vector<int64_t>& out_dims)>;

struct TacticResult {
  std::string provider, tactic;
  size_t workspace = 0;
  double max_abs_err = 0, max_ref = 0;
};

// Runs every tactic of every CPU provider of the op with the inputs cast to `dtype` (float
// inputs only) and checks |y - ref| <= atol + rtol * |ref| elementwise. Returns each tactic's
// result; adds gtest failures for mismatches, errors or when no tactic exists.
std::vector<TacticResult> CheckAllTactics(const OpCase& c, const Reference& reference, double atol,
                                          double rtol, DataType dtype = DataType::kFloat32);

// Runs the first tactic of the first CPU provider that offers one, with every output allocated,
// and returns output `k` (the harness above checks output 0 only).
StatusOr<Tensor> RunFirstTactic(const OpCase& c, size_t k);

// Output shape inferred for the case (static), or an error.
StatusOr<std::vector<int64_t>> InferOutputDims(const OpCase& c);

}  // namespace kiln::testing
