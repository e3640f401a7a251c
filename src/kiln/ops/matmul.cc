// Shape rules of the matrix products: MatMul (numpy batched broadcasting, 1-D operands) and
// Gemm (2-D, transposes, C broadcast to [M, N]).
#include "kiln/ops/nn.h"
#include "kiln/ops/op_schema.h"
#include "kiln/ops/quant_edge.h"

namespace kiln {

Status SameFloatTypes(const InferenceContext& ctx, size_t n) {
  const DataType t = ProductType(ctx);
  for (size_t i = 0; i < n; ++i) {
    if (!ctx.has_input(i)) continue;
    const DataType ti = i == 0 ? t : ctx.input_type(i);
    if (!IsFloat(ti)) {
      return ctx.Error(ErrorCode::kTypeMismatch, "input {} has type {}; a float type is required",
                       i, ToString(ctx.input_type(i)));
    }
    if (ti != t) {
      return ctx.Error(ErrorCode::kTypeMismatch, "input {} has type {}; input 0 has {}", i,
                       ToString(ti), ToString(t));
    }
  }
  return OkStatus();
}

namespace {
bool MayEqual(const Dim& a, const Dim& b) { return a == b || !a.is_static() || !b.is_static(); }
}  // namespace

DataType ProductType(const InferenceContext& ctx) {
  const DataType a = ctx.input_type(0);
  return ctx.has_input(1) ? ProductFloatType(ctx.node(), a, ctx.input_type(1)) : a;
}

Status InferMatMulLike(InferenceContext& ctx, bool trans_a, bool trans_b) {
  KILN_RETURN_IF_ERROR(SameFloatTypes(ctx, 2));
  Shape a = ctx.input_shape(0);
  Shape b = ctx.input_shape(1);
  if (a.empty() || b.empty()) {
    return ctx.Error(ErrorCode::kShapeMismatch, "MatMul operands must have rank >= 1 ({} and {})",
                     ToString(a), ToString(b));
  }
  // numpy: a 1-D A is a row [1, K] whose 1 is dropped; a 1-D B is a column [K, 1].
  bool a_vec = a.size() == 1, b_vec = b.size() == 1;
  if (a_vec) a.insert(a.begin(), Dim(1));
  if (b_vec) b.push_back(Dim(1));
  if (trans_a && !a_vec) std::swap(a[a.size() - 1], a[a.size() - 2]);
  if (trans_b && !b_vec) std::swap(b[b.size() - 1], b[b.size() - 2]);
  const Dim& ka = a[a.size() - 1];
  const Dim& kb = b[b.size() - 2];
  if (!MayEqual(ka, kb)) {
    return ctx.Error(ErrorCode::kShapeMismatch, "inner dims differ: {} x {}",
                     ToString(ctx.input_shape(0)), ToString(ctx.input_shape(1)));
  }
  Shape batch_a(a.begin(), a.end() - 2), batch_b(b.begin(), b.end() - 2);
  auto batch = BroadcastShapes(batch_a, batch_b);
  if (!batch.ok()) {
    return ctx.Error(ErrorCode::kShapeMismatch, "batch dims: {}", batch.status().message());
  }
  Shape y = *batch;
  if (!a_vec) y.push_back(a[a.size() - 2]);
  if (!b_vec) y.push_back(b[b.size() - 1]);
  ctx.set_output(0, ProductOutputType(ctx.node(), ProductType(ctx)), std::move(y));
  return OkStatus();
}

Status InferMatMul(InferenceContext& ctx) { return InferMatMulLike(ctx, false, false); }

Status InferGemmLike(InferenceContext& ctx) {
  KILN_RETURN_IF_ERROR(SameFloatTypes(ctx, 3));
  Shape a = ctx.input_shape(0);
  Shape b = ctx.input_shape(1);
  if (a.size() != 2 || b.size() != 2) {
    return ctx.Error(ErrorCode::kShapeMismatch, "Gemm needs 2-D A and B; got {} and {}",
                     ToString(a), ToString(b));
  }
  if (ctx.attrs().GetInt("transA", 0)) std::swap(a[0], a[1]);
  if (ctx.attrs().GetInt("transB", 0)) std::swap(b[0], b[1]);
  if (!MayEqual(a[1], b[0])) {
    return ctx.Error(ErrorCode::kShapeMismatch, "inner dims differ: op(A) {} x op(B) {}",
                     ToString(a), ToString(b));
  }
  Shape y = {a[0], b[1]};
  if (ctx.has_input(2)) {
    const Shape& c = ctx.input_shape(2);
    auto out = BroadcastShapes(c, y);
    if (c.size() > 2 || !out.ok() || !MayEqual((*out)[0], y[0]) || !MayEqual((*out)[1], y[1])) {
      return ctx.Error(ErrorCode::kShapeMismatch, "C {} does not broadcast to [M, N] = {}",
                       ToString(c), ToString(y));
    }
  }
  ctx.set_output(0, ProductOutputType(ctx.node(), ProductType(ctx)), std::move(y));
  return OkStatus();
}

Status InferGemm(InferenceContext& ctx) { return InferGemmLike(ctx); }

}  // namespace kiln
