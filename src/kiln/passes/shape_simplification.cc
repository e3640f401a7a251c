// Shape-subgraph simplification: exporters compute reshape targets at run time
// (Shape -> Gather/Slice -> Unsqueeze -> Concat -> Reshape). Shape inference already knows those
// small integer tensors as dims-values; every one whose elements are all static becomes a
// constant, and the chain that computed it dies. With symbolic dims only the static parts fold
// (Gather(Shape(x), 2) with a static dim 2 does; Gather(Shape(x), 0) with dim 0 = batch does not).
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
    return OkStatus();
  }

 private:
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
