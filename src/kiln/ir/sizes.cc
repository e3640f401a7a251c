// Checked size arithmetic and kiln's size limits.
#include "kiln/ir/sizes.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

namespace kiln {

int64_t SatFromDouble(double x) {
  // 2^63 is exactly representable; every double below it converts without overflow.
  constexpr double kTwo63 = 9223372036854775808.0;
  if (std::isnan(x) || x >= kTwo63) return std::numeric_limits<int64_t>::max();
  if (x < -kTwo63) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(x);
}

namespace {
Status TooLarge(ErrorCode code, std::string_view what, std::string_view detail) {
  return MakeError(code, "{} {}; kiln's limit is {} bytes (1 TiB) per tensor and {} per dimension",
                   what, detail, kMaxTensorBytes, kMaxDim);
}

// The product check shared by both entry points: `extent` is the product so far (zeros counted
// as one), `dims_text` the shape as the message shows it.
Status CheckExtent(int64_t extent, DataType dtype, ErrorCode code, std::string_view what,
                   const std::string& dims_text) {
  const int64_t elem = dtype == DataType::kUndefined ? 1 : static_cast<int64_t>(SizeOf(dtype));
  auto bytes = CheckedMul(extent, elem);
  if (!bytes || *bytes > kMaxTensorBytes) {
    return TooLarge(
        code, what,
        bytes ? fmt::format("has shape {} ({} bytes of {})", dims_text, *bytes, ToString(dtype))
              : fmt::format("has shape {}, whose byte size overflows 64 bits", dims_text));
  }
  return OkStatus();
}
}  // namespace

StatusOr<TensorSize> CheckedTensorSize(std::span<const int64_t> dims, DataType dtype,
                                       ErrorCode code, std::string_view what) {
  int64_t extent = 1;
  bool empty = false;
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = dims[i];
    if (d < 0) {
      return MakeError(code, "{} has shape [{}]: dimension {} is negative ({})", what,
                       fmt::join(dims, ","), i, d);
    }
    if (d > kMaxDim) {
      return TooLarge(
          code, what,
          fmt::format("has shape [{}]: dimension {} is {}", fmt::join(dims, ","), i, d));
    }
    if (d == 0) empty = true;
    auto next = CheckedMul(extent, std::max<int64_t>(d, 1));
    if (!next || *next > kMaxTensorBytes) {
      return TooLarge(code, what,
                      fmt::format("has shape [{}], more than {} elements", fmt::join(dims, ","),
                                  kMaxTensorBytes));
    }
    extent = *next;
  }
  KILN_RETURN_IF_ERROR(
      CheckExtent(extent, dtype, code, what, fmt::format("[{}]", fmt::join(dims, ","))));
  TensorSize size;
  size.elements = empty ? 0 : extent;
  size.bytes = size.elements * static_cast<int64_t>(SizeOf(dtype));
  return size;
}

Status CheckShapeSize(const Shape& shape, DataType dtype, ErrorCode code, std::string_view what) {
  int64_t extent = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    auto d = shape[i].static_value();
    if (!d) continue;
    if (*d < 0) {
      return MakeError(code, "{} has shape {}: dimension {} is negative ({})", what,
                       ToString(shape), i, *d);
    }
    if (*d > kMaxDim) {
      return TooLarge(code, what,
                      fmt::format("has shape {}: dimension {} is {}", ToString(shape), i, *d));
    }
    auto next = CheckedMul(extent, std::max<int64_t>(*d, 1));
    if (!next || *next > kMaxTensorBytes) {
      return TooLarge(code, what,
                      fmt::format("has shape {}, more than {} elements in its static dimensions",
                                  ToString(shape), kMaxTensorBytes));
    }
    extent = *next;
  }
  return CheckExtent(extent, dtype, code, what, ToString(shape));
}

StatusOr<int64_t> CheckedTotalBytes(int64_t a, int64_t b, ErrorCode code, std::string_view what) {
  auto sum = CheckedAdd(a, b);
  if (a < 0 || b < 0 || !sum || *sum > kMaxTotalBytes) {
    return MakeError(code, "{} would need {} + {} bytes, more than kiln's limit of {} bytes", what,
                     a, b, kMaxTotalBytes);
  }
  return *sum;
}

StatusOr<int64_t> CheckedAlignUp(int64_t n, int64_t alignment, ErrorCode code,
                                 std::string_view what) {
  if (alignment <= 0 || alignment > kMaxTotalBytes) {
    return MakeError(ErrorCode::kInternal, "{}: alignment {} is not in [1, {}]", what, alignment,
                     kMaxTotalBytes);
  }
  if (n < 0 || n > kMaxTotalBytes) {
    return MakeError(code, "{} is {} bytes, outside kiln's limit of [0, {}]", what, n,
                     kMaxTotalBytes);
  }
  return (n + alignment - 1) / alignment * alignment;  // cannot overflow: both <= 2^50
}

}  // namespace kiln
