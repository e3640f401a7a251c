#include "kiln/ops/matmul_geometry.h"

#include <algorithm>

namespace kiln {

StatusOr<MatMulGeometry> ResolveMatMulGeometry(bool trans_a, bool trans_b,
                                               std::span<const int64_t> a_dims,
                                               std::span<const int64_t> b_dims, bool offsets) {
  std::vector<int64_t> a(a_dims.begin(), a_dims.end()), b(b_dims.begin(), b_dims.end());
  if (a.empty() || b.empty()) return MakeError(ErrorCode::kShapeMismatch, "MatMul of a scalar");
  const bool a_vec = a.size() == 1, b_vec = b.size() == 1;
  if (a_vec) a = {1, a[0]};
  if (b_vec) b = {b[0], 1};
  MatMulGeometry g;
  g.ta = trans_a && !a_vec;
  g.tb = trans_b && !b_vec;
  const size_t ra = a.size(), rb = b.size();
  g.m = g.ta ? a[ra - 1] : a[ra - 2];
  g.k = g.ta ? a[ra - 2] : a[ra - 1];
  g.n = g.tb ? b[rb - 2] : b[rb - 1];
  const int64_t kb = g.tb ? b[rb - 1] : b[rb - 2];
  if (kb != g.k) {
    return MakeError(ErrorCode::kShapeMismatch, "MatMul inner dims differ ({} vs {})", g.k, kb);
  }
  const size_t rank = std::max(ra, rb) - 2;
  g.batch_dims.assign(rank, 1);
  std::vector<int64_t> as(rank, 0), bs(rank, 0);  // element strides per batch dim (0: broadcast)
  int64_t a_stride = g.m * g.k, b_stride = g.k * g.n;
  for (size_t i = rank; i-- > 0;) {
    const int64_t da = i + ra - 2 >= rank ? a[i + ra - 2 - rank] : 1;
    const int64_t db = i + rb - 2 >= rank ? b[i + rb - 2 - rank] : 1;
    if (da != db && da != 1 && db != 1) {
      return MakeError(ErrorCode::kShapeMismatch, "MatMul batch dims {} and {} do not broadcast",
                       da, db);
    }
    g.batch_dims[i] = std::max(da, db);
    as[i] = da == 1 ? 0 : a_stride;
    bs[i] = db == 1 ? 0 : b_stride;
    a_stride *= da;
    b_stride *= db;
  }
  for (int64_t x : g.batch_dims) g.batch *= x;
  const bool b_batched = std::any_of(bs.begin(), bs.end(), [](int64_t v) { return v != 0; });
  g.fold = !b_batched && !g.ta;
  if (offsets && !g.fold) {
    g.a_offsets.resize(g.batch);
    g.b_offsets.resize(g.batch);
    for (int64_t p = 0; p < g.batch; ++p) {
      int64_t rem = p, ao = 0, bo = 0;
      for (size_t i = rank; i-- > 0;) {
        const int64_t coord = rem % g.batch_dims[i];
        rem /= g.batch_dims[i];
        ao += coord * as[i];
        bo += coord * bs[i];
      }
      g.a_offsets[p] = ao;
      g.b_offsets[p] = bo;
    }
  }
  return g;
}

}  // namespace kiln
