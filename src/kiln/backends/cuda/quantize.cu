// QuantizeLinear and DequantizeLinear on CUDA, per tensor or per axis, with the CPU kernel's
// arithmetic (backends/cpu/quantize.cc): x / scale as an IEEE FP32 division, round half to even,
// NaN to the zero point, saturation to the quantized type; dequantize as float(q - zero) * scale.
// One thread per 4 elements, moved as one vector where n and the pointers allow.
#include <cstdint>
#include <limits>

#include "kiln/backends/cuda/cuda_launch_more.h"
#include "kiln/backends/cuda/device_util.cuh"

namespace kiln::cuda {
namespace {

constexpr int kVec = 4;

template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// The scale and zero point of element i: by value per tensor, else read from the device.
template <typename S, typename Q>
struct Params {
  QuantDesc d;
  __device__ __forceinline__ int64_t Channel(int64_t i) const {
    return d.channels == 1 ? 0 : (i / d.inner) % d.channels;
  }
  __device__ __forceinline__ float Scale(int64_t c) const {
    return d.scale ? static_cast<float>(Load(static_cast<const S*>(d.scale)[c])) : d.scale_value;
  }
  __device__ __forceinline__ int32_t Zero(int64_t c) const {
    return d.zero ? static_cast<int32_t>(static_cast<const Q*>(d.zero)[c]) : d.zero_value;
  }
};

template <typename X>
__device__ __forceinline__ float ToFloat(X v) {
  if constexpr (std::is_same_v<X, int32_t>) {
    return static_cast<float>(v);
  } else {
    return static_cast<float>(Load(v));
  }
}

template <typename Q>
__device__ __forceinline__ Q QuantizeOne(float v, float scale, int32_t zero) {
  constexpr float kMin = static_cast<float>(std::numeric_limits<Q>::min());
  constexpr float kMax = static_cast<float>(std::numeric_limits<Q>::max());
  float q = rintf(__fdiv_rn(v, scale));
  q = isnan(q) ? 0.f : q;
  q = fminf(fmaxf(__fadd_rn(q, static_cast<float>(zero)), kMin), kMax);
  return static_cast<Q>(q);
}

template <typename Y, typename Q>
__device__ __forceinline__ Y DequantizeOne(Q q, float scale, int32_t zero) {
  const float v = static_cast<float>(static_cast<int64_t>(q) - zero);
  return Store<Y>(__fmul_rn(v, scale));
}

// Element-wise over n elements, kVec per thread; `vec` when n % kVec == 0 and both pointers are
// aligned to their vectors (one load and one store per thread).
template <typename X, typename Y, typename S, typename Q, bool kQuantize>
__global__ void QdqKernel(Params<S, Q> p, const X* __restrict__ x, Y* __restrict__ y, int64_t n,
                          bool vec) {
  const int64_t groups = (n + kVec - 1) / kVec;
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t first = g * kVec;
    Vec<X, kVec> in{};
    Vec<Y, kVec> out;
    if (vec) {
      in = reinterpret_cast<const Vec<X, kVec>*>(x)[g];
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        if (first + k < n) in.v[k] = x[first + k];
      }
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const int64_t c = first + k < n ? p.Channel(first + k) : 0;
      if constexpr (kQuantize) {
        out.v[k] = QuantizeOne<Y>(ToFloat(in.v[k]), p.Scale(c), p.Zero(c));
      } else {
        out.v[k] = DequantizeOne<Y>(in.v[k], p.Scale(c), p.Zero(c));
      }
    }
    if (vec) {
      reinterpret_cast<Vec<Y, kVec>*>(y)[g] = out;
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        if (first + k < n) y[first + k] = out.v[k];
      }
    }
  }
}

template <typename X, typename Y>
bool Vectorisable(const void* x, const void* y, int64_t n) {
  return n % kVec == 0 && reinterpret_cast<uintptr_t>(x) % sizeof(Vec<X, kVec>) == 0 &&
         reinterpret_cast<uintptr_t>(y) % sizeof(Vec<Y, kVec>) == 0;
}

template <typename X, typename Y, typename S, typename Q, bool kQuantize>
cudaError_t Launch(const QuantDesc& d, const void* x, void* y, int64_t n, cudaStream_t stream) {
  const bool vec = Vectorisable<X, Y>(x, y, n);
  QdqKernel<X, Y, S, Q, kQuantize><<<GridFor((n + kVec - 1) / kVec), 256, 0, stream>>>(
      Params<S, Q>{d}, static_cast<const X*>(x), static_cast<Y*>(y), n, vec);
  return cudaGetLastError();
}

// Calls f(q) with the storage type of a quantized element type (i8, u8; i32 when `with_i32`).
template <typename F>
cudaError_t DispatchQuantized(Elem e, bool with_i32, F&& f) {
  switch (e) {
    case Elem::kI8:
      return f(int8_t{});
    case Elem::kU8:
      return f(uint8_t{});
    case Elem::kI32:
      return with_i32 ? f(int32_t{}) : cudaErrorInvalidValue;
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t LaunchQuantize(Elem x_t, Elem q_t, const QuantDesc& d, const void* x, void* y,
                           int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchQuantized(q_t, false, [&](auto q_tag) {
    using Q = decltype(q_tag);
    return DispatchFloat(d.scale_t, [&](auto s_tag) {
      using S = decltype(s_tag);
      if (x_t == Elem::kI32) return Launch<int32_t, Q, S, Q, true>(d, x, y, n, stream);
      return DispatchFloat(x_t, [&](auto x_tag) {
        return Launch<decltype(x_tag), Q, S, Q, true>(d, x, y, n, stream);
      });
    });
  });
}

cudaError_t LaunchDequantize(Elem q_t, Elem y_t, const QuantDesc& d, const void* q, void* y,
                             int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchQuantized(q_t, true, [&](auto q_tag) {
    using Q = decltype(q_tag);
    return DispatchFloat(d.scale_t, [&](auto s_tag) {
      using S = decltype(s_tag);
      return DispatchFloat(y_t, [&](auto y_tag) {
        return Launch<Q, decltype(y_tag), S, Q, false>(d, q, y, n, stream);
      });
    });
  });
}

}  // namespace kiln::cuda
