// Conv1d lift: where the layout pass will run (PassOptions::conv_layout "NHWC"), a 1-D
// convolution becomes the 2-D one of height 1, so that it joins the channels-last stacks:
//
//   Conv(X [N, C, L], W [K, C/g, k], B?, Z?)
//   =>  Reshape(Conv(Reshape(X, [N, C, 1, L]), W' [K, C/g, 1, k], B?, Reshape(Z, [N, K, 1, L'])),
//               [N, K, L'])
//
// with kernel_shape, strides, dilations and pads given a leading 1 (pads 0 top and bottom). A
// lifted convolution that reads another's output reads its 4-D value directly, so a Conv1d stack
// (Whisper's two-convolution stem) stays 4-D between its layers and the layout pass puts one
// Transpose at each end. The Transpose back meets the model's own permute to [N, L', K] in
// transpose sinking, through the Reshape (its Reshape rule). Conv and FusedConv; a convolution
// the model quantized (Q/DQ) stays as it is. The Reshape targets use 0 (copy the dim) and -1, so a
// symbolic batch and length both fit.
#include <fmt/format.h>

#include <unordered_set>

#include "kiln/ops/int8_layer.h"
#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"

namespace kiln::passes {
namespace {

std::vector<int64_t> Lifted(const std::vector<int64_t>& v, int64_t lead) {
  if (v.empty()) return {};
  std::vector<int64_t> out{lead};
  out.insert(out.end(), v.begin(), v.end());
  return out;
}

class Conv1dLiftPass final : public Pass {
 public:
  std::string_view name() const override { return "conv1d_lift"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    if (ctx.options().conv_layout != "NHWC") return OkStatus();
    KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
    lifted_.clear();
    for (Node* n : order) {
      if (n->is_dead() || !(IsOp(*n, OpType::kConv) || IsOp(*n, OpType::kFusedConv))) continue;
      Lift(graph, ctx, n);
    }
    return OkStatus();
  }

 private:
  // A Reshape of `v` to 4-D with a unit third axis: `v` itself when it is a lifted output's
  // Reshape back to 3-D (its 4-D source), else a new Reshape.
  Value* To4d(Graph& graph, Value* v, const std::string& prefix) {
    if (Node* p = v->producer(); p && IsOp(*p, OpType::kReshape) && lifted_.count(p)) {
      return p->input(0);
    }
    Value* target =
        AddLiteralConstant(graph, prefix + "_shape",
                           Tensor::FromVector<int64_t>(DataType::kInt64, {4}, {0, 0, 1, -1}));
    Value* out = graph.AddValue(graph.UniqueName(prefix), v->dtype());
    const Shape& s = v->shape();
    out->set_shape({s[0], s[1], Dim(1), s[2]});
    graph.AddNode("Reshape", graph.UniqueName(prefix), {v, target}, {out});
    return out;
  }

  void Lift(Graph& graph, PassContext& ctx, Node* conv) {
    Value* x = conv->input(0);
    Value* w = conv->input(1);
    Value* y = conv->output(0);
    if (!x || !w || !y || !w->is_constant() || !x->has_shape() || !y->has_shape()) return;
    if (x->shape().size() != 3 || y->shape().size() != 3 || w->constant()->dims().size() != 3) {
      return;
    }
    if (conv->num_outputs() != 1 || HasModelInt8Attrs(*conv)) return;
    Value* z = conv->num_inputs() > 3 ? conv->input(3) : nullptr;
    if (z && (!z->has_shape() || z->shape().size() != 3)) return;
    const AttributeMap& a = conv->attrs();
    const std::string auto_pad = a.GetString("auto_pad", "NOTSET");
    if (auto_pad != "NOTSET" && auto_pad != "VALID") return;
    const std::vector<int64_t> wd = w->constant()->dims();
    const std::vector<int64_t> pads = a.GetInts("pads");
    if (!pads.empty() && pads.size() != 2) return;

    AttributeMap attrs = a;
    attrs.Set("kernel_shape", std::vector<int64_t>{1, wd[2]});
    if (auto v = Lifted(a.GetInts("strides"), 1); !v.empty()) attrs.Set("strides", v);
    if (auto v = Lifted(a.GetInts("dilations"), 1); !v.empty()) attrs.Set("dilations", v);
    if (!pads.empty()) attrs.Set("pads", std::vector<int64_t>{0, pads[0], 0, pads[1]});
    AttributeMap dims;
    dims.Set("dims", std::vector<int64_t>{wd[0], wd[1], 1, wd[2]});
    Value* w4 = DeriveConstant(graph, w->name() + "_2d", std::string(kReshapeBytesOp), dims, {w});
    if (!w4) return;

    const std::string name = conv->name();
    std::vector<Value*> inputs(conv->inputs().begin(), conv->inputs().end());
    inputs[0] = To4d(graph, x, name + "_x2d");
    inputs[1] = w4;
    if (z) inputs[3] = To4d(graph, z, name + "_z2d");
    Value* y4 = graph.AddValue(graph.UniqueName(y->name() + "_2d"), y->dtype());
    const Shape& ys = y->shape();
    y4->set_shape({ys[0], ys[1], Dim(1), ys[2]});
    const std::string op_type = conv->op_type();
    graph.RemoveNode(conv);  // releases y, which the Reshape back produces
    graph.AddNode(op_type, graph.UniqueName(name + "_2d"), std::move(inputs), {y4},
                  std::move(attrs));
    // An earlier lifted output's Reshape back to 3-D that nothing reads now goes, so that the
    // layout pass sees no channels-first reader of the 4-D value.
    for (Value* v : {x, z}) {
      Node* p = v ? v->producer() : nullptr;
      if (p && lifted_.count(p) && v->consumers().empty() && !v->is_graph_output()) {
        lifted_.erase(p);
        graph.RemoveNode(p);
        ctx.stats().nodes_removed += 1;
      }
    }
    Value* back = AddLiteralConstant(
        graph, name + "_1d_shape", Tensor::FromVector<int64_t>(DataType::kInt64, {3}, {0, 0, -1}));
    Node* r = graph.AddNode("Reshape", graph.UniqueName(name + "_1d"), {y4, back}, {y});
    lifted_.insert(r);
    ctx.stats().rewrites += 1;
    ctx.stats().nodes_added += 2;
  }

  // The Reshapes back to 3-D this run made (read by To4d).
  std::unordered_set<const Node*> lifted_;
};

}  // namespace

std::unique_ptr<Pass> MakeConv1dLiftPass() { return std::make_unique<Conv1dLiftPass>(); }

}  // namespace kiln::passes
