// The mapping between ONNX TensorProto element-type codes and kiln DataTypes, in one place: Cast's
// `to` attribute, ConstantOfShape and the ONNX importer all use it.
#pragma once

#include <cstdint>
#include <optional>

#include "kiln/ir/dtype.h"

namespace kiln {

// ONNX TensorProto.DataType codes kiln stores.
inline std::optional<DataType> DataTypeFromOnnx(int64_t code) {
  switch (code) {
    case 1:
      return DataType::kFloat32;
    case 2:
      return DataType::kUInt8;
    case 3:
      return DataType::kInt8;
    case 6:
      return DataType::kInt32;
    case 7:
      return DataType::kInt64;
    case 9:
      return DataType::kBool;
    case 10:
      return DataType::kFloat16;
    case 16:
      return DataType::kBFloat16;
    case 4:
      return DataType::kUInt16;
    case 5:
      return DataType::kInt16;
    case 11:
      return DataType::kFloat64;
    case 12:
      return DataType::kUInt32;
    case 13:
      return DataType::kUInt64;
    default:
      return std::nullopt;
  }
}

// 0 (UNDEFINED) for kUndefined.
inline int64_t OnnxDataTypeCode(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return 1;
    case DataType::kUInt8:
      return 2;
    case DataType::kInt8:
      return 3;
    case DataType::kInt32:
      return 6;
    case DataType::kInt64:
      return 7;
    case DataType::kBool:
      return 9;
    case DataType::kFloat16:
      return 10;
    case DataType::kBFloat16:
      return 16;
    case DataType::kUInt16:
      return 4;
    case DataType::kInt16:
      return 5;
    case DataType::kFloat64:
      return 11;
    case DataType::kUInt32:
      return 12;
    case DataType::kUInt64:
      return 13;
    case DataType::kUndefined:
      return 0;
  }
  return 0;
}

}  // namespace kiln
