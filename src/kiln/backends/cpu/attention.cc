// Attention on the CPU (reference): per (batch, query row) scores = scale * q K^T, mask, softmax
// in FP32 with max subtraction, then the weighted sum of V rows. The scores live in the
// workspace, sized in Prepare, so Run never allocates.
#include <cmath>
#include <limits>

#include "kiln/backends/cpu/cpu_kernel.h"

namespace kiln::cpu {
namespace {

enum class MaskKind { kNone, kAdditive, kBoolean, kCausal };

struct AttentionShape {
  DimVec batch;  // output batch dims (inline: built in Run without allocating)
  int64_t batch_n = 1, sq = 0, sk = 0, d = 0, dv = 0;
};

AttentionShape ShapeOf(std::span<const TensorView> in, std::span<const TensorView> out) {
  AttentionShape s;
  const auto& y = out[0].dims;
  s.batch = DimVec(y.begin(), y.end() - 2);
  for (int64_t b : s.batch) s.batch_n *= b;
  size_t r = in[0].dims.size();
  s.sq = in[0].dims[r - 2];
  s.d = in[0].dims[r - 1];
  s.sk = in[1].dims[r - 2];
  s.dv = in[2].dims[r - 1];
  return s;
}

class AttentionKernel final : public Kernel {
 public:
  AttentionKernel(float scale, bool default_scale, MaskKind kind, float fill)
      : scale_(scale), default_scale_(default_scale), kind_(kind), fill_(fill) {}

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    AttentionShape s = ShapeOf(inputs, outputs);
    return static_cast<size_t>(s.batch_n * s.sq * s.sk) * sizeof(float);
  }

  Status Run(const KernelRunArgs& a) override {
    AttentionShape s = ShapeOf(a.inputs, a.outputs);
    if (a.workspace_bytes < static_cast<size_t>(s.batch_n * s.sq * s.sk) * sizeof(float)) {
      return MakeError(ErrorCode::kInternal, "attention: workspace of {} bytes is too small",
                       a.workspace_bytes);
    }
    const float* q = a.inputs[0].as<const float>();
    const float* k = a.inputs[1].as<const float>();
    const float* v = a.inputs[2].as<const float>();
    float* y = a.outputs[0].as<float>();
    float* scores = static_cast<float*>(a.workspace);
    size_t r = a.inputs[0].dims.size();
    auto batch_dims = [&](const TensorView& t) { return t.dims.first(r - 2); };
    BroadcastIndexer qi(batch_dims(a.inputs[0]), s.batch), ki(batch_dims(a.inputs[1]), s.batch),
        vi(batch_dims(a.inputs[2]), s.batch);
    bool has_mask = kind_ == MaskKind::kAdditive || kind_ == MaskKind::kBoolean;
    DimVec score_dims = s.batch;
    score_dims.push_back(s.sq);
    score_dims.push_back(s.sk);
    BroadcastIndexer mi(has_mask ? a.inputs[3].dims : std::span<const int64_t>(score_dims),
                        score_dims);
    float scale = default_scale_ ? 1.f / std::sqrt(static_cast<float>(s.d)) : scale_;
    int64_t rows = s.batch_n * s.sq;
    ThreadPool::Default().ParallelFor(
        rows,
        [&](int64_t begin, int64_t end) {
          for (int64_t row = begin; row < end; ++row) {
            int64_t b = row / s.sq, i = row % s.sq;
            const float* qr = q + (qi(b) * s.sq + i) * s.d;
            const float* kb = k + ki(b) * s.sk * s.d;
            const float* vb = v + vi(b) * s.sk * s.dv;
            float* sc = scores + row * s.sk;
            float mx = -std::numeric_limits<float>::infinity();
            for (int64_t j = 0; j < s.sk; ++j) {
              float acc = 0.f;
              for (int64_t t = 0; t < s.d; ++t) acc += qr[t] * kb[j * s.d + t];
              float x = acc * scale;
              int64_t mask_index = row * s.sk + j;
              switch (kind_) {
                case MaskKind::kAdditive:
                  x += a.inputs[3].as<const float>()[mi(mask_index)];
                  break;
                case MaskKind::kBoolean:
                  if (!a.inputs[3].as<const bool>()[mi(mask_index)]) x = fill_;
                  break;
                case MaskKind::kCausal:
                  if (j > i + (s.sk - s.sq)) x = -std::numeric_limits<float>::infinity();
                  break;
                case MaskKind::kNone:
                  break;
              }
              sc[j] = x;
              mx = std::max(mx, x);
            }
            float sum = 0.f;
            for (int64_t j = 0; j < s.sk; ++j) {
              sc[j] = std::exp(sc[j] - mx);
              sum += sc[j];
            }
            float inv = 1.f / sum;
            float* yr = y + row * s.dv;
            for (int64_t t = 0; t < s.dv; ++t) yr[t] = 0.f;
            for (int64_t j = 0; j < s.sk; ++j) {
              float p = sc[j] * inv;
              const float* vr = vb + j * s.dv;
              for (int64_t t = 0; t < s.dv; ++t) yr[t] += p * vr[t];
            }
          }
        },
        4);
    return OkStatus();
  }

 private:
  float scale_;
  bool default_scale_;
  MaskKind kind_;
  float fill_;
};

class AttentionProvider final : public CpuFloatProvider {
 public:
  std::string_view id() const override { return "cpu.attention"; }
  std::string_view op_type() const override { return "Attention"; }

 protected:
  std::vector<TacticConfig> F32Tactics(const KernelRequest&) const override {
    return {{"f32-attention-cpu-rowwise", {}, 0}};
  }
  StatusOr<std::unique_ptr<Kernel>> CreateF32(const KernelRequest& request,
                                              const TacticConfig&) const override {
    const AttributeMap& attrs = request.node->attrs();
    std::string kind = attrs.GetString("mask_kind", "none");
    MaskKind k = kind == "additive"  ? MaskKind::kAdditive
                 : kind == "boolean" ? MaskKind::kBoolean
                 : kind == "causal"  ? MaskKind::kCausal
                                     : MaskKind::kNone;
    return std::unique_ptr<Kernel>(std::make_unique<AttentionKernel>(
        attrs.GetFloat("scale", 1.f), !attrs.Has("scale"), k,
        attrs.GetFloat("mask_fill", -std::numeric_limits<float>::infinity())));
  }
};
KILN_REGISTER_KERNEL_PROVIDER(AttentionProvider);

}  // namespace
}  // namespace kiln::cpu
