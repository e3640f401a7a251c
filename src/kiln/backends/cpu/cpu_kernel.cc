// CpuFloatProvider's f16/bf16 wrapping and small shared helpers.
#include "kiln/backends/cpu/cpu_kernel.h"

#include <cstring>

namespace kiln::cpu {

namespace {
bool IsHalfLike(DataType t) { return t == DataType::kFloat16 || t == DataType::kBFloat16; }

void ConvertToF32(const TensorView& src, float* dst) {
  int64_t n = src.num_elements();
  if (src.dtype == DataType::kFloat16) {
    auto* s = static_cast<const uint16_t*>(src.data);
    for (int64_t i = 0; i < n; ++i) dst[i] = HalfBitsToFloat(s[i]);
  } else {
    auto* s = static_cast<const uint16_t*>(src.data);
    for (int64_t i = 0; i < n; ++i) dst[i] = BFloat16BitsToFloat(s[i]);
  }
}

void ConvertFromF32(const float* src, const TensorView& dst) {
  int64_t n = dst.num_elements();
  auto* d = static_cast<uint16_t*>(dst.data);
  if (dst.dtype == DataType::kFloat16) {
    for (int64_t i = 0; i < n; ++i) d[i] = FloatToHalfBits(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) d[i] = FloatToBFloat16Bits(src[i]);
  }
}

size_t Align64(size_t n) { return (n + 63) / 64 * 64; }

// Runs an f32 kernel on f16/bf16 operands: converts inputs into the workspace, runs, converts
// outputs back. Workspace layout: [converted inputs][f32 outputs][inner workspace].
class HalfWrapperKernel final : public Kernel {
 public:
  HalfWrapperKernel(std::unique_ptr<Kernel> inner, std::vector<std::unique_ptr<Tensor>> keep)
      : inner_(std::move(inner)), keep_(std::move(keep)) {}

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    in_views_.assign(inputs.begin(), inputs.end());
    out_views_.assign(outputs.begin(), outputs.end());
    const size_t bytes = ToF32Views(in_views_, out_views_);
    KILN_ASSIGN_OR_RETURN(size_t inner, inner_->Prepare(in_views_, out_views_));
    return bytes + inner;
  }

  StatusOr<size_t> QueryWorkspace(std::span<const TensorView> inputs,
                                  std::span<const TensorView> outputs) override {
    std::vector<TensorView> ins(inputs.begin(), inputs.end()), outs(outputs.begin(), outputs.end());
    const size_t bytes = ToF32Views(ins, outs);
    KILN_ASSIGN_OR_RETURN(size_t inner, inner_->QueryWorkspace(ins, outs));
    return bytes + inner;
  }

  Status Run(const KernelRunArgs& args) override {
    auto* ws = static_cast<std::byte*>(args.workspace);
    size_t offset = 0;
    // Views are rebuilt from args each run (dims and pointers may change between runs).
    for (size_t i = 0; i < args.inputs.size(); ++i) {
      in_views_[i] = args.inputs[i];
      if (args.inputs[i].data && IsHalfLike(args.inputs[i].dtype)) {
        auto* f = reinterpret_cast<float*>(ws + offset);
        ConvertToF32(args.inputs[i], f);
        in_views_[i].dtype = DataType::kFloat32;
        in_views_[i].data = f;
        offset += Align64(static_cast<size_t>(args.inputs[i].num_elements()) * 4);
      }
    }
    for (size_t i = 0; i < args.outputs.size(); ++i) {
      out_views_[i] = args.outputs[i];
      if (IsHalfLike(args.outputs[i].dtype)) {
        out_views_[i].dtype = DataType::kFloat32;
        out_views_[i].data = ws + offset;
        offset += Align64(static_cast<size_t>(args.outputs[i].num_elements()) * 4);
      }
    }
    KernelRunArgs inner = args;
    inner.inputs = in_views_;
    inner.outputs = out_views_;
    inner.workspace = ws + offset;
    inner.workspace_bytes = args.workspace_bytes - offset;
    KILN_RETURN_IF_ERROR(inner_->Run(inner));
    for (size_t i = 0; i < args.outputs.size(); ++i) {
      if (IsHalfLike(args.outputs[i].dtype)) {
        ConvertFromF32(static_cast<const float*>(out_views_[i].data), args.outputs[i]);
      }
    }
    return OkStatus();
  }

 private:
  // Retypes the f16/bf16 views as f32; returns the workspace bytes their f32 copies take.
  static size_t ToF32Views(std::vector<TensorView>& ins, std::vector<TensorView>& outs) {
    size_t bytes = 0;
    for (auto& v : ins) {
      if (v.data && IsHalfLike(v.dtype)) {
        bytes += Align64(static_cast<size_t>(v.num_elements()) * 4);
        v.dtype = DataType::kFloat32;
      }
    }
    for (auto& v : outs) {
      if (IsHalfLike(v.dtype)) {
        bytes += Align64(static_cast<size_t>(v.num_elements()) * 4);
        v.dtype = DataType::kFloat32;
      }
    }
    return bytes;
  }

  std::unique_ptr<Kernel> inner_;
  std::vector<std::unique_ptr<Tensor>> keep_;
  std::vector<TensorView> in_views_, out_views_;
};
}  // namespace

F32Request ToF32Request(const KernelRequest& request) {
  F32Request out;
  out.request = request;
  auto fix = [&](OperandDesc& d) {
    if (!IsHalfLike(d.dtype)) return;
    out.storage = d.dtype;
    d.dtype = DataType::kFloat32;
    if (d.constant) {
      out.converted.push_back(std::make_unique<Tensor>(d.constant->CastTo(DataType::kFloat32)));
      d.constant = out.converted.back().get();
    }
  };
  for (auto& d : out.request.inputs) fix(d);
  for (auto& d : out.request.outputs) fix(d);
  return out;
}

bool CpuFloatProvider::AcceptsTypes(const KernelRequest& r) const {
  for (const auto& d : r.inputs) {
    if (IsFloat(d.dtype) && d.dtype != DataType::kFloat32) return false;
  }
  for (const auto& d : r.outputs) {
    if (d.dtype != DataType::kFloat32) return false;
  }
  return true;
}

std::vector<TacticConfig> CpuFloatProvider::Tactics(const KernelRequest& request) const {
  if (HasStorageOnlyOperand(request)) return {};
  F32Request f32 = ToF32Request(request);
  if (!AcceptsTypes(f32.request)) return {};
  std::vector<TacticConfig> tactics = F32Tactics(f32.request);
  if (f32.storage != DataType::kFloat32) {
    // The wrapper's f32 copies of every f16/bf16 operand come on top of the inner workspace.
    size_t conversion = 0;
    auto add = [&](const OperandDesc& d) {
      if (!IsHalfLike(d.dtype)) return;
      std::vector<int64_t> dims = d.max_dims;
      if (dims.empty()) {
        if (auto s = StaticDims(d.shape)) dims = *s;
      }
      int64_t n = 1;
      for (int64_t x : dims) n *= x;
      conversion += Align64(static_cast<size_t>(n) * 4);
    };
    for (const auto& d : request.inputs) add(d);
    for (const auto& d : request.outputs) add(d);
    std::string prefix(ToString(f32.storage));
    for (auto& t : tactics) {
      if (t.name.starts_with("f32-")) t.name = prefix + t.name.substr(3);
      t.workspace_bytes += conversion;
    }
  }
  return tactics;
}

StatusOr<std::unique_ptr<Kernel>> CpuFloatProvider::Create(const KernelRequest& request,
                                                           const TacticConfig& tactic) const {
  F32Request f32 = ToF32Request(request);
  if (HasStorageOnlyOperand(request) || !AcceptsTypes(f32.request)) {
    return MakeError(ErrorCode::kNoTactic, "{} cannot run these operand types", id());
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Kernel> inner, CreateF32(f32.request, tactic));
  if (f32.storage == DataType::kFloat32) return inner;
  return std::unique_ptr<Kernel>(
      std::make_unique<HalfWrapperKernel>(std::move(inner), std::move(f32.converted)));
}

BroadcastIndexer::BroadcastIndexer(std::span<const int64_t> in_dims,
                                   std::span<const int64_t> out_dims) {
  int64_t in_n = 1;
  for (int64_t d : in_dims) in_n *= d;
  scalar = in_n == 1;
  identity = std::equal(in_dims.begin(), in_dims.end(), out_dims.begin(), out_dims.end());
  size_t rank = out_dims.size();
  out_strides.assign(rank, 1);
  in_strides.assign(rank, 0);
  for (size_t i = rank; i-- > 1;) out_strides[i - 1] = out_strides[i] * out_dims[i];
  int64_t stride = 1;
  for (size_t k = 0; k < in_dims.size(); ++k) {
    size_t in_axis = in_dims.size() - 1 - k;
    size_t out_axis = rank - 1 - k;
    in_strides[out_axis] = in_dims[in_axis] == 1 ? 0 : stride;
    stride *= in_dims[in_axis];
  }
}

int64_t BroadcastIndexer::operator()(int64_t out_index) const {
  if (identity) return out_index;
  if (scalar) return 0;
  int64_t in = 0;
  for (size_t a = 0; a < out_strides.size(); ++a) {
    int64_t coord = out_index / out_strides[a];
    out_index -= coord * out_strides[a];
    in += coord * in_strides[a];
  }
  return in;
}

}  // namespace kiln::cpu
