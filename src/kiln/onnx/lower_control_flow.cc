// If, Loop and Scan lowered into the enclosing graph at import. kiln's engines run a static
// graph, so control flow is unrolled or inlined when its shape is known at import:
//   Scan  every scan input's length along its scan axis is static: the body is inlined once per
//         step (Gather of step t on each scan input, states threaded, the per-step scan outputs
//         Unsqueeze'd and Concat'ed), directions and axes honoured; Scan-8's batch axis by one
//         such unrolling per batch entry, stacked.
//   Loop  the trip count is a constant (or absent) and the condition is constant or folds each
//         iteration (computed from constants and the iteration number): unrolled likewise.
//   If    a constant (or folding) condition inlines the branch taken; a run-time condition whose
//         branches give outputs of one element type and shape inlines both and picks with Where
//         (branches have no side effects); 1-D outputs of different lengths are picked with
//         Compress over both concatenated (a data-dependent length). Other shape mismatches
//         (ranks, multi-dimensional shapes) are reported.
// Body inputs are bound to the values the node passes; values defined in a body get fresh names
// (`<node>/iter<t>/<name>`), names a body reads from the outer scope stay as they are (inside
// nested subgraphs too, where a local definition shadows them). Body nodes go back through the
// normaliser (EmitRaw): version rewrites, expansions and nested control flow apply to them.
// Anything else is reported as an unsupported node saying why (KILN-E2004).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include "kiln/onnx/expand_util.h"
#include "kiln/onnx/onnx_internal.h"
#include "kiln/ops/op_schema.h"

namespace kiln::onnx_internal {

namespace {

using expand::FindAttr;
std::vector<int64_t> IntsAttr(const onnx::NodeProto& n, std::string_view name) {
  const auto* a = FindAttr(n, name);
  if (!a) return {};
  return {a->ints().begin(), a->ints().end()};
}
onnx::AttributeProto IntAttrProto(const std::string& name, int64_t v) {
  return expand::Attr(name, v);
}

// A reason the node cannot be lowered (not an error of the model): reported in KILN-E2004.
template <typename... Args>
Status Unlowerable(fmt::format_string<Args...> f, Args&&... args) {
  return Status(ErrorCode::kUnsupportedOps, fmt::format(f, std::forward<Args>(args)...));
}

// Names defined inside `g` (inputs, initializers, node outputs): they shadow the outer scope.
std::unordered_set<std::string> LocalNames(const onnx::GraphProto& g) {
  std::unordered_set<std::string> local;
  for (const auto& i : g.input()) local.insert(i.name());
  for (const auto& t : g.initializer()) local.insert(t.name());
  for (const auto& n : g.node()) {
    for (const auto& o : n.output()) local.insert(o);
  }
  return local;
}

// Renames the outer-scope names `g` reads (at any depth) by `map`, honouring shadowing.
void RenameFree(onnx::GraphProto* g, const std::unordered_map<std::string, std::string>& map) {
  std::unordered_set<std::string> local = LocalNames(*g);
  std::unordered_map<std::string, std::string> inner;
  for (const auto& [from, to] : map) {
    if (!local.count(from)) inner.emplace(from, to);
  }
  if (inner.empty()) return;
  for (auto& n : *g->mutable_node()) {
    for (auto& in : *n.mutable_input()) {
      if (auto it = inner.find(in); it != inner.end()) in = it->second;
    }
    for (auto& a : *n.mutable_attribute()) {
      if (a.has_g()) RenameFree(a.mutable_g(), inner);
      for (auto& sg : *a.mutable_graphs()) RenameFree(&sg, inner);
    }
  }
  for (auto& o : *g->mutable_output()) {
    if (auto it = inner.find(o.name()); it != inner.end()) o.set_name(it->second);
  }
}

int64_t CountNodes(const onnx::GraphProto& g) {
  int64_t n = g.node_size();
  for (const auto& node : g.node()) {
    for (const auto& a : node.attribute()) {
      if (a.has_g()) n += CountNodes(a.g());
      for (const auto& sg : a.graphs()) n += CountNodes(sg);
    }
  }
  return n;
}

class Lowerer {
 public:
  Lowerer(const onnx::NodeProto& n, int version, LoweringHost& host)
      : n_(n), version_(version), host_(host) {}

  Status Run() {
    const std::string& op = n_.op_type();
    if (op == "If") return LowerIf();
    if (op == "Loop") return LowerLoop();
    if (op == "FlexAttention") return LowerFlexAttention();
    if (op == "Scan") return LowerScan();
    return LowerSequenceOp();
  }

 private:
  const onnx::GraphProto* GraphAttr(const char* name) const {
    const auto* a = FindAttr(n_, name);
    return a && a->has_g() ? &a->g() : nullptr;
  }
  std::string In(int i) const { return i < n_.input_size() ? n_.input(i) : std::string(); }
  std::string Out(int i) const { return i < n_.output_size() ? n_.output(i) : std::string(); }

  // A glue node in canonical form; its output is `out` when given, a fresh value otherwise.
  std::string Op(const std::string& what, const std::string& op, std::vector<std::string> inputs,
                 std::vector<onnx::AttributeProto> attrs = {}, const std::string& out = "") {
    return emit_.Op(what, op, std::move(inputs), std::move(attrs), out);
  }
  std::string Constant(const std::string& what, onnx::TensorProto t) {
    return emit_.Constant(what, std::move(t));
  }
  std::string Ints(const std::vector<int64_t>& v) { return emit_.Ints(v); }
  std::string IntScalar(const std::string& what, int64_t v) {
    onnx::TensorProto t;
    t.set_data_type(onnx::TensorProto::INT64);
    t.add_int64_data(v);
    return Constant(what, std::move(t));
  }
  std::string BoolScalar(const std::string& what, bool v) {
    onnx::TensorProto t;
    t.set_data_type(onnx::TensorProto::BOOL);
    t.add_int32_data(v ? 1 : 0);
    return Constant(what, std::move(t));
  }

  // `copies` more inlined copies of `body` must fit the budget; `done`: copies made so far by
  // a loop checked as it goes (-1: checked up front).
  Status CheckBudget(const onnx::GraphProto& body, int64_t copies, int64_t done = -1) {
    const int64_t per = std::max<int64_t>(1, CountNodes(body));
    if (copies > kMaxInlinedNodes / per ||
        host_.inlined_nodes() + per * copies > kMaxInlinedNodes) {
      std::string what = done >= 0 ? fmt::format(
                                         "{} iterations of a {}-node body so far, and "
                                         "its condition still holds",
                                         done, per)
                                   : fmt::format("{} copies of a {}-node body", copies, per);
      return Unlowerable(
          "unrolling it would add more than {} nodes ({}); kiln lowers control flow by "
          "unrolling, so long loops need a model that computes them without a Loop/Scan",
          kMaxInlinedNodes, what);
    }
    return OkStatus();
  }

  // Inlines `g` with its inputs bound to `args`; `outs` receives its outputs' names here.
  Status Inline(const onnx::GraphProto& g, const std::vector<std::string>& args,
                const std::string& prefix, std::vector<std::string>* outs) {
    if (g.input_size() != static_cast<int>(args.size())) {
      return MakeError(ErrorCode::kInvalidModel,
                       "node '{}' ({}): its subgraph '{}' has {} input(s), the node binds {}",
                       n_.name(), n_.op_type(), g.name(), g.input_size(), args.size());
    }
    if (g.sparse_initializer_size() > 0) {
      return Unlowerable("its subgraph '{}' has sparse initializers", g.name());
    }
    std::unordered_map<std::string, std::string> map;
    for (int i = 0; i < g.input_size(); ++i) {
      map[g.input(i).name()] = args[static_cast<size_t>(i)];
      DeclareFromValueInfo(g.input(i), args[static_cast<size_t>(i)]);
    }
    // Initializers once per subgraph, however many times it is inlined.
    auto& hoisted = hoisted_[&g];
    if (hoisted.empty() && g.initializer_size() > 0) {
      for (const auto& t : g.initializer())
        hoisted[t.name()] = Constant("initializer/" + t.name(), t);
    }
    for (const auto& [from, to] : hoisted) map[from] = to;
    // Fresh names for every value the body defines, first: value_info may describe them.
    for (const auto& node : g.node()) {
      for (const auto& o : node.output()) {
        if (!o.empty()) map[o] = host_.FreshValueName(prefix + o);
      }
    }
    for (const auto& vi : g.value_info()) {
      if (auto it = map.find(vi.name()); it != map.end()) DeclareFromValueInfo(vi, it->second);
    }
    for (const auto& node : g.node()) {
      onnx::NodeProto copy = node;
      for (auto& in : *copy.mutable_input()) {
        if (auto it = map.find(in); it != map.end()) in = it->second;
      }
      for (auto& o : *copy.mutable_output()) {
        if (!o.empty()) o = map.at(o);
      }
      for (auto& a : *copy.mutable_attribute()) {
        if (a.has_g()) RenameFree(a.mutable_g(), map);
        for (auto& sg : *a.mutable_graphs()) RenameFree(&sg, map);
      }
      copy.set_name(
          host_.FreshNodeName(prefix + (node.name().empty() ? node.op_type() : node.name())));
      ++host_.inlined_nodes();
      KILN_RETURN_IF_ERROR(host_.EmitRaw(std::move(copy)));
    }
    if (g.node_size() == 0) ++host_.inlined_nodes();  // an empty body still costs a copy
    outs->clear();
    for (const auto& o : g.output()) {
      auto it = map.find(o.name());
      outs->push_back(it == map.end() ? o.name() : it->second);  // else: an outer-scope value
      DeclareFromValueInfo(o, outs->back());
    }
    return OkStatus();
  }

  void DeclareFromValueInfo(const onnx::ValueInfoProto& vi, const std::string& value) {
    if (!vi.type().has_tensor_type() || host_.Dims(value)) return;
    const auto& tt = vi.type().tensor_type();
    if (!tt.has_shape()) return;
    std::vector<int64_t> dims;
    for (const auto& d : tt.shape().dim()) dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
    host_.DeclareDims(value, tt.elem_type(), dims);
  }

  // Out[i] = Identity(value) when the node names output i; a sequence or optional is aliased.
  void Bind(int i, const std::string& value) {
    if (Out(i).empty()) return;
    BindValue(Out(i), value);
  }
  void BindValue(const std::string& out, const std::string& value) {
    if (const auto* o = host_.OptionalContents(value)) {
      host_.DefineOptional(out, *o);
      if (const auto* e = host_.SequenceElements(value)) host_.DefineSequence(out, *e);
    } else if (const auto* e = host_.SequenceElements(value)) {
      host_.DefineSequence(out, *e);
    } else {
      Op("output", "Identity", {value}, {}, out);
    }
  }
  bool IsComposite(const std::string& v) const {
    return host_.SequenceElements(v) || host_.OptionalContents(v) ||
           !host_.UnknownComposite(v).empty();
  }

  // Stacks per-step values along `axis` (of the stacked rank); `reverse`: last step first.
  std::string Stack(std::vector<std::string> pieces, int64_t axis, bool reverse,
                    const std::string& out) {
    if (reverse) std::reverse(pieces.begin(), pieces.end());
    std::string axes = Ints({axis});
    std::vector<std::string> unsq;
    for (const auto& p : pieces) unsq.push_back(Op("unsqueeze", "Unsqueeze", {p, axes}));
    // Concat takes at most kMaxConcatInputs inputs: longer runs are concatenated in groups.
    while (unsq.size() > kMaxConcatInputs) {
      std::vector<std::string> groups;
      for (size_t i = 0; i < unsq.size(); i += kMaxConcatInputs) {
        std::vector<std::string> part(unsq.begin() + static_cast<std::ptrdiff_t>(i),
                                      unsq.begin() + static_cast<std::ptrdiff_t>(std::min(
                                                         unsq.size(), i + kMaxConcatInputs)));
        groups.push_back(Op("concat", "Concat", part, {IntAttrProto("axis", axis)}));
      }
      unsq = std::move(groups);
    }
    return Op("concat", "Concat", unsq, {IntAttrProto("axis", axis)}, out);
  }

  // ---- If ----

  Status LowerIf() {
    const onnx::GraphProto* then_g = GraphAttr("then_branch");
    const onnx::GraphProto* else_g = GraphAttr("else_branch");
    if (!then_g || !else_g) {
      return MakeError(ErrorCode::kInvalidAttribute,
                       "node '{}' (If) needs graph attributes then_branch and else_branch",
                       n_.name());
    }
    if (then_g->output_size() != else_g->output_size() ||
        then_g->output_size() < n_.output_size()) {
      return MakeError(ErrorCode::kInvalidModel,
                       "node '{}' (If): its branches give {} and {} outputs, the node has {}",
                       n_.name(), then_g->output_size(), else_g->output_size(), n_.output_size());
    }
    const std::string cond = In(0);
    if (auto v = host_.IntValues(cond); v && v->size() == 1) {
      std::vector<std::string> outs;
      KILN_RETURN_IF_ERROR(Inline((*v)[0] ? *then_g : *else_g, {}, n_.name() + "/", &outs));
      for (int i = 0; i < n_.output_size(); ++i) Bind(i, outs[static_cast<size_t>(i)]);
      return OkStatus();
    }
    // A run-time condition: both branches, then Where per output.
    KILN_RETURN_IF_ERROR(CheckBudget(*then_g, 1));
    std::vector<std::string> t, e;
    KILN_RETURN_IF_ERROR(Inline(*then_g, {}, n_.name() + "/then/", &t));
    KILN_RETURN_IF_ERROR(Inline(*else_g, {}, n_.name() + "/else/", &e));
    std::vector<bool> composite(static_cast<size_t>(n_.output_size()), false);
    std::string cond_scalar;
    for (int i = 0; i < n_.output_size(); ++i) {
      const auto& ti = t[static_cast<size_t>(i)];
      const auto& ei = e[static_cast<size_t>(i)];
      if (!IsComposite(ti) && !IsComposite(ei)) {
        if (!then_g->output(i).type().has_tensor_type() &&
            then_g->output(i).type().value_case() != onnx::TypeProto::VALUE_NOT_SET) {
          return Unlowerable("output {} is neither a tensor nor a sequence or optional of tensors",
                             i);
        }
        continue;
      }
      composite[static_cast<size_t>(i)] = true;
      if (cond_scalar.empty()) cond_scalar = Op("condition", "Reshape", {cond, Ints({})});
      KILN_RETURN_IF_ERROR(SelectComposite(cond_scalar, then_g->output(i), ti, ei, i, Out(i)));
    }
    // Outputs of one shape are picked with Where; 1-D outputs whose lengths may differ (an empty
    // constant against a data-dependent count: detection post-processing) with Compress over
    // both, concatenated, under a mask that keeps the taken branch's elements: the output's
    // length is then data-dependent (bounded by the two lengths' sum).
    std::vector<bool> by_compress(static_cast<size_t>(n_.output_size()), false);
    for (int i = 0; i < n_.output_size(); ++i) {
      if (Out(i).empty() || composite[static_cast<size_t>(i)]) continue;
      const auto& ti = t[static_cast<size_t>(i)];
      const auto& ei = e[static_cast<size_t>(i)];
      Status same = SameTypeAndShape(then_g->output(i), else_g->output(i), ti, ei, i);
      if (same.ok()) continue;
      if (!SameElemType(then_g->output(i), else_g->output(i), ti, ei)) return same;
      if (BothOneDimensional(then_g->output(i), else_g->output(i), ti, ei)) {
        by_compress[static_cast<size_t>(i)] = true;
        continue;
      }
      return Unlowerable(
          "its condition is computed at run time and kiln cannot show that both branches give "
          "output {} of one shape, nor that both give it 1-D (declare the branches' output "
          "shapes); kiln lowers such an If to both branches + Where (one shape) or + Compress "
          "(1-D outputs of different lengths); branches of different ranks or of different "
          "multi-dimensional shapes need run-time control flow, which kiln does not have",
          i);
    }
    std::string c = Op("condition", "Reshape", {cond, Ints({})});
    std::string not_c;
    for (int i = 0; i < n_.output_size(); ++i) {
      if (Out(i).empty() || composite[static_cast<size_t>(i)]) continue;
      const auto& ti = t[static_cast<size_t>(i)];
      const auto& ei = e[static_cast<size_t>(i)];
      if (!by_compress[static_cast<size_t>(i)]) {
        Op("select", "Where", {c, ti, ei}, {}, Out(i));
        continue;
      }
      if (not_c.empty()) not_c = Op("not_condition", "Not", {c});
      std::string keep_t = Op("keep_then", "Expand", {c, Op("then_len", "Shape", {ti})});
      std::string keep_e = Op("keep_else", "Expand", {not_c, Op("else_len", "Shape", {ei})});
      std::string both = Op("both", "Concat", {ti, ei}, {IntAttrProto("axis", 0)});
      std::string mask = Op("mask", "Concat", {keep_t, keep_e}, {IntAttrProto("axis", 0)});
      Op("select", "Compress", {both, mask}, {IntAttrProto("axis", 0)}, Out(i));
    }
    return OkStatus();
  }

  // Output i of an If on a run-time condition where a branch gives a sequence or optional:
  // sequences of one length are picked element by element (Where, elements of one type and
  // static shape); optionals that both hold a value (or are both empty) pick their values.
  Status SelectComposite(const std::string& c, const onnx::ValueInfoProto& declared,
                         const std::string& tv, const std::string& ev, int i,
                         const std::string& out) {
    const auto* to = host_.OptionalContents(tv);
    const auto* eo = host_.OptionalContents(ev);
    if (to || eo) {
      if (!to || !eo) {
        return Unlowerable("its branches give output {} as an optional in one and not the other",
                           i);
      }
      if (to->has_value() != eo->has_value()) {
        return Unlowerable(
            "its condition is computed at run time and only one branch's optional output {} "
            "holds a value, so whether it does depends on run-time data; kiln resolves "
            "optionals at import",
            i);
      }
      if (!to->has_value()) {
        if (!out.empty()) host_.DefineOptional(out, std::nullopt);
        return OkStatus();
      }
      std::string inner = out.empty() ? std::string() : host_.FreshValueName(out + "/value");
      onnx::ValueInfoProto inner_decl;
      if (declared.type().has_optional_type()) {
        *inner_decl.mutable_type() = declared.type().optional_type().elem_type();
      }
      KILN_RETURN_IF_ERROR(SelectComposite(c, inner_decl, **to, **eo, i, inner));
      if (!out.empty()) host_.DefineOptional(out, inner);
      return OkStatus();
    }
    const auto* ts = host_.SequenceElements(tv);
    const auto* es = host_.SequenceElements(ev);
    if (!ts || !es) {
      std::string why = host_.UnknownComposite(ts ? ev : tv);
      return Unlowerable("its output {} is a sequence kiln cannot follow in {} branch{}", i,
                         ts ? "the else" : "the then", why.empty() ? "" : " (" + why + ")");
    }
    if (ts->size() != es->size()) {
      return Unlowerable(
          "its condition is computed at run time and its branches give sequences of lengths {} "
          "and {} as output {}, so the sequence's length depends on run-time data",
          ts->size(), es->size(), i);
    }
    onnx::ValueInfoProto elem;
    if (declared.type().has_sequence_type()) {
      *elem.mutable_type() = declared.type().sequence_type().elem_type();
    }
    std::vector<std::string> picked;
    for (size_t k = 0; k < ts->size(); ++k) {
      KILN_RETURN_IF_ERROR(SameTypeAndShape(elem, elem, (*ts)[k], (*es)[k], i));
      picked.push_back(Op("select", "Where", {c, (*ts)[k], (*es)[k]}));
    }
    if (!out.empty()) host_.DefineSequence(out, std::move(picked));
    return OkStatus();
  }

  // The declared or known rank of a branch output (nullopt: unknown).
  std::optional<size_t> RankOf(const onnx::ValueInfoProto& vi, const std::string& v) const {
    const auto& tt = vi.type().tensor_type();
    if (tt.has_shape()) return static_cast<size_t>(tt.shape().dim_size());
    if (auto d = host_.Dims(v)) return d->size();
    return std::nullopt;
  }
  bool BothOneDimensional(const onnx::ValueInfoProto& a, const onnx::ValueInfoProto& b,
                          const std::string& va, const std::string& vb) const {
    auto ra = RankOf(a, va);
    auto rb = RankOf(b, vb);
    return ra && rb && *ra == 1 && *rb == 1;
  }
  bool SameElemType(const onnx::ValueInfoProto& a, const onnx::ValueInfoProto& b,
                    const std::string& va, const std::string& vb) const {
    int32_t ea = a.type().tensor_type().elem_type() ? a.type().tensor_type().elem_type()
                                                    : host_.ElemType(va);
    int32_t eb = b.type().tensor_type().elem_type() ? b.type().tensor_type().elem_type()
                                                    : host_.ElemType(vb);
    return ea != 0 && ea == eb;
  }

  // Both branches' output i must have one element type and shape for Where to pick between
  // them: from the branches' declarations, or the static facts of the inlined values.
  Status SameTypeAndShape(const onnx::ValueInfoProto& a, const onnx::ValueInfoProto& b,
                          const std::string& va, const std::string& vb, int i) {
    const auto& ta = a.type().tensor_type();
    const auto& tb = b.type().tensor_type();
    int32_t ea = ta.elem_type() ? ta.elem_type() : host_.ElemType(va);
    int32_t eb = tb.elem_type() ? tb.elem_type() : host_.ElemType(vb);
    if (ea == 0 || ea != eb) {
      return Unlowerable(
          "its condition is computed at run time and kiln cannot show that both branches give "
          "output {} of one element type ({} vs {}); kiln lowers such an If to both branches + "
          "Where",
          i, ea ? OnnxDataTypeName(ea) : "unknown", eb ? OnnxDataTypeName(eb) : "unknown");
    }
    bool same = false;
    if (ta.has_shape() && tb.has_shape() && ta.shape().dim_size() == tb.shape().dim_size()) {
      same = true;
      for (int d = 0; d < ta.shape().dim_size() && same; ++d) {
        const auto& x = ta.shape().dim(d);
        const auto& y = tb.shape().dim(d);
        same = (x.has_dim_value() && y.has_dim_value() && x.dim_value() == y.dim_value()) ||
               (x.has_dim_param() && y.has_dim_param() && !x.dim_param().empty() &&
                x.dim_param() == y.dim_param());
      }
    }
    if (!same) {
      auto da = host_.Dims(va);
      auto db = host_.Dims(vb);
      same = da && db && *da == *db &&
             std::all_of(da->begin(), da->end(), [](int64_t d) { return d >= 0; });
    }
    if (!same) {
      return Unlowerable(
          "its condition is computed at run time and kiln cannot show that both branches give "
          "output {} of one shape (declare the branches' output shapes); kiln lowers such an If "
          "to both branches + Where",
          i);
    }
    return OkStatus();
  }

  // ---- Loop ----

  Status LowerLoop() {
    const onnx::GraphProto* body = GraphAttr("body");
    if (!body) {
      return MakeError(ErrorCode::kInvalidAttribute, "node '{}' (Loop) needs graph attribute body",
                       n_.name());
    }
    const int num_states = std::max(0, n_.input_size() - 2);
    const int num_scans = body->output_size() - 1 - num_states;
    if (body->input_size() != 2 + num_states || num_scans < 0 ||
        n_.output_size() > num_states + num_scans) {
      return MakeError(ErrorCode::kInvalidModel,
                       "node '{}' (Loop): the body has {} input(s) and {} output(s) for {} loop "
                       "state value(s) and {} node output(s)",
                       n_.name(), body->input_size(), body->output_size(), num_states,
                       n_.output_size());
    }
    std::optional<int64_t> trips;
    if (!In(0).empty()) {
      auto v = host_.IntValues(In(0));
      if (!v || v->size() != 1) {
        return LowerLoopBounded(*body, In(0), std::nullopt, num_states, num_scans,
                                fmt::format("its trip count '{}' is computed at run time", In(0)));
      }
      trips = (*v)[0];
    }
    bool cond = true;
    if (!In(1).empty()) {
      auto v = host_.IntValues(In(1));
      if (!v || v->size() != 1) {
        return LowerLoopGated(
            *body, trips, num_states, num_scans,
            fmt::format("its initial condition '{}' is computed at run time", In(1)));
      }
      cond = (*v)[0] != 0;
    }
    // A body that passes its condition through runs exactly `trips` iterations: the budget is
    // checked up front (a loop past it is refused before anything is unrolled).
    if (cond && ConditionPassesThrough(*body)) {
      if (!trips) {
        return Unlowerable(
            "it has no trip count and its condition stays true, so it never ends (or only by an "
            "error)");
      }
      KILN_RETURN_IF_ERROR(CheckBudget(*body, *trips));
    }
    std::vector<std::string> states;
    for (int i = 0; i < num_states; ++i) states.push_back(In(2 + i));
    std::vector<std::vector<std::string>> pieces(static_cast<size_t>(num_scans));
    const size_t mark = host_.EmittedCount();
    int64_t t = 0;
    for (; cond && (!trips || t < *trips); ++t) {
      KILN_RETURN_IF_ERROR(CheckBudget(*body, 1, t));  // as it goes: M may be INT64_MAX
      std::vector<std::string> args = {IntScalar("iteration", t), BoolScalar("condition", true)};
      args.insert(args.end(), states.begin(), states.end());
      std::vector<std::string> outs;
      KILN_RETURN_IF_ERROR(Inline(*body, args, fmt::format("{}/iter{}/", n_.name(), t), &outs));
      auto c = host_.IntValues(outs[0]);
      if (!c || c->size() != 1) {
        host_.DropEmittedAfter(mark);
        hoisted_.clear();  // those constants were dropped too
        return LowerLoopGated(
            *body, trips, num_states, num_scans,
            fmt::format("the condition its body computes ('{}') does not fold to a constant at "
                        "import",
                        body->output(0).name()));
      }
      cond = (*c)[0] != 0;
      for (int i = 0; i < num_states; ++i) states[static_cast<size_t>(i)] = outs[1 + i];
      for (int k = 0; k < num_scans; ++k) {
        pieces[static_cast<size_t>(k)].push_back(outs[static_cast<size_t>(1 + num_states + k)]);
      }
    }
    for (int i = 0; i < num_states && i < n_.output_size(); ++i) {
      Bind(i, states[static_cast<size_t>(i)]);
    }
    for (int k = 0; k < num_scans && num_states + k < n_.output_size(); ++k) {
      if (Out(num_states + k).empty()) continue;
      if (t == 0) {
        return Unlowerable(
            "it runs zero iterations, so its scan output '{}' is empty with a shape kiln cannot "
            "know",
            Out(num_states + k));
      }
      Stack(pieces[static_cast<size_t>(k)], 0, false, Out(num_states + k));
    }
    return OkStatus();
  }

  // The initial states of a Loop unrolled with a run-time condition: tensors only (a sequence's
  // length would depend on the data).
  Status GatedStates(const onnx::GraphProto& body, int num_states, const std::string& why,
                     std::vector<std::string>* states) {
    for (int i = 0; i < num_states; ++i) {
      states->push_back(In(2 + i));
      if (IsComposite(states->back())) {
        return Unlowerable(
            "{}, and its loop state '{}' is a sequence or optional, whose length or presence "
            "would then depend on run-time data",
            why, body.input(2 + i).name());
      }
    }
    return OkStatus();
  }

  // Each state after one gated iteration: Where(active, the body's new value, the old one), which
  // needs the body to keep the state's static shape.
  Status KeepOrUpdate(const onnx::GraphProto& body, const std::vector<std::string>& outs,
                      const std::string& active, const std::string& why,
                      std::vector<std::string>* states) {
    for (size_t i = 0; i < states->size(); ++i) {
      const std::string& old_v = (*states)[i];
      const std::string& new_v = outs[1 + i];
      auto a = host_.Dims(old_v), b = host_.Dims(new_v);
      if (!a || !b || *a != *b ||
          !std::all_of(a->begin(), a->end(), [](int64_t d) { return d >= 0; })) {
        return Unlowerable(
            "{}, and kiln cannot show that its body keeps the shape of loop state '{}' (which a "
            "run-time trip count or condition needs: each state is kept or replaced per "
            "iteration)",
            why, body.input(static_cast<int>(2 + i)).name());
      }
      (*states)[i] = Op("keep_or_update", "Where", {active, new_v, old_v});
    }
    return OkStatus();
  }

  // A Loop whose condition is computed at run time, with a constant trip count: every iteration
  // unrolled, each state updated only while the condition held (Where(active, new, old), active
  // = And(active, condition)). Needs states whose shapes the body keeps (Where would broadcast
  // otherwise) and no scan outputs (their length would depend on the data). The body runs on in
  // the iterations after the condition turned false; their results are discarded.
  Status LowerLoopGated(const onnx::GraphProto& body, std::optional<int64_t> trips, int num_states,
                        int num_scans, const std::string& why) {
    // No trip count, or scan outputs whose length then depends on the data: unrolled to the
    // import's bound instead.
    if (!trips || num_scans > 0) {
      return LowerLoopBounded(body, "", trips, num_states, num_scans, why);
    }
    KILN_RETURN_IF_ERROR(CheckBudget(body, std::max<int64_t>(*trips, 0)));
    std::string active = In(1).empty() ? BoolScalar("condition", true)
                                       : Op("condition", "Reshape", {In(1), Ints({})});
    std::vector<std::string> states;
    KILN_RETURN_IF_ERROR(GatedStates(body, num_states, why, &states));
    for (int64_t t = 0; t < *trips; ++t) {
      std::vector<std::string> args = {IntScalar("iteration", t), active};
      args.insert(args.end(), states.begin(), states.end());
      std::vector<std::string> outs;
      KILN_RETURN_IF_ERROR(Inline(body, args, fmt::format("{}/iter{}/", n_.name(), t), &outs));
      KILN_RETURN_IF_ERROR(KeepOrUpdate(body, outs, active, why, &states));
      std::string c = Op("body_condition", "Reshape", {outs[0], Ints({})});
      active = Op("active", "And", {active, c});
    }
    for (int i = 0; i < num_states && i < n_.output_size(); ++i) {
      Bind(i, states[static_cast<size_t>(i)]);
    }
    return OkStatus();
  }

  // A Loop whose trip count (`trip_value`, a run-time scalar) or condition is known only at run
  // time, or whose scan outputs then have a data-dependent length: unrolled to B iterations,
  // B = min(ImportOptions::max_loop_trips, a constant trip count). Iteration t runs while
  // active[t] = condition so far && t < trip count; each state is kept or replaced as in
  // LowerLoopGated (the body runs on in the iterations after; their results are discarded, and
  // they see iteration number 0, an index every iteration has seen valid). A LoopGuard node
  // (ops.inc) reads active[0..B]: it reports the n iterations that ran (the scan outputs keep
  // their first n rows, a data-dependent length) and fails with KILN-E5016 when active[B] says
  // the loop wanted more than B, so a truncated result never leaves the engine.
  //
  // A body whose shapes depend on the iteration number (a Slice at it) cannot take the run-time
  // number: then the iterations see constants 0, 1, ... instead, and the unrolling stops at the
  // first iteration whose states or scan outputs would change shape (the loop may run no further
  // with one static plan): B is that iteration, and the guard fails a run that wants it.
  Status LowerLoopBounded(const onnx::GraphProto& body, const std::string& trip_value,
                          std::optional<int64_t> trips, int num_states, int num_scans,
                          const std::string& why) {
    if (host_.max_loop_trips() <= 0) {
      return Unlowerable(
          "{}; kiln unrolls such a Loop to a bound given at build time, and none is set "
          "(`kiln build --max-loop-trips N`)",
          why);
    }
    const size_t mark = host_.EmittedCount();
    Status run_time = LowerLoopBoundedAs(body, trip_value, trips, num_states, num_scans, why,
                                         /*constant_iterations=*/false);
    if (run_time.code() != ErrorCode::kUnsupportedOps) return run_time;
    host_.DropEmittedAfter(mark);
    hoisted_.clear();  // those constants were dropped too
    Status constant = LowerLoopBoundedAs(body, trip_value, trips, num_states, num_scans, why,
                                         /*constant_iterations=*/true);
    if (constant.ok()) return constant;
    host_.DropEmittedAfter(mark);
    hoisted_.clear();
    return run_time;
  }

  Status LowerLoopBoundedAs(const onnx::GraphProto& body, const std::string& trip_value,
                            std::optional<int64_t> trips, int num_states, int num_scans,
                            const std::string& why, bool constant_iterations) {
    const int64_t limit = host_.max_loop_trips();
    int64_t bound = trips ? std::clamp<int64_t>(*trips, 0, limit) : limit;
    KILN_RETURN_IF_ERROR(CheckBudget(body, bound));
    std::vector<std::string> states;
    KILN_RETURN_IF_ERROR(GatedStates(body, num_states, why, &states));
    std::string m;  // the run-time trip count as an int64 scalar
    if (!trip_value.empty()) {
      m = Op("trip_count", "Reshape", {trip_value, Ints({})});
      if (host_.ElemType(trip_value) != onnx::TensorProto::INT64) {
        m = Op("trip_count", "Cast", {m}, {IntAttrProto("to", onnx::TensorProto::INT64)});
      }
    }
    // Whether iteration t may run as far as the trip count goes.
    auto within_trips = [&](int64_t t, const std::string& active) {
      if (!m.empty()) {
        std::string more = Op("within_trip_count", "Less", {IntScalar("iteration", t), m});
        return Op("active", "And", {active, more});
      }
      if (trips && t >= *trips) return BoolScalar("active", false);
      return active;
    };
    std::string active = In(1).empty() ? BoolScalar("condition", true)
                                       : Op("condition", "Reshape", {In(1), Ints({})});
    active = within_trips(0, active);
    std::vector<std::string> actives = {active};
    std::vector<std::vector<std::string>> pieces(static_cast<size_t>(num_scans));
    // The run-time number of iteration t >= 1: t while it runs, 0 once the loop has ended.
    const std::string zero = constant_iterations ? "" : IntScalar("iteration", 0);
    for (int64_t t = 0; t < bound; ++t) {
      const size_t iteration_mark = host_.EmittedCount();
      std::string iteration =
          t == 0 || constant_iterations
              ? IntScalar("iteration", t)
              : Op("iteration", "Where", {active, IntScalar("iteration", t), zero});
      std::vector<std::string> args = {iteration, active};
      args.insert(args.end(), states.begin(), states.end());
      std::vector<std::string> outs;
      std::vector<std::string> next_states = states;
      Status st = Inline(body, args, fmt::format("{}/iter{}/", n_.name(), t), &outs);
      if (st.ok()) st = KeepOrUpdate(body, outs, active, why, &next_states);
      for (int k = 0; k < num_scans && st.ok(); ++k) {
        const std::string& piece = outs[static_cast<size_t>(1 + num_states + k)];
        auto first = pieces[static_cast<size_t>(k)].empty()
                         ? std::nullopt
                         : host_.Dims(pieces[static_cast<size_t>(k)].front());
        auto d = host_.Dims(piece);
        if (!d || std::any_of(d->begin(), d->end(), [](int64_t x) { return x < 0; }) ||
            (first && *first != *d)) {
          st = Unlowerable(
              "{}, and kiln cannot show that every iteration's scan output '{}' has one static "
              "shape (which stacking a run-time number of them needs)",
              why, body.output(1 + num_states + k).name());
        }
      }
      if (!st.ok()) {
        if (!constant_iterations || t == 0) return st;
        // Iteration t would change a shape: the loop is unrolled to t iterations, and the guard
        // reads whether it wanted this one (actives.back()).
        host_.DropEmittedAfter(iteration_mark);
        bound = t;
        break;
      }
      states = std::move(next_states);
      for (int k = 0; k < num_scans; ++k) {
        pieces[static_cast<size_t>(k)].push_back(outs[static_cast<size_t>(1 + num_states + k)]);
      }
      std::string c = Op("body_condition", "Reshape", {outs[0], Ints({})});
      active = within_trips(t + 1, Op("active", "And", {active, c}));
      actives.push_back(active);
    }
    std::vector<std::string> flags;
    for (const std::string& a : actives) flags.push_back(Op("active", "Reshape", {a, Ints({1})}));
    std::string mask = flags.size() == 1
                           ? flags[0]
                           : Op("active_mask", "Concat", flags, {IntAttrProto("axis", 0)});
    std::vector<std::string> guard_in = {mask};
    guard_in.insert(guard_in.end(), states.begin(), states.end());
    onnx::AttributeProto loop_name;
    loop_name.set_name("loop");
    loop_name.set_type(onnx::AttributeProto::STRING);
    loop_name.set_s(n_.name());
    std::vector<std::string> guarded =
        emit_.Ops("loop_guard", "LoopGuard", guard_in, 1 + num_states, {loop_name});
    for (int i = 0; i < num_states && i < n_.output_size(); ++i) {
      Bind(i, guarded[static_cast<size_t>(1 + i)]);
    }
    for (int k = 0; k < num_scans && num_states + k < n_.output_size(); ++k) {
      if (Out(num_states + k).empty()) continue;
      if (bound == 0) {
        return Unlowerable(
            "{}, and it runs zero iterations, so its scan output '{}' is empty with a shape kiln "
            "cannot know",
            why, Out(num_states + k));
      }
      std::string stacked = Stack(pieces[static_cast<size_t>(k)], 0, false, "");
      Op("scan_rows_run", "Gather", {stacked, guarded[0]}, {IntAttrProto("axis", 0)},
         Out(num_states + k));
    }
    return OkStatus();
  }

  // The body's condition output is its condition input (directly or through Identity).
  static bool ConditionPassesThrough(const onnx::GraphProto& body) {
    const std::string& in = body.input(1).name();
    const std::string& out = body.output(0).name();
    if (in == out) return true;
    for (const auto& n : body.node()) {
      if (n.output_size() == 1 && n.output(0) == out) {
        return n.op_type() == "Identity" && n.input_size() == 1 && n.input(0) == in;
      }
    }
    return false;
  }

  // ---- FlexAttention (ai.onnx.preview) ----

  // As the spec's function writes it: K and V repeated per query head (grouped-query), Q and K
  // each scaled by sqrt(scale) (default 1/sqrt(head size)), Q K^T cast to softmax_precision
  // (float32, or float64 for float64 inputs), score_mod inlined on the scores, Softmax on the
  // last axis, prob_mod inlined on the probabilities, the product with V (in that precision),
  // cast back to Q's type.
  Status LowerFlexAttention() {
    const std::string q = In(0), k = In(1), v = In(2);
    if (q.empty() || k.empty() || v.empty() || Out(0).empty()) {
      return MakeError(ErrorCode::kInvalidModel,
                       "FlexAttention needs inputs Q, K, V and output Y; node '{}' lacks one",
                       n_.name());
    }
    const int32_t type = host_.ElemType(q);
    if (type != onnx::TensorProto::FLOAT && type != onnx::TensorProto::FLOAT16 &&
        type != onnx::TensorProto::BFLOAT16 && type != onnx::TensorProto::DOUBLE) {
      return Unlowerable(
          "Q's float element type is not known, which kiln's expansion of this operator needs "
          "(declare it in value_info, e.g. with onnx.shape_inference)");
    }
    for (const std::string& x : {q, k, v}) {
      if (auto d = host_.Dims(x); d && d->size() != 4) {
        return MakeError(ErrorCode::kShapeMismatch,
                         "node '{}' (FlexAttention): input '{}' has rank {}; Q, K and V are "
                         "rank 4",
                         n_.name(), x, d->size());
      }
    }
    const auto* sp_attr = FindAttr(n_, "softmax_precision");
    const int32_t precision = sp_attr
                                  ? static_cast<int32_t>(sp_attr->i())
                                  : (type == onnx::TensorProto::DOUBLE ? onnx::TensorProto::DOUBLE
                                                                       : onnx::TensorProto::FLOAT);
    auto shape = [&](const std::string& x, int64_t start, int64_t end) {
      onnx::AttributeProto s = IntAttrProto("start", start), e = IntAttrProto("end", end);
      return Op("shape", "Shape", {x}, {s, e});
    };
    auto cast = [&](const std::string& x, int32_t from, int32_t to) {
      return from == to ? x : Op("cast", "Cast", {x}, {IntAttrProto("to", to)});
    };
    // K, V repeated per query head: [B, Hkv, S, d] -> [B, Hkv, rep, S, d] -> [B, Hq, S, d].
    const std::string rep = Op("kv_repeat", "Div", {shape(q, 1, 2), shape(k, 1, 2)});
    const std::string expand_shape =
        Op("repeat_shape", "Concat", {Ints({1, 1}), rep, Ints({1, 1})}, {IntAttrProto("axis", 0)});
    auto repeat = [&](const std::string& x) {
      std::string five = Op("kv_unsqueeze", "Unsqueeze", {x, Ints({2})});
      std::string wide = Op("kv_expand", "Expand", {five, expand_shape});
      std::string target =
          Op("kv_shape", "Concat", {shape(x, 0, 1), shape(q, 1, 2), shape(x, 2, 4)},
             {IntAttrProto("axis", 0)});
      return Op("kv_aligned", "Reshape", {wide, target});
    };
    const std::string k_rep = repeat(k), v_rep = repeat(v);
    // sqrt(scale), in Q's type.
    std::string sqrt_scale;
    if (const auto* a = FindAttr(n_, "scale")) {
      onnx::TensorProto t;
      t.set_data_type(onnx::TensorProto::FLOAT);
      t.add_float_data(std::sqrt(a->f()));
      sqrt_scale = Constant("sqrt_scale", std::move(t));
    } else {
      std::string d =
          Op("head_size", "Cast", {shape(q, 3, 4)}, {IntAttrProto("to", onnx::TensorProto::FLOAT)});
      sqrt_scale =
          Op("sqrt_scale", "Sqrt", {Op("scale", "Reciprocal", {Op("sqrt_d", "Sqrt", {d})})});
    }
    sqrt_scale = cast(sqrt_scale, onnx::TensorProto::FLOAT, type);
    std::string qs = Op("q_scaled", "Mul", {q, sqrt_scale});
    std::string ks = Op("k_scaled", "Mul", {k_rep, sqrt_scale});
    std::string kt = Op("k_transposed", "Transpose", {ks}, {[] {
                          onnx::AttributeProto a;
                          a.set_name("perm");
                          a.set_type(onnx::AttributeProto::INTS);
                          for (int64_t x : {0, 1, 3, 2}) a.add_ints(x);
                          return a;
                        }()});
    std::string scores = cast(Op("scores", "MatMul", {qs, kt}), type, precision);
    std::vector<std::string> outs;
    if (const onnx::GraphProto* g = GraphAttr("score_mod")) {
      KILN_RETURN_IF_ERROR(CheckModifier(*g, "score_mod"));
      KILN_RETURN_IF_ERROR(Inline(*g, {scores}, n_.name() + "/score_mod/", &outs));
      scores = outs[0];
    }
    std::string probs = Op("probs", "Softmax", {scores}, {IntAttrProto("axis", -1)});
    if (const onnx::GraphProto* g = GraphAttr("prob_mod")) {
      KILN_RETURN_IF_ERROR(CheckModifier(*g, "prob_mod"));
      KILN_RETURN_IF_ERROR(Inline(*g, {probs}, n_.name() + "/prob_mod/", &outs));
      probs = outs[0];
    }
    std::string y = Op("y", "MatMul", {probs, cast(v_rep, type, precision)});
    if (precision == type) {
      Op("output", "Identity", {y}, {}, Out(0));
    } else {
      Op("output", "Cast", {y}, {IntAttrProto("to", type)}, Out(0));
    }
    host_.Declare(Out(0), type, 4);
    return OkStatus();
  }

  Status CheckModifier(const onnx::GraphProto& g, const char* what) {
    if (g.input_size() != 1 || g.output_size() != 1) {
      return MakeError(ErrorCode::kInvalidModel,
                       "node '{}' (FlexAttention): its {} subgraph has {} input(s) and {} "
                       "output(s); the spec wants one of each",
                       n_.name(), what, g.input_size(), g.output_size());
    }
    return OkStatus();
  }

  // ---- Sequences and optionals ----
  //
  // kiln has tensors only: a sequence is tracked at import as the list of its elements' values,
  // an optional as absent or the value it holds (LoweringHost). The ops that build and read
  // them are resolved here when positions, split sizes and lengths are known at import; they
  // leave canonical nodes only where a tensor is computed (Split, Concat, Identity, Constant).

  // The elements of sequence input `v`, or why they are not known.
  Status Elements(const std::string& v, std::vector<std::string>* elems) {
    if (const auto* e = host_.SequenceElements(v)) {
      *elems = *e;
      return OkStatus();
    }
    std::string why = host_.UnknownComposite(v);
    if (v.empty())
      return MakeError(ErrorCode::kInvalidModel,
                       "node '{}' ({}) needs a sequence "
                       "input",
                       n_.name(), n_.op_type());
    return Unlowerable("its input sequence '{}' is not known at import{}", v,
                       why.empty() ? " (kiln resolves sequences at import, from ops whose "
                                     "lengths are known there)"
                                   : ": " + why);
  }

  // A position known at import (SequenceAt, SequenceInsert, SequenceErase), in [lo, hi] after
  // negative positions count from the end (`n` elements).
  Status Position(const std::string& v, int64_t n, bool insert, size_t* pos) {
    auto vals = host_.IntValues(v);
    if (!vals || vals->size() != 1) {
      return Unlowerable(
          "its position '{}' is computed at run time; kiln resolves sequences at import, which "
          "needs a position that is a constant (or folds to one)",
          v);
    }
    int64_t p = (*vals)[0];
    const int64_t hi = insert ? n : n - 1;
    if (p < -n || p > hi) {
      return MakeError(ErrorCode::kInvalidModel,
                       "node '{}' ({}): position {} is outside [{}, {}] for a sequence of {} "
                       "element(s)",
                       n_.name(), n_.op_type(), p, -n, hi, n);
    }
    *pos = static_cast<size_t>(p < 0 ? p + n : p);
    return OkStatus();
  }

  // Concat of any number of pieces along `axis` (groups of kMaxConcatInputs).
  std::string ConcatAll(std::vector<std::string> pieces, int64_t axis, const std::string& out) {
    while (pieces.size() > kMaxConcatInputs) {
      std::vector<std::string> groups;
      for (size_t i = 0; i < pieces.size(); i += kMaxConcatInputs) {
        std::vector<std::string> part(pieces.begin() + static_cast<std::ptrdiff_t>(i),
                                      pieces.begin() + static_cast<std::ptrdiff_t>(std::min(
                                                           pieces.size(), i + kMaxConcatInputs)));
        groups.push_back(Op("concat", "Concat", part, {IntAttrProto("axis", axis)}));
      }
      pieces = std::move(groups);
    }
    return Op("concat", "Concat", pieces, {IntAttrProto("axis", axis)}, out);
  }

  Status LowerSequenceOp() {
    const std::string& op = n_.op_type();
    const std::string out = Out(0);
    std::vector<std::string> elems;
    if (op == "Identity") {
      if (!host_.UnknownComposite(In(0)).empty()) return Elements(In(0), &elems);
      if (!out.empty()) BindValue(out, In(0));
      return OkStatus();
    }
    if (op == "SequenceConstruct") {
      for (const auto& in : n_.input()) {
        if (IsComposite(in)) {
          return Unlowerable("its input '{}' is not a tensor (kiln's sequences hold tensors)", in);
        }
        elems.push_back(in);
      }
      host_.DefineSequence(out, std::move(elems));
      return OkStatus();
    }
    if (op == "SequenceEmpty") {
      host_.DefineSequence(out, {});
      return OkStatus();
    }
    if (op == "SequenceInsert" || op == "SequenceErase") {
      KILN_RETURN_IF_ERROR(Elements(In(0), &elems));
      const auto n = static_cast<int64_t>(elems.size());
      const bool insert = op == "SequenceInsert";
      const std::string pos_in = In(insert ? 2 : 1);
      size_t pos = insert ? elems.size() : elems.size() - 1;
      if (!pos_in.empty()) {
        KILN_RETURN_IF_ERROR(Position(pos_in, n, insert, &pos));
      } else if (!insert && n == 0) {
        return MakeError(ErrorCode::kInvalidModel,
                         "node '{}' (SequenceErase): the sequence '{}' is empty", n_.name(), In(0));
      }
      if (insert) {
        if (In(1).empty() || IsComposite(In(1))) {
          return Unlowerable("its input '{}' is not a tensor (kiln's sequences hold tensors)",
                             In(1));
        }
        elems.insert(elems.begin() + static_cast<std::ptrdiff_t>(pos), In(1));
      } else {
        elems.erase(elems.begin() + static_cast<std::ptrdiff_t>(pos));
      }
      host_.DefineSequence(out, std::move(elems));
      return OkStatus();
    }
    if (op == "SequenceAt") {
      KILN_RETURN_IF_ERROR(Elements(In(0), &elems));
      size_t pos = 0;
      KILN_RETURN_IF_ERROR(Position(In(1), static_cast<int64_t>(elems.size()), false, &pos));
      Op("element", "Identity", {elems[pos]}, {}, out);
      return OkStatus();
    }
    if (op == "SequenceLength") {
      KILN_RETURN_IF_ERROR(Elements(In(0), &elems));
      onnx::TensorProto t;
      t.set_data_type(onnx::TensorProto::INT64);
      t.add_int64_data(static_cast<int64_t>(elems.size()));
      emit_.Constant("value", std::move(t), out);
      return OkStatus();
    }
    if (op == "ConcatFromSequence") {
      KILN_RETURN_IF_ERROR(Elements(In(0), &elems));
      const auto* axis_attr = FindAttr(n_, "axis");
      if (!axis_attr) {
        return MakeError(ErrorCode::kInvalidAttribute,
                         "node '{}' (ConcatFromSequence) needs attribute axis", n_.name());
      }
      if (elems.empty()) {
        return Unlowerable(
            "its sequence '{}' is empty, and the concatenation of no tensors has no shape", In(0));
      }
      const int64_t axis = axis_attr->i();
      if (expand::IntAttr(n_, "new_axis", 0) != 0) {
        Stack(elems, axis, false, out);  // Unsqueeze at axis (of the output's rank), Concat
      } else {
        ConcatAll(elems, axis, out);
      }
      return OkStatus();
    }
    if (op == "SplitToSequence") return LowerSplitToSequence();
    if (op == "SequenceMap") return LowerSequenceMap();
    if (op == "Optional") {
      if (In(0).empty()) {
        host_.DefineOptional(out, std::nullopt);
        return OkStatus();
      }
      if (!host_.UnknownComposite(In(0)).empty()) return Elements(In(0), &elems);
      host_.DefineOptional(out, In(0));
      return OkStatus();
    }
    if (op == "OptionalHasElement" || op == "OptionalGetElement") {
      const std::string in = In(0);
      if (std::string why = host_.UnknownComposite(in); !why.empty()) {
        return Unlowerable("its input '{}' is not known at import: {}", in, why);
      }
      const auto* contents = in.empty() ? nullptr : host_.OptionalContents(in);
      if (op == "OptionalHasElement") {
        // No input, an empty optional: false; an optional holding a value, or (opset 18) a
        // tensor or sequence: true.
        const bool has = !in.empty() && (!contents || contents->has_value());
        onnx::TensorProto t;
        t.set_data_type(onnx::TensorProto::BOOL);
        t.add_int32_data(has ? 1 : 0);
        emit_.Constant("value", std::move(t), out);
        return OkStatus();
      }
      if (in.empty()) {
        return MakeError(ErrorCode::kInvalidModel, "node '{}' (OptionalGetElement) needs an input",
                         n_.name());
      }
      if (contents && !contents->has_value()) {
        return Unlowerable(
            "its optional input '{}' is empty here (known at import), and getting the element "
            "of an empty optional is an error",
            in);
      }
      const std::string value = contents ? **contents : in;
      if (host_.OptionalContents(value) && value != in) {
        BindValue(out, value);
      } else if (const auto* e = host_.SequenceElements(value)) {
        host_.DefineSequence(out, *e);
      } else {
        Op("element", "Identity", {value}, {}, out);
      }
      return OkStatus();
    }
    return Unlowerable("kiln does not lower {}", op);
  }

  // SplitToSequence: Split (by the constant sizes, chunks of a constant size, or pieces of 1
  // along a static axis, squeezed unless keepdims) into the sequence's elements.
  Status LowerSplitToSequence() {
    const std::string x = In(0), split = In(1);
    const int64_t axis_attr = expand::IntAttr(n_, "axis", 0);
    const bool keepdims = expand::IntAttr(n_, "keepdims", 1) != 0;
    auto dims = host_.Dims(x);
    std::optional<int64_t> axis;
    if (dims) {
      const auto rank = static_cast<int64_t>(dims->size());
      if (axis_attr < -rank || axis_attr >= rank) {
        return MakeError(ErrorCode::kInvalidAttribute,
                         "node '{}' (SplitToSequence): axis {} is outside the input's rank {}",
                         n_.name(), axis_attr, rank);
      }
      axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
    }
    auto axis_len = [&]() -> std::optional<int64_t> {
      if (!axis) return std::nullopt;
      int64_t d = (*dims)[static_cast<size_t>(*axis)];
      return d >= 0 ? std::optional<int64_t>(d) : std::nullopt;
    };
    std::vector<int64_t> sizes;
    if (!split.empty()) {
      auto v = host_.IntValues(split);
      auto sd = host_.Dims(split);
      if (!v && sd && sd->size() == 1 && (*sd)[0] >= 0) {
        // Sizes computed at run time, but as many as split has entries: the sequence's length
        // is static, its elements' shapes follow Split's (sizes read at build time).
        const int count = static_cast<int>((*sd)[0]);
        std::vector<std::string> elems;
        if (count > 0) {
          KILN_RETURN_IF_ERROR(CheckBudgetNodes(count));
          elems = emit_.Ops("split", "Split", {x, split}, count, {IntAttrProto("axis", axis_attr)});
        }
        host_.DefineSequence(Out(0), std::move(elems));
        return OkStatus();
      }
      if (!v || !sd) {
        return Unlowerable(
            "its split '{}' is computed at run time, so the sequence's length depends on "
            "run-time data; kiln resolves sequences at import (a constant split)",
            split);
      }
      if (sd->empty()) {  // one chunk size: the last chunk takes the rest
        const int64_t chunk = v->empty() ? 0 : (*v)[0];
        auto len = axis_len();
        if (chunk <= 0) {
          return MakeError(ErrorCode::kInvalidModel,
                           "node '{}' (SplitToSequence): split {} is not positive", n_.name(),
                           chunk);
        }
        if (!len) {
          return Unlowerable(
              "the length of '{}' along axis {} is not static, so the number of chunks of {} "
              "(the sequence's length) is not known at import",
              x, axis_attr, chunk);
        }
        for (int64_t done = 0; done < *len; done += chunk)
          sizes.push_back(std::min(chunk, *len - done));
      } else {
        sizes = *v;
      }
    } else {
      auto len = axis_len();
      if (!len) {
        return Unlowerable(
            "the length of '{}' along axis {} is not static, so the sequence's length (one "
            "element per entry) is not known at import",
            x, axis_attr);
      }
      sizes.assign(static_cast<size_t>(*len), 1);
    }
    std::vector<std::string> elems;
    if (!sizes.empty()) {
      KILN_RETURN_IF_ERROR(CheckBudgetNodes(static_cast<int64_t>(sizes.size())));
      elems = emit_.Ops("split", "Split", {x, Ints(sizes)}, static_cast<int>(sizes.size()),
                        {IntAttrProto("axis", axis_attr)});
      if (split.empty() && !keepdims) {
        const std::string axes = Ints({axis_attr});
        for (auto& e : elems) e = Op("squeeze", "Squeeze", {e, axes});
      }
    }
    host_.DefineSequence(Out(0), std::move(elems));
    return OkStatus();
  }

  Status CheckBudgetNodes(int64_t nodes) {
    if (nodes > kMaxInlinedNodes || host_.inlined_nodes() + nodes > kMaxInlinedNodes) {
      return Unlowerable("it would add more than {} nodes ({} sequence elements)", kMaxInlinedNodes,
                         nodes);
    }
    host_.inlined_nodes() += nodes;
    return OkStatus();
  }

  // SequenceMap: the body inlined once per element (input sequences of one length; other
  // inputs passed to every copy), each output gathering its per-element values.
  Status LowerSequenceMap() {
    const onnx::GraphProto* body = GraphAttr("body");
    if (!body) {
      return MakeError(ErrorCode::kInvalidAttribute,
                       "node '{}' (SequenceMap) needs graph attribute body", n_.name());
    }
    std::vector<std::vector<std::string>> seqs(static_cast<size_t>(n_.input_size()));
    std::vector<bool> is_seq(static_cast<size_t>(n_.input_size()), false);
    int64_t length = -1;
    for (int i = 0; i < n_.input_size(); ++i) {
      const std::string in = In(i);
      const bool seq = i == 0 || host_.SequenceElements(in) || !host_.UnknownComposite(in).empty();
      if (!seq) continue;
      is_seq[static_cast<size_t>(i)] = true;
      KILN_RETURN_IF_ERROR(Elements(in, &seqs[static_cast<size_t>(i)]));
      const auto len = static_cast<int64_t>(seqs[static_cast<size_t>(i)].size());
      if (length >= 0 && len != length) {
        return MakeError(ErrorCode::kShapeMismatch,
                         "node '{}' (SequenceMap): its input sequences have lengths {} and {}",
                         n_.name(), length, len);
      }
      length = len;
    }
    KILN_RETURN_IF_ERROR(CheckBudget(*body, length));
    std::vector<std::vector<std::string>> results(static_cast<size_t>(body->output_size()));
    for (int64_t k = 0; k < length; ++k) {
      std::vector<std::string> args;
      for (int i = 0; i < n_.input_size(); ++i) {
        args.push_back(is_seq[static_cast<size_t>(i)]
                           ? seqs[static_cast<size_t>(i)][static_cast<size_t>(k)]
                           : In(i));
      }
      std::vector<std::string> outs;
      KILN_RETURN_IF_ERROR(Inline(*body, args, fmt::format("{}/iter{}/", n_.name(), k), &outs));
      for (size_t j = 0; j < outs.size(); ++j) {
        if (IsComposite(outs[j])) {
          return Unlowerable("its body's output {} is not a tensor (kiln's sequences hold tensors)",
                             j);
        }
        results[j].push_back(outs[j]);
      }
    }
    for (int j = 0; j < n_.output_size(); ++j) {
      if (!Out(j).empty()) host_.DefineSequence(Out(j), results[static_cast<size_t>(j)]);
    }
    return OkStatus();
  }

  // ---- Scan ----

  Status LowerScan() {
    const onnx::GraphProto* body = GraphAttr("body");
    const auto* m_attr = FindAttr(n_, "num_scan_inputs");
    if (!body || !m_attr) {
      return MakeError(ErrorCode::kInvalidAttribute,
                       "node '{}' (Scan) needs attributes body and num_scan_inputs", n_.name());
    }
    const int first = version_ < 9 ? 1 : 0;  // Scan-8: input 0 is sequence_lens
    const int num_inputs = n_.input_size() - first;
    const auto m = static_cast<int>(m_attr->i());
    const int num_states = num_inputs - m;
    const int num_scans = body->output_size() - num_states;
    if (m < 1 || num_states < 0 || num_scans < 0 || body->input_size() != num_inputs ||
        n_.output_size() > body->output_size()) {
      return MakeError(ErrorCode::kInvalidModel,
                       "node '{}' (Scan): {} input(s) with num_scan_inputs = {}, a body of {} "
                       "input(s) and {} output(s), {} node output(s)",
                       n_.name(), num_inputs, m, body->input_size(), body->output_size(),
                       n_.output_size());
    }
    std::vector<std::string> states, xs;
    for (int i = 0; i < num_states; ++i) states.push_back(In(first + i));
    for (int j = 0; j < m; ++j) xs.push_back(In(first + num_states + j));
    std::vector<std::string> want;
    for (int i = 0; i < body->output_size(); ++i) want.push_back(Out(i));
    auto pad = [](std::vector<int64_t> v, size_t n) {
      v.resize(std::max(v.size(), n), 0);
      return v;
    };
    if (version_ >= 9) {
      std::vector<std::string> got;
      return ScanSteps(*body, states, xs, pad(IntsAttr(n_, "scan_input_axes"), xs.size()),
                       pad(IntsAttr(n_, "scan_input_directions"), xs.size()),
                       pad(IntsAttr(n_, "scan_output_axes"), static_cast<size_t>(num_scans)),
                       pad(IntsAttr(n_, "scan_output_directions"), static_cast<size_t>(num_scans)),
                       n_.name() + "/", want, &got);
    }
    // Scan-8: axis 0 of every input and output is a batch axis; the scan axis is 1.
    if (!In(0).empty()) {
      return Unlowerable(
          "it has sequence_lens (per-batch lengths), which kiln cannot unroll; omit it when "
          "every sequence has the full length");
    }
    std::vector<int64_t> batch_dims;
    std::vector<std::string> all = states;
    all.insert(all.end(), xs.begin(), xs.end());
    for (const auto& v : all) {
      auto d = host_.Dims(v);
      if (!d || d->empty() || (*d)[0] < 0) {
        return Unlowerable(
            "the batch size of '{}' (axis 0) is not known at import; declare its shape (e.g. "
            "run onnx.shape_inference)",
            v);
      }
      batch_dims.push_back((*d)[0]);
    }
    const int64_t batch = batch_dims[0];
    for (int64_t d : batch_dims) {
      if (d != batch) {
        return MakeError(ErrorCode::kShapeMismatch,
                         "node '{}' (Scan-8): its inputs have batch sizes {} and {}", n_.name(),
                         batch, d);
      }
    }
    KILN_RETURN_IF_ERROR(CheckBudget(*body, batch));
    std::vector<std::vector<std::string>> per_batch(static_cast<size_t>(body->output_size()));
    for (int64_t b = 0; b < batch; ++b) {
      std::string idx = IntScalar("batch", b);
      auto take = [&](const std::string& v) {
        return Op("batch_entry", "Gather", {v, idx}, {IntAttrProto("axis", 0)});
      };
      std::vector<std::string> bs, bx;
      for (const auto& s : states) bs.push_back(take(s));
      for (const auto& x : xs) bx.push_back(take(x));
      std::vector<std::string> got;
      KILN_RETURN_IF_ERROR(
          ScanSteps(*body, bs, bx, std::vector<int64_t>(xs.size(), 0),
                    pad(IntsAttr(n_, "directions"), xs.size()),
                    std::vector<int64_t>(static_cast<size_t>(num_scans), 0),
                    std::vector<int64_t>(static_cast<size_t>(num_scans), 0),
                    fmt::format("{}/batch{}/", n_.name(), b),
                    std::vector<std::string>(static_cast<size_t>(body->output_size())), &got));
      for (size_t i = 0; i < got.size(); ++i) per_batch[i].push_back(got[i]);
    }
    for (int i = 0; i < n_.output_size(); ++i) {
      if (!Out(i).empty()) Stack(per_batch[static_cast<size_t>(i)], 0, false, Out(i));
    }
    return OkStatus();
  }

  // The Scan-9 semantics: `want` names the final states and the stacked scan outputs (empty:
  // fresh, or not wanted by the node); `got` receives every one of them.
  Status ScanSteps(const onnx::GraphProto& body, std::vector<std::string> states,
                   const std::vector<std::string>& xs, const std::vector<int64_t>& in_axes,
                   const std::vector<int64_t>& in_dirs, const std::vector<int64_t>& out_axes,
                   const std::vector<int64_t>& out_dirs, const std::string& prefix,
                   const std::vector<std::string>& want, std::vector<std::string>* got) {
    const size_t num_states = states.size();
    const size_t num_scans = body.output_size() - num_states;
    for (int64_t d : in_dirs) {
      if (d != 0 && d != 1) {
        return MakeError(ErrorCode::kInvalidAttribute,
                         "node '{}' (Scan): a scan direction is {}; directions are 0 (forward) "
                         "or 1 (reverse)",
                         n_.name(), d);
      }
    }
    for (int64_t d : out_dirs) {
      if (d != 0 && d != 1) {
        return MakeError(ErrorCode::kInvalidAttribute,
                         "node '{}' (Scan): a scan output direction is {}; directions are 0 "
                         "(forward) or 1 (reverse)",
                         n_.name(), d);
      }
    }
    int64_t length = -1;
    std::vector<int64_t> axes;
    for (size_t j = 0; j < xs.size(); ++j) {
      auto d = host_.Dims(xs[j]);
      if (!d) {
        return Unlowerable(
            "the shape of its scan input '{}' is not known at import; kiln unrolls a Scan over a "
            "static length (declare the shape, e.g. run onnx.shape_inference)",
            xs[j]);
      }
      const auto rank = static_cast<int64_t>(d->size());
      int64_t a = in_axes[j] < 0 ? in_axes[j] + rank : in_axes[j];
      if (a < 0 || a >= rank) {
        return MakeError(ErrorCode::kInvalidAttribute,
                         "node '{}' (Scan): scan axis {} of input '{}' is outside its rank {}",
                         n_.name(), in_axes[j], xs[j], rank);
      }
      axes.push_back(a);
      int64_t len = (*d)[static_cast<size_t>(a)];
      if (len < 0) {
        return Unlowerable(
            "the length of its scan input '{}' along axis {} is not static; kiln unrolls a Scan "
            "over a length known at import",
            xs[j], a);
      }
      if (length >= 0 && len != length) {
        return MakeError(ErrorCode::kShapeMismatch,
                         "node '{}' (Scan): scan inputs have lengths {} and {} ('{}')", n_.name(),
                         length, len, xs[j]);
      }
      length = len;
    }
    if (length == 0 && num_scans > 0) {
      return Unlowerable("its scan length is 0, so its scan outputs are empty of unknown shape");
    }
    KILN_RETURN_IF_ERROR(CheckBudget(body, length));
    std::vector<std::vector<std::string>> pieces(num_scans);
    for (int64_t t = 0; t < length; ++t) {
      std::vector<std::string> args = states;
      for (size_t j = 0; j < xs.size(); ++j) {
        std::string idx = IntScalar("step", in_dirs[j] ? length - 1 - t : t);
        args.push_back(Op("step", "Gather", {xs[j], idx}, {IntAttrProto("axis", axes[j])}));
      }
      std::vector<std::string> outs;
      KILN_RETURN_IF_ERROR(Inline(body, args, fmt::format("{}iter{}/", prefix, t), &outs));
      for (size_t i = 0; i < num_states; ++i) states[i] = outs[i];
      for (size_t k = 0; k < num_scans; ++k) pieces[k].push_back(outs[num_states + k]);
    }
    got->clear();
    for (size_t i = 0; i < num_states; ++i) {
      got->push_back(want[i].empty() ? states[i]
                                     : Op("output", "Identity", {states[i]}, {}, want[i]));
    }
    for (size_t k = 0; k < num_scans; ++k) {
      got->push_back(Stack(pieces[k], out_axes[k], out_dirs[k] != 0, want[num_states + k]));
    }
    return OkStatus();
  }

  const onnx::NodeProto& n_;
  int version_;
  LoweringHost& host_;
  expand::Emitter emit_{n_, host_};  // names glue nodes and values `<node>/<what>`
  std::unordered_map<const onnx::GraphProto*, std::unordered_map<std::string, std::string>>
      hoisted_;
};

}  // namespace

StatusOr<std::string> ExpandFlexAttention(const onnx::NodeProto& n, LoweringHost& host) {
  return LowerControlFlow(n, 1, host);
}

bool IsSequenceOrOptionalOp(const onnx::NodeProto& n) {
  if (!n.domain().empty() && n.domain() != "ai.onnx") return false;
  static const std::unordered_set<std::string> kOps = {
      "SequenceConstruct", "SequenceEmpty",  "SequenceInsert",     "SequenceErase",
      "SequenceAt",        "SequenceLength", "SplitToSequence",    "ConcatFromSequence",
      "SequenceMap",       "Optional",       "OptionalHasElement", "OptionalGetElement"};
  return kOps.count(n.op_type()) > 0;
}

bool IsControlFlowOp(const onnx::NodeProto& n) {
  if (!n.domain().empty() && n.domain() != "ai.onnx") return false;
  return n.op_type() == "If" || n.op_type() == "Loop" || n.op_type() == "Scan";
}

StatusOr<std::string> LowerControlFlow(const onnx::NodeProto& n, int version, LoweringHost& host) {
  Status st = Lowerer(n, version, host).Run();
  if (st.ok()) return std::string();
  if (st.code() == ErrorCode::kUnsupportedOps) return st.message();
  return st;
}

}  // namespace kiln::onnx_internal
