// The IR: a Graph owns Nodes and Values. Values are SSA: one producer (a node, a graph input or a
// constant), any number of consumers. Op semantics live in the ops layer; the IR knows only
// structure, types and (symbolic) shapes.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/ir/attribute.h"
#include "kiln/ir/dim.h"
#include "kiln/ir/dtype.h"
#include "kiln/ir/tensor.h"

namespace kiln {

class Node;
struct WeightExpr;

class Value {
 public:
  const std::string& name() const { return name_; }
  DataType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  bool has_shape() const { return has_shape_; }
  void set_dtype(DataType t) { dtype_ = t; }
  void set_shape(Shape s) {
    shape_ = std::move(s);
    has_shape_ = true;
  }
  void clear_shape() {
    shape_.clear();
    has_shape_ = false;
  }

  Node* producer() const { return producer_; }
  int producer_output() const { return producer_output_; }
  const std::vector<Node*>& consumers() const { return consumers_; }

  bool is_constant() const { return constant_.has_value(); }
  const Tensor* constant() const { return constant_ ? &*constant_ : nullptr; }
  // Sets the constant and forgets its provenance: the caller records the new one.
  void set_constant(Tensor t);
  // How the constant was made from the model's initializers (ir/weight_program.h); nullptr when
  // the code that made it recorded nothing.
  const std::shared_ptr<const WeightExpr>& provenance() const { return provenance_; }
  void set_provenance(std::shared_ptr<const WeightExpr> e) { provenance_ = std::move(e); }

  bool is_graph_input() const { return is_graph_input_; }
  bool is_graph_output() const { return is_graph_output_; }

  // A shape input (an integer graph input that feeds a shape operand: Reshape's shape, Slice's
  // starts...): the values the engine is specialized for. Shape rules read them as they read a
  // constant's; nothing folds them, since the caller gives other values at run time.
  const Tensor* shape_input_values() const {
    return shape_input_values_ ? &*shape_input_values_ : nullptr;
  }
  void set_shape_input_values(std::optional<Tensor> t) { shape_input_values_ = std::move(t); }
  // Set by shape inference: the shape or contents follow from a shape input's values, so they
  // hold for the build's values only. A rewrite that decides by such a shape (a Reshape to the
  // same shape is an identity) would bake those values in; passes leave these values alone.
  bool value_dependent() const { return value_dependent_; }
  void set_value_dependent(bool on) { value_dependent_ = on; }

 private:
  friend class Graph;
  std::string name_;
  DataType dtype_ = DataType::kUndefined;
  Shape shape_;
  bool has_shape_ = false;
  Node* producer_ = nullptr;
  int producer_output_ = -1;
  std::vector<Node*> consumers_;
  std::optional<Tensor> constant_;
  std::shared_ptr<const WeightExpr> provenance_;
  std::optional<Tensor> shape_input_values_;
  bool value_dependent_ = false;
  bool is_graph_input_ = false;
  bool is_graph_output_ = false;
  bool referenced_ = false;  // scratch for Graph::Compact
};

class Node {
 public:
  const std::string& name() const { return name_; }
  const std::string& op_type() const { return op_type_; }
  const std::string& domain() const { return domain_; }
  // Omitted optional inputs are nullptr.
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  Value* input(size_t i) const { return i < inputs_.size() ? inputs_[i] : nullptr; }
  Value* output(size_t i) const { return i < outputs_.size() ? outputs_[i] : nullptr; }
  size_t num_inputs() const { return inputs_.size(); }
  size_t num_outputs() const { return outputs_.size(); }
  const AttributeMap& attrs() const { return attrs_; }
  AttributeMap& mutable_attrs() {
    shape_dirty_ = true;
    return attrs_;
  }
  void set_name(std::string n) { name_ = std::move(n); }
  void set_op_type(std::string t) {
    op_type_ = std::move(t);
    shape_dirty_ = true;
  }
  // Set when the node is added or its inputs, attributes or op type change, or an input's
  // constant is replaced; shape inference clears it. Incremental inference (InferNewShapes)
  // re-infers only dirty nodes and what depends on them.
  bool shape_dirty() const { return shape_dirty_; }
  void clear_shape_dirty() { shape_dirty_ = false; }
  // Position in the graph's insertion order (stable ids for reports).
  int64_t id() const { return id_; }
  bool is_dead() const { return dead_; }

 private:
  friend class Graph;
  friend class Value;  // set_constant marks the consumers dirty
  std::string name_;
  std::string op_type_;
  std::string domain_;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
  AttributeMap attrs_;
  int64_t id_ = 0;
  bool dead_ = false;
  bool shape_dirty_ = true;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  const std::string& name() const { return name_; }
  void set_name(std::string n) { name_ = std::move(n); }
  int64_t opset() const { return opset_; }
  void set_opset(int64_t v) { opset_ = v; }

  // Data-dependent dims (docs/architecture.md, "Data-dependent shapes"): symbols that an op's
  // kernel reports at run time (NonZero's count, NMS's selected boxes), each with an upper bound
  // over other dims (NonZero's: the input's element count). Shape inference records them; the
  // memory plan sizes such a dim at its bound; the runtime binds the reported value.
  const std::map<std::string, Dim>& data_dependent_bounds() const { return dd_bounds_; }
  void SetDataDependentBound(const std::string& symbol, Dim bound) {
    dd_bounds_.insert_or_assign(symbol, std::move(bound));
  }

  // Creating values and nodes. Value names are unique; an empty name gets a fresh one.
  Value* AddValue(std::string name, DataType dtype = DataType::kUndefined);
  Value* AddInput(std::string name, DataType dtype, Shape shape);
  Value* AddConstant(std::string name, Tensor tensor);
  void MarkOutput(Value* v);
  void UnmarkOutput(Value* v);
  // Fresh name with this prefix that no value or node has yet.
  std::string UniqueName(const std::string& prefix);
  Node* AddNode(std::string op_type, std::string name, std::vector<Value*> inputs,
                std::vector<Value*> outputs, AttributeMap attrs = {}, std::string domain = "");

  // Editing.
  void SetInput(Node* node, size_t index, Value* value);
  // Makes `value` (no producer yet) output `index` of `node`, growing its outputs with omitted
  // (nullptr) ones as needed; fails where that output is already present.
  Status SetOutput(Node* node, size_t index, Value* value);
  // Points every consumer (and graph-output mark) of `from` at `to`.
  void ReplaceAllUses(Value* from, Value* to);
  // Removes a node; its outputs stay as values without a producer (remove or rewire them).
  void RemoveNode(Node* node);
  // Drops values with no producer, no consumer, not input/output/constant... and dead nodes.
  void Compact();

  Value* FindValue(const std::string& name) const;
  Node* FindNode(const std::string& name) const;

  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  // Live nodes in insertion order (not necessarily topological).
  std::vector<Node*> nodes() const;
  std::vector<Value*> values() const;
  size_t num_nodes() const;

  // Nodes in a deterministic topological order; KILN-E2005 names a node on a cycle. The order
  // is kept until the structure changes (AddNode, SetInput, ReplaceAllUses, RemoveNode,
  // Compact), so the passes' repeated calls on an unchanged graph do not re-sort it.
  StatusOr<std::vector<Node*>> TopologicalOrder() const;

 private:
  StatusOr<std::vector<Node*>> ComputeTopologicalOrder() const;
  void StructureChanged() { ++structure_version_; }

  std::string name_;
  int64_t opset_ = 0;
  std::map<std::string, Dim> dd_bounds_;
  std::vector<std::unique_ptr<Value>> values_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::unordered_map<std::string, Value*> value_by_name_;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
  int64_t next_node_id_ = 0;
  int64_t next_unique_ = 0;
  // Bumped by every edit that can change the order; the cached order is for one version.
  uint64_t structure_version_ = 0;
  mutable std::mutex order_mutex_;  // const readers may share a graph across threads
  mutable std::optional<uint64_t> order_version_;
  mutable std::vector<Node*> order_;
};

// Structural checks: every input defined (graph input, constant or node output), one producer per
// value, no cycles, outputs defined, dtypes known, graph inputs' static dims within the size
// limits (ir/sizes.h, KILN-E2015). Op-specific type rules live in ops.
Status Verify(const Graph& graph);

}  // namespace kiln
