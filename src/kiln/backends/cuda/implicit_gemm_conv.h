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

// Where row m's window starts: its image's first element in x, and the input position of (r, s) =
// (0, 0) (negative inside the top/left padding).
struct ImplicitGemmRow {
  int64_t image = 0;
  int64_t ih0 = 0, iw0 = 0;
};
// The divisions run in 32 bits (a 64-bit division is several times the instructions, and the
// kernels' loaders divide for every 16-byte chunk): rows() and depth() must be below 2^31, which
// ImplicitGemmIndexable checks and LaunchInt8WgmmaConv requires. Offsets into x stay 64-bit.
KILN_IMPLICIT_GEMM_HD ImplicitGemmRow RowOf(const ImplicitGemmConv& g, int64_t m) {
  const auto pixels = static_cast<uint32_t>(g.oh * g.ow), ow = static_cast<uint32_t>(g.ow);
  const uint32_t n = static_cast<uint32_t>(m) / pixels, p = static_cast<uint32_t>(m) - n * pixels;
  const uint32_t y = p / ow, x = p - y * ow;
  return {int64_t{n} * g.h * g.w * g.cp, int64_t{y} * g.stride_h - g.pad_top,
          int64_t{x} * g.stride_w - g.pad_left};
}

// The offset in x of element (row, j) of A, or -1 where it reads the padding around the image.
// j's chunk of 16 (j % 16 == 0 for the loaders) stays within one (r, s).
KILN_IMPLICIT_GEMM_HD int64_t OffsetOf(const ImplicitGemmConv& g, const ImplicitGemmRow& row,
                                       int64_t j) {
  const auto cp = static_cast<uint32_t>(g.cp), s = static_cast<uint32_t>(g.s);
  const uint32_t rs = static_cast<uint32_t>(j) / cp, c = static_cast<uint32_t>(j) - rs * cp;
  const uint32_t kr = rs / s, ks = rs - kr * s;
  const int64_t ih = row.ih0 + kr * g.dil_h, iw = row.iw0 + ks * g.dil_w;
  if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) return -1;
  return row.image + (ih * g.w + iw) * g.cp + c;
}

// Whether RowOf and OffsetOf's 32-bit divisions hold for g: rows and depth below 2^31.
KILN_IMPLICIT_GEMM_HD bool ImplicitGemmIndexable(const ImplicitGemmConv& g) {
  constexpr int64_t kLimit = int64_t{1} << 31;
  return g.batch >= 0 && g.oh >= 0 && g.ow >= 0 && g.cp > 0 && g.r > 0 && g.s > 0 &&
         g.rows() < kLimit && g.depth() < kLimit;
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
