// The schema table built from ops.inc, arity checking and graph-wide shape inference.
#include "kiln/ops/op_schema.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "kiln/ir/sizes.h"
#include "kiln/ir/weight_program.h"

namespace kiln {

namespace {
constexpr OpSchema kSchemas[] = {
#define KILN_OP(name, min_in, max_in, min_out, max_out, latest) \
  {OpType::k##name, #name, min_in, max_in, min_out, max_out, latest, &Infer##name},
#include "kiln/ops/ops.inc"
#undef KILN_OP
};
}  // namespace

std::span<const OpSchema> AllOpSchemas() { return kSchemas; }

const OpSchema& GetOpSchema(OpType type) { return kSchemas[static_cast<size_t>(type)]; }

const OpSchema* FindOpSchema(std::string_view op_type) {
  static const auto* index = [] {
    auto* m = new std::unordered_map<std::string_view, const OpSchema*>();
    for (const OpSchema& s : kSchemas) (*m)[s.name] = &s;
    return m;
  }();
  auto it = index->find(op_type);
  return it == index->end() ? nullptr : it->second;
}

ValueInfo InfoOf(const Value& v) {
  ValueInfo vi;
  vi.dtype = v.dtype();
  vi.shape = v.shape();
  vi.constant = v.constant();
  vi.shape_input_values = v.shape_input_values();
  return vi;
}

Dim InferenceContext::DataDependentDim(size_t i, size_t index, Dim bound) {
  std::string symbol = DataDependentSymbol(node_.name(), i, index);
  Dim d = Dim::Symbol(symbol);
  outputs_[i].data_dependent.emplace_back(std::move(symbol), std::move(bound));
  return d;
}

Status BindDataDependentDims(const Node& node, std::span<ValueInfo> outputs,
                             const std::map<std::string, int64_t>& values,
                             std::map<std::string, int64_t>* bounds) {
  for (ValueInfo& out : outputs) {
    if (out.data_dependent.empty()) continue;
    std::map<std::string, int64_t> bind;
    for (const auto& [symbol, bound] : out.data_dependent) {
      if (!bound.is_static()) {
        return MakeError(ErrorCode::kDataDependentShape,
                         "node '{}' ({}): the bound {} of data-dependent dim '{}' is not concrete",
                         node.name(), node.op_type(), bound.ToString(), symbol);
      }
      auto it = values.find(symbol);
      bind[symbol] = it == values.end() ? bound.value() : std::min(it->second, bound.value());
      if (bounds) (*bounds)[symbol] = bound.value();
    }
    for (Dim& d : out.shape) d = d.Substitute(bind);
  }
  return OkStatus();
}

StatusOr<std::vector<ConcreteOutput>> InferNodeOnTensors(const Node& node,
                                                         std::span<const Tensor* const> inputs) {
  std::vector<ValueInfo> in_info(inputs.size());
  std::vector<const ValueInfo*> in_ptrs(inputs.size(), nullptr);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i]) continue;
    in_info[i].dtype = inputs[i]->dtype();
    in_info[i].shape = MakeShape(inputs[i]->dims());
    in_info[i].constant = inputs[i];
    in_ptrs[i] = &in_info[i];
  }
  return InferNodeOnOperands(node, in_ptrs);
}

StatusOr<std::vector<ConcreteOutput>> InferNodeOnOperands(
    const Node& node, std::span<const ValueInfo* const> inputs) {
  std::vector<ValueInfo> out_info(node.num_outputs());
  KILN_RETURN_IF_ERROR(InferNode(node, inputs, out_info));
  // Data-dependent outputs are allocated at their bounds and cut to what the kernel reports.
  KILN_RETURN_IF_ERROR(BindDataDependentDims(node, out_info, {}));
  std::vector<ConcreteOutput> outputs;
  for (ValueInfo& o : out_info) {
    auto dims = StaticDims(o.shape);
    if (!dims) {
      return MakeError(ErrorCode::kInternal, "node '{}': output shape {} is not concrete",
                       node.name(), ToString(o.shape));
    }
    outputs.push_back({o.dtype, std::move(o.shape), std::move(*dims)});
  }
  return outputs;
}

const Tensor* InferenceContext::input_constant(size_t i) const {
  if (!has_input(i)) return nullptr;
  const ValueInfo& v = *inputs_[i];
  if (v.constant) return v.constant;
  if (v.shape_input_values && i < 64) shape_values_read_ |= uint64_t{1} << i;
  return v.shape_input_values;
}

std::optional<std::vector<Dim>> InferenceContext::input_dims_value(size_t i) const {
  if (!has_input(i)) return std::nullopt;
  const ValueInfo& v = *inputs_[i];
  if (v.dims_value) {
    if (v.value_dependent && i < 64) shape_values_read_ |= uint64_t{1} << i;
    return v.dims_value;
  }
  // Only integer contents are dims: a float input's values (a shape input's too) are not read.
  const Tensor* c = IsFloatingPoint(v.dtype) ? nullptr : input_constant(i);
  if (c && (c->dtype() == DataType::kInt64 || c->dtype() == DataType::kInt32) &&
      c->dims().size() <= 1) {
    std::vector<Dim> out;
    for (int64_t x : c->ToInt64Vector()) out.push_back(x);
    return out;
  }
  // An integer vector of static length 0 has known contents whether or not it is a constant
  // (a graph input fed `axes = []`).
  if (IsInteger(v.dtype) && v.shape.size() == 1 && v.shape[0] == Dim(0)) {
    return std::vector<Dim>{};
  }
  return std::nullopt;
}

std::optional<std::vector<int64_t>> InferenceContext::input_ints(size_t i) const {
  if (!has_input(i) || IsFloatingPoint(inputs_[i]->dtype)) return std::nullopt;
  if (const Tensor* c = input_constant(i); c && IsInteger(c->dtype())) {
    return c->ToInt64Vector();
  }
  auto dims = input_dims_value(i);
  if (!dims) return std::nullopt;
  std::vector<int64_t> out;
  for (const Dim& d : *dims) {
    if (!d.is_static()) return std::nullopt;
    out.push_back(d.value());
  }
  return out;
}

namespace {
// Every shape kiln infers (import, build, the profile's max shapes, run time, constant folding)
// comes out of InferNode, so this is where an oversized or overflowed result (Dim arithmetic
// saturates) is stopped, before anything is planned, allocated or run.
Status CheckOutputSizes(const Node& node, std::span<const ValueInfo> outputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const ValueInfo& out = outputs[i];
    if (CheckShapeSize(out.shape, out.dtype, ErrorCode::kTensorTooLarge, "").ok()) continue;
    // The message is only formatted on the error path (this runs for every node, every time).
    const Value* v = i < node.num_outputs() ? node.output(i) : nullptr;
    // A negative dim is a rule's shape error (inputs that do not fit), not a size past limits.
    const bool negative = std::any_of(out.shape.begin(), out.shape.end(),
                                      [](const Dim& d) { return d.is_static() && d.value() < 0; });
    return CheckShapeSize(out.shape, out.dtype,
                          negative ? ErrorCode::kShapeMismatch : ErrorCode::kTensorTooLarge,
                          fmt::format("node '{}' ({}): output '{}'", node.name(), node.op_type(),
                                      v ? v->name() : fmt::format("#{}", i)));
  }
  return OkStatus();
}
}  // namespace

Status InferNode(const Node& node, std::span<const ValueInfo* const> inputs,
                 std::span<ValueInfo> outputs, uint64_t* shape_values_read) {
  const OpSchema* schema = FindOpSchema(node.op_type());
  if (!schema) {
    return MakeError(ErrorCode::kUnsupportedOps, "node '{}': op '{}' is not supported", node.name(),
                     node.op_type());
  }
  // Trailing omitted inputs do not count.
  int given = static_cast<int>(inputs.size());
  while (given > 0 && inputs[given - 1] == nullptr) --given;
  if (given < schema->min_inputs || given > schema->max_inputs) {
    return MakeError(ErrorCode::kInvalidModel,
                     "node '{}' ({}) has {} inputs; the op takes {} to {}", node.name(),
                     node.op_type(), given, schema->min_inputs, schema->max_inputs);
  }
  int outs = static_cast<int>(outputs.size());
  if (outs < schema->min_outputs || outs > schema->max_outputs) {
    return MakeError(ErrorCode::kInvalidModel,
                     "node '{}' ({}) has {} outputs; the op gives {} to {}", node.name(),
                     node.op_type(), outs, schema->min_outputs, schema->max_outputs);
  }
  for (int i = 0; i < schema->min_inputs; ++i) {
    if (!inputs[i]) {
      return MakeError(ErrorCode::kInvalidModel, "node '{}' ({}): required input {} is missing",
                       node.name(), node.op_type(), i);
    }
  }
  InferenceContext ctx(node, inputs, outputs);
  KILN_RETURN_IF_ERROR(schema->infer(ctx));
  if (shape_values_read) *shape_values_read = ctx.shape_values_read();
  // Whatever a node computes from a shape input's values holds for those values only.
  const bool dependent = std::any_of(inputs.begin(), inputs.end(), [](const ValueInfo* in) {
    return in && (in->value_dependent || in->shape_input_values);
  });
  if (dependent) {
    for (ValueInfo& out : outputs) out.value_dependent = true;
  }
  return CheckOutputSizes(node, outputs);
}

namespace {
// Outputs at most this many elements are folded at inference time (shape vectors, pads, slice
// bounds; never weights).
constexpr int64_t kMaxFoldedShapeElements = 4096;
// Floating-point outputs (scales computed from constants and shapes) up to this many elements.
constexpr int64_t kMaxFoldedFloatElements = 64;

// The known contents of a value for folding: its constant, or its dims-value when every element
// is static (rank 0 or 1, as dims-values are). Null when unknown.
const Tensor* KnownInput(const ValueInfo& vi, std::vector<Tensor>& storage) {
  if (vi.constant) return vi.constant;
  if (vi.value_dependent) return nullptr;  // known for the build's shape input values only
  if (!vi.dims_value || (vi.dtype != DataType::kInt64 && vi.dtype != DataType::kInt32)) {
    return nullptr;
  }
  if (vi.shape.size() > 1) return nullptr;
  std::vector<int64_t> values;
  for (const Dim& d : *vi.dims_value) {
    if (!d.is_static()) return nullptr;
    values.push_back(d.value());
  }
  std::vector<int64_t> dims;
  if (vi.shape.size() == 1) {
    dims.push_back(static_cast<int64_t>(values.size()));
    if (!(vi.shape[0] == Dim(dims[0]))) return nullptr;
  } else if (values.size() != 1) {
    return nullptr;
  }
  Tensor t = Tensor::FromVector<int64_t>(DataType::kInt64, dims, values);
  if (vi.dtype == DataType::kInt32) t = t.CastTo(DataType::kInt32);
  storage.push_back(std::move(t));
  return &storage.back();
}

// Whether a node with these inferred outputs and inputs is shape arithmetic worth folding.
bool FoldableShapeNode(const Node& node, std::span<const ValueInfo* const> ins,
                       std::span<const ValueInfo> outs) {
  if (outs.empty() || node.num_outputs() != outs.size()) return false;
  bool any_input = false;
  for (const ValueInfo* in : ins) {
    if (!in) continue;
    any_input = true;
    if (!in->constant && !in->dims_value) return false;
  }
  if (!any_input) return false;  // Constant, RandomNormal...: nothing to fold
  // A constant of more than one element made from the model's initializers is a weight (a
  // DequantizeLinear of an INT8 weight, a small convolution's kernel): a floating-point result
  // made from one is left to the passes that read such patterns (qdq_fusion). Constants from
  // shape arithmetic and ONNX Constant nodes are literals.
  bool reads_weights = false;
  for (size_t i = 0; i < node.num_inputs(); ++i) {
    const Value* v = node.input(i);
    if (!v || !v->is_constant() || v->constant()->num_elements() <= 1) continue;
    const WeightExprPtr& e = v->provenance();
    if (e && e->kind != WeightExpr::Kind::kLiteral) reads_weights = true;
  }
  for (const ValueInfo& out : outs) {
    auto dims = StaticDims(out.shape);
    if (!dims) return false;
    // Floating-point results too, when small and computed from shapes and scalars: a size
    // computed through a float scale (an image resized by min(800 / h, 1333 / w), then Floor and
    // Cast to int64), never weights.
    const bool exact = IsInteger(out.dtype) || out.dtype == DataType::kBool;
    if (!exact && reads_weights) return false;
    if (NumElements(*dims) > (exact ? kMaxFoldedShapeElements : kMaxFoldedFloatElements)) {
      return false;
    }
  }
  return true;
}

StatusOr<ShapeInferenceResult> InferShapesImpl(Graph& graph, const ShapeEvaluator* fold) {
  KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
  ShapeInferenceResult result;
  std::unordered_map<const Value*, ValueInfo> info;
  auto info_of = [&](Value* v) -> const ValueInfo* {
    if (!v) return nullptr;
    auto it = info.find(v);
    if (it != info.end()) return &it->second;
    return &info.emplace(v, InfoOf(*v)).first->second;
  };
  for (Node* node : order) {
    std::vector<const ValueInfo*> ins;
    for (Value* v : node->inputs()) ins.push_back(info_of(v));
    std::vector<ValueInfo> outs(node->num_outputs());
    uint64_t read = 0;
    KILN_RETURN_IF_ERROR(InferNode(*node, ins, outs, &read));
    node->clear_shape_dirty();
    for (size_t i = 0; read && i < node->num_inputs() && i < 64; ++i) {
      const Value* in = node->input(i);
      if ((read >> i & 1) && in && in->shape_input_values() &&
          std::find(result.shape_inputs_read.begin(), result.shape_inputs_read.end(), in) ==
              result.shape_inputs_read.end()) {
        result.shape_inputs_read.push_back(in);
      }
    }
    std::optional<std::vector<Tensor>> folded;
    // Provenance of folded outputs: literals when their dims-values were static, else the step.
    std::vector<WeightExprPtr> provenance;
    if (fold) {
      // Outputs whose dims-values are all static (Gather(Shape(x), 2) with a static dim 2) are
      // constants already, whatever the inputs.
      std::vector<Tensor> storage;
      storage.reserve(outs.size());
      for (const ValueInfo& out : outs) {
        if (!KnownInput(out, storage)) break;
      }
      if (!outs.empty() && storage.size() == outs.size()) folded = std::move(storage);
    }
    if (fold && !folded && FoldableShapeNode(*node, ins, outs)) {
      std::vector<Tensor> storage;
      storage.reserve(ins.size());
      std::vector<const Tensor*> known;
      bool all_known = true;
      for (const ValueInfo* in : ins) {
        const Tensor* t = in ? KnownInput(*in, storage) : nullptr;
        if (in && !t) all_known = false;
        known.push_back(t);
      }
      if (all_known) {
        // An op the evaluator lacks (or rejects) simply stays: not an error.
        auto evaluated = (*fold)(*node, known);
        bool fits = evaluated.ok() && evaluated->size() == outs.size();
        for (size_t i = 0; fits && i < outs.size(); ++i) {
          fits = (*evaluated)[i].dtype() == outs[i].dtype &&
                 StaticDims(outs[i].shape) == (*evaluated)[i].dims();
        }
        if (fits) {
          folded = std::move(*evaluated);
          provenance = FoldedNodeOutputs(*node, known, *folded);
        }
      }
    }
    std::vector<Value*> values = node->outputs();
    if (folded) graph.RemoveNode(node);
    for (size_t i = 0; i < outs.size(); ++i) {
      Value* v = values[i];
      if (!v) continue;
      v->set_dtype(outs[i].dtype);
      v->set_shape(outs[i].shape);
      if (folded) {
        v->set_constant(std::move((*folded)[i]));
        v->set_provenance(provenance.empty() ? LiteralExpr(*v->constant()) : provenance[i]);
        outs[i].constant = v->constant();
        outs[i].dims_value.reset();
      }
      v->set_value_dependent(outs[i].value_dependent);
      for (const auto& [symbol, bound] : outs[i].data_dependent) {
        graph.SetDataDependentBound(symbol, bound);
      }
      // Passes read dims-values as facts of the graph; these hold for one specialization only.
      if (outs[i].dims_value && !outs[i].value_dependent) {
        result.dims_values[v] = *outs[i].dims_value;
      }
      info[v] = std::move(outs[i]);
    }
  }
  return result;
}
}  // namespace

StatusOr<ShapeInferenceResult> InferShapes(Graph& graph) { return InferShapesImpl(graph, nullptr); }

StatusOr<ShapeInferenceResult> InferShapes(Graph& graph, const ShapeEvaluator& fold) {
  return InferShapesImpl(graph, &fold);
}

Status InferNewShapes(Graph& graph,
                      std::unordered_map<const Value*, std::vector<Dim>>& dims_values) {
  KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
  // Entries of values the graph no longer has go (their addresses may be reused by new values).
  // A sorted vector, not a hash set: this runs after every pass that changed the graph.
  std::vector<Value*> live = graph.values();
  std::sort(live.begin(), live.end());
  std::erase_if(dims_values, [&](const auto& e) {
    return !std::binary_search(live.begin(), live.end(), e.first);
  });
  std::unordered_set<const Value*> changed;
  std::vector<ValueInfo> in_infos;
  std::vector<const ValueInfo*> ins;
  for (Node* node : order) {
    bool needed = node->shape_dirty();
    for (Value* v : node->outputs()) {
      if (v && (!v->has_shape() || v->dtype() == DataType::kUndefined)) needed = true;
    }
    for (Value* v : node->inputs()) {
      if (v && changed.count(v)) needed = true;
    }
    if (!needed) continue;
    in_infos.assign(node->num_inputs(), ValueInfo());
    ins.assign(node->num_inputs(), nullptr);
    for (size_t i = 0; i < node->num_inputs(); ++i) {
      Value* v = node->input(i);
      if (!v) continue;
      ValueInfo& vi = in_infos[i];
      vi = InfoOf(*v);
      vi.value_dependent = v->value_dependent();
      if (auto it = dims_values.find(v); it != dims_values.end()) vi.dims_value = it->second;
      ins[i] = &vi;
    }
    std::vector<ValueInfo> outs(node->num_outputs());
    KILN_RETURN_IF_ERROR(InferNode(*node, ins, outs));
    node->clear_shape_dirty();
    for (size_t i = 0; i < outs.size(); ++i) {
      Value* v = node->output(i);
      if (!v) continue;
      v->set_value_dependent(outs[i].value_dependent);
      if (outs[i].value_dependent) outs[i].dims_value.reset();  // as InferShapes: not a fact
      for (const auto& [symbol, bound] : outs[i].data_dependent) {
        graph.SetDataDependentBound(symbol, bound);
      }
      auto old = dims_values.find(v);
      bool same =
          v->has_shape() && v->dtype() == outs[i].dtype && v->shape() == outs[i].shape &&
          (old == dims_values.end() ? !outs[i].dims_value
                                    : outs[i].dims_value && *outs[i].dims_value == old->second);
      if (same) continue;
      changed.insert(v);
      v->set_dtype(outs[i].dtype);
      v->set_shape(std::move(outs[i].shape));
      if (outs[i].dims_value) {
        dims_values[v] = std::move(*outs[i].dims_value);
      } else if (old != dims_values.end()) {
        dims_values.erase(old);
      }
    }
  }
  return OkStatus();
}

StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b) {
  size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const Dim* da = i < rank - a.size() ? nullptr : &a[i - (rank - a.size())];
    const Dim* db = i < rank - b.size() ? nullptr : &b[i - (rank - b.size())];
    if (!da) {
      out[i] = *db;
    } else if (!db) {
      out[i] = *da;
    } else if (*da == *db || *db == Dim(1)) {
      out[i] = *da;
    } else if (*da == Dim(1)) {
      out[i] = *db;
    } else if (da->is_static() && db->is_static()) {
      return MakeError(ErrorCode::kShapeMismatch, "shapes {} and {} do not broadcast", ToString(a),
                       ToString(b));
    } else {
      // Symbolic vs other: assume equal (the runtime checks concrete dims).
      out[i] = da->is_static() ? *da : *db;
    }
  }
  return out;
}

StatusOr<int64_t> NormalizeAxis(int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= std::max<int64_t>(rank, 1)) {
    return MakeError(ErrorCode::kInvalidAttribute, "axis {} is out of range for rank {}", axis,
                     rank);
  }
  return axis < 0 ? axis + rank : axis;
}

}  // namespace kiln
