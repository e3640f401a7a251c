// Attention on the CPU: per (batch, block of query rows) scores = scale * Q K^T (sgemm), mask,
// softmax in FP32 with max subtraction, then P V (sgemm). The scores live in the workspace,
// sized in Prepare, so Run never allocates. Any head layout (bhsd, bshd, bsd, qkv_packed) is a
// matter of strides: the sgemm calls take each operand's row stride as its leading dimension.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/backends/cpu/cpu_kernel.h"
#include "kiln/backends/cpu/sgemm.h"
#include "kiln/backends/cpu/vec_math.h"
#include "kiln/ops/fused.h"

namespace kiln::cpu {
namespace {

// One operand as a batch of matrices: batch dims, element strides per batch dim, rows (the
// sequence), cols (the head size) and the stride between rows. Inline storage: built in Run.
struct OperandView {
  DimVec batch, stride;
  int64_t rows = 0, cols = 0, row_stride = 0;
};

// parts = 3: the operand is Q, K and V side by side ([B, S, 3*H*D], attribute qkv_packed); the
// view is one third of each row (the caller offsets K and V by a third and two thirds).
OperandView ViewOf(std::span<const int64_t> x, AttentionLayout layout, int64_t heads,
                   int64_t parts = 1) {
  OperandView v;
  if (layout == AttentionLayout::kBhsd) {
    size_t r = x.size();
    v.rows = x[r - 2];
    v.cols = x[r - 1];
    v.row_stride = v.cols;
    v.batch = DimVec(x.begin(), x.end() - 2);
    v.stride = DimVec(x.begin(), x.end() - 2);
    int64_t st = v.rows * v.cols;
    for (size_t i = r - 2; i-- > 0;) {
      v.stride[i] = st;
      st *= x[i];
    }
    return v;
  }
  if (layout == AttentionLayout::kBshd) {  // [B, S, heads..., D]: batch dims B and the heads
    const size_t r = x.size();
    v.rows = x[1];
    v.cols = x[r - 1];
    v.row_stride = 1;
    for (size_t i = 2; i < r; ++i) v.row_stride *= x[i];
    v.batch.push_back(x[0]);
    v.stride.push_back(x[1] * v.row_stride);
    int64_t st = v.row_stride;
    for (size_t i = 2; i + 1 < r; ++i) {
      st /= x[i];
      v.batch.push_back(x[i]);
      v.stride.push_back(st);
    }
    return v;
  }
  const bool seq_first = layout == AttentionLayout::kSbd;
  int64_t h = heads;
  int64_t e = x[2];
  v.cols = e / parts / h;
  v.batch.push_back(seq_first ? x[1] : x[0]);
  v.batch.push_back(h);
  if (seq_first) {  // [S, B, E]: row s of batch b at (s * B + b) * E
    v.rows = x[0];
    v.row_stride = x[1] * e;
    v.stride.push_back(e);
  } else {
    v.rows = x[1];
    v.row_stride = e;
    v.stride.push_back(x[1] * e);
  }
  v.stride.push_back(v.cols);
  return v;
}

// Element offset of output batch b (row-major over `out` batch dims) in operand `v`
// (numpy broadcasting: a size-1 batch dim does not advance).
int64_t BatchOffset(const OperandView& v, const DimVec& out, int64_t b) {
  int64_t off = 0;
  for (size_t i = out.size(); i-- > 0;) {
    int64_t c = b % out[i];
    b /= out[i];
    if (v.batch[i] != 1) off += c * v.stride[i];
  }
  return off;
}

// Query rows per task: enough for an efficient sgemm, few enough that one (batch, head) with a
// long sequence still spreads over the threads.
constexpr int64_t kRowBlock = 64;

class AttentionKernel final : public Kernel {
 public:
  explicit AttentionKernel(const AttentionAttrs& at) : at_(at) {}

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    const bool rows3 = at_.layout == AttentionLayout::kBsd || at_.layout == AttentionLayout::kSbd;
    // bshd: [B, S, H, D], or [B, S, G, R, D] (grouped-query attention).
    const size_t need_rank = rows3 ? 3 : inputs[0].dims.size() == 5 ? 5 : 4;
    for (const TensorView* t : {&inputs[0], &inputs[1], &inputs[2], &outputs[0]}) {
      if ((at_.layout == AttentionLayout::kBhsd && t->dims.size() < 2) ||
          (at_.layout != AttentionLayout::kBhsd && t->dims.size() != need_rank) ||
          (rows3 && t->dims[2] % at_.heads != 0) ||
          (parts() == 3 && t != &outputs[0] && t->dims[2] % (3 * at_.heads) != 0)) {
        return MakeError(ErrorCode::kShapeMismatch,
                         "attention: operand dims do not fit the layout");
      }
    }
    OperandView y = ViewOf(outputs[0].dims, at_.layout, at_.heads);
    int64_t batch_n = 1;
    for (int64_t b : y.batch) batch_n *= b;
    OperandView k = ViewOf(inputs[1].dims, at_.layout, at_.heads, parts());
    return static_cast<size_t>(batch_n * y.rows * k.rows) * sizeof(float);
  }

  Status Run(const KernelRunArgs& a) override {
    OperandView qv = ViewOf(a.inputs[0].dims, at_.layout, at_.heads, parts());
    OperandView kv = ViewOf(a.inputs[1].dims, at_.layout, at_.heads, parts());
    OperandView vv = ViewOf(a.inputs[2].dims, at_.layout, at_.heads, parts());
    OperandView yv = ViewOf(a.outputs[0].dims, at_.layout, at_.heads);
    int64_t batch_n = 1;
    for (int64_t b : yv.batch) batch_n *= b;
    const int64_t sq = qv.rows, sk = kv.rows, d = qv.cols, dv = vv.cols;
    if (a.workspace_bytes < static_cast<size_t>(batch_n * sq * sk) * sizeof(float)) {
      return MakeError(ErrorCode::kInternal, "attention: workspace of {} bytes is too small",
                       a.workspace_bytes);
    }
    // Packed: K and V start a third and two thirds into each row (of 3*H*D elements; in layout
    // sbd the rows of one sequence position are B rows apart, so not the row stride).
    const int64_t k_off = parts() == 3 ? a.inputs[1].dims[2] / 3 : 0;
    const int64_t v_off = parts() == 3 ? 2 * (a.inputs[2].dims[2] / 3) : 0;
    const float* q = a.inputs[0].as<const float>();
    const float* k = a.inputs[1].as<const float>() + k_off;
    const float* v = a.inputs[2].as<const float>() + v_off;
    float* y = a.outputs[0].as<float>();
    float* scores = static_cast<float*>(a.workspace);
    DimVec score_dims = yv.batch;  // the logical scores [batch..., Sq, Sk]
    score_dims.push_back(sq);
    score_dims.push_back(sk);
    bool has_mask = at_.mask == AttentionMask::kAdditive || at_.mask == AttentionMask::kBoolean;
    BroadcastIndexer mi(has_mask ? a.inputs[3].dims : std::span<const int64_t>(score_dims),
                        score_dims);
    // Along a score row (key index j) the mask either runs contiguously or is broadcast.
    const int64_t mask_step =
        has_mask && !a.inputs[3].dims.empty() && a.inputs[3].dims.back() == sk ? 1 : 0;
    float scale = at_.default_scale ? 1.f / std::sqrt(static_cast<float>(d)) : at_.scale;
    // One task: a block of query rows of one (batch, head). The two products are single-threaded
    // sgemm calls (OpenBLAS's kernels; the row-by-row dot products they replace ran scalar and
    // made the fused layer slower than the unfused MatMul-Softmax-MatMul it came from).
    const int64_t row_blocks = (sq + kRowBlock - 1) / kRowBlock;
    ThreadPool::Default().ParallelFor(batch_n * row_blocks, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t b = t / row_blocks;
        const int64_t i0 = (t % row_blocks) * kRowBlock;
        const int64_t rows = std::min(kRowBlock, sq - i0);
        // Strided operands: each matrix's rows are row_stride apart (heads interleaved).
        const float* qb = q + BatchOffset(qv, yv.batch, b) + i0 * qv.row_stride;
        const float* kb = k + BatchOffset(kv, yv.batch, b);
        const float* vb = v + BatchOffset(vv, yv.batch, b);
        float* sc = scores + (b * sq + i0) * sk;
        Sgemm(GemmImpl::kOpenBlas, false, true, rows, sk, d, scale, qb, qv.row_stride, kb,
              kv.row_stride, 0.f, sc, sk, nullptr);
        for (int64_t ii = 0; ii < rows; ++ii) {
          const int64_t i = i0 + ii;
          float* row = sc + ii * sk;
          const int64_t m0 = has_mask ? mi((b * sq + i) * sk) : 0;
          switch (at_.mask) {
            case AttentionMask::kAdditive: {
              const float* m = a.inputs[3].as<const float>() + m0;
              for (int64_t j = 0; j < sk; ++j) row[j] += m[j * mask_step];
              break;
            }
            case AttentionMask::kBoolean: {
              const bool* m = a.inputs[3].as<const bool>() + m0;
              for (int64_t j = 0; j < sk; ++j) row[j] = m[j * mask_step] ? row[j] : at_.mask_fill;
              break;
            }
            case AttentionMask::kCausal:
              for (int64_t j = std::max<int64_t>(0, i + (sk - sq) + 1); j < sk; ++j) {
                row[j] = -std::numeric_limits<float>::infinity();
              }
              break;
            case AttentionMask::kNone:
              break;
          }
          // A row masked whole (every score -inf: an FP16 mask of the lowest float, a causal row
          // before a left-padded start) gives zeros, as the CUDA kernels do, not NaN.
          bool any = false;
          for (int64_t j = 0; j < sk && !any; ++j)
            any = row[j] != -std::numeric_limits<float>::infinity();
          if (any) {
            SoftmaxRowInPlace(row, sk);
          } else {
            std::fill(row, row + sk, 0.f);
          }
        }
        Sgemm(GemmImpl::kOpenBlas, false, false, rows, dv, sk, 1.f, sc, sk, vb, vv.row_stride, 0.f,
              y + BatchOffset(yv, yv.batch, b) + i0 * yv.row_stride, yv.row_stride, nullptr);
      }
    });
    return OkStatus();
  }

 private:
  // 3 when Q, K and V are packed side by side in each operand, else 1.
  int64_t parts() const { return at_.qkv_packed ? 3 : 1; }

  AttentionAttrs at_;
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
    KILN_ASSIGN_OR_RETURN(AttentionAttrs at, ReadAttentionAttrs(request.node->attrs()));
    return std::unique_ptr<Kernel>(std::make_unique<AttentionKernel>(at));
  }
};
KILN_REGISTER_KERNEL_PROVIDER(AttentionProvider);

}  // namespace
}  // namespace kiln::cpu
