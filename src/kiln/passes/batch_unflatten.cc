// Batch unflattening: products that exports compute over flattened batch dims (torch.bmm on
// [B*H, S, D] views, GPT-NeoX's baddbmm, OPT's and BLOOM's attention) computed on the operands as
// they were, so that the attention fusion sees MatMul(Q, K^T) of [B, H, S, D] heads:
//
//   MatMul(Reshape(a, [X, m, k]), Reshape(b, [X, k, n]))
//     -> Reshape(MatMul(a, b), [X, m, n])
//   MatMul(Reshape(a, [X, m, k]), Transpose(Reshape(b, [X, n, k]), [0, 2, 1]))
//     -> Reshape(MatMul(a, Transpose(b, last two swapped)), [X, m, n])
//       where a is [B..., m, k] and b [B..., k, n] (or [B..., n, k]) with the same leading dims,
//       whose product is X (static).
//   MatMul(Softmax(Reshape(x, [X, m, k])), B) (the softmax over the last axis) likewise, the
//       Softmax taken of x (OPT and BLOOM take the softmax of the flattened scores)
//   Reshape(op(Reshape(y, s1), c), s2) -> op(Reshape(y, s2), c)
//       op Add, Sub, Mul or Div and c a one-element constant: the two reshapes meet (and vanish
//       when s2 is y's own shape, in identity_elimination).
//   Reshape(Reshape(y, s1), s2) -> Reshape(y, s2)
//   Reshape(y, [X, m, n]) -> chain of Add/Sub/Mul/Div -> Reshape back to y's shape: the chain runs
//       on y (BLOOM adds its ALiBi bias [B*H, 1, S] to the flattened scores)
//   Rows of (position, head) pairs: multi-query attention over [B, S*H, D] (GPT-BigCode), each
//   query head's rows interleaved with the others':
//     MatMul(Reshape(q [B, S, H*D] -> [B, S*H, D]), kt [B, D, Sk]) -> ops by one-element
//     constants -> Reshape [B, S, H, Sk] -> mask ops (Add, Sub, Mul, Div, Where: constant or
//     one-element operands) -> Softmax (last axis) -> Reshape [B, S*H, Sk] ->
//     MatMul(., v [B, Sk, Dv]) -> Reshape [B, S, H*Dv]
//   runs head-major, with one K/V head broadcast over the H query heads:
//     MatMul(Transpose(Reshape(q, [B, S, H, D]), [0, 2, 1, 3]), Reshape(kt, [B, 1, D, Sk])) ->
//     the same ops (each constant operand transposed [0, 2, 1, 3] after padding to rank 4) ->
//     Softmax -> MatMul(., Reshape(v, [B, 1, Sk, Dv])) -> Transpose [0, 2, 1, 3] -> Reshape
//   which the attention fusion takes (and the layout pass reads q in place again).
//
// Each rewritten intermediate is read only by the next step; a Reshape is a view, so the new
// ones cost nothing.
#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"
#include "kiln/passes/pattern.h"

namespace kiln::passes {
namespace {

// A value's shape when known and not following from a shape input's values.
std::optional<Shape> ShapeIf(const Value* v) {
  if (!v || !v->has_shape() || v->value_dependent()) return std::nullopt;
  return v->shape();
}

// `r` = Reshape(x, [X, p, q]) where x is [B..., p, q] with prod(B) = X (symbolic dims compared as
// expressions: X = 8*batch when B = [batch, 8]): x's shape, else nullopt.
std::optional<Shape> LeadingMerge(const Node* r) {
  if (!r || !IsOp(*r, OpType::kReshape)) return std::nullopt;
  auto in = ShapeIf(r->input(0));
  auto out = ShapeIf(r->output(0));
  if (!in || !out || out->size() != 3 || in->size() < 3) return std::nullopt;
  Dim x(1);
  for (size_t i = 0; i + 2 < in->size(); ++i) x = x * (*in)[i];
  if (!(x == (*out)[0]) || !((*in)[in->size() - 2] == (*out)[1]) || !(in->back() == (*out)[2])) {
    return std::nullopt;
  }
  return in;
}

bool LastAxis(const Node& softmax) {
  const Value* x = softmax.input(0);
  const int64_t axis = attrs::Softmax::axis(softmax);
  return x && x->has_shape() && (axis == -1 || axis == static_cast<int64_t>(x->shape().size()) - 1);
}

class BatchUnflattenPass final : public Pass {
 public:
  std::string_view name() const override { return "batch_unflatten"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
    for (Node* n : order) {
      if (n->is_dead()) continue;
      if (IsOp(*n, OpType::kMatMul)) {
        if (!UnflattenRows(graph, ctx, n)) UnflattenProduct(graph, ctx, n);
      } else if (IsOp(*n, OpType::kReshape)) {
        if (!SinkToUnflatten(graph, ctx, n)) MergeReshapes(graph, ctx, n);
      }
      // What a rewrite bypassed goes at once, so that the attention passes later in this round
      // find the scores read by the new chain alone.
      RemoveUnread(graph, ctx, bypassed_);
      bypassed_.clear();
    }
    return OkStatus();
  }

 private:
  std::vector<Node*> bypassed_;  // readers before what they read

  // `v`'s one reader when it reads v once and v is no graph output; nullptr otherwise.
  static Node* OnlyReader(Value* v) {
    if (!v || v->is_graph_output() || v->consumers().size() != 1) return nullptr;
    Node* r = v->consumers().front();
    return ReadOnlyBy(v, r) ? r : nullptr;
  }

  static bool Elementwise(const Node& n) {
    return IsOp(n, OpType::kAdd) || IsOp(n, OpType::kSub) || IsOp(n, OpType::kMul) ||
           IsOp(n, OpType::kDiv);
  }

  static AttributeMap Perm(const std::vector<int64_t>& perm) {
    AttributeMap a;
    a.Set("perm", perm);
    return a;
  }
  static AttributeMap LastAxisAttrs() {
    AttributeMap a;
    a.Set("axis", int64_t{-1});
    return a;
  }

  static bool OneElement(const Value* v) {
    return v && v->is_constant() && v->constant()->num_elements() == 1 &&
           v->constant()->dims().size() <= 1;
  }

  // A new value of `shape` computed by `op` from `ins`.
  static Value* Add(Graph& graph, PassContext& ctx, const std::string& op, const std::string& name,
                    std::vector<Value*> ins, DataType dtype, const Shape& shape,
                    AttributeMap attrs = {}) {
    Value* out = graph.AddValue(graph.UniqueName(name), dtype);
    out->set_shape(shape);
    graph.AddNode(op, graph.UniqueName(name), std::move(ins), {out}, std::move(attrs));
    ctx.stats().nodes_added += 1;
    return out;
  }

  // The multi-query rows rule (the file comment). False when `mm` is not its first product.
  bool UnflattenRows(Graph& graph, PassContext& ctx, Node* mm) {
    static const std::vector<int64_t> kSwap12 = {0, 2, 1, 3};
    Node* ra = ProducerIf(mm->input(0), OpType::kReshape);
    if (!ra || !ReadOnlyBy(mm->input(0), mm)) return false;
    Value* q = ra->input(0);
    auto qs = ShapeIf(q);
    auto rs = ShapeIf(ra->output(0));
    auto kts = ShapeIf(mm->input(1));
    if (!qs || !rs || !kts || qs->size() != 3 || rs->size() != 3 || kts->size() != 3) return false;
    const Dim &b = (*qs)[0], &s = (*qs)[1];
    auto e = (*qs)[2].static_value();
    auto d = (*rs)[2].static_value();
    if (!e || !d || *d <= 0 || *e % *d != 0 || *e / *d < 2) return false;
    const int64_t h = *e / *d;
    if (!((*rs)[0] == b) || !((*rs)[1] == s * Dim(h)) || !((*kts)[1] == Dim(*d))) return false;
    if (!((*kts)[0] == b) && !((*kts)[0] == Dim(1))) return false;
    const Dim sk = (*kts)[2];
    // Scores [B, S*H, Sk] -> ops by one-element constants -> Reshape [B, S, H, Sk].
    std::vector<Node*> pre;
    Value* v = mm->output(0);
    Node* c = OnlyReader(v);
    while (c && Elementwise(*c) && c->num_inputs() == 2 && OneElement(c->input(c->input(0) == v))) {
      pre.push_back(c);
      v = c->output(0);
      c = OnlyReader(v);
    }
    const Shape split = {b, s, Dim(h), sk};
    const Shape heads = {b, Dim(h), s, sk};
    if (!c || !IsOp(*c, OpType::kReshape) || ShapeIf(c->output(0)) != split) return false;
    Node* r1 = c;
    // Mask ops on [B, S, H, Sk], then the Softmax over Sk.
    std::vector<Node*> post;
    v = r1->output(0);
    c = OnlyReader(v);
    while (c && !IsOp(*c, OpType::kSoftmax)) {
      const bool where = IsOp(*c, OpType::kWhere);
      if ((!Elementwise(*c) && !where) || ShapeIf(c->output(0)) != split) return false;
      for (size_t i = 0; i < c->num_inputs(); ++i) {
        const Value* z = c->input(i);
        if (z == v) {
          if (where && i == 0) return false;  // the scores as the condition
          continue;
        }
        if (!z || !z->is_constant() || z->shape().size() > 4) return false;
      }
      post.push_back(c);
      v = c->output(0);
      c = OnlyReader(v);
    }
    if (!c || !LastAxis(*c)) return false;
    Node* sm = c;
    // -> Reshape [B, S*H, Sk] -> MatMul(., v) -> Reshape [B, S, H*Dv].
    Node* r2 = OnlyReader(sm->output(0));
    if (!r2 || !IsOp(*r2, OpType::kReshape)) return false;
    auto r2s = ShapeIf(r2->output(0));
    if (!r2s || r2s->size() != 3 || !((*r2s)[0] == b) || !((*r2s)[1] == (*rs)[1]) ||
        !((*r2s)[2] == sk)) {
      return false;
    }
    Node* mm2 = OnlyReader(r2->output(0));
    if (!mm2 || !IsOp(*mm2, OpType::kMatMul) || mm2->input(0) != r2->output(0)) return false;
    Value* vv = mm2->input(1);
    auto vs = ShapeIf(vv);
    if (!vs || vs->size() != 3 || !((*vs)[1] == sk) || !(*vs)[2].is_static()) return false;
    if (!((*vs)[0] == b) && !((*vs)[0] == Dim(1))) return false;
    const int64_t dv = (*vs)[2].value();
    Node* r3 = OnlyReader(mm2->output(0));
    if (!r3 || !IsOp(*r3, OpType::kReshape)) return false;
    const Shape merged = {b, s, Dim(h * dv)};
    if (ShapeIf(r3->output(0)) != merged) return false;
    const Shape split_out = {b, s, Dim(h), Dim(dv)};
    // Reshape targets (views) first: nothing changes unless all of them exist.
    const Shape q4 = {b, s, Dim(h), Dim(*d)};
    // K as one head: of k itself when kt swaps k's last two axes (the export's key.transpose).
    Node* kt_node = ProducerIf(mm->input(1), OpType::kTranspose);
    const bool k_swapped = kt_node && ShapeIf(kt_node->input(0)).has_value() &&
                           attrs::Transpose::perm(*kt_node) == std::vector<int64_t>{0, 2, 1};
    const Shape k4 =
        k_swapped ? Shape{(*kts)[0], Dim(1), sk, Dim(*d)} : Shape{(*kts)[0], Dim(1), Dim(*d), sk};
    const Shape v4 = {(*vs)[0], Dim(1), sk, Dim(dv)};
    Value* q_target = AddReshapeTarget(graph, ra->name() + "_heads", *qs, q4);
    Value* k_target = AddReshapeTarget(graph, mm->name() + "_kv_head",
                                       k_swapped ? *ShapeIf(kt_node->input(0)) : *kts, k4);
    Value* v_target = AddReshapeTarget(graph, mm2->name() + "_kv_head", *vs, v4);
    Value* o_target = AddReshapeTarget(graph, r3->name() + "_heads", split_out, merged);
    if (!q_target || !k_target || !v_target || !o_target) return false;
    // Each constant mask operand, padded to rank 4 and transposed to head-major.
    // nullptr stands for the chain's value.
    std::vector<std::vector<Value*>> operands;
    Value* prev = r1->output(0);
    for (Node* op : post) {
      std::vector<Value*> ins;
      for (size_t i = 0; i < op->num_inputs(); ++i) {
        Value* z = op->input(i);
        if (z == prev || OneElement(z)) {
          ins.push_back(z == prev ? nullptr : z);
          continue;
        }
        Value* t = DeriveConstant(graph, z->name() + "_heads", std::string(kTransposeBroadcastOp),
                                  Perm(kSwap12), {z});
        if (!t) return false;
        ins.push_back(t);
      }
      operands.push_back(std::move(ins));
      prev = op->output(0);
    }
    const DataType dt = mm->output(0)->dtype();
    Value* qh = Add(graph, ctx, "Reshape", ra->name() + "_heads", {q, q_target}, q->dtype(), q4);
    qh = Add(graph, ctx, "Transpose", ra->name() + "_heads_first", {qh}, q->dtype(),
             {b, Dim(h), s, Dim(*d)}, Perm(kSwap12));
    Value* kh = nullptr;
    if (k_swapped) {
      // kt = Transpose(k [B, Sk, D]): K's head view swapped, which the attention fusion reads as
      // K itself.
      Value* k = kt_node->input(0);
      kh = Add(graph, ctx, "Reshape", mm->name() + "_kv_head", {k, k_target}, k->dtype(), k4);
      kh = Add(graph, ctx, "Transpose", mm->name() + "_kv_head_t", {kh}, k->dtype(),
               {(*kts)[0], Dim(1), Dim(*d), sk}, Perm({0, 1, 3, 2}));
    } else {
      kh = Add(graph, ctx, "Reshape", mm->name() + "_kv_head", {mm->input(1), k_target},
               mm->input(1)->dtype(), k4);
    }
    Value* cur = Add(graph, ctx, "MatMul", mm->name() + "_heads", {qh, kh}, dt, heads);
    prev = mm->output(0);
    for (Node* op : pre) {
      const int zi = op->input(0) == prev ? 1 : 0;  // the one-element constant's place
      Value* z = op->input(zi);
      std::vector<Value*> ins = zi == 1 ? std::vector<Value*>{cur, z} : std::vector<Value*>{z, cur};
      prev = op->output(0);
      cur = Add(graph, ctx, std::string(op->op_type()), op->name() + "_heads", ins, dt, heads);
    }
    for (size_t k = 0; k < post.size(); ++k) {
      std::vector<Value*> ins = operands[k];
      for (Value*& z : ins) {
        if (!z) z = cur;
      }
      cur = Add(graph, ctx, std::string(post[k]->op_type()), post[k]->name() + "_heads", ins, dt,
                heads);
    }
    cur = Add(graph, ctx, "Softmax", sm->name() + "_heads", {cur}, dt, heads, LastAxisAttrs());
    Value* vh =
        Add(graph, ctx, "Reshape", mm2->name() + "_kv_head", {vv, v_target}, vv->dtype(), v4);
    cur = Add(graph, ctx, "MatMul", mm2->name() + "_heads", {cur, vh}, dt, {b, Dim(h), s, Dim(dv)});
    cur = Add(graph, ctx, "Transpose", mm2->name() + "_positions_first", {cur}, dt, split_out,
              Perm(kSwap12));
    Value* out = r3->output(0);
    const std::string name = r3->name();
    graph.RemoveNode(r3);
    graph.AddNode("Reshape", graph.UniqueName(name + "_heads"), {cur, o_target}, {out});
    ctx.stats().nodes_added += 1;
    bypassed_.insert(bypassed_.end(), {mm2, r2, sm});
    for (auto it = post.rbegin(); it != post.rend(); ++it) bypassed_.push_back(*it);
    bypassed_.push_back(r1);
    for (auto it = pre.rbegin(); it != pre.rend(); ++it) bypassed_.push_back(*it);
    bypassed_.insert(bypassed_.end(), {mm, ra});
    if (k_swapped) bypassed_.push_back(kt_node);
    ctx.stats().rewrites += 1;
    return true;
  }

  void UnflattenProduct(Graph& graph, PassContext& ctx, Node* mm) {
    // A: a leading-merge Reshape, or a Softmax over the last axis of one (OPT and BLOOM take the
    // softmax of the flattened scores), which then runs on the unflattened scores.
    Node* sm = ProducerIf(mm->input(0), OpType::kSoftmax);
    if (sm && !(ReadOnlyBy(sm->output(0), mm) && LastAxis(*sm))) return;
    Node* ra = ProducerIf(sm ? sm->input(0) : mm->input(0), OpType::kReshape);
    auto a = LeadingMerge(ra);
    if (!a || mm->output(0)->is_graph_output()) return;
    if (sm && !ReadOnlyBy(ra->output(0), sm)) return;
    // B: a leading-merge Reshape, or the swap of the last two axes of one.
    Value* rb_out = mm->input(1);
    Node* t = ProducerIf(rb_out, OpType::kTranspose);
    if (t) {
      const std::vector<int64_t> p = attrs::Transpose::perm(*t);
      if (p != std::vector<int64_t>{0, 2, 1}) return;
      rb_out = t->input(0);
    }
    Node* rb = ProducerIf(rb_out, OpType::kReshape);
    auto b = LeadingMerge(rb);
    if (!b || b->size() != a->size() || !std::equal(a->begin(), a->end() - 2, b->begin())) return;
    const size_t rank = a->size();
    // [.., m, k] x [.., k, n] (or [.., n, k] transposed).
    if (!((t ? b->back() : (*b)[rank - 2]) == a->back())) return;
    auto flat = ShapeIf(mm->output(0));
    if (!flat || flat->size() != 3) return;
    Shape y_shape = *a;
    y_shape.back() = t ? (*b)[rank - 2] : b->back();
    // The flattened product either meets a Reshape back to the unflattened shape through a chain
    // of elementwise ops (rewritten here, any dims), or keeps a Reshape view of a literal target
    // (static dims but one).
    const Chain chain = FindChainBack(mm->output(0), y_shape, (*flat)[0]);
    if (!chain.back && !FitsShapeConstant(*flat)) return;
    Value* bv = rb->input(0);
    if (t) {
      std::vector<int64_t> swap(rank);
      for (size_t i = 0; i < rank; ++i) swap[i] = static_cast<int64_t>(i);
      std::swap(swap[rank - 1], swap[rank - 2]);
      Value* bt = graph.AddValue(graph.UniqueName(bv->name() + "_t"), bv->dtype());
      Shape bt_shape = *b;
      std::swap(bt_shape[rank - 1], bt_shape[rank - 2]);
      bt->set_shape(bt_shape);
      AttributeMap ta;
      ta.Set("perm", swap);
      graph.AddNode("Transpose", graph.UniqueName(t->name() + "_unflattened"), {bv}, {bt},
                    std::move(ta));
      bv = bt;
      ctx.stats().nodes_added += 1;
    }
    Value* av = ra->input(0);
    if (sm) {
      Value* p = graph.AddValue(graph.UniqueName(sm->output(0)->name() + "_unflattened"),
                                sm->output(0)->dtype());
      p->set_shape(*a);
      AttributeMap last;
      last.Set("axis", int64_t{-1});
      graph.AddNode("Softmax", graph.UniqueName(sm->name() + "_unflattened"), {av}, {p},
                    std::move(last));
      av = p;
      ctx.stats().nodes_added += 1;
    }
    Value* y = graph.AddValue(graph.UniqueName(mm->output(0)->name() + "_unflattened"),
                              mm->output(0)->dtype());
    // Shaped now: what follows merges in this round (before gemm_fusion, later in the round,
    // takes a product this rewrite leads to the attention fusion).
    y->set_shape(y_shape);
    graph.AddNode("MatMul", graph.UniqueName(mm->name() + "_unflattened"), {av, bv}, {y});
    ctx.stats().nodes_added += 1;
    if (chain.back) {
      RunChainOn(graph, ctx, y, chain, mm->output(0), y_shape);
      bypassed_.push_back(mm);
    } else {
      Value* target = AddShapeConstant(graph, mm->name() + "_flat", *flat);
      Value* out = mm->output(0);
      const std::string name = mm->name();
      graph.RemoveNode(mm);
      graph.AddNode("Reshape", graph.UniqueName(name + "_flat"), {y, target}, {out});
      ctx.stats().nodes_added += 1;
    }
    if (t) bypassed_.push_back(t);
    if (sm) bypassed_.push_back(sm);
    bypassed_.insert(bypassed_.end(), {ra, rb});
    ctx.stats().rewrites += 1;
  }

  // A chain from a flattened value [X, m, n] of y [B..., m, n]: elementwise ops (Add, Sub, Mul,
  // Div; each read only by the next; the other operand z of rank <= 3 with a leading dim of X (a
  // Reshape gives it y's leading dims; static dims but one), 1 or none, broadcasting into the
  // value) ending in a Reshape back to y's shape. `back` null when there is none.
  struct Chain {
    std::vector<Node*> ops;
    Node* back = nullptr;
  };
  static Chain FindChainBack(Value* flat, const Shape& y, const Dim& x) {
    Chain chain;
    const Shape lead(y.begin(), y.end() - 2);
    Value* v = flat;
    while (!v->is_graph_output() && v->consumers().size() == 1) {
      Node* c = v->consumers().front();
      if (IsOp(*c, OpType::kReshape)) {
        if (c->input(0) == v && ShapeIf(c->output(0)) == y) chain.back = c;
        break;
      }
      if (!Elementwise(*c) || c->num_inputs() != 2 || c->input(0) == c->input(1)) break;
      auto zd = ShapeIf(c->input(c->input(0) == v ? 1 : 0));
      if (!zd || zd->size() > 3 || ShapeIf(c->output(0)) != ShapeIf(v)) break;
      if (zd->size() == 3 && !(zd->front() == Dim(1))) {
        Shape to = lead;
        to.insert(to.end(), zd->begin() + 1, zd->end());
        if (!(zd->front() == x) || !FitsShapeConstant(to)) break;
      }
      chain.ops.push_back(c);
      v = c->output(0);
    }
    if (chain.back && (chain.back->output(0)->is_graph_output() ||
                       chain.back->output(0)->dtype() != flat->dtype())) {
      chain.back = nullptr;
    }
    return chain;
  }

  // The chain's ops on `cur` (y, unflattened) instead of on `flat`; the chain's Reshape back is
  // bypassed (its readers read the last op's result).
  void RunChainOn(Graph& graph, PassContext& ctx, Value* cur, const Chain& chain, Value* flat,
                  const Shape& y) {
    const Shape lead(y.begin(), y.end() - 2);
    Value* prev = flat;
    for (Node* c : chain.ops) {
      const int zi = c->input(0) == prev ? 1 : 0;
      Value* z = c->input(zi);
      const Shape zd = z->shape();
      if (zd.size() == 3 && !(zd.front() == Dim(1))) {
        Shape to = lead;
        to.insert(to.end(), zd.begin() + 1, zd.end());
        Value* target = AddShapeConstant(graph, c->name() + "_operand_shape", to);
        Value* zv = graph.AddValue(graph.UniqueName(z->name() + "_unflattened"), z->dtype());
        zv->set_shape(to);
        graph.AddNode("Reshape", graph.UniqueName(c->name() + "_operand"), {z, target}, {zv});
        ctx.stats().nodes_added += 1;
        z = zv;
      }
      Value* out = graph.AddValue(graph.UniqueName(c->output(0)->name() + "_unflattened"),
                                  c->output(0)->dtype());
      out->set_shape(y);
      std::vector<Value*> ins = zi == 1 ? std::vector<Value*>{cur, z} : std::vector<Value*>{z, cur};
      graph.AddNode(std::string(c->op_type()), graph.UniqueName(c->name() + "_unflattened"), ins,
                    {out});
      ctx.stats().nodes_added += 1;
      prev = c->output(0);
      cur = out;
    }
    graph.ReplaceAllUses(chain.back->output(0), cur);
    bypassed_.push_back(chain.back);
    for (auto it = chain.ops.rbegin(); it != chain.ops.rend(); ++it) bypassed_.push_back(*it);
  }

  // r = Reshape(y, [X, m, n]) (a leading merge of y [B..., m, n]) read by a chain of elementwise
  // ops that ends in a Reshape back to y's shape (FindChainBack): the chain runs on y and the
  // Reshapes go. BLOOM adds its ALiBi bias [B*H, 1, S] to the flattened scores before
  // unflattening them.
  bool SinkToUnflatten(Graph& graph, PassContext& ctx, Node* r) {
    auto y = LeadingMerge(r);
    if (!y) return false;
    const Chain chain = FindChainBack(r->output(0), *y, r->output(0)->shape().front());
    if (!chain.back || chain.ops.empty()) return false;
    RunChainOn(graph, ctx, r->input(0), chain, r->output(0), *y);
    bypassed_.push_back(r);
    ctx.stats().rewrites += 1;
    return true;
  }

  // Reshape(op(Reshape(y, s1), c), s2) -> op(Reshape(y, s2), c); Reshape(Reshape(y, s1), s2) ->
  // Reshape(y, s2).
  void MergeReshapes(Graph& graph, PassContext& ctx, Node* outer) {
    Value* out = outer->output(0);
    Value* in = outer->input(0);
    if (!out || !in || !out->has_shape() || out->value_dependent()) return;
    Node* e = in->producer();
    if (!e) return;
    if (IsOp(*e, OpType::kReshape) || IsOp(*e, OpType::kFlatten)) {
      Value* y = e->input(0);
      if (!ReadOnlyBy(in, outer) || !y || !y->has_shape()) return;
      Value* target = AddReshapeTarget(graph, outer->name() + "_merged", y->shape(), out->shape());
      if (!target) return;
      graph.SetInput(outer, 0, y);
      graph.SetInput(outer, 1, target);
      ctx.stats().rewrites += 1;
      bypassed_.push_back(e);
      return;
    }
    if (!Elementwise(*e) || e->num_inputs() != 2 || !ReadOnlyBy(in, outer)) return;
    Node* inner = ProducerIf(e->input(0), OpType::kReshape);
    if (!OneElement(e->input(1)) || !inner || !ReadOnlyBy(e->input(0), e)) return;
    Value* y = inner->input(0);
    if (!y || !y->has_shape() || y->dtype() != out->dtype()) return;
    Value* reshaped = y;  // the two Reshapes cancel when `out` has y's shape
    if (!(y->shape() == out->shape()) || y->value_dependent()) {
      Value* target = AddReshapeTarget(graph, outer->name() + "_merged", y->shape(), out->shape());
      if (!target) return;
      reshaped = graph.AddValue(graph.UniqueName(y->name() + "_view"), y->dtype());
      reshaped->set_shape(out->shape());
      graph.AddNode("Reshape", graph.UniqueName(outer->name() + "_above"), {y, target}, {reshaped});
      ctx.stats().nodes_added += 1;
    }
    const std::string op(e->op_type());
    const std::string name = e->name();
    Value* cv = e->input(1);
    graph.RemoveNode(outer);
    graph.AddNode(op, graph.UniqueName(name + "_unflattened"), {reshaped, cv}, {out});
    ctx.stats().rewrites += 1;
    bypassed_.insert(bypassed_.end(), {e, inner});
  }
};

}  // namespace

std::unique_ptr<Pass> MakeBatchUnflattenPass() { return std::make_unique<BatchUnflattenPass>(); }

}  // namespace kiln::passes
