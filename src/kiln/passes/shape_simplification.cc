// Shape-subgraph simplification: exporters compute reshape targets at run time
// (Shape -> Gather/Slice -> Unsqueeze -> Concat -> Reshape). Shape inference already knows those
// small integer tensors as dims-values; every one whose elements are all static becomes a
// constant, and the chain that computed it dies. With symbolic dims only the static parts fold
// (Gather(Shape(x), 2) with a static dim 2 does; Gather(Shape(x), 0) with dim 0 = batch does not).
//
// The Shape nodes that stay (a symbolic dim) read an intermediate tensor only for its shape, which
// keeps the node that makes it alive even when nothing else reads it (a Transpose feeding only a
// Shape), and ties the shape chain to the data path. Each dim of such a shape is a polynomial in
// the graph inputs' symbolic dims (the shape rules' Dim), so the Shape becomes a computation from
// the graph inputs' own shapes: Gather(Shape(input), axis) per symbol, Mul/Add for the polynomial,
// Concat of the dims. Only where every symbol is a whole dim of some graph input.
#include <map>

#include "kiln/ir/weight_program.h"
#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"

namespace kiln::passes {
namespace {

// The static value of an integer tensor known as dims; nullopt when any element is symbolic or
// the value's shape does not fit the element count.
std::optional<Tensor> StaticShapeTensor(const Value* v, const std::vector<Dim>& dims) {
  if (v->dtype() != DataType::kInt64 && v->dtype() != DataType::kInt32) return std::nullopt;
  if (!v->has_shape() || v->shape().size() > 1) return std::nullopt;
  std::vector<int64_t> values;
  for (const Dim& d : dims) {
    if (!d.is_static()) return std::nullopt;
    values.push_back(d.value());
  }
  std::vector<int64_t> tdims;
  if (v->shape().size() == 1) {
    tdims.push_back(static_cast<int64_t>(values.size()));
    if (!(v->shape()[0] == Dim(tdims[0]))) return std::nullopt;
  } else if (values.size() != 1) {
    return std::nullopt;
  }
  Tensor t = Tensor::FromVector<int64_t>(DataType::kInt64, tdims, values);
  if (v->dtype() == DataType::kInt32) t = t.CastTo(DataType::kInt32);
  return t;
}

class ShapeSimplificationPass final : public Pass {
 public:
  std::string_view name() const override { return "shape_simplification"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    for (Node* node : graph.nodes()) {
      if (node->is_dead() || node->num_outputs() == 0) continue;
      // Every output must become a constant, or the node has to stay anyway.
      std::vector<std::optional<Tensor>> folded;
      bool all = true;
      for (Value* out : node->outputs()) {
        if (!out) {
          folded.emplace_back();
          continue;
        }
        std::optional<Tensor> t;
        if (const std::vector<Dim>* dv = ctx.dims_value(out)) t = StaticShapeTensor(out, *dv);
        if (!t && IsOp(*node, OpType::kShape)) t = StaticShapeOf(*node);
        if (!t) {
          all = false;
          break;
        }
        folded.push_back(std::move(t));
      }
      if (!all) continue;
      std::vector<Value*> outs = node->outputs();
      graph.RemoveNode(node);
      for (size_t i = 0; i < outs.size(); ++i) {
        if (!outs[i]) continue;
        outs[i]->set_constant(std::move(*folded[i]));
        outs[i]->set_provenance(LiteralExpr(*outs[i]->constant()));  // a static shape
      }
      ctx.stats().rewrites += 1;
      ctx.stats().nodes_removed += 1;
    }
    DetachShapes(graph, ctx);
    return OkStatus();
  }

 private:
  struct Detacher {
    Graph& graph;
    std::map<std::string, std::pair<Value*, int64_t>> symbols;  // symbol -> (input, axis)
    std::map<Value*, Value*> input_shapes;
    std::map<std::string, Value*> symbol_values;

    Value* Literal(int64_t v) {
      return AddLiteralConstant(graph, "shape_dim",
                                Tensor::FromVector<int64_t>(DataType::kInt64, {1}, {v}));
    }
    Value* Node1(const std::string& op, std::vector<Value*> in, AttributeMap attrs = {}) {
      Value* out = graph.AddValue(graph.UniqueName("shape_" + op), DataType::kInt64);
      graph.AddNode(op, graph.UniqueName("shape_" + op), std::move(in), {out}, std::move(attrs));
      return out;
    }
    Value* Symbol(const std::string& name) {
      if (auto it = symbol_values.find(name); it != symbol_values.end()) return it->second;
      auto [input, axis] = symbols.at(name);
      Value*& shape = input_shapes[input];
      if (!shape) shape = Node1("Shape", {input});
      AttributeMap a;
      a.Set("axis", int64_t{0});
      Value* v = Node1("Gather", {shape, Literal(axis)}, std::move(a));
      symbol_values[name] = v;
      return v;
    }
    // A [1] tensor holding `d`; nullptr when a symbol is not a graph input's dim.
    Value* DimValue(const Dim& d) {
      if (d.is_static()) return Literal(d.value());
      Value* sum = nullptr;
      for (const auto& [monomial, coeff] : d.terms()) {
        Value* term = monomial.empty() || coeff != 1 ? Literal(coeff) : nullptr;
        for (const std::string& sym : monomial) {
          if (!symbols.count(sym)) return nullptr;
          Value* s = Symbol(sym);
          term = term ? Node1("Mul", {term, s}) : s;
        }
        sum = sum ? Node1("Add", {sum, term}) : term;
      }
      return sum ? sum : Literal(0);
    }
  };

  static bool Expressible(const Dim& d, const Detacher& det) {
    if (d.is_static()) return true;
    for (const auto& [monomial, coeff] : d.terms()) {
      for (const std::string& sym : monomial) {
        if (!det.symbols.count(sym)) return false;
      }
    }
    return true;
  }

  static void DetachShapes(Graph& graph, PassContext& ctx) {
    Detacher det{graph, {}, {}, {}};
    for (Value* in : graph.inputs()) {
      if (!in->has_shape()) continue;
      for (size_t k = 0; k < in->shape().size(); ++k) {
        const Dim& d = in->shape()[k];
        if (d.is_static()) continue;
        Dim::Terms t = d.terms();
        if (t.size() == 1 && t[0].first.size() == 1 && t[0].second == 1) {
          det.symbols.emplace(t[0].first[0], std::make_pair(in, static_cast<int64_t>(k)));
        }
      }
    }
    if (det.symbols.empty()) return;
    for (Node* node : graph.nodes()) {
      if (node->is_dead() || !IsOp(*node, OpType::kShape)) continue;
      Value* v = node->input(0);
      Value* out = node->output(0);
      if (!v || !out || !v->has_shape() || !v->producer() || v->is_constant()) continue;
      const int64_t rank = static_cast<int64_t>(v->shape().size());
      int64_t start = attrs::Shape::start(*node);
      int64_t end = node->attrs().GetInt("end", rank);
      if (start < 0) start += rank;
      if (end < 0) end += rank;
      start = std::clamp<int64_t>(start, 0, rank);
      end = std::clamp<int64_t>(end, start, rank);
      Shape dims(v->shape().begin() + start, v->shape().begin() + end);
      if (dims.empty() || IsStatic(dims)) continue;  // folded above
      bool ok = true;
      for (const Dim& d : dims) ok = ok && Expressible(d, det);
      if (!ok) continue;
      std::vector<Value*> parts;
      for (const Dim& d : dims) parts.push_back(det.DimValue(d));
      const std::string name = node->name();
      graph.RemoveNode(node);
      AttributeMap a;
      a.Set("axis", int64_t{0});
      graph.AddNode("Concat", graph.UniqueName(name + "_dims"), std::move(parts), {out},
                    std::move(a));
      ctx.stats().rewrites += 1;
    }
  }

  // Shape(x) of a fully static x (for shape rules that do not record a dims-value).
  static std::optional<Tensor> StaticShapeOf(const Node& node) {
    Value* in = node.input(0);
    if (!in || !in->has_shape()) return std::nullopt;
    auto dims = StaticDims(in->shape());
    if (!dims) return std::nullopt;
    int64_t rank = static_cast<int64_t>(dims->size());
    int64_t start = attrs::Shape::start(node);
    int64_t end = node.attrs().GetInt("end", rank);
    if (start < 0) start += rank;
    if (end < 0) end += rank;
    start = std::clamp<int64_t>(start, 0, rank);
    end = std::clamp<int64_t>(end, start, rank);
    std::vector<int64_t> values(dims->begin() + start, dims->begin() + end);
    return Tensor::FromVector<int64_t>(DataType::kInt64, {static_cast<int64_t>(values.size())},
                                       values);
  }
};

}  // namespace

std::unique_ptr<Pass> MakeShapeSimplificationPass() {
  return std::make_unique<ShapeSimplificationPass>();
}

}  // namespace kiln::passes
