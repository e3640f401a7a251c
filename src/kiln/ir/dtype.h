// Element types kiln's IR and engines use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kiln {

#define KILN_DTYPES(X)             \
  X(Float32, "f32", float, 4)      \
  X(Float16, "f16", Float16, 2)    \
  X(BFloat16, "bf16", BFloat16, 2) \
  X(Int8, "i8", int8_t, 1)         \
  X(UInt8, "u8", uint8_t, 1)       \
  X(Int32, "i32", int32_t, 4)      \
  X(Int64, "i64", int64_t, 8)      \
  X(Bool, "bool", bool, 1)         \
  X(Float64, "f64", double, 8)     \
  X(Int16, "i16", int16_t, 2)      \
  X(UInt16, "u16", uint16_t, 2)    \
  X(UInt32, "u32", uint32_t, 4)    \
  X(UInt64, "u64", uint64_t, 8)

// New types go at the end: engine files store the enum's value.
enum class DataType : uint8_t {
  kUndefined = 0,
#define KILN_DTYPE_ENUM(name, short_name, ctype, size) k##name,
  KILN_DTYPES(KILN_DTYPE_ENUM)
#undef KILN_DTYPE_ENUM
};
// The last type in KILN_DTYPES (engine files check stored types against it).
inline constexpr DataType kLastDataType = DataType::kUInt64;

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
inline bool IsInteger(DataType t) {
  return t == DataType::kInt8 || t == DataType::kInt16 || t == DataType::kInt32 ||
         t == DataType::kInt64 || IsUnsigned(t);
}

}  // namespace kiln
