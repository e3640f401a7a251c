// Element types kiln's IR and engines use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "kiln/core/minifloat.h"

namespace kiln {

#define KILN_DTYPES(X)                        \
  X(Float32, "f32", float, 4)                 \
  X(Float16, "f16", Float16, 2)               \
  X(BFloat16, "bf16", BFloat16, 2)            \
  X(Int8, "i8", int8_t, 1)                    \
  X(UInt8, "u8", uint8_t, 1)                  \
  X(Int32, "i32", int32_t, 4)                 \
  X(Int64, "i64", int64_t, 8)                 \
  X(Bool, "bool", bool, 1)                    \
  X(Float64, "f64", double, 8)                \
  X(Int16, "i16", int16_t, 2)                 \
  X(UInt16, "u16", uint16_t, 2)               \
  X(UInt32, "u32", uint32_t, 4)               \
  X(UInt64, "u64", uint64_t, 8)               \
  X(Float8E4M3FN, "f8e4m3fn", uint8_t, 1)     \
  X(Float8E4M3FNUZ, "f8e4m3fnuz", uint8_t, 1) \
  X(Float8E5M2, "f8e5m2", uint8_t, 1)         \
  X(Float8E5M2FNUZ, "f8e5m2fnuz", uint8_t, 1) \
  X(Float8E8M0, "f8e8m0", uint8_t, 1)         \
  X(Float4E2M1, "f4e2m1", uint8_t, 1)         \
  X(Int4, "i4", int8_t, 1)                    \
  X(UInt4, "u4", uint8_t, 1)                  \
  X(Int2, "i2", int8_t, 1)                    \
  X(UInt2, "u2", uint8_t, 1)

// New types go at the end: engine files store the enum's value.
enum class DataType : uint8_t {
  kUndefined = 0,
#define KILN_DTYPE_ENUM(name, short_name, ctype, size) k##name,
  KILN_DTYPES(KILN_DTYPE_ENUM)
#undef KILN_DTYPE_ENUM
};
// The last type in KILN_DTYPES (engine files check stored types against it).
inline constexpr DataType kLastDataType = DataType::kUInt2;

size_t SizeOf(DataType t);
std::string_view ToString(DataType t);  // "f32", "f16", ...
std::optional<DataType> ParseDataType(std::string_view s);
// The float types that compute in FP32 (f16/bf16 storage converts around it) and that reduced
// precision may assign; FP64 is apart (IsFloatingPoint), kept in its own type end to end.
inline bool IsFloat(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat16 || t == DataType::kBFloat16;
}
inline bool IsFloatingPoint(DataType t) { return IsFloat(t) || t == DataType::kFloat64; }
inline bool IsUnsigned(DataType t) {
  return t == DataType::kUInt8 || t == DataType::kUInt16 || t == DataType::kUInt32 ||
         t == DataType::kUInt64;
}
// Storage-only types (ONNX's float8, float4, int4, uint4, int2, uint2): kiln holds them one value
// per byte in memory and in engine files (int4/int2 sign-extended, float4 in the low nibble);
// only ONNX tensors pack 4- and 2-bit values. Cast, QuantizeLinear/DequantizeLinear and the
// data-movement kernels that opt in read and write them; every other kernel refuses them at build.
// They are neither IsFloat nor IsInteger, so no arithmetic rule accepts them by accident.
inline bool IsStorageOnly(DataType t) {
  return t >= DataType::kFloat8E4M3FN && t <= DataType::kUInt2;
}
inline bool IsFloat8(DataType t) {
  return t >= DataType::kFloat8E4M3FN && t <= DataType::kFloat8E5M2FNUZ;  // not E8M0
}
// The bit layout of a float8 type (IsFloat8).
inline Float8Format ToFloat8Format(DataType t) {
  switch (t) {
    case DataType::kFloat8E4M3FNUZ:
      return Float8Format::kE4M3FNUZ;
    case DataType::kFloat8E5M2:
      return Float8Format::kE5M2;
    case DataType::kFloat8E5M2FNUZ:
      return Float8Format::kE5M2FNUZ;
    default:
      return Float8Format::kE4M3FN;
  }
}
// Bits per element in an ONNX tensor (raw_data / int32_data packing): 4 or 2 for the sub-byte
// types, else 8 * SizeOf(t).
int BitWidth(DataType t);
inline bool IsInteger(DataType t) {
  return t == DataType::kInt8 || t == DataType::kInt16 || t == DataType::kInt32 ||
         t == DataType::kInt64 || IsUnsigned(t);
}

}  // namespace kiln
