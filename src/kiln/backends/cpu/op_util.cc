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
    if (!Accepts(r)) return {};
    return {{TacticName(NameType(def_, r), def_.op_type, def_.variant), {}, 0}};
  }
  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& r,
                                           const TacticConfig&) const override {
    if (!Accepts(r)) {
      return MakeError(ErrorCode::kNoTactic, "{} cannot run these operand types", id_);
    }
    return def_.create(r);
  }

 private:
  bool Accepts(const KernelRequest& r) const {
    return (def_.storage_types || !HasStorageOnlyOperand(r)) && def_.accepts(r);
  }
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

std::unique_ptr<Kernel> MakeKernel(FnKernel::RunFn run) {
  return std::make_unique<FnKernel>(std::move(run));
}

DimVec ReadInts(const TensorView& v) {
  DimVec out(static_cast<size_t>(v.num_elements()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = ReadInt(v, static_cast<int64_t>(i));
  return out;
}

DimVec Strides(std::span<const int64_t> dims) {
  DimVec s(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) s[i - 1] = s[i] * dims[i];
  return s;
}

BroadcastPlan::BroadcastPlan(std::span<const TensorView> inputs,
                             std::span<const int64_t> out_dims) {
  size_t rank = out_dims.size();
  // Per input and output axis: 1 = complete, 0 = broadcast, -1 = either (output dim 1).
  auto kind = [&](size_t i, size_t a) {
    size_t r = inputs[i].dims.size();
    int64_t d = a + r < rank ? 1 : inputs[i].dims[a + r - rank];
    return out_dims[a] == 1 ? -1 : (d == out_dims[a] ? 1 : 0);
  };
  // Longest suffix where each input keeps one kind.
  size_t start = rank;
  SmallVec<int, 4> seen(inputs.size(), -1);
  while (start > 0) {
    bool ok = true;
    for (size_t i = 0; i < inputs.size(); ++i) {
      int k = kind(i, start - 1);
      if (k >= 0 && seen[i] >= 0 && k != seen[i]) ok = false;
    }
    if (!ok) break;
    --start;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (kind(i, start) >= 0) seen[i] = kind(i, start);
    }
  }
  inner = 1;
  for (size_t a = start; a < rank; ++a) inner *= out_dims[a];
  int64_t total = 1;
  for (int64_t d : out_dims) total *= d;
  rows = inner == 0 ? 0 : total / inner;
  for (size_t i = 0; i < inputs.size(); ++i) {
    indexers.push_back(BroadcastIndexer(inputs[i].dims, out_dims));
    inner_stride.push_back(seen[i] == 0 ? 0 : 1);
  }
}

}  // namespace kiln::cpu
