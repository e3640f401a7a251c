// Attention on the CPU: per (batch, block of query rows) scores = scale * Q K^T (sgemm), mask,
// softmax in FP32 with max subtraction, then P V (sgemm). The scores live in the workspace,
// sized in Prepare, so Run never allocates.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/backends/cpu/cpu_kernel.h"
#include "kiln/backends/cpu/sgemm.h"
#include "kiln/backends/cpu/vec_math.h"

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

// Query rows per task: enough for an efficient sgemm, few enough that one (batch, head) with a
// long sequence still spreads over the threads.
constexpr int64_t kRowBlock = 64;

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
    // Along a score row (key index j) the mask either runs contiguously or is broadcast.
    const int64_t mask_step =
        has_mask && !a.inputs[3].dims.empty() && a.inputs[3].dims.back() == s.sk ? 1 : 0;
    float scale = default_scale_ ? 1.f / std::sqrt(static_cast<float>(s.d)) : scale_;
    // One task: a block of query rows of one (batch, head). The two products are single-threaded
    // sgemm calls (OpenBLAS's kernels; the row-by-row dot products they replace ran scalar and
    // made the fused layer slower than the unfused MatMul-Softmax-MatMul it came from).
    const int64_t row_blocks = (s.sq + kRowBlock - 1) / kRowBlock;
    ThreadPool::Default().ParallelFor(s.batch_n * row_blocks, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t b = t / row_blocks;
        const int64_t i0 = (t % row_blocks) * kRowBlock;
        const int64_t rows = std::min(kRowBlock, s.sq - i0);
        const float* qb = q + (qi(b) * s.sq + i0) * s.d;
        const float* kb = k + ki(b) * s.sk * s.d;
        const float* vb = v + vi(b) * s.sk * s.dv;
        float* sc = scores + (b * s.sq + i0) * s.sk;
        Sgemm(GemmImpl::kOpenBlas, false, true, rows, s.sk, s.d, scale, qb, s.d, kb, s.d, 0.f, sc,
              s.sk, nullptr);
        for (int64_t ii = 0; ii < rows; ++ii) {
          const int64_t i = i0 + ii;
          float* row = sc + ii * s.sk;
          const int64_t m0 = has_mask ? mi((b * s.sq + i) * s.sk) : 0;
          switch (kind_) {
            case MaskKind::kAdditive: {
              const float* m = a.inputs[3].as<const float>() + m0;
              for (int64_t j = 0; j < s.sk; ++j) row[j] += m[j * mask_step];
              break;
            }
            case MaskKind::kBoolean: {
              const bool* m = a.inputs[3].as<const bool>() + m0;
              for (int64_t j = 0; j < s.sk; ++j) row[j] = m[j * mask_step] ? row[j] : fill_;
              break;
            }
            case MaskKind::kCausal:
              for (int64_t j = std::max<int64_t>(0, i + (s.sk - s.sq) + 1); j < s.sk; ++j) {
                row[j] = -std::numeric_limits<float>::infinity();
              }
              break;
            case MaskKind::kNone:
              break;
          }
          SoftmaxRowInPlace(row, s.sk);
        }
        Sgemm(GemmImpl::kOpenBlas, false, false, rows, s.dv, s.sk, 1.f, sc, s.sk, vb, s.dv, 0.f,
              y + (b * s.sq + i0) * s.dv, s.dv, nullptr);
      }
    });
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
    return {{"f32-attention-cpu-sgemm-rows64", {}, 0}};
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
