// Operator schemas and shape/type inference over symbolic dims. One rule per op (ops.inc); the
// same rule runs at build time (dims may be symbolic) and at run time (dims are integers).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/ir/graph.h"

namespace kiln {

enum class OpType : uint16_t {
#define KILN_OP(name, ...) k##name,
#include "kiln/ops/ops.inc"
#undef KILN_OP
  kNumOps,
};

// What inference knows about one value.
struct ValueInfo {
  DataType dtype = DataType::kUndefined;
  Shape shape;
  // The value's contents when it is a constant (weights, folded tensors).
  const Tensor* constant = nullptr;
  // The value's contents when it is a small integer tensor whose elements are known as dims
  // (the output of Shape and of arithmetic on it). Rank 0 or 1.
  std::optional<std::vector<Dim>> dims_value;
  // A shape input's values (Value::shape_input_values): rules read them like a constant's, but
  // they hold for one specialization only, so nothing folds them.
  const Tensor* shape_input_values = nullptr;
  // The shape, dims-value or contents follow from a shape input's values (InferNode sets it on
  // every output of a node with such an input).
  bool value_dependent = false;
  // Data-dependent dims of this output (ops whose output dims follow from input VALUES: NonZero,
  // Unique, Compress, NonMaxSuppression): each symbol (DataDependentSymbol) and an upper bound
  // over the inputs' dims. Set by the rule through InferenceContext::DataDependentDim.
  std::vector<std::pair<std::string, Dim>> data_dependent;
};

// What inference knows of `v` before its producer is inferred: dtype, shape, constant and shape
// input values (the starting point of every inference sweep).
ValueInfo InfoOf(const Value& v);

class InferenceContext {
 public:
  InferenceContext(const Node& node, std::span<const ValueInfo* const> inputs,
                   std::span<ValueInfo> outputs)
      : node_(node), inputs_(inputs), outputs_(outputs) {}

  const Node& node() const { return node_; }
  const AttributeMap& attrs() const { return node_.attrs(); }
  size_t num_inputs() const { return inputs_.size(); }
  size_t num_outputs() const { return outputs_.size(); }
  bool has_input(size_t i) const { return i < inputs_.size() && inputs_[i] != nullptr; }
  const ValueInfo& input(size_t i) const { return *inputs_[i]; }
  DataType input_type(size_t i) const { return inputs_[i]->dtype; }
  const Shape& input_shape(size_t i) const { return inputs_[i]->shape; }
  // The contents of input i when known at inference: a constant or a shape input's values (the
  // latter recorded in shape_values_read()).
  const Tensor* input_constant(size_t i) const;
  // The elements of input i as dims when known (a constant integer tensor or a propagated shape
  // value); nullopt otherwise.
  std::optional<std::vector<Dim>> input_dims_value(size_t i) const;
  // Like input_dims_value but every element must be static; nullopt otherwise.
  std::optional<std::vector<int64_t>> input_ints(size_t i) const;

  ValueInfo& output(size_t i) { return outputs_[i]; }
  void set_output(size_t i, DataType dtype, Shape shape) {
    outputs_[i].dtype = dtype;
    outputs_[i].shape = std::move(shape);
  }
  void set_output_dims_value(size_t i, std::vector<Dim> value) {
    outputs_[i].dims_value = std::move(value);
  }
  // A dim of output i (its dim `index`) that the kernel reports at run time, at most `bound`:
  // a data-dependent symbol (docs/architecture.md, "Data-dependent shapes").
  Dim DataDependentDim(size_t i, size_t index, Dim bound);

  // Bit i: the rule read input i's shape input values (directly or as a dims-value), i.e. the
  // input feeds a shape operand. Inputs past 63 are not recorded.
  uint64_t shape_values_read() const { return shape_values_read_; }

  // An error that names the node: "node 'conv1' (Conv): <message>".
  template <typename... Args>
  Status Error(ErrorCode code, fmt::format_string<Args...> format, Args&&... args) const {
    return Status(code, fmt::format("node '{}' ({}): {}", node_.name(), node_.op_type(),
                                    fmt::format(format, std::forward<Args>(args)...)));
  }

 private:
  const Node& node_;
  std::span<const ValueInfo* const> inputs_;
  std::span<ValueInfo> outputs_;
  mutable uint64_t shape_values_read_ = 0;
};

using InferFn = Status (*)(InferenceContext&);

struct OpSchema {
  OpType type;
  std::string_view name;
  int min_inputs, max_inputs, min_outputs, max_outputs;
  int latest_opset;
  InferFn infer;
};

// nullptr for an op kiln does not support.
const OpSchema* FindOpSchema(std::string_view op_type);
const OpSchema& GetOpSchema(OpType type);
std::span<const OpSchema> AllOpSchemas();

// Applies one node's rule (checks arity first). Outputs are value_dependent when an input is
// (or is a shape input). `shape_values_read`, when given, receives the rule's
// InferenceContext::shape_values_read().
Status InferNode(const Node& node, std::span<const ValueInfo* const> inputs,
                 std::span<ValueInfo> outputs, uint64_t* shape_values_read = nullptr);

// Infers dtypes and shapes of every value in topological order and stores them on the values
// (and the known dims-values in the returned table). Errors name the node.
struct ShapeInferenceResult {
  std::unordered_map<const Value*, std::vector<Dim>> dims_values;
  // Graph inputs with shape_input_values whose values some rule read (they feed a shape
  // operand), in first-read order.
  std::vector<const Value*> shape_inputs_read;
};
StatusOr<ShapeInferenceResult> InferShapes(Graph& graph);

// Evaluates one node on host tensors (the builder passes kiln::cpu::EvaluateNode).
using ShapeEvaluator =
    std::function<StatusOr<std::vector<Tensor>>(const Node&, std::span<const Tensor* const>)>;

// InferShapes that also folds shape arithmetic as it goes: a node whose inputs are all known
// (constants, or dims-values with every element static) and whose outputs are small integer
// tensors with static shapes is evaluated with `fold`, removed, and its outputs become constants.
// Rules further down (Pad's pads, Slice's starts, Reshape's shape) then see values that
// dims-values alone do not carry: multi-dimensional ones (a Reshape to [-1, 2], a Transpose) and
// ones through ops without a dims-value rule (Mod, Where, Min). A node `fold` cannot evaluate
// stays as it is.
StatusOr<ShapeInferenceResult> InferShapes(Graph& graph, const ShapeEvaluator& fold);

// Incremental shape inference after a rewrite: infers, in topological order, only the nodes
// marked shape_dirty() (added, re-wired, attributes or op type changed, an input constant
// replaced) or with an output that has no shape or dtype yet, and the consumers of every value
// whose dtype, shape or dims-value changed as a result. `dims_values` (from an earlier
// InferShapes) is updated in place and loses the entries of values no longer in the graph.
// Gives what InferShapes would, for the cost of the rewritten part.
Status InferNewShapes(Graph& graph,
                      std::unordered_map<const Value*, std::vector<Dim>>& dims_values);

// Concrete inference (the builder's profile shapes, the runtime, the CPU evaluator): every
// data-dependent dim of `outputs` (ValueInfo::data_dependent) becomes `values`' entry for its
// symbol when there is one (clamped to the bound), else its bound; the bound must be static here
// (KILN-E2011 otherwise). `bounds`, when given, receives each symbol's bound.
Status BindDataDependentDims(const Node& node, std::span<ValueInfo> outputs,
                             const std::map<std::string, int64_t>& values,
                             std::map<std::string, int64_t>* bounds = nullptr);

// One node on host tensors, as the reference evaluators see it (every input's values known): the
// outputs' dtypes and concrete dims, data-dependent ones at their bounds. KILN-E5000-class
// internal error when a shape is still not concrete.
struct ConcreteOutput {
  DataType dtype = DataType::kUndefined;
  Shape shape;
  std::vector<int64_t> dims;
};
StatusOr<std::vector<ConcreteOutput>> InferNodeOnTensors(const Node& node,
                                                         std::span<const Tensor* const> inputs);
// The same where some operands' values are not at hand (a device evaluator's values): each
// present input's dtype and static shape, with its `constant` where the values are known. An
// output whose shape needs an unknown value is an error (the caller fetches the values and asks
// again).
StatusOr<std::vector<ConcreteOutput>> InferNodeOnOperands(const Node& node,
                                                          std::span<const ValueInfo* const> inputs);

// Helpers for rules.
// Numpy-style broadcast of two shapes; error names both shapes.
StatusOr<Shape> BroadcastShapes(const Shape& a, const Shape& b);
// Normalises a possibly negative axis against rank; error when out of range.
StatusOr<int64_t> NormalizeAxis(int64_t axis, int64_t rank);

// Declarations of every rule.
#define KILN_OP(name, ...) Status Infer##name(InferenceContext& ctx);
#include "kiln/ops/ops.inc"
#undef KILN_OP

}  // namespace kiln
