// Graph construction, editing, ordering and verification.
#include "kiln/ir/graph.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <queue>
#include <unordered_set>

#include "kiln/ir/sizes.h"

namespace kiln {

void Value::set_constant(Tensor t) {
  dtype_ = t.dtype();
  set_shape(MakeShape(t.dims()));
  constant_ = std::move(t);
  provenance_.reset();
  for (Node* c : consumers_) c->shape_dirty_ = true;
}

std::string Graph::UniqueName(const std::string& prefix) {
  for (;;) {
    std::string name = prefix + "_" + std::to_string(next_unique_++);
    if (!value_by_name_.count(name) && !FindNode(name)) return name;
  }
}

Value* Graph::AddValue(std::string name, DataType dtype) {
  if (name.empty() || value_by_name_.count(name)) name = UniqueName(name.empty() ? "v" : name);
  auto v = std::make_unique<Value>();
  v->name_ = name;
  v->dtype_ = dtype;
  Value* raw = v.get();
  values_.push_back(std::move(v));
  value_by_name_[name] = raw;
  return raw;
}

Value* Graph::AddInput(std::string name, DataType dtype, Shape shape) {
  Value* v = AddValue(std::move(name), dtype);
  v->set_shape(std::move(shape));
  v->is_graph_input_ = true;
  inputs_.push_back(v);
  return v;
}

Value* Graph::AddConstant(std::string name, Tensor tensor) {
  Value* v = AddValue(std::move(name));
  v->set_constant(std::move(tensor));
  return v;
}

void Graph::MarkOutput(Value* v) {
  if (!v->is_graph_output_) {
    v->is_graph_output_ = true;
    outputs_.push_back(v);
  }
}

void Graph::UnmarkOutput(Value* v) {
  v->is_graph_output_ = false;
  std::erase(outputs_, v);
}

Node* Graph::AddNode(std::string op_type, std::string name, std::vector<Value*> inputs,
                     std::vector<Value*> outputs, AttributeMap attrs, std::string domain) {
  auto n = std::make_unique<Node>();
  n->id_ = next_node_id_++;
  n->name_ = name.empty() ? op_type + "_" + std::to_string(n->id_) : std::move(name);
  n->op_type_ = std::move(op_type);
  n->domain_ = std::move(domain);
  n->inputs_ = std::move(inputs);
  n->outputs_ = std::move(outputs);
  n->attrs_ = std::move(attrs);
  Node* raw = n.get();
  for (Value* in : raw->inputs_) {
    if (in) in->consumers_.push_back(raw);
  }
  for (size_t i = 0; i < raw->outputs_.size(); ++i) {
    Value* out = raw->outputs_[i];
    if (!out) continue;
    out->producer_ = raw;
    out->producer_output_ = static_cast<int>(i);
  }
  nodes_.push_back(std::move(n));
  StructureChanged();
  return raw;
}

void Graph::SetInput(Node* node, size_t index, Value* value) {
  if (index >= node->inputs_.size()) node->inputs_.resize(index + 1, nullptr);
  Value* old = node->inputs_[index];
  if (old) {
    auto it = std::find(old->consumers_.begin(), old->consumers_.end(), node);
    if (it != old->consumers_.end()) old->consumers_.erase(it);
  }
  node->inputs_[index] = value;
  node->shape_dirty_ = true;
  StructureChanged();
  if (value) value->consumers_.push_back(node);
}

Status Graph::SetOutput(Node* node, size_t index, Value* value) {
  if (value->producer_) {
    return MakeError(ErrorCode::kInternal, "value '{}' already has a producer ('{}')",
                     value->name(), value->producer_->name());
  }
  if (index < node->outputs_.size() && node->outputs_[index]) {
    return MakeError(ErrorCode::kInternal, "node '{}' already has output {} ('{}')", node->name(),
                     index, node->outputs_[index]->name());
  }
  if (index >= node->outputs_.size()) node->outputs_.resize(index + 1, nullptr);
  node->outputs_[index] = value;
  value->producer_ = node;
  value->producer_output_ = static_cast<int>(index);
  node->shape_dirty_ = true;
  StructureChanged();
  return OkStatus();
}

void Graph::ReplaceAllUses(Value* from, Value* to) {
  if (from == to) return;
  std::vector<Node*> consumers = from->consumers_;
  for (Node* n : consumers) {
    for (size_t i = 0; i < n->inputs_.size(); ++i) {
      if (n->inputs_[i] == from) SetInput(n, i, to);
    }
  }
  if (from->is_graph_output_) {
    // Keep the output's public name: the graph's outputs are an interface.
    auto it = std::find(outputs_.begin(), outputs_.end(), from);
    from->is_graph_output_ = false;
    if (to->is_graph_output_ || to->is_graph_input_ || to->is_constant()) {
      // `to` cannot be renamed; the caller accepts the new name (rare: identity-only graphs).
      *it = to;
      to->is_graph_output_ = true;
    } else {
      std::string public_name = from->name_;
      value_by_name_.erase(public_name);
      from->name_ = UniqueName(public_name + "_replaced");
      value_by_name_[from->name_] = from;
      value_by_name_.erase(to->name_);
      to->name_ = public_name;
      value_by_name_[public_name] = to;
      *it = to;
      to->is_graph_output_ = true;
    }
  }
}

void Graph::RemoveNode(Node* node) {
  for (size_t i = 0; i < node->inputs_.size(); ++i) SetInput(node, i, nullptr);
  for (Value* out : node->outputs_) {
    if (out && out->producer_ == node) {
      out->producer_ = nullptr;
      out->producer_output_ = -1;
    }
  }
  node->dead_ = true;
  StructureChanged();
}

void Graph::Compact() {
  std::erase_if(nodes_, [](const std::unique_ptr<Node>& n) { return n->dead_; });
  StructureChanged();
  for (const auto& v : values_) v->referenced_ = false;
  for (const auto& n : nodes_) {
    for (Value* v : n->inputs_) {
      if (v) v->referenced_ = true;
    }
    for (Value* v : n->outputs_) {
      if (v) v->referenced_ = true;
    }
  }
  std::erase_if(values_, [&](const std::unique_ptr<Value>& v) {
    bool keep = v->referenced_ || v->is_graph_input_ || v->is_graph_output_;
    if (!keep) value_by_name_.erase(v->name_);
    return !keep;
  });
}

Value* Graph::FindValue(const std::string& name) const {
  auto it = value_by_name_.find(name);
  return it == value_by_name_.end() ? nullptr : it->second;
}

Node* Graph::FindNode(const std::string& name) const {
  for (const auto& n : nodes_) {
    if (!n->dead_ && n->name_ == name) return n.get();
  }
  return nullptr;
}

std::vector<Node*> Graph::nodes() const {
  std::vector<Node*> out;
  out.reserve(nodes_.size());
  for (const auto& n : nodes_) {
    if (!n->dead_) out.push_back(n.get());
  }
  return out;
}

std::vector<Value*> Graph::values() const {
  std::vector<Value*> out;
  out.reserve(values_.size());
  for (const auto& v : values_) out.push_back(v.get());
  return out;
}

size_t Graph::num_nodes() const {
  return static_cast<size_t>(
      std::count_if(nodes_.begin(), nodes_.end(), [](const auto& n) { return !n->dead_; }));
}

StatusOr<std::vector<Node*>> Graph::TopologicalOrder() const {
  std::lock_guard<std::mutex> lock(order_mutex_);
  if (order_version_ == structure_version_) return order_;
  KILN_ASSIGN_OR_RETURN(order_, ComputeTopologicalOrder());  // a cycle is not cached
  order_version_ = structure_version_;
  return order_;
}

StatusOr<std::vector<Node*>> Graph::ComputeTopologicalOrder() const {
  // Kahn's algorithm; ties broken by insertion order, so the order is deterministic. Live nodes
  // are in id order (ids grow with insertion and nodes_ keeps that order), so a node's slot in
  // `live` is found by binary search: no hash map on this hot path of the builder.
  std::vector<Node*> live = nodes();
  auto slot = [&](const Node* n) {
    return std::lower_bound(live.begin(), live.end(), n->id_,
                            [](const Node* a, int64_t id) { return a->id_ < id; }) -
           live.begin();
  };
  std::vector<int> pending(live.size(), 0);
  for (size_t i = 0; i < live.size(); ++i) {
    for (Value* in : live[i]->inputs_) {
      if (in && in->producer_ && !in->producer_->dead_) ++pending[i];
    }
  }
  auto cmp = [](const Node* a, const Node* b) { return a->id_ > b->id_; };
  std::priority_queue<Node*, std::vector<Node*>, decltype(cmp)> ready(cmp);
  for (size_t i = 0; i < live.size(); ++i) {
    if (pending[i] == 0) ready.push(live[i]);
  }
  std::vector<Node*> order;
  order.reserve(live.size());
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    order.push_back(n);
    for (Value* out : n->outputs_) {
      if (!out) continue;
      for (Node* c : out->consumers_) {
        // A consumer listing the same value twice is decremented twice, matching its count.
        if (--pending[slot(c)] == 0) ready.push(c);
      }
    }
  }
  if (order.size() != live.size()) {
    std::vector<std::string> stuck;
    for (size_t i = 0; i < live.size(); ++i) {
      if (pending[i] > 0 && stuck.size() < 5) stuck.push_back("'" + live[i]->name_ + "'");
    }
    return MakeError(ErrorCode::kGraphCycle, "{} node(s) lie on or behind a cycle, e.g. {}",
                     live.size() - order.size(), fmt::join(stuck, ", "));
  }
  return order;
}

Status Verify(const Graph& graph) {
  std::vector<std::string> undefined;
  for (Node* n : graph.nodes()) {
    for (Value* in : n->inputs()) {
      if (!in) continue;
      bool defined = in->is_graph_input() || in->is_constant() ||
                     (in->producer() && !in->producer()->is_dead());
      if (!defined)
        undefined.push_back(fmt::format("'{}' (read by node '{}')", in->name(), n->name()));
    }
  }
  for (Value* out : graph.outputs()) {
    if (!out->is_graph_input() && !out->is_constant() && !out->producer()) {
      undefined.push_back(fmt::format("'{}' (a graph output)", out->name()));
    }
  }
  if (!undefined.empty()) {
    return MakeError(ErrorCode::kUndefinedValue, "{} undefined value(s): {}", undefined.size(),
                     fmt::join(undefined, ", "));
  }
  KILN_RETURN_IF_ERROR(graph.TopologicalOrder());
  for (Value* in : graph.inputs()) {
    if (in->dtype() == DataType::kUndefined) {
      return MakeError(ErrorCode::kTypeMismatch, "graph input '{}' has no element type",
                       in->name());
    }
    // Symbolic dims are checked where they are bound (the profile, run-time shapes).
    KILN_RETURN_IF_ERROR(CheckShapeSize(in->shape(), in->dtype(), ErrorCode::kTensorTooLarge,
                                        fmt::format("graph input '{}'", in->name())));
  }
  return OkStatus();
}

}  // namespace kiln
