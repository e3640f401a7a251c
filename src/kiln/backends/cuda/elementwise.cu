// Elementwise CUDA kernels: unary activations, Clip, broadcasting binary ops (every row of
// ops/unary_ops.inc and binary_ops.inc), Where and Cast.
// Dense operands move 16 bytes per thread per step (vectorised loads); broadcasting walks a
// coalesced index space. One launch per layer, grid-stride loops, FP32 math for f16/bf16.
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kiln/backends/cuda/binary_formula.cuh"
#include "kiln/backends/cuda/device_util.cuh"
#include "kiln/backends/cuda/unary_formula.cuh"

namespace kiln::cuda {
namespace {

// Each thread handles kVec consecutive elements per step: one 16-byte load/store when the
// pointers are aligned and the chunk is whole, element by element otherwise (the tail).
template <typename T, typename F>
__global__ void MapKernel(const T* __restrict__ x, T* __restrict__ y, int64_t n, bool aligned,
                          F f) {
  constexpr int kVec = 16 / sizeof(T);
  int64_t chunks = (n + kVec - 1) / kVec;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t i0 = c * kVec;
    if (aligned && i0 + kVec <= n) {
      uint4 raw = *reinterpret_cast<const uint4*>(x + i0);
      T* v = reinterpret_cast<T*>(&raw);
#pragma unroll
      for (int k = 0; k < kVec; ++k) v[k] = Store<T>(f(Load(v[k])));
      *reinterpret_cast<uint4*>(y + i0) = raw;
    } else {
      for (int64_t i = i0; i < n && i < i0 + kVec; ++i) y[i] = Store<T>(f(Load(x[i])));
    }
  }
}

bool Aligned16(const void* a, const void* b = nullptr, const void* c = nullptr) {
  auto bits = reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
              reinterpret_cast<uintptr_t>(c);
  return (bits & 15) == 0;
}

template <typename T, typename F>
cudaError_t Map(const void* x, void* y, int64_t n, F f, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int kVec = 16 / sizeof(T);
  MapKernel<T><<<GridFor((n + kVec - 1) / kVec), 256, 0, stream>>>(
      static_cast<const T*>(x), static_cast<T*>(y), n, Aligned16(x, y), f);
  return cudaGetLastError();
}

template <UnaryOp kOp>
struct UnaryFn {
  UnaryParams p;
  __device__ __forceinline__ float operator()(float v) const { return Unary<kOp>(v, p); }
};

template <UnaryOp kOp>
cudaError_t UnaryTyped(UnaryParams p, Elem t, const void* x, void* y, int64_t n,
                       cudaStream_t stream) {
  return DispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    return Map<T>(x, y, n, UnaryFn<kOp>{p}, stream);
  });
}

__global__ void NotKernel(const uint8_t* x, uint8_t* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = x[i] ? 0 : 1;
  }
}

template <typename T>
__global__ void ClipKernel(const T* __restrict__ x, const T* lo_p, const T* hi_p, T* __restrict__ y,
                           int64_t n) {
  using C = typename Compute<T>::type;
  C lo = lo_p ? Load(*lo_p) : C(0), hi = hi_p ? Load(*hi_p) : C(0);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    C v = Load(x[i]);
    if (lo_p) v = v < lo ? lo : v;
    if (hi_p) v = v > hi ? hi : v;  // ONNX: with min > max every element becomes max
    y[i] = Store<T>(v);
  }
}

// ---- binary (the formulas: binary_formula.cuh, from ops/binary_ops.inc) ----------------------
template <BinaryOp kOp, typename T, typename B, typename O>
__global__ void BinaryDenseKernel(const T* __restrict__ a, const B* __restrict__ b,
                                  O* __restrict__ y, int64_t n, bool aligned, BinaryParams p) {
  // Vector width from the widest operand so every access is at most 16 bytes.
  constexpr int kWidest = sizeof(T) > sizeof(B) ? (sizeof(T) > sizeof(O) ? sizeof(T) : sizeof(O))
                                                : (sizeof(B) > sizeof(O) ? sizeof(B) : sizeof(O));
  constexpr int kVec = 16 / kWidest;
  int64_t chunks = (n + kVec - 1) / kVec;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t i0 = c * kVec;
    if (aligned && i0 + kVec <= n) {
      // Aligned so the whole-array reinterpretations below are legal vector accesses.
      alignas(16) T va[kVec];
      alignas(16) B vb[kVec];
      alignas(16) O vy[kVec];
      using VA = typename Bytes<sizeof(T) * kVec>::type;
      using VB = typename Bytes<sizeof(B) * kVec>::type;
      using VY = typename Bytes<sizeof(O) * kVec>::type;
      *reinterpret_cast<VA*>(va) = *reinterpret_cast<const VA*>(a + i0);
      *reinterpret_cast<VB*>(vb) = *reinterpret_cast<const VB*>(b + i0);
#pragma unroll
      for (int k = 0; k < kVec; ++k) vy[k] = Store<O>(Binary<kOp>(Load(va[k]), Load(vb[k]), p));
      *reinterpret_cast<VY*>(y + i0) = *reinterpret_cast<VY*>(vy);
    } else {
      for (int64_t i = i0; i < n && i < i0 + kVec; ++i) {
        y[i] = Store<O>(Binary<kOp>(Load(a[i]), Load(b[i]), p));
      }
    }
  }
}

template <BinaryOp kOp, typename T, typename B, typename O>
__global__ void BinaryStridedKernel(const T* __restrict__ a, const B* __restrict__ b,
                                    O* __restrict__ y, Strided s, int64_t n, BinaryParams p) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[2];
    StridedOffsets<2>(s, i, off);
    y[i] = Store<O>(Binary<kOp>(Load(a[off[0]]), Load(b[off[1]]), p));
  }
}

// One operand broadcast over the middle of [outer, mid, inner] while the other is dense: a
// squeeze-excite scale (x[N, H*W, C] * s[N, 1, C]), a per-channel bias over NHWC rows. Each thread
// moves one 16-byte vector of the dense operand, the output and the broadcast operand (inner is a
// multiple of the vector, so a vector never crosses a row): one division per vector instead of the
// strided walk's per element.
template <BinaryOp kOp, typename T, bool kBroadcastB>
__global__ void BinaryRowBroadcastKernel(const T* __restrict__ a, const T* __restrict__ b,
                                         T* __restrict__ y, int64_t mid_inner, int64_t inner,
                                         int64_t n, BinaryParams p) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t chunks = n / kVec;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i0 = c * kVec;
    const int64_t r0 = (i0 / mid_inner) * inner + i0 % inner;  // the broadcast operand's element
    alignas(16) T va[kVec];
    alignas(16) T vb[kVec];
    alignas(16) T vy[kVec];
    *reinterpret_cast<uint4*>(va) = *reinterpret_cast<const uint4*>(a + (kBroadcastB ? i0 : r0));
    *reinterpret_cast<uint4*>(vb) = *reinterpret_cast<const uint4*>(b + (kBroadcastB ? r0 : i0));
#pragma unroll
    for (int k = 0; k < kVec; ++k) vy[k] = Store<T>(Binary<kOp>(Load(va[k]), Load(vb[k]), p));
    *reinterpret_cast<uint4*>(y + i0) = *reinterpret_cast<uint4*>(vy);
  }
}

// Whether the coalesced space `s` is [outer, mid, inner] (or [mid, inner]) with operand `dense`
// row-major and the other operand broadcast over mid only; sets mid * inner and inner.
bool IsRowBroadcast(const Strided& s, int dense, int64_t* mid_inner, int64_t* inner) {
  if (s.rank < 2 || s.rank > 3 || s.offset[0] != 0 || s.offset[1] != 0) return false;
  const int bcast = 1 - dense;
  const int d = s.rank - 2;  // the mid dim
  const int64_t in = s.dims[d + 1], mid = s.dims[d];
  if (s.strides[dense][d + 1] != 1 || s.strides[dense][d] != in) return false;
  if (s.strides[bcast][d + 1] != 1 || s.strides[bcast][d] != 0) return false;
  if (s.rank == 3 && (s.strides[dense][0] != mid * in || s.strides[bcast][0] != in)) return false;
  *mid_inner = mid * in;
  *inner = in;
  return true;
}

template <BinaryOp kOp, typename T, typename B>
cudaError_t BinaryTyped(BinaryParams p, const void* a, const void* b, void* y, const Strided& s,
                        int64_t n, bool same_shape, cudaStream_t stream) {
  using O = std::conditional_t<WritesBool(TypesOf(kOp)), bool, T>;
  if (n == 0) return cudaSuccess;
  auto* pa = static_cast<const T*>(a);
  auto* pb = static_cast<const B*>(b);
  auto* py = static_cast<O*>(y);
  if (same_shape) {
    BinaryDenseKernel<kOp, T, B, O>
        <<<GridFor((n + 3) / 4), 256, 0, stream>>>(pa, pb, py, n, Aligned16(a, b, y), p);
    return cudaGetLastError();
  }
  if constexpr (std::is_same_v<T, B> && std::is_same_v<T, O>) {
    constexpr int kVec = 16 / sizeof(T);
    int64_t mid_inner = 0, inner = 0;
    for (int dense = 0; dense < 2; ++dense) {
      if (!IsRowBroadcast(s, dense, &mid_inner, &inner) || inner % kVec != 0 ||
          !Aligned16(a, b, y)) {
        continue;
      }
      const int64_t chunks = n / kVec;
      if (dense == 0) {
        BinaryRowBroadcastKernel<kOp, T, true>
            <<<GridFor(chunks), 256, 0, stream>>>(pa, pb, py, mid_inner, inner, n, p);
      } else {
        BinaryRowBroadcastKernel<kOp, T, false>
            <<<GridFor(chunks), 256, 0, stream>>>(pa, pb, py, mid_inner, inner, n, p);
      }
      return cudaGetLastError();
    }
  }
  Strided fast = s;
  EnableFastDivision(fast, n);
  BinaryStridedKernel<kOp, T, B, O><<<GridFor(n), 256, 0, stream>>>(pa, pb, py, fast, n, p);
  return cudaGetLastError();
}

// The storage types each type class dispatches over (the providers accept the same).
template <BinaryOp kOp>
cudaError_t BinaryOpTyped(BinaryParams p, Elem t, Elem bt, const void* a, const void* b, void* y,
                          const Strided& s, int64_t n, bool same, cudaStream_t stream) {
  constexpr BinaryTypes kTypes = TypesOf(kOp);
  if constexpr (kTypes == BinaryTypes::kLogic) {
    return BinaryTyped<kOp, bool, bool>(p, a, b, y, s, n, same, stream);
  } else if constexpr (kTypes == BinaryTypes::kPow) {
    // The exponent may have another type than the base (f32 ^ i64, i64 ^ f32, ...).
    return DispatchNumeric(t, [&](auto ta) {
      return DispatchNumeric(bt, [&](auto tb) {
        return BinaryTyped<kOp, decltype(ta), decltype(tb)>(p, a, b, y, s, n, same, stream);
      });
    });
  } else {
    if constexpr (kTypes == BinaryTypes::kEquality) {
      if (t == Elem::kBool) return BinaryTyped<kOp, bool, bool>(p, a, b, y, s, n, same, stream);
    }
    return DispatchNumeric(t, [&](auto ta) {
      using T = decltype(ta);
      return BinaryTyped<kOp, T, T>(p, a, b, y, s, n, same, stream);
    });
  }
}

template <typename T>
__global__ void WhereKernel(const bool* __restrict__ c, const T* __restrict__ x,
                            const T* __restrict__ yv, T* __restrict__ o, Strided s, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off[3];
    StridedOffsets<3>(s, i, off);
    o[i] = c[off[0]] ? x[off[1]] : yv[off[2]];
  }
}

// ---- cast ------------------------------------------------------------------------------------
template <typename Dst, typename C>
__device__ __forceinline__ Dst CastValue(C v) {
  if constexpr (std::is_same_v<Dst, bool>) {
    return v != C(0);
  } else if constexpr (std::is_integral_v<Dst> && !std::is_integral_v<C>) {
    // Out-of-range and NaN are undefined in ONNX; kiln makes them 0 (as the CPU backend does).
    double d = static_cast<double>(v);
    if (!isfinite(d)) return 0;
    d = trunc(d);
    if (d < static_cast<double>(std::numeric_limits<Dst>::lowest()) ||
        d > static_cast<double>(std::numeric_limits<Dst>::max())) {
      return 0;
    }
    return static_cast<Dst>(d);
  } else {
    return Store<Dst>(v);
  }
}

template <typename Src, typename Dst>
__global__ void CastKernel(const Src* __restrict__ x, Dst* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = CastValue<Dst>(Load(x[i]));
  }
}

}  // namespace

cudaError_t LaunchUnary(UnaryOp op, UnaryParams p, Elem t, const void* x, void* y, int64_t n,
                        cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  switch (op) {
#define KILN_UNARY_OP(Name, formula) \
  case UnaryOp::k##Name:             \
    return UnaryTyped<UnaryOp::k##Name>(p, t, x, y, n, stream);
#define KILN_INT_UNARY_OP(Name, formula)
#include "kiln/ops/unary_ops.inc"
#undef KILN_INT_UNARY_OP
#undef KILN_UNARY_OP
    case UnaryOp::kNot:
      NotKernel<<<GridFor(n), 256, 0, stream>>>(static_cast<const uint8_t*>(x),
                                                static_cast<uint8_t*>(y), n);
      return cudaGetLastError();
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchClip(Elem t, const void* x, const void* lo, const void* hi, void* y, int64_t n,
                       cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchNumeric(t, [&](auto tag) {
    using T = decltype(tag);
    ClipKernel<T><<<GridFor(n), 256, 0, stream>>>(static_cast<const T*>(x),
                                                  static_cast<const T*>(lo),
                                                  static_cast<const T*>(hi), static_cast<T*>(y), n);
    return cudaGetLastError();
  });
}

cudaError_t LaunchBinary(BinaryOp op, BinaryParams p, Elem t, Elem b_type, const void* a,
                         const void* b, void* y, const Strided& s, int64_t n, bool same_shape,
                         cudaStream_t stream) {
  switch (op) {
#define KILN_BINARY_OP(Name, Types, formula) \
  case BinaryOp::k##Name:                    \
    return BinaryOpTyped<BinaryOp::k##Name>(p, t, b_type, a, b, y, s, n, same_shape, stream);
#define KILN_VARIADIC_OP(Name, Types, formula) KILN_BINARY_OP(Name, Types, formula)
#include "kiln/ops/binary_ops.inc"
#undef KILN_VARIADIC_OP
#undef KILN_BINARY_OP
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchWhere(size_t elem_size, const void* cond, const void* x, const void* y, void* out,
                        const Strided& s, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  Strided fast = s;
  EnableFastDivision(fast, n);
  return DispatchBytes(elem_size, [&](auto tag) {
    using T = decltype(tag);
    WhereKernel<T>
        <<<GridFor(n), 256, 0, stream>>>(static_cast<const bool*>(cond), static_cast<const T*>(x),
                                         static_cast<const T*>(y), static_cast<T*>(out), fast, n);
    return cudaGetLastError();
  });
}

cudaError_t LaunchCast(Elem from, Elem to, const void* x, void* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchAll(from, [&](auto src_tag) {
    using Src = decltype(src_tag);
    return DispatchAll(to, [&](auto dst_tag) {
      using Dst = decltype(dst_tag);
      CastKernel<Src, Dst>
          <<<GridFor(n), 256, 0, stream>>>(static_cast<const Src*>(x), static_cast<Dst*>(y), n);
      return cudaGetLastError();
    });
  });
}

}  // namespace kiln::cuda
