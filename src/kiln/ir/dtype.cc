// DataType names and sizes.
#include "kiln/ir/dtype.h"

#include "kiln/core/float16.h"

namespace kiln {

size_t SizeOf(DataType t) {
  switch (t) {
#define KILN_DTYPE_SIZE(name, short_name, ctype, size) \
  case DataType::k##name:                              \
    return size;
    KILN_DTYPES(KILN_DTYPE_SIZE)
#undef KILN_DTYPE_SIZE
    case DataType::kUndefined:
      return 0;
  }
  return 0;
}

int BitWidth(DataType t) {
  switch (t) {
    case DataType::kInt4:
    case DataType::kUInt4:
    case DataType::kFloat4E2M1:
      return 4;
    case DataType::kInt2:
    case DataType::kUInt2:
      return 2;
    default:
      return static_cast<int>(8 * SizeOf(t));
  }
}

std::string_view ToString(DataType t) {
  switch (t) {
#define KILN_DTYPE_NAME(name, short_name, ctype, size) \
  case DataType::k##name:                              \
    return short_name;
    KILN_DTYPES(KILN_DTYPE_NAME)
#undef KILN_DTYPE_NAME
    case DataType::kUndefined:
      return "undefined";
  }
  return "undefined";
}

std::optional<DataType> ParseDataType(std::string_view s) {
#define KILN_DTYPE_PARSE(name, short_name, ctype, size) \
  if (s == short_name) return DataType::k##name;
  KILN_DTYPES(KILN_DTYPE_PARSE)
#undef KILN_DTYPE_PARSE
  return std::nullopt;
}

}  // namespace kiln
