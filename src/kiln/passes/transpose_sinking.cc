// Transpose sinking: moves Transposes down through layout-agnostic elementwise ops and cancels
// the ones that meet their inverse, so that a model's own permutes (ConvNeXt's NCHW <-> NHWC
// Permute around each block) and the layout pass's boundary Transposes stop moving data back and
// forth. Three rewrites, over any rank and permutation:
//   Transpose(Transpose(x, p), q)  => Transpose(x, p[q[k]]), or x itself when that is the identity
//   Reshape(Transpose(x, p), f)    => Transpose(Reshape(x, f'), q)
//     when the Reshape merges runs of the Transpose's axes that read runs of x's axes in order, and
//     its result is read by a Transpose alone (which the moved one then meets);
//   op(Transpose(a, p), ..., c)    => Transpose(op(a, ..., c'), p)
//     for an op with the kLayoutAgnostic trait (ops.inc), every non-constant input a Transpose by
//     the same p (or a value already transposed by p's inverse somewhere else in the graph), and c'
//     each constant transposed by p's inverse (padded to the rank first, as broadcasting does).
// A rewrite never adds Transposes overall: it applies when every input Transpose it bypasses is
// read by the op alone, or when the op's output is itself read by a Transpose by p's inverse
// (which then cancels). The old Transposes that nothing reads any more go in dead-node
// elimination.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "kiln/ir/weight_program.h"
#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"

namespace kiln::passes {

Tensor TransposePadded(const Tensor& t, std::span<const int64_t> perm) {
  const size_t rank = perm.size();
  std::vector<int64_t> d = t.dims();
  d.insert(d.begin(), static_cast<std::ptrdiff_t>(rank - d.size()), 1);
  std::vector<int64_t> out_dims(rank);
  for (size_t k = 0; k < rank; ++k) out_dims[k] = d[static_cast<size_t>(perm[k])];
  // Input strides, read in the output's order.
  std::vector<int64_t> in_stride(rank, 1);
  for (size_t i = rank; i-- > 1;) in_stride[i - 1] = in_stride[i] * d[i];
  std::vector<int64_t> step(rank);
  for (size_t k = 0; k < rank; ++k) step[k] = in_stride[static_cast<size_t>(perm[k])];
  Tensor out(t.dtype(), out_dims);
  const size_t es = SizeOf(t.dtype());
  const auto* src = static_cast<const std::byte*>(t.raw());
  auto* dst = static_cast<std::byte*>(out.mutable_raw());
  const int64_t n = out.num_elements();
  std::vector<int64_t> idx(rank, 0);
  int64_t offset = 0;
  for (int64_t o = 0; o < n; ++o) {
    std::memcpy(dst + o * static_cast<int64_t>(es), src + offset * static_cast<int64_t>(es), es);
    for (size_t k = rank; k-- > 0;) {  // odometer over the output index
      offset += step[k];
      if (++idx[k] < out_dims[k]) break;
      offset -= step[k] * out_dims[k];
      idx[k] = 0;
    }
  }
  return out;
}

namespace {

using Perm = std::vector<int64_t>;

bool IsPermutation(const Perm& p) {
  std::vector<bool> seen(p.size(), false);
  for (int64_t a : p) {
    if (a < 0 || a >= static_cast<int64_t>(p.size()) || seen[static_cast<size_t>(a)]) return false;
    seen[static_cast<size_t>(a)] = true;
  }
  return true;
}

bool IsIdentity(const Perm& p) {
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

Perm Inverse(const Perm& p) {
  Perm inv(p.size());
  for (size_t k = 0; k < p.size(); ++k) inv[static_cast<size_t>(p[k])] = static_cast<int64_t>(k);
  return inv;
}

// The explicit permutation of a Transpose node whose input rank is known; empty otherwise (an
// absent perm reverses the axes).
Perm PermOf(const Node& t) {
  const Value* in = t.input(0);
  if (!in || !in->has_shape()) return {};
  Perm p = attrs::Transpose::perm(t);
  const size_t rank = in->shape().size();
  if (p.empty()) {
    for (size_t i = 0; i < rank; ++i) p.push_back(static_cast<int64_t>(rank - 1 - i));
  }
  if (p.size() != rank || !IsPermutation(p)) return {};
  return p;
}

bool IsTranspose(const Node* n) { return n && !n->is_dead() && IsOp(*n, OpType::kTranspose); }

// Whether `v` is read by `reader` only (and is not a graph output).
bool ReadOnlyBy(const Value* v, const Node* reader) {
  if (v->is_graph_output()) return false;
  return std::all_of(v->consumers().begin(), v->consumers().end(),
                     [&](const Node* c) { return c == reader; });
}

// A live Transpose by `perm` that reads `v`, or nullptr.
Node* TransposeReading(const Value* v, const Perm& perm) {
  for (Node* c : v->consumers()) {
    if (IsTranspose(c) && c->input(0) == v && PermOf(*c) == perm) return c;
  }
  return nullptr;
}

// The weight op kTransposeBroadcastOp (pass.h).
StatusOr<std::vector<Tensor>> TransposeBroadcast(const AttributeMap& a,
                                                 std::span<const Tensor* const> in) {
  Perm perm = a.GetInts("perm");
  if (in.size() != 1 || !in[0] || !IsPermutation(perm) || in[0]->dims().size() > perm.size()) {
    return MakeError(ErrorCode::kInternal, "{}: one input of rank <= {}", kTransposeBroadcastOp,
                     perm.size());
  }
  std::vector<Tensor> result;
  result.push_back(TransposePadded(*in[0], perm));
  return result;
}

const bool kTransposeRegistered =
    RegisterWeightOp(std::string(kTransposeBroadcastOp), TransposeBroadcast);

class TransposeSinkingPass final : public Pass {
 public:
  std::string_view name() const override { return "transpose_sinking"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
    for (Node* n : order) {
      if (n->is_dead()) continue;
      if (IsTranspose(n)) {
        Compose(graph, ctx, n);
      } else if (IsOp(*n, OpType::kReshape)) {
        SinkBelowReshape(graph, ctx, n);
      } else if (HasTrait(OpTypeOf(*n), op_traits::kLayoutAgnostic)) {
        Sink(graph, ctx, n);
      }
    }
    return OkStatus();
  }

 private:
  // Transpose(Transpose(x, p), q): one Transpose of x, or none.
  static void Compose(Graph& graph, PassContext& ctx, Node* t2) {
    Value* mid = t2->input(0);
    Node* t1 = mid ? mid->producer() : nullptr;
    if (!IsTranspose(t1)) return;
    Perm p = PermOf(*t1);
    Perm q = PermOf(*t2);
    if (p.empty() || q.empty() || p.size() != q.size()) return;
    Perm r(q.size());
    for (size_t k = 0; k < q.size(); ++k) r[k] = p[static_cast<size_t>(q[k])];
    Value* x = t1->input(0);
    if (IsIdentity(r)) {
      if (!ForwardValue(graph, t2->output(0), x)) return;
      graph.RemoveNode(t2);
      ctx.stats().nodes_removed += 1;
    } else {
      graph.SetInput(t2, 0, x);
      t2->mutable_attrs().Set("perm", r);
    }
    ctx.stats().rewrites += 1;
  }

  // Reshape(Transpose(x, p), f) => Transpose(Reshape(x, f'), q), when the Reshape merges runs of
  // the Transpose's output axes that come from runs of x's axes in the same order (ViT's
  // flatten(2) after a channels-last product moved back to channels-first). Applies when the
  // Reshape's result is read by a Transpose alone, which the moved one then meets.
  static void SinkBelowReshape(Graph& graph, PassContext& ctx, Node* reshape) {
    Value* y = reshape->input(0);
    Value* z = reshape->output(0);
    Node* t = y ? y->producer() : nullptr;
    if (!IsTranspose(t) || !z || !z->has_shape() || !y->has_shape() || !ReadOnlyBy(y, reshape)) {
      return;
    }
    if (z->is_graph_output() || z->consumers().size() != 1 || !IsTranspose(z->consumers()[0])) {
      return;
    }
    Value* x = t->input(0);
    const Perm p = PermOf(*t);
    if (p.empty() || !x->has_shape()) return;
    const Shape& e = y->shape();
    const Shape& f = z->shape();
    // Group y's axes into consecutive runs, one per axis of z, each of z's dim's size (a symbolic
    // dim is one axis of y, with any unit axes before it; unit axes at the end join the last run).
    // z's last dim, when symbolic and not one of y's dims as written (a Reshape's -1 is inferred
    // as a quotient), takes the rest of y's axes: the Reshape keeps the element count, and every
    // run before it matched exactly.
    std::vector<size_t> group_start;
    size_t i = 0;
    auto unit = [&](size_t k) { return e[k].is_static() && e[k].value() == 1; };
    for (size_t j = 0; j < f.size(); ++j) {
      const Dim& fj = f[j];
      if (i >= e.size()) return;
      group_start.push_back(i);
      if (!fj.is_static()) {
        const size_t start = i;
        while (i < e.size() && unit(i)) ++i;
        if (i < e.size() && e[i] == fj) {
          ++i;
        } else if (j + 1 == f.size()) {
          i = e.size();
          if (i == start) return;
        } else {
          return;
        }
        continue;
      }
      if (!e[i].is_static()) return;
      int64_t product = e[i++].value();
      while (product < fj.value() && i < e.size() && e[i].is_static()) product *= e[i++].value();
      if (product != fj.value()) return;
    }
    while (i < e.size() && unit(i)) ++i;
    if (i != e.size() || group_start.empty()) return;
    group_start.push_back(e.size());
    // Each run must read a run of x's axes in order.
    const size_t groups = f.size();
    std::vector<int64_t> source_start(groups);
    for (size_t g = 0; g < groups; ++g) {
      source_start[g] = p[group_start[g]];
      for (size_t k = group_start[g] + 1; k < group_start[g + 1]; ++k) {
        if (p[k] != p[k - 1] + 1) return;
      }
    }
    // The runs in x's order make the new Reshape's shape; q puts them back in z's order.
    std::vector<size_t> order(groups);
    for (size_t g = 0; g < groups; ++g) order[g] = g;
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return source_start[a] < source_start[b]; });
    Shape inner_shape;
    Perm q(groups);
    for (size_t pos = 0; pos < groups; ++pos) {
      inner_shape.push_back(f[order[pos]]);
      q[order[pos]] = static_cast<int64_t>(pos);
    }
    Value* target = AddReshapeTarget(graph, reshape->name() + "_shape", x->shape(), inner_shape);
    if (!target) return;
    const std::string name = reshape->name();
    Value* inner = graph.AddValue(graph.UniqueName(z->name() + "_sunk"), z->dtype());
    inner->set_shape(inner_shape);
    graph.RemoveNode(reshape);  // releases z, which the new Transpose produces
    graph.AddNode("Reshape", graph.UniqueName(name), {x, target}, {inner});
    AttributeMap t_attrs;
    t_attrs.Set("perm", q);
    graph.AddNode("Transpose", graph.UniqueName(name + "_transpose"), {inner}, {z},
                  std::move(t_attrs));
    ctx.stats().rewrites += 1;
    ctx.stats().nodes_added += 1;
  }

  // op(Transpose(a, p), ...) => Transpose(op(a, ...), p), when it does not add Transposes.
  static void Sink(Graph& graph, PassContext& ctx, Node* n) {
    if (n->num_outputs() != 1 || !n->output(0) || !n->output(0)->has_shape()) return;
    Value* out = n->output(0);
    const size_t rank = out->shape().size();
    if (rank < 2) return;
    // The permutation: that of the first input made by a Transpose.
    Perm p;
    for (Value* in : n->inputs()) {
      if (in && !in->is_constant() && IsTranspose(in->producer())) {
        p = PermOf(*in->producer());
        break;
      }
    }
    if (p.size() != rank || IsIdentity(p)) return;
    const Perm inv = Inverse(p);
    // Where each input comes from once the op runs before the Transpose.
    std::vector<Value*> sources(n->num_inputs(), nullptr);
    bool all_bypassed_read_only_here = true;
    bool any_bypassed = false;
    for (size_t i = 0; i < n->num_inputs(); ++i) {
      Value* in = n->input(i);
      if (!in) continue;
      if (in->is_constant()) {
        if (in->constant()->dims().size() > rank) return;
        continue;  // permuted below
      }
      if (!in->has_shape() || in->shape().size() != rank) return;
      Node* producer = in->producer();
      if (IsTranspose(producer) && PermOf(*producer) == p) {
        sources[i] = producer->input(0);
        any_bypassed = true;
        if (!ReadOnlyBy(in, n)) all_bypassed_read_only_here = false;
        continue;
      }
      // A value that is already transposed by p's inverse elsewhere: its twin is reused.
      Node* twin = TransposeReading(in, inv);
      if (!twin) return;
      sources[i] = twin->output(0);
      all_bypassed_read_only_here = false;
    }
    if (!any_bypassed) return;
    if (!all_bypassed_read_only_here && !TransposeReading(out, inv)) return;

    // Constants in the op's new (pre-transpose) order.
    AttributeMap perm_attr;
    perm_attr.Set("perm", inv);
    for (size_t i = 0; i < n->num_inputs(); ++i) {
      Value* in = n->input(i);
      if (!in || !in->is_constant()) continue;
      if (in->constant()->num_elements() == 1) {
        sources[i] = in;
        continue;
      }
      Value* c = DeriveConstant(graph, in->name() + "_t", std::string(kTransposeBroadcastOp),
                                perm_attr, {in});
      if (!c) return;  // the graph is left as it was (the new constant, unread, is dropped)
      sources[i] = c;
    }
    std::string name = n->name();
    std::string op_type = n->op_type();
    AttributeMap attrs = n->attrs();
    Value* inner = graph.AddValue(graph.UniqueName(out->name() + "_sunk"), out->dtype());
    Shape inner_shape;  // out = Transpose(inner, p): inner's axis p[k] is out's axis k
    for (size_t j = 0; j < rank; ++j)
      inner_shape.push_back(out->shape()[static_cast<size_t>(inv[j])]);
    inner->set_shape(std::move(inner_shape));
    graph.RemoveNode(n);  // releases `out`, which the new Transpose produces
    graph.AddNode(std::move(op_type), graph.UniqueName(name), std::move(sources), {inner},
                  std::move(attrs));
    AttributeMap t_attrs;
    t_attrs.Set("perm", p);
    graph.AddNode("Transpose", graph.UniqueName(name + "_transpose"), {inner}, {out},
                  std::move(t_attrs));
    ctx.stats().rewrites += 1;
    ctx.stats().nodes_added += 1;
  }
};

}  // namespace

std::unique_ptr<Pass> MakeTransposeSinkingPass() {
  return std::make_unique<TransposeSinkingPass>();
}

}  // namespace kiln::passes
