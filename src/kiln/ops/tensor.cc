// Shape rules for shape and tensor manipulation ops. These carry the dims-values that make
// exported shape subgraphs (Shape -> Gather -> Unsqueeze -> Concat -> Reshape) resolve to
// static or symbolic target shapes.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/ir/sizes.h"
#include "kiln/ops/onnx_dtype.h"
#include "kiln/ops/op_schema.h"
#include "kiln/ops/op_table.h"
#include "kiln/ops/rule_util.h"

namespace kiln {

using namespace ops_internal;

namespace {
int64_t Rank(const InferenceContext& ctx, size_t i) {
  return static_cast<int64_t>(ctx.input_shape(i).size());
}

Status RequireIntegerInput(const InferenceContext& ctx, size_t i, const char* what) {
  DataType t = ctx.input_type(i);
  if (t != DataType::kInt64 && t != DataType::kInt32) {
    return ctx.Error(ErrorCode::kTypeMismatch, "input {} ({}) must be int64 or int32, not {}", i,
                     what, ToString(t));
  }
  return OkStatus();
}

// Target dims for Reshape/Expand/ConstantOfShape/Tile: a dims-value or KILN-E2011.
StatusOr<std::vector<Dim>> RequiredDims(const InferenceContext& ctx, size_t i, const char* what) {
  auto v = ctx.input_dims_value(i);
  if (!v) {
    return ctx.Error(ErrorCode::kDataDependentShape,
                     "input {} ({}) must be a constant or computed from shapes", i, what);
  }
  return *v;
}

// Normalises a list of axes against rank; rejects duplicates.
StatusOr<std::vector<int64_t>> NormalizeAxes(const InferenceContext& ctx, std::vector<int64_t> axes,
                                             int64_t rank) {
  for (int64_t& a : axes) {
    KILN_ASSIGN_OR_RETURN(a, Axis(ctx, a, rank));
  }
  std::vector<int64_t> sorted = axes;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "axes repeat an axis");
  }
  return axes;
}

constexpr int64_t kHuge = std::numeric_limits<int64_t>::max() / 4;

// Slice along one dim with ONNX clamping. Static dims are exact; for symbolic dims the usual
// patterns (to the end, from the end, a prefix shorter than the dim) are resolved, assuming a
// symbolic dim is at least as large as the static bounds used with it.
StatusOr<Dim> SliceDim(const InferenceContext& ctx, const Dim& d, Dim start, Dim end,
                       int64_t step) {
  if (step == 0) return ctx.Error(ErrorCode::kInvalidAttribute, "Slice step must not be 0");
  if (d.is_static() && start.is_static() && end.is_static()) {
    int64_t n = d.value(), s = start.value(), e = end.value();
    if (s < 0) s += n;
    if (e < 0) e += n;
    // Written so that no step (INT64_MIN included) overflows: ceil(len / |step|).
    if (step > 0) {
      s = std::clamp<int64_t>(s, 0, n);
      e = std::clamp<int64_t>(e, 0, n);
      return Dim(e > s ? 1 + (e - s - 1) / step : 0);
    }
    s = std::clamp<int64_t>(s, 0, n - 1);
    e = std::clamp<int64_t>(e, -1, n - 1);
    return Dim(s > e ? 1 + (s - e - 1) / SatSub(0, step) : 0);
  }
  auto norm = [&](Dim x, bool is_end) -> Dim {
    if (!x.is_static()) return x;
    int64_t v = x.value();
    if (v >= kHuge) return step > 0 ? d : d - 1;
    if (v <= -kHuge) return step > 0 ? Dim(0) : Dim(-1);
    if (v < 0) return d + v;
    return x;
  };
  start = norm(start, false);
  end = norm(end, true);
  if (step > 0) {
    Dim len = end - start;
    if (step == 1) return len;
    return CeilDiv(len, step);
  }
  return CeilDiv(start - end, SatSub(0, step));
}
}  // namespace

Status InferShape(InferenceContext& ctx) {
  int64_t rank = Rank(ctx, 0);
  KILN_ASSIGN_OR_RETURN(int64_t start, IntAttr(ctx, "start", attrs::Shape::start_default()));
  KILN_ASSIGN_OR_RETURN(int64_t end, IntAttr(ctx, "end", rank));
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  end = std::clamp<int64_t>(end, 0, rank);
  std::vector<Dim> dims;
  for (int64_t i = start; i < end; ++i) dims.push_back(ctx.input_shape(0)[i]);
  ctx.set_output(0, DataType::kInt64, {static_cast<int64_t>(dims.size())});
  ctx.set_output_dims_value(0, std::move(dims));
  return OkStatus();
}

Status InferSize(InferenceContext& ctx) {
  ctx.set_output(0, DataType::kInt64, {});
  ctx.set_output_dims_value(0, {NumElements(ctx.input_shape(0))});
  return OkStatus();
}

Status InferReshape(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireIntegerInput(ctx, 1, "shape"));
  KILN_ASSIGN_OR_RETURN(int64_t allowzero,
                        IntAttr(ctx, "allowzero", attrs::Reshape::allowzero_default()));
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> target, RequiredDims(ctx, 1, "shape"));
  const Shape& in = ctx.input_shape(0);
  Shape out(target.size());
  int infer_at = -1;
  Dim known = 1;
  for (size_t i = 0; i < target.size(); ++i) {
    const Dim& t = target[i];
    if (t.is_static() && t.value() == -1) {
      if (infer_at >= 0) return ctx.Error(ErrorCode::kInvalidAttribute, "shape has two -1 dims");
      infer_at = static_cast<int>(i);
      continue;
    }
    if (t.is_static() && t.value() == 0 && !allowzero) {
      if (i >= in.size()) {
        return ctx.Error(ErrorCode::kShapeMismatch,
                         "shape[{}] is 0 (copy) but input {} has rank {}", i, ToString(in),
                         in.size());
      }
      out[i] = in[i];
    } else if (t.is_static() && t.value() < 0) {
      return ctx.Error(ErrorCode::kShapeMismatch, "shape[{}] is {}", i, t.value());
    } else {
      out[i] = t;
    }
    known = known * out[i];
  }
  Dim total = NumElements(in);
  if (infer_at >= 0) {
    if (known == Dim(0)) {
      return ctx.Error(ErrorCode::kShapeMismatch, "cannot infer -1 in {} with a zero dim",
                       ToString(target));
    }
    out[infer_at] = FloorDiv(total, known);
    if (total.is_static() && known.is_static() && total.value() % known.value() != 0) {
      return ctx.Error(ErrorCode::kShapeMismatch, "cannot reshape {} ({} elements) into {}",
                       ToString(in), total.value(), ToString(target));
    }
  } else if (total.is_static() && known.is_static() && total.value() != known.value()) {
    return ctx.Error(ErrorCode::kShapeMismatch, "cannot reshape {} ({} elements) into {}",
                     ToString(in), total.value(), ToString(out));
  }
  ctx.set_output(0, ctx.input_type(0), out);
  if (auto v = ctx.input_dims_value(0); v && NumElements(out) == Dim(int64_t(v->size()))) {
    ctx.set_output_dims_value(0, *v);
  }
  return OkStatus();
}

Status InferFlatten(InferenceContext& ctx) {
  int64_t rank = Rank(ctx, 0);
  KILN_ASSIGN_OR_RETURN(int64_t axis, IntAttr(ctx, "axis", attrs::Flatten::axis_default()));
  if (axis < -rank || axis > rank) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "axis {} is out of range for rank {}", axis,
                     rank);
  }
  if (axis < 0) axis += rank;
  Dim a = 1, b = 1;
  for (int64_t i = 0; i < rank; ++i)
    (i < axis ? a : b) = (i < axis ? a : b) * ctx.input_shape(0)[i];
  ctx.set_output(0, ctx.input_type(0), {a, b});
  return OkStatus();
}

Status InferTranspose(InferenceContext& ctx) {
  int64_t rank = Rank(ctx, 0);
  KILN_ASSIGN_OR_RETURN(auto perm_attr, IntsAttr(ctx, "perm"));
  std::vector<int64_t> perm;
  if (perm_attr) {
    perm = *perm_attr;
  } else {
    for (int64_t i = rank - 1; i >= 0; --i) perm.push_back(i);
  }
  if (static_cast<int64_t>(perm.size()) != rank) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "perm has {} entries for rank {}", perm.size(),
                     rank);
  }
  std::vector<bool> seen(rank, false);
  Shape out;
  for (int64_t p : perm) {
    if (p < 0 || p >= rank || seen[p]) {
      return ctx.Error(ErrorCode::kInvalidAttribute, "perm [{}] is not a permutation of 0..{}",
                       fmt::join(perm, ","), rank - 1);
    }
    seen[p] = true;
    out.push_back(ctx.input_shape(0)[p]);
  }
  ctx.set_output(0, ctx.input_type(0), out);
  return OkStatus();
}

// Concat's and ConcatSlices' inputs: one type and rank, the dims off `axis` equal. Returns input
// 0's shape with the off-axis dims made static where any input's is.
static StatusOr<Shape> ConcatOffAxisShape(InferenceContext& ctx, int64_t rank, int64_t axis) {
  Shape out = ctx.input_shape(0);
  for (size_t i = 1; i < ctx.num_inputs(); ++i) {
    const Shape& s = ctx.input_shape(i);
    if (ctx.input_type(i) != ctx.input_type(0)) {
      return ctx.Error(ErrorCode::kTypeMismatch, "input {} is {}, input 0 is {}", i,
                       ToString(ctx.input_type(i)), ToString(ctx.input_type(0)));
    }
    if (static_cast<int64_t>(s.size()) != rank) {
      return ctx.Error(ErrorCode::kShapeMismatch, "input {} {} and input 0 {} differ in rank", i,
                       ToString(s), ToString(ctx.input_shape(0)));
    }
    for (int64_t d = 0; d < rank; ++d) {
      if (d == axis) continue;
      if (DimsEqual(out[d], s[d]) == false) {
        return ctx.Error(ErrorCode::kShapeMismatch,
                         "input {} {} and input 0 {} differ outside axis {}", i, ToString(s),
                         ToString(ctx.input_shape(0)), axis);
      }
      if (!out[d].is_static() && s[d].is_static()) out[d] = s[d];
    }
  }
  return out;
}

Status InferConcatSlices(InferenceContext& ctx) {
  const int64_t rank = Rank(ctx, 0);
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr, RequiredIntAttr(ctx, "axis"));
  KILN_ASSIGN_OR_RETURN(int64_t axis, Axis(ctx, axis_attr, rank));
  KILN_ASSIGN_OR_RETURN(auto starts, IntsAttr(ctx, "starts"));
  KILN_ASSIGN_OR_RETURN(auto lengths, IntsAttr(ctx, "lengths"));
  if (!starts || !lengths || starts->size() != ctx.num_inputs() ||
      lengths->size() != ctx.num_inputs()) {
    return ctx.Error(ErrorCode::kInvalidAttribute,
                     "starts and lengths need one entry per input ({})", ctx.num_inputs());
  }
  KILN_ASSIGN_OR_RETURN(Shape out, ConcatOffAxisShape(ctx, rank, axis));
  int64_t total = 0;
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const Shape& s = ctx.input_shape(i);
    const int64_t b = (*starts)[i], n = (*lengths)[i];
    const Dim& a = s[static_cast<size_t>(axis)];
    if (b < 0 || n < 0 || (a.is_static() && b + n > a.value())) {
      return ctx.Error(ErrorCode::kShapeMismatch, "input {} {}: range [{}, {}) of axis {}", i,
                       ToString(s), b, b + n, axis);
    }
    total += n;
  }
  out[static_cast<size_t>(axis)] = Dim(total);
  ctx.set_output(0, ctx.input_type(0), out);
  return OkStatus();
}

Status InferConcat(InferenceContext& ctx) {
  int64_t rank = Rank(ctx, 0);
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr, RequiredIntAttr(ctx, "axis"));
  KILN_ASSIGN_OR_RETURN(int64_t axis, Axis(ctx, axis_attr, rank));
  KILN_ASSIGN_OR_RETURN(Shape out, ConcatOffAxisShape(ctx, rank, axis));
  for (size_t i = 1; i < ctx.num_inputs(); ++i) {
    out[static_cast<size_t>(axis)] =
        out[static_cast<size_t>(axis)] + ctx.input_shape(i)[static_cast<size_t>(axis)];
  }
  ctx.set_output(0, ctx.input_type(0), out);
  if (rank == 1) {
    std::vector<Dim> v;
    for (size_t i = 0; i < ctx.num_inputs(); ++i) {
      auto d = ctx.input_dims_value(i);
      if (!d) return OkStatus();
      v.insert(v.end(), d->begin(), d->end());
    }
    ctx.set_output_dims_value(0, std::move(v));
  }
  return OkStatus();
}

Status InferSplit(InferenceContext& ctx) {
  int64_t rank = Rank(ctx, 0);
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr, IntAttr(ctx, "axis", attrs::Split::axis_default()));
  KILN_ASSIGN_OR_RETURN(int64_t axis, Axis(ctx, axis_attr, rank));
  int64_t n = static_cast<int64_t>(ctx.num_outputs());
  const Dim& d = ctx.input_shape(0)[axis];
  std::vector<Dim> sizes;
  if (ctx.has_input(1)) {
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> split, RequiredInts(ctx, 1, "split"));
    if (static_cast<int64_t>(split.size()) != n) {
      return ctx.Error(ErrorCode::kInvalidAttribute, "split has {} entries for {} outputs",
                       split.size(), n);
    }
    int64_t sum = 0;
    for (int64_t s : split) {
      if (s < 0) return ctx.Error(ErrorCode::kInvalidAttribute, "split has a negative size");
      sum = SatAdd(sum, s);
      sizes.push_back(s);
    }
    if (d.is_static() && d.value() != sum) {
      return ctx.Error(ErrorCode::kShapeMismatch, "split sizes sum to {} but axis {} of {} is {}",
                       sum, axis, ToString(ctx.input_shape(0)), d.value());
    }
  } else {
    KILN_ASSIGN_OR_RETURN(int64_t num, IntAttr(ctx, "num_outputs", n));
    if (num != n || n < 1) {
      return ctx.Error(ErrorCode::kInvalidAttribute,
                       "num_outputs is {} but the node has {} outputs", num, n);
    }
    // ONNX: chunks of ceil(d/n), the last one smaller.
    Dim chunk = CeilDiv(d, n);
    for (int64_t i = 0; i + 1 < n; ++i) sizes.push_back(chunk);
    sizes.push_back(d - chunk * (n - 1));
    if (d.is_static() && sizes.back().value() < 0) {
      return ctx.Error(ErrorCode::kShapeMismatch, "axis {} of size {} cannot give {} outputs", axis,
                       d.value(), n);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    Shape s = ctx.input_shape(0);
    s[axis] = sizes[i];
    ctx.set_output(i, ctx.input_type(0), s);
  }
  return OkStatus();
}

Status InferSlice(InferenceContext& ctx) {
  int64_t rank = Rank(ctx, 0);
  auto starts = ctx.input_dims_value(1);
  auto ends = ctx.input_dims_value(2);
  if (!starts || !ends) {
    return ctx.Error(ErrorCode::kDataDependentShape,
                     "starts and ends must be constants or computed from shapes");
  }
  if (starts->size() != ends->size()) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "starts has {} entries, ends {}", starts->size(),
                     ends->size());
  }
  std::vector<int64_t> axes, steps(starts->size(), 1);
  if (ctx.has_input(3)) {
    KILN_ASSIGN_OR_RETURN(axes, RequiredInts(ctx, 3, "axes"));
  } else {
    for (size_t i = 0; i < starts->size(); ++i) axes.push_back(static_cast<int64_t>(i));
  }
  if (ctx.has_input(4)) {
    KILN_ASSIGN_OR_RETURN(steps, RequiredInts(ctx, 4, "steps"));
  }
  if (axes.size() != starts->size() || steps.size() != starts->size()) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "starts, ends, axes and steps differ in length");
  }
  KILN_ASSIGN_OR_RETURN(axes, NormalizeAxes(ctx, axes, rank));
  Shape out = ctx.input_shape(0);
  for (size_t i = 0; i < axes.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(out[axes[i]],
                          SliceDim(ctx, out[axes[i]], (*starts)[i], (*ends)[i], steps[i]));
  }
  ctx.set_output(0, ctx.input_type(0), out);
  // Slicing a shape vector (x.shape[:-1]).
  auto v = ctx.input_dims_value(0);
  if (v && rank == 1 && out[0].is_static()) {
    auto s = (*starts)[0].static_value(), e = (*ends)[0].static_value();
    if (s && e) {
      int64_t n = static_cast<int64_t>(v->size()), step = steps[0], b = *s;
      if (b < 0) b += n;
      b = step > 0 ? std::clamp<int64_t>(b, 0, n) : std::clamp<int64_t>(b, 0, n - 1);
      std::vector<Dim> r;
      for (int64_t k = 0; k < out[0].value(); ++k) r.push_back((*v)[b + k * step]);
      ctx.set_output_dims_value(0, std::move(r));
    }
  }
  return OkStatus();
}

Status InferGather(InferenceContext& ctx) {
  int64_t rank = Rank(ctx, 0);
  KILN_RETURN_IF_ERROR(RequireIntegerInput(ctx, 1, "indices"));
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr, IntAttr(ctx, "axis", attrs::Gather::axis_default()));
  KILN_ASSIGN_OR_RETURN(int64_t axis, Axis(ctx, axis_attr, rank));
  const Shape& data = ctx.input_shape(0);
  Shape out(data.begin(), data.begin() + axis);
  for (const Dim& d : ctx.input_shape(1)) out.push_back(d);
  out.insert(out.end(), data.begin() + axis + 1, data.end());
  ctx.set_output(0, ctx.input_type(0), out);
  auto v = ctx.input_dims_value(0);
  auto idx = ctx.input_ints(1);
  if (v && idx && rank == 1) {
    std::vector<Dim> r;
    int64_t n = static_cast<int64_t>(v->size());
    for (int64_t i : *idx) {
      if (i < -n || i >= n) {
        return ctx.Error(ErrorCode::kShapeMismatch, "index {} is out of range for {} elements", i,
                         n);
      }
      r.push_back((*v)[i < 0 ? i + n : i]);
    }
    ctx.set_output_dims_value(0, std::move(r));
  }
  return OkStatus();
}

// GatherElements/ScatterElements: indices address data by their own coordinates on every axis
// but `axis`, so there they may not be longer than data (checked where both dims are static; the
// CPU kernels check again at run time).
Status IndicesWithinData(const InferenceContext& ctx, int64_t axis) {
  const Shape& data = ctx.input_shape(0);
  const Shape& ind = ctx.input_shape(1);
  for (size_t d = 0; d < data.size() && d < ind.size(); ++d) {
    auto n = data[d].static_value(), m = ind[d].static_value();
    if (static_cast<int64_t>(d) != axis && n && m && *m > *n) {
      return ctx.Error(ErrorCode::kShapeMismatch,
                       "indices {} are longer than data {} on axis {} (the gather/scatter axis "
                       "is {})",
                       ToString(ind), ToString(data), d, axis);
    }
  }
  return OkStatus();
}

Status InferGatherElements(InferenceContext& ctx) {
  int64_t rank = Rank(ctx, 0);
  KILN_RETURN_IF_ERROR(RequireIntegerInput(ctx, 1, "indices"));
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr,
                        IntAttr(ctx, "axis", attrs::GatherElements::axis_default()));
  KILN_ASSIGN_OR_RETURN(int64_t axis, Axis(ctx, axis_attr, rank));
  if (Rank(ctx, 1) != rank) {
    return ctx.Error(ErrorCode::kShapeMismatch, "indices {} and data {} differ in rank",
                     ToString(ctx.input_shape(1)), ToString(ctx.input_shape(0)));
  }
  KILN_RETURN_IF_ERROR(IndicesWithinData(ctx, axis));
  ctx.set_output(0, ctx.input_type(0), ctx.input_shape(1));
  return OkStatus();
}

// GatherND: out = indices.shape[:-1] ++ data.shape[batch_dims + k:], k = indices.shape[-1],
// which must be static (it decides the output's rank).
Status InferGatherND(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireIntegerInput(ctx, 1, "indices"));
  KILN_ASSIGN_OR_RETURN(int64_t b,
                        IntAttr(ctx, "batch_dims", attrs::GatherND::batch_dims_default()));
  const Shape& data = ctx.input_shape(0);
  const Shape& ind = ctx.input_shape(1);
  int64_t r = Rank(ctx, 0), q = Rank(ctx, 1);
  if (r < 1 || q < 1) {
    return ctx.Error(ErrorCode::kShapeMismatch, "data {} and indices {} must have rank >= 1",
                     ToString(data), ToString(ind));
  }
  if (b < 0 || b >= std::min(r, q)) {
    return ctx.Error(ErrorCode::kInvalidAttribute,
                     "batch_dims {} must lie in [0, {}) for data of rank {} and indices of rank {}",
                     b, std::min(r, q), r, q);
  }
  std::optional<int64_t> k = ind.back().static_value();
  if (!k) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "the last dim of indices {} must be static: it decides the output's rank",
                     ToString(ind));
  }
  if (*k < 1 || *k > r - b) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "the last dim of indices {} must lie in [1, {}] for data {} and batch_dims {}",
                     ToString(ind), r - b, ToString(data), b);
  }
  for (int64_t i = 0; i < b; ++i) {
    if (DimsEqual(data[i], ind[i]) == false) {
      return ctx.Error(ErrorCode::kShapeMismatch, "batch dim {} differs: data {}, indices {}", i,
                       ToString(data), ToString(ind));
    }
  }
  Shape out(ind.begin(), ind.end() - 1);
  out.insert(out.end(), data.begin() + b + *k, data.end());
  ctx.set_output(0, ctx.input_type(0), out);
  return OkStatus();
}

// The scatters' shared checks: a reduction ONNX defines, and updates (input 2) of data's type.
static Status CheckScatterReductionAndUpdates(InferenceContext& ctx, const std::string& red) {
  if (red != "none" && red != "add" && red != "mul" && red != "max" && red != "min") {
    return ctx.Error(ErrorCode::kInvalidAttribute, "reduction '{}' is not none/add/mul/max/min",
                     red);
  }
  if (ctx.input_type(2) != ctx.input_type(0)) {
    return ctx.Error(ErrorCode::kTypeMismatch, "updates type {} differs from data type {}",
                     ToString(ctx.input_type(2)), ToString(ctx.input_type(0)));
  }
  return OkStatus();
}

// ScatterElements: indices and updates of one shape, of data's rank; the output is data's shape.
Status InferScatterElements(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireIntegerInput(ctx, 1, "indices"));
  int64_t rank = Rank(ctx, 0);
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr,
                        IntAttr(ctx, "axis", attrs::ScatterElements::axis_default()));
  KILN_ASSIGN_OR_RETURN(int64_t axis, Axis(ctx, axis_attr, rank));
  KILN_ASSIGN_OR_RETURN(std::string red,
                        StringAttr(ctx, "reduction", attrs::ScatterElements::reduction_default()));
  KILN_RETURN_IF_ERROR(CheckScatterReductionAndUpdates(ctx, red));
  const Shape& ind = ctx.input_shape(1);
  const Shape& upd = ctx.input_shape(2);
  if (Rank(ctx, 1) != rank || Rank(ctx, 2) != rank) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "indices {} and updates {} must have the rank of data {}", ToString(ind),
                     ToString(upd), ToString(ctx.input_shape(0)));
  }
  for (int64_t i = 0; i < rank; ++i) {
    if (DimsEqual(ind[i], upd[i]) == false) {
      return ctx.Error(ErrorCode::kShapeMismatch, "indices {} and updates {} differ in shape",
                       ToString(ind), ToString(upd));
    }
  }
  KILN_RETURN_IF_ERROR(IndicesWithinData(ctx, axis));
  ctx.set_output(0, ctx.input_type(0), ctx.input_shape(0));
  return OkStatus();
}

Status InferScatterND(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireIntegerInput(ctx, 1, "indices"));
  KILN_ASSIGN_OR_RETURN(std::string red,
                        StringAttr(ctx, "reduction", attrs::ScatterND::reduction_default()));
  KILN_RETURN_IF_ERROR(CheckScatterReductionAndUpdates(ctx, red));
  // updates = indices.shape[:-1] ++ data.shape[k:], k = indices.shape[-1] (checked where static;
  // the kernel checks the rest at run time).
  const Shape& data = ctx.input_shape(0);
  const Shape& ind = ctx.input_shape(1);
  const Shape& upd = ctx.input_shape(2);
  if (ind.empty()) {
    return ctx.Error(ErrorCode::kShapeMismatch, "indices must have rank >= 1");
  }
  if (std::optional<int64_t> k = ind.back().static_value()) {
    int64_t r = Rank(ctx, 0);
    if (*k < 1 || *k > r) {
      return ctx.Error(ErrorCode::kShapeMismatch,
                       "the last dim of indices {} must lie in [1, {}] for data {}", ToString(ind),
                       r, ToString(data));
    }
    Shape want(ind.begin(), ind.end() - 1);
    want.insert(want.end(), data.begin() + *k, data.end());
    bool differs = want.size() != upd.size();
    for (size_t i = 0; !differs && i < want.size(); ++i) {
      differs = DimsEqual(want[i], upd[i]) == false;
    }
    if (differs) {
      return ctx.Error(ErrorCode::kShapeMismatch, "updates {} must have shape {}", ToString(upd),
                       ToString(want));
    }
  }
  ctx.set_output(0, ctx.input_type(0), ctx.input_shape(0));
  return OkStatus();
}

Status InferUnsqueeze(InferenceContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> axes, RequiredInts(ctx, 1, "axes"));
  int64_t out_rank = Rank(ctx, 0) + static_cast<int64_t>(axes.size());
  KILN_ASSIGN_OR_RETURN(axes, NormalizeAxes(ctx, axes, out_rank));
  Shape out(out_rank);
  std::vector<bool> is_new(out_rank, false);
  for (int64_t a : axes) is_new[a] = true;
  size_t k = 0;
  for (int64_t i = 0; i < out_rank; ++i) out[i] = is_new[i] ? Dim(1) : ctx.input_shape(0)[k++];
  ctx.set_output(0, ctx.input_type(0), out);
  if (auto v = ctx.input_dims_value(0); v && out_rank <= 1) ctx.set_output_dims_value(0, *v);
  return OkStatus();
}

Status InferSqueeze(InferenceContext& ctx) {
  int64_t rank = Rank(ctx, 0);
  const Shape& in = ctx.input_shape(0);
  std::vector<bool> drop(rank, false);
  if (ctx.has_input(1)) {
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> axes, RequiredInts(ctx, 1, "axes"));
    KILN_ASSIGN_OR_RETURN(axes, NormalizeAxes(ctx, axes, rank));
    for (int64_t a : axes) {
      if (in[a].is_static() && in[a].value() != 1) {
        return ctx.Error(ErrorCode::kShapeMismatch, "cannot squeeze axis {} of {}: it is not 1", a,
                         ToString(in));
      }
      drop[a] = true;
    }
  } else {
    // Symbolic dims are kept: they are sizes that the profile may set to anything.
    for (int64_t i = 0; i < rank; ++i) drop[i] = in[i] == Dim(1);
  }
  Shape out;
  for (int64_t i = 0; i < rank; ++i) {
    if (!drop[i]) out.push_back(in[i]);
  }
  ctx.set_output(0, ctx.input_type(0), out);
  if (auto v = ctx.input_dims_value(0); v && v->size() == 1) ctx.set_output_dims_value(0, *v);
  return OkStatus();
}

Status InferExpand(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireIntegerInput(ctx, 1, "shape"));
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> target, RequiredDims(ctx, 1, "shape"));
  auto s = BroadcastShapes(ctx.input_shape(0), target);
  if (!s.ok()) return ctx.Error(ErrorCode::kShapeMismatch, "{}", s.status().message());
  ctx.set_output(0, ctx.input_type(0), *s);
  if (auto v = ctx.input_dims_value(0); v && s->size() <= 1) {
    if (s->empty() || (*s)[0] == Dim(int64_t(v->size()))) {
      ctx.set_output_dims_value(0, *v);
    } else if (v->size() == 1 && (*s)[0].is_static()) {
      ctx.set_output_dims_value(0, std::vector<Dim>((*s)[0].value(), (*v)[0]));
    }
  }
  return OkStatus();
}

Status InferTile(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireIntegerInput(ctx, 1, "repeats"));
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> reps, RequiredDims(ctx, 1, "repeats"));
  if (static_cast<int64_t>(reps.size()) != Rank(ctx, 0)) {
    return ctx.Error(ErrorCode::kShapeMismatch, "repeats has {} entries for input {}", reps.size(),
                     ToString(ctx.input_shape(0)));
  }
  Shape out = ctx.input_shape(0);
  for (size_t i = 0; i < out.size(); ++i) out[i] = out[i] * reps[i];
  ctx.set_output(0, ctx.input_type(0), out);
  return OkStatus();
}

Status InferCast(InferenceContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t to, RequiredIntAttr(ctx, "to"));
  auto t = DataTypeFromOnnx(to);
  if (!t) {
    return ctx.Error(ErrorCode::kInvalidAttribute,
                     "attribute 'to' is ONNX type {}, which kiln does not support (double, "
                     "float, float16, bfloat16, the float8 and float4 types, int2/4/8/16/32/64, "
                     "uint2/4/8/16/32/64, bool)",
                     to);
  }
  KILN_ASSIGN_OR_RETURN(std::string round_mode,
                        StringAttr(ctx, "round_mode", attrs::Cast::round_mode_default()));
  if (round_mode != "up" && round_mode != "down" && round_mode != "nearest") {
    return ctx.Error(ErrorCode::kInvalidAttribute,
                     "round_mode is '{}'; it must be 'up', 'down' or 'nearest'", round_mode);
  }
  ctx.set_output(0, *t, ctx.input_shape(0));
  // Dims-values (which may hold -1) pass through casts to signed integers only, and from an
  // integer to f32/f64, which hold every dim exactly (Range reads such a float bound: the
  // window ops' expansions compute their length as Cast(size, float)).
  const bool int_to_float =
      IsInteger(ctx.input_type(0)) && (*t == DataType::kFloat32 || *t == DataType::kFloat64);
  if ((IsInteger(*t) && (!IsUnsigned(*t) || *t == DataType::kUInt8)) || int_to_float) {
    if (auto v = ctx.input_dims_value(0)) ctx.set_output_dims_value(0, *v);
  }
  return OkStatus();
}

Status InferConstantOfShape(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireIntegerInput(ctx, 0, "shape"));
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> shape, RequiredDims(ctx, 0, "shape"));
  DataType t = DataType::kFloat32;
  if (ctx.attrs().Has("value")) {
    const Tensor* v = ctx.attrs().GetTensor("value");
    if (!v || v->num_elements() != 1) {
      return ctx.Error(ErrorCode::kInvalidAttribute,
                       "attribute 'value' must be a one-element tensor");
    }
    t = v->dtype();
    if (IsInteger(t) && shape.size() <= 1) {
      // A constant-of-shape vector of ints is itself a dims-value (e.g. ones for Expand).
      if (shape.size() == 0 || shape[0].is_static()) {
        int64_t n = shape.empty() ? 1 : shape[0].value();
        if (n <= 16) ctx.set_output_dims_value(0, std::vector<Dim>(n, Dim(v->GetInt(0))));
      }
    }
  }
  for (const Dim& d : shape) {
    if (d.is_static() && d.value() < 0) {
      return ctx.Error(ErrorCode::kShapeMismatch, "shape {} has a negative dim", ToString(shape));
    }
  }
  ctx.set_output(0, t, shape);
  return OkStatus();
}

// Range (opset 27 form): f16/bf16 bounds compute in f32 (stash_type 1, the default; the CPU
// kernel's f16/bf16 wrapping is exactly that).
Status InferRange(InferenceContext& ctx) {
  DataType t = ctx.input_type(0);
  KILN_ASSIGN_OR_RETURN(int64_t stash,
                        IntAttr(ctx, "stash_type", attrs::Range::stash_type_default()));
  if (stash != 1 && (t == DataType::kFloat16 || t == DataType::kBFloat16)) {
    return ctx.Error(ErrorCode::kUnimplemented,
                     "stash_type {} (only 1, float, is supported for {} bounds)", stash,
                     ToString(t));
  }
  for (size_t i = 1; i < 3; ++i) {
    if (ctx.input_type(i) != t) {
      return ctx.Error(ErrorCode::kTypeMismatch, "start, limit and delta must share a type");
    }
  }
  for (size_t i = 0; i < 3; ++i) {
    if (NumElements(ctx.input_shape(i)) != Dim(1)) {
      return ctx.Error(ErrorCode::kShapeMismatch, "input {} must be a scalar", i);
    }
  }
  auto dims_of = [&](size_t i) -> std::optional<Dim> {
    if (auto v = ctx.input_dims_value(i); v && v->size() == 1) return (*v)[0];
    // A float bound that is a whole-number constant joins dims (a float Range whose limit is a
    // cast dim: Range(0.0, Cast(n, float), 1.0)).
    if (const Tensor* c = ctx.input_constant(i);
        c && IsFloatingPoint(t) && c->num_elements() == 1) {
      const double x = c->GetDouble(0);
      if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) <= double(kMaxDim)) {
        return Dim(static_cast<int64_t>(x));
      }
    }
    return std::nullopt;
  };
  Dim n;
  const Tensor *c0 = ctx.input_constant(0), *c1 = ctx.input_constant(1),
               *c2 = ctx.input_constant(2);
  if (IsFloat(t) && c0 && c1 && c2) {
    double start = c0->GetDouble(0), limit = c1->GetDouble(0), delta = c2->GetDouble(0);
    if (delta == 0) return ctx.Error(ErrorCode::kInvalidAttribute, "Range delta is 0");
    n = std::max<int64_t>(SatFromDouble(std::ceil((limit - start) / delta)), 0);
  } else if (auto s = dims_of(0), l = dims_of(1), d = dims_of(2); s && l && d) {
    if (!d->is_static() || d->value() == 0) {
      return ctx.Error(ErrorCode::kDataDependentShape, "Range delta must be a non-zero constant");
    }
    int64_t delta = d->value();
    Dim span = delta > 0 ? *l - *s : *s - *l;
    int64_t ad = delta > 0 ? delta : -delta;
    n = ad == 1 ? span : CeilDiv(span, ad);
    if (n.is_static() && n.value() < 0) n = 0;
  } else {
    return ctx.Error(ErrorCode::kDataDependentShape,
                     "start, limit and delta must be constants or computed from shapes");
  }
  ctx.set_output(0, t, {n});
  return OkStatus();
}

Status InferPad(InferenceContext& ctx) {
  int64_t rank = Rank(ctx, 0);
  KILN_ASSIGN_OR_RETURN(std::string mode, StringAttr(ctx, "mode", attrs::Pad::mode_default()));
  if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap") {
    return ctx.Error(ErrorCode::kInvalidAttribute,
                     "mode '{}' is not constant, reflect, edge or wrap", mode);
  }
  KILN_RETURN_IF_ERROR(RequireIntegerInput(ctx, 1, "pads"));
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> pads, RequiredDims(ctx, 1, "pads"));
  std::vector<int64_t> axes;
  if (ctx.has_input(3)) {
    KILN_ASSIGN_OR_RETURN(axes, RequiredInts(ctx, 3, "axes"));
    KILN_ASSIGN_OR_RETURN(axes, NormalizeAxes(ctx, axes, rank));
  } else {
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  }
  if (pads.size() != 2 * axes.size()) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "pads has {} entries for {} axes", pads.size(),
                     axes.size());
  }
  if (ctx.has_input(2) && ctx.input_type(2) != ctx.input_type(0)) {
    return ctx.Error(ErrorCode::kTypeMismatch, "constant_value type differs from data type");
  }
  Shape out = ctx.input_shape(0);
  size_t n = axes.size();
  for (size_t i = 0; i < n; ++i) {
    out[axes[i]] = out[axes[i]] + pads[i] + pads[i + n];
    if (out[axes[i]].is_static() && out[axes[i]].value() < 0) {
      return ctx.Error(ErrorCode::kShapeMismatch, "pads make axis {} negative", axes[i]);
    }
  }
  ctx.set_output(0, ctx.input_type(0), out);
  return OkStatus();
}

// CenterCropPad(input, shape [k]): each listed axis (attribute axes, default all) cropped or
// zero-padded about its centre to shape's value.
Status InferCenterCropPad(InferenceContext& ctx) {
  const int64_t rank = Rank(ctx, 0);
  KILN_RETURN_IF_ERROR(RequireIntegerInput(ctx, 1, "shape"));
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> target, RequiredDims(ctx, 1, "shape"));
  std::vector<int64_t> axes = attrs::CenterCropPad::axes(ctx.attrs());
  if (axes.empty()) {
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  }
  KILN_ASSIGN_OR_RETURN(axes, NormalizeAxes(ctx, axes, rank));
  if (target.size() != axes.size()) {
    return ctx.Error(ErrorCode::kShapeMismatch, "shape has {} entries for {} axes", target.size(),
                     axes.size());
  }
  Shape out = ctx.input_shape(0);
  for (size_t i = 0; i < axes.size(); ++i) {
    if (target[i].is_static() && target[i].value() < 0) {
      return ctx.Error(ErrorCode::kShapeMismatch, "shape[{}] is {}", i, target[i].value());
    }
    out[axes[i]] = target[i];
  }
  ctx.set_output(0, ctx.input_type(0), std::move(out));
  return OkStatus();
}

Status InferTrilu(InferenceContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t upper, IntAttr(ctx, "upper", attrs::Trilu::upper_default()));
  if (upper != 0 && upper != 1) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "attribute 'upper' must be 0 or 1");
  }
  if (Rank(ctx, 0) < 2) {
    return ctx.Error(ErrorCode::kShapeMismatch, "input {} has rank < 2",
                     ToString(ctx.input_shape(0)));
  }
  ctx.set_output(0, ctx.input_type(0), ctx.input_shape(0));
  return OkStatus();
}

Status InferCumSum(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(RequireIntegerInput(ctx, 1, "axis"));
  if (NumElements(ctx.input_shape(1)) != Dim(1)) {
    return ctx.Error(ErrorCode::kShapeMismatch, "axis must be a scalar");
  }
  if (auto axis = ctx.input_ints(1)) {
    KILN_RETURN_IF_ERROR(Axis(ctx, (*axis)[0], Rank(ctx, 0)).status());
  }
  ctx.set_output(0, ctx.input_type(0), ctx.input_shape(0));
  return OkStatus();
}

Status InferTopK(InferenceContext& ctx) {
  int64_t rank = Rank(ctx, 0);
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr, IntAttr(ctx, "axis", attrs::TopK::axis_default()));
  KILN_ASSIGN_OR_RETURN(int64_t axis, Axis(ctx, axis_attr, rank));
  const Dim& d = ctx.input_shape(0)[axis];
  if (!ctx.input_dims_value(1)) {
    // K computed from tensor values at run time: a data-dependent dim, at most the axis length
    // (docs/architecture.md, "Data-dependent shapes"); the kernel reads K and reports it.
    if (NumElements(ctx.input_shape(1)) != Dim(1)) {
      return ctx.Error(ErrorCode::kShapeMismatch, "K must have one element; got shape {}",
                       ToString(ctx.input_shape(1)));
    }
    Shape out = ctx.input_shape(0);
    out[axis] = ctx.DataDependentDim(0, axis, d);
    ctx.set_output(0, ctx.input_type(0), out);
    ctx.output(1).data_dependent = ctx.output(0).data_dependent;
    ctx.set_output(1, DataType::kInt64, out);
    return OkStatus();
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Dim> k, RequiredDims(ctx, 1, "K"));
  if (k.size() != 1) return ctx.Error(ErrorCode::kShapeMismatch, "K must have one element");
  if (k[0].is_static() && (k[0].value() < 0 || (d.is_static() && k[0].value() > d.value()))) {
    return ctx.Error(ErrorCode::kShapeMismatch, "K={} is out of range for axis {} of {}",
                     k[0].value(), axis, ToString(ctx.input_shape(0)));
  }
  Shape out = ctx.input_shape(0);
  out[axis] = k[0];
  ctx.set_output(0, ctx.input_type(0), out);
  ctx.set_output(1, DataType::kInt64, out);
  return OkStatus();
}

Status InferOneHot(InferenceContext& ctx) {
  int64_t rank = Rank(ctx, 0) + 1;
  KILN_ASSIGN_OR_RETURN(int64_t axis_attr, IntAttr(ctx, "axis", attrs::OneHot::axis_default()));
  KILN_ASSIGN_OR_RETURN(int64_t axis, Axis(ctx, axis_attr, rank));
  auto depth = ctx.input_dims_value(1);
  Dim depth_dim;
  if (depth && depth->size() == 1) {
    depth_dim = (*depth)[0];
  } else if (const Tensor* c = ctx.input_constant(1); c && c->num_elements() == 1) {
    depth_dim = SatFromDouble(c->GetDouble(0));
  } else {
    return ctx.Error(ErrorCode::kDataDependentShape, "depth must be a constant");
  }
  if (NumElements(ctx.input_shape(2)) != Dim(2)) {
    return ctx.Error(ErrorCode::kShapeMismatch, "values must have two elements [off, on]");
  }
  Shape out = ctx.input_shape(0);
  out.insert(out.begin() + axis, depth_dim);
  ctx.set_output(0, ctx.input_type(2), out);
  return OkStatus();
}

namespace {
Status SpaceDepth(InferenceContext& ctx, bool to_space) {
  KILN_ASSIGN_OR_RETURN(int64_t b, RequiredIntAttr(ctx, "blocksize"));
  // blocksize^2 must not overflow (a wrapped 0 would divide by zero below): at most 2^20.
  constexpr int64_t kMaxBlock = int64_t{1} << 20;
  if (b < 1 || b > kMaxBlock) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "blocksize is {}; it must be in [1, {}]", b,
                     kMaxBlock);
  }
  if (to_space) {
    KILN_ASSIGN_OR_RETURN(std::string mode,
                          StringAttr(ctx, "mode", attrs::DepthToSpace::mode_default()));
    if (mode != "DCR" && mode != "CRD") {
      return ctx.Error(ErrorCode::kInvalidAttribute, "mode '{}' is not DCR or CRD", mode);
    }
  }
  if (Rank(ctx, 0) != 4) {
    return ctx.Error(ErrorCode::kShapeMismatch, "input {} must be NCHW",
                     ToString(ctx.input_shape(0)));
  }
  Shape s = ctx.input_shape(0);
  if (to_space) {
    if (s[1].is_static() && s[1].value() % (b * b) != 0) {
      return ctx.Error(ErrorCode::kShapeMismatch, "channels {} not divisible by blocksize^2 {}",
                       s[1].value(), b * b);
    }
    s = {s[0], FloorDiv(s[1], b * b), s[2] * b, s[3] * b};
  } else {
    for (int i = 2; i < 4; ++i) {
      if (s[i].is_static() && s[i].value() % b != 0) {
        return ctx.Error(ErrorCode::kShapeMismatch, "spatial dims {} not divisible by {}",
                         ToString(s), b);
      }
    }
    s = {s[0], s[1] * (b * b), FloorDiv(s[2], b), FloorDiv(s[3], b)};
  }
  ctx.set_output(0, ctx.input_type(0), s);
  return OkStatus();
}
}  // namespace

Status InferDepthToSpace(InferenceContext& ctx) { return SpaceDepth(ctx, true); }
Status InferSpaceToDepth(InferenceContext& ctx) { return SpaceDepth(ctx, false); }

// CumProd: CumSum's rule (a scalar integer axis), any numeric type.
Status InferCumProd(InferenceContext& ctx) { return InferCumSum(ctx); }

// BitCast: the same bytes read as `to`, which must have the input's element size (shape kept).
Status InferBitCast(InferenceContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t to, RequiredIntAttr(ctx, "to"));
  auto t = DataTypeFromOnnx(to);
  if (!t) {
    return ctx.Error(ErrorCode::kInvalidAttribute,
                     "attribute 'to' is ONNX type {}, which kiln does not support", to);
  }
  if (SizeOf(*t) != SizeOf(ctx.input_type(0))) {
    return ctx.Error(ErrorCode::kTypeMismatch, "{} and {} have different element sizes",
                     ToString(ctx.input_type(0)), ToString(*t));
  }
  ctx.set_output(0, *t, ctx.input_shape(0));
  return OkStatus();
}

// EyeLike: a 2-D tensor of the input's shape with ones on diagonal k, of type `dtype` (the
// input's when absent).
Status InferEyeLike(InferenceContext& ctx) {
  if (Rank(ctx, 0) != 2) {
    return ctx.Error(ErrorCode::kShapeMismatch, "input {} must be 2-D",
                     ToString(ctx.input_shape(0)));
  }
  DataType t = ctx.input_type(0);
  if (ctx.attrs().Has("dtype")) {
    KILN_ASSIGN_OR_RETURN(int64_t code, RequiredIntAttr(ctx, "dtype"));
    auto d = DataTypeFromOnnx(code);
    if (!d) {
      return ctx.Error(ErrorCode::kInvalidAttribute,
                       "attribute 'dtype' is ONNX type {}, which kiln does not support", code);
    }
    t = *d;
  }
  KILN_RETURN_IF_ERROR(IntAttr(ctx, "k", attrs::EyeLike::k_default()).status());
  ctx.set_output(0, t, ctx.input_shape(0));
  return OkStatus();
}

}  // namespace kiln
