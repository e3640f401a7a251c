// The pattern matcher: enumerates every way a pattern fits (commutative operand orders and
// alternatives), so that a capture bound on one branch constrains the others, then keeps the first
// fit whose intermediates are private to the match.
#include "kiln/passes/pattern.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

namespace kiln::passes {

Pattern Pattern::Capture(std::string name) const {
  auto n = std::make_shared<PatternNode>(*node_);
  n->capture = std::move(name);
  return Pattern(std::move(n));
}

Pattern Pattern::Where(std::function<bool(const Node&)> pred) const {
  auto n = std::make_shared<PatternNode>(*node_);
  auto prev = n->node_pred;
  n->node_pred = prev ? [prev, pred](const Node& x) { return prev(x) && pred(x); } : pred;
  return Pattern(std::move(n));
}

Pattern Pattern::WhereValue(std::function<bool(const Value&)> pred) const {
  auto n = std::make_shared<PatternNode>(*node_);
  auto prev = n->value_pred;
  n->value_pred = prev ? [prev, pred](const Value& x) { return prev(x) && pred(x); } : pred;
  return Pattern(std::move(n));
}

Pattern Pattern::Shared() const {
  auto n = std::make_shared<PatternNode>(*node_);
  n->shared = true;
  return Pattern(std::move(n));
}

namespace pat {

Pattern Op(std::string type, std::vector<Pattern> inputs) {
  return Op(std::vector<std::string>{std::move(type)}, std::move(inputs));
}

Pattern Op(std::vector<std::string> types, std::vector<Pattern> inputs) {
  auto n = std::make_shared<PatternNode>();
  n->kind = PatternNode::Kind::kOp;
  n->commutative = inputs.size() == 2 && std::all_of(types.begin(), types.end(), [](auto& t) {
                     return t == "Add" || t == "Mul";
                   });
  n->op_types = std::move(types);
  n->children = std::move(inputs);
  return Pattern(std::move(n));
}

Pattern Any(std::string capture) {
  auto n = std::make_shared<PatternNode>();
  n->kind = PatternNode::Kind::kAny;
  n->capture = std::move(capture);
  return Pattern(std::move(n));
}

Pattern Constant(std::string capture) {
  auto n = std::make_shared<PatternNode>();
  n->kind = PatternNode::Kind::kConstant;
  n->capture = std::move(capture);
  return Pattern(std::move(n));
}

Pattern Scalar(double value, double rel_tol, std::string capture) {
  return Constant(std::move(capture)).WhereValue([value, rel_tol](const Value& v) {
    auto s = ConstantSplat(&v);
    return s && std::abs(*s - value) <= rel_tol * std::max(1.0, std::abs(value));
  });
}

Pattern OneOf(std::vector<Pattern> alternatives) {
  auto n = std::make_shared<PatternNode>();
  n->kind = PatternNode::Kind::kOneOf;
  n->children = std::move(alternatives);
  return Pattern(std::move(n));
}

}  // namespace pat

Node* Match::node(const std::string& name) const {
  auto it = nodes.find(name);
  return it == nodes.end() ? nullptr : it->second;
}

Value* Match::value(const std::string& name) const {
  auto it = values.find(name);
  return it == values.end() ? nullptr : it->second;
}

namespace {

struct State {
  Match match;
  std::vector<bool> shared;  // parallel to match.matched
};

std::vector<State> MatchNode(const PatternNode& p, Node* node, State state);

// An op pattern's type test (one of its op_types).
bool OpTypeMatches(const PatternNode& p, const Node& node) {
  return std::find(p.op_types.begin(), p.op_types.end(), node.op_type()) != p.op_types.end();
}

std::vector<State> MatchValue(const PatternNode& p, Value* v, State state) {
  if (!v) return {};
  switch (p.kind) {
    case PatternNode::Kind::kOneOf: {
      std::vector<State> out;
      for (const Pattern& alt : p.children) {
        auto r = MatchValue(alt.node(), v, state);
        out.insert(out.end(), std::make_move_iterator(r.begin()), std::make_move_iterator(r.end()));
      }
      return out;
    }
    case PatternNode::Kind::kAny:
    case PatternNode::Kind::kConstant: {
      if (p.kind == PatternNode::Kind::kConstant && !v->is_constant()) return {};
      if (p.value_pred && !p.value_pred(*v)) return {};
      if (!p.capture.empty()) {
        auto it = state.match.values.find(p.capture);
        if (it != state.match.values.end()) {
          if (it->second != v) return {};
        } else {
          state.match.values[p.capture] = v;
        }
      }
      return {std::move(state)};
    }
    case PatternNode::Kind::kOp: {
      Node* producer = v->producer();
      if (!producer || producer->is_dead()) return {};
      return MatchNode(p, producer, std::move(state));
    }
  }
  return {};
}

std::vector<State> MatchNode(const PatternNode& p, Node* node, State state) {
  if (p.kind == PatternNode::Kind::kOneOf) {
    std::vector<State> out;
    for (const Pattern& alt : p.children) {
      auto r = MatchNode(alt.node(), node, state);
      out.insert(out.end(), std::make_move_iterator(r.begin()), std::make_move_iterator(r.end()));
    }
    return out;
  }
  if (p.kind != PatternNode::Kind::kOp || !OpTypeMatches(p, *node)) return {};
  if (node->num_inputs() < p.children.size()) return {};
  if (p.node_pred && !p.node_pred(*node)) return {};
  if (!p.capture.empty()) {
    auto it = state.match.nodes.find(p.capture);
    if (it != state.match.nodes.end()) {
      // The same capture twice: the second occurrence refers to the node already matched.
      return it->second == node ? std::vector<State>{std::move(state)} : std::vector<State>{};
    }
    state.match.nodes[p.capture] = node;
  }
  auto pos = std::find(state.match.matched.begin(), state.match.matched.end(), node);
  if (pos == state.match.matched.end()) {
    state.match.matched.push_back(node);
    state.shared.push_back(p.shared);
  } else if (!p.shared) {
    state.shared[pos - state.match.matched.begin()] = false;
  }

  std::vector<std::vector<size_t>> orders = {{}};
  for (size_t i = 0; i < p.children.size(); ++i) orders[0].push_back(i);
  if (p.commutative && node->num_inputs() == 2) orders.push_back({1, 0});

  std::vector<State> out;
  for (const auto& order : orders) {
    std::vector<State> states = {state};
    for (size_t c = 0; c < p.children.size() && !states.empty(); ++c) {
      std::vector<State> next;
      for (State& s : states) {
        auto r = MatchValue(p.children[c].node(), node->input(order[c]), std::move(s));
        next.insert(next.end(), std::make_move_iterator(r.begin()),
                    std::make_move_iterator(r.end()));
      }
      states = std::move(next);
    }
    out.insert(out.end(), std::make_move_iterator(states.begin()),
               std::make_move_iterator(states.end()));
  }
  return out;
}

bool IntermediatesArePrivate(const State& s) {
  std::unordered_set<const Node*> inside(s.match.matched.begin(), s.match.matched.end());
  for (size_t i = 0; i < s.match.matched.size(); ++i) {
    const Node* n = s.match.matched[i];
    if (n == s.match.root || s.shared[i]) continue;
    for (const Value* out : n->outputs()) {
      if (!out) continue;
      if (out->is_graph_output()) return false;
      for (const Node* c : out->consumers()) {
        if (!inside.count(c)) return false;
      }
    }
  }
  return true;
}

// Whether the pattern's root can be `node` at all (its op type), checked before any matching
// state is built: most nodes of a graph fail here, for every pattern of every pass.
bool RootMayMatch(const PatternNode& p, const Node& node) {
  switch (p.kind) {
    case PatternNode::Kind::kOp:
      return OpTypeMatches(p, node);
    case PatternNode::Kind::kOneOf:
      return std::any_of(p.children.begin(), p.children.end(),
                         [&](const Pattern& alt) { return RootMayMatch(alt.node(), node); });
    case PatternNode::Kind::kAny:
    case PatternNode::Kind::kConstant:
      break;
  }
  return false;  // MatchNode matches only op patterns at a node
}

}  // namespace

std::optional<Match> MatchAt(const Pattern& pattern, Node* node) {
  if (!node || node->is_dead() || !RootMayMatch(pattern.node(), *node)) return std::nullopt;
  State start;
  start.match.root = node;
  for (State& s : MatchNode(pattern.node(), node, std::move(start))) {
    if (IntermediatesArePrivate(s)) return std::move(s.match);
  }
  return std::nullopt;
}

Status ForEachMatch(Graph& graph, const Pattern& pattern, RootOrder order,
                    const std::function<bool(const Node&)>& is_root,
                    const std::function<void(const Match&)>& rewrite) {
  KILN_ASSIGN_OR_RETURN(std::vector<Node*> nodes, graph.TopologicalOrder());
  if (order == RootOrder::kFromOutputs) std::reverse(nodes.begin(), nodes.end());
  for (Node* node : nodes) {
    if (node->is_dead() || (is_root && !is_root(*node))) continue;
    if (auto m = MatchAt(pattern, node)) rewrite(*m);
  }
  return OkStatus();
}

std::optional<std::vector<double>> ConstantValues(const Value* v, int64_t max_elements) {
  if (!v || !v->is_constant()) return std::nullopt;
  const Tensor& t = *v->constant();
  if (t.num_elements() > max_elements) return std::nullopt;
  std::vector<double> out(static_cast<size_t>(t.num_elements()));
  for (int64_t i = 0; i < t.num_elements(); ++i) out[i] = t.GetDouble(i);
  return out;
}

std::optional<double> ConstantSplat(const Value* v) {
  if (!v || !v->is_constant()) return std::nullopt;
  const Tensor& t = *v->constant();
  if (t.num_elements() < 1) return std::nullopt;
  double first = t.GetDouble(0);
  for (int64_t i = 1; i < t.num_elements(); ++i) {
    if (t.GetDouble(i) != first) return std::nullopt;
  }
  return first;
}

}  // namespace kiln::passes
