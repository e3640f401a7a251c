// Shape rules of the neural-network layers: Conv, ConvTranspose, the pools, BatchNormalization
// and Resize, plus the window geometry (nn.h) their kernels share.
#include "kiln/ops/nn.h"

#include <algorithm>
#include <cmath>

#include "kiln/ir/sizes.h"
#include "kiln/ops/op_schema.h"
#include "kiln/ops/op_table.h"
#include "kiln/ops/quant_edge.h"
#include "kiln/ops/rule_util.h"

namespace kiln {

namespace nn {

StatusOr<WindowAttrs> ReadWindowAttrs(const AttributeMap& attrs, size_t rank,
                                      const std::vector<int64_t>& kernel_from_weights) {
  WindowAttrs a;
  std::string pad = attrs.GetString("auto_pad", "NOTSET");
  if (pad == "NOTSET") {
    a.auto_pad = AutoPad::kNotSet;
  } else if (pad == "SAME_UPPER") {
    a.auto_pad = AutoPad::kSameUpper;
  } else if (pad == "SAME_LOWER") {
    a.auto_pad = AutoPad::kSameLower;
  } else if (pad == "VALID") {
    a.auto_pad = AutoPad::kValid;
  } else {
    return MakeError(ErrorCode::kInvalidAttribute,
                     "auto_pad '{}' is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID", pad);
  }
  a.kernel = attrs.GetInts("kernel_shape", kernel_from_weights);
  if (a.kernel.size() != rank) {
    return MakeError(ErrorCode::kInvalidAttribute,
                     "kernel_shape has {} entries; the input has {} spatial dims", a.kernel.size(),
                     rank);
  }
  if (!kernel_from_weights.empty() && a.kernel != kernel_from_weights) {
    return MakeError(ErrorCode::kInvalidAttribute,
                     "kernel_shape does not match the weight tensor's spatial dims");
  }
  auto read = [&](const char* name, size_t n, int64_t def, int64_t min,
                  std::vector<int64_t>& out) -> Status {
    out = attrs.GetInts(name, std::vector<int64_t>(n, def));
    if (out.empty()) out.assign(n, def);
    if (out.size() != n) {
      return MakeError(ErrorCode::kInvalidAttribute, "{} has {} entries; expected {}", name,
                       out.size(), n);
    }
    for (int64_t v : out) {
      if (v < min || v > kMaxDim) {
        return MakeError(ErrorCode::kInvalidAttribute, "{} has value {}; it must be in [{}, {}]",
                         name, v, min, kMaxDim);
      }
    }
    return OkStatus();
  };
  for (int64_t k : a.kernel) {
    if (k < 1 || k > kMaxDim) {
      return MakeError(ErrorCode::kInvalidAttribute, "kernel_shape has value {}", k);
    }
  }
  KILN_RETURN_IF_ERROR(read("strides", rank, 1, 1, a.strides));
  KILN_RETURN_IF_ERROR(read("dilations", rank, 1, 1, a.dilations));
  // The dilated kernel extent, which the window formulas (nn.h) use unchecked.
  for (size_t i = 0; i < rank; ++i) {
    auto k_eff = CheckedMul(a.dilations[i], a.kernel[i] - 1);
    if (!k_eff || *k_eff >= kMaxDim) {
      return MakeError(ErrorCode::kInvalidAttribute,
                       "dilations {} x kernel_shape {} on axis {}: the dilated kernel is larger "
                       "than {}",
                       a.dilations[i], a.kernel[i], i, kMaxDim);
    }
  }
  KILN_RETURN_IF_ERROR(read("pads", 2 * rank, 0, 0, a.pads));
  KILN_RETURN_IF_ERROR(read("output_padding", rank, 0, 0, a.output_padding));
  a.output_shape = attrs.GetInts("output_shape");
  if (a.output_shape.size() == rank + 2)
    a.output_shape.erase(a.output_shape.begin(), a.output_shape.begin() + 2);
  if (!a.output_shape.empty() && a.output_shape.size() != rank) {
    return MakeError(ErrorCode::kInvalidAttribute, "output_shape has {} entries; expected {}",
                     a.output_shape.size(), rank);
  }
  a.group = attrs.GetInt("group", 1);
  if (a.group < 1) return MakeError(ErrorCode::kInvalidAttribute, "group is {}", a.group);
  a.ceil_mode = attrs.GetInt("ceil_mode", 0) != 0;
  return a;
}

int64_t WindowPadBegin(int64_t in, int64_t out, const WindowAttrs& a, size_t i) {
  if (a.auto_pad == AutoPad::kNotSet) return a.pads[i];
  if (a.auto_pad == AutoPad::kValid) return 0;
  int64_t k_eff = a.dilations[i] * (a.kernel[i] - 1) + 1;
  int64_t total = std::max<int64_t>(0, (out - 1) * a.strides[i] + k_eff - in);
  return a.auto_pad == AutoPad::kSameUpper ? total / 2 : total - total / 2;
}

int64_t TransposePadBegin(int64_t in, int64_t out, const WindowAttrs& a, size_t i) {
  bool computed = !a.output_shape.empty() || a.auto_pad == AutoPad::kSameUpper ||
                  a.auto_pad == AutoPad::kSameLower;
  if (!computed) return a.auto_pad == AutoPad::kValid ? 0 : a.pads[i];
  int64_t k_eff = a.dilations[i] * (a.kernel[i] - 1) + 1;
  int64_t total = a.strides[i] * (in - 1) + a.output_padding[i] + k_eff - out;
  // ONNX: SAME_UPPER pads more at the end; NOTSET (with output_shape) and SAME_LOWER at the start.
  // A negative total (output_shape beyond the full extent) adds zero rows at the end: floor
  // division, as in the ONNX reference.
  int64_t half = FloorDiv(total, 2);
  return a.auto_pad == AutoPad::kSameUpper ? half : total - half;
}

}  // namespace nn

namespace {

using ops_internal::RequireFloat;

// Static spatial dims of a weight shape (dims 2..); errors when symbolic.
StatusOr<std::vector<int64_t>> WeightKernel(InferenceContext& ctx, size_t input) {
  const Shape& w = ctx.input_shape(input);
  std::vector<int64_t> k;
  for (size_t i = 2; i < w.size(); ++i) {
    if (!w[i].is_static()) {
      return ctx.Error(ErrorCode::kShapeMismatch, "weight dim {} is symbolic ({})", i,
                       w[i].ToString());
    }
    k.push_back(w[i].value());
  }
  return k;
}

StatusOr<nn::WindowAttrs> ReadAttrs(InferenceContext& ctx, size_t rank,
                                    const std::vector<int64_t>& kernel) {
  auto a = nn::ReadWindowAttrs(ctx.attrs(), rank, kernel);
  if (!a.ok()) return ctx.Error(a.status().code(), "{}", a.status().message());
  return a;
}

bool StaticEq(const Dim& d, int64_t v) { return d.is_static() && d.value() == v; }

}  // namespace

bool IsChannelsLast(const AttributeMap& attrs) {
  return attrs.GetString("kiln_layout", "") == "NHWC";
}

Shape ChannelsLastToFirst(const Shape& s) {
  if (s.size() < 3) return s;
  Shape out = {s[0], s.back()};
  for (size_t i = 1; i + 1 < s.size(); ++i) out.push_back(s[i]);
  return out;
}

Shape ChannelsFirstToLast(const Shape& s) {
  if (s.size() < 3) return s;
  Shape out = {s[0]};
  for (size_t i = 2; i < s.size(); ++i) out.push_back(s[i]);
  out.push_back(s[1]);
  return out;
}

Status InferWithLayout(InferenceContext& ctx, Status (*rule)(InferenceContext&),
                       std::initializer_list<size_t> activations) {
  if (!ctx.attrs().Has("kiln_layout")) return rule(ctx);
  std::string layout = ctx.attrs().GetString("kiln_layout", "");
  if (layout == "NCHW") return rule(ctx);
  if (layout != "NHWC") {
    return ctx.Error(ErrorCode::kInvalidAttribute, "kiln_layout '{}' is not NCHW or NHWC", layout);
  }
  // The rule runs on a channels-first view of the activations, then its outputs turn back.
  std::vector<ValueInfo> copies(ctx.num_inputs());
  std::vector<const ValueInfo*> view(ctx.num_inputs(), nullptr);
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) continue;
    copies[i] = ctx.input(i);
    if (std::find(activations.begin(), activations.end(), i) != activations.end()) {
      if (copies[i].shape.size() != 4) {
        return ctx.Error(ErrorCode::kShapeMismatch,
                         "kiln_layout NHWC needs 4-D activations; input {} is {}", i,
                         ToString(copies[i].shape));
      }
      copies[i].shape = ChannelsLastToFirst(copies[i].shape);
    }
    view[i] = &copies[i];
  }
  std::vector<ValueInfo> outs(ctx.num_outputs());
  InferenceContext inner(ctx.node(), view, outs);
  KILN_RETURN_IF_ERROR(rule(inner));
  for (size_t i = 0; i < outs.size(); ++i) {
    ctx.set_output(i, outs[i].dtype, ChannelsFirstToLast(outs[i].shape));
  }
  return OkStatus();
}

// Conv: X [N, C, D...], W [M, C/group, k...], B [M] optional -> Y [N, M, out...].
// Shared with FusedConv (fused.cc), whose extra inputs do not change the output shape. On an INT8
// edge (ops/quant_edge.h) X arrives as int8 (the layer computes in W's type), or Y leaves as int8.
Status InferConvLike(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(SameFloatTypes(ctx, 2));
  const Shape& x = ctx.input_shape(0);
  const Shape& w = ctx.input_shape(1);
  if (x.size() < 3) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "input has rank {}; Conv needs N, C and >= 1 "
                     "spatial dims",
                     x.size());
  }
  if (w.size() != x.size()) {
    return ctx.Error(ErrorCode::kShapeMismatch, "weight {} and input {} differ in rank",
                     ToString(w), ToString(x));
  }
  size_t rank = x.size() - 2;
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> kernel, WeightKernel(ctx, 1));
  KILN_ASSIGN_OR_RETURN(nn::WindowAttrs a, ReadAttrs(ctx, rank, kernel));
  if (a.ceil_mode) return ctx.Error(ErrorCode::kInvalidAttribute, "Conv has no ceil_mode");
  if (!w[0].is_static() || !w[1].is_static()) {
    return ctx.Error(ErrorCode::kShapeMismatch, "weight shape {} must be static", ToString(w));
  }
  if (w[0].value() % a.group != 0) {
    return ctx.Error(ErrorCode::kShapeMismatch, "{} output channels do not divide into {} groups",
                     w[0].value(), a.group);
  }
  if (x[1].is_static() && x[1].value() != w[1].value() * a.group) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "input has {} channels; weight {} with group {} expects {}", x[1].value(),
                     ToString(w), a.group, w[1].value() * a.group);
  }
  if (ctx.has_input(2)) {
    KILN_RETURN_IF_ERROR(SameFloatTypes(ctx, 3));
    const Shape& b = ctx.input_shape(2);
    if (b.size() != 1 || !(b[0] == w[0])) {
      return ctx.Error(ErrorCode::kShapeMismatch, "bias shape {} must be [{}]", ToString(b),
                       w[0].value());
    }
  }
  Shape y = {x[0], w[0]};
  for (size_t i = 0; i < rank; ++i) {
    Dim out = nn::WindowOutDim(x[i + 2], a, i);
    if (out.is_static() && out.value() < 1) {
      return ctx.Error(ErrorCode::kShapeMismatch,
                       "spatial dim {} of input {} is smaller than the dilated kernel", i,
                       ToString(x));
    }
    y.push_back(out);
  }
  ctx.set_output(0, ProductOutputType(ctx.node(), ProductType(ctx)), std::move(y));
  return OkStatus();
}

Status InferConv(InferenceContext& ctx) { return InferWithLayout(ctx, InferConvLike, {0}); }

namespace {
// ConvTranspose: X [N, C, D...], W [C, M/group, k...] -> Y [N, M, out...].
Status InferConvTransposeNchw(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireFloat(ctx, 0));
  KILN_RETURN_IF_ERROR(RequireFloat(ctx, 1));
  const Shape& x = ctx.input_shape(0);
  const Shape& w = ctx.input_shape(1);
  if (x.size() < 3 || w.size() != x.size()) {
    return ctx.Error(ErrorCode::kShapeMismatch, "input {} and weight {} need equal rank >= 3",
                     ToString(x), ToString(w));
  }
  size_t rank = x.size() - 2;
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> kernel, WeightKernel(ctx, 1));
  KILN_ASSIGN_OR_RETURN(nn::WindowAttrs a, ReadAttrs(ctx, rank, kernel));
  if (!w[0].is_static() || !w[1].is_static()) {
    return ctx.Error(ErrorCode::kShapeMismatch, "weight shape {} must be static", ToString(w));
  }
  if (x[1].is_static() && x[1].value() != w[0].value()) {
    return ctx.Error(ErrorCode::kShapeMismatch, "input has {} channels; weight {} expects {}",
                     x[1].value(), ToString(w), w[0].value());
  }
  if (w[0].value() % a.group != 0) {
    return ctx.Error(ErrorCode::kShapeMismatch, "{} input channels do not divide into {} groups",
                     w[0].value(), a.group);
  }
  for (size_t i = 0; i < rank; ++i) {
    if (a.output_padding[i] >= std::max(a.strides[i], a.dilations[i])) {
      return ctx.Error(ErrorCode::kInvalidAttribute,
                       "output_padding {} must be smaller than stride or dilation on axis {}",
                       a.output_padding[i], i);
    }
  }
  Dim m = w[1].value() * a.group;
  if (ctx.has_input(2)) {
    KILN_RETURN_IF_ERROR(RequireFloat(ctx, 2));
    const Shape& b = ctx.input_shape(2);
    if (b.size() != 1 || !(b[0] == m)) {
      return ctx.Error(ErrorCode::kShapeMismatch, "bias shape {} must be [{}]", ToString(b),
                       m.value());
    }
  }
  Shape y = {x[0], m};
  for (size_t i = 0; i < rank; ++i) {
    Dim out = nn::TransposeOutDim(x[i + 2], a, i);
    if (out.is_static() && out.value() < 1) {
      return ctx.Error(ErrorCode::kShapeMismatch, "output dim {} would be {}", i, out.value());
    }
    y.push_back(out);
  }
  ctx.set_output(0, ctx.input_type(0), std::move(y));
  return OkStatus();
}

Status InferPool(InferenceContext& ctx, bool is_max) {
  // MaxPool also takes int8/uint8 (a max needs no arithmetic).
  const DataType xt = ctx.input_type(0);
  if (!is_max || (xt != DataType::kInt8 && xt != DataType::kUInt8)) {
    KILN_RETURN_IF_ERROR(RequireFloat(ctx, 0));
  }
  const Shape& x = ctx.input_shape(0);
  if (x.size() < 3) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "input has rank {}; pooling needs N, C and "
                     ">= 1 spatial dims",
                     x.size());
  }
  if (!ctx.attrs().Has("kernel_shape")) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "kernel_shape is required");
  }
  if (is_max) {
    const int64_t order = ctx.attrs().GetInt("storage_order", 0);
    if (order != 0 && order != 1) {
      return ctx.Error(ErrorCode::kInvalidAttribute, "storage_order is {}; it must be 0 or 1",
                       order);
    }
  }
  size_t rank = x.size() - 2;
  KILN_ASSIGN_OR_RETURN(nn::WindowAttrs a, ReadAttrs(ctx, rank, {}));
  if (a.group != 1) return ctx.Error(ErrorCode::kInvalidAttribute, "pools have no group");
  Shape y = {x[0], x[1]};
  for (size_t i = 0; i < rank; ++i) {
    if (a.auto_pad == nn::AutoPad::kNotSet) {
      int64_t k_eff = a.dilations[i] * (a.kernel[i] - 1) + 1;
      if (a.pads[i] >= k_eff || a.pads[i + rank] >= k_eff) {
        return ctx.Error(ErrorCode::kInvalidAttribute,
                         "pad {} on axis {} is not smaller than the kernel extent {}",
                         std::max(a.pads[i], a.pads[i + rank]), i, k_eff);
      }
    }
    Dim out = nn::WindowOutDim(x[i + 2], a, i);
    if (out.is_static() && out.value() < 1) {
      return ctx.Error(ErrorCode::kShapeMismatch,
                       "spatial dim {} of input {} is smaller than the kernel", i, ToString(x));
    }
    y.push_back(out);
  }
  // MaxPool's Indices: int64 positions of each maximum in the flattened input (CPU only).
  if (ctx.num_outputs() > 1) ctx.set_output(1, DataType::kInt64, y);
  ctx.set_output(0, ctx.input_type(0), std::move(y));
  return OkStatus();
}

Status InferGlobalPool(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireFloat(ctx, 0));
  const Shape& x = ctx.input_shape(0);
  if (x.size() < 3) {
    return ctx.Error(ErrorCode::kShapeMismatch, "input has rank {}; needs >= 3", x.size());
  }
  Shape y = {x[0], x[1]};
  y.resize(x.size(), Dim(1));
  ctx.set_output(0, ctx.input_type(0), std::move(y));
  return OkStatus();
}

Status InferMaxPoolNchw(InferenceContext& ctx) { return InferPool(ctx, true); }
Status InferAveragePoolNchw(InferenceContext& ctx) { return InferPool(ctx, false); }
}  // namespace

Status InferConvTranspose(InferenceContext& ctx) {
  return InferWithLayout(ctx, InferConvTransposeNchw, {0});
}
Status InferMaxPool(InferenceContext& ctx) { return InferWithLayout(ctx, InferMaxPoolNchw, {0}); }
Status InferAveragePool(InferenceContext& ctx) {
  return InferWithLayout(ctx, InferAveragePoolNchw, {0});
}
Status InferLpPool(InferenceContext& ctx) {
  const int64_t p = attrs::LpPool::p(ctx.node());
  if (p < 1)
    return ctx.Error(ErrorCode::kInvalidAttribute, "attribute 'p' is {}; it must be >= 1", p);
  return InferPool(ctx, false);
}
Status InferGlobalAveragePool(InferenceContext& ctx) {
  return InferWithLayout(ctx, InferGlobalPool, {0});
}
Status InferGlobalMaxPool(InferenceContext& ctx) { return InferGlobalPool(ctx); }

// BatchNormalization, inference form: X [N, C, ...], scale/B/mean/var [C] -> Y like X.
Status InferBatchNormalization(InferenceContext& ctx) {
  // training_mode 1 normalises by the batch's statistics and may output the updated running
  // mean and variance (CPU only); inference mode has one output.
  const int64_t training = ctx.attrs().GetInt("training_mode", 0);
  if (training != 0 && training != 1) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "training_mode is {}; it must be 0 or 1",
                     training);
  }
  if (training == 0 && ctx.num_outputs() > 1) {
    return ctx.Error(ErrorCode::kInvalidModel,
                     "running mean/var outputs need training_mode 1; export the model in eval "
                     "mode");
  }
  const Shape& x = ctx.input_shape(0);
  if (x.size() < 2) {
    return ctx.Error(ErrorCode::kShapeMismatch, "input has rank {}; needs >= 2", x.size());
  }
  for (size_t i = 0; i < 5; ++i) {
    if (!IsFloat(ctx.input_type(i))) {
      return ctx.Error(ErrorCode::kTypeMismatch, "input {} has type {}", i,
                       ToString(ctx.input_type(i)));
    }
    if (i == 0) continue;
    const Shape& p = ctx.input_shape(i);
    if (p.size() != 1 || !(p[0] == x[1] || !x[1].is_static() || !p[0].is_static())) {
      return ctx.Error(ErrorCode::kShapeMismatch, "input {} has shape {}; expected [{}]", i,
                       ToString(p), x[1].ToString());
    }
  }
  ctx.set_output(0, ctx.input_type(0), x);
  for (size_t i = 1; i < ctx.num_outputs(); ++i) {
    ctx.set_output(i, ctx.input_type(3), ctx.input_shape(3));
  }
  return OkStatus();
}

// Resize (opset 19 form): X, roi (tf_crop_and_resize only), scales, sizes; optional axes
// attribute.
Status InferResize(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireFloat(ctx, 0));
  const AttributeMap& at = ctx.attrs();
  const Shape& x = ctx.input_shape(0);
  size_t rank = x.size();
  std::string mode = at.GetString("mode", "nearest");
  if (mode != "nearest" && mode != "linear" && mode != "cubic") {
    return ctx.Error(ErrorCode::kInvalidAttribute, "mode '{}' is not nearest, linear or cubic",
                     mode);
  }
  std::string ctm = at.GetString("coordinate_transformation_mode", "half_pixel");
  if (ctm != "half_pixel" && ctm != "pytorch_half_pixel" && ctm != "align_corners" &&
      ctm != "asymmetric" && ctm != "tf_half_pixel_for_nn" && ctm != "half_pixel_symmetric" &&
      ctm != "tf_crop_and_resize") {
    return ctx.Error(ErrorCode::kInvalidAttribute, "coordinate_transformation_mode '{}' is invalid",
                     ctm);
  }
  std::string nearest = at.GetString("nearest_mode", "round_prefer_floor");
  if (nearest != "round_prefer_floor" && nearest != "round_prefer_ceil" && nearest != "floor" &&
      nearest != "ceil") {
    return ctx.Error(ErrorCode::kInvalidAttribute, "nearest_mode '{}' is invalid", nearest);
  }
  std::vector<int64_t> axes = at.GetInts("axes");
  if (axes.empty()) {
    for (size_t i = 0; i < rank; ++i) axes.push_back(static_cast<int64_t>(i));
  }
  for (auto& a : axes) {
    auto n = NormalizeAxis(a, static_cast<int64_t>(rank));
    if (!n.ok()) return ctx.Error(ErrorCode::kInvalidAttribute, "axes: {}", n.status().message());
    a = *n;
  }
  if (ctm == "tf_crop_and_resize") {
    // The crop decides the kernel's taps (not the output's shape): read here so that a graph
    // input feeding it becomes a shape input, whose values kernels see as a constant.
    const bool has_roi =
        ctx.has_input(1) && !(ctx.input_shape(1).size() == 1 && StaticEq(ctx.input_shape(1)[0], 0));
    if (!has_roi || !IsFloat(ctx.input_type(1))) {
      return ctx.Error(ErrorCode::kInvalidModel, "tf_crop_and_resize needs a float roi input");
    }
    if (const Tensor* roi = ctx.input_constant(1);
        roi && roi->num_elements() != 2 * static_cast<int64_t>(axes.size())) {
      return ctx.Error(ErrorCode::kShapeMismatch, "roi has {} entries; {} axes need {}",
                       roi->num_elements(), axes.size(), 2 * axes.size());
    }
  }
  bool has_scales =
      ctx.has_input(2) && !(ctx.input_shape(2).size() == 1 && StaticEq(ctx.input_shape(2)[0], 0));
  bool has_sizes =
      ctx.has_input(3) && !(ctx.input_shape(3).size() == 1 && StaticEq(ctx.input_shape(3)[0], 0));
  if (has_scales == has_sizes) {
    return ctx.Error(ErrorCode::kInvalidModel, "exactly one of scales and sizes must be given");
  }
  Shape y = x;
  if (has_sizes) {
    auto sizes = ctx.input_dims_value(3);
    if (!sizes) {
      return ctx.Error(ErrorCode::kDataDependentShape,
                       "sizes is computed at run time from tensor values");
    }
    if (sizes->size() != axes.size()) {
      return ctx.Error(ErrorCode::kShapeMismatch, "sizes has {} entries; {} axes", sizes->size(),
                       axes.size());
    }
    std::string policy = at.GetString("keep_aspect_ratio_policy", "stretch");
    if (policy == "stretch") {
      for (size_t i = 0; i < axes.size(); ++i) y[axes[i]] = (*sizes)[i];
    } else if (policy == "not_larger" || policy == "not_smaller") {
      double scale = policy == "not_larger" ? 1e300 : 0;
      for (size_t i = 0; i < axes.size(); ++i) {
        const Dim& in = x[axes[i]];
        const Dim& s = (*sizes)[i];
        if (!in.is_static() || !s.is_static()) {
          return ctx.Error(ErrorCode::kDataDependentShape,
                           "keep_aspect_ratio_policy needs static input and sizes");
        }
        double r = static_cast<double>(s.value()) / static_cast<double>(in.value());
        scale = policy == "not_larger" ? std::min(scale, r) : std::max(scale, r);
      }
      for (size_t i = 0; i < axes.size(); ++i) {
        y[axes[i]] = SatFromDouble(std::round(scale * static_cast<double>(x[axes[i]].value())));
      }
    } else {
      return ctx.Error(ErrorCode::kInvalidAttribute, "keep_aspect_ratio_policy '{}' is invalid",
                       policy);
    }
  } else {
    const Tensor* scales = ctx.input_constant(2);
    if (!scales) {
      return ctx.Error(ErrorCode::kDataDependentShape, "scales is not a constant");
    }
    std::vector<float> s = scales->ToFloatVector();
    if (s.size() != axes.size()) {
      return ctx.Error(ErrorCode::kShapeMismatch, "scales has {} entries; {} axes", s.size(),
                       axes.size());
    }
    for (size_t i = 0; i < axes.size(); ++i) {
      if (!(s[i] > 0)) {
        return ctx.Error(ErrorCode::kInvalidAttribute, "scale {} must be positive", s[i]);
      }
      const Dim& in = x[axes[i]];
      if (in.is_static()) {
        y[axes[i]] = SatFromDouble(std::floor(static_cast<double>(in.value()) * s[i]));
      } else if (s[i] >= 1 && s[i] == std::floor(s[i])) {
        y[axes[i]] = in * SatFromDouble(s[i]);
      } else if (s[i] < 1 && 1 / s[i] == std::floor(1 / s[i])) {
        y[axes[i]] = FloorDiv(in, Dim(SatFromDouble(1 / s[i])));
      } else {
        y[axes[i]] = Dim::Symbol(fmt::format("floor({}*{})", in.ToString(), s[i]));
      }
    }
  }
  ctx.set_output(0, ctx.input_type(0), std::move(y));
  return OkStatus();
}

// Col2Im(input [N, C * prod(block_shape), L], image_shape [r], block_shape [r]) gives
// [N, C, image_shape...]: the sliding blocks summed back into the image (Conv's im2col inverse).
Status InferCol2Im(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireFloat(ctx, 0));
  const Shape& x = ctx.input_shape(0);
  if (x.size() != 3) {
    return ctx.Error(ErrorCode::kShapeMismatch, "input {} must be [N, C * prod(block), L]",
                     ToString(x));
  }
  auto image = ctx.input_dims_value(1);
  auto block = ctx.input_ints(2);
  if (!image || !block) {
    return ctx.Error(ErrorCode::kDataDependentShape,
                     "image_shape and block_shape must be constants or shape inputs");
  }
  const size_t r = block->size();
  if (r == 0 || image->size() != r) {
    return ctx.Error(ErrorCode::kShapeMismatch, "image_shape has {} entries, block_shape {}",
                     image->size(), r);
  }
  const AttributeMap& at = ctx.attrs();
  std::vector<int64_t> dil = attrs::Col2Im::dilations(at), str = attrs::Col2Im::strides(at),
                       pads = attrs::Col2Im::pads(at);
  if (dil.empty()) dil.assign(r, 1);
  if (str.empty()) str.assign(r, 1);
  if (pads.empty()) pads.assign(2 * r, 0);
  if (dil.size() != r || str.size() != r || pads.size() != 2 * r) {
    return ctx.Error(ErrorCode::kInvalidAttribute,
                     "dilations, strides and pads must have {}, {} and {} entries", r, r, 2 * r);
  }
  int64_t per_channel = 1;
  Dim blocks(1);
  for (size_t i = 0; i < r; ++i) {
    if ((*block)[i] < 1 || dil[i] < 1 || str[i] < 1 || pads[i] < 0 || pads[i + r] < 0) {
      return ctx.Error(ErrorCode::kInvalidAttribute,
                       "block_shape, dilations and strides must be positive, pads not negative");
    }
    per_channel *= (*block)[i];
    // Sliding positions along axis i: (image + pads - dilated block) / stride + 1.
    const Dim span = (*image)[i] + Dim(pads[i] + pads[i + r] - dil[i] * ((*block)[i] - 1) - 1);
    blocks = blocks * (FloorDiv(span, Dim(str[i])) + Dim(1));
  }
  const Dim& cp = x[1];
  if (cp.is_static() && cp.value() % per_channel != 0) {
    return ctx.Error(ErrorCode::kShapeMismatch, "input's axis 1 ({}) is not a multiple of {}",
                     cp.value(), per_channel);
  }
  if (ops_internal::DimsEqual(blocks, x[2]) == false) {
    return ctx.Error(ErrorCode::kShapeMismatch, "input has {} blocks; the image holds {}",
                     x[2].ToString(), blocks.ToString());
  }
  Shape y = {x[0], FloorDiv(cp, Dim(per_channel))};
  for (const Dim& d : *image) y.push_back(d);
  ctx.set_output(0, ctx.input_type(0), std::move(y));
  return OkStatus();
}

// GridSample (opset 20 form): X [N, C, D1..Dr] and grid [N, O1..Or, r] of float types give
// Y [N, C, O1..Or] of X's type.
Status InferGridSample(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireFloat(ctx, 0));
  const AttributeMap& at = ctx.attrs();
  const std::string mode = attrs::GridSample::mode(at);
  if (mode != "linear" && mode != "nearest" && mode != "cubic") {
    return ctx.Error(ErrorCode::kInvalidAttribute, "mode '{}' is not linear, nearest or cubic",
                     mode);
  }
  const std::string padding = attrs::GridSample::padding_mode(at);
  if (padding != "zeros" && padding != "border" && padding != "reflection") {
    return ctx.Error(ErrorCode::kInvalidAttribute,
                     "padding_mode '{}' is not zeros, border or reflection", padding);
  }
  const Shape& x = ctx.input_shape(0);
  const Shape& grid = ctx.input_shape(1);
  if (x.size() < 3 || grid.size() != x.size() || !IsFloat(ctx.input_type(1))) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "X {} must be [N, C, D1..Dr] (r >= 1) and grid {} a float [N, O1..Or, r]",
                     ToString(x), ToString(grid));
  }
  const int64_t r = static_cast<int64_t>(x.size()) - 2;
  if (ops_internal::DimsEqual(grid[0], x[0]) == false ||
      ops_internal::DimsEqual(grid.back(), Dim(r)) == false) {
    return ctx.Error(ErrorCode::kShapeMismatch, "grid {} must be [N, O1..Or, {}] for X {}",
                     ToString(grid), r, ToString(x));
  }
  Shape y = {x[0], x[1]};
  for (size_t i = 1; i + 1 < grid.size(); ++i) y.push_back(grid[i]);
  ctx.set_output(0, ctx.input_type(0), std::move(y));
  return OkStatus();
}

namespace {
// X [N, C, ...] of a float type; the output has X's type and shape.
Status NormalizationLike(InferenceContext& ctx, size_t min_rank) {
  const Shape& x = ctx.input_shape(0);
  if (!IsFloatingPoint(ctx.input_type(0)) || x.size() < min_rank) {
    return ctx.Error(ErrorCode::kTypeMismatch,
                     "input must be a float tensor of rank >= {}; got {} {}", min_rank,
                     ToString(ctx.input_type(0)), ToString(x));
  }
  ctx.set_output(0, ctx.input_type(0), x);
  return OkStatus();
}
}  // namespace

// InstanceNormalization(X [N, C, ...], scale [C], B [C]).
Status InferInstanceNormalization(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(NormalizationLike(ctx, 3));
  const Dim& c = ctx.input_shape(0)[1];
  for (size_t i = 1; i < 3; ++i) {
    const Shape& s = ctx.input_shape(i);
    if (ctx.input_type(i) != ctx.input_type(0) || s.size() != 1 ||
        (s[0].is_static() && c.is_static() && s[0] != c)) {
      return ctx.Error(ErrorCode::kShapeMismatch, "{} {} must be [C] = [{}] of type {}",
                       i == 1 ? "scale" : "B", ToString(s), c.ToString(),
                       ToString(ctx.input_type(0)));
    }
  }
  return OkStatus();
}

// LRN over channels of X [N, C, ...]; `size` (required) is the window's length.
Status InferLRN(InferenceContext& ctx) {
  const Attribute* size = ctx.attrs().Find("size");
  if (!size || !std::holds_alternative<int64_t>(*size) || std::get<int64_t>(*size) < 1) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "attribute 'size' (required) must be >= 1");
  }
  return NormalizationLike(ctx, 3);
}

// MeanVarianceNormalization: (X - mean) / sqrt(var + 1e-9) over `axes`.
Status InferMeanVarianceNormalization(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(NormalizationLike(ctx, 1));
  const int64_t rank = static_cast<int64_t>(ctx.input_shape(0).size());
  for (int64_t a : attrs::MeanVarianceNormalization::axes(ctx.node())) {
    if (a < -rank || a >= rank) {
      return ctx.Error(ErrorCode::kInvalidAttribute, "axis {} is outside rank {}", a, rank);
    }
  }
  return OkStatus();
}

}  // namespace kiln
