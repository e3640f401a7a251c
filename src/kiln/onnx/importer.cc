// ImportOnnxFile / ImportOnnxBytes: parse, check the opset, normalise op versions, reject
// unsupported ops all at once, then build the IR graph (initializers as constants, symbolic
// input dims, attributes) and verify it.
#include <fmt/ranges.h>

#include <filesystem>
#include <limits>
#include <unordered_set>

#include "kiln/core/logging.h"
#include "kiln/ir/weight_program.h"
#include "kiln/onnx/onnx_internal.h"
#include "kiln/ops/op_schema.h"

namespace kiln {

using namespace onnx_internal;  // NOLINT: this file is the layer's implementation

namespace {

std::string DtypeListEntry(const std::string& what, const std::string& name, int64_t type) {
  return fmt::format("{} '{}' ({})", what, name, OnnxDataTypeName(type));
}

class GraphBuilder {
 public:
  GraphBuilder(onnx::ModelProto& model, int64_t opset, std::string base_dir,
               const ImportOptions& options)
      : model_(model), opset_(opset), resolver_(std::move(base_dir)), options_(options) {}

  StatusOr<std::unique_ptr<Graph>> Build(std::vector<NormalizedNode>& nodes) {
    graph_ = std::make_unique<Graph>();
    onnx::GraphProto& g = *model_.mutable_graph();
    graph_->set_name(g.name());
    graph_->set_opset(opset_);
    KILN_RETURN_IF_ERROR(CheckElementTypes(g, nodes));
    KILN_RETURN_IF_ERROR(AddInitializers(&g));
    KILN_RETURN_IF_ERROR(AddInputs(g));
    for (NormalizedNode& nn : nodes) {
      KILN_RETURN_IF_ERROR_CTX(AddNode(nn.node), "while importing node '{}' ({})", nn.node.name(),
                               nn.node.op_type());
    }
    for (const auto& out : g.output()) {
      if (out.name().empty()) {
        return MakeError(ErrorCode::kInvalidModel, "a graph output has an empty name");
      }
      graph_->MarkOutput(Use(out.name()));
    }
    KILN_RETURN_IF_ERROR(SanityCheckDeclaredTypes(g));
    return std::move(graph_);
  }

 private:
  // Every tensor with an element type kiln lacks, listed in one error.
  Status CheckElementTypes(const onnx::GraphProto& g, const std::vector<NormalizedNode>& nodes) {
    std::vector<std::string> bad;
    for (const auto& t : g.initializer()) {
      if (!ToKilnDataType(t.data_type())) {
        bad.push_back(DtypeListEntry("initializer", t.name(), t.data_type()));
      }
    }
    std::unordered_set<std::string> init_names;
    for (const auto& t : g.initializer()) init_names.insert(t.name());
    for (const auto& in : g.input()) {
      if (init_names.count(in.name())) continue;
      if (!in.type().has_tensor_type()) {
        bad.push_back(
            fmt::format("input '{}' (not a tensor: sequence, map or optional)", in.name()));
      } else if (!ToKilnDataType(in.type().tensor_type().elem_type())) {
        bad.push_back(DtypeListEntry("input", in.name(), in.type().tensor_type().elem_type()));
      }
    }
    for (const auto& nn : nodes) {
      for (const auto& a : nn.node.attribute()) {
        if (a.has_t() && !ToKilnDataType(a.t().data_type()) && nn.node.op_type() == "Constant") {
          bad.push_back(DtypeListEntry("Constant node", nn.node.name(), a.t().data_type()));
        } else if (nn.node.op_type() == "Cast" && a.name() == "to" && !ToKilnDataType(a.i())) {
          bad.push_back(
              fmt::format("Cast node '{}' (to {})", nn.node.name(), OnnxDataTypeName(a.i())));
        } else if (nn.node.op_type() == "Constant" &&
                   (a.name() == "value_string" || a.name() == "value_strings")) {
          bad.push_back(fmt::format("Constant node '{}' (string)", nn.node.name()));
        }
      }
    }
    if (bad.empty()) return OkStatus();
    constexpr size_t kShown = 10;
    std::string more =
        bad.size() > kShown ? fmt::format("\n  ... and {} more", bad.size() - kShown) : "";
    if (bad.size() > kShown) bad.resize(kShown);
    return MakeError(ErrorCode::kUnsupportedDataType,
                     "{} tensor(s) have element types kiln does not support:\n  {}{}", bad.size(),
                     fmt::join(bad, "\n  "), more);
  }

  Status AddInitializers(onnx::GraphProto* g) {
    for (auto& t : *g->mutable_initializer()) {
      if (t.name().empty()) {
        return MakeError(ErrorCode::kInvalidModel, "an initializer has an empty name");
      }
      if (graph_->FindValue(t.name())) {
        return MakeError(ErrorCode::kInvalidModel, "initializer '{}' is defined twice", t.name());
      }
      // The tensor takes the proto's raw_data (its storage, or a copy made as the proto's is
      // freed), and the typed fields are freed below: a large model is never held twice.
      KILN_ASSIGN_OR_RETURN(Tensor tensor, TakeTensorFromProto(&t, &resolver_));
      Value* v = graph_->AddConstant(t.name(), std::move(tensor));
      v->set_provenance(InitializerExpr(t.name(), *v->constant()));  // what refit renews
      google::protobuf::RepeatedField<float>().Swap(t.mutable_float_data());
      google::protobuf::RepeatedField<int32_t>().Swap(t.mutable_int32_data());
      google::protobuf::RepeatedField<int64_t>().Swap(t.mutable_int64_data());
    }
    return OkStatus();
  }

  Status AddInputs(const onnx::GraphProto& g) {
    for (const auto& in : g.input()) {
      // IR < 4 lists initializers among the inputs too; they stay constants.
      if (Value* v = graph_->FindValue(in.name()); v && v->is_constant()) continue;
      if (in.name().empty()) {
        return MakeError(ErrorCode::kInvalidModel, "a graph input has an empty name");
      }
      if (graph_->FindValue(in.name())) {
        return MakeError(ErrorCode::kInvalidModel, "graph input '{}' is listed twice", in.name());
      }
      const auto& tt = in.type().tensor_type();
      DataType dtype = *ToKilnDataType(tt.elem_type());  // checked by CheckElementTypes
      if (!tt.has_shape()) {
        return MakeError(ErrorCode::kInvalidModel,
                         "graph input '{}' has no shape (unknown rank); kiln needs the rank of "
                         "every input: re-export with input shapes",
                         in.name());
      }
      Shape shape;
      for (int i = 0; i < tt.shape().dim_size(); ++i) {
        const auto& d = tt.shape().dim(i);
        if (d.has_dim_value() && d.dim_value() >= 0) {
          shape.push_back(Dim(d.dim_value()));
        } else if (d.has_dim_param() && !d.dim_param().empty()) {
          shape.push_back(Dim::Symbol(d.dim_param()));
        } else {
          shape.push_back(Dim::Symbol(fmt::format("{}_dim{}", in.name(), i)));
        }
      }
      graph_->AddInput(in.name(), dtype, std::move(shape));
    }
    return OkStatus();
  }

  Value* Use(const std::string& name) {
    if (Value* v = graph_->FindValue(name)) return v;
    return graph_->AddValue(name);  // defined later (or never: Verify reports it)
  }

  // A value a node (or Constant) defines; each name may be defined once.
  StatusOr<Value*> Define(const std::string& name, const std::string& node) {
    Value* v = graph_->FindValue(name);
    if (!v) return graph_->AddValue(name);
    if (v->is_graph_input() || v->is_constant() || v->producer()) {
      std::string by = v->producer()      ? fmt::format("node '{}'", v->producer()->name())
                       : v->is_constant() ? "an initializer or Constant"
                                          : "a graph input";
      return MakeError(ErrorCode::kInvalidModel,
                       "value '{}' is defined twice: by {} and by node '{}'", name, by, node);
    }
    return v;
  }

  StatusOr<Tensor> ConstantNodeValue(const onnx::NodeProto& n) {
    if (n.attribute_size() != 1) {
      return MakeError(ErrorCode::kInvalidAttribute,
                       "a Constant node needs exactly one value attribute, it has {}",
                       n.attribute_size());
    }
    const auto& a = n.attribute(0);
    if (a.name() == "value") {
      if (!a.has_t()) {
        return MakeError(ErrorCode::kInvalidAttribute, "attribute 'value' holds no tensor");
      }
      return TensorFromProto(a.t(), &resolver_);
    }
    if (a.name() == "value_float")
      return Tensor::FromVector<float>(DataType::kFloat32, {}, {a.f()});
    if (a.name() == "value_int") return Tensor::FromVector<int64_t>(DataType::kInt64, {}, {a.i()});
    if (a.name() == "value_floats") {
      std::vector<float> v(a.floats().begin(), a.floats().end());
      return Tensor::FromVector(DataType::kFloat32, {static_cast<int64_t>(v.size())}, v);
    }
    if (a.name() == "value_ints") {
      std::vector<int64_t> v(a.ints().begin(), a.ints().end());
      return Tensor::FromVector(DataType::kInt64, {static_cast<int64_t>(v.size())}, v);
    }
    return MakeError(ErrorCode::kInvalidAttribute,
                     "Constant attribute '{}' is not supported (kiln reads value, value_float(s) "
                     "and value_int(s))",
                     a.name());
  }

  StatusOr<Attribute> ConvertAttribute(const onnx::AttributeProto& a) {
    auto type = a.type();
    if (type == onnx::AttributeProto::UNDEFINED) {
      // Very old exporters leave the type out; infer it from the field that is set.
      if (a.has_i())
        type = onnx::AttributeProto::INT;
      else if (a.has_f())
        type = onnx::AttributeProto::FLOAT;
      else if (a.has_s())
        type = onnx::AttributeProto::STRING;
      else if (a.has_t())
        type = onnx::AttributeProto::TENSOR;
      else if (a.has_g())
        type = onnx::AttributeProto::GRAPH;
      else if (a.ints_size())
        type = onnx::AttributeProto::INTS;
      else if (a.floats_size())
        type = onnx::AttributeProto::FLOATS;
      else if (a.strings_size())
        type = onnx::AttributeProto::STRINGS;
    }
    switch (type) {
      case onnx::AttributeProto::INT:
        return Attribute(static_cast<int64_t>(a.i()));
      case onnx::AttributeProto::FLOAT:
        return Attribute(a.f());
      case onnx::AttributeProto::STRING:
        return Attribute(a.s());
      case onnx::AttributeProto::INTS:
        return Attribute(std::vector<int64_t>(a.ints().begin(), a.ints().end()));
      case onnx::AttributeProto::FLOATS:
        return Attribute(std::vector<float>(a.floats().begin(), a.floats().end()));
      case onnx::AttributeProto::STRINGS:
        return Attribute(std::vector<std::string>(a.strings().begin(), a.strings().end()));
      case onnx::AttributeProto::TENSOR: {
        KILN_ASSIGN_OR_RETURN(Tensor t, TensorFromProto(a.t(), &resolver_));
        return Attribute(std::move(t));
      }
      case onnx::AttributeProto::GRAPH:
      case onnx::AttributeProto::GRAPHS:
        return MakeError(ErrorCode::kInvalidAttribute,
                         "attribute '{}' holds a subgraph; kiln does not support control flow "
                         "(If, Loop, Scan)",
                         a.name());
      default:
        return MakeError(ErrorCode::kInvalidAttribute,
                         "attribute '{}' has ONNX attribute type {}, which kiln does not read "
                         "(sparse tensors, type protos)",
                         a.name(), static_cast<int>(type));
    }
  }

  Status AddNode(const onnx::NodeProto& n) {
    bool default_domain = n.domain().empty() || n.domain() == "ai.onnx";
    if (default_domain && n.op_type() == "Constant") {
      if (n.output_size() != 1 || n.output(0).empty()) {
        return MakeError(ErrorCode::kInvalidModel, "a Constant node needs exactly one output");
      }
      KILN_ASSIGN_OR_RETURN(Tensor t, ConstantNodeValue(n));
      KILN_ASSIGN_OR_RETURN(Value * v, Define(n.output(0), n.name()));
      v->set_constant(std::move(t));
      v->set_provenance(LiteralExpr(*v->constant()));  // part of the architecture, not a weight
      return OkStatus();
    }
    bool supported = default_domain && FindOpSchema(n.op_type()) != nullptr;
    std::vector<Value*> inputs;
    for (const auto& name : n.input()) inputs.push_back(name.empty() ? nullptr : Use(name));
    while (!inputs.empty() && inputs.back() == nullptr) inputs.pop_back();
    int num_outputs = n.output_size();
    while (num_outputs > 0 && n.output(num_outputs - 1).empty()) --num_outputs;
    std::vector<Value*> outputs;
    for (int i = 0; i < num_outputs; ++i) {
      if (n.output(i).empty()) {
        outputs.push_back(nullptr);
        continue;
      }
      KILN_ASSIGN_OR_RETURN(Value * v, Define(n.output(i), n.name()));
      outputs.push_back(v);
    }
    AttributeMap attrs;
    for (const auto& a : n.attribute()) {
      bool subgraph = a.type() == onnx::AttributeProto::GRAPH ||
                      a.type() == onnx::AttributeProto::GRAPHS || a.has_g();
      // An unsupported op (If, Loop, ...) is already reported as such; keep its node for
      // inspection without its subgraphs.
      if (subgraph && !supported) continue;
      auto converted = ConvertAttribute(a);
      if (!converted.ok()) {
        if (!supported && options_.allow_unsupported_ops) continue;
        return std::move(converted).status();
      }
      attrs.Set(a.name(), std::move(converted).value());
    }
    graph_->AddNode(n.op_type(), n.name(), std::move(inputs), std::move(outputs), std::move(attrs),
                    default_domain ? "" : n.domain());
    return OkStatus();
  }

  // value_info and output types are not trusted for inference (the ops rules recompute them),
  // but a declaration that contradicts a value kiln already knows means a broken model.
  Status SanityCheckDeclaredTypes(const onnx::GraphProto& g) {
    auto check = [&](const onnx::ValueInfoProto& vi, const char* where) -> Status {
      if (!vi.type().has_tensor_type()) return OkStatus();
      int32_t declared = vi.type().tensor_type().elem_type();
      if (declared == 0) return OkStatus();
      Value* v = graph_->FindValue(vi.name());
      if (!v || (!v->is_constant() && !v->is_graph_input())) return OkStatus();
      std::optional<DataType> t = ToKilnDataType(declared);
      if (!t || *t != v->dtype()) {
        return MakeError(ErrorCode::kTypeMismatch,
                         "{} declares '{}' as {}, but the value is {} ({})", where, vi.name(),
                         OnnxDataTypeName(declared), ToString(v->dtype()),
                         v->is_constant() ? "a constant" : "a graph input");
      }
      return OkStatus();
    };
    for (const auto& vi : g.value_info()) KILN_RETURN_IF_ERROR(check(vi, "value_info"));
    for (const auto& vi : g.output()) KILN_RETURN_IF_ERROR(check(vi, "the graph output list"));
    return OkStatus();
  }

  onnx::ModelProto& model_;
  int64_t opset_;
  ExternalDataResolver resolver_;
  const ImportOptions& options_;
  std::unique_ptr<Graph> graph_;
};

void FillMeta(const onnx::ModelProto& model, int64_t opset, uint64_t bytes, OnnxModelMeta* meta) {
  if (!meta) return;
  meta->ir_version = model.ir_version();
  meta->opset = opset;
  meta->opset_imports.clear();
  for (const auto& o : model.opset_import()) {
    meta->opset_imports[o.domain() == "ai.onnx" ? "" : o.domain()] = o.version();
  }
  meta->producer_name = model.producer_name();
  meta->producer_version = model.producer_version();
  meta->graph_name = model.graph().name();
  meta->file_bytes = bytes;
}

StatusOr<std::unique_ptr<Graph>> ImportParsed(onnx::ModelProto& model, uint64_t bytes,
                                              const std::string& base_dir,
                                              const ImportOptions& options, OnnxModelMeta* meta) {
  KILN_ASSIGN_OR_RETURN(int64_t opset, DefaultOpset(model));
  FillMeta(model, opset, bytes, meta);
  // Sequence and optional inputs and outputs are specialised into tensors (README.md,
  // "Sequences and optionals"); a build needs every sequence input's length.
  if (!options.allow_unsupported_ops) {
    KILN_RETURN_IF_ERROR(CheckSequenceInputs(model.graph(), options));
  }
  IoSpecialization io;
  io.options = &options;
  io.probe = options.allow_unsupported_ops;
  std::vector<NormalizedNode> nodes;
  KILN_RETURN_IF_ERROR(NormalizeNodes(model.mutable_graph(), opset, &nodes, &io));
  if (meta) {
    meta->inputs = std::move(io.inputs);
    meta->outputs = std::move(io.outputs);
  }
  KILN_ASSIGN_OR_RETURN(std::vector<OnnxUnsupportedOp> inner,
                        FindUnsupportedOpsInSubgraphs(nodes, opset));
  std::vector<OnnxUnsupportedOp> unsupported = FindUnsupportedOps(nodes, opset);
  // One KILN-E2004 lists them all, those inside If, Loop and Scan bodies too.
  MergeUnsupportedOps(std::move(inner), &unsupported);
  if (!unsupported.empty()) {
    if (!options.allow_unsupported_ops) return UnsupportedOpsError(unsupported);
    KILN_LOG(Debug, ONNX, "importing a graph with {} unsupported op type(s)", unsupported.size());
  }
  GraphBuilder builder(model, opset, base_dir, options);
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Graph> graph, builder.Build(nodes));
  if (options.verify) KILN_RETURN_IF_ERROR(Verify(*graph));
  return graph;
}

}  // namespace

StatusOr<std::unique_ptr<Graph>> ImportOnnxFile(const std::string& path,
                                                const ImportOptions& options, OnnxModelMeta* meta) {
  onnx::ModelProto model;
  uint64_t bytes = 0;
  Hash128 hash;
  KILN_RETURN_IF_ERROR(ParseModelFile(path, &model, &bytes, options.hash_file ? &hash : nullptr));
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string base_dir = parent.empty() ? std::string(".") : parent.string();
  auto graph = ImportParsed(model, bytes, base_dir, options, meta);
  if (!graph.ok()) return std::move(graph).status().AddContext(fmt::format("importing '{}'", path));
  if (meta) meta->file_hash = hash;
  return graph;
}

StatusOr<std::unique_ptr<Graph>> ImportOnnxBytes(std::span<const std::byte> bytes,
                                                 const std::string& base_dir,
                                                 const ImportOptions& options,
                                                 OnnxModelMeta* meta) {
  onnx::ModelProto model;
  KILN_RETURN_IF_ERROR(ParseModelBytes(bytes, &model));
  return ImportParsed(model, bytes.size(), base_dir, options, meta);
}

StatusOr<Tensor> LoadTensorProto(const std::string& path, std::string* name) {
  onnx::TensorProto proto;
  KILN_RETURN_IF_ERROR(ParseTensorFile(path, &proto));
  std::string dir = std::filesystem::path(path).parent_path().string();
  ExternalDataResolver resolver(dir.empty() ? "." : dir);
  auto tensor = TensorFromProto(proto, &resolver);
  if (!tensor.ok()) return std::move(tensor).status().AddContext(fmt::format("reading '{}'", path));
  if (name) *name = proto.name();
  return tensor;
}

const char* ToString(OnnxValueKind kind) {
  switch (kind) {
    case OnnxValueKind::kTensor:
      return "tensor";
    case OnnxValueKind::kSequence:
      return "sequence";
    case OnnxValueKind::kOptionalTensor:
      return "optional tensor";
    case OnnxValueKind::kOptionalSequence:
      return "optional sequence";
    case OnnxValueKind::kOther:
      break;
  }
  return "other (map, sparse tensor, nested sequence)";
}

StatusOr<OnnxSignature> ReadOnnxSignature(const std::string& path) {
  onnx::ModelProto model;
  uint64_t bytes = 0;
  KILN_RETURN_IF_ERROR(ParseModelFile(path, &model, &bytes));
  std::unordered_set<std::string> inits;
  for (const auto& t : model.graph().initializer()) inits.insert(t.name());
  OnnxSignature sig;
  for (const auto& in : model.graph().input()) {
    if (!inits.count(in.name())) sig.inputs.emplace_back(in.name(), KindOfType(in.type()));
  }
  for (const auto& out : model.graph().output()) {
    sig.outputs.emplace_back(out.name(), KindOfType(out.type()));
  }
  return sig;
}

namespace {

StatusOr<std::vector<Tensor>> SequenceTensors(const onnx::SequenceProto& seq,
                                              ExternalDataResolver* resolver) {
  if (seq.elem_type() != onnx::SequenceProto::TENSOR && seq.tensor_values_size() == 0 &&
      seq.elem_type() != onnx::SequenceProto::UNDEFINED) {
    return MakeError(ErrorCode::kUnsupportedDataType,
                     "sequence '{}' holds elements of type {} (kiln reads sequences of tensors)",
                     seq.name(), static_cast<int>(seq.elem_type()));
  }
  std::vector<Tensor> out;
  for (const auto& t : seq.tensor_values()) {
    KILN_ASSIGN_OR_RETURN(Tensor x, TensorFromProto(t, resolver));
    out.push_back(std::move(x));
  }
  return out;
}

}  // namespace

StatusOr<OnnxValue> LoadOnnxValue(const std::string& path, OnnxValueKind kind) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  ExternalDataResolver resolver(dir.empty() ? "." : dir);
  OnnxValue v;
  v.kind = kind;
  auto read = [&]() -> Status {
    switch (kind) {
      case OnnxValueKind::kTensor: {
        KILN_ASSIGN_OR_RETURN(v.tensor, LoadTensorProto(path));
        return OkStatus();
      }
      case OnnxValueKind::kSequence: {
        onnx::SequenceProto seq;
        KILN_RETURN_IF_ERROR(ParseMessageFile(path, &seq));
        KILN_ASSIGN_OR_RETURN(v.elements, SequenceTensors(seq, &resolver));
        return OkStatus();
      }
      case OnnxValueKind::kOptionalTensor:
      case OnnxValueKind::kOptionalSequence: {
        onnx::OptionalProto opt;
        KILN_RETURN_IF_ERROR(ParseMessageFile(path, &opt));
        if (opt.has_tensor_value()) {
          KILN_ASSIGN_OR_RETURN(v.tensor, TensorFromProto(opt.tensor_value(), &resolver));
          v.kind = OnnxValueKind::kOptionalTensor;
        } else if (opt.has_sequence_value()) {
          KILN_ASSIGN_OR_RETURN(v.elements, SequenceTensors(opt.sequence_value(), &resolver));
          v.kind = OnnxValueKind::kOptionalSequence;
        } else if (opt.elem_type() == onnx::OptionalProto::UNDEFINED ||
                   opt.elem_type() == onnx::OptionalProto::TENSOR ||
                   opt.elem_type() == onnx::OptionalProto::SEQUENCE) {
          v.present = false;
        } else {
          return MakeError(ErrorCode::kUnsupportedDataType,
                           "optional '{}' holds a value of type {} (kiln reads optional tensors "
                           "and sequences of tensors)",
                           opt.name(), static_cast<int>(opt.elem_type()));
        }
        return OkStatus();
      }
      case OnnxValueKind::kOther:
        break;
    }
    return MakeError(ErrorCode::kUnsupportedDataType,
                     "the value's declared type is not a tensor, a sequence of tensors or an "
                     "optional of those, which kiln does not read");
  };
  Status st = read();
  if (!st.ok()) return std::move(st).AddContext(fmt::format("reading '{}'", path));
  return v;
}

StatusOr<Tensor> LoadTensorProtoBytes(std::span<const std::byte> bytes, std::string* name) {
  onnx::TensorProto proto;
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return MakeError(ErrorCode::kModelNotProtobuf, "{} bytes are not a serialized onnx.TensorProto",
                     bytes.size());
  }
  // In-memory tensors have no directory for external data to live in.
  ExternalDataResolver resolver("");
  KILN_ASSIGN_OR_RETURN(Tensor tensor, TensorFromProto(proto, &resolver));
  if (name) *name = proto.name();
  return tensor;
}

}  // namespace kiln
