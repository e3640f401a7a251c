#include "kiln/passes/view_analysis.h"

#include <algorithm>
#include <limits>

#include "kiln/ops/op_table.h"
#include "kiln/passes/pass.h"

namespace kiln::passes {
namespace {

bool IsOne(const Dim& d) { return d.is_static() && d.value() == 1; }

// a divides b with a quotient other than 1 (both symbolic or static).
bool ProperlyDivides(const Dim& a, const Dim& b) {
  if (a == b) return false;
  if (a.is_static() && a.value() == 0) return false;
  Dim q = FloorDiv(b, a);
  return q * a == b;
}

// Normalizes a possibly negative axis against rank; nullopt when out of range.
std::optional<size_t> Axis(int64_t axis, size_t rank) {
  const int64_t r = static_cast<int64_t>(rank);
  if (axis < 0) axis += r;
  if (axis < 0 || axis >= r) return std::nullopt;
  return static_cast<size_t>(axis);
}

// Drops size-1 modes and joins neighbours that are one run (outer stride = inner stride x size).
std::vector<ViewMode> Normalized(const std::vector<ViewMode>& modes) {
  std::vector<ViewMode> out;
  for (const ViewMode& m : modes) {
    if (IsOne(m.size)) continue;
    if (!out.empty() && out.back().stride == m.stride * m.size) {
      out.back() = ViewMode{out.back().size * m.size, m.stride};
    } else {
      out.push_back(m);
    }
  }
  return out;
}

// The element offset of index i along a dim with these modes; nullopt when it needs symbolic
// sizes to split (several modes of which an inner one is symbolic).
std::optional<Dim> IndexOffset(const std::vector<ViewMode>& modes, int64_t i) {
  if (modes.empty()) return Dim(0);
  if (modes.size() == 1) return Dim(i) * modes[0].stride;
  Dim off = 0;
  for (size_t k = modes.size(); k-- > 0;) {
    if (k == 0) {
      off = off + Dim(i) * modes[k].stride;
      break;
    }
    if (!modes[k].size.is_static() || modes[k].size.value() <= 0) return std::nullopt;
    const int64_t n = modes[k].size.value();
    off = off + Dim(i % n) * modes[k].stride;
    i /= n;
  }
  return off;
}

bool IsReshapeLike(const Node& n) {
  return IsOp(n, OpType::kReshape) || IsOp(n, OpType::kSqueeze) || IsOp(n, OpType::kUnsqueeze) ||
         IsOp(n, OpType::kFlatten);
}

std::optional<StridedView> GatherView(const Node& n, const StridedView& in,
                                      const PassContext& ctx) {
  std::optional<size_t> axis = Axis(attrs::Gather::axis(n), in.shape.size());
  if (!axis) return std::nullopt;
  const Value* index = n.input(1);
  if (!index || !index->has_shape()) return std::nullopt;
  auto idx = StaticInts(index, ctx);
  if (!idx || idx->size() != 1 || index->shape().size() > 1) return std::nullopt;
  int64_t i = (*idx)[0];
  const Dim& dim = in.shape[*axis];
  if (i < 0) {
    if (!dim.is_static()) return std::nullopt;
    i += dim.value();
  }
  if (i < 0 || (dim.is_static() && i >= dim.value())) return std::nullopt;
  std::optional<Dim> at = IndexOffset(in.modes[*axis], i);
  if (!at) return std::nullopt;
  StridedView out = in;
  out.offset = in.offset + *at;
  if (index->shape().empty()) {  // a scalar index drops the axis
    out.shape.erase(out.shape.begin() + static_cast<std::ptrdiff_t>(*axis));
    out.modes.erase(out.modes.begin() + static_cast<std::ptrdiff_t>(*axis));
  } else {
    out.shape[*axis] = 1;
    out.modes[*axis].clear();
  }
  return out;
}

std::optional<StridedView> SliceView(const Node& n, const StridedView& in, const PassContext& ctx) {
  auto starts = StaticInts(n.input(1), ctx);
  auto ends = StaticInts(n.input(2), ctx);
  if (!starts || !ends || starts->size() != ends->size()) return std::nullopt;
  std::vector<int64_t> axes;
  if (n.num_inputs() > 3 && n.input(3)) {
    auto a = StaticInts(n.input(3), ctx);
    if (!a) return std::nullopt;
    axes = *a;
  } else {
    for (size_t i = 0; i < starts->size(); ++i) axes.push_back(static_cast<int64_t>(i));
  }
  std::vector<int64_t> steps(starts->size(), 1);
  if (n.num_inputs() > 4 && n.input(4)) {
    auto s = StaticInts(n.input(4), ctx);
    if (!s) return std::nullopt;
    steps = *s;
  }
  if (axes.size() != starts->size() || steps.size() != starts->size()) return std::nullopt;
  StridedView out = in;
  for (size_t k = 0; k < axes.size(); ++k) {
    std::optional<size_t> axis = Axis(axes[k], in.shape.size());
    if (!axis || steps[k] <= 0) return std::nullopt;
    const Dim& dim = in.shape[*axis];
    int64_t start = (*starts)[k], end = (*ends)[k];
    if (!dim.is_static()) {
      // Only the whole axis is known without its size.
      if (start == 0 && end == std::numeric_limits<int64_t>::max() && steps[k] == 1) continue;
      return std::nullopt;
    }
    const int64_t d = dim.value();
    auto clamp = [d](int64_t v) {
      if (v < 0) v += d;
      return std::clamp<int64_t>(v, 0, d);
    };
    start = clamp(start);
    end = clamp(end);
    const int64_t len = end > start ? (end - start + steps[k] - 1) / steps[k] : 0;
    std::vector<ViewMode>& m = out.modes[*axis];
    if (len == 0 || m.size() > 1) return std::nullopt;
    if (m.empty()) continue;  // a size-1 dim kept whole
    out.offset = out.offset + Dim(start) * m[0].stride;
    m[0] = ViewMode{Dim(len), m[0].stride * Dim(steps[k])};
    out.shape[*axis] = len;
    m = Normalized(m);
  }
  return out;
}

std::optional<StridedView> SplitView(const Node& n, size_t output_index, const StridedView& in,
                                     const PassContext& ctx) {
  std::optional<size_t> axis = Axis(attrs::Split::axis(n), in.shape.size());
  if (!axis || output_index >= n.num_outputs()) return std::nullopt;
  std::vector<int64_t> sizes;
  if (n.num_inputs() > 1 && n.input(1)) {
    auto s = StaticInts(n.input(1), ctx);
    if (!s) return std::nullopt;
    sizes = *s;
  } else if (n.attrs().Has("split")) {
    sizes = n.attrs().GetInts("split");
  } else {
    // Equal parts (opset 18's uneven last part included): read the outputs' sizes.
    for (size_t i = 0; i < n.num_outputs(); ++i) {
      const Value* o = n.output(i);
      if (!o || !o->has_shape() || o->shape().size() != in.shape.size() ||
          !o->shape()[*axis].is_static()) {
        return std::nullopt;
      }
      sizes.push_back(o->shape()[*axis].value());
    }
  }
  if (sizes.size() != n.num_outputs()) return std::nullopt;
  int64_t before = 0;
  for (size_t i = 0; i < output_index; ++i) before += sizes[i];
  StridedView out = in;
  std::vector<ViewMode>& m = out.modes[*axis];
  if (m.size() != 1 || sizes[output_index] <= 0) return std::nullopt;
  out.offset = in.offset + Dim(before) * m[0].stride;
  out.shape[*axis] = sizes[output_index];
  m[0].size = sizes[output_index];
  m = Normalized(m);
  return out;
}

}  // namespace

StridedView ContiguousView(const Shape& shape) {
  StridedView v;
  v.shape = shape;
  v.modes.resize(shape.size());
  Dim stride = 1;
  for (size_t k = shape.size(); k-- > 0;) {
    if (!IsOne(shape[k])) v.modes[k].push_back(ViewMode{shape[k], stride});
    stride = stride * shape[k];
  }
  return v;
}

std::optional<Dim> StridedView::stride(size_t k) const {
  if (modes[k].empty()) return Dim(0);
  if (modes[k].size() == 1) return modes[k][0].stride;
  return std::nullopt;
}

std::optional<StridedView> ContiguousView(Value* v) {
  if (!v || !v->has_shape()) return std::nullopt;
  StridedView view = ContiguousView(v->shape());
  view.source = v;
  return view;
}

std::optional<StridedView> ReshapeView(const StridedView& in, const Shape& shape) {
  if (!(NumElements(in.shape) == NumElements(shape))) return std::nullopt;
  // Every mode in order, outermost first: the elements' row-major order.
  std::vector<ViewMode> all;
  for (const std::vector<ViewMode>& m : in.modes) all.insert(all.end(), m.begin(), m.end());
  size_t next = 0;
  StridedView out;
  out.source = in.source;
  out.shape = shape;
  out.offset = in.offset;
  out.modes.resize(shape.size());
  for (size_t j = 0; j < shape.size(); ++j) {
    Dim rem = shape[j];  // how much of dim j the modes taken so far leave to cover
    std::vector<ViewMode> taken;
    while (!IsOne(rem)) {
      if (next >= all.size()) return std::nullopt;
      ViewMode& m = all[next];
      if (m.size == rem) {
        taken.push_back(m);
        ++next;
        rem = 1;
      } else if (ProperlyDivides(m.size, rem)) {  // the whole mode and more
        taken.push_back(m);
        ++next;
        rem = FloorDiv(rem, m.size);
      } else if (ProperlyDivides(rem, m.size)) {  // the mode's outer part; its inner part stays
        Dim inner = FloorDiv(m.size, rem);
        taken.push_back(ViewMode{rem, m.stride * inner});
        m = ViewMode{inner, m.stride};
        rem = 1;
      } else {
        return std::nullopt;
      }
    }
    out.modes[j] = Normalized(taken);
  }
  if (next != all.size()) return std::nullopt;
  return out;
}

StridedView TransposeView(const StridedView& in, const std::vector<int64_t>& perm) {
  StridedView out = in;
  for (size_t k = 0; k < perm.size(); ++k) {
    out.shape[k] = in.shape[static_cast<size_t>(perm[k])];
    out.modes[k] = in.modes[static_cast<size_t>(perm[k])];
  }
  return out;
}

std::optional<std::vector<int64_t>> TransposePerm(const Node& n, size_t rank) {
  std::vector<int64_t> perm = attrs::Transpose::perm(n);
  if (perm.empty()) {
    for (size_t k = rank; k-- > 0;) perm.push_back(static_cast<int64_t>(k));
  }
  if (perm.size() != rank) return std::nullopt;
  std::vector<bool> seen(rank, false);
  for (int64_t p : perm) {
    if (p < 0 || p >= static_cast<int64_t>(rank) || seen[static_cast<size_t>(p)]) {
      return std::nullopt;
    }
    seen[static_cast<size_t>(p)] = true;
  }
  return perm;
}

Value* ViewInput(const Node& n) {
  if (n.num_inputs() == 0) return nullptr;
  if (IsReshapeLike(n) || IsOp(n, OpType::kTranspose) || IsOp(n, OpType::kIdentity) ||
      IsOp(n, OpType::kGather) || IsOp(n, OpType::kSlice) || IsOp(n, OpType::kSplit)) {
    return n.input(0);
  }
  return nullptr;
}

std::optional<StridedView> ApplyView(const Node& n, size_t output_index, const StridedView& in,
                                     const PassContext& ctx) {
  if (output_index >= n.num_outputs()) return std::nullopt;
  const Value* out = n.output(output_index);
  if (IsOp(n, OpType::kIdentity)) return in;
  if (IsReshapeLike(n)) {
    if (!out || !out->has_shape()) return std::nullopt;
    return ReshapeView(in, out->shape());
  }
  if (IsOp(n, OpType::kTranspose)) {
    std::optional<std::vector<int64_t>> perm = TransposePerm(n, in.shape.size());
    if (!perm) return std::nullopt;
    return TransposeView(in, *perm);
  }
  if (IsOp(n, OpType::kGather)) return GatherView(n, in, ctx);
  if (IsOp(n, OpType::kSlice)) return SliceView(n, in, ctx);
  if (IsOp(n, OpType::kSplit)) return SplitView(n, output_index, in, ctx);
  return std::nullopt;
}

ViewChain ViewChainOf(Value* v, int max_depth) {
  ViewChain c;
  c.values.push_back(v);
  while (static_cast<int>(c.nodes.size()) < max_depth) {
    Value* cur = c.values.back();
    const Node* p = cur->producer();
    Value* in = p ? ViewInput(*p) : nullptr;
    if (!in || !in->has_shape()) break;
    size_t index = 0;
    while (index < p->num_outputs() && p->output(index) != cur) ++index;
    c.nodes.push_back(p);
    c.output_index.push_back(index);
    c.values.push_back(in);
  }
  return c;
}

std::optional<StridedView> ApplyChain(const ViewChain& chain, size_t from, StridedView start,
                                      const PassContext& ctx) {
  std::optional<StridedView> view = std::move(start);
  for (size_t k = from; view && k-- > 0;) {
    view = ApplyView(*chain.nodes[k], chain.output_index[k], *view, ctx);
  }
  return view;
}

std::vector<StridedView> ViewsOf(Value* v, const PassContext& ctx, int max_depth) {
  ViewChain chain = ViewChainOf(v, max_depth);
  std::vector<StridedView> views;
  for (size_t s = chain.values.size(); s-- > 0;) {  // each source, farthest first
    std::optional<StridedView> start = ContiguousView(chain.values[s]);
    if (!start) continue;
    if (std::optional<StridedView> view = ApplyChain(chain, s, *start, ctx)) {
      views.push_back(std::move(*view));
    }
  }
  return views;
}

bool HasStride(const StridedView& view, size_t k, const Dim& want) {
  if (IsOne(view.shape[k])) return true;
  std::optional<Dim> st = view.stride(k);
  return st && *st == want;
}

bool IsRowMajor(const StridedView& view, const Shape& shape) {
  if (view.shape.size() != shape.size() || !(view.offset == Dim(0))) return false;
  StridedView want = ContiguousView(shape);
  for (size_t k = 0; k < shape.size(); ++k) {
    if (!(view.shape[k] == shape[k])) return false;
    if (!HasStride(view, k, *want.stride(k))) return false;
  }
  return true;
}

}  // namespace kiln::passes
