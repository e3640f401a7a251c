// RotaryEmbedding on CUDA (src/kiln/ops/rotary.cc): one pass over x, each thread rotating kVec
// element pairs of one row (16-byte loads of x, cos and sin when the row layout allows), cos and
// sin rows found through their broadcast strides over x's leading dims. FP32 math.
#include <cstdint>

#include "kiln/backends/cuda/device_util.cuh"

namespace kiln::cuda {
namespace {

template <typename T, int kN>
struct alignas(sizeof(T) * kN) RotVec {
  T v[kN];
};

// Loads kN elements from p, each `step` apart: one 16-byte load when kVector (step is 1 and p is
// aligned then), else one element at a time.
template <typename T, int kN, bool kVector, typename I>
__device__ __forceinline__ RotVec<T, kN> LoadChunk(const T* p, I step) {
  if constexpr (kVector) {
    return *reinterpret_cast<const RotVec<T, kN>*>(p);
  } else {
    RotVec<T, kN> v;
#pragma unroll
    for (int e = 0; e < kN; ++e) v.v[e] = p[e * step];
    return v;
  }
}
template <typename T, int kN, bool kVector>
__device__ __forceinline__ void StoreChunk(T* p, const RotVec<T, kN>& v) {
  if constexpr (kVector) {
    *reinterpret_cast<RotVec<T, kN>*>(p) = v;
  } else {
#pragma unroll
    for (int e = 0; e < kN; ++e) p[e] = v.v[e];
  }
}

// Items are (row, chunk) pairs: a chunk is kN elements of the row's first half and the kN at the
// same place in its second half (rotate-half), or kN consecutive elements holding kN / 2 pairs
// (interleaved). I is the index type (32-bit when every offset fits, so that the row split is a
// native division).
template <typename T, int kN, bool kInterleaved, bool kVector, typename I>
__global__ void RotaryKernel(const T* __restrict__ x, const T* __restrict__ cos_t,
                             const T* __restrict__ sin_t, T* __restrict__ y, RotaryGeometry g) {
  const I d = static_cast<I>(g.d);
  const I ld = static_cast<I>(g.ld > 0 ? g.ld : g.d);
  const I h = d / 2;
  const I per_row = (kInterleaved ? d : h) / kN;
  const I total = static_cast<I>(g.rows) * per_row;
  const I cstep = static_cast<I>(g.cos_step), sstep = static_cast<I>(g.sin_step);
  for (I item = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; item < total;
       item += static_cast<I>(gridDim.x) * blockDim.x) {
    const I r = item / per_row;
    const I j = (item - r * per_row) * kN;
    // The row's cos and sin offsets: r split over x's leading dims, innermost last.
    I oc = 0, os = 0, rem = r;
#pragma unroll
    for (int k = kMaxRank - 1; k >= 0; --k) {
      if (k >= g.rank) continue;
      const I dk = static_cast<I>(g.dims[k]);
      const I c = rem % dk;
      rem /= dk;
      oc += c * static_cast<I>(g.cos_strides[k]);
      os += c * static_cast<I>(g.sin_strides[k]);
    }
    const T* px = x + r * ld;
    T* py = y + r * ld;
    if constexpr (kInterleaved) {
      const auto a = LoadChunk<T, kN, kVector>(px + j, I{1});
      const auto c = LoadChunk<T, kN, kVector>(cos_t + oc + j * cstep, cstep);
      const auto s = LoadChunk<T, kN, kVector>(sin_t + os + j * sstep, sstep);
      RotVec<T, kN> o;
#pragma unroll
      for (int e = 0; e < kN; e += 2) {
        const float a0 = Load(a.v[e]), a1 = Load(a.v[e + 1]);
        o.v[e] = Store<T>(a0 * Load(c.v[e]) - a1 * Load(s.v[e]));
        o.v[e + 1] = Store<T>(a1 * Load(c.v[e + 1]) + a0 * Load(s.v[e + 1]));
      }
      StoreChunk<T, kN, kVector>(py + j, o);
    } else {
      const auto lo = LoadChunk<T, kN, kVector>(px + j, I{1});
      const auto hi = LoadChunk<T, kN, kVector>(px + j + h, I{1});
      const auto c_lo = LoadChunk<T, kN, kVector>(cos_t + oc + j * cstep, cstep);
      const auto c_hi = LoadChunk<T, kN, kVector>(cos_t + oc + (j + h) * cstep, cstep);
      const auto s_lo = LoadChunk<T, kN, kVector>(sin_t + os + j * sstep, sstep);
      const auto s_hi = LoadChunk<T, kN, kVector>(sin_t + os + (j + h) * sstep, sstep);
      RotVec<T, kN> o_lo, o_hi;
#pragma unroll
      for (int e = 0; e < kN; ++e) {
        const float a = Load(lo.v[e]), b = Load(hi.v[e]);
        o_lo.v[e] = Store<T>(a * Load(c_lo.v[e]) - b * Load(s_lo.v[e]));
        o_hi.v[e] = Store<T>(b * Load(c_hi.v[e]) + a * Load(s_hi.v[e]));
      }
      StoreChunk<T, kN, kVector>(py + j, o_lo);
      StoreChunk<T, kN, kVector>(py + j + h, o_hi);
    }
  }
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

cudaError_t LaunchRotary(Elem t, bool interleaved, const void* x, const void* cos_t,
                         const void* sin_t, void* y, const RotaryGeometry& g, cudaStream_t stream) {
  if (g.rows == 0 || g.d == 0) return cudaSuccess;
  if (g.d % 2 != 0 || g.rank > kMaxRank || (g.ld != 0 && g.ld < g.d)) return cudaErrorInvalidValue;
  return DispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    constexpr int kVec = 16 / sizeof(T);
    auto* px = static_cast<const T*>(x);
    auto* pc = static_cast<const T*>(cos_t);
    auto* ps = static_cast<const T*>(sin_t);
    auto* py = static_cast<T*>(y);
    // 16-byte chunks: every chunk of x, cos and sin starts on a 16-byte boundary when the bases
    // do, the chunk count divides the span, cos and sin step by 1 along the row and their row
    // offsets (sums of strides) are multiples of kVec.
    const int64_t ld = g.ld > 0 ? g.ld : g.d;
    bool vec = (interleaved ? g.d : g.d / 2) % kVec == 0 && ld % kVec == 0 && g.cos_step == 1 &&
               g.sin_step == 1 && Aligned16(x) && Aligned16(y) && Aligned16(cos_t) &&
               Aligned16(sin_t);
    for (int k = 0; vec && k < g.rank; ++k) {
      vec = g.cos_strides[k] % kVec == 0 && g.sin_strides[k] % kVec == 0;
    }
    // Scalar chunks: one pair for rotate-half (an element of each half), one pair for
    // interleaved (two consecutive elements).
    const int64_t chunk = vec ? kVec : (interleaved ? 2 : 1);
    const int64_t items = g.rows * ((interleaved ? g.d : g.d / 2) / chunk);
    // Every element offset (x's, and cos's and sin's, which broadcast to x) fits in 32 bits.
    const bool narrow = g.rows * ld < (int64_t{1} << 31);
    auto go = [&](auto kernel) {
      kernel<<<GridFor(items), 256, 0, stream>>>(px, pc, ps, py, g);
      return cudaGetLastError();
    };
    if (interleaved) {
      if (vec) {
        return narrow ? go(RotaryKernel<T, kVec, true, true, uint32_t>)
                      : go(RotaryKernel<T, kVec, true, true, int64_t>);
      }
      return narrow ? go(RotaryKernel<T, 2, true, false, uint32_t>)
                    : go(RotaryKernel<T, 2, true, false, int64_t>);
    }
    if (vec) {
      return narrow ? go(RotaryKernel<T, kVec, false, true, uint32_t>)
                    : go(RotaryKernel<T, kVec, false, true, int64_t>);
    }
    return narrow ? go(RotaryKernel<T, 1, false, false, uint32_t>)
                  : go(RotaryKernel<T, 1, false, false, int64_t>);
  });
}

}  // namespace kiln::cuda
