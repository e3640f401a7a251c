// Conv geometry shared by the CPU conv tactics.
#include "kiln/backends/cpu/conv_common.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {

std::vector<int64_t> MaxDimsOf(const OperandDesc& operand) {
  if (!operand.max_dims.empty()) return operand.max_dims;
  if (auto dims = StaticDims(operand.shape)) return *dims;
  return {};
}

StatusOr<ConvSpec> ReadConvSpec(const KernelRequest& request, size_t min_spatial,
                                size_t max_spatial) {
  const Node& node = *request.node;
  if (request.inputs.size() < 2 || request.outputs.empty()) {
    return MakeError(ErrorCode::kInvalidModel, "node '{}' ({}): needs X, W and one output",
                     node.name(), node.op_type());
  }
  size_t rank = request.inputs[0].shape.size();
  if (rank < min_spatial + 2 || rank > max_spatial + 2) {
    return MakeError(ErrorCode::kUnimplemented,
                     "node '{}' ({}): this CPU convolution runs {}-D to {}-D convolutions; the "
                     "input has rank {}",
                     node.name(), node.op_type(), min_spatial, max_spatial, rank);
  }
  auto kernel = StaticDims(request.inputs[1].shape);
  if (!kernel || kernel->size() != rank) {
    return MakeError(ErrorCode::kShapeMismatch, "node '{}': weight shape must be static, rank {}",
                     node.name(), rank);
  }
  ConvSpec spec;
  spec.spatial_rank = rank - 2;
  std::vector<int64_t> k(kernel->begin() + 2, kernel->end());
  auto attrs = nn::ReadWindowAttrs(node.attrs(), spec.spatial_rank, k);
  if (!attrs.ok()) {
    return MakeError(attrs.status().code(), "node '{}' ({}): {}", node.name(), node.op_type(),
                     attrs.status().message());
  }
  spec.attrs = std::move(*attrs);
  if (IsOp(node, OpType::kFusedConv)) {
    KILN_ASSIGN_OR_RETURN(spec.act, ParseFusedActivation(node.attrs()));
  }
  return spec;
}

StatusOr<ConvGeometry> ResolveConvGeometry(const ConvSpec& spec, std::span<const int64_t> x,
                                           std::span<const int64_t> w, std::span<const int64_t> y) {
  const nn::WindowAttrs& a = spec.attrs;
  size_t r = spec.spatial_rank;
  if (x.size() != r + 2 || w.size() != r + 2) {
    return MakeError(ErrorCode::kShapeMismatch, "conv operands have ranks {} and {}; expected {}",
                     x.size(), w.size(), r + 2);
  }
  ConvGeometry g;
  g.n = x[0];
  g.group = a.group;
  g.cg = w[1];
  g.mg = w[0] / a.group;
  if (x[1] != g.cg * g.group || w[0] % a.group != 0) {
    return MakeError(ErrorCode::kShapeMismatch, "conv input has {} channels; weight expects {}",
                     x[1], g.cg * g.group);
  }
  // Axis i of the attributes maps to H (2-D only) and W.
  size_t hi = 0, wi = r - 1;
  int64_t out_h = r == 2 ? nn::WindowOutDim<int64_t>(x[2], a, hi) : 1;
  int64_t out_w = nn::WindowOutDim<int64_t>(x[r + 1], a, wi);
  if (r == 2) {
    g.ih = x[2];
    g.oh = out_h;
    g.kh = a.kernel[hi];
    g.sh = a.strides[hi];
    g.dh = a.dilations[hi];
    g.ph = nn::WindowPadBegin(g.ih, g.oh, a, hi);
    g.pad_h_end = (g.oh - 1) * g.sh + g.dh * (g.kh - 1) + 1 - g.ih - g.ph;
  }
  g.iw = x[r + 1];
  g.ow = out_w;
  g.kw = a.kernel[wi];
  g.sw = a.strides[wi];
  g.dw = a.dilations[wi];
  g.pw = nn::WindowPadBegin(g.iw, g.ow, a, wi);
  g.pad_w_end = (g.ow - 1) * g.sw + g.dw * (g.kw - 1) + 1 - g.iw - g.pw;
  if (g.oh < 1 || g.ow < 1) {
    return MakeError(ErrorCode::kShapeMismatch, "conv output would be empty");
  }
  if (!y.empty()) {
    bool ok = y.size() == r + 2 && y[0] == g.n && y[1] == g.mg * g.group && y[r + 1] == g.ow &&
              (r == 1 || y[2] == g.oh);
    if (!ok) {
      return MakeError(ErrorCode::kShapeMismatch,
                       "conv output dims do not match the attributes (expected {} x {} x {} x {})",
                       g.n, g.mg * g.group, g.oh, g.ow);
    }
  }
  return g;
}

StatusOr<ConvGeometry> MaxConvGeometry(const ConvSpec& spec, const KernelRequest& request) {
  std::vector<int64_t> x = MaxDimsOf(request.inputs[0]);
  std::vector<int64_t> w = MaxDimsOf(request.inputs[1]);
  if (x.empty() || w.empty()) {
    return MakeError(ErrorCode::kInvalidArgument, "conv operand dims are unknown");
  }
  return ResolveConvGeometry(spec, x, w, {});
}

}  // namespace kiln::cpu
