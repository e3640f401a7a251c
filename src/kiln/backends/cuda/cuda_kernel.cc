// Host-side scaffolding for kiln's own CUDA kernels (see cuda_kernel.h).
#include "kiln/backends/cuda/cuda_kernel.h"

#include <algorithm>
#include <cctype>

#include "kiln/backends/cuda/cuda_common.h"

namespace kiln::cuda {

std::optional<Elem> ToElem(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return Elem::kF32;
    case DataType::kFloat16:
      return Elem::kF16;
    case DataType::kBFloat16:
      return Elem::kBF16;
    case DataType::kInt8:
      return Elem::kI8;
    case DataType::kUInt8:
      return Elem::kU8;
    case DataType::kInt32:
      return Elem::kI32;
    case DataType::kInt64:
      return Elem::kI64;
    case DataType::kBool:
      return Elem::kBool;
    default:
      return std::nullopt;
  }
}

std::string KebabCase(std::string_view op) {
  std::string out;
  for (size_t i = 0; i < op.size(); ++i) {
    char c = op[i];
    if (std::isupper(static_cast<unsigned char>(c))) {
      bool prev_lower = i > 0 && std::islower(static_cast<unsigned char>(op[i - 1]));
      if (i > 0 && prev_lower) out.push_back('-');
      out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string TacticName(DataType dtype, std::string_view op, std::string_view variant) {
  // Appends (not operator+ chains): GCC 12 reports a false -Wrestrict on "x" + std::string.
  std::string name(ToString(dtype));
  name.append("-").append(KebabCase(op)).append("-cuda");
  if (!variant.empty()) name.append("-").append(variant);
  return name;
}

Status Launched(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return OkStatus();
  std::string call = "launch of " + std::string(what);
  return CudaStatus(err, call.c_str());
}

std::optional<std::vector<int64_t>> ConstantInts(const KernelRequest& r, size_t i) {
  if (i >= r.inputs.size() || !r.inputs[i].constant) return std::nullopt;
  DataType t = r.inputs[i].constant->dtype();
  if (t != DataType::kInt64 && t != DataType::kInt32) return std::nullopt;
  return r.inputs[i].constant->ToInt64Vector();
}

std::vector<int64_t> DenseStrides(std::span<const int64_t> dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) s[i - 1] = s[i] * dims[i];
  return s;
}

bool SameDims(std::span<const int64_t> a, std::span<const int64_t> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

namespace {
// Merges dims (outermost first) with per-operand strides into a Strided of `k` operands.
StatusOr<Strided> Merge(const std::vector<int64_t>& dims,
                        const std::vector<std::vector<int64_t>>& strides, size_t k) {
  std::vector<int64_t> md;
  std::vector<std::vector<int64_t>> ms(k);
  for (size_t j = 0; j < dims.size(); ++j) {
    if (dims[j] == 1) continue;
    bool merge = !md.empty();
    for (size_t o = 0; o < k && merge; ++o) merge = ms[o].back() == strides[o][j] * dims[j];
    if (merge) {
      md.back() *= dims[j];
      for (size_t o = 0; o < k; ++o) ms[o].back() = strides[o][j];
    } else {
      md.push_back(dims[j]);
      for (size_t o = 0; o < k; ++o) ms[o].push_back(strides[o][j]);
    }
  }
  if (md.empty()) {
    md.push_back(1);
    for (size_t o = 0; o < k; ++o) ms[o].push_back(0);
  }
  if (md.size() > static_cast<size_t>(kMaxRank)) {
    return MakeError(ErrorCode::kKernelFailed,
                     "the CUDA kernels take at most {} non-mergeable dims; this layer has {}",
                     kMaxRank, md.size());
  }
  Strided s;
  s.rank = static_cast<int32_t>(md.size());
  for (size_t j = 0; j < md.size(); ++j) {
    s.dims[j] = md[j];
    for (size_t o = 0; o < k; ++o) s.strides[o][j] = ms[o][j];
  }
  return s;
}
}  // namespace

StatusOr<Strided> BroadcastSpace(std::span<const std::span<const int64_t>> inputs,
                                 std::span<const int64_t> out_dims) {
  size_t r = out_dims.size(), k = inputs.size();
  std::vector<int64_t> dims(out_dims.begin(), out_dims.end());
  std::vector<std::vector<int64_t>> strides(k, std::vector<int64_t>(r, 0));
  for (size_t o = 0; o < k; ++o) {
    std::span<const int64_t> in = inputs[o];
    if (in.size() > r) {
      return MakeError(ErrorCode::kShapeMismatch, "input of rank {} broadcast to rank {}",
                       in.size(), r);
    }
    std::vector<int64_t> dense = DenseStrides(in);
    size_t lead = r - in.size();
    for (size_t j = 0; j < in.size(); ++j) {
      if (in[j] != 1 && in[j] != out_dims[lead + j]) {
        return MakeError(ErrorCode::kShapeMismatch, "dim {} of size {} cannot broadcast to {}", j,
                         in[j], out_dims[lead + j]);
      }
      strides[o][lead + j] = in[j] == 1 ? 0 : dense[j];
    }
  }
  return Merge(dims, strides, k);
}

StatusOr<std::vector<bool>> ReducedAxes(std::span<const int64_t> dims,
                                        std::span<const int64_t> axes, bool noop_with_empty_axes) {
  const size_t rank = dims.size();
  std::vector<bool> reduce(rank, axes.empty() && !noop_with_empty_axes);
  for (int64_t ax : axes) {
    const int64_t a = ax < 0 ? ax + static_cast<int64_t>(rank) : ax;
    if (a < 0 || a >= static_cast<int64_t>(rank)) {
      return MakeError(ErrorCode::kShapeMismatch, "reduce axis {} of rank {}", ax, rank);
    }
    reduce[static_cast<size_t>(a)] = true;
  }
  return reduce;
}

StatusOr<StridedReduction> PlanStridedReduction(std::span<const int64_t> dims,
                                                const std::vector<bool>& reduce) {
  const std::vector<int64_t> strides = DenseStrides(dims);
  std::vector<int64_t> kd, ks, rd, rs;
  StridedReduction out;
  for (size_t i = 0; i < dims.size(); ++i) {
    (reduce[i] ? rd : kd).push_back(dims[i]);
    (reduce[i] ? rs : ks).push_back(strides[i]);
    (reduce[i] ? out.count : out.outputs) *= dims[i];
  }
  out.kept = CoalesceOne(kd, ks, 0);
  out.red = CoalesceOne(rd, rs, 0);
  if (out.kept.rank < 0 || out.red.rank < 0) {
    return MakeError(ErrorCode::kUnimplemented, "reduction of more than {} separate axes",
                     kMaxRank);
  }
  return out;
}

bool ReduceAxesAreConstant(const KernelRequest& r) {
  return r.inputs.size() < 2 || InType(r, 1) == DataType::kUndefined ||
         ConstantInts(r, 1).has_value();
}

Strided CoalesceOne(std::span<const int64_t> dims, std::span<const int64_t> strides,
                    int64_t offset) {
  std::vector<int64_t> d(dims.begin(), dims.end());
  std::vector<std::vector<int64_t>> s = {std::vector<int64_t>(strides.begin(), strides.end())};
  auto merged = Merge(d, s, 1);
  Strided out = merged.ok() ? *merged : Strided{};
  if (!merged.ok()) {
    // Cannot coalesce below kMaxRank: the caller checks rank; keep it an empty space.
    out.rank = -1;
  }
  out.offset[0] = offset;
  return out;
}

StatusOr<Strided> TransposeSpace(std::span<const int64_t> x, std::span<const int64_t> perm,
                                 std::span<const int64_t> y) {
  size_t rank = x.size();
  std::vector<int64_t> p(perm.begin(), perm.end());
  if (p.empty()) {
    for (size_t i = rank; i-- > 0;) p.push_back(static_cast<int64_t>(i));
  }
  if (p.size() != rank || y.size() != rank) {
    return MakeError(ErrorCode::kShapeMismatch, "perm of {} axes for rank {}", p.size(), rank);
  }
  std::vector<int64_t> xs = DenseStrides(x), strides(rank);
  for (size_t j = 0; j < rank; ++j) {
    int64_t a = p[j] < 0 ? p[j] + static_cast<int64_t>(rank) : p[j];
    if (a < 0 || a >= static_cast<int64_t>(rank) || x[a] != y[j]) {
      return MakeError(ErrorCode::kShapeMismatch, "perm entry {} does not map input to output",
                       p[j]);
    }
    strides[j] = xs[a];
  }
  return CoalesceOne(y, strides, 0);
}

StatusOr<Strided> SliceSpace(std::span<const int64_t> starts, std::span<const int64_t> axes,
                             std::span<const int64_t> steps, std::span<const int64_t> x,
                             std::span<const int64_t> y) {
  size_t rank = x.size();
  if (y.size() != rank) {
    return MakeError(ErrorCode::kShapeMismatch, "Slice of rank {} to rank {}", rank, y.size());
  }
  if ((!axes.empty() && axes.size() != starts.size()) ||
      (!steps.empty() && steps.size() != starts.size())) {
    return MakeError(ErrorCode::kShapeMismatch, "Slice has {} starts, {} axes and {} steps",
                     starts.size(), axes.size(), steps.size());
  }
  std::vector<int64_t> xs = DenseStrides(x), strides = xs;
  int64_t offset = 0;
  for (size_t i = 0; i < starts.size(); ++i) {
    int64_t ax = axes.empty() ? static_cast<int64_t>(i) : axes[i];
    if (ax < 0) ax += static_cast<int64_t>(rank);
    if (ax < 0 || ax >= static_cast<int64_t>(rank)) {
      return MakeError(ErrorCode::kShapeMismatch, "Slice axis {} of rank {}", ax, rank);
    }
    int64_t n = x[ax], step = steps.empty() ? 1 : steps[i], s = starts[i];
    if (step == 0) return MakeError(ErrorCode::kKernelFailed, "Slice step is 0");
    if (s < 0) s += n;
    s = step > 0 ? std::clamp<int64_t>(s, 0, n) : std::clamp<int64_t>(s, 0, n - 1);
    if (y[ax] > 0 && (s + (y[ax] - 1) * step < 0 || s + (y[ax] - 1) * step >= n)) {
      return MakeError(ErrorCode::kKernelFailed, "Slice output dims disagree with its inputs");
    }
    offset += s * xs[ax];
    strides[ax] = xs[ax] * step;
  }
  return CoalesceOne(y, strides, offset);
}

CudaOpProvider::CudaOpProvider(CudaOpDef def) : def_(std::move(def)) {
  id_ = "cuda." + KebabCase(def_.op_type);
  if (!def_.variant.empty()) id_ += "." + def_.variant;
}

std::vector<TacticConfig> CudaOpProvider::Tactics(const KernelRequest& request) const {
  if (!request.node || (request.inputs.empty() && def_.name_operand >= 0)) return {};
  // The storage-only types (float8, float4, int4, int2...) have no CUDA kernels yet: the CPU
  // backend runs them.
  if (HasStorageOnlyOperand(request)) return {};
  if (def_.accepts && !def_.accepts(request)) return {};
  DataType t = def_.name_operand < 0 ? OutType(request, 0) : InType(request, def_.name_operand);
  return {{TacticName(t, def_.op_type, def_.variant), {}, 0}};
}

StatusOr<std::unique_ptr<Kernel>> CudaOpProvider::Create(const KernelRequest& request,
                                                         const TacticConfig&) const {
  if (HasStorageOnlyOperand(request) || (def_.accepts && !def_.accepts(request))) {
    return MakeError(ErrorCode::kUnimplemented, "node '{}': {} has no CUDA kernel for this case",
                     request.node ? request.node->name() : "", id_);
  }
  return def_.create(request);
}

}  // namespace kiln::cuda
