// Transposes of the leading axes move above row-wise products to meet another Transpose.
//
// A product applied to each row of its input (Gemm or MatMul by a rank-2 weight, on the rows of
// a Reshape to [M, K]) commutes with any permutation of the rows. Sequence-first attention
// blocks (nn.MultiheadAttention, batch_first modules included) end with
//   Transpose(Y, p1) -> Reshape [S*B, E] -> Gemm -> Reshape [S, B, E] -> Transpose(1, 0, 2)
// and the last Transpose can as well come before the product, where it composes with the first:
//   Transpose(Y, p2 . p1) -> Reshape [B*S, E] -> Gemm -> Reshape [B, S, E]
// one Transpose fewer, and a layout the attention can write in place (attention_layout).
//
// The rewrite applies to
//   T = Transpose(Reshape(G(Reshape(U, [M, K]), ...), lead ++ [N]), p)
// where p keeps the last axis, lead is U's leading dims (the rest of U's dims make K), each
// intermediate value is read by the next node alone, and U is itself made by a Transpose (so the
// moved one merges with it: the rewrite never adds a Transpose).
#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"

namespace kiln::passes {
namespace {

// Gemm, FusedGemm, MatMul or FusedMatMul of a rank-2 A (not transposed) by a rank-2 B.
bool IsRowProduct(const Node& g) {
  const bool gemm = IsOp(g, OpType::kGemm) || IsOp(g, OpType::kFusedGemm);
  const bool fused = IsOp(g, OpType::kFusedMatMul);
  if (!gemm && !fused && !IsOp(g, OpType::kMatMul)) return false;
  if (IsOp(g, OpType::kGemm) && attrs::Gemm::transA(g) != 0) return false;
  if (IsOp(g, OpType::kFusedGemm) && attrs::FusedGemm::transA(g) != 0) return false;
  if (fused && attrs::FusedMatMul::transA(g) != 0) return false;
  const Value* a = g.input(0);
  const Value* b = g.input(1);
  if (!a || !b || !a->has_shape() || !b->has_shape()) return false;
  if (a->shape().size() != 2 || b->shape().size() != 2) return false;
  // A bias must be per column (Gemm's C may be [M, N] or [M, 1]: rows would move with it).
  if (g.num_inputs() > 2 && g.input(2)) {
    const Value* c = g.input(2);
    if (!c->has_shape()) return false;
    const Shape& cs = c->shape();
    if (cs.size() == 2 && !(cs[0].is_static() && cs[0].value() == 1)) return false;
    if (cs.size() > 2) return false;
  }
  return true;
}

class RowTransposePass final : public Pass {
 public:
  std::string_view name() const override { return "row_transpose"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
    int moved = 0;
    for (Node* t : order) {
      if (!t->is_dead() && IsOp(*t, OpType::kTranspose) && Rewrite(graph, t)) ++moved;
    }
    if (moved > 0) {
      ctx.stats().rewrites += moved;
      ctx.stats().notes.push_back(fmt::format(
          "{} Transpose(s) of the rows moved above a row-wise product to merge with another",
          moved));
    }
    return OkStatus();
  }

 private:
  static bool Rewrite(Graph& graph, Node* t) {
    Value* z2 = t->input(0);
    Value* out = t->output(0);
    if (!z2 || !out || !z2->has_shape() || !out->has_shape()) return false;
    const size_t r = z2->shape().size();
    std::vector<int64_t> perm = attrs::Transpose::perm(*t);
    if (r < 2 || perm.size() != r || perm.back() != static_cast<int64_t>(r) - 1) return false;
    Node* r2 = z2->producer();
    if (!r2 || !IsOp(*r2, OpType::kReshape) || !ReadOnlyBy(z2, t)) return false;
    Value* gy = r2->input(0);
    Node* g = gy ? gy->producer() : nullptr;
    if (!g || !IsRowProduct(*g) || !ReadOnlyBy(gy, r2) || g->output(0) != gy) return false;
    Value* a = g->input(0);
    Node* r1 = a->producer();
    if (!r1 || !IsOp(*r1, OpType::kReshape) || !ReadOnlyBy(a, g)) return false;
    Value* u = r1->input(0);
    if (!u || !u->has_shape() || !u->producer() || !IsOp(*u->producer(), OpType::kTranspose)) {
      return false;
    }
    const Shape& us = u->shape();
    const Shape& zs = z2->shape();
    if (us.size() < r) return false;  // U: lead (r - 1 dims) ++ tail (at least one)
    for (size_t k = 0; k + 1 < r; ++k) {
      if (!(us[k] == zs[k])) return false;
    }
    if (!a->has_shape() || !FitsShapeConstant(out->shape()) || !FitsShapeConstant(a->shape())) {
      return false;
    }
    Value* row_shape = AddShapeConstant(graph, "row_shape", out->shape());
    Value* flat_shape = AddShapeConstant(graph, "row_shape", a->shape());
    std::vector<int64_t> ext(perm.begin(), perm.end() - 1);
    for (size_t k = r - 1; k < us.size(); ++k) ext.push_back(static_cast<int64_t>(k));
    AttributeMap tattrs;
    tattrs.Set("perm", ext);
    Value* ut = graph.AddValue(graph.UniqueName(u->name() + "_rows"), u->dtype());
    graph.AddNode("Transpose", graph.UniqueName(t->name() + "_rows"), {u}, {ut}, tattrs);
    Value* at = graph.AddValue(graph.UniqueName(a->name() + "_rows"), a->dtype());
    graph.AddNode("Reshape", graph.UniqueName(r1->name() + "_rows"), {ut, flat_shape}, {at});
    std::vector<Value*> gin;
    for (size_t i = 0; i < g->num_inputs(); ++i) gin.push_back(i == 0 ? at : g->input(i));
    Value* gt = graph.AddValue(graph.UniqueName(gy->name() + "_rows"), gy->dtype());
    graph.AddNode(g->op_type(), graph.UniqueName(g->name() + "_rows"), std::move(gin), {gt},
                  g->attrs(), g->domain());
    graph.RemoveNode(t);  // the new Reshape writes its output
    graph.AddNode("Reshape", graph.UniqueName(r2->name() + "_rows"), {gt, row_shape}, {out});
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> MakeRowTransposePass() { return std::make_unique<RowTransposePass>(); }

}  // namespace kiln::passes
