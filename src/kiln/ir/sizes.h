// Checked size arithmetic: the one place that decides whether a shape, an element count, a byte
// size or an offset is representable, and the limits kiln enforces on them (docs/limits.md).
// Every layer that takes sizes from outside (import, shape rules, profiles, the memory plan,
// run-time shapes) checks them here, so kernels can multiply checked dims without overflow.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string_view>

#include "kiln/core/status.h"
#include "kiln/ir/dim.h"
#include "kiln/ir/dtype.h"

namespace kiln {

// The largest tensor kiln plans, stores or runs: 2^40 bytes (1 TiB), far beyond any device and
// far inside int64, so that sums and strides of checked tensors cannot overflow.
inline constexpr int64_t kMaxTensorBytes = int64_t{1} << 40;
// The largest dimension, also of a tensor with no elements (its strides are still computed).
inline constexpr int64_t kMaxDim = kMaxTensorBytes;
// The largest sum of tensor sizes: weights, activation arena, workspace, a plan's peak.
inline constexpr int64_t kMaxTotalBytes = int64_t{1} << 50;

// Saturating arithmetic: a result outside int64 clamps to INT64_MAX or INT64_MIN, which every
// size check below rejects. Dim uses it so that no shape rule ever wraps around silently.
inline int64_t SatAdd(int64_t a, int64_t b) {
  int64_t r;
  if (!__builtin_add_overflow(a, b, &r)) return r;
  return b > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
}
inline int64_t SatSub(int64_t a, int64_t b) {
  int64_t r;
  if (!__builtin_sub_overflow(a, b, &r)) return r;
  return b < 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
}
inline int64_t SatMul(int64_t a, int64_t b) {
  int64_t r;
  if (!__builtin_mul_overflow(a, b, &r)) return r;
  return (a < 0) != (b < 0) ? std::numeric_limits<int64_t>::min()
                            : std::numeric_limits<int64_t>::max();
}
// A double rounded toward zero, clamped to int64 (NaN gives INT64_MAX: never a valid size).
int64_t SatFromDouble(double x);

// nullopt on overflow.
inline std::optional<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// A checked tensor size.
struct TensorSize {
  int64_t elements = 0;
  int64_t bytes = 0;
};

// The size of a dense tensor of `dims` and `dtype`. Every dim must be in [0, kMaxDim], and the
// dims' product (zeros counted as one: an empty tensor's strides are still computed) times the
// element size (one byte for kUndefined) at most kMaxTensorBytes. Errors carry `code` and name
// `what` ("initializer 'w'") and the offending value.
StatusOr<TensorSize> CheckedTensorSize(std::span<const int64_t> dims, DataType dtype,
                                       ErrorCode code, std::string_view what);

// The same for a possibly symbolic shape: static dims are checked one by one and their product
// as above; symbolic dims are checked when they are bound (profiles, run-time shapes).
Status CheckShapeSize(const Shape& shape, DataType dtype, ErrorCode code, std::string_view what);

// a + b for byte totals, at most kMaxTotalBytes (operands must be non-negative).
StatusOr<int64_t> CheckedTotalBytes(int64_t a, int64_t b, ErrorCode code, std::string_view what);

// n rounded up to a multiple of `alignment` (> 0), for a checked size n in [0, kMaxTotalBytes].
StatusOr<int64_t> CheckedAlignUp(int64_t n, int64_t alignment, ErrorCode code,
                                 std::string_view what);

}  // namespace kiln
