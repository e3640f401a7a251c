// Stem space-to-depth: a strided convolution of a few-channel input (the 7x7 stride-2 stem of
// ResNets from 3 channels, the 3x3 stride-2 stems of MobileNets and EfficientNets) becomes a
// stride-1 convolution over the input's s_h x s_w blocks moved into channels.
//
//   Conv(X [N, C, H, W], W [K, C, kh, kw], B), strides (s_h, s_w), pads (p_t, p_l, p_b, p_r)
//   =>  S = Transpose(Reshape(Transpose(Reshape(X, [N, C, H/s_h, s_h, W/s_w, s_w]),
//                                       (0, 2, 4, 3, 5, 1)),
//                             [N, H/s_h, W/s_w, s_h*s_w*C]),
//                     (0, 3, 1, 2))                          (channel (dy*s_w + dx)*C + c)
//       Y = Conv(S, W', B), stride 1, kernel (kh', kw'), pads (P_t, P_l, P_b, P_r)
//
// per axis (stride s, begin pad p, kernel k, output extent o): P = ceil(p / s) blocks of padding
// before, the taps shifted by d = s*P - p, k' = ceil((k + d) / s) taps, and the end padding that
// gives o outputs. W'[o, (dy*s_w + dx)*C + c, a, b] = W[o, c, s_h*a + dy - d_h, s_w*b + dx - d_w],
// zero where that tap is outside W. The same sums of the same products: Y is the convolution's.
//
// Why: kiln's INT8 implicit-GEMM convolution (CUDA) reads each window's channels in 16-byte
// chunks, padding C to 16, so a 7x7 window of 3 channels is a depth of 49 * 16 = 784 of which 147
// are the model's; over 2 x 2 blocks the same window is 4 x 4 taps of 12 channels, a depth of
// 4 * 4 * 16 = 256 (a third of the products and of the gathers). The rewrite applies only where
// that depth shrinks, and only when the builder asks for it (PassOptions::stem_space_to_depth: an
// INT8 build on CUDA with the quantized tactics on): a float convolution does the zero taps' work
// too (PyTorch's CPU convolution of ResNet's stem ran about 1.8x slower so). The blocks do not
// overlap: the first Transpose moves each input element once, and under the NHWC layout the
// second cancels against the layout's.
#include <fmt/format.h>

#include <cstring>

#include "kiln/ir/weight_program.h"
#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"

namespace kiln::passes {
namespace {

constexpr std::string_view kWeightOp = kStemSpaceToDepthWeightsOp;
// The implicit-GEMM convolution's channel chunk: a window's channels are padded to a multiple.
constexpr int64_t kChannelChunk = 16;
// Strides the rewrite takes (stems stride by 2 to 4; the weight op refuses more: StemWeights).
constexpr int64_t kMaxStride = 64;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t PaddedChannels(int64_t c) { return CeilDiv(c, kChannelChunk) * kChannelChunk; }

// One axis of the rewrite: stride s, begin padding p, kernel k, input extent n (a multiple of s),
// output extent o. Blocks of padding before, the taps' shift, the new kernel and the end padding
// (negative: the rewrite does not apply).
struct Axis {
  int64_t pad_begin, shift, kernel, pad_end;
};
Axis AxisFor(int64_t s, int64_t p, int64_t k, int64_t n, int64_t o) {
  Axis a;
  a.pad_begin = CeilDiv(p, s);
  a.shift = s * a.pad_begin - p;
  a.kernel = CeilDiv(k + a.shift, s);
  a.pad_end = o - 1 + a.kernel - n / s - a.pad_begin;
  return a;
}

// The weight op: W [K, C, kh, kw] as the stride-1 convolution's [K, s_h*s_w*C, kh', kw']
// (attributes strides and shift; any element type, the missing taps zero). The taps kh', kw'
// follow from W's window, the strides and the shifts (AxisFor). Refit replays the op with the
// attributes an engine file holds: strides outside [1, kMaxStride] or a shift outside [0, stride)
// are refused, which also bounds the output to a small multiple of W.
StatusOr<std::vector<Tensor>> StemWeights(const AttributeMap& a,
                                          std::span<const Tensor* const> in) {
  const std::vector<int64_t> strides = a.GetInts("strides"), shift = a.GetInts("shift");
  if (in.size() != 1 || !in[0] || in[0]->dims().size() != 4 || strides.size() != 2 ||
      shift.size() != 2) {
    return MakeError(ErrorCode::kInternal, "{}: one 4-D input, two strides and shifts", kWeightOp);
  }
  for (int i = 0; i < 2; ++i) {
    if (strides[i] < 1 || strides[i] > kMaxStride || shift[i] < 0 || shift[i] >= strides[i]) {
      return MakeError(ErrorCode::kInternal,
                       "{}: stride {} and shift {} (a stride of 1-{}, a shift below it)", kWeightOp,
                       strides[i], shift[i], kMaxStride);
    }
  }
  const Tensor& w = *in[0];
  const int64_t k = w.dims()[0], c = w.dims()[1], kh = w.dims()[2], kw = w.dims()[3];
  const int64_t sh = strides[0], sw = strides[1];
  const int64_t kernel[2] = {CeilDiv(kh + shift[0], sh), CeilDiv(kw + shift[1], sw)};
  Tensor out(w.dtype(), {k, sh * sw * c, kernel[0], kernel[1]});  // zero-filled
  const size_t es = SizeOf(w.dtype());
  const auto* src = static_cast<const std::byte*>(w.raw());
  auto* dst = static_cast<std::byte*>(out.mutable_raw());
  for (int64_t o = 0; o < k; ++o) {
    for (int64_t dy = 0; dy < sh; ++dy) {
      for (int64_t dx = 0; dx < sw; ++dx) {
        for (int64_t ci = 0; ci < c; ++ci) {
          const int64_t ch = (dy * sw + dx) * c + ci;
          for (int64_t ta = 0; ta < kernel[0]; ++ta) {
            const int64_t i = sh * ta + dy - shift[0];
            if (i < 0 || i >= kh) continue;
            for (int64_t tb = 0; tb < kernel[1]; ++tb) {
              const int64_t j = sw * tb + dx - shift[1];
              if (j < 0 || j >= kw) continue;
              std::memcpy(dst + (((o * sh * sw * c + ch) * kernel[0] + ta) * kernel[1] + tb) * es,
                          src + (((o * c + ci) * kh + i) * kw + j) * es, es);
            }
          }
        }
      }
    }
  }
  std::vector<Tensor> result;
  result.push_back(std::move(out));
  return result;
}
const bool kWeightOpRegistered = RegisterWeightOp(std::string(kWeightOp), StemWeights);

class StemSpaceToDepthPass final : public Pass {
 public:
  std::string_view name() const override { return "stem_space_to_depth"; }

  Status Run(Graph& graph, PassContext& ctx) override {
    if (!ctx.options().stem_space_to_depth) return OkStatus();
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
    const Shape& ys = y->shape();
    const std::vector<int64_t>& wd = w->constant()->dims();
    if (xs.size() != 4 || wd.size() != 4 || ys.size() != 4) return;
    for (int i = 1; i < 4; ++i) {
      if (!xs[i].is_static() || !ys[i].is_static()) return;
    }
    const int64_t c = xs[1].value(), hh = xs[2].value(), ww = xs[3].value();
    const int64_t kh = wd[2], kw = wd[3];
    if (wd[1] != c || attrs::Conv::group(*conv) != 1) return;
    if (attrs::Conv::auto_pad(*conv) != "NOTSET") return;
    const std::vector<int64_t> window{kh, kw};
    if (conv->attrs().GetInts("kernel_shape", window) != window) return;
    const std::vector<int64_t> strides = attrs::Conv::strides(*conv);
    const std::vector<int64_t> dilations = attrs::Conv::dilations(*conv);
    std::vector<int64_t> pads = attrs::Conv::pads(*conv);
    if (pads.empty()) pads.assign(4, 0);
    if (strides.size() != 2 || pads.size() != 4) return;
    if (!dilations.empty() && dilations != std::vector<int64_t>{1, 1}) return;
    const int64_t sh = strides[0], sw = strides[1];
    if (sh < 1 || sw < 1 || sh > kMaxStride || sw > kMaxStride || sh * sw < 2 || hh % sh != 0 ||
        ww % sw != 0) {
      return;
    }
    for (int64_t p : pads) {
      if (p < 0) return;
    }
    const Axis ah = AxisFor(sh, pads[0], kh, hh, ys[2].value());
    const Axis aw = AxisFor(sw, pads[1], kw, ww, ys[3].value());
    if (ah.pad_end < 0 || aw.pad_end < 0) return;
    // Only where the implicit GEMM's depth (taps times channels padded to its chunk) shrinks.
    const int64_t depth = kh * kw * PaddedChannels(c);
    const int64_t new_depth = ah.kernel * aw.kernel * PaddedChannels(sh * sw * c);
    if (new_depth >= depth) return;

    AttributeMap wa;
    wa.Set("strides", std::vector<int64_t>{sh, sw});
    wa.Set("shift", std::vector<int64_t>{ah.shift, aw.shift});
    Value* w2 =
        DeriveConstant(graph, w->name() + "_space_to_depth", std::string(kWeightOp), wa, {w});
    if (!w2) return;

    const Dim& n = xs[0];
    const DataType dt = x->dtype();
    const int64_t h2 = hh / sh, w2d = ww / sw;
    const std::string name = conv->name();
    auto reshape = [&](Value* in, const Shape& to, const std::string& suffix) -> Value* {
      // Each shape has at most the batch symbolic, so it fits a shape constant.
      Value* target = AddShapeConstant(graph, name + suffix + "_shape", to);
      Value* out = graph.AddValue(graph.UniqueName(name + suffix), dt);
      out->set_shape(to);
      graph.AddNode("Reshape", graph.UniqueName(name + suffix), {in, target}, {out});
      return out;
    };
    auto transpose = [&](Value* in, std::vector<int64_t> perm, const Shape& to,
                         const std::string& suffix) {
      Value* out = graph.AddValue(graph.UniqueName(name + suffix), dt);
      out->set_shape(to);
      AttributeMap a;
      a.Set("perm", std::move(perm));
      graph.AddNode("Transpose", graph.UniqueName(name + suffix), {in}, {out}, std::move(a));
      return out;
    };
    // The blocks go channels-last first, then the whole to channels-first: under the NHWC layout
    // (layout_nhwc.cc) the last Transpose meets the layout's own before the convolution and the
    // two cancel (transpose_sinking), so the input is moved once, as the layout moved it before.
    Value* split = reshape(x, {n, c, h2, sh, w2d, sw}, "_blocks");
    Value* moved = transpose(split, {0, 2, 4, 3, 5, 1}, {n, h2, w2d, sh, sw, c}, "_blocks_moved");
    Value* last = reshape(moved, {n, h2, w2d, sh * sw * c}, "_space_to_depth_nhwc");
    Value* s2d = transpose(last, {0, 3, 1, 2}, {n, sh * sw * c, h2, w2d}, "_space_to_depth");

    AttributeMap ca;
    ca.Set("kernel_shape", std::vector<int64_t>{ah.kernel, aw.kernel});
    ca.Set("strides", std::vector<int64_t>{1, 1});
    ca.Set("dilations", std::vector<int64_t>{1, 1});
    ca.Set("pads", std::vector<int64_t>{ah.pad_begin, aw.pad_begin, ah.pad_end, aw.pad_end});
    ca.Set("group", int64_t{1});
    std::vector<Value*> conv_in{s2d, w2};
    if (bias) conv_in.push_back(bias);
    // The Conv's output value and name move to the new one (its readers stay).
    graph.RemoveNode(conv);
    graph.AddNode("Conv", graph.UniqueName(name), std::move(conv_in), {y}, std::move(ca));
    ctx.stats().rewrites += 1;
    ctx.stats().nodes_removed += 1;
    ctx.stats().nodes_added += 5;
    ctx.stats().notes.push_back(fmt::format(
        "{}: {}x{} stride {}x{} from {} channels as {}x{} stride 1 over {}x{} blocks (depth {} -> "
        "{} with channels padded to {})",
        name, kh, kw, sh, sw, c, ah.kernel, aw.kernel, sh, sw, depth, new_depth, kChannelChunk));
  }
};

}  // namespace

std::unique_ptr<Pass> MakeStemSpaceToDepthPass() {
  return std::make_unique<StemSpaceToDepthPass>();
}

}  // namespace kiln::passes
