// onnx.TensorProto -> kiln Tensor: element types, typed fields vs raw_data, and external data
// files (mapped once, checked against the model directory and the bytes each tensor needs).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/ranges.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>

#include "kiln/core/file_io.h"
#include "kiln/ir/sizes.h"
#include "kiln/onnx/onnx_internal.h"
#include "kiln/ops/onnx_dtype.h"

namespace kiln::onnx_internal {

namespace fs = std::filesystem;

std::optional<DataType> ToKilnDataType(int64_t t) { return DataTypeFromOnnx(t); }

std::string OnnxDataTypeName(int64_t t) {
  // The TensorProto.DataType numbering, including the types newer than the onnx headers here.
  static constexpr const char* kNames[] = {
      "undefined",      "float32",  "uint8",        "int8",           "uint16",
      "int16",          "int32",    "int64",        "string",         "bool",
      "float16",        "float64",  "uint32",       "uint64",         "complex64",
      "complex128",     "bfloat16", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2",
      "float8e5m2fnuz", "uint4",    "int4",         "float4e2m1",     "float8e8m0",
      "uint2",          "int2"};
  if (t >= 0 && t < static_cast<int64_t>(std::size(kNames))) return kNames[t];
  return fmt::format("type {}", t);
}

// ---- external data ----

ExternalDataResolver::ExternalDataResolver(std::string base_dir) : base_dir_(std::move(base_dir)) {}

StatusOr<std::string> ExternalDataResolver::CheckedPath(const std::string& tensor_name,
                                                        const std::string& location) {
  if (location.empty()) {
    return MakeError(ErrorCode::kInvalidModel,
                     "tensor '{}' has external data without a 'location' key", tensor_name);
  }
  if (location.find('\0') != std::string::npos) {
    return MakeError(ErrorCode::kExternalDataPathInvalid,
                     "tensor '{}': external data location contains a NUL byte", tensor_name);
  }
  fs::path rel(location);
  if (rel.is_absolute() || rel.has_root_name() || rel.has_root_directory()) {
    return MakeError(ErrorCode::kExternalDataPathInvalid,
                     "tensor '{}': external data location '{}' is an absolute path; it must be "
                     "relative to the model's directory",
                     tensor_name, location);
  }
  fs::path normal = rel.lexically_normal();
  if (normal.empty() || *normal.begin() == ".." || normal == ".") {
    return MakeError(ErrorCode::kExternalDataPathInvalid,
                     "tensor '{}': external data location '{}' escapes the model's directory "
                     "('..')",
                     tensor_name, location);
  }
  if (base_dir_.empty()) {
    return MakeError(ErrorCode::kExternalDataMissing,
                     "tensor '{}' keeps its data in external file '{}', but the model was given "
                     "as bytes without a directory to look in",
                     tensor_name, location);
  }
  fs::path full = fs::path(base_dir_) / normal;
  // A symlink inside the directory may still point outside it.
  std::error_code ec;
  fs::path real = fs::canonical(full, ec);
  if (!ec) {
    fs::path real_base = fs::canonical(base_dir_, ec);
    if (!ec) {
      auto rel_real = real.lexically_relative(real_base);
      if (rel_real.empty() || *rel_real.begin() == "..") {
        return MakeError(ErrorCode::kExternalDataPathInvalid,
                         "tensor '{}': external data file '{}' resolves (through a symlink) to "
                         "'{}', outside the model's directory '{}'",
                         tensor_name, location, real.string(), real_base.string());
      }
    }
  }
  return full.string();
}

namespace {

StatusOr<int64_t> ParseNonNegative(const std::string& tensor, const std::string& key,
                                   const std::string& text) {
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || ptr != text.data() + text.size() || v < 0) {
    return MakeError(ErrorCode::kInvalidModel,
                     "tensor '{}': external data key '{}' is '{}', not a non-negative integer",
                     tensor, key, text);
  }
  return v;
}

}  // namespace

StatusOr<ExternalDataResolver::Range> ExternalDataResolver::Resolve(const onnx::TensorProto& tensor,
                                                                    size_t expected_bytes) {
  std::string location;
  int64_t offset = 0;
  std::optional<int64_t> length;
  for (const auto& kv : tensor.external_data()) {
    if (kv.key() == "location") {
      location = kv.value();
    } else if (kv.key() == "offset") {
      KILN_ASSIGN_OR_RETURN(offset, ParseNonNegative(tensor.name(), "offset", kv.value()));
    } else if (kv.key() == "length") {
      KILN_ASSIGN_OR_RETURN(length, ParseNonNegative(tensor.name(), "length", kv.value()));
    }
  }
  KILN_ASSIGN_OR_RETURN(std::string path, CheckedPath(tensor.name(), location));
  if (length && static_cast<uint64_t>(*length) != expected_bytes) {
    return MakeError(ErrorCode::kInvalidModel,
                     "tensor '{}': external data length is {} bytes but its shape and type "
                     "need {}",
                     tensor.name(), *length, expected_bytes);
  }
  auto it = files_.find(path);
  if (it == files_.end()) {
    StatusOr<InputFile> opened = OpenInputFile(path, "external data file");
    if (!opened.ok()) {
      const ErrorCode code = opened.status().code();
      if (code != ErrorCode::kNotFound && code != ErrorCode::kIoError) {  // a FIFO, a device
        return std::move(opened).status().AddContext(
            fmt::format("while reading the external data of tensor '{}'", tensor.name()));
      }
      return MakeError(ErrorCode::kExternalDataMissing,
                       "tensor '{}' keeps its data in '{}' (looked for '{}'), which cannot be "
                       "opened: {}",
                       tensor.name(), location, path, opened.status().message());
    }
    const int fd = opened->fd.get();
    Mapping m;
    m.size = static_cast<size_t>(opened->size);
    if (m.size > 0) {
      void* p = ::mmap(nullptr, m.size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        int err = errno;
        return MakeError(ErrorCode::kIoError, "tensor '{}': mmap of '{}' ({} bytes) failed: {}",
                         tensor.name(), path, m.size, std::strerror(err));
      }
      size_t size = m.size;
      m.keepalive = std::shared_ptr<const void>(
          p, [size](const void* q) { ::munmap(const_cast<void*>(q), size); });
      m.data = static_cast<const std::byte*>(p);
    }
    // The descriptor closes with `opened`; the mapping stays valid without it.
    it = files_.emplace(path, std::move(m)).first;
  }
  const Mapping& m = it->second;
  uint64_t end = static_cast<uint64_t>(offset) + expected_bytes;
  if (static_cast<uint64_t>(offset) > m.size || end > m.size) {
    return MakeError(ErrorCode::kExternalDataMissing,
                     "tensor '{}' needs bytes [{}, {}) of '{}', but the file has only {} bytes "
                     "(truncated or the wrong file)",
                     tensor.name(), offset, end, path, m.size);
  }
  Range r;
  r.data = m.data ? m.data + offset : nullptr;
  r.size = expected_bytes;
  r.keepalive = m.keepalive;
  return r;
}

// ---- TensorProto ----

namespace {

// The range of an integer type that int32_data stores widened (8 and 16 bits); nullopt for others.
std::optional<std::pair<int32_t, int32_t>> NarrowIntegerRange(DataType t) {
  switch (t) {
    case DataType::kInt8:
      return std::pair{-128, 127};
    case DataType::kUInt8:
      return std::pair{0, 255};
    case DataType::kInt16:
      return std::pair{-32768, 32767};
    case DataType::kUInt16:
      return std::pair{0, 65535};
    default:
      return std::nullopt;
  }
}

template <typename Field>
Status CheckCount(const onnx::TensorProto& p, const char* field, const Field& f, int64_t n) {
  if (static_cast<int64_t>(f.size()) != n) {
    return MakeError(ErrorCode::kInvalidModel, "tensor '{}' has {} elements but {} values in {}",
                     p.name(), n, f.size(), field);
  }
  return OkStatus();
}

// ONNX packs 4-bit values two to a byte and 2-bit values four to a byte, the first element in
// the least significant bits; kiln holds one value per byte (dtype.h), signed ones sign-extended.
size_t OnnxBytes(DataType t, int64_t n) {
  const int bits = BitWidth(t);
  if (bits >= 8) return static_cast<size_t>(n) * static_cast<size_t>(bits / 8);
  const int64_t per_byte = 8 / bits;
  return static_cast<size_t>((n + per_byte - 1) / per_byte);
}

// `packed` holds OnnxBytes(t, n) bytes (or one byte per int32_data entry: `stride` 4 bytes apart).
Tensor UnpackSubByte(DataType t, std::vector<int64_t> dims, const std::byte* packed,
                     size_t stride = 1) {
  Tensor out(t, std::move(dims));
  const int bits = BitWidth(t);
  const int per_byte = 8 / bits;
  const bool is_signed = t == DataType::kInt4 || t == DataType::kInt2;
  auto* y = static_cast<uint8_t*>(out.mutable_raw());
  const int64_t n = out.num_elements();
  for (int64_t i = 0; i < n; ++i) {
    const auto byte = static_cast<uint8_t>(packed[static_cast<size_t>(i / per_byte) * stride]);
    const int v = (byte >> ((i % per_byte) * bits)) & ((1 << bits) - 1);
    y[i] = static_cast<uint8_t>(WrapToBits(v, bits, is_signed));
  }
  return out;
}

}  // namespace

namespace {

// `owner`, when given, is `p` itself, and its raw_data may be taken instead of copied.
StatusOr<Tensor> ConvertTensorProto(const onnx::TensorProto& p, ExternalDataResolver* resolver,
                                    onnx::TensorProto* owner) {
  std::optional<DataType> dtype = ToKilnDataType(p.data_type());
  if (!dtype) {
    return MakeError(ErrorCode::kUnsupportedDataType,
                     "tensor '{}' has element type {}, which kiln does not support", p.name(),
                     OnnxDataTypeName(p.data_type()));
  }
  if (p.has_segment()) {
    return MakeError(ErrorCode::kInvalidModel,
                     "tensor '{}' is stored in segments, which kiln does not read", p.name());
  }
  std::vector<int64_t> dims(p.dims().begin(), p.dims().end());
  for (int64_t d : dims) {
    if (d < 0) {
      return MakeError(ErrorCode::kInvalidModel, "tensor '{}' has a negative dimension {}",
                       p.name(), d);
    }
  }
  // Bound the size before anything is allocated (the file may be hostile).
  KILN_ASSIGN_OR_RETURN(TensorSize size, CheckedTensorSize(dims, *dtype, ErrorCode::kTensorTooLarge,
                                                           fmt::format("tensor '{}'", p.name())));
  const int64_t n = size.elements;
  const size_t elem = SizeOf(*dtype);
  const size_t bytes = static_cast<size_t>(size.bytes);
  const bool packed = BitWidth(*dtype) < 8;
  const size_t onnx_bytes = packed ? OnnxBytes(*dtype, n) : bytes;

  if (p.data_location() == onnx::TensorProto::EXTERNAL) {
    if (!resolver) {
      return MakeError(ErrorCode::kExternalDataMissing,
                       "tensor '{}' uses external data, which is not allowed here", p.name());
    }
    KILN_ASSIGN_OR_RETURN(auto range, resolver->Resolve(p, onnx_bytes));
    if (bytes == 0) return Tensor(*dtype, std::move(dims));
    if (packed) return UnpackSubByte(*dtype, std::move(dims), range.data);
    // Borrow the mapping when kernels get the alignment they may assume; copy otherwise.
    if (reinterpret_cast<uintptr_t>(range.data) % 64 == 0) {
      return Tensor::Borrow(*dtype, std::move(dims), range.data, std::move(range.keepalive));
    }
    return Tensor::FromBytes(*dtype, std::move(dims), {range.data, range.size});
  }

  if (p.has_raw_data()) {
    if (p.raw_data().size() != onnx_bytes) {
      return MakeError(ErrorCode::kInvalidModel,
                       "tensor '{}' ({} {}) needs {} bytes of raw_data but has {}", p.name(),
                       ToString(*dtype), fmt::format("{}", fmt::join(dims, "x")), onnx_bytes,
                       p.raw_data().size());
    }
    if (packed) {
      return UnpackSubByte(*dtype, std::move(dims),
                           reinterpret_cast<const std::byte*>(p.raw_data().data()));
    }
    if (owner && bytes > 0) {
      // The parsed bytes become the tensor's storage when they have the alignment kernels may
      // assume (mimalloc gives large blocks 64-byte alignment; glibc does not): a 440 MB model
      // is then not copied a second time on its way into the graph.
      std::shared_ptr<std::string> raw(owner->release_raw_data());
      const void* data = raw->data();
      if (reinterpret_cast<uintptr_t>(data) % 64 == 0) {
        return Tensor::Borrow(*dtype, std::move(dims), data,
                              std::shared_ptr<const void>(raw, data));
      }
      return Tensor::FromBytes(*dtype, std::move(dims),
                               std::as_bytes(std::span(raw->data(), bytes)));
    }
    return Tensor::FromBytes(*dtype, std::move(dims),
                             std::as_bytes(std::span(p.raw_data().data(), bytes)));
  }

  // Check the typed field's count before allocating (a hostile shape must not allocate).
  if (*dtype == DataType::kFloat32) {
    KILN_RETURN_IF_ERROR(CheckCount(p, "float_data", p.float_data(), n));
  } else if (*dtype == DataType::kInt64) {
    KILN_RETURN_IF_ERROR(CheckCount(p, "int64_data", p.int64_data(), n));
  } else if (*dtype == DataType::kFloat64) {
    KILN_RETURN_IF_ERROR(CheckCount(p, "double_data", p.double_data(), n));
  } else if (*dtype == DataType::kUInt32 || *dtype == DataType::kUInt64) {
    KILN_RETURN_IF_ERROR(CheckCount(p, "uint64_data", p.uint64_data(), n));
  } else if (packed) {  // one packed byte per int32_data entry
    KILN_RETURN_IF_ERROR(
        CheckCount(p, "int32_data", p.int32_data(), static_cast<int64_t>(onnx_bytes)));
  } else {
    KILN_RETURN_IF_ERROR(CheckCount(p, "int32_data", p.int32_data(), n));
  }
  // int32_data holds 8- and 16-bit integers widened, one per element: a value outside the type's
  // range (a uint8 zero point of 300) would otherwise wrap silently into another number.
  if (auto range = NarrowIntegerRange(*dtype)) {
    for (int64_t i = 0; i < n; ++i) {
      const int32_t v = p.int32_data(static_cast<int>(i));
      if (v < range->first || v > range->second) {
        return MakeError(ErrorCode::kInvalidQuantization,
                         "tensor '{}' ({}) element {} is {}, outside the type's range [{}, {}]",
                         p.name(), ToString(*dtype), i, v, range->first, range->second);
      }
    }
  }
  if (packed) {
    // int32_data entries are little-endian: the packed byte is each entry's first byte.
    if (n == 0) return Tensor(*dtype, std::move(dims));
    return UnpackSubByte(*dtype, std::move(dims),
                         reinterpret_cast<const std::byte*>(p.int32_data().data()), 4);
  }
  Tensor t(*dtype, std::move(dims));
  if (n == 0) return t;
  switch (*dtype) {
    case DataType::kFloat32:
      std::memcpy(t.mutable_raw(), p.float_data().data(), bytes);
      break;
    case DataType::kInt64:
      std::memcpy(t.mutable_raw(), p.int64_data().data(), bytes);
      break;
    case DataType::kInt32:
      std::memcpy(t.mutable_raw(), p.int32_data().data(), bytes);
      break;
    case DataType::kFloat64:
      std::memcpy(t.mutable_raw(), p.double_data().data(), bytes);
      break;
    case DataType::kUInt64:
      std::memcpy(t.mutable_raw(), p.uint64_data().data(), bytes);
      break;
    case DataType::kUInt32: {
      auto* out = static_cast<uint32_t*>(t.mutable_raw());
      for (int64_t i = 0; i < n; ++i)
        out[i] = static_cast<uint32_t>(p.uint64_data(static_cast<int>(i)));
      break;
    }
    case DataType::kInt16:
    case DataType::kUInt16: {
      auto* out = static_cast<uint16_t*>(t.mutable_raw());
      for (int64_t i = 0; i < n; ++i)
        out[i] = static_cast<uint16_t>(p.int32_data(static_cast<int>(i)));
      break;
    }
    // Narrow types are widened to int32_data, one value per element (16-bit floats as bits).
    case DataType::kInt8:
    case DataType::kUInt8:
    case DataType::kBool:
    case DataType::kFloat16:
    case DataType::kBFloat16:
    case DataType::kFloat8E4M3FN:
    case DataType::kFloat8E4M3FNUZ:
    case DataType::kFloat8E5M2:
    case DataType::kFloat8E5M2FNUZ:
    case DataType::kFloat8E8M0: {
      auto* out = static_cast<std::byte*>(t.mutable_raw());
      for (int64_t i = 0; i < n; ++i) {
        int32_t v = p.int32_data(static_cast<int>(i));
        if (elem == 1) {
          uint8_t b = *dtype == DataType::kBool ? (v != 0) : static_cast<uint8_t>(v);
          std::memcpy(out + i, &b, 1);
        } else {
          uint16_t h = static_cast<uint16_t>(v);
          std::memcpy(out + 2 * i, &h, 2);
        }
      }
      break;
    }
    case DataType::kFloat4E2M1:  // packed: unpacked above
    case DataType::kInt4:
    case DataType::kUInt4:
    case DataType::kInt2:
    case DataType::kUInt2:
    case DataType::kUndefined:
      break;
  }
  return t;
}

}  // namespace

StatusOr<Tensor> TensorFromProto(const onnx::TensorProto& p, ExternalDataResolver* resolver) {
  return ConvertTensorProto(p, resolver, nullptr);
}

StatusOr<Tensor> TakeTensorFromProto(onnx::TensorProto* p, ExternalDataResolver* resolver) {
  return ConvertTensorProto(*p, resolver, p);
}

}  // namespace kiln::onnx_internal
