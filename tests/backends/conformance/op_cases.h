// The op conformance suite's case tables: one table per op family (elementwise_cases.cc,
// nn_cases.cc, reduce_cases.cc, tensor_cases.cc, matmul_cases.cc, quantize_cases.cc). A case is a
// one-node graph as an OpTester (op_tester.h); op_conformance_test.cc runs every case on every
// backend built into this kiln (TEST_P over BackendKind x case): every provider and tactic of the
// backend, in every float storage type the case names, on fresh random inputs, against the case's
// reference or the CPU backend's first tactic. Cases made with `must` also require a tactic on
// every backend (the suite checks that host-side, without a device); the others are checked where
// a backend has one. Backend-specific tests (run-time index checks, NHWC variants, tactic names)
// stay in tests/backends/<backend>/.
#pragma once

#include <cctype>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kiln/ir/attribute.h"
#include "kiln/ir/tensor.h"
#include "op_tester.h"

namespace kiln::testing {

struct OpCase {
  std::string name;
  std::function<OpTester()> make;
  bool required = false;  // every backend must offer a tactic
};

std::vector<OpCase> ElementwiseCases();
std::vector<OpCase> NnCases();
std::vector<OpCase> ReduceCases();
std::vector<OpCase> TensorCases();
std::vector<OpCase> MatmulCases();
std::vector<OpCase> QuantizeCases();

// ---- shorthands for the tables ------------------------------------------------------------------
inline constexpr DataType kF32 = DataType::kFloat32;
inline constexpr DataType kI64 = DataType::kInt64;
inline constexpr DataType kI32 = DataType::kInt32;
inline constexpr DataType kBool = DataType::kBool;
inline const std::vector<DataType> kAllFloats = {DataType::kFloat32, DataType::kFloat16,
                                                 DataType::kBFloat16};

inline AttributeMap Attrs(std::initializer_list<std::pair<const char*, Attribute>> kv) {
  AttributeMap m;
  for (const auto& [k, v] : kv) m.Set(k, v);
  return m;
}
inline Tensor I64(std::vector<int64_t> dims, std::vector<int64_t> v) {
  return Tensor::FromVector(kI64, std::move(dims), v);
}
inline Tensor I32(std::vector<int64_t> dims, std::vector<int32_t> v) {
  return Tensor::FromVector(kI32, std::move(dims), v);
}
inline Tensor F32(std::vector<int64_t> dims, std::vector<float> v) {
  return Tensor::FromVector(kF32, std::move(dims), v);
}
// f32 with small integer values: many exact ties in every float type (ArgMax, TopK).
inline Tensor Rounded(std::vector<int64_t> dims, int lo, int hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(NumElements(dims)));
  for (float& x : v) x = static_cast<float>(dist(rng));
  return F32(std::move(dims), v);
}
// A permutation of 0..n-1 (distinct indices for ScatterND without reduction), as int64.
inline std::vector<int64_t> Shuffled(int64_t n, uint32_t seed) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  std::shuffle(v.begin(), v.end(), std::mt19937(seed));
  return v;
}

// A case name as a gtest parameter name: every character but letters and digits becomes '_'.
inline std::string CaseTestName(std::string name) {
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

}  // namespace kiln::testing
