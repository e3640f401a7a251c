// Q/K/V projection fusion: an Attention that reads its heads in place (layout bsd, see
// attention_layout.cc) whose Q, K and V come from three FusedMatMuls (or bias-less MatMuls) of one
// input with constant weights of one shape (BERT: query/key/value Linear layers; not GQA, whose K
// and V are narrower) gets one FusedMatMul with the weights and biases
// concatenated, [K, 3N], whose output it reads with qkv_packed (Q, K, V side by side in each row).
// One wide GEMM instead of three narrow ones: fewer launches and better tensor-core occupancy,
// the layout GPT-2 exports natively (c_attn). Runs after gemm_fusion has made the FusedMatMuls.
#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"
#include "kiln/passes/projection_concat.h"

namespace kiln::passes {
namespace {

class QkvFusionPass final : public Pass {
 public:
  std::string_view name() const override { return "qkv_fusion"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
    int fused = 0;
    for (Node* attn : order) {
      if (attn->is_dead() || !IsOp(*attn, OpType::kAttention)) continue;
      if (attrs::Attention::layout(*attn) != "bsd" || attrs::Attention::qkv_packed(*attn) != 0) {
        continue;
      }
      fused += Rewrite(graph, ctx, attn) ? 1 : 0;
    }
    if (fused > 0) {
      ctx.stats().notes.push_back(fmt::format(
          "{} attention layer(s) take Q, K and V from one projection of 3x the width", fused));
    }
    return OkStatus();
  }

 private:
  static bool Rewrite(Graph& graph, PassContext& ctx, Node* attn) {
    const Node* p[3];
    for (int i = 0; i < 3; ++i) {
      if (!attn->input(i) || !(p[i] = ConstantProjection(attn->input(i), attn))) return false;
    }
    if (p[0] == p[1] || p[1] == p[2] || p[0] == p[2]) return false;
    Value* qkv = ConcatProjections(graph, p, "_qkv");
    if (!qkv) return false;
    for (int i = 0; i < 3; ++i) graph.SetInput(attn, i, qkv);
    AttributeMap attrs = attn->attrs();
    attrs.Set("qkv_packed", int64_t{1});
    attn->mutable_attrs() = std::move(attrs);
    ctx.stats().rewrites += 1;
    ctx.stats().nodes_added += 1;
    return true;  // the three projections are dead now; dead-node elimination removes them
  }
};

}  // namespace

std::unique_ptr<Pass> MakeQkvFusionPass() { return std::make_unique<QkvFusionPass>(); }

}  // namespace kiln::passes
