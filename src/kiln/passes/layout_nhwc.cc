// Layout pass: turns convolution stacks channels-last (NHWC) for backends whose convolutions are
// fastest that way (CUDA tensor cores in f16/bf16), inserting the fewest Transposes at the stack
// boundaries. The ops with a channels-last form (ops.inc's kChannelsLast: Conv/FusedConv/
// ConvTranspose and the pools) get kiln_layout = "NHWC" (nn.h); layout-agnostic ops between them
// (ops.inc's kLayoutAgnostic elementwise ops, Concat, Resize) are rewritten as the same ONNX op
// on the permuted tensor (per-channel constants, Concat's axis and Resize's scales permuted), so
// they need no tag and no special kernel.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "kiln/ir/weight_program.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"

namespace kiln::passes {
namespace {

using namespace op_traits;

// Nodes with a channels-last form (tagged kiln_layout = "NHWC") and elementwise ops whose
// non-activation inputs are scalars or broadcast constants: both from the op table (ops.inc's
// kChannelsLast and kLayoutAgnostic traits).
bool IsAnchor(OpType op) { return HasTrait(op, kChannelsLast); }
bool IsAgnostic(OpType op) { return HasTrait(op, kLayoutAgnostic); }

// NCHW axis -> NHWC axis.
int64_t NhwcAxis(int64_t nchw_axis) {
  static constexpr int64_t kMap[4] = {0, 3, 1, 2};
  return kMap[nchw_axis];
}

bool IsRank4(const Value* v) { return v && v->has_shape() && v->shape().size() == 4; }

// A constant that broadcasts against a 4-D activation: rank <= 4.
bool IsBroadcastConstant(const Value* v) {
  return v && v->is_constant() && v->constant()->dims().size() <= 4;
}

// The constant as it broadcasts against an NHWC activation: padded to rank 4 (leading ones, as
// numpy broadcasting does) and transposed with perm (0, 2, 3, 1). Scalars stay as they are.
Tensor PermuteBroadcastConstant(const Tensor& t) {
  if (t.num_elements() == 1) return t;
  static constexpr int64_t kToNhwc[4] = {0, 2, 3, 1};
  return TransposePadded(t, kToNhwc);
}

// Weight ops of the layout: the broadcast permutation above, and a four-vector put in NHWC order.
constexpr std::string_view kPermuteOp = "PermuteBroadcastNhwc";
constexpr std::string_view kFourVectorOp = "FourVectorNhwc";

StatusOr<std::vector<Tensor>> PermuteOp(const AttributeMap&, std::span<const Tensor* const> in) {
  if (in.size() != 1 || !in[0]) return MakeError(ErrorCode::kInternal, "{}: one input", kPermuteOp);
  std::vector<Tensor> out;
  out.push_back(PermuteBroadcastConstant(*in[0]));
  return out;
}

StatusOr<std::vector<Tensor>> FourVectorOp(const AttributeMap&, std::span<const Tensor* const> in) {
  if (in.size() != 1 || !in[0] || in[0]->num_elements() != 4) {
    return MakeError(ErrorCode::kInternal, "{}: one four-vector input", kFourVectorOp);
  }
  const Tensor& t = *in[0];
  Tensor p(t.dtype(), t.dims());
  size_t es = SizeOf(t.dtype());
  for (int64_t a = 0; a < 4; ++a) {
    std::memcpy(static_cast<std::byte*>(p.mutable_raw()) + NhwcAxis(a) * es,
                static_cast<const std::byte*>(t.raw()) + a * es, es);
  }
  std::vector<Tensor> out;
  out.push_back(std::move(p));
  return out;
}

const bool kPermuteRegistered = RegisterWeightOp(std::string(kPermuteOp), PermuteOp);
const bool kFourVectorRegistered = RegisterWeightOp(std::string(kFourVectorOp), FourVectorOp);

// A constant 1-D vector of four entries (Resize's scales or sizes) in NHWC order.
bool IsFourVector(const Value* v) {
  return v && v->is_constant() && v->constant()->dims().size() == 1 &&
         v->constant()->num_elements() == 4;
}
bool IsEmptyOrAbsent(const Value* v) {
  return !v || (v->is_constant() && v->constant()->num_elements() == 0);
}

class LayoutNhwcPass final : public Pass {
 public:
  std::string_view name() const override { return "layout_nhwc"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    if (ctx.options().conv_layout != "NHWC") return OkStatus();
    // The pass converts the whole graph at once; a graph that already has tagged nodes has been
    // through it (the manager may call it again) and is left alone.
    for (Node* n : graph.nodes()) {
      if (n->attrs().Has("kiln_layout")) return OkStatus();
    }
    KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());

    // 1. Decide, in topological order, which nodes run channels-last. A value is NHWC when its
    // producer is.
    std::unordered_set<const Node*> nhwc;
    auto value_nhwc = [&](const Value* v) {
      return v && v->producer() && nhwc.count(v->producer()) != 0;
    };
    for (Node* n : order) {
      if (Decide(*n, value_nhwc)) nhwc.insert(n);
    }
    if (nhwc.empty()) return OkStatus();

    // 2. Rewrite: tag anchors, permute constants and attributes of agnostic nodes, and put
    // Transposes on every edge that crosses the boundary (one per value and direction).
    std::unordered_map<Value*, Value*> to_nhwc;  // NCHW value -> its transposed twin
    std::vector<std::string> inserted, reshaped;
    auto transpose = [&](Value* src, bool into_nhwc, Value* dst) {
      if (!dst) {
        dst = graph.AddValue(graph.UniqueName(src->name() + (into_nhwc ? "_nhwc" : "_nchw")),
                             src->dtype());
      }
      dst->set_dtype(src->dtype());
      // Values made channels-last still carry their channels-first shape until shapes are
      // re-inferred after the pass, so either way `src->shape()` is in NCHW order.
      const Shape* nchw = src->has_shape() ? &src->shape() : nullptr;
      if (nchw) dst->set_shape(into_nhwc ? ChannelsFirstToLast(*nchw) : *nchw);
      ctx.stats().nodes_added += 1;
      auto is_one = [](const Dim& d) { return d.is_static() && d.value() == 1; };
      if (!into_nhwc && nchw && nchw->size() == 4 && is_one((*nchw)[2]) && is_one((*nchw)[3])) {
        // N x 1 x 1 x C and N x C x 1 x 1 have the same bytes: a Reshape, no data movement.
        Value* target =
            AddLiteralConstant(graph, src->name() + "_nchw_shape",
                               Tensor::FromVector<int64_t>(DataType::kInt64, {4}, {0, -1, 1, 1}));
        graph.AddNode("Reshape", graph.UniqueName(src->name() + "_layout"), {src, target}, {dst});
        reshaped.push_back(src->name());
        return dst;
      }
      AttributeMap attrs;
      attrs.Set("perm",
                into_nhwc ? std::vector<int64_t>{0, 2, 3, 1} : std::vector<int64_t>{0, 3, 1, 2});
      graph.AddNode("Transpose", graph.UniqueName(src->name() + "_layout"), {src}, {dst},
                    std::move(attrs));
      inserted.push_back(fmt::format("{} -> {}", src->name(), into_nhwc ? "NHWC" : "NCHW"));
      return dst;
    };

    for (Node* n : order) {
      if (!nhwc.count(n)) continue;
      if (IsAnchor(OpTypeOf(*n))) n->mutable_attrs().Set("kiln_layout", std::string("NHWC"));
      KILN_RETURN_IF_ERROR(RewriteAgnostic(graph, *n));
      for (size_t i = 0; i < n->num_inputs(); ++i) {
        Value* in = n->input(i);
        if (!in || !IsActivationInput(*n, i) || value_nhwc(in)) continue;
        auto it = to_nhwc.find(in);
        Value* t = it != to_nhwc.end() ? it->second : transpose(in, true, nullptr);
        to_nhwc[in] = t;
        graph.SetInput(n, i, t);
      }
    }
    // NHWC values read by channels-first consumers or leaving the graph.
    for (Node* n : order) {
      if (!nhwc.count(n)) continue;
      for (Value* out : n->outputs()) {
        if (!out) continue;
        std::vector<Node*> nchw_readers;
        for (Node* c : out->consumers()) {
          if (!nhwc.count(c)) nchw_readers.push_back(c);
        }
        if (out->is_graph_output()) {
          // The graph output keeps its name and layout: the transpose produces it, and the
          // channels-last readers go on reading the NHWC twin.
          Value* twin = graph.AddValue(graph.UniqueName(out->name() + "_nhwc"), out->dtype());
          std::vector<Node*> readers = out->consumers();
          graph.ReplaceAllUses(out, twin);  // twin takes the public name and the output mark
          // Now `out` is the private NHWC value and `twin` the public NCHW one.
          transpose(out, false, twin);
          for (Node* c : readers) {
            if (!nhwc.count(c)) continue;
            for (size_t i = 0; i < c->num_inputs(); ++i) {
              if (c->input(i) == twin) graph.SetInput(c, i, out);
            }
          }
          continue;
        }
        if (nchw_readers.empty()) continue;
        Value* t = transpose(out, false, nullptr);
        for (Node* c : nchw_readers) {
          for (size_t i = 0; i < c->num_inputs(); ++i) {
            if (c->input(i) == out) graph.SetInput(c, i, t);
          }
        }
      }
    }
    ctx.stats().rewrites += static_cast<int64_t>(nhwc.size());
    ctx.stats().notes.push_back(
        fmt::format("{} node(s) channels-last; {} transpose(s) inserted{}{}", nhwc.size(),
                    inserted.size(), inserted.empty() ? "" : ": ", fmt::join(inserted, ", ")));
    if (!reshaped.empty()) {
      ctx.stats().notes.push_back(fmt::format("{} 1x1 map(s) back to NCHW by Reshape: {}",
                                              reshaped.size(), fmt::join(reshaped, ", ")));
    }
    return OkStatus();
  }

 private:
  // Inputs that carry the activation (and so follow the node's layout).
  static bool IsActivationInput(const Node& n, size_t i) {
    const OpType op = OpTypeOf(n);
    if (op == OpType::kFusedConv) return i == 0 || i == 3;
    if (IsAnchor(op)) return i == 0;
    if (op == OpType::kResize) return i == 0;
    if (op == OpType::kConcat) return true;
    return !n.input(i)->is_constant();  // elementwise
  }

  template <typename IsNhwc>
  static bool Decide(const Node& n, const IsNhwc& value_nhwc) {
    const OpType op = OpTypeOf(n);
    if (n.num_outputs() != 1 || !IsRank4(n.output(0))) return false;
    // (An int8/uint8 MaxPool stays NCHW: only the float pools have channels-last kernels.)
    if (IsAnchor(op)) return IsRank4(n.input(0)) && IsFloat(n.input(0)->dtype());
    bool any_nhwc = false;
    if (IsAgnostic(op)) {
      for (const Value* in : n.inputs()) {
        if (!in) continue;
        if (in->is_constant()) {
          if (!IsBroadcastConstant(in)) return false;
          continue;
        }
        if (!value_nhwc(in) || !IsRank4(in)) return false;
        any_nhwc = true;
      }
      return any_nhwc;
    }
    if (op == OpType::kConcat) {
      for (const Value* in : n.inputs()) {
        if (!in || !value_nhwc(in) || !IsRank4(in)) return false;
      }
      return true;
    }
    if (op == OpType::kResize) {
      // The resampled axes move with the layout; the attribute form (axes) is left alone.
      if (n.attrs().Has("axes") || !value_nhwc(n.input(0))) return false;
      const Value* roi = n.input(1);
      const Value* scales = n.input(2);
      const Value* sizes = n.input(3);
      bool roi_ok = IsEmptyOrAbsent(roi);
      bool scales_ok = IsEmptyOrAbsent(scales) || IsFourVector(scales);
      bool sizes_ok = IsEmptyOrAbsent(sizes) || IsFourVector(sizes);
      return roi_ok && scales_ok && sizes_ok;
    }
    return false;
  }

  // Makes an agnostic node compute the same thing on the NHWC tensor.
  static Status RewriteAgnostic(Graph& graph, Node& n) {
    const OpType op = OpTypeOf(n);
    if (op == OpType::kConcat) {
      int64_t axis = n.attrs().GetInt("axis", 1);
      if (axis < 0) axis += 4;
      if (axis < 0 || axis > 3) {
        return MakeError(ErrorCode::kInvalidAttribute, "node '{}': Concat axis out of range",
                         n.name());
      }
      n.mutable_attrs().Set("axis", NhwcAxis(axis));
      return OkStatus();
    }
    if (op == OpType::kResize) {
      for (size_t i : {size_t{2}, size_t{3}}) {
        Value* v = n.input(i);
        if (!IsFourVector(v)) continue;
        Value* p = DeriveConstant(graph, v->name() + "_nhwc", std::string(kFourVectorOp), {}, {v});
        if (!p)
          return MakeError(ErrorCode::kInternal, "node '{}': cannot permute '{}'", n.name(),
                           v->name());
        graph.SetInput(&n, i, p);
      }
      return OkStatus();
    }
    if (!IsAgnostic(op)) return OkStatus();
    for (size_t i = 0; i < n.num_inputs(); ++i) {
      Value* v = n.input(i);
      if (!v || !v->is_constant() || v->constant()->num_elements() == 1) continue;
      // Constants may be shared with channels-first readers: the permuted copy is new.
      Value* p = DeriveConstant(graph, v->name() + "_nhwc", std::string(kPermuteOp), {}, {v});
      if (!p)
        return MakeError(ErrorCode::kInternal, "node '{}': cannot permute '{}'", n.name(),
                         v->name());
      graph.SetInput(&n, i, p);
    }
    return OkStatus();
  }
};

}  // namespace

std::unique_ptr<Pass> MakeLayoutNhwcPass() { return std::make_unique<LayoutNhwcPass>(); }

}  // namespace kiln::passes
