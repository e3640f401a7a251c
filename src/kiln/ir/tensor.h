// Host tensors: Tensor owns its bytes (weights, constants, test data); TensorView borrows them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/core/float16.h"
#include "kiln/core/status.h"
#include "kiln/ir/dtype.h"

namespace kiln {

// The product of `dims`, saturating at INT64_MAX instead of wrapping. Tensors take dims that
// passed CheckedTensorSize (ir/sizes.h) wherever they come from outside, so this never
// saturates for them; where it would, allocation fails (std::bad_alloc) instead of
// under-allocating.
int64_t NumElements(std::span<const int64_t> dims);
inline int64_t NumElements(const std::vector<int64_t>& dims) {
  return NumElements(std::span<const int64_t>(dims));
}

// elements * SizeOf(dtype), saturating like NumElements.
size_t ByteSize(int64_t elements, DataType dtype);

// A borrowed, dense, row-major tensor.
struct TensorView {
  DataType dtype = DataType::kUndefined;
  std::span<const int64_t> dims;
  void* data = nullptr;

  int64_t num_elements() const { return NumElements(dims); }
  size_t size_bytes() const { return ByteSize(num_elements(), dtype); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// An owned, dense, row-major host tensor. Bytes are 64-byte aligned. Copyable (deep copy is the
// point: constants are values). Storage may also be borrowed from a mapped file, kept alive by
// `keepalive`.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DataType dtype, std::vector<int64_t> dims);  // zero-filled
  static Tensor FromBytes(DataType dtype, std::vector<int64_t> dims,
                          std::span<const std::byte> bytes);
  // Shares memory owned by `keepalive` (e.g. an mmapped engine); never copies.
  static Tensor Borrow(DataType dtype, std::vector<int64_t> dims, const void* data,
                       std::shared_ptr<const void> keepalive);
  template <typename T>
  static Tensor FromVector(DataType dtype, std::vector<int64_t> dims,
                           const std::vector<T>& values) {
    return FromBytes(dtype, std::move(dims),
                     std::as_bytes(std::span(values.data(), values.size())));
  }

  DataType dtype() const { return dtype_; }
  const std::vector<int64_t>& dims() const { return dims_; }
  int64_t num_elements() const { return NumElements(dims_); }
  size_t size_bytes() const { return ByteSize(num_elements(), dtype_); }
  bool empty() const { return dtype_ == DataType::kUndefined; }

  const void* raw() const { return data_; }
  // What keeps raw() alive (shared by copies; device_eval.h holds it to pin the bytes).
  const std::shared_ptr<const void>& storage() const { return storage_; }
  void* mutable_raw();  // copies borrowed storage first
  std::span<const std::byte> bytes() const {
    return {static_cast<const std::byte*>(data_), size_bytes()};
  }
  template <typename T>
  const T* data() const {
    return static_cast<const T*>(data_);
  }
  template <typename T>
  T* mutable_data() {
    return static_cast<T*>(mutable_raw());
  }
  TensorView view() const { return {dtype_, dims_, const_cast<void*>(data_)}; }

  // Element i converted to double / int64 (any dtype). For tests, folding and shape values.
  double GetDouble(int64_t i) const;
  int64_t GetInt(int64_t i) const;
  // Converted copy (float <-> half <-> int ...), rounding to nearest even.
  Tensor CastTo(DataType dtype) const;
  // A tensor whose bytes the caller writes every one of next (not zeroed first).
  static Tensor ForOverwrite(DataType dtype, std::vector<int64_t> dims);
  std::vector<int64_t> ToInt64Vector() const;
  std::vector<float> ToFloatVector() const;

 private:
  DataType dtype_ = DataType::kUndefined;
  std::vector<int64_t> dims_;
  std::shared_ptr<const void> storage_;
  const void* data_ = nullptr;
};

// Elements [begin, end) of `src` converted into `dst` (same element count, dst's dtype), as
// CastTo converts them: a large cast split over threads gives CastTo's bytes.
void CastElements(const TensorView& src, const TensorView& dst, int64_t begin, int64_t end);

// Reads element i of a view as double and writes element i from double (for reference code).
double LoadAsDouble(const TensorView& v, int64_t i);
void StoreFromDouble(const TensorView& v, int64_t i, double x);

}  // namespace kiln
