// Host-side planning of the CUDA INT8 matrix product (int8_gemm_plan.h).
#include "kiln/backends/cuda/int8_gemm_plan.h"

#include "kiln/backends/int8_quant.h"

namespace kiln::cuda {

StatusOr<std::pair<int64_t, int64_t>> Int8RowsAndDepth(const GemmSpec& s,
                                                       std::span<const int64_t> a) {
  const bool gemm = s.kind == GemmKind::kGemm;
  if (a.empty() || (gemm && a.size() != 2) || (s.trans_a && a.size() != 2)) {
    return MakeError(ErrorCode::kShapeMismatch, "int8 {}: A has rank {}", gemm ? "Gemm" : "MatMul",
                     a.size());
  }
  if (s.trans_a) return std::pair{a[1], a[0]};
  int64_t m = 1;
  for (size_t i = 0; i + 1 < a.size(); ++i) m *= a[i];
  return std::pair{m, a.back()};
}

StatusOr<Int8Addend> ResolveInt8Addend(const GemmSpec& s, const std::vector<int64_t>* c, int64_t m,
                                       int64_t n) {
  Int8Addend a;
  const bool gemm = s.kind == GemmKind::kGemm;
  if (!c || (gemm && s.beta == 0.f)) return a;
  int64_t cm = c->size() == 2 ? (*c)[0] : 1, cn = c->empty() ? 1 : c->back();
  if (c->size() > 2 || (cm != 1 && cm != m) || (cn != 1 && cn != n) || (!gemm && cm != 1)) {
    return MakeError(ErrorCode::kShapeMismatch, "int8 {}: addend does not broadcast to [{}, {}]",
                     gemm ? "Gemm" : "MatMul", m, n);
  }
  a.present = true;
  a.factor = gemm ? s.beta : 1.f;
  a.row_stride = cm == 1 ? 0 : cn;
  a.col_stride = cn == 1 ? 0 : 1;
  return a;
}

Int8PackedB PackInt8B(const GemmSpec& s, const Tensor& b_any, float amax) {
  Int8PackedB p;
  const Tensor b = b_any.CastTo(DataType::kFloat32);
  const auto& d = b.dims();
  p.k = s.trans_b ? d[1] : d[0];
  p.n = s.trans_b ? d[0] : d[1];
  p.kp = Int8Padded(p.k);
  p.np = Int8Padded(p.n);
  // B's channels are its columns N: element (n, k) sits at k * N + n, or n * K + k when
  // transposed (as the CPU kernel quantizes them).
  const int64_t k = p.k, n = p.n;
  Int8Weights w = s.trans_b ? QuantizeWeightsPerChannel(b.data<float>(), n, k, k, 1)
                            : QuantizeWeightsPerChannel(b.data<float>(), n, k, 1, n);
  p.packed.assign(static_cast<size_t>(p.np * p.kp), 0);
  p.col_scale.assign(static_cast<size_t>(p.np), 0.f);
  const float a_scale = Int8ActivationScale(amax);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < k; ++i) {
      p.packed[j * p.kp + i] = w.q[s.trans_b ? j * k + i : i * n + j];
    }
    p.col_scale[j] = s.alpha * a_scale * w.scales[j];
  }
  return p;
}

}  // namespace kiln::cuda
