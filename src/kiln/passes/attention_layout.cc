// Attention head layout: exporters split heads around attention with copies,
//   x [B, S, H*D] -> Reshape [B, S, H, D] -> Transpose(0, 2, 1, 3) -> [B, H, S, D]   (Q, K, V)
//   Attention -> [B, H, S, Dv] -> Transpose(0, 2, 1, 3) -> Reshape [B, S, H*Dv]       (Y)
// Kiln's Attention reads and writes the interleaved layouts directly (strides, no copies), so
// this pass hands it the values before the split and after the merge: layout "bsd" (rank 3,
// num_heads) when every operand's memory is rows of [B, S, H*D] (or [B, S, 3*H*D] rows of one
// packed projection: qkv_packed), else "bshd" (rank 4) when every operand is a [B, S, H, D]
// value. Runs after attention_fusion; the bypassed nodes are left for dead-node elimination
// (they stay where something else still reads them).
//
// What counts as "the value before the split" is decided by strided-view analysis
// (view_analysis.h), not by matching one exporter's chain: any chain of Reshape, Transpose,
// Squeeze, Unsqueeze, Gather of one index, Slice and Split whose composition reads those rows.
// nn.MultiheadAttention's export (Reshape -> Unsqueeze -> Transpose -> Squeeze -> Gather per
// operand, in sequence-first order) is one such chain. Sequence-first also puts a Transpose of
// the leading axes before the packed in-projection (batch_first modules); a row-wise product
// commutes with it, so when reading the projection's output as if it came after that Transpose
// gives rows of [B, S, 3*H*D], the pass computes the projection on the untransposed input and
// the attention reads that.
#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"
#include "kiln/passes/pattern.h"
#include "kiln/passes/view_analysis.h"

namespace kiln::passes {
namespace {

bool StaticDim(const Dim& d, int64_t& out) {
  if (!d.is_static()) return false;
  out = d.value();
  return true;
}

// True when `view`, an operand [B, H, S, D], reads rows of length `row` of a [B, S, row] source
// ([S, B, row] when seq_first) with its heads side by side in each row, starting `offset`
// elements into each row.
bool ReadsRows(const StridedView& view, const Dim& row, const Dim& offset, bool seq_first) {
  const Shape& s = view.shape;
  if (s.size() != 4) return false;
  const Dim want[4] = {seq_first ? row : s[2] * row, s[3], seq_first ? s[0] * row : row, Dim(1)};
  for (size_t k = 0; k < 4; ++k) {
    if (!HasStride(view, k, want[k])) return false;
  }
  return view.offset == offset;
}

// Where an operand's memory is, as one of the interleaved layouts can read it.
struct Read {
  Value* source = nullptr;     // nullptr with `rows` set: the projection made by the rewrite
  bool packed = false;         // bsd/sbd: rows of 3*H*D, this operand's third
  const Node* rows = nullptr;  // the row-wise product to recompute without its input Transpose
  Shape as;                    // when set, the source's memory read as this shape (a Reshape)
};

Read SourceRead(Value* source) {
  Read r;
  r.source = source;
  return r;
}

struct Reads {
  std::optional<Read> bsd, sbd, bshd;
};

// Grouped-query attention's operand [B, G, R, S, D] (K and V with R = 1): the view reads the
// memory of a [B, S, G, R, D] tensor, which a source [B, S, ...] holds exactly (its projection's
// rows [B, S, G*R*D], or [B, S, H, D]).
void MatchGrouped(const StridedView& view, const Shape& xs, Reads& r, Read read) {
  const Shape& s = view.shape;
  if (r.bshd || xs.size() < 3 || !(xs[0] == s[0]) || !(xs[1] == s[3])) return;
  int64_t g = 0, rep = 0, d = 0;
  if (!StaticDim(s[1], g) || !StaticDim(s[2], rep) || !StaticDim(s[4], d)) return;
  int64_t row = 1;
  for (size_t k = 2; k < xs.size(); ++k) {
    int64_t x = 0;
    if (!StaticDim(xs[k], x)) return;
    row *= x;
  }
  Shape bsgrd{s[0], s[3], s[1], s[2], s[4]};
  if (row != g * rep * d || !IsRowMajor(TransposeView(view, {0, 3, 1, 2, 4}), bsgrd)) return;
  r.bshd = read;
  r.bshd->as = std::move(bsgrd);
}

// Matches one operand view (shape [B, H, S, D], or [B, G, R, S, D]) of a source of shape `xs`.
void Match(const StridedView& view, const Shape& xs, int part, Reads& r, Read read) {
  const Shape& s = view.shape;
  if (s.size() == 5) {
    MatchGrouped(view, xs, r, read);
    return;
  }
  int64_t h = 0, d = 0;
  if (!StaticDim(s[1], h) || !StaticDim(s[3], d)) return;
  const int64_t e = h * d;
  for (bool seq_first : {false, true}) {
    std::optional<Read>& slot = seq_first ? r.sbd : r.bsd;
    if (slot || xs.size() != 3) continue;
    const Dim& batch = seq_first ? xs[1] : xs[0];
    const Dim& seq = seq_first ? xs[0] : xs[1];
    if (!(batch == s[0]) || !(seq == s[2]) || !xs[2].is_static()) continue;
    const int64_t row = xs[2].value();
    if (row == e && ReadsRows(view, row, 0, seq_first)) {
      slot = read;
    } else if (row == 3 * e && ReadsRows(view, row, Dim(part * e), seq_first)) {
      slot = read;
      slot->packed = true;
    }
  }
  if (!r.bshd && xs.size() == 4 && xs[0] == s[0] && xs[1] == s[2] && xs[2] == s[1] &&
      xs[3] == s[3] && ReadsRows(view, Dim(e), 0, false)) {
    r.bshd = read;
  }
}

// A product computed row by row over its input's leading axes: MatMul or FusedMatMul of a
// rank >= 3 input (not transposed) by a rank-2 weight. Its input's Transpose of the leading
// axes could as well come after it.
bool IsRowWiseProduct(const Node& n) {
  const bool fused = IsOp(n, OpType::kFusedMatMul);
  if (!fused && !IsOp(n, OpType::kMatMul)) return false;
  if (fused && attrs::FusedMatMul::transA(n) != 0) return false;
  const Value* a = n.input(0);
  const Value* b = n.input(1);
  if (!a || !b || !a->has_shape() || !b->has_shape()) return false;
  if (a->shape().size() < 3 || b->shape().size() != 2) return false;
  if (fused && n.num_inputs() > 2 && n.input(2) &&
      (!n.input(2)->has_shape() || n.input(2)->shape().size() != 1)) {
    return false;
  }
  return true;
}

// For `p` made by a row-wise product of Transpose(x, perm) with perm keeping the last axis, and
// that Transpose read by the product alone: perm (else empty).
std::vector<int64_t> LeadingTransposeBefore(const Value* p) {
  const Node* g = p->producer();
  if (!g || !IsRowWiseProduct(*g)) return {};
  const Value* t = g->input(0);
  const Node* tn = t->producer();
  if (!tn || !IsOp(*tn, OpType::kTranspose) || t->is_graph_output() || t->consumers().size() != 1) {
    return {};
  }
  std::vector<int64_t> perm = attrs::Transpose::perm(*tn);
  const int64_t rank = static_cast<int64_t>(t->shape().size());
  if (static_cast<int64_t>(perm.size()) != rank || perm.back() != rank - 1) return {};
  return perm;
}

// True when everything that reads `v` is `attn` or a view op whose results only lead there.
bool OnlyFeeds(const Value* v, const Node* attn, int depth = 0) {
  if (v->is_graph_output() || depth > 16) return false;
  for (const Node* c : v->consumers()) {
    if (c == attn) continue;
    if (!ViewInput(*c) || ViewInput(*c) != v) return false;
    for (size_t i = 0; i < c->num_outputs(); ++i) {
      if (c->output(i) && !OnlyFeeds(c->output(i), attn, depth + 1)) return false;
    }
  }
  return true;
}

// The ways operand `part` of `attn` can be read in place.
Reads OperandReads(Value* operand, int part, const Node* attn, const PassContext& ctx) {
  Reads r;
  const size_t rank = operand->has_shape() ? operand->shape().size() : 0;
  if (rank != 4 && rank != 5) return r;
  for (const StridedView& view : ViewsOf(operand, ctx)) {
    Match(view, view.source->shape(), part, r, SourceRead(view.source));
  }
  if (r.bsd || rank == 5) return r;
  // Through the row-wise product at the chain's far end, as if its input Transpose came after.
  ViewChain chain = ViewChainOf(operand);
  const Value* p = chain.values.back();
  std::vector<int64_t> perm = LeadingTransposeBefore(p);
  if (perm.empty() || !p->has_shape() || !OnlyFeeds(p, attn)) return r;
  const Shape& ps = p->shape();
  Shape rows(ps.size());  // the product's output before the Transpose: rows[perm[k]] = ps[k]
  for (size_t k = 0; k < perm.size(); ++k) rows[static_cast<size_t>(perm[k])] = ps[k];
  StridedView start = TransposeView(ContiguousView(rows), perm);
  std::optional<StridedView> view = ApplyChain(chain, chain.values.size() - 1, start, ctx);
  if (view) {
    Reads v;
    Read recompute;
    recompute.rows = p->producer();
    Match(*view, rows, part, v, recompute);
    if (v.bsd) r.bsd = v.bsd;
  }
  return r;
}

// True when everything that reads `v` is an Attention (as Q, K or V) or a view op whose results
// only lead to one.
bool LeadsToAttention(const Value* v, int depth = 0) {
  if (v->is_graph_output() || depth > 16 || v->consumers().empty()) return false;
  for (const Node* c : v->consumers()) {
    if (IsOp(*c, OpType::kAttention)) {
      if (c->num_inputs() > 3 && c->input(3) == v) return false;  // a mask
      continue;
    }
    if (!ViewInput(*c) || ViewInput(*c) != v) return false;
    for (size_t i = 0; i < c->num_outputs(); ++i) {
      if (c->output(i) && !LeadsToAttention(c->output(i), depth + 1)) return false;
    }
  }
  return true;
}

// RotaryEmbedding(Transpose(y, p), cos, sin) => Transpose(RotaryEmbedding(y, cos', sin'), p) when
// p keeps the last axis (the rotation's), the Transpose is read by the rotary alone, and the
// rotary's result leads only to attention: the head split then comes after the rotation, where
// the attention reads through it (Llama's Q and K, rotated between the split and the attention).
// cos' and sin' are the tables padded to y's rank and transposed by p's inverse: a derived
// constant, or for a computed table a Reshape, when that transpose only moves axes of size 1
// ([B, 1, S, D] -> [B, S, 1, D]). The moved Transpose is one copy, as before; the rewrite only
// pays off when the attention then reads y in place.
bool SinkBelowRotary(Graph& graph, PassContext& ctx, Node* rope) {
  if (rope->num_inputs() != 3 || rope->num_outputs() != 1) return false;
  Value* x = rope->input(0);
  Value* out = rope->output(0);
  const Node* t = x ? x->producer() : nullptr;
  if (!t || !IsOp(*t, OpType::kTranspose) || x->is_graph_output() || x->consumers().size() != 1 ||
      !out || !out->has_shape() || !LeadsToAttention(out)) {
    return false;
  }
  Value* y = t->input(0);
  if (!y || !y->has_shape()) return false;
  const size_t rank = y->shape().size();
  std::optional<std::vector<int64_t>> perm = TransposePerm(*t, rank);
  if (!perm || rank < 2 || (*perm)[rank - 1] != static_cast<int64_t>(rank) - 1) return false;
  std::vector<int64_t> inv(rank);
  bool identity = true;
  for (size_t k = 0; k < rank; ++k) {
    inv[static_cast<size_t>((*perm)[k])] = static_cast<int64_t>(k);
    identity = identity && (*perm)[k] == static_cast<int64_t>(k);
  }
  if (identity) return false;
  // Each table's shape against y: padded to the rank, then permuted by p's inverse.
  Shape moved[2];
  for (int i = 0; i < 2; ++i) {
    const Value* c = rope->input(1 + i);
    if (!c || !c->has_shape() || c->shape().size() > rank) return false;
    if (c->is_constant()) continue;
    Shape padded(rank - c->shape().size(), Dim(1));
    padded.insert(padded.end(), c->shape().begin(), c->shape().end());
    moved[i].resize(rank);
    for (size_t j = 0; j < rank; ++j) moved[i][j] = padded[static_cast<size_t>(inv[j])];
    // Only axes of size 1 may move: the other dims keep their order (the same memory).
    auto kept = [](const Shape& sh) {
      Shape o;
      for (const Dim& d : sh) {
        if (!d.is_static() || d.value() != 1) o.push_back(d);
      }
      return o;
    };
    if (!(kept(padded) == kept(moved[i]))) return false;
  }
  Value* tables[2] = {nullptr, nullptr};
  for (int i = 0; i < 2; ++i) {
    Value* c = rope->input(1 + i);
    if (c->is_constant()) {
      AttributeMap a;
      a.Set("perm", inv);
      tables[i] =
          DeriveConstant(graph, c->name() + "_heads", std::string(kTransposeBroadcastOp), a, {c});
    } else if (Value* target =
                   AddReshapeTarget(graph, c->name() + "_heads_shape", c->shape(), moved[i])) {
      tables[i] = graph.AddValue(graph.UniqueName(c->name() + "_heads"), c->dtype());
      graph.AddNode("Reshape", graph.UniqueName(c->name() + "_heads"), {c, target}, {tables[i]});
    }
    if (!tables[i]) return false;  // what was added, unread, goes in dead-node elimination
  }
  const std::string name = rope->name();
  AttributeMap attrs = rope->attrs();
  std::string domain = rope->domain();
  Value* inner = graph.AddValue(graph.UniqueName(out->name() + "_unsplit"), out->dtype());
  inner->set_shape(y->shape());
  graph.RemoveNode(rope);  // releases `out`, which the new Transpose makes
  graph.AddNode("RotaryEmbedding", graph.UniqueName(name), {y, tables[0], tables[1]}, {inner},
                std::move(attrs), std::move(domain));
  AttributeMap t_attrs;
  t_attrs.Set("perm", *perm);
  graph.AddNode("Transpose", graph.UniqueName(name + "_split"), {inner}, {out}, std::move(t_attrs));
  ctx.stats().rewrites += 1;
  return true;
}

// Y's readers: a chain of single-reader Transposes and reshapes, each value read by the next
// alone. For each value z on it, Y as a view of z (Y's elements in z's memory).
struct OutputPlace {
  std::vector<Node*> chain;  // the nodes from Y to `value`
  Value* value = nullptr;
  StridedView view;
};

std::vector<OutputPlace> OutputPlaces(Value* y) {
  std::vector<Node*> chain;
  std::vector<Value*> values{y};
  while (chain.size() < 16) {
    Value* cur = values.back();
    if (cur->is_graph_output() || cur->consumers().size() != 1) break;
    Node* c = cur->consumers()[0];
    const bool invertible = IsOp(*c, OpType::kTranspose) || IsOp(*c, OpType::kReshape) ||
                            IsOp(*c, OpType::kSqueeze) || IsOp(*c, OpType::kUnsqueeze) ||
                            IsOp(*c, OpType::kFlatten);
    if (!invertible || c->input(0) != cur || c->num_outputs() != 1 || !c->output(0) ||
        !c->output(0)->has_shape()) {
      break;
    }
    chain.push_back(c);
    values.push_back(c->output(0));
  }
  std::vector<OutputPlace> places;
  for (size_t k = chain.size(); k >= 1; --k) {  // farthest first
    std::optional<StridedView> view = ContiguousView(values[k]);
    for (size_t m = k; view && m >= 1; --m) {  // undo chain[m - 1]: values[m] -> values[m - 1]
      const Node* c = chain[m - 1];
      if (IsOp(*c, OpType::kTranspose)) {
        const size_t rank = values[m - 1]->shape().size();
        std::optional<std::vector<int64_t>> perm = TransposePerm(*c, rank);
        if (!perm) {
          view.reset();
          break;
        }
        std::vector<int64_t> inverse(rank);
        for (size_t i = 0; i < rank; ++i) {
          inverse[static_cast<size_t>((*perm)[i])] = static_cast<int64_t>(i);
        }
        view = TransposeView(*view, inverse);
      } else {
        view = ReshapeView(*view, values[m - 1]->shape());
      }
    }
    if (view) {
      places.push_back(OutputPlace{
          std::vector<Node*>(chain.begin(), chain.begin() + static_cast<std::ptrdiff_t>(k)),
          values[k], std::move(*view)});
    }
  }
  return places;
}

class AttentionLayoutPass final : public Pass {
 public:
  std::string_view name() const override { return "attention_layout"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
    recomputed_.clear();
    bool sunk = false;
    for (Node* node : order) {
      if (!node->is_dead() && IsOp(*node, OpType::kRotaryEmbedding)) {
        sunk = SinkBelowRotary(graph, ctx, node) || sunk;
      }
    }
    if (sunk) {
      KILN_ASSIGN_OR_RETURN(order, graph.TopologicalOrder());
    }
    int bsd = 0, sbd = 0, bshd = 0;
    for (Node* node : order) {
      if (node->is_dead() || !IsOp(*node, OpType::kAttention)) continue;
      if (attrs::Attention::layout(*node) != "bhsd") continue;
      std::string_view l = Rewrite(graph, ctx, node);
      bsd += l == "bsd";
      sbd += l == "sbd";
      bshd += l == "bshd";
    }
    if (bsd + sbd + bshd > 0) {
      ctx.stats().notes.push_back(fmt::format(
          "{} attention layer(s) read the heads in place ({} as [B, S, H*D], {} as [S, B, H*D], "
          "{} as [B, S, H, D]): no head split/merge copies",
          bsd + sbd + bshd, bsd, sbd, bshd));
    }
    return OkStatus();
  }

 private:
  // The layout given to `attn`, or "" when it stays as it is.
  std::string_view Rewrite(Graph& graph, PassContext& ctx, Node* attn) {
    Value* q = attn->input(0);
    if (!q || !q->has_shape() || (q->shape().size() != 4 && q->shape().size() != 5)) return "";
    const Shape& qs = q->shape();
    const bool grouped = qs.size() == 5;  // [B, G, R, S, D]: K and V [B, G, 1, S, D]
    int64_t heads = 0;
    if (!StaticDim(qs[1], heads)) return "";
    Reads reads[3];
    for (int i = 0; i < 3; ++i) {
      Value* in = attn->input(i);
      if (!in || !in->has_shape() || in->shape().size() != qs.size() ||
          !(in->shape()[0] == qs[0]) || !(in->shape()[1] == qs[1])) {
        return "";
      }
      reads[i] = OperandReads(in, i, attn, ctx);
    }
    // bsd, else sbd (rows of [B, S] or [S, B] order; all packed or none), else bshd.
    auto rows_layout = [&](std::optional<Read> Reads::*slot) {
      const Reads& a = reads[0];
      const Reads& b = reads[1];
      const Reads& c = reads[2];
      if (!(a.*slot) || !(b.*slot) || !(c.*slot)) return 0;  // 0: no, 1: rows, 3: packed rows
      const int packed = (a.*slot)->packed + (b.*slot)->packed + (c.*slot)->packed;
      return packed == 3 ? 3 : packed == 0 ? 1 : 0;
    };
    std::string layout;
    int rows_kind = grouped ? 0 : rows_layout(&Reads::bsd);
    if (grouped) {
      if (!reads[0].bshd || !reads[1].bshd || !reads[2].bshd) return "";
      layout = "bshd";
    } else if (rows_kind) {
      layout = "bsd";
    } else if ((rows_kind = rows_layout(&Reads::sbd))) {
      layout = "sbd";
    } else if (reads[0].bshd && reads[1].bshd && reads[2].bshd) {
      layout = "bshd";
    } else {
      return "";
    }
    const bool packed = rows_kind == 3;
    const bool seq_first = layout == "sbd";
    const bool use_rows = layout != "bshd";

    // Y [B, H, Sq, Dv]: where its readers want it as rows of [B, Sq, H, Dv] ([Sq, B, ...]).
    // Grouped: Y [B, G, R, S, Dv] where they want [B, S, G, R, Dv].
    Value* y = attn->output(0);
    if (!y || !y->has_shape() || y->shape().size() != qs.size()) return "";
    const Shape& ys = y->shape();
    const Shape out_shape = grouped     ? Shape{ys[0], ys[3], ys[1], ys[2], ys[4]}
                            : seq_first ? Shape{ys[2], ys[0], ys[1] * ys[3]}
                            : use_rows  ? Shape{ys[0], ys[2], ys[1] * ys[3]}
                                        : Shape{ys[0], ys[2], ys[1], ys[3]};
    const OutputPlace* place = nullptr;
    std::vector<OutputPlace> places = OutputPlaces(y);
    for (const OutputPlace& p : places) {
      const bool fits = grouped ? IsRowMajor(TransposeView(p.view, {0, 3, 1, 2, 4}), out_shape)
                                : ReadsRows(p.view, ys[1] * ys[3], 0, seq_first);
      if (!fits || !(p.view.shape == ys)) continue;
      if (p.value->shape() == out_shape || FitsShapeConstant(p.value->shape())) {
        place = &p;
        break;
      }
    }
    if (!place) return "";

    AttributeMap attrs = attn->attrs();
    attrs.Set("layout", layout);
    if (use_rows) attrs.Set("num_heads", heads);
    if (packed) attrs.Set("qkv_packed", int64_t{1});
    // Grouped operands are their sources' memory in another shape: a Reshape (a view) each.
    Value* as_target[3] = {nullptr, nullptr, nullptr};
    for (int i = 0; layout == "bshd" && i < 3; ++i) {
      const Read& r = *reads[i].bshd;
      if (r.source && !r.as.empty() && !(r.source->shape() == r.as)) {
        as_target[i] = AddReshapeTarget(graph, "attention_heads", r.source->shape(), r.as);
        if (!as_target[i]) return "";  // (an unread target goes in dead-node elimination)
      }
    }
    std::vector<Value*> inputs;
    for (int i = 0; i < 3; ++i) {
      const Read& r = layout == "bsd" ? *reads[i].bsd : seq_first ? *reads[i].sbd : *reads[i].bshd;
      Value* in = r.source ? r.source : Recomputed(graph, ctx, r.rows);
      if (as_target[i]) {
        Value* viewed = graph.AddValue(graph.UniqueName(in->name() + "_heads"), in->dtype());
        graph.AddNode("Reshape", graph.UniqueName(attn->name() + "_heads"), {in, as_target[i]},
                      {viewed});
        in = viewed;
      }
      inputs.push_back(in);
    }
    if (attn->input(3)) inputs.push_back(attn->input(3));
    const std::string name = attn->name();
    Value* target = place->value;
    std::vector<Node*> chain = place->chain;
    Value* shape = nullptr;
    Value* out = target;
    if (!(target->shape() == out_shape)) {
      shape = AddShapeConstant(graph, "attention_shape", target->shape());
      out = graph.AddValue(graph.UniqueName(name + "_rows"), y->dtype());
    }
    // The new node writes the merged value itself (its name may be a graph output's).
    for (Node* n : chain) graph.RemoveNode(n);
    graph.RemoveNode(attn);
    graph.AddNode("Attention", graph.UniqueName(name + "_" + layout), std::move(inputs), {out},
                  std::move(attrs));
    if (shape) {
      graph.AddNode("Reshape", graph.UniqueName(name + "_rows_view"), {out, shape}, {target});
    }
    ctx.stats().nodes_removed += static_cast<int64_t>(chain.size()) - (shape ? 1 : 0);
    ctx.stats().rewrites += 1;
    return layout == "bsd" ? "bsd" : seq_first ? "sbd" : "bshd";
  }

  // The row-wise product `g` (its input a Transpose of the leading axes) computed on the
  // Transpose's input instead: [B, S, N] rows where `g` made [S, B, N]. One per product.
  Value* Recomputed(Graph& graph, PassContext& ctx, const Node* g) {
    auto it = recomputed_.find(g);
    if (it != recomputed_.end()) return it->second;
    Value* x = g->input(0)->producer()->input(0);
    std::vector<Value*> inputs;
    for (size_t i = 0; i < g->num_inputs(); ++i) inputs.push_back(i == 0 ? x : g->input(i));
    Value* rows =
        graph.AddValue(graph.UniqueName(g->output(0)->name() + "_rows"), g->output(0)->dtype());
    graph.AddNode(g->op_type(), graph.UniqueName(g->name() + "_rows"), std::move(inputs), {rows},
                  g->attrs(), g->domain());
    ctx.stats().rewrites += 1;
    recomputed_[g] = rows;
    return rows;
  }

  std::unordered_map<const Node*, Value*> recomputed_;  // this run's products, by the old one
};

}  // namespace

std::unique_ptr<Pass> MakeAttentionLayoutPass() { return std::make_unique<AttentionLayoutPass>(); }

}  // namespace kiln::passes
