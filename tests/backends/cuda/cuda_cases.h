// Shared by the CUDA conformance case tables (cuda_kernels_test.cc, cuda_ops_more_test.cc): dtype
// shorthands, tensor and attribute builders, the backend the cases run on, and gtest names.
#pragma once

#include <cctype>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "kiln/backends/backend.h"
#include "kiln/ir/attribute.h"
#include "kiln/ir/tensor.h"

namespace kiln::testing {

inline constexpr DataType kF32 = DataType::kFloat32;
inline constexpr DataType kI64 = DataType::kInt64;
inline constexpr DataType kI32 = DataType::kInt32;
inline constexpr DataType kBool = DataType::kBool;
inline const std::vector<DataType> kAllFloats = {DataType::kFloat32, DataType::kFloat16,
                                                 DataType::kBFloat16};

// The cases run on CUDA; KILN_CUDA_KERNELS_ON=cpu runs them on the CPU providers instead (a check
// of the cases themselves on a machine without a GPU).
inline BackendKind TargetBackend() {
  const char* on = std::getenv("KILN_CUDA_KERNELS_ON");
  return on && std::string(on) == "cpu" ? BackendKind::kCpu : BackendKind::kCuda;
}

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

// A case name as a gtest parameter name: every character but letters and digits becomes '_'.
inline std::string CaseTestName(std::string name) {
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

}  // namespace kiln::testing
