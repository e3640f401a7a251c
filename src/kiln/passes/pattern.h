// The one pattern matcher every fusion uses: a declarative tree of op patterns, value captures and
// constant predicates, matched against the producers of a root node. Fusions describe the shape
// they want; this file owns the traversal, commutativity, backtracking and the rule that a
// fused-away intermediate must not be read outside the match.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/ir/graph.h"

namespace kiln::passes {

struct PatternNode;
// A shared, immutable pattern tree node. Build with the functions in namespace `pat` below.
class Pattern {
 public:
  explicit Pattern(std::shared_ptr<PatternNode> node) : node_(std::move(node)) {}

  // Records the matched node (op patterns) or value (any/constant patterns) under `name`. A name
  // used twice in one pattern must bind the same value both times (x * (1 + erf(x / c))).
  Pattern Capture(std::string name) const;
  // An extra condition on the matched node (op patterns only).
  Pattern Where(std::function<bool(const Node&)> pred) const;
  // An extra condition on the matched value (any pattern).
  Pattern WhereValue(std::function<bool(const Value&)> pred) const;
  // Allows this intermediate op's output to have readers outside the match (the rewrite then
  // keeps it; dead-node elimination removes it later if it ends up unused).
  Pattern Shared() const;

  const PatternNode& node() const { return *node_; }

 private:
  std::shared_ptr<PatternNode> node_;
};

struct PatternNode {
  enum class Kind { kOp, kAny, kConstant, kOneOf };
  Kind kind = Kind::kAny;
  std::vector<std::string> op_types;  // kOp: accepted op types
  std::vector<Pattern> children;      // kOp: inputs 0..n-1 (extra node inputs are free);
                                      // kOneOf: alternatives, tried in order
  bool commutative = false;           // kOp with two children: either input order
  std::string capture;
  std::function<bool(const Node&)> node_pred;
  std::function<bool(const Value&)> value_pred;
  bool shared = false;
};

namespace pat {
// A node of one of `types` whose first inputs match `inputs` in order. Add and Mul (two inputs)
// are commutative: the inputs match in either order.
Pattern Op(std::string type, std::vector<Pattern> inputs = {});
Pattern Op(std::vector<std::string> types, std::vector<Pattern> inputs = {});
// Any value (graph input, constant or node output).
Pattern Any(std::string capture = "");
// A constant value (weights, folded tensors).
Pattern Constant(std::string capture = "");
// A constant whose every element is within `rel_tol` of `value` (scalars like 0.5, sqrt(2)).
Pattern Scalar(double value, double rel_tol = 1e-3, std::string capture = "");
// The first alternative that matches (each may capture different names).
Pattern OneOf(std::vector<Pattern> alternatives);
}  // namespace pat

// A successful match: captures by name, and every op node the pattern covered.
struct Match {
  Node* root = nullptr;
  std::map<std::string, Node*> nodes;
  std::map<std::string, Value*> values;
  // Op nodes in the match, root first. Non-shared intermediates are read only inside the match.
  std::vector<Node*> matched;

  Node* node(const std::string& name) const;
  Value* value(const std::string& name) const;
  bool has(const std::string& name) const { return nodes.count(name) || values.count(name); }
};

// Matches `pattern` (whose top is an op pattern) rooted at `node`. Intermediates (every matched
// op node but the root, unless Shared) must have all readers inside the match and must not be
// graph outputs: fusing them away must not change what anything else sees.
std::optional<Match> MatchAt(const Pattern& pattern, Node* node);

// The order in which ForEachMatch visits candidate roots: the graph's topological order, or from
// the outputs back (a chain's last op first, so the largest match wins: a norm's gamma Mul, an
// activation after a bias).
enum class RootOrder { kTopological, kFromOutputs };
// Every fusion's loop: calls `rewrite` with each match of `pattern` rooted at a live node that
// `is_root` (when given) accepts, visiting the nodes of the graph as it is when the call starts, in
// `order`. Nodes a rewrite kills are not visited; nodes it adds are not either.
Status ForEachMatch(Graph& graph, const Pattern& pattern, RootOrder order,
                    const std::function<bool(const Node&)>& is_root,
                    const std::function<void(const Match&)>& rewrite);

// Helpers for predicates on constants.
// The constant's elements as doubles when it has at most `max_elements` elements.
std::optional<std::vector<double>> ConstantValues(const Value* v, int64_t max_elements = 1 << 20);
// The single value of a constant whose elements are all equal (a scalar or a splat).
std::optional<double> ConstantSplat(const Value* v);

}  // namespace kiln::passes
