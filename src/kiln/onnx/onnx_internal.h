// Internals of the ONNX importer shared by its files and tests: protobuf reading with kiln's
// limits, TensorProto conversion, external data, op version history and normalisation.
// Only this layer and its tests include the ONNX protobuf headers.
#pragma once

#include <onnx/onnx-data_pb.h>
#include <onnx/onnx_pb.h>

#include <climits>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kiln/core/hash.h"
#include "kiln/core/status.h"
#include "kiln/ir/tensor.h"
#include "kiln/onnx/onnx_import.h"

namespace google::protobuf::io {
class CodedInputStream;
}

namespace kiln::onnx_internal {

// ---- reading protobuf (proto_io.cc) ----

// Protobuf refuses messages above its total-bytes limit; kiln raises it to the format's hard
// ceiling (INT_MAX, 2 GiB - 1) so that every model protobuf can represent is readable.
inline constexpr int kProtobufTotalBytesLimit = INT_MAX;
void ConfigureCodedStream(google::protobuf::io::CodedInputStream& stream);

// Parses a model, streaming from the file descriptor (no full copy in memory). Failures are
// classified: not protobuf / not ONNX (KILN-E2000), cut short (KILN-E2001), too large (E2010).
// `file_hash`, when given, receives HashBytes of the whole file, computed in the same read.
Status ParseModelFile(const std::string& path, onnx::ModelProto* model, uint64_t* file_bytes,
                      Hash128* file_hash = nullptr);
Status ParseModelBytes(std::span<const std::byte> bytes, onnx::ModelProto* model);
// Checks that a parsed message is an ONNX model (graph, ir_version, opset_import).
Status CheckModelShape(const onnx::ModelProto& model, const std::string& what);
Status ParseTensorFile(const std::string& path, onnx::TensorProto* tensor);
// The same for any message (SequenceProto, OptionalProto of the backend-test data).
Status ParseMessageFile(const std::string& path, google::protobuf::Message* msg);

// How a failed parse looks when the top-level fields are walked one by one.
enum class WireScan { kClean, kTruncated, kCorrupt };
struct WireScanResult {
  WireScan kind = WireScan::kClean;
  int64_t offset = 0;  // where the walk stopped
  int field = 0;       // field number being read there
  std::string detail;  // for the message
};
// Walks the top-level fields of a ModelProto in `stream` without parsing their contents.
WireScanResult ScanModelWire(google::protobuf::io::CodedInputStream& stream, int64_t total_bytes);

// ---- tensors (tensor_proto.cc) ----

// ONNX TensorProto.DataType number -> kiln DataType (nullopt for types kiln lacks).
// Forwards to the ops layer's DataTypeFromOnnx (kiln/ops/onnx_dtype.h), the one mapping.
std::optional<DataType> ToKilnDataType(int64_t onnx_type);
// "float32", "float64", "string", ... ("type 99" for unknown numbers).
std::string OnnxDataTypeName(int64_t onnx_type);

// Maps external data files (once each) and hands out checked byte ranges of them.
class ExternalDataResolver {
 public:
  // `base_dir` empty: external data is an error (the caller has no directory to look in).
  explicit ExternalDataResolver(std::string base_dir);
  ExternalDataResolver(const ExternalDataResolver&) = delete;
  ExternalDataResolver& operator=(const ExternalDataResolver&) = delete;

  // The bytes of `tensor` (data_location = EXTERNAL) and the mapping that keeps them alive.
  struct Range {
    const std::byte* data = nullptr;
    size_t size = 0;
    std::shared_ptr<const void> keepalive;
  };
  StatusOr<Range> Resolve(const onnx::TensorProto& tensor, size_t expected_bytes);

  // Checks `location` (lexically, and through symlinks when the file exists) stays inside
  // base_dir; returns the full path.
  StatusOr<std::string> CheckedPath(const std::string& tensor_name, const std::string& location);

 private:
  std::string base_dir_;
  struct Mapping {
    std::shared_ptr<const void> keepalive;
    const std::byte* data = nullptr;
    size_t size = 0;
  };
  std::unordered_map<std::string, Mapping> files_;
};

// Converts a TensorProto (typed fields, raw_data or external data) into a kiln Tensor. Sizes are
// checked before anything is allocated. `resolver` may be null when external data is not allowed.
StatusOr<Tensor> TensorFromProto(const onnx::TensorProto& proto, ExternalDataResolver* resolver);
// The same, leaving `proto` without its raw_data: the parsed bytes are the tensor's storage
// when they are 64-byte aligned (copied otherwise).
StatusOr<Tensor> TakeTensorFromProto(onnx::TensorProto* proto, ExternalDataResolver* resolver);

// ---- op versions (op_versions.cc) ----

// The version of `op_type` (ai.onnx) in effect at `opset`: the newest since_version <= opset at
// which the op's interface (attributes, inputs, outputs) changed; versions that only added
// element types do not count (gen_op_versions.py). 0 when ONNX does not define the op at that
// opset (or at all).
int EffectiveOpVersion(std::string_view op_type, int64_t opset);
bool IsOnnxOp(std::string_view op_type);

// ---- normalisation (normalize.cc) ----

struct NormalizedNode {
  onnx::NodeProto node;  // canonical form; name unique in the graph
  int version = 0;       // ai.onnx version whose semantics the node now has (0: unknown op)
  std::string origin;    // original node's name when this node was added by a rewrite
  // Why an op that kiln expands at import (ONNX's Attention, RotaryEmbedding) could not be
  // expanded here (the node is kept as it is); FindUnsupportedOps reports it. Empty otherwise.
  std::string unsupported;
};

// The kind of a declared type: tensor, sequence of tensors, optional tensor or sequence.
OnnxValueKind KindOfType(const onnx::TypeProto& t);

// Sequence- and optional-typed graph inputs and outputs specialised into tensors (README.md,
// "Sequences and optionals"): the graph's input and output lists are rewritten in place.
struct IoSpecialization {
  const ImportOptions* options = nullptr;  // lengths, absent optionals (null: none given)
  // kiln inspect: a sequence input without a given length is taken as length 1, to report
  // which of its ops lower once a length is given.
  bool probe = false;
  std::vector<OnnxValueBinding> inputs, outputs;  // filled: what each became
};
// Checks that every sequence-typed input of `graph` has a length in `options` (KILN-E2017
// naming those that lack one, and how to give it).
Status CheckSequenceInputs(const onnx::GraphProto& graph, const ImportOptions& options);

// Rewrites older op versions into the canonical forms (README.md lists them) and gives every
// node a unique name. Consumes the graph's nodes (they are moved out). `io`: sequence and
// optional graph inputs/outputs are specialised (without it they stay, unknown to the lowering).
Status NormalizeNodes(onnx::GraphProto* graph, int64_t opset, std::vector<NormalizedNode>* out,
                      IoSpecialization* io = nullptr);

// The unsupported ops among normalised nodes, grouped by type, in first-seen order.
std::vector<OnnxUnsupportedOp> FindUnsupportedOps(const std::vector<NormalizedNode>& nodes,
                                                  int64_t opset);
// The unsupported ops inside the subgraphs of normalised nodes that kept them (If, Loop and
// Scan nodes that could not be lowered, any other graph attribute), depth first; each node is
// named with the path of the ops that hold it ("nms (in If 'maybe'.then_branch)"). Lowered
// control flow is gone from `nodes`: its bodies' nodes were normalised in place.
StatusOr<std::vector<OnnxUnsupportedOp>> FindUnsupportedOpsInSubgraphs(
    const std::vector<NormalizedNode>& nodes, int64_t opset);
// Adds `more` to `into`: node names join an entry of the same op type, new types go last.
void MergeUnsupportedOps(std::vector<OnnxUnsupportedOp> more, std::vector<OnnxUnsupportedOp>* into);
// The KILN-E2004 error listing them all.
Status UnsupportedOpsError(const std::vector<OnnxUnsupportedOp>& unsupported);

// ---- expansions of ONNX ops into kiln's primitive ops (expand_attention.cc) ----

// ONNX's Attention (23, 24) and RotaryEmbedding (23) share their names with kiln-internal fusion
// ops of other semantics. The importer expands them into primitive ops (MatMul, Softmax,
// Reshape, ...) that the graph passes fuse back where the pattern is the plain one. An expansion
// needs facts only the normaliser has; it provides them through this interface.
class ExpansionHost {
 public:
  virtual ~ExpansionHost() = default;
  // The ONNX element type of a value when declared (graph input, initializer, value_info,
  // Constant, or an expansion's output); 0 when unknown.
  virtual int32_t ElemType(const std::string& value) const = 0;
  // The value's dims when its rank is declared; -1 for a dim without a value.
  virtual std::optional<std::vector<int64_t>> Dims(const std::string& value) const = 0;
  // Records what an expansion knows of one of its outputs.
  virtual void Declare(const std::string& value, int32_t elem_type, size_t rank) = 0;
  virtual std::string FreshValueName(const std::string& hint) = 0;
  virtual std::string FreshNodeName(const std::string& hint) = 0;
  // Appends a node in canonical form (after the nodes emitted before it).
  virtual void Emit(NormalizedNode node) = 0;
  virtual int64_t opset() const = 0;
};

// Expand `n` (Attention of `version` 23 or 24, or RotaryEmbedding-23) through `host`. The result
// is empty when the node was expanded, or the reason it was not (nothing emitted; the caller
// reports the node unsupported). An error: the node is invalid (a 3-D Attention without head
// counts, heads that do not divide, ...).
StatusOr<std::string> ExpandAttention(const onnx::NodeProto& n, int version, ExpansionHost& host);
StatusOr<std::string> ExpandRotaryEmbedding(const onnx::NodeProto& n, ExpansionHost& host);
// ONNX opset-27 ops defined by function bodies (expand_ops27.cc), the same contract.
StatusOr<std::string> ExpandCausalConvWithState(const onnx::NodeProto& n, ExpansionHost& host);
StatusOr<std::string> ExpandLinearAttention(const onnx::NodeProto& n, ExpansionHost& host);

// ---- control flow lowered at import (lower_control_flow.cc) ----

// kiln has no run-time control flow: If, Loop and Scan are lowered into the enclosing graph when
// their shape is static (Scan over a known length, Loop with a constant trip count and a
// condition that folds, If on a constant condition, or on a run-time one whose branches give
// outputs of one shape and type: both branches + Where). The lowering needs the normaliser's
// static facts (constant values, declared or propagated dims) and feeds the inlined body nodes
// back through it (version rewrites, expansions, nested control flow).
class LoweringHost : public ExpansionHost {
 public:
  // The values of a small integer or boolean tensor known at import (an initializer, a Constant,
  // or a node folded from such values: shapes of static dims, comparisons, casts, ...), flat.
  virtual std::optional<std::vector<int64_t>> IntValues(const std::string& value) const = 0;
  // Records the declared element type and dims (-1: unknown) of a value nothing else describes.
  virtual void DeclareDims(const std::string& value, int32_t elem_type,
                           const std::vector<int64_t>& dims) = 0;
  // Normalises one node of a subgraph being inlined (its op at the model's opset), as if it
  // were a node of the graph: rewrites, expansions, control flow, facts.
  virtual Status EmitRaw(onnx::NodeProto node) = 0;
  // Nodes inlined so far by lowering (unrolled bodies), against kMaxInlinedNodes.
  virtual int64_t& inlined_nodes() = 0;
  // ImportOptions::max_loop_trips: the iterations a Loop with a run-time trip count or
  // condition is unrolled to.
  virtual int64_t max_loop_trips() const = 0;
  // How many nodes have been emitted; DropEmittedAfter(mark) takes back those emitted since
  // (a lowering that starts over another way).
  virtual size_t EmittedCount() const = 0;
  virtual void DropEmittedAfter(size_t mark) = 0;

  // Sequences and optionals exist only at import: a sequence is the list of its elements'
  // tensor values, an optional is absent or names the value it holds (a tensor or a sequence).
  // Null when `value` is no known sequence / optional.
  virtual const std::vector<std::string>* SequenceElements(const std::string& value) const = 0;
  virtual void DefineSequence(const std::string& value, std::vector<std::string> elements) = 0;
  virtual const std::optional<std::string>* OptionalContents(const std::string& value) const = 0;
  virtual void DefineOptional(const std::string& value, std::optional<std::string> contents) = 0;
  // Why `value` (a sequence or optional whose producer could not be lowered, or a graph input
  // without a length) is not known at import; empty when nothing is recorded.
  virtual std::string UnknownComposite(const std::string& value) const = 0;
};

// The most nodes that unrolling and inlining may add to one model.
inline constexpr int64_t kMaxInlinedNodes = 200000;
// The most inputs of one Concat (ops.inc); longer stacks are concatenated in groups.
inline constexpr size_t kMaxConcatInputs = 1024;

// Lowers an If, Loop or Scan node (`version` is its op version). Empty: lowered; otherwise the
// reason it cannot be (the caller drops whatever was emitted and reports the node in
// KILN-E2004). An error: the node is malformed.
StatusOr<std::string> LowerControlFlow(const onnx::NodeProto& n, int version, LoweringHost& host);
bool IsControlFlowOp(const onnx::NodeProto& n);
// The sequence and optional ops (SequenceConstruct, ..., SequenceMap, Optional, ...), lowered
// at import by LowerControlFlow into the values they hold (the same contract).
bool IsSequenceOrOptionalOp(const onnx::NodeProto& n);
// ai.onnx.preview's FlexAttention: attention with its score_mod and prob_mod subgraphs inlined
// (the same contract as LowerControlFlow).
StatusOr<std::string> ExpandFlexAttention(const onnx::NodeProto& n, LoweringHost& host);

// Opset of the default domain; KILN-E2003 / E2012 when out of range; 0 when the model imports
// only other domains.
StatusOr<int64_t> DefaultOpset(const onnx::ModelProto& model);

}  // namespace kiln::onnx_internal
