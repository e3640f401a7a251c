// Provider-from-functions, tactic naming and the broadcast plan shared by the CPU op families.
#include "kiln/backends/cpu/op_util.h"

#include <cctype>

namespace kiln::cpu {

std::string KebabCase(std::string_view op) {
  std::string out;
  for (size_t i = 0; i < op.size(); ++i) {
    char c = op[i];
    bool upper = std::isupper(static_cast<unsigned char>(c));
    // A new word starts at an upper-case letter after a lower-case one ("LeakyRelu"), or before
    // a lower-case one inside an acronym ("IsNaN" stays "is-nan").
    if (upper && i > 0 && std::islower(static_cast<unsigned char>(op[i - 1]))) out += '-';
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

std::string TacticName(DataType dtype, std::string_view op, std::string_view variant) {
  std::string name = fmt::format("{}-{}-cpu", ToString(dtype), KebabCase(op));
  if (!variant.empty()) name += fmt::format("-{}", variant);
  return name;
}

namespace {
DataType NameType(const OpKernelDef& def, const KernelRequest& r) {
  return def.name_operand < 0 ? OutType(r, 0) : InType(r, def.name_operand);
}

std::string ProviderId(const OpKernelDef& def) {
  std::string id = "cpu." + KebabCase(def.op_type);
  if (!def.variant.empty()) id += "." + def.variant;
  return id;
}

class FloatFnProvider final : public CpuFloatProvider {
 public:
  explicit FloatFnProvider(OpKernelDef def) : def_(std::move(def)), id_(ProviderId(def_)) {}
  std::string_view id() const override { return id_; }
  std::string_view op_type() const override { return def_.op_type; }

 protected:
  std::vector<TacticConfig> F32Tactics(const KernelRequest& r) const override {
    return {{TacticName(NameType(def_, r), def_.op_type, def_.variant), {}, 0}};
  }
  StatusOr<std::unique_ptr<Kernel>> CreateF32(const KernelRequest& r,
                                              const TacticConfig&) const override {
    return def_.create(r);
  }
  bool AcceptsTypes(const KernelRequest& r) const override { return def_.accepts(r); }

 private:
  OpKernelDef def_;
  std::string id_;
};

class AnyFnProvider final : public KernelProvider {
 public:
  explicit AnyFnProvider(OpKernelDef def) : def_(std::move(def)), id_(ProviderId(def_)) {}
  std::string_view id() const override { return id_; }
  std::string_view op_type() const override { return def_.op_type; }
  BackendKind backend() const override { return BackendKind::kCpu; }
  std::vector<TacticConfig> Tactics(const KernelRequest& r) const override {
    if (!def_.accepts(r)) return {};
    return {{TacticName(NameType(def_, r), def_.op_type, def_.variant), {}, 0}};
  }
  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& r,
                                           const TacticConfig&) const override {
    if (!def_.accepts(r)) {
      return MakeError(ErrorCode::kNoTactic, "{} cannot run these operand types", id_);
    }
    return def_.create(r);
  }

 private:
  OpKernelDef def_;
  std::string id_;
};
}  // namespace

void RegisterOpKernel(OpKernelDef def) {
  if (def.float_wrap) {
    KernelRegistry::Get().Register(std::make_unique<FloatFnProvider>(std::move(def)));
  } else {
    KernelRegistry::Get().Register(std::make_unique<AnyFnProvider>(std::move(def)));
  }
}

std::unique_ptr<Kernel> MakeKernel(LambdaKernel::RunFn run) {
  return std::make_unique<LambdaKernel>(std::move(run));
}

std::vector<int64_t> ReadInts(const TensorView& v) {
  std::vector<int64_t> out(static_cast<size_t>(v.num_elements()));
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = v.dtype == DataType::kInt64 ? v.as<const int64_t>()[i]
                                         : static_cast<int64_t>(LoadAsDouble(v, i));
  }
  return out;
}

std::vector<int64_t> Strides(std::span<const int64_t> dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) s[i - 1] = s[i] * dims[i];
  return s;
}

BroadcastPlan::BroadcastPlan(std::span<const TensorView> inputs,
                             std::span<const int64_t> out_dims) {
  size_t rank = out_dims.size();
  // Per input and output axis: 1 = complete, 0 = broadcast, -1 = either (output dim 1).
  std::vector<std::vector<int>> kind(inputs.size(), std::vector<int>(rank));
  for (size_t i = 0; i < inputs.size(); ++i) {
    size_t r = inputs[i].dims.size();
    for (size_t a = 0; a < rank; ++a) {
      int64_t d = a + r < rank ? 1 : inputs[i].dims[a + r - rank];
      kind[i][a] = out_dims[a] == 1 ? -1 : (d == out_dims[a] ? 1 : 0);
    }
  }
  // Longest suffix where each input keeps one kind.
  size_t start = rank;
  std::vector<int> seen(inputs.size(), -1);
  while (start > 0) {
    bool ok = true;
    for (size_t i = 0; i < inputs.size(); ++i) {
      int k = kind[i][start - 1];
      if (k >= 0 && seen[i] >= 0 && k != seen[i]) ok = false;
    }
    if (!ok) break;
    --start;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (kind[i][start] >= 0) seen[i] = kind[i][start];
    }
  }
  inner = 1;
  for (size_t a = start; a < rank; ++a) inner *= out_dims[a];
  int64_t total = 1;
  for (int64_t d : out_dims) total *= d;
  rows = inner == 0 ? 0 : total / inner;
  for (size_t i = 0; i < inputs.size(); ++i) {
    indexers.emplace_back(inputs[i].dims, out_dims);
    inner_stride.push_back(seen[i] == 0 ? 0 : 1);
  }
}

void MapCopy(const void* src, std::span<const int64_t> in_dims, void* dst,
             std::span<const int64_t> out_dims, const std::vector<std::vector<int64_t>>& maps,
             size_t es, const void* fill) {
  size_t rank = out_dims.size();
  int64_t total = 1;
  for (int64_t d : out_dims) total *= d;
  if (total == 0) return;
  auto* s = static_cast<const std::byte*>(src);
  auto* d = static_cast<std::byte*>(dst);
  std::vector<std::byte> zero(es);
  const auto* fill_bytes = fill ? static_cast<const std::byte*>(fill) : zero.data();
  if (rank == 0) {
    std::memcpy(d, s, es);
    return;
  }
  std::vector<int64_t> in_strides = Strides(in_dims);
  int64_t inner = out_dims[rank - 1];
  const std::vector<int64_t>& last = maps[rank - 1];
  // Maximal runs of the last axis that read consecutive input elements.
  struct Run {
    int64_t out_begin, len, in_begin;  // in_begin -1: fill
  };
  std::vector<Run> runs;
  for (int64_t o = 0; o < inner; ++o) {
    int64_t m = last[o];
    if (!runs.empty()) {
      Run& r = runs.back();
      bool extends =
          (m < 0 && r.in_begin < 0) || (m >= 0 && r.in_begin >= 0 && m == r.in_begin + r.len);
      if (extends) {
        ++r.len;
        continue;
      }
    }
    runs.push_back({o, 1, m < 0 ? -1 : m});
  }
  int64_t rows = total / inner;
  ParallelRows(rows, inner, [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> coord(rank, 0);
    int64_t rem = r0;
    for (size_t a = rank - 1; a-- > 0;) {
      coord[a] = rem % out_dims[a];
      rem /= out_dims[a];
    }
    for (int64_t r = r0; r < r1; ++r) {
      int64_t off = 0;
      bool filled = false;
      for (size_t a = 0; a + 1 < rank; ++a) {
        int64_t m = maps[a][coord[a]];
        if (m < 0) filled = true;
        off += m * in_strides[a];
      }
      std::byte* row = d + r * inner * static_cast<int64_t>(es);
      for (const Run& run : runs) {
        std::byte* out = row + run.out_begin * static_cast<int64_t>(es);
        if (filled || run.in_begin < 0) {
          for (int64_t j = 0; j < run.len; ++j) std::memcpy(out + j * es, fill_bytes, es);
        } else {
          std::memcpy(out, s + (off + run.in_begin) * static_cast<int64_t>(es),
                      static_cast<size_t>(run.len) * es);
        }
      }
      for (size_t a = rank - 1; a-- > 0;) {
        if (++coord[a] < out_dims[a]) break;
        coord[a] = 0;
      }
    }
  });
}

void ParallelRows(int64_t n, int64_t cost_per_item,
                  const std::function<void(int64_t, int64_t)>& fn) {
  constexpr int64_t kGrain = 1 << 15;  // elements worth one task
  int64_t min_chunk = std::max<int64_t>(1, kGrain / std::max<int64_t>(1, cost_per_item));
  ThreadPool::Default().ParallelFor(n, fn, min_chunk);
}

}  // namespace kiln::cpu
