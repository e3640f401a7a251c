// The ONNX importer: ONNX protobuf (file or bytes, with external data) -> kiln IR Graph, with
// older op versions rewritten into the one canonical form the ops layer implements.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "kiln/core/hash.h"
#include "kiln/core/status.h"
#include "kiln/ir/graph.h"
#include "kiln/ir/tensor.h"

namespace kiln {

// Model opsets (default domain) kiln imports. Below: KILN-E2012; above: KILN-E2003.
inline constexpr int64_t kMinOnnxOpset = 1;
inline constexpr int64_t kMaxOnnxOpset = 27;

// A sequence-typed graph input (or an optional one holding a sequence), specialised at build
// time: kiln's engines take tensors, so the sequence becomes `length` tensor inputs named
// `<input>.0` ... `<input>.<length-1>` (README.md, "Sequences and optionals").
struct SequenceInputSpec {
  int64_t length = 0;
  // The elements' rank when the model does not declare the element shape (-1: the model's).
  int element_rank = -1;
};

struct ImportOptions {
  // Run the IR verifier (cycles KILN-E2005, undefined values KILN-E2006) after the import.
  bool verify = true;
  // Keep nodes of unsupported ops in the graph instead of failing with KILN-E2004
  // (InspectOnnxFile uses this; such a graph cannot be built).
  bool allow_unsupported_ops = false;
  // ImportOnnxFile: hash the file's bytes (OnnxModelMeta::file_hash) in the same read that
  // parses them, for callers that key on the model's content (the builder's engine key).
  bool hash_file = false;
  // Sequence-typed graph inputs (and optional ones holding a sequence) by name: their length at
  // build time. A sequence input without an entry is KILN-E2017 naming it.
  std::map<std::string, SequenceInputSpec> sequence_inputs;
  // Optional-typed graph inputs specialised as absent (None): they are no engine input, and
  // OptionalHasElement of them is false. Optional inputs not listed are present.
  std::set<std::string> absent_inputs;
  // A Loop whose trip count or condition is computed at run time is unrolled to this many
  // iterations, each gated by the condition; a run that wants more fails with KILN-E5016
  // (never a truncated result). 0: such a Loop is reported unsupported (KILN-E2004).
  int64_t max_loop_trips = 16;
};

// What an ONNX graph input or output is.
enum class OnnxValueKind { kTensor, kSequence, kOptionalTensor, kOptionalSequence, kOther };
const char* ToString(OnnxValueKind kind);

// How one ONNX graph input or output maps onto the engine's tensors after the import's
// specialisation: a tensor is itself; a sequence of length N is `<name>.0` ... `<name>.N-1`;
// a present optional is its tensor (`<name>`) or its sequence's tensors; an absent one is none.
struct OnnxValueBinding {
  std::string name;
  OnnxValueKind kind = OnnxValueKind::kTensor;
  bool present = true;               // false: an absent optional
  std::vector<std::string> tensors;  // engine tensor names, a sequence's elements in order
};

// What the model says about itself.
struct OnnxModelMeta {
  int64_t ir_version = 0;
  int64_t opset = 0;                             // default (ai.onnx) domain
  std::map<std::string, int64_t> opset_imports;  // every domain, "" = ai.onnx
  std::string producer_name;
  std::string producer_version;
  std::string graph_name;
  uint64_t file_bytes = 0;  // size of the .onnx file or byte span
  Hash128 file_hash;        // HashBytes of the file, with ImportOptions::hash_file
  // The graph's inputs (initializers excluded) and outputs, in order, and their engine tensors.
  std::vector<OnnxValueBinding> inputs, outputs;
};

// The names and kinds of a model's graph inputs (initializers excluded) and outputs, read from
// their declared types (what a caller needs to read data for them: LoadOnnxValue).
struct OnnxSignature {
  std::vector<std::pair<std::string, OnnxValueKind>> inputs, outputs;
};
StatusOr<OnnxSignature> ReadOnnxSignature(const std::string& path);

// A value of a backend-test `input_N.pb` / `output_N.pb`: a TensorProto, SequenceProto (of
// tensors) or OptionalProto, read as `kind` says (the model's declared type of that input or
// output), never guessed from the bytes.
struct OnnxValue {
  OnnxValueKind kind = OnnxValueKind::kTensor;
  bool present = true;           // optionals: false when empty
  Tensor tensor;                 // a tensor, or a present optional tensor
  std::vector<Tensor> elements;  // a sequence, or a present optional sequence
};
StatusOr<OnnxValue> LoadOnnxValue(const std::string& path, OnnxValueKind kind);

// Imports a model file. External data is resolved relative to the file's directory and mapped,
// not copied, where alignment allows. Models larger than 2 GiB must keep their weights in
// external data (protobuf cannot hold a message above 2 GiB).
StatusOr<std::unique_ptr<Graph>> ImportOnnxFile(const std::string& path,
                                                const ImportOptions& options = {},
                                                OnnxModelMeta* meta = nullptr);
// Imports a model held in memory; external data is resolved relative to `base_dir` (empty: the
// model may not use external data).
StatusOr<std::unique_ptr<Graph>> ImportOnnxBytes(std::span<const std::byte> bytes,
                                                 const std::string& base_dir,
                                                 const ImportOptions& options = {},
                                                 OnnxModelMeta* meta = nullptr);

// Reads one serialized onnx.TensorProto (the backend-test layout's input_N.pb / output_N.pb).
// `name` receives the tensor's name when given.
StatusOr<Tensor> LoadTensorProto(const std::string& path, std::string* name = nullptr);
// The same from bytes in memory (no external data).
StatusOr<Tensor> LoadTensorProtoBytes(std::span<const std::byte> bytes,
                                      std::string* name = nullptr);

// ---- inspection (`kiln inspect model.onnx`) ----

struct OnnxTensorInfo {
  std::string name;
  std::string dtype;               // kiln's short name ("f32", "i64") or the ONNX name if kiln
                                   // lacks it ("float64")
  bool has_shape = false;          // false: rank unknown
  std::vector<std::string> shape;  // "1", "batch", "?" (unknown)
};

struct OnnxUnsupportedOp {
  std::string op_type;                  // "NonMaxSuppression", "com.microsoft:FusedGelu"
  std::string reason;                   // why (not implemented, version too new, ...)
  std::vector<std::string> node_names;  // every node of this type
};

struct OnnxModelInfo {
  OnnxModelMeta meta;
  std::vector<OnnxTensorInfo> inputs;  // initializers excluded
  std::vector<OnnxTensorInfo> outputs;
  std::map<std::string, int64_t> op_histogram;  // as in the file (before normalisation)
  int64_t num_nodes = 0;
  int64_t num_initializers = 0;
  int64_t parameter_count = 0;  // elements of all initializers (weights and buffers)
  int64_t parameter_bytes = 0;
  std::vector<std::string> symbols;            // dynamic dim names of the inputs, sorted
  std::vector<OnnxUnsupportedOp> unsupported;  // empty: every op is supported
  // The structural checks a build's import runs (cycles KILN-E2005, undefined values E2006,
  // external data E2002, ...), unsupported ops aside: not OK means `kiln build` refuses the
  // model even where every op is supported.
  Status structure;
  // The imported graph when `structure` is OK and every op is supported: what a build starts
  // from (`kiln inspect`'s kernel check takes it instead of importing the file again).
  std::unique_ptr<Graph> graph;
};

// Reads a model for inspection; fails only when the file itself is unreadable (KILN-E2000,
// E2001, E2003, E2010, ...), never because of unsupported ops (it lists them) or a malformed
// graph (`structure` says so).
StatusOr<OnnxModelInfo> InspectOnnxFile(const std::string& path);

}  // namespace kiln
