// Reading ONNX protobuf messages with kiln's limits, and telling a truncated file from one that
// is not an ONNX model at all (KILN-E2001 vs KILN-E2000).
#include <fcntl.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kiln/core/file_io.h"
#include "kiln/onnx/onnx_internal.h"

namespace kiln::onnx_internal {

namespace pb = google::protobuf;
using pb::internal::WireFormatLite;

namespace {

// A file descriptor closed on every path out.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// Regular files only, opened without blocking (a FIFO or device is KILN-E1009, not a hang).
StatusOr<std::pair<int, uint64_t>> OpenForRead(const std::string& path, std::string_view what) {
  KILN_ASSIGN_OR_RETURN(InputFile f, OpenInputFile(path, what));
  return std::make_pair(f.fd.release(), f.size);
}

// ModelProto's top-level fields and their wire types (onnx.proto), so that a file that happens
// to be valid protobuf but is some other message is not mistaken for a cut-short model.
bool IsModelField(int field, WireFormatLite::WireType type) {
  switch (field) {
    case 1:  // ir_version
    case 5:  // model_version
      return type == WireFormatLite::WIRETYPE_VARINT;
    case 2:
    case 3:
    case 4:
    case 6:   // producer_name/version, domain, doc_string
    case 7:   // graph
    case 8:   // opset_import
    case 14:  // metadata_props
    case 20:  // training_info
    case 25:  // functions
    case 26:  // configuration
      return type == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    default:
      return false;
  }
}

const char* ModelFieldName(int field) {
  switch (field) {
    case 1:
      return "ir_version";
    case 2:
      return "producer_name";
    case 3:
      return "producer_version";
    case 4:
      return "domain";
    case 5:
      return "model_version";
    case 6:
      return "doc_string";
    case 7:
      return "graph";
    case 8:
      return "opset_import";
    case 14:
      return "metadata_props";
    case 20:
      return "training_info";
    case 25:
      return "functions";
    default:
      return "unknown field";
  }
}

Status ParseFailure(const WireScanResult& scan, const std::string& what, uint64_t total) {
  switch (scan.kind) {
    case WireScan::kTruncated:
      return MakeError(ErrorCode::kModelTruncated,
                       "{} ends early: field {} ({}) at byte {} {}, but the file has only {} "
                       "bytes; the file was probably cut short (interrupted copy or download)",
                       what, scan.field, ModelFieldName(scan.field), scan.offset, scan.detail,
                       total);
    case WireScan::kCorrupt:
      return MakeError(ErrorCode::kModelNotProtobuf,
                       "{} is not an ONNX model: {} at byte {} (of {})", what, scan.detail,
                       scan.offset, total);
    case WireScan::kClean:
      break;
  }
  return MakeError(ErrorCode::kModelNotProtobuf,
                   "{} is not a valid ONNX protobuf: its top-level fields are intact but the "
                   "contents of one of them are corrupt (protobuf parse failed); the file may "
                   "be damaged or truncated inside",
                   what);
}

// Hands the file's bytes to protobuf unchanged and hashes each byte once as it goes by, so a
// caller that needs the model's content hash (the engine key) reads the file once, not twice.
// Protobuf may BackUp() over the tail of a buffer and be handed those bytes again; `hashed_`
// (the stream offset up to which bytes were hashed) keeps them from being hashed twice.
class HashingInputStream final : public pb::io::ZeroCopyInputStream {
 public:
  HashingInputStream(pb::io::ZeroCopyInputStream* inner, Hasher* hasher)
      : inner_(inner), hasher_(hasher) {}
  bool Next(const void** data, int* size) override {
    if (!inner_->Next(data, size)) return false;
    const int64_t start = inner_->ByteCount() - *size;
    const int64_t end = start + *size;
    if (end > hashed_) {
      const int64_t skip = hashed_ - start;  // >= 0: bytes are handed out in order
      hasher_->Update(std::span(static_cast<const std::byte*>(*data) + skip,
                                static_cast<size_t>(end - hashed_)));
      hashed_ = end;
    }
    return true;
  }
  void BackUp(int count) override { inner_->BackUp(count); }
  bool Skip(int count) override {
    const void* data = nullptr;
    int size = 0;
    while (count > 0) {  // every skipped byte is still hashed
      if (!Next(&data, &size)) return false;
      if (size > count) {
        BackUp(size - count);
        return true;
      }
      count -= size;
    }
    return true;
  }
  int64_t ByteCount() const override { return inner_->ByteCount(); }
  // Hashes what protobuf did not read (nothing, after a parse that consumed the message).
  bool Drain() {
    const void* data = nullptr;
    int size = 0;
    while (Next(&data, &size)) {
    }
    return inner_->ByteCount() == hashed_;
  }

 private:
  pb::io::ZeroCopyInputStream* inner_;
  Hasher* hasher_;
  int64_t hashed_ = 0;
};

// Read size per read(2): protobuf's default of 8 KiB makes 50,000 system calls for a 400 MB model.
constexpr int kFileBlockBytes = 256 << 10;

}  // namespace

void ConfigureCodedStream(pb::io::CodedInputStream& stream) {
  stream.SetTotalBytesLimit(kProtobufTotalBytesLimit);
}

WireScanResult ScanModelWire(pb::io::CodedInputStream& in, int64_t total) {
  WireScanResult r;
  for (;;) {
    r.offset = in.CurrentPosition();
    if (r.offset >= total) return r;  // clean end
    uint32_t tag = in.ReadTag();
    if (tag == 0) {
      r.kind = in.CurrentPosition() >= total ? WireScan::kTruncated : WireScan::kCorrupt;
      r.detail = r.kind == WireScan::kTruncated ? "has a tag cut short" : "invalid field tag 0";
      return r;
    }
    r.field = static_cast<int>(WireFormatLite::GetTagFieldNumber(tag));
    auto type = WireFormatLite::GetTagWireType(tag);
    if (!IsModelField(r.field, type)) {
      r.kind = WireScan::kCorrupt;
      r.detail = fmt::format("field number {} with wire type {} is not part of an ONNX model",
                             r.field, static_cast<int>(type));
      return r;
    }
    if (type == WireFormatLite::WIRETYPE_VARINT) {
      uint64_t v = 0;
      if (!in.ReadVarint64(&v)) {
        r.kind = in.CurrentPosition() >= total ? WireScan::kTruncated : WireScan::kCorrupt;
        r.detail = "holds a varint that is cut short";
        return r;
      }
    } else {
      uint32_t len = 0;
      if (!in.ReadVarint32(&len)) {
        r.kind = in.CurrentPosition() >= total ? WireScan::kTruncated : WireScan::kCorrupt;
        r.detail = "has a length that is cut short";
        return r;
      }
      int64_t start = in.CurrentPosition();
      if (start + static_cast<int64_t>(len) > total) {
        r.kind = WireScan::kTruncated;
        r.detail = fmt::format("needs {} bytes", len);
        return r;
      }
      if (!in.Skip(static_cast<int>(len))) {
        r.kind = WireScan::kTruncated;
        r.detail = fmt::format("needs {} bytes", len);
        return r;
      }
    }
  }
}

Status CheckModelShape(const onnx::ModelProto& model, const std::string& what) {
  if (!model.has_graph() && !model.has_ir_version()) {
    return MakeError(ErrorCode::kModelNotProtobuf,
                     "{} is not an ONNX model: it has neither an ir_version nor a graph", what);
  }
  if (!model.has_graph()) {
    return MakeError(ErrorCode::kModelTruncated,
                     "{} has an ONNX header (ir_version {}) but no graph; the file was probably "
                     "cut short before the graph",
                     what, model.ir_version());
  }
  // Not ModelTruncated: a model written without opset_import (by hand, by a converter) is the
  // common case; a copy cut exactly after the graph looks the same, so the message says both.
  if (model.opset_import_size() == 0 && model.ir_version() >= 3) {
    return MakeError(
        ErrorCode::kInvalidModel,
        "{} has no opset_import, which ONNX requires since IR version 3 (the model "
        "does not say which operator set its nodes follow); add one (e.g. "
        "model.opset_import.append(onnx.helper.make_opsetid('', 17))) or re-export the "
        "model; if it is a copy, check that it is complete (opset_import is stored "
        "after the graph)",
        what);
  }
  return OkStatus();
}

Status ParseModelFile(const std::string& path, onnx::ModelProto* model, uint64_t* file_bytes,
                      Hash128* file_hash) {
  KILN_ASSIGN_OR_RETURN(auto opened, OpenForRead(path, "model"));
  Fd fd(opened.first);
  uint64_t size = opened.second;
  if (file_bytes) *file_bytes = size;
  std::string what = fmt::format("'{}'", path);
  if (size == 0) {
    return MakeError(ErrorCode::kModelTruncated,
                     "{} is empty (0 bytes); the file was probably cut short or never written",
                     what);
  }
  if (size > static_cast<uint64_t>(kProtobufTotalBytesLimit)) {
    return MakeError(ErrorCode::kInvalidModel,
                     "{} is {} bytes, above protobuf's 2 GiB message limit; such a model must "
                     "keep its weights in external data (onnx.save_model(model, path, "
                     "save_as_external_data=True))",
                     what, size);
  }
  bool parsed = false;
  {
    pb::io::FileInputStream raw(fd.get(), kFileBlockBytes);
    Hasher hasher;
    HashingInputStream hashing(&raw, &hasher);
    pb::io::ZeroCopyInputStream* source = &raw;
    if (file_hash) source = &hashing;
    {
      pb::io::CodedInputStream coded(source);
      ConfigureCodedStream(coded);
      parsed = model->ParseFromCodedStream(&coded) && coded.ConsumedEntireMessage();
    }  // the CodedInputStream backs up what it buffered but did not read
    if (parsed && file_hash) {
      if (!hashing.Drain() || static_cast<uint64_t>(hashing.ByteCount()) != size) {
        return MakeError(ErrorCode::kIoError,
                         "{} changed while it was read ({} bytes read, {} when opened); "
                         "is another process writing it?",
                         what, hashing.ByteCount(), size);
      }
      *file_hash = hasher.Digest();
    }
  }
  if (!parsed) {
    if (::lseek(fd.get(), 0, SEEK_SET) != 0) {
      return MakeError(ErrorCode::kModelNotProtobuf, "{} is not a valid ONNX protobuf", what);
    }
    pb::io::FileInputStream raw(fd.get());
    pb::io::CodedInputStream coded(&raw);
    ConfigureCodedStream(coded);
    return ParseFailure(ScanModelWire(coded, static_cast<int64_t>(size)), what, size);
  }
  return CheckModelShape(*model, what);
}

Status ParseModelBytes(std::span<const std::byte> bytes, onnx::ModelProto* model) {
  std::string what = fmt::format("the model ({} bytes)", bytes.size());
  if (bytes.empty()) {
    return MakeError(ErrorCode::kModelTruncated, "the model is empty (0 bytes)");
  }
  if (bytes.size() > static_cast<size_t>(kProtobufTotalBytesLimit)) {
    return MakeError(ErrorCode::kInvalidModel,
                     "{} is above protobuf's 2 GiB message limit; keep the weights in external "
                     "data",
                     what);
  }
  auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  int size = static_cast<int>(bytes.size());
  bool parsed = false;
  {
    pb::io::CodedInputStream coded(data, size);
    ConfigureCodedStream(coded);
    parsed = model->ParseFromCodedStream(&coded) && coded.ConsumedEntireMessage();
  }
  if (!parsed) {
    pb::io::CodedInputStream coded(data, size);
    ConfigureCodedStream(coded);
    return ParseFailure(ScanModelWire(coded, size), what, bytes.size());
  }
  return CheckModelShape(*model, what);
}

Status ParseMessageFile(const std::string& path, google::protobuf::Message* msg) {
  KILN_ASSIGN_OR_RETURN(auto opened, OpenForRead(path, "tensor file"));
  Fd fd(opened.first);
  if (opened.second > static_cast<uint64_t>(kProtobufTotalBytesLimit)) {
    return MakeError(ErrorCode::kInvalidModel,
                     "'{}' is {} bytes, above protobuf's 2 GiB message limit", path, opened.second);
  }
  pb::io::FileInputStream raw(fd.get());
  pb::io::CodedInputStream coded(&raw);
  ConfigureCodedStream(coded);
  if (!msg->ParseFromCodedStream(&coded) || !coded.ConsumedEntireMessage()) {
    return MakeError(ErrorCode::kModelNotProtobuf,
                     "'{}' ({} bytes) is not a valid {} (protobuf parse failed; the file may be "
                     "truncated or of another kind)",
                     path, opened.second, msg->GetTypeName());
  }
  return OkStatus();
}

Status ParseTensorFile(const std::string& path, onnx::TensorProto* tensor) {
  return ParseMessageFile(path, tensor);
}

}  // namespace kiln::onnx_internal
