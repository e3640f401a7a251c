// Host-side planning of the CUDA INT8 and FP8 matrix products (quant_gemm_plan.h).
#include "kiln/backends/cuda/quant_gemm_plan.h"

#include <algorithm>
#include <cmath>

#include "kiln/backends/cuda/cuda_common.h"
#include "kiln/backends/fp8_quant.h"
#include "kiln/backends/int8_quant.h"

namespace kiln::cuda {

std::optional<std::pair<int64_t, int64_t>> QuantConstantB(const GemmSpec& s,
                                                          const KernelRequest& r) {
  if (r.inputs.size() < 2) return std::nullopt;
  const Tensor* b = r.inputs[1].constant;
  if (!b || !ToBlasType(b->dtype()) || b->dims().size() != 2) return std::nullopt;
  const auto& d = b->dims();
  return s.trans_b ? std::pair{d[1], d[0]} : std::pair{d[0], d[1]};
}

std::optional<QuantizedGemm> ResolveQuantizedGemm(const KernelRequest& r,
                                                  std::optional<float> amax) {
  QuantizedGemm p;
  if (!amax || r.inputs.size() < 2 || r.outputs.empty()) return std::nullopt;
  p.amax = *amax;
  auto spec = ReadGemmSpec(*r.node);
  if (!spec.ok() || spec->alpha == 0.f) return std::nullopt;
  p.spec = *spec;
  const DataType t = r.inputs[0].dtype;
  auto type = ToBlasType(t);
  if (!type || r.outputs[0].dtype != t) return std::nullopt;
  const bool has_c = r.inputs.size() > 2 && r.inputs[2].dtype != DataType::kUndefined;
  if (has_c && r.inputs[2].dtype != t) return std::nullopt;
  p.type = *type;
  auto kn = QuantConstantB(p.spec, r);
  if (!kn) return std::nullopt;
  std::tie(p.k, p.n) = *kn;
  std::vector<int64_t> a = LargestDims(r.inputs[0]);
  if (a.empty()) return std::nullopt;
  auto mk = QuantRowsAndDepth(p.spec, a);
  if (!mk.ok() || mk->second != p.k) return std::nullopt;
  p.m = mk->first;
  if (p.m <= 0 || p.k <= 0 || p.n <= 0) return std::nullopt;
  if (has_c) {
    std::vector<int64_t> c = LargestDims(r.inputs[2]);
    if (c.empty() && r.inputs[2].shape.size() != 0) return std::nullopt;
    auto addend = ResolveQuantAddend(p.spec, &c, p.m, p.n);
    if (!addend.ok()) return std::nullopt;
    p.addend = *addend;
  }
  return p;
}

std::optional<QuantizedGemm> ResolveQuantizedGemmOnEdges(const KernelRequest& r,
                                                         std::optional<float> amax, DataType edge) {
  const bool in_edge = !r.inputs.empty() && r.inputs[0].dtype == edge;
  const bool out_edge = !r.outputs.empty() && r.outputs[0].dtype == edge;
  if ((!in_edge && !out_edge) || r.inputs.size() < 2) return ResolveQuantizedGemm(r, amax);
  KernelRequest in_float = r;
  if (in_edge) in_float.inputs[0].dtype = r.inputs[1].dtype;
  if (out_edge) in_float.outputs[0].dtype = r.inputs[1].dtype;
  return ResolveQuantizedGemm(in_float, amax);
}

DataType EdgeProductFloatType(const KernelRequest& r, DataType edge) {
  if (r.inputs.empty() || r.inputs[0].dtype != edge) {
    return r.inputs.empty() ? DataType::kUndefined : r.inputs[0].dtype;
  }
  if (!r.outputs.empty() && r.outputs[0].dtype != edge) return r.outputs[0].dtype;
  return r.inputs.size() > 1 ? r.inputs[1].dtype : DataType::kUndefined;
}

StatusOr<std::pair<int64_t, int64_t>> QuantRowsAndDepth(const GemmSpec& s,
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

StatusOr<QuantAddend> ResolveQuantAddend(const GemmSpec& s, const std::vector<int64_t>* c,
                                         int64_t m, int64_t n) {
  QuantAddend a;
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
  p.kp = QuantPadded(p.k);
  p.np = QuantPadded(p.n);
  // B's channels are its columns N: element (n, k) sits at k * N + n, or n * K + k when
  // transposed (as the CPU kernel quantizes them).
  const int64_t k = p.k, n = p.n;
  Int8Weights w = s.trans_b ? QuantizeWeightsPerChannel(b.data<float>(), n, k, k, 1)
                            : QuantizeWeightsPerChannel(b.data<float>(), n, k, 1, n);
  return PackInt8B(s, k, n, w, Int8ActivationScale(amax));
}

Int8PackedB PackInt8B(const GemmSpec& s, int64_t k, int64_t n, const Int8Weights& w,
                      float a_scale) {
  Int8PackedB p;
  p.k = k;
  p.n = n;
  p.kp = QuantPadded(k);
  p.np = QuantPadded(n);
  p.packed.assign(static_cast<size_t>(p.np * p.kp), 0);
  p.col_scale.assign(static_cast<size_t>(p.np), 0.f);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < k; ++i) {
      p.packed[j * p.kp + i] = w.q[s.trans_b ? j * k + i : i * n + j];
    }
    p.col_scale[j] = s.alpha * a_scale * w.scales[j];
  }
  return p;
}

std::optional<Int8Activation> CudaInt8Activation(const Node& node) {
  std::optional<Int8Activation> a = Int8ActivationOf(node);
  if (a && a->from_model && a->zero_point != 0) return std::nullopt;
  return a;
}

Fp8PackedB PackFp8B(const GemmSpec& s, const Tensor& b_any) {
  Fp8PackedB p;
  const Tensor b = b_any.CastTo(DataType::kFloat32);
  const auto& d = b.dims();
  p.k = s.trans_b ? d[1] : d[0];
  p.n = s.trans_b ? d[0] : d[1];
  p.kp = QuantPadded(p.k);
  p.np = QuantPadded(p.n);
  const float* w = b.data<float>();
  float absmax = 0.f;
  for (int64_t i = 0; i < p.k * p.n; ++i) absmax = std::max(absmax, std::fabs(w[i]));
  p.scale = absmax > 0.f ? Fp8Scale(absmax) : 1.f;
  const float inv = 1.f / p.scale;
  p.packed.assign(static_cast<size_t>(p.np * p.kp), 0);  // 0x00 is +0 in E4M3
  for (int64_t j = 0; j < p.n; ++j) {
    for (int64_t i = 0; i < p.k; ++i) {
      p.packed[j * p.kp + i] = ToE4M3(w[s.trans_b ? j * p.k + i : i * p.n + j] * inv);
    }
  }
  return p;
}

StatusOr<QuantRunShape> PrepareQuantRun(const GemmSpec& s, int64_t k, int64_t n,
                                        std::span<const TensorView> inputs,
                                        std::span<const TensorView> outputs,
                                        std::string_view name) {
  KILN_ASSIGN_OR_RETURN(auto mk, QuantRowsAndDepth(s, inputs[0].dims));
  QuantRunShape run;
  run.m = mk.first;
  if (mk.second != k || outputs[0].num_elements() != run.m * n) {
    return MakeError(ErrorCode::kShapeMismatch,
                     "{}: A is [{} x {}], B [{} x {}], Y has {} elements", name, run.m, mk.second,
                     k, n, outputs[0].num_elements());
  }
  std::vector<int64_t> c_dims;
  const bool has_c = inputs.size() > 2 && inputs[2].dtype != DataType::kUndefined;
  if (has_c) c_dims.assign(inputs[2].dims.begin(), inputs[2].dims.end());
  KILN_ASSIGN_OR_RETURN(run.addend, ResolveQuantAddend(s, has_c ? &c_dims : nullptr, run.m, n));
  run.a_strides = QuantAStridesFor(s, run.m, k);
  run.empty = run.m * n == 0;
  return run;
}

Int8EpilogueParams QuantEpilogueFor(const GemmSpec& s, BlasType type, int64_t m, int64_t n,
                                    const QuantAddend& addend, const float* col_scale,
                                    const KernelRunArgs& args) {
  Int8EpilogueParams e;
  e.col_scale = col_scale;
  e.y = args.outputs[0].data;
  e.type = type;
  e.rows = m;
  e.cols = n;
  if (addend.present) {
    e.c = args.inputs[2].data;
    e.c_row_stride = addend.row_stride;
    e.c_col_stride = addend.col_stride;
    e.beta = addend.factor;
  }
  e.act = static_cast<BlasAct>(s.act.kind);
  e.act_min = s.act.min;
  e.act_max = s.act.max;
  return e;
}

QuantWorkspace QuantWorkspaceFor(int64_t m, int64_t np, int64_t kp, size_t lt_bytes) {
  static_assert(sizeof(int32_t) == sizeof(float));
  QuantWorkspace w;
  w.a_bytes = AlignUpSize(static_cast<size_t>(m * kp), kWorkspaceAlign);
  w.acc_bytes = AlignUpSize(static_cast<size_t>(m * np) * sizeof(int32_t), kWorkspaceAlign);
  w.lt_bytes = AlignUpSize(lt_bytes, kWorkspaceAlign);
  return w;
}

}  // namespace kiln::cuda
