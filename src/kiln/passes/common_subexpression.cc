// Common-subexpression elimination: two nodes of one op with the same inputs (the same values, in
// order) and the same attributes compute the same outputs, so the later one's readers read the
// earlier one's outputs and it goes. The fusions make such twins: attention_fusion gives every
// layer of T5 the sum of the shared position bias and the shared padding mask, one
// [B, H, S, S] Add per layer where one serves them all. Exporters write others (a mask or a
// position computation per layer from the same inputs).
//
// Small constants with equal bytes count as one input where refit cannot make them differ
// (literals; integer and bool initializers, which refit checks unchanged).
// Left alone: nodes with a tensor attribute (compared by value nowhere else; constant folding
// turns most of them into constants) and a twin whose output is a graph output (its name is the
// caller's). Every op kiln imports is deterministic (it has no random ops), so equal inputs give
// equal outputs.
#include <fmt/format.h>

#include <map>
#include <tuple>
#include <variant>

#include "kiln/ir/weight_program.h"
#include "kiln/passes/pass.h"

namespace kiln::passes {
namespace {

// Attribute values compared by value; a tensor never equals anything (not compared).
bool SameAttribute(const Attribute& a, const Attribute& b) {
  if (a.index() != b.index()) return false;
  return std::visit(
      [&](const auto& x) {
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<X, Tensor>) {
          return false;
        } else {
          return x == std::get<X>(b);
        }
      },
      a);
}

bool SameAttributes(const AttributeMap& a, const AttributeMap& b) {
  if (a.size() != b.size()) return false;
  auto ia = a.all().begin();
  for (auto ib = b.all().begin(); ib != b.all().end(); ++ia, ++ib) {
    if (ia->first != ib->first || !SameAttribute(ia->second, ib->second)) return false;
  }
  return true;
}

bool HasTensorAttribute(const Node& n) {
  for (const auto& [name, value] : n.attrs().all()) {
    if (std::holds_alternative<Tensor>(value)) return true;
  }
  return false;
}

// Small constants of equal type, dims and bytes stand for one another as inputs when refit can
// never make them differ: literals (shape targets, scalars an exporter wrote per layer) and
// integer or bool initializers (refit checks those unchanged). DistilBERT reshapes the shared
// padding mask in every layer, each with its own copy of the target.
constexpr int64_t kSmallConstant = 256;

bool Interchangeable(const Value& v) {
  if (!v.is_constant() || v.constant()->num_elements() > kSmallConstant) return false;
  const DataType t = v.constant()->dtype();
  return ProvenanceOf(v)->kind == WeightExpr::Kind::kLiteral || t == DataType::kInt64 ||
         t == DataType::kInt32 || t == DataType::kBool;
}

class CommonSubexpressionPass final : public Pass {
 public:
  std::string_view name() const override { return "common_subexpression"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
    // Candidates by op, domain and input values; attributes are compared within a bucket.
    using Key = std::tuple<std::string, std::string, std::vector<const Value*>, size_t>;
    std::map<Key, std::vector<Node*>> seen;
    // The first of each set of interchangeable constants, by dtype, dims and bytes.
    std::map<std::tuple<DataType, std::vector<int64_t>, std::string>, const Value*> constants;
    auto representative = [&](const Value* v) -> const Value* {
      if (!v || !Interchangeable(*v)) return v;
      const Tensor& t = *v->constant();
      std::string bytes(reinterpret_cast<const char*>(t.bytes().data()), t.size_bytes());
      return constants.try_emplace({t.dtype(), t.dims(), std::move(bytes)}, v).first->second;
    };
    int merged = 0;
    for (Node* n : order) {
      if (n->is_dead() || n->num_outputs() == 0 || HasTensorAttribute(*n)) continue;
      std::vector<const Value*> inputs;
      for (const Value* in : n->inputs()) inputs.push_back(representative(in));
      std::vector<Node*>& bucket =
          seen[Key{n->op_type(), n->domain(), std::move(inputs), n->num_outputs()}];
      Node* twin = nullptr;
      for (Node* m : bucket) {
        if (SameAttributes(m->attrs(), n->attrs())) {
          twin = m;
          break;
        }
      }
      bool replaceable = twin != nullptr;
      for (size_t i = 0; replaceable && i < n->num_outputs(); ++i) {
        const Value* out = n->output(i);
        if (out && (out->is_graph_output() || !twin->output(i))) replaceable = false;
      }
      if (!replaceable) {
        bucket.push_back(n);
        continue;
      }
      for (size_t i = 0; i < n->num_outputs(); ++i) {
        if (n->output(i)) graph.ReplaceAllUses(n->output(i), twin->output(i));
      }
      graph.RemoveNode(n);
      ctx.stats().rewrites += 1;
      ctx.stats().nodes_removed += 1;
      ++merged;
    }
    if (merged > 0) {
      ctx.stats().notes.push_back(
          fmt::format("{} node(s) computed what an earlier node with the same inputs did", merged));
    }
    return OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeCommonSubexpressionPass() {
  return std::make_unique<CommonSubexpressionPass>();
}

}  // namespace kiln::passes
