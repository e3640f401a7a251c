// Transpose on the CPU (any dtype: moves bytes), and DepthToSpace/SpaceToDepth as reshape +
// transpose. Dims that stay adjacent are merged first; a batched 2D transpose (the common
// NCHW<->NHWC and K^T perms) runs in cache blocks, a kept innermost dim copies contiguous runs.
#include "kiln/backends/cpu/op_util.h"
#include "kiln/ops/op_table.h"

namespace kiln::cpu {

namespace {
template <typename T>
void Transpose2D(const T* src, T* dst, int64_t rows, int64_t cols) {
  // dst[c][r] = src[r][c], in tiles so both sides stay in cache.
  constexpr int64_t kBlock = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kBlock) {
    int64_t r1 = std::min(rows, r0 + kBlock);
    for (int64_t c0 = 0; c0 < cols; c0 += kBlock) {
      int64_t c1 = std::min(cols, c0 + kBlock);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) dst[c * rows + r] = src[r * cols + c];
      }
    }
  }
}

template <typename T>
void TransposeTyped(const T* src, T* dst, const DimVec& dims, const DimVec& perm) {
  size_t rank = dims.size();
  DimVec out_dims(rank);
  for (size_t i = 0; i < rank; ++i) out_dims[i] = dims[perm[i]];
  int64_t total = 1;
  for (int64_t d : dims) total *= d;
  if (total == 0) return;
  // Batched 2D: perm = [0..k-1, k+1, k] after coalescing (rank <= 3 with perm [0,2,1] or [1,0]).
  bool batched_2d = rank >= 2 && perm[rank - 1] == static_cast<int64_t>(rank) - 2 &&
                    perm[rank - 2] == static_cast<int64_t>(rank) - 1;
  for (size_t i = 0; batched_2d && i + 2 < rank; ++i)
    batched_2d = perm[i] == static_cast<int64_t>(i);
  if (batched_2d) {
    int64_t rows = dims[rank - 2], cols = dims[rank - 1], mat = rows * cols;
    ParallelRows(total / mat, mat, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) Transpose2D(src + b * mat, dst + b * mat, rows, cols);
    });
    return;
  }
  DimVec in_strides = Strides(dims);
  // Input stride of each output axis.
  DimVec stride(rank);
  for (size_t i = 0; i < rank; ++i) stride[i] = in_strides[perm[i]];
  int64_t inner = out_dims[rank - 1], inner_stride = stride[rank - 1];
  int64_t rows = total / inner;
  ParallelRows(rows, inner, [&](int64_t r0, int64_t r1) {
    DimVec coord(rank, 0);
    // Coordinates of row r0 over the output's outer axes.
    int64_t rem = r0;
    for (size_t a = rank - 1; a-- > 0;) {
      coord[a] = rem % out_dims[a];
      rem /= out_dims[a];
    }
    for (int64_t r = r0; r < r1; ++r) {
      int64_t off = 0;
      for (size_t a = 0; a + 1 < rank; ++a) off += coord[a] * stride[a];
      T* d = dst + r * inner;
      const T* s = src + off;
      if (inner_stride == 1) {
        std::memcpy(d, s, static_cast<size_t>(inner) * sizeof(T));
      } else {
        for (int64_t j = 0; j < inner; ++j) d[j] = s[j * inner_stride];
      }
      for (size_t a = rank - 1; a-- > 0;) {
        if (++coord[a] < out_dims[a]) break;
        coord[a] = 0;
      }
    }
  });
}
}  // namespace

void TransposeBytes(const void* src, void* dst, std::span<const int64_t> in_dims,
                    std::span<const int64_t> perm, size_t elem_size) {
  // Drop size-1 dims, then merge input dims that stay adjacent and in order in the output.
  // Everything here is rank-sized and inline: Run does not allocate.
  DimVec keep;  // input axes kept, in output order
  for (int64_t p : perm) {
    if (in_dims[p] != 1) keep.push_back(p);
  }
  DimVec dims, perm2;  // coalesced
  {
    // Group consecutive output axes that are consecutive input axes: group g is
    // keep[start[g]] .. keep[start[g] + len[g] - 1].
    DimVec start, len;
    for (size_t i = 0; i < keep.size(); ++i) {
      if (!start.empty() && keep[start.back() + len.back() - 1] + 1 == keep[i]) {
        ++len.back();
      } else {
        start.push_back(static_cast<int64_t>(i));
        len.push_back(1);
      }
    }
    size_t groups = start.size();
    // Order groups by their first input axis to get the coalesced input dims.
    DimVec order(groups);
    for (size_t i = 0; i < groups; ++i) order[i] = static_cast<int64_t>(i);
    std::sort(order.begin(), order.end(),
              [&](int64_t a, int64_t b) { return keep[start[a]] < keep[start[b]]; });
    DimVec pos(groups);
    for (size_t i = 0; i < groups; ++i) {
      pos[order[i]] = static_cast<int64_t>(i);
      int64_t d = 1;
      for (int64_t k = 0; k < len[order[i]]; ++k) d *= in_dims[keep[start[order[i]] + k]];
      dims.push_back(d);
    }
    for (size_t g = 0; g < groups; ++g) perm2.push_back(pos[g]);
  }
  if (dims.empty()) {
    dims = {1};
    perm2 = {0};
  }
  switch (elem_size) {
    case 1:
      TransposeTyped(static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), dims, perm2);
      break;
    case 2:
      TransposeTyped(static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), dims, perm2);
      break;
    case 4:
      TransposeTyped(static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), dims, perm2);
      break;
    default:
      TransposeTyped(static_cast<const uint64_t*>(src), static_cast<uint64_t*>(dst), dims, perm2);
      break;
  }
}

namespace {
bool AnyType(const KernelRequest& r) { return InType(r, 0) != DataType::kUndefined; }

const bool kRegistered = [] {
  RegisterOpKernel({
      .op_type = "Transpose",
      .float_wrap = false,
      .storage_types = true,
      .accepts = AnyType,
      .create =
          [](const KernelRequest& r) {
            std::vector<int64_t> perm = attrs::Transpose::perm(*r.node);
            return KernelOr([perm](const KernelRunArgs& a) {
              const TensorView& x = a.inputs[0];
              DimVec p(perm.begin(), perm.end());
              if (p.empty()) {
                for (size_t i = x.dims.size(); i-- > 0;) p.push_back(static_cast<int64_t>(i));
              }
              TransposeBytes(x.data, a.outputs[0].data, x.dims, p, SizeOf(x.dtype));
              return OkStatus();
            });
          },
  });
  for (bool to_space : {true, false}) {
    RegisterOpKernel({
        .op_type = to_space ? "DepthToSpace" : "SpaceToDepth",
        .float_wrap = false,
        .storage_types = true,
        .accepts = AnyType,
        .create =
            [to_space](const KernelRequest& r) {
              int64_t b = r.node->attrs().GetInt("blocksize", 1);
              bool crd = r.node->attrs().GetString("mode", "DCR") == "CRD";
              return KernelOr([=](const KernelRunArgs& a) {
                const TensorView& x = a.inputs[0];
                int64_t n = x.dims[0], c = x.dims[1], h = x.dims[2], w = x.dims[3];
                DimVec dims, perm;
                if (!to_space) {
                  dims = {n, c, h / b, b, w / b, b};
                  perm = {0, 3, 5, 1, 2, 4};
                } else if (crd) {
                  dims = {n, c / (b * b), b, b, h, w};
                  perm = {0, 1, 4, 2, 5, 3};
                } else {
                  dims = {n, b, b, c / (b * b), h, w};
                  perm = {0, 3, 4, 1, 5, 2};
                }
                TransposeBytes(x.data, a.outputs[0].data, dims, perm, SizeOf(x.dtype));
                return OkStatus();
              });
            },
    });
  }
  return true;
}();
}  // namespace

}  // namespace kiln::cpu
