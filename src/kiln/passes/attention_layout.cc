// Attention head layout: exporters split heads around attention with copies,
//   x [B, S, H*D] -> Reshape [B, S, H, D] -> Transpose(0, 2, 1, 3) -> [B, H, S, D]   (Q, K, V)
//   Attention -> [B, H, S, Dv] -> Transpose(0, 2, 1, 3) -> Reshape [B, S, H*Dv]       (Y)
// Kiln's Attention reads and writes the interleaved layouts directly (strides, no copies), so
// this pass hands it the values before the split and after the merge: layout "bsd" (rank 3,
// num_heads) when every operand's Reshape can go too, else "bshd" (rank 4) when only the
// Transposes can. Runs after attention_fusion; the bypassed Reshape/Transpose nodes are left for
// dead-node elimination (they stay where something else still reads them).
#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"
#include "kiln/passes/pattern.h"

namespace kiln::passes {
namespace {

bool IsHeadSwap(const Node* n) {
  if (!n || !IsOp(*n, OpType::kTranspose)) return false;
  std::vector<int64_t> p = attrs::Transpose::perm(*n);
  return p == std::vector<int64_t>{0, 2, 1, 3};
}

bool StaticDim(const Dim& d, int64_t& out) {
  if (!d.is_static()) return false;
  out = d.value();
  return true;
}

// [B, S, E] -> Reshape -> [B, S, H, D] with E = H * D: the rank-3 source, else nullptr.
Value* PackedSource(Value* split) {
  Node* r = split->producer();
  if (!r || !IsOp(*r, OpType::kReshape)) return nullptr;
  Value* x = r->input(0);
  if (!x || !x->has_shape() || !split->has_shape()) return nullptr;
  const Shape& xs = x->shape();
  const Shape& s = split->shape();
  int64_t e = 0, h = 0, d = 0;
  if (xs.size() != 3 || s.size() != 4 || !StaticDim(xs[2], e) || !StaticDim(s[2], h) ||
      !StaticDim(s[3], d)) {
    return nullptr;
  }
  if (!(xs[0] == s[0]) || !(xs[1] == s[1]) || e != h * d) return nullptr;
  return x;
}

// Q, K, V as outputs 0, 1, 2 of one Split of X [B, S, 3E] into equal thirds along the last axis
// (GPT-2's c_attn output): X, which Attention reads with qkv_packed; else nullptr.
Value* SplitSource(Value* const packed[3], const PassContext& ctx) {
  Node* s = packed[0]->producer();
  if (!s || !IsOp(*s, OpType::kSplit) || s->num_outputs() != 3) return nullptr;
  for (int i = 0; i < 3; ++i) {
    if (packed[i]->producer() != s || s->output(i) != packed[i]) return nullptr;
  }
  Value* x = s->input(0);
  int64_t e3 = 0;
  if (!x || !x->has_shape() || x->shape().size() != 3 || !StaticDim(x->shape()[2], e3) ||
      e3 % 3 != 0) {
    return nullptr;
  }
  int64_t axis = attrs::Split::axis(*s);
  if (axis != -1 && axis != 2) return nullptr;
  std::vector<int64_t> sizes;
  if (s->num_inputs() > 1 && s->input(1)) {
    const Value* sv = s->input(1);
    if (sv->is_constant()) {
      sizes = sv->constant()->ToInt64Vector();
    } else if (const std::vector<Dim>* dv = ctx.dims_value(sv)) {
      for (const Dim& d : *dv) {
        if (!d.is_static()) return nullptr;
        sizes.push_back(d.value());
      }
    } else {
      return nullptr;
    }
  } else if (s->attrs().Has("split")) {
    sizes = s->attrs().GetInts("split");
  }
  if (!sizes.empty() && sizes != std::vector<int64_t>{e3 / 3, e3 / 3, e3 / 3}) return nullptr;
  return x;
}

// The sole reader of `v` when it is one node of `op` and `v` is not a graph output.
Node* SoleConsumer(const Value* v, std::string_view op) {
  if (v->is_graph_output() || v->consumers().size() != 1) return nullptr;
  Node* c = v->consumers()[0];
  return c->op_type() == op ? c : nullptr;
}

class AttentionLayoutPass final : public Pass {
 public:
  std::string_view name() const override { return "attention_layout"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
    int bsd = 0, bshd = 0;
    for (Node* node : order) {
      if (node->is_dead() || !IsOp(*node, OpType::kAttention)) continue;
      if (attrs::Attention::layout(*node) != "bhsd") continue;
      if (std::string_view l = Rewrite(graph, ctx, node); l == "bsd") {
        ++bsd;
      } else if (l == "bshd") {
        ++bshd;
      }
    }
    if (bsd + bshd > 0) {
      ctx.stats().notes.push_back(fmt::format(
          "{} attention layer(s) read the heads in place ({} as [B, S, H*D], {} as [B, S, H, D]): "
          "no head split/merge copies",
          bsd + bshd, bsd, bshd));
    }
    return OkStatus();
  }

 private:
  // The layout given to `attn`, or "" when it stays as it is.
  static std::string_view Rewrite(Graph& graph, PassContext& ctx, Node* attn) {
    // Q, K, V: each the output of Transpose(0, 2, 1, 3) of a [B, S, H, D] value.
    Value* split[3];
    Value* packed[3];
    bool all_packed = true;
    for (int i = 0; i < 3; ++i) {
      Value* in = attn->input(i);
      if (!in || !in->has_shape() || in->shape().size() != 4 || !IsHeadSwap(in->producer())) {
        return "";
      }
      split[i] = in->producer()->input(0);
      if (!split[i] || !split[i]->has_shape() || split[i]->shape().size() != 4) return "";
      packed[i] = PackedSource(split[i]);
      all_packed = all_packed && packed[i] != nullptr;
    }
    // Y: read only by Transpose(0, 2, 1, 3), whose output only a Reshape to [B, S, H*Dv] reads.
    Value* y = attn->output(0);
    Node* merge = SoleConsumer(y, "Transpose");
    if (!merge || !IsHeadSwap(merge)) return "";
    Value* z = merge->output(0);  // [B, S, H, Dv]
    Node* flatten = SoleConsumer(z, "Reshape");
    Value* w = flatten ? flatten->output(0) : nullptr;
    if (w) {
      int64_t e = 0, h = 0, dv = 0;
      const bool fits = z->has_shape() && w->has_shape() && z->shape().size() == 4 &&
                        w->shape().size() == 3 && StaticDim(w->shape()[2], e) &&
                        StaticDim(z->shape()[2], h) && StaticDim(z->shape()[3], dv) &&
                        e == h * dv && w->shape()[0] == z->shape()[0] &&
                        w->shape()[1] == z->shape()[1];
      if (!fits) w = nullptr;
    }
    bool use_bsd = all_packed && w != nullptr;
    int64_t heads = 0;
    if (!StaticDim(split[0]->shape()[2], heads)) return "";

    AttributeMap attrs = attn->attrs();
    attrs.Set("layout", std::string(use_bsd ? "bsd" : "bshd"));
    if (use_bsd) attrs.Set("num_heads", heads);
    std::vector<Value*> inputs;
    Value* qkv = use_bsd ? SplitSource(packed, ctx) : nullptr;
    if (qkv) attrs.Set("qkv_packed", int64_t{1});
    for (int i = 0; i < 3; ++i) inputs.push_back(qkv ? qkv : use_bsd ? packed[i] : split[i]);
    if (attn->input(3)) inputs.push_back(attn->input(3));
    Value* out = use_bsd ? w : z;
    std::string name = attn->name();
    // The new node writes the merged value itself (its name may be a graph output's).
    if (use_bsd) {
      graph.RemoveNode(flatten);
      ctx.stats().nodes_removed += 1;
    }
    graph.RemoveNode(merge);
    graph.RemoveNode(attn);
    graph.AddNode("Attention", graph.UniqueName(name + (use_bsd ? "_bsd" : "_bshd")),
                  std::move(inputs), {out}, std::move(attrs));
    ctx.stats().nodes_removed += 1;  // attention replaced one for one; the merge Transpose went
    ctx.stats().rewrites += 1;
    return use_bsd ? "bsd" : "bshd";
  }
};

}  // namespace

std::unique_ptr<Pass> MakeAttentionLayoutPass() { return std::make_unique<AttentionLayoutPass>(); }

}  // namespace kiln::passes
