// InspectOnnxFile: what `kiln inspect model.onnx` shows. Reads the model and lists everything,
// unsupported ops included, without loading weights or failing on what kiln cannot build.
#include <set>

#include "kiln/ir/sizes.h"
#include "kiln/onnx/onnx_internal.h"

namespace kiln {

using namespace onnx_internal;  // NOLINT: this file is the layer's implementation

namespace {

OnnxTensorInfo DescribeValue(const onnx::ValueInfoProto& vi) {
  OnnxTensorInfo info;
  info.name = vi.name();
  // Sequences and optionals are described by their tensors: "sequence<f32>", "optional<f32>",
  // "optional<sequence<f32>>", with the element's shape.
  const onnx::TypeProto* t = &vi.type();
  std::string wrap_open, wrap_close;
  if (t->has_optional_type()) {
    wrap_open += "optional<";
    wrap_close += ">";
    t = &t->optional_type().elem_type();
  }
  if (t->has_sequence_type()) {
    wrap_open += "sequence<";
    wrap_close += ">";
    t = &t->sequence_type().elem_type();
  }
  if (!t->has_tensor_type()) {
    info.dtype = "non-tensor";
    return info;
  }
  const auto& tt = t->tensor_type();
  auto dtype = ToKilnDataType(tt.elem_type());
  info.dtype = wrap_open +
               (dtype ? std::string(ToString(*dtype)) : OnnxDataTypeName(tt.elem_type())) +
               wrap_close;
  info.has_shape = tt.has_shape();
  for (const auto& d : tt.shape().dim()) {
    if (d.has_dim_value() && d.dim_value() >= 0) {
      info.shape.push_back(std::to_string(d.dim_value()));
    } else if (d.has_dim_param() && !d.dim_param().empty()) {
      info.shape.push_back(d.dim_param());
    } else {
      info.shape.push_back("?");
    }
  }
  return info;
}

int64_t ElementsOf(const onnx::TensorProto& t) {
  std::vector<int64_t> dims(t.dims().begin(), t.dims().end());
  auto size = CheckedTensorSize(dims, DataType::kUndefined, ErrorCode::kTensorTooLarge, "");
  return size.ok() ? size->elements : 0;  // nonsense shape: count nothing (import refuses it)
}

}  // namespace

StatusOr<OnnxModelInfo> InspectOnnxFile(const std::string& path) {
  onnx::ModelProto model;
  uint64_t bytes = 0;
  KILN_RETURN_IF_ERROR(ParseModelFile(path, &model, &bytes));
  KILN_ASSIGN_OR_RETURN(int64_t opset, DefaultOpset(model));
  OnnxModelInfo info;
  info.meta.ir_version = model.ir_version();
  info.meta.opset = opset;
  for (const auto& o : model.opset_import()) {
    info.meta.opset_imports[o.domain() == "ai.onnx" ? "" : o.domain()] = o.version();
  }
  info.meta.producer_name = model.producer_name();
  info.meta.producer_version = model.producer_version();
  info.meta.graph_name = model.graph().name();
  info.meta.file_bytes = bytes;

  const onnx::GraphProto& g = model.graph();
  std::set<std::string> initializers;
  for (const auto& t : g.initializer()) {
    initializers.insert(t.name());
    int64_t n = ElementsOf(t);
    info.parameter_count += n;
    auto dtype = ToKilnDataType(t.data_type());
    info.parameter_bytes += dtype ? n * static_cast<int64_t>(SizeOf(*dtype)) : 0;
  }
  info.num_initializers = g.initializer_size();
  std::set<std::string> symbols;
  for (const auto& in : g.input()) {
    if (initializers.count(in.name())) continue;
    info.inputs.push_back(DescribeValue(in));
    for (const auto& d : in.type().tensor_type().shape().dim()) {
      if (!d.has_dim_value() && !d.dim_param().empty()) symbols.insert(d.dim_param());
    }
  }
  info.symbols.assign(symbols.begin(), symbols.end());
  for (const auto& out : g.output()) info.outputs.push_back(DescribeValue(out));
  for (const auto& n : g.node()) {
    bool custom = !n.domain().empty() && n.domain() != "ai.onnx";
    ++info.op_histogram[custom ? n.domain() + ":" + n.op_type() : n.op_type()];
  }
  info.num_nodes = g.node_size();

  // Inside the subgraphs of If, Loop and Scan nodes that could not be lowered (and any other
  // graph attribute): the ops there are what a build would meet once the outer op were
  // supported, so they are listed too, each node named with the path of the ops that hold it.
  // Lowered control flow has its bodies' nodes among `nodes` already.
  // Sequence inputs without a given length are probed at length 1: their ops are listed as
  // unsupported only when no length would let them lower (a run-time position, split, ...).
  IoSpecialization io;
  io.probe = true;
  std::vector<NormalizedNode> nodes;
  KILN_RETURN_IF_ERROR(NormalizeNodes(model.mutable_graph(), opset, &nodes, &io));
  KILN_ASSIGN_OR_RETURN(std::vector<OnnxUnsupportedOp> inner,
                        FindUnsupportedOpsInSubgraphs(nodes, opset));
  info.unsupported = FindUnsupportedOps(nodes, opset);
  MergeUnsupportedOps(std::move(inner), &info.unsupported);

  // The import a build runs, with unsupported ops kept: inspect must not call a model fine that
  // build then refuses (a cycle, an undefined value, missing external data).
  ImportOptions import;
  import.allow_unsupported_ops = true;
  auto imported = ImportOnnxFile(path, import);
  info.structure = imported.status();
  if (imported.ok() && info.unsupported.empty()) info.graph = std::move(*imported);
  return info;
}

}  // namespace kiln
