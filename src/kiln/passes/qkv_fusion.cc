// Q/K/V projection fusion: an Attention that reads its heads in place (layout bsd, see
// attention_layout.cc) whose Q, K and V come from three FusedMatMuls of one input with constant
// weights (BERT: query/key/value Linear layers) gets one FusedMatMul with the weights and biases
// concatenated, [K, 3N], whose output it reads with qkv_packed (Q, K, V side by side in each row).
// One wide GEMM instead of three narrow ones: fewer launches and better tensor-core occupancy,
// the layout GPT-2 exports natively (c_attn). Runs after gemm_fusion has made the FusedMatMuls.
#include <cstring>

#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"

namespace kiln::passes {
namespace {

// The projection writing `v` when it is a FusedMatMul of a non-constant A with a constant f32
// weight (and f32 bias, if any), no activation, read only by `attn`.
const Node* Projection(const Value* v, const Node* attn) {
  const Node* n = v->producer();
  if (!n || !IsOp(*n, OpType::kFusedMatMul) || v->is_graph_output()) return nullptr;
  for (const Node* c : v->consumers()) {
    if (c != attn) return nullptr;
  }
  if (n->attrs().GetString("activation", "") != "" || attrs::FusedMatMul::transA(*n) != 0) {
    return nullptr;
  }
  const Value* a = n->input(0);
  const Value* w = n->input(1);
  if (!a || a->is_constant() || !w || !w->is_constant() ||
      w->constant()->dtype() != DataType::kFloat32 || w->constant()->dims().size() != 2) {
    return nullptr;
  }
  if (n->num_inputs() > 2 && n->input(2)) {
    const Value* b = n->input(2);
    if (!b->is_constant() || b->constant()->dtype() != DataType::kFloat32 ||
        b->constant()->dims().size() != 1) {
      return nullptr;
    }
  }
  return n;
}

class QkvFusionPass final : public Pass {
 public:
  std::string_view name() const override { return "qkv_fusion"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
    int fused = 0;
    for (Node* attn : order) {
      if (attn->is_dead() || !IsOp(*attn, OpType::kAttention)) continue;
      if (attrs::Attention::layout(*attn) != "bsd" ||
          attrs::Attention::qkv_packed(*attn) != 0) {
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
      if (!attn->input(i) || !(p[i] = Projection(attn->input(i), attn))) return false;
    }
    if (p[0] == p[1] || p[1] == p[2] || p[0] == p[2]) return false;
    Value* a = p[0]->input(0);
    const int64_t trans_b = attrs::FusedMatMul::transB(*p[0]);
    const float alpha = attrs::FusedMatMul::alpha(*p[0]);
    const bool bias = p[0]->num_inputs() > 2 && p[0]->input(2);
    const std::vector<int64_t>& wd = p[0]->input(1)->constant()->dims();
    for (int i = 1; i < 3; ++i) {
      const bool has_bias = p[i]->num_inputs() > 2 && p[i]->input(2);
      if (p[i]->input(0) != a || attrs::FusedMatMul::transB(*p[i]) != trans_b ||
          attrs::FusedMatMul::alpha(*p[i]) != alpha || has_bias != bias ||
          p[i]->input(1)->constant()->dims() != wd) {
        return false;
      }
    }
    // W is [K, N] (or [N, K] with transB): concatenate along N.
    const int64_t rows = wd[0], cols = wd[1];
    const int64_t n = trans_b ? rows : cols;
    for (int i = 0; bias && i < 3; ++i) {
      if (p[i]->input(2)->constant()->num_elements() != n) return false;  // nothing changed yet
    }
    Tensor w(DataType::kFloat32,
             trans_b ? std::vector<int64_t>{3 * rows, cols} : std::vector<int64_t>{rows, 3 * cols});
    float* wp = w.mutable_data<float>();
    for (int i = 0; i < 3; ++i) {
      const float* src = p[i]->input(1)->constant()->data<float>();
      if (trans_b) {
        std::memcpy(wp + i * rows * cols, src, sizeof(float) * rows * cols);
      } else {
        for (int64_t r = 0; r < rows; ++r) {
          std::memcpy(wp + r * 3 * cols + i * cols, src + r * cols, sizeof(float) * cols);
        }
      }
    }
    std::vector<Value*> inputs = {
        a, graph.AddConstant(graph.UniqueName(p[0]->name() + "_qkv_weight"), std::move(w))};
    if (bias) {
      Tensor b(DataType::kFloat32, {3 * n});
      for (int i = 0; i < 3; ++i) {
        const Tensor& src = *p[i]->input(2)->constant();
        std::memcpy(b.mutable_data<float>() + i * n, src.data<float>(), sizeof(float) * n);
      }
      inputs.push_back(
          graph.AddConstant(graph.UniqueName(p[0]->name() + "_qkv_bias"), std::move(b)));
    }
    Value* qkv = graph.AddValue(graph.UniqueName(p[0]->name() + "_qkv"), a->dtype());
    graph.AddNode("FusedMatMul", graph.UniqueName(p[0]->name() + "_qkv"), std::move(inputs), {qkv},
                  p[0]->attrs());
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
