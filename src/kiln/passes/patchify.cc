// Patchify: a convolution whose windows tile its input (stride equal to the kernel, no padding,
// no dilation, one group) is one matrix product over the input's patches.
//
//   Conv(X [N, C, H, W], W [K, C, kh, kw], B), stride (kh, kw), H % kh == W % kw == 0
//   =>  P = Reshape(Transpose(Reshape(X, [N, C, h, kh, w, kw]), (0, 2, 4, 1, 3, 5)),
//                   [N*h*w, C*kh*kw])
//       G = Gemm(P, Reshape(W, [K, C*kh*kw]), B, transB=1)
//       Y = Transpose(Reshape(G, [N, h, w, K]), (0, 3, 1, 2))
//
// The patches do not overlap, so the Transpose moves each input element once: no element is
// copied twice as in a general im2col. This is the patch embedding of ViT-family models (ViT, DeiT,
// CLIP: 16x16 windows from 3 channels) and the stem of Swin and ConvNeXt (4x4 from 3 channels).
// It applies only when the convolution reads few channels (fewer than kMaxChannels): an
// implicit-GEMM convolution then pads each window's channels to its vector width and wastes most of
// its work (a cuDNN 16x16 stride-16 convolution from 3 channels runs at a tenth of the product's
// rate), while with many channels it is as fast as the product and the Transpose would be a pass
// over the data it does not need.
//
// The output's Transpose back to channels-first usually meets the model's own permute to
// channels-last (ViT's flatten(2).transpose(1, 2), Swin's and ConvNeXt's permute before their
// LayerNorm) and cancels in transpose sinking (which moves a Transpose below a Reshape that
// merges runs of the Transpose's axes).
#include <fmt/format.h>

#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"

namespace kiln::passes {
namespace {

// Input channels below which the rewrite applies (see above).
constexpr int64_t kMaxChannels = 8;
// Windows smaller than this many elements stay convolutions (a 1x1 "patch" is a product already).
constexpr int64_t kMinWindow = 4;

class PatchifyPass final : public Pass {
 public:
  std::string_view name() const override { return "patchify"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    for (Node* node : graph.nodes()) {
      if (node->is_dead() || !IsOp(*node, OpType::kConv)) continue;
      Rewrite(graph, ctx, node);
    }
    return OkStatus();
  }

 private:
  static void Rewrite(Graph& graph, PassContext& ctx, Node* conv) {
    const std::optional<ConstantWeightConv> operands = AsConstantWeightConv(*conv);
    if (!operands) return;
    Value* x = operands->x;
    Value* w = operands->w;
    Value* bias = operands->bias;
    Value* y = operands->y;
    const Shape& xs = x->shape();
    const std::vector<int64_t>& wd = w->constant()->dims();
    if (xs.size() != 4 || wd.size() != 4 || y->shape().size() != 4) return;
    if (!xs[1].is_static() || !xs[2].is_static() || !xs[3].is_static()) return;
    const int64_t c = xs[1].value(), hh = xs[2].value(), ww = xs[3].value();
    const int64_t k = wd[0], kh = wd[2], kw = wd[3];
    if (wd[1] != c || c >= kMaxChannels || kh * kw < kMinWindow) return;
    if (attrs::Conv::group(*conv) != 1) return;
    const std::string auto_pad = attrs::Conv::auto_pad(*conv);
    if (auto_pad != "NOTSET" && auto_pad != "VALID") return;
    const std::vector<int64_t> window{kh, kw};
    std::vector<int64_t> kernel = conv->attrs().GetInts("kernel_shape", window);
    std::vector<int64_t> strides = attrs::Conv::strides(*conv);
    std::vector<int64_t> dilations = attrs::Conv::dilations(*conv);
    std::vector<int64_t> pads = attrs::Conv::pads(*conv);
    if (kernel != window || strides != window) return;
    if (!dilations.empty() && dilations != std::vector<int64_t>{1, 1}) return;
    for (int64_t p : pads) {
      if (p != 0) return;
    }
    if (hh % kh != 0 || ww % kw != 0) return;
    const int64_t h = hh / kh, wo = ww / kw;
    const Dim& n = xs[0];
    const DataType dt = x->dtype();

    auto reshape = [&](Value* in, const Shape& to, const std::string& suffix) -> Value* {
      // Each shape has at most the batch symbolic, so it fits a shape constant.
      Value* target = AddShapeConstant(graph, conv->name() + suffix + "_shape", to);
      Value* out = graph.AddValue(graph.UniqueName(conv->name() + suffix), dt);
      out->set_shape(to);
      graph.AddNode("Reshape", graph.UniqueName(conv->name() + suffix), {in, target}, {out});
      return out;
    };
    auto transpose = [&](Value* in, std::vector<int64_t> perm, const Shape& to,
                         const std::string& suffix, Value* out = nullptr) {
      if (!out) {
        out = graph.AddValue(graph.UniqueName(conv->name() + suffix), dt);
        out->set_shape(to);
      }
      AttributeMap a;
      a.Set("perm", std::move(perm));
      graph.AddNode("Transpose", graph.UniqueName(conv->name() + suffix), {in}, {out},
                    std::move(a));
      return out;
    };
    // The weight as [K, C*kh*kw]: the same bytes, recorded for refit.
    AttributeMap dims;
    dims.Set("dims", std::vector<int64_t>{k, c * kh * kw});
    Value* wm =
        DeriveConstant(graph, w->name() + "_patches", std::string(kReshapeBytesOp), dims, {w});
    if (!wm) return;

    // Only the batch may be symbolic: it is then the one -1 of each shape constant below.
    const Dim rows = n * Dim(h * wo);
    Value* split = reshape(x, {n, c, h, kh, wo, kw}, "_windows");
    Value* patches6 = transpose(split, {0, 2, 4, 1, 3, 5}, {n, h, wo, c, kh, kw}, "_patches");
    Value* patches = reshape(patches6, {rows, c * kh * kw}, "_rows");
    Value* prod = graph.AddValue(graph.UniqueName(conv->name() + "_product"), dt);
    prod->set_shape({rows, k});
    AttributeMap gemm;
    gemm.Set("transB", int64_t{1});
    std::vector<Value*> gemm_in{patches, wm};
    if (bias) gemm_in.push_back(bias);
    graph.AddNode("Gemm", graph.UniqueName(conv->name() + "_product"), std::move(gemm_in), {prod},
                  std::move(gemm));
    Value* grid = reshape(prod, {n, h, wo, k}, "_grid");
    // The Conv's output value moves to the final Transpose (its name and readers stay).
    const std::string name = conv->name();
    graph.RemoveNode(conv);
    transpose(grid, {0, 3, 1, 2}, {}, "_nchw", y);
    ctx.stats().rewrites += 1;
    ctx.stats().nodes_removed += 1;
    ctx.stats().nodes_added += 6;
    ctx.stats().notes.push_back(
        fmt::format("{}: {}x{} windows from {} channels as one product", name, kh, kw, c));
  }
};

}  // namespace

std::unique_ptr<Pass> MakePatchifyPass() { return std::make_unique<PatchifyPass>(); }

}  // namespace kiln::passes
