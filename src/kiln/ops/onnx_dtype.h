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
    case 17:
      return DataType::kFloat8E4M3FN;
    case 18:
      return DataType::kFloat8E4M3FNUZ;
    case 19:
      return DataType::kFloat8E5M2;
    case 20:
      return DataType::kFloat8E5M2FNUZ;
    case 21:
      return DataType::kUInt4;
    case 22:
      return DataType::kInt4;
    case 23:
      return DataType::kFloat4E2M1;
    case 24:
      return DataType::kFloat8E8M0;
    case 25:
      return DataType::kUInt2;
    case 26:
      return DataType::kInt2;
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
    case DataType::kFloat8E4M3FN:
      return 17;
    case DataType::kFloat8E4M3FNUZ:
      return 18;
    case DataType::kFloat8E5M2:
      return 19;
    case DataType::kFloat8E5M2FNUZ:
      return 20;
    case DataType::kUInt4:
      return 21;
    case DataType::kInt4:
      return 22;
    case DataType::kFloat4E2M1:
      return 23;
    case DataType::kFloat8E8M0:
      return 24;
    case DataType::kUInt2:
      return 25;
    case DataType::kInt2:
      return 26;
    case DataType::kUndefined:
      return 0;
  }
  return 0;
}

}  // namespace kiln
