// An NHWC convolution as the matrix product kiln's 8-bit tensor-core kernels compute (implicit
// GEMM), for the INT8/FP8 convolutions on CUDA (issue 22: ResNet-50 needs them). Header-only:
// the same functions run on the host (tests, weight packing) and in the kernels' operand loaders.
//
//   Y [N * OH * OW, K] = A [N * OH * OW, R * S * Cp] x B [K, R * S * Cp]^T
//
// Row m of A is output pixel (n, oh, ow), in that order (Y is then NHWC). Column j = (r * S + s) *
// Cp + c of it reads the quantized input x [N, H, W, Cp] at (n, oh * stride_h - pad_top + r *
// dil_h, ow * stride_w - pad_left + s * dil_w, c), 0 outside the image. Cp is C padded to a
// multiple of 16, the padding channels 0 in x and B: every 16-byte chunk of a row of A then lies
// within one (r, s) and is one contiguous 16-byte copy (or zeros), which is how the kernels'
// cp.async loaders move A. B is the weight [K, C, R, S] (ONNX's layout) in [K, R, S, Cp] order.
// Groups are not covered (group 1 only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define KILN_IMPLICIT_GEMM_HD __host__ __device__ __forceinline__
#else
#define KILN_IMPLICIT_GEMM_HD inline
#endif

namespace kiln::cuda {

inline constexpr int64_t kConvChannelPad = 16;
inline int64_t PaddedChannels(int64_t c) {
  return (c + kConvChannelPad - 1) / kConvChannelPad * kConvChannelPad;
}

struct ImplicitGemmConv {
  int64_t batch = 0, h = 0, w = 0, cp = 0;  // the input, channels padded
  int64_t oh = 0, ow = 0;                   // the output's spatial size
  int32_t r = 1, s = 1;                     // the kernel window
  int32_t stride_h = 1, stride_w = 1, pad_top = 0, pad_left = 0, dil_h = 1, dil_w = 1;

  KILN_IMPLICIT_GEMM_HD int64_t rows() const { return batch * oh * ow; }
  KILN_IMPLICIT_GEMM_HD int64_t depth() const { return int64_t{r} * s * cp; }
};

// Where row m's window starts: its image's first element in x (-1: a row past the last, NoRow),
// and the input position of (r, s) = (0, 0) (negative inside the top/left padding).
struct ImplicitGemmRow {
  int64_t image = 0;
  int32_t ih0 = 0, iw0 = 0;
};
// The divisions run in 32 bits (a 64-bit division is several times the instructions), and the
// window positions are 32-bit: rows() and depth() must be below 2^31 and the input and output
// extents times the strides below 2^30, which ImplicitGemmIndexable checks and
// LaunchInt8WgmmaConv requires. Offsets into x stay 64-bit.
KILN_IMPLICIT_GEMM_HD ImplicitGemmRow RowOf(const ImplicitGemmConv& g, int64_t m) {
  const auto pixels = static_cast<uint32_t>(g.oh * g.ow), ow = static_cast<uint32_t>(g.ow);
  const uint32_t n = static_cast<uint32_t>(m) / pixels, p = static_cast<uint32_t>(m) - n * pixels;
  const uint32_t y = p / ow, x = p - y * ow;
  return {int64_t{n} * g.h * g.w * g.cp, static_cast<int32_t>(y) * g.stride_h - g.pad_top,
          static_cast<int32_t>(x) * g.stride_w - g.pad_left};
}

// A row past the last (rows() and beyond): every element of it reads as padding (OffsetAt -1).
KILN_IMPLICIT_GEMM_HD ImplicitGemmRow NoRow() { return {-1, 0, 0}; }

// Column j of A as a window tap (kr, ks) and a channel c. The kernels' loaders keep one per
// thread and move it along the depth a stage at a time (Advance) instead of dividing for every
// 16-byte chunk; kr == r past the depth (the last stage's tail), where OffsetAt reads zeros.
struct ImplicitGemmColumn {
  int32_t kr = 0, ks = 0, c = 0;
};
KILN_IMPLICIT_GEMM_HD ImplicitGemmColumn ColumnOf(const ImplicitGemmConv& g, int64_t j) {
  const auto cp = static_cast<uint32_t>(g.cp), s = static_cast<uint32_t>(g.s);
  const uint32_t rs = static_cast<uint32_t>(j) / cp, c = static_cast<uint32_t>(j) - rs * cp;
  const uint32_t kr = rs / s, ks = rs - kr * s;
  return {static_cast<int32_t>(kr), static_cast<int32_t>(ks), static_cast<int32_t>(c)};
}
// The column `step` bytes further along the depth (step > 0; a loop of at most step / cp + 1
// subtractions, no division).
KILN_IMPLICIT_GEMM_HD void Advance(const ImplicitGemmConv& g, ImplicitGemmColumn& col,
                                   int32_t step) {
  const auto cp = static_cast<int32_t>(g.cp);
  col.c += step;
  while (col.c >= cp) {
    col.c -= cp;
    if (++col.ks == g.s) {
      col.ks = 0;
      ++col.kr;
    }
  }
}

// The offset in x of A's element at (row, col), or -1 where it reads the padding around the
// image, a row past the last (NoRow) or a column past the depth. A 16-byte chunk of a row (c % 16
// == 0 for the loaders) stays within one (r, s).
KILN_IMPLICIT_GEMM_HD int64_t OffsetAt(const ImplicitGemmConv& g, const ImplicitGemmRow& row,
                                       const ImplicitGemmColumn& col) {
  if (col.kr >= g.r || row.image < 0) return -1;
  const int32_t ih = row.ih0 + col.kr * g.dil_h, iw = row.iw0 + col.ks * g.dil_w;
  if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) return -1;
  return row.image + (int64_t{ih} * g.w + iw) * g.cp + col.c;
}

// The offset in x of element (row, j) of A, or -1 (OffsetAt).
KILN_IMPLICIT_GEMM_HD int64_t OffsetOf(const ImplicitGemmConv& g, const ImplicitGemmRow& row,
                                       int64_t j) {
  return OffsetAt(g, row, ColumnOf(g, j));
}

// One thread's share of a stage of A in kiln's cp.async loaders (implicit_gemm_loader.cuh): a
// stage is kRows rows of A by kChunks 16-byte chunks, and thread tid of kThreads takes chunk
// tid % kChunks of tile rows RowInTile(tid, it), it < kPer. Its rows stay fixed, decomposed once
// (Init); its column moves one stage along the depth at a time (Next, no division). Offset(it) is
// OffsetAt for its it-th chunk of the current stage.
template <int kRows, int kChunks, int kThreads>
struct ImplicitGemmThreadWalk {
  static_assert(kThreads % kChunks == 0, "a thread's chunk is the same one in each of its rows");
  static constexpr int kPer = kRows * kChunks / kThreads;
  static_assert(kPer * kThreads == kRows * kChunks, "every thread copies the same chunks");
  ImplicitGemmRow rows[kPer];
  ImplicitGemmColumn col;

  KILN_IMPLICIT_GEMM_HD static int RowInTile(int tid, int it) {
    return (tid + it * kThreads) / kChunks;
  }
  KILN_IMPLICIT_GEMM_HD void Init(const ImplicitGemmConv& g, int64_t row0, int tid) {
    const int64_t last = g.rows();
    for (int it = 0; it < kPer; ++it) {
      const int64_t m = row0 + RowInTile(tid, it);
      rows[it] = m < last ? RowOf(g, m) : NoRow();
    }
    col = ColumnOf(g, (tid % kChunks) * 16);
  }
  KILN_IMPLICIT_GEMM_HD int64_t Offset(const ImplicitGemmConv& g, int it) const {
    return OffsetAt(g, rows[it], col);
  }
  KILN_IMPLICIT_GEMM_HD void Next(const ImplicitGemmConv& g) { Advance(g, col, kChunks * 16); }
};

// Whether the convolution is pointwise: a 1x1 window, stride 1, no padding. A is then x itself,
// [N * H * W, Cp] row-major, and the plain matrix kernels (TMA's included) run it.
KILN_IMPLICIT_GEMM_HD bool IsPointwise(const ImplicitGemmConv& g) {
  return g.r == 1 && g.s == 1 && g.stride_h == 1 && g.stride_w == 1 && g.pad_top == 0 &&
         g.pad_left == 0 && g.oh == g.h && g.ow == g.w;
}

// Whether RowOf's and ColumnOf's 32-bit arithmetic holds for g (RowOf says what it needs).
KILN_IMPLICIT_GEMM_HD bool ImplicitGemmIndexable(const ImplicitGemmConv& g) {
  constexpr int64_t kLimit = int64_t{1} << 31, kExtent = int64_t{1} << 30;
  return g.batch >= 0 && g.oh >= 0 && g.ow >= 0 && g.cp > 0 && g.r > 0 && g.s > 0 &&
         g.stride_h > 0 && g.stride_w > 0 && g.dil_h > 0 && g.dil_w > 0 && g.rows() < kLimit &&
         g.depth() < kLimit && g.h < kExtent && g.w < kExtent &&
         g.oh * g.stride_h + g.pad_top < kExtent && g.ow * g.stride_w + g.pad_left < kExtent &&
         int64_t{g.r} * g.dil_h + g.pad_top < kExtent &&
         int64_t{g.s} * g.dil_w + g.pad_left < kExtent;
}

// Whether a launch of `rows` rows of Y over a depth of `depth` can run g: they are g's, its
// channels are padded as the loaders copy them, and it is ImplicitGemmIndexable.
KILN_IMPLICIT_GEMM_HD bool ImplicitGemmLaunchable(const ImplicitGemmConv& g, int64_t rows,
                                                  int64_t depth) {
  return rows == g.rows() && depth == g.depth() && g.cp % kConvChannelPad == 0 &&
         ImplicitGemmIndexable(g);
}

// The weight [K, C, R, S] (any element type T, e.g. int8 after per-channel quantization) as B:
// [kp, R * S * Cp], row k = output channel k in [K, R, S, Cp] order, zeros in the padding
// channels and in rows k >= K up to kp.
template <typename T>
std::vector<T> PackConvWeights(const T* w, int64_t k, int64_t c, int32_t r, int32_t s, int64_t kp) {
  const int64_t cp = PaddedChannels(c), depth = int64_t{r} * s * cp;
  std::vector<T> b(static_cast<size_t>(kp * depth), T{});
  for (int64_t o = 0; o < k; ++o) {
    for (int64_t ci = 0; ci < c; ++ci) {
      for (int32_t kr = 0; kr < r; ++kr) {
        for (int32_t ks = 0; ks < s; ++ks) {
          b[static_cast<size_t>(o * depth + (int64_t{kr} * s + ks) * cp + ci)] =
              w[((o * c + ci) * r + kr) * s + ks];
        }
      }
    }
  }
  return b;
}

}  // namespace kiln::cuda

#undef KILN_IMPLICIT_GEMM_HD
