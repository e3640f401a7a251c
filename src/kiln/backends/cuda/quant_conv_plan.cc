// Host-side planning of the CUDA INT8 convolution (quant_conv_plan.h).
#include "kiln/backends/cuda/quant_conv_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "kiln/backends/cuda/cuda_common.h"
#include "kiln/backends/cuda/quant_gemm_plan.h"
#include "kiln/ops/op_table.h"
#include "kiln/ops/quant_edge.h"

namespace kiln::cuda {

namespace {

bool Present(const KernelRequest& r, size_t i) {
  return r.inputs.size() > i && r.inputs[i].dtype != DataType::kUndefined;
}

}  // namespace

std::optional<QuantizedConv> ResolveQuantizedConv(const KernelRequest& r) {
  const Node& node = *r.node;
  const OpType op = OpTypeOf(node);
  if ((op != OpType::kConv && op != OpType::kFusedConv) || NodeLayout(node) != "NHWC" ||
      r.inputs.size() < 2 || r.outputs.size() != 1) {
    return std::nullopt;
  }
  QuantizedConv q;
  std::optional<Int8Activation> input = CudaInt8Activation(node);
  if (!input) return std::nullopt;
  q.input = *input;
  // On INT8 edges (ops/quant_edge.h) X arrives as int8, Y leaves as int8, or both; the layer's
  // float type is then the other side's, or W's (the type rule's ProductFloatType).
  q.in_int8 = r.inputs[0].dtype == kInt8EdgeType && node.attrs().Has(kInt8InputEdgeAttr);
  const bool out_int8 = r.outputs[0].dtype == kInt8EdgeType;
  if (out_int8) {
    q.out_scale = node.attrs().GetFloat(kInt8OutputScaleAttr, 0.f);
    if (!(q.out_scale > 0.f && std::isfinite(q.out_scale))) return std::nullopt;
  }
  const DataType t = !q.in_int8 ? r.inputs[0].dtype
                     : out_int8 ? r.inputs[1].dtype
                                : r.outputs[0].dtype;
  auto type = ToBlasType(t);
  if (!type || (!out_int8 && r.outputs[0].dtype != t) || (q.in_int8 && r.inputs[1].dtype != t)) {
    return std::nullopt;
  }
  q.type = *type;
  q.has_bias = Present(r, 2);
  q.has_z = Present(r, 3);
  if ((q.has_bias && r.inputs[2].dtype != t) || (q.has_z && r.inputs[3].dtype != t)) {
    return std::nullopt;
  }
  const Tensor* w = r.inputs[1].constant;
  if (!w || !ToBlasType(w->dtype()) || w->dims().size() != 4) return std::nullopt;
  const auto& wd = w->dims();
  if (wd[0] <= 0 || wd[1] <= 0 || wd[2] <= 0 || wd[3] <= 0) return std::nullopt;
  // int32 accumulation: 127 * 127 * depth must not overflow. Checked on the weight's own dims
  // (their product is a tensor's size, so this cannot overflow) before r and s narrow to int32.
  if (wd[2] * wd[3] * PaddedChannels(wd[1]) > (int64_t{1} << 31) / (127 * 127)) {
    return std::nullopt;
  }
  q.k = wd[0];
  q.c = wd[1];
  q.r = static_cast<int32_t>(wd[2]);
  q.s = static_cast<int32_t>(wd[3]);
  auto attrs = nn::ReadWindowAttrs(node.attrs(), 2, {wd[2], wd[3]});
  if (!attrs.ok() || attrs->group != 1) return std::nullopt;
  q.attrs = *attrs;
  bool unpadded = q.attrs.auto_pad != nn::AutoPad::kNotSet;  // SAME and VALID pad a 1x1 by 0
  if (!unpadded) {
    unpadded =
        std::all_of(q.attrs.pads.begin(), q.attrs.pads.end(), [](int64_t v) { return v == 0; });
  }
  q.pointwise =
      q.r == 1 && q.s == 1 && q.attrs.strides[0] == 1 && q.attrs.strides[1] == 1 && unpadded;
  if (op == OpType::kFusedConv) {
    auto act = ParseFusedActivation(node.attrs());
    if (!act.ok()) return std::nullopt;
    q.act = *act;
  }
  // X [N, H, W, C] at the largest shapes; the bias one value per output channel.
  const std::vector<int64_t> x = LargestDims(r.inputs[0]);
  if (x.size() != 4 || x[3] != q.c) return std::nullopt;
  // An int8 X is read in place as the kernel's [N, H, W, Cp]: no channel padding to add.
  if (q.in_int8 && PaddedChannels(q.c) != q.c) return std::nullopt;
  if (q.has_bias) {
    const std::vector<int64_t> b = LargestDims(r.inputs[2]);
    if (b.size() != 1 || b[0] != q.k) return std::nullopt;
  }
  // The residual is read as Y's twin (no broadcasting).
  if (q.has_z && LargestDims(r.inputs[3]) != LargestDims(r.outputs[0])) return std::nullopt;
  return q;
}

StatusOr<ImplicitGemmConv> ImplicitGemmFor(const QuantizedConv& q, std::span<const int64_t> x,
                                           std::span<const int64_t> y) {
  if (x.size() != 4 || y.size() != 4 || x[3] != q.c || y[3] != q.k || y[0] != x[0]) {
    return MakeError(ErrorCode::kShapeMismatch,
                     "int8 conv: X [{}] and Y [{}] (NHWC) do not agree with the weight [{}, {}, "
                     "{}, {}]",
                     fmt::join(x, ","), fmt::join(y, ","), q.k, q.c, q.r, q.s);
  }
  ImplicitGemmConv g;
  g.batch = x[0];
  g.h = x[1];
  g.w = x[2];
  g.cp = PaddedChannels(q.c);
  g.oh = y[1];
  g.ow = y[2];
  g.r = q.r;
  g.s = q.s;
  const nn::WindowAttrs& a = q.attrs;
  for (size_t i = 0; i < 2; ++i) {
    const int64_t in = x[1 + i], out = y[1 + i];
    if (nn::WindowOutDim<int64_t>(in, a, i) != out) {
      return MakeError(ErrorCode::kShapeMismatch,
                       "int8 conv: output extent {} of axis {} does not follow from input {} and "
                       "the window attributes",
                       out, i, in);
    }
    const int64_t begin = nn::WindowPadBegin(in, out, a, i);
    if (begin < 0) return MakeError(ErrorCode::kUnimplemented, "int8 conv: negative padding");
    // The geometry's window fields are int32 (ImplicitGemmIndexable bounds their combinations).
    constexpr int64_t kNarrow = int64_t{1} << 30;
    if (begin >= kNarrow || a.strides[i] >= kNarrow || a.dilations[i] >= kNarrow) {
      return MakeError(ErrorCode::kUnimplemented,
                       "int8 conv: padding {}, stride {} or dilation {} of axis {} passes the "
                       "kernel's 32-bit window arithmetic (2^30)",
                       begin, a.strides[i], a.dilations[i], i);
    }
    (i == 0 ? g.pad_top : g.pad_left) = static_cast<int32_t>(begin);
    (i == 0 ? g.stride_h : g.stride_w) = static_cast<int32_t>(a.strides[i]);
    (i == 0 ? g.dil_h : g.dil_w) = static_cast<int32_t>(a.dilations[i]);
  }
  if (!ImplicitGemmIndexable(g)) {
    return MakeError(ErrorCode::kUnimplemented,
                     "int8 conv: {} output pixels by a depth of {} passes the kernel's 32-bit "
                     "indexing (2^31 each); run smaller batches",
                     g.rows(), g.depth());
  }
  return g;
}

Int8PackedConv PackInt8Conv(const QuantizedConv& q, const Int8Weights& w) {
  Int8PackedConv p;
  p.kp = QuantPadded(q.k);
  p.depth = int64_t{q.r} * q.s * PaddedChannels(q.c);
  p.packed = PackConvWeights(w.q.data(), q.k, q.c, q.r, q.s, p.kp);
  p.col_scale.assign(static_cast<size_t>(p.kp), 0.f);
  for (int64_t k = 0; k < q.k; ++k) {
    p.col_scale[static_cast<size_t>(k)] = q.input.scale * w.scales[static_cast<size_t>(k)];
  }
  return p;
}

}  // namespace kiln::cuda
