// Kernels of ops with data-dependent output dims (docs/architecture.md, "Data-dependent
// shapes"): NonZero, Unique, Compress, NonMaxSuppression. Each writes its outputs densely at the
// dims it finds and reports them (Kernel::RunOutputDims); the output views' dims are not read
// (they are the bounds or the last run's), only their bytes, which hold the bounds.
#include <algorithm>
#include <cmath>

#include "kiln/backends/cpu/op_util.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {
namespace {

using OutDims = std::vector<std::vector<int64_t>>;

// A kernel that reports its outputs' dims. `workspace` sizes the scratch Run needs for the
// inputs' dims (Run never allocates: the dims vectors keep their capacity between runs).
class ReportingKernel final : public Kernel {
 public:
  using RunFn = std::function<Status(const KernelRunArgs&, OutDims&)>;
  using WorkspaceFn = std::function<size_t(std::span<const TensorView>)>;
  ReportingKernel(size_t outputs, RunFn run, WorkspaceFn workspace)
      : dims_(outputs), run_(std::move(run)), workspace_(std::move(workspace)) {
    for (auto& d : dims_) d.reserve(8);
  }
  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView>) override {
    return workspace_ ? workspace_(inputs) : size_t{0};
  }
  Status Run(const KernelRunArgs& args) override {
    if (args.workspace_bytes < (workspace_ ? workspace_(args.inputs) : 0)) {
      return MakeError(ErrorCode::kKernelFailed, "workspace of {} bytes is too small",
                       args.workspace_bytes);
    }
    return run_(args, dims_);
  }
  const std::vector<int64_t>* RunOutputDims(size_t i) const override {
    return i < dims_.size() ? &dims_[i] : nullptr;
  }

 private:
  OutDims dims_;
  RunFn run_;
  WorkspaceFn workspace_;
};

StatusOr<std::unique_ptr<Kernel>> Reporting(size_t outputs, ReportingKernel::RunFn run,
                                            ReportingKernel::WorkspaceFn workspace = nullptr) {
  return std::unique_ptr<Kernel>(
      std::make_unique<ReportingKernel>(outputs, std::move(run), std::move(workspace)));
}

// Calls f(nonzero) with a predicate on element i of v, chosen once per run: floats compare as
// numbers (-0 is zero, NaN is not), every other type by its bytes.
template <typename F>
void WithNonZero(const TensorView& v, F&& f) {
  const void* d = v.data;
  switch (v.dtype) {
    case DataType::kFloat32:
      return f([p = static_cast<const float*>(d)](int64_t i) { return p[i] != 0.f; });
    case DataType::kFloat64:
      return f([p = static_cast<const double*>(d)](int64_t i) { return p[i] != 0.0; });
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return f([p = static_cast<const uint16_t*>(d)](int64_t i) { return (p[i] & 0x7fff) != 0; });
    default:
      break;
  }
  switch (SizeOf(v.dtype)) {
    case 1:
      return f([p = static_cast<const uint8_t*>(d)](int64_t i) { return p[i] != 0; });
    case 2:
      return f([p = static_cast<const uint16_t*>(d)](int64_t i) { return p[i] != 0; });
    case 4:
      return f([p = static_cast<const uint32_t*>(d)](int64_t i) { return p[i] != 0; });
    default:
      return f([p = static_cast<const uint64_t*>(d)](int64_t i) { return p[i] != 0; });
  }
}

// ---- NonZero: [rank, n] coordinates of the non-zero elements, row-major order.
Status RunNonZero(const KernelRunArgs& a, OutDims& dims) {
  const TensorView& x = a.inputs[0];
  const int64_t total = x.num_elements();
  const size_t rank = std::max<size_t>(1, x.dims.size());
  auto* out = a.outputs[0].as<int64_t>();
  int64_t n = 0;
  WithNonZero(x, [&](auto nonzero) {
    for (int64_t i = 0; i < total; ++i) n += nonzero(i) ? 1 : 0;
    int64_t j = 0;
    for (int64_t i = 0; i < total; ++i) {
      if (!nonzero(i)) continue;
      int64_t rest = i;
      for (size_t r = x.dims.size(); r-- > 0;) {
        out[static_cast<int64_t>(r) * n + j] = rest % x.dims[r];
        rest /= x.dims[r];
      }
      if (x.dims.empty()) out[j] = 0;
      ++j;
    }
  });
  dims[0].assign({static_cast<int64_t>(rank), n});
  return OkStatus();
}

// x as [outer, len, inner] around `axis_attr` (negative from the back); without an axis, one
// flattened run of every element (outer = inner = 1, axis 0).
struct AxisSplit {
  int64_t outer = 1, len = 0, inner = 1;
  size_t axis = 0;
};
AxisSplit SplitAtAxis(const TensorView& x, std::optional<int64_t> axis_attr) {
  AxisSplit s;
  s.len = x.num_elements();
  if (!axis_attr) return s;
  s.axis = static_cast<size_t>(*axis_attr < 0 ? *axis_attr + static_cast<int64_t>(x.dims.size())
                                              : *axis_attr);
  s.len = x.dims[s.axis];
  for (size_t i = 0; i < s.axis; ++i) s.outer *= x.dims[i];
  for (size_t i = s.axis + 1; i < x.dims.size(); ++i) s.inner *= x.dims[i];
  return s;
}

// ---- Compress: the slices (or flattened elements) whose condition is true.
Status RunCompress(std::optional<int64_t> axis_attr, const KernelRunArgs& a, OutDims& dims) {
  const TensorView& x = a.inputs[0];
  const TensorView& cond = a.inputs[1];
  const auto* c = cond.as<const bool>();
  const int64_t clen = cond.num_elements();
  const AxisSplit split = SplitAtAxis(x, axis_attr);
  const int64_t outer = split.outer, len = split.len, inner = split.inner;
  const size_t axis = split.axis;
  int64_t n = 0;
  for (int64_t i = 0; i < clen; ++i) {
    if (!c[i]) continue;
    if (i >= len) {
      return MakeError(ErrorCode::kShapeMismatch,
                       "Compress: condition selects index {} but the input has {} there", i, len);
    }
    ++n;
  }
  const size_t es = SizeOf(x.dtype);
  const auto* src = static_cast<const std::byte*>(x.data);
  auto* dst = static_cast<std::byte*>(a.outputs[0].data);
  const size_t run = static_cast<size_t>(inner) * es;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < clen && i < len; ++i) {
      if (!c[i]) continue;
      std::memcpy(dst, src + (o * len + i) * static_cast<int64_t>(run), run);
      dst += run;
    }
  }
  if (axis_attr) {
    dims[0].assign(x.dims.begin(), x.dims.end());
    dims[0][axis] = n;
  } else {
    dims[0].assign({n});
  }
  return OkStatus();
}

// ---- Unique: distinct elements (or slices along an axis), sorted or in first-occurrence order,
// with the first index of each, every element's position in Y, and the counts. NaNs compare
// equal to each other and greater than every number (numpy's equal_nan).
template <typename T>
bool Less(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a)) return false;
    if (std::isnan(b)) return true;
  }
  return a < b;
}

size_t UniqueWorkspace(std::span<const TensorView> in, std::optional<int64_t> axis) {
  const TensorView& x = in[0];
  int64_t len = x.num_elements();
  if (axis) {
    const int64_t r = static_cast<int64_t>(x.dims.size());
    len = x.dims[static_cast<size_t>(*axis < 0 ? *axis + r : *axis)];
  }
  return static_cast<size_t>(5 * std::max<int64_t>(len, 1)) * sizeof(int64_t);
}

template <typename T>
Status RunUnique(std::optional<int64_t> axis_attr, bool sorted, const KernelRunArgs& a,
                 OutDims& dims) {
  const TensorView& x = a.inputs[0];
  const T* src = x.as<const T>();
  const AxisSplit split = SplitAtAxis(x, axis_attr);
  const int64_t outer = split.outer, len = split.len, inner = split.inner;
  const size_t axis = split.axis;
  // Slice k is x[o, k, i] for o < outer, i < inner, compared in (o, i) order.
  auto cmp = [&](int64_t p, int64_t q) -> int {
    for (int64_t o = 0; o < outer; ++o) {
      const T* sp = src + (o * len + p) * inner;
      const T* sq = src + (o * len + q) * inner;
      for (int64_t i = 0; i < inner; ++i) {
        if (Less(sp[i], sq[i])) return -1;
        if (Less(sq[i], sp[i])) return 1;
      }
    }
    return 0;
  };
  auto* ws = static_cast<int64_t*>(a.workspace);
  int64_t* perm = ws;             // slices by value, ties by index
  int64_t* group = ws + len;      // per sorted position: its group
  int64_t* first = ws + 2 * len;  // per group: its first index
  int64_t* place = ws + 3 * len;  // per output position: its group
  int64_t* pos_of_group = ws + 4 * len;
  for (int64_t k = 0; k < len; ++k) perm[k] = k;
  std::sort(perm, perm + len, [&](int64_t p, int64_t q) {
    const int c = cmp(p, q);
    return c != 0 ? c < 0 : p < q;
  });
  int64_t n = 0;
  for (int64_t s = 0; s < len; ++s) {
    if (s == 0 || cmp(perm[s - 1], perm[s]) != 0) first[n++] = perm[s];
    group[s] = n - 1;
  }
  // Output order: the groups as sorted, or by first occurrence.
  for (int64_t g = 0; g < n; ++g) place[g] = g;
  if (!sorted)
    std::sort(place, place + n, [&](int64_t g, int64_t h) { return first[g] < first[h]; });
  for (int64_t k = 0; k < n; ++k) pos_of_group[place[k]] = k;
  auto* indices = a.outputs.size() > 1 && a.outputs[1].data ? a.outputs[1].as<int64_t>() : nullptr;
  auto* inverse = a.outputs.size() > 2 && a.outputs[2].data ? a.outputs[2].as<int64_t>() : nullptr;
  auto* counts = a.outputs.size() > 3 && a.outputs[3].data ? a.outputs[3].as<int64_t>() : nullptr;
  if (counts) std::fill(counts, counts + n, 0);
  for (int64_t s = 0; s < len; ++s) {
    const int64_t k = pos_of_group[group[s]];
    if (inverse) inverse[perm[s]] = k;
    if (counts) ++counts[k];
  }
  T* y = a.outputs[0].as<T>();
  for (int64_t k = 0; k < n; ++k) {
    const int64_t g = place[k];
    if (indices) indices[k] = first[g];
    for (int64_t o = 0; o < outer; ++o) {
      std::copy_n(src + (o * len + first[g]) * inner, inner, y + (o * n + k) * inner);
    }
  }
  if (axis_attr) {
    dims[0].assign(x.dims.begin(), x.dims.end());
    dims[0][axis] = n;
  } else {
    dims[0].assign({n});
  }
  if (dims.size() > 1) dims[1].assign({n});
  if (dims.size() > 2) dims[2].assign({len});
  if (dims.size() > 3) dims[3].assign({n});
  return OkStatus();
}

// ---- NonMaxSuppression: per (batch, class), boxes by descending score (ties: lower index
// first) above score_threshold, each kept unless its IoU with a kept one exceeds iou_threshold,
// at most max_output_boxes_per_class; output rows [batch, class, box].
struct Corners {
  float x0, y0, x1, y1;
};

Corners CornersOf(const float* b, bool center) {
  if (center) {
    return {b[0] - b[2] / 2, b[1] - b[3] / 2, b[0] + b[2] / 2, b[1] + b[3] / 2};
  }
  return {std::min(b[1], b[3]), std::min(b[0], b[2]), std::max(b[1], b[3]), std::max(b[0], b[2])};
}

bool Suppresses(const Corners& a, const Corners& b, float iou_threshold) {
  const float ix0 = std::max(a.x0, b.x0), ix1 = std::min(a.x1, b.x1);
  if (ix1 <= ix0) return false;
  const float iy0 = std::max(a.y0, b.y0), iy1 = std::min(a.y1, b.y1);
  if (iy1 <= iy0) return false;
  const float inter = (ix1 - ix0) * (iy1 - iy0);
  const float area_a = (a.x1 - a.x0) * (a.y1 - a.y0), area_b = (b.x1 - b.x0) * (b.y1 - b.y0);
  const float uni = area_a + area_b - inter;
  if (inter <= 0 || area_a <= 0 || area_b <= 0 || uni <= 0) return false;
  return inter / uni > iou_threshold;
}

size_t NmsWorkspace(std::span<const TensorView> in) {
  return static_cast<size_t>(2 * std::max<int64_t>(1, in[0].dims.size() == 3 ? in[0].dims[1] : 1)) *
         sizeof(int64_t);
}

Status RunNms(bool center, const KernelRunArgs& a, OutDims& dims) {
  const TensorView& boxes = a.inputs[0];
  const TensorView& scores = a.inputs[1];
  const int64_t batches = boxes.dims[0], count = boxes.dims[1], classes = scores.dims[1];
  if (boxes.dims[2] != 4 || scores.dims[0] != batches || scores.dims[2] != count) {
    return MakeError(ErrorCode::kShapeMismatch,
                     "NonMaxSuppression: boxes [{}, {}, {}] and scores [{}, {}, {}] disagree",
                     boxes.dims[0], boxes.dims[1], boxes.dims[2], scores.dims[0], scores.dims[1],
                     scores.dims[2]);
  }
  auto present = [&](size_t i) {
    return a.inputs.size() > i && a.inputs[i].data && a.inputs[i].num_elements() > 0;
  };
  const int64_t max_out = present(2) ? std::max<int64_t>(0, ReadInt(a.inputs[2], 0)) : 0;
  const float iou = present(3) ? static_cast<float>(ReadScalar(a.inputs[3])) : 0.f;
  const bool has_score = present(4);
  const float score_threshold = has_score ? static_cast<float>(ReadScalar(a.inputs[4])) : 0.f;
  const float* bx = boxes.as<const float>();
  const float* sc = scores.as<const float>();
  auto* ws = static_cast<int64_t*>(a.workspace);
  int64_t* cand = ws;
  int64_t* kept = ws + count;
  auto* out = a.outputs[0].as<int64_t>();
  int64_t n = 0;
  for (int64_t b = 0; b < batches && max_out > 0; ++b) {
    const float* bb = bx + b * count * 4;
    for (int64_t c = 0; c < classes; ++c) {
      const float* s = sc + (b * classes + c) * count;
      int64_t m = 0;
      for (int64_t i = 0; i < count; ++i) {
        if (!has_score || s[i] > score_threshold) cand[m++] = i;
      }
      std::sort(cand, cand + m,
                [&](int64_t p, int64_t q) { return s[p] != s[q] ? s[p] > s[q] : p < q; });
      int64_t k = 0;
      for (int64_t j = 0; j < m && k < max_out; ++j) {
        const Corners box = CornersOf(bb + cand[j] * 4, center);
        bool keep = true;
        for (int64_t t = 0; t < k && keep; ++t) {
          keep = !Suppresses(box, CornersOf(bb + kept[t] * 4, center), iou);
        }
        if (!keep) continue;
        kept[k++] = cand[j];
        out[3 * n] = b;
        out[3 * n + 1] = c;
        out[3 * n + 2] = cand[j];
        ++n;
      }
    }
  }
  dims[0].assign({n, 3});
  return OkStatus();
}

// ---- LoopGuard: the iterations an unrolled Loop ran, and its states passed through.
Status RunLoopGuard(const std::string& loop, const KernelRunArgs& a, OutDims& dims) {
  const TensorView& active = a.inputs[0];
  const auto* act = active.as<const bool>();
  const int64_t bound = active.num_elements() - 1;
  if (act[bound]) {
    return MakeError(ErrorCode::kLoopTripLimit,
                     "Loop '{}' wants more than the {} iteration(s) it was unrolled to at build "
                     "time (its trip count or condition is computed at run time); rebuild with "
                     "`kiln build --max-loop-trips N` for a larger N",
                     loop, bound);
  }
  int64_t n = 0;
  while (n < bound && act[n]) ++n;
  auto* iterations = a.outputs[0].as<int64_t>();
  for (int64_t i = 0; i < n; ++i) iterations[i] = i;
  dims[0].assign({n});
  for (size_t i = 1; i < a.inputs.size() && i < a.outputs.size(); ++i) {
    const TensorView& x = a.inputs[i];
    const size_t bytes = x.size_bytes();
    if (bytes && a.outputs[i].data != x.data) std::memcpy(a.outputs[i].data, x.data, bytes);
    dims[i].assign(x.dims.begin(), x.dims.end());
  }
  return OkStatus();
}

std::optional<int64_t> AxisAttr(const Node& node) {
  if (!node.attrs().Has("axis")) return std::nullopt;
  return node.attrs().GetInt("axis", 0);
}

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "NonZero",
      .float_wrap = false,
      .accepts = [](const KernelRequest& r) { return SizeOf(InType(r, 0)) > 0; },
      .create = [](const KernelRequest&) { return Reporting(1, RunNonZero); },
  });
  RegisterOpKernel({
      .op_type = "Compress",
      .float_wrap = false,
      .accepts =
          [](const KernelRequest& r) {
            return SizeOf(InType(r, 0)) > 0 && InType(r, 1) == DataType::kBool;
          },
      .create =
          [](const KernelRequest& r) {
            std::optional<int64_t> axis = AxisAttr(*r.node);
            return Reporting(
                1, [axis](const KernelRunArgs& a, OutDims& d) { return RunCompress(axis, a, d); });
          },
  });
  RegisterOpKernel({
      .op_type = "LoopGuard",
      .float_wrap = false,
      .accepts =
          [](const KernelRequest& r) {
            for (size_t i = 1; i < r.inputs.size(); ++i) {
              if (SizeOf(InType(r, i)) == 0) return false;
            }
            return InType(r, 0) == DataType::kBool;
          },
      .create =
          [](const KernelRequest& r) {
            std::string loop = attrs::LoopGuard::loop(r.node->attrs());
            if (loop.empty()) loop = r.node->name();
            return Reporting(r.node->num_outputs(), [loop](const KernelRunArgs& a, OutDims& d) {
              return RunLoopGuard(loop, a, d);
            });
          },
  });
  RegisterOpKernel({
      .op_type = "Unique",
      .float_wrap = false,
      .accepts =
          [](const KernelRequest& r) {
            const DataType t = InType(r, 0);
            return t == DataType::kFloat32 || t == DataType::kFloat64 || t == DataType::kInt64 ||
                   t == DataType::kInt32 || t == DataType::kInt8 || t == DataType::kUInt8 ||
                   t == DataType::kInt16 || t == DataType::kUInt16 || t == DataType::kUInt32 ||
                   t == DataType::kUInt64 || t == DataType::kBool;
          },
      .create =
          [](const KernelRequest& r) {
            std::optional<int64_t> axis = AxisAttr(*r.node);
            const bool sorted = attrs::Unique::sorted(r.node->attrs()) != 0;
            const DataType t = r.inputs[0].dtype;
            return Reporting(
                r.node->num_outputs(),
                [axis, sorted, t](const KernelRunArgs& a, OutDims& d) {
                  return DispatchNumeric(t, [&](auto tag) {
                    using T = typename decltype(tag)::type;
                    return RunUnique<T>(axis, sorted, a, d);
                  });
                },
                [axis](std::span<const TensorView> in) { return UniqueWorkspace(in, axis); });
          },
  });
  RegisterOpKernel({
      .op_type = "NonMaxSuppression",
      .float_wrap = false,
      .accepts =
          [](const KernelRequest& r) {
            return InType(r, 0) == DataType::kFloat32 && InType(r, 1) == DataType::kFloat32;
          },
      .create =
          [](const KernelRequest& r) {
            const bool center = attrs::NonMaxSuppression::center_point_box(r.node->attrs()) != 0;
            return Reporting(
                1, [center](const KernelRunArgs& a, OutDims& d) { return RunNms(center, a, d); },
                NmsWorkspace);
          },
  });
  return true;
}();

}  // namespace
}  // namespace kiln::cpu
