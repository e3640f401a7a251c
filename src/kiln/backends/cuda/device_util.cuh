// Device-side helpers shared by kiln's CUDA kernels: storage <-> FP32 conversion (f16/bf16 are
// stored, FP32 is computed), launch geometry for grid-stride loops, warp and block reductions,
// and the coalesced-index walk of a Strided iteration space.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kiln/backends/cuda/cuda_launch.h"

namespace kiln::cuda {

// Storage element -> compute value: halves compute in float, the rest as themselves.
template <typename T>
struct Compute {
  using type = T;
};
template <>
struct Compute<__half> {
  using type = float;
};
template <>
struct Compute<__nv_bfloat16> {
  using type = float;
};

template <typename T>
__device__ __forceinline__ typename Compute<T>::type Load(T v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(v);
  } else {
    return v;
  }
}
template <typename T, typename C>
__device__ __forceinline__ T Store(C v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

// One activation by the INT8 contract (kiln/backends/int8_quant.h): x * inv_scale in FP32,
// saturated to [-127, 127] with NaN to +127, rounded half to even; bit-identical to the CPU's.
__device__ __forceinline__ int8_t QuantizeInt8Device(float x, float inv_scale) {
  float v = __fmul_rn(x, inv_scale);
  v = v < 127.f ? v : 127.f;  // NaN compares false: it becomes 127
  v = v > -127.f ? v : -127.f;
  return static_cast<int8_t>(__float2int_rn(v));
}

// Eight consecutive elements of a row as floats: one 16-byte load for halves, two for floats
// (`row` 16-byte aligned).
template <typename T>
__device__ __forceinline__ void LoadRow8(const T* row, float (&v)[8]) {
  if constexpr (sizeof(T) == 2) {
    const uint4 raw = *reinterpret_cast<const uint4*>(row);
    const T* h = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = Load(h[j]);
  } else {
    const float4 a = reinterpret_cast<const float4*>(row)[0];
    const float4 b = reinterpret_cast<const float4*>(row)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
}

// Whether a quantize pass (the INT8 and FP8 products' Int8QuantizeParams/Fp8QuantizeParams: rows
// of `depth` elements `row_stride` apart, into rows of `ldq` bytes) can take 8 elements a thread
// with LoadRow8 and 32-bit indexing.
template <typename P>
inline bool QuantRowsVectorizable(const P& p) {
  return p.col_stride == 1 && p.depth % 8 == 0 && p.ldq % 8 == 0 && p.row_stride % 8 == 0 &&
         reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && reinterpret_cast<uintptr_t>(p.q) % 8 == 0 &&
         p.rows * (p.ldq / 8) < (int64_t{1} << 31);
}

// Blocks for a grid-stride loop over n items with `threads` per block: enough to fill the GPU
// (the H200 has 132 SMs), never more than there is work.
inline unsigned GridFor(int64_t n, int threads = 256, int64_t cap = 132 * 16) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > cap) blocks = cap;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename T>
__device__ __forceinline__ T WarpMax(T v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide sum/max for blockDim.x a multiple of 32 (<= 1024); every thread gets the result.
// `scratch` holds 33 floats in shared memory.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // scratch may still be read from a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.f;
  v = WarpSum(v);
  return v;
}
__device__ __forceinline__ float BlockMax(float v, float* scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  v = WarpMax(v);
  return v;
}

// Element offsets of output index i in operands 0..K-1 of a Strided space.
template <int K>
__device__ __forceinline__ void StridedOffsets(const Strided& s, int64_t i, int64_t* off) {
#pragma unroll
  for (int k = 0; k < K; ++k) off[k] = s.offset[k];
  if (s.div32) {  // every index below 2^31: multiply-high division (EnableFastDivision)
    uint32_t u = static_cast<uint32_t>(i);
    for (int d = s.rank - 1; d >= 0; --d) {
      const uint32_t dim = static_cast<uint32_t>(s.dims[d]);
      const uint32_t q = (__umulhi(u, s.div_mul[d]) + u) >> s.div_shift[d];
      const int64_t c = static_cast<int64_t>(u - q * dim);
      u = q;
#pragma unroll
      for (int k = 0; k < K; ++k) off[k] += c * s.strides[k][d];
    }
    return;
  }
  for (int d = s.rank - 1; d >= 0; --d) {
    int64_t dim = s.dims[d];
    int64_t c = i % dim;
    i /= dim;
#pragma unroll
    for (int k = 0; k < K; ++k) off[k] += c * s.strides[k][d];
  }
}

// A C++ type of each byte size, for kernels that only move elements.
template <size_t N>
struct Bytes;
template <>
struct Bytes<1> {
  using type = uint8_t;
};
template <>
struct Bytes<2> {
  using type = uint16_t;
};
template <>
struct Bytes<4> {
  using type = uint32_t;
};
template <>
struct Bytes<8> {
  using type = uint64_t;
};
template <>
struct Bytes<16> {
  using type = uint4;
};

// Calls f(std::integral_constant-like tag) with the storage type of e among the float types.
template <typename F>
cudaError_t DispatchFloat(Elem e, F&& f) {
  switch (e) {
    case Elem::kF32:
      return f(float{});
    case Elem::kF16:
      return f(__half{});
    case Elem::kBF16:
      return f(__nv_bfloat16{});
    default:
      return cudaErrorInvalidValue;
  }
}
// Float types plus the integer types the shape arithmetic uses.
template <typename F>
cudaError_t DispatchNumeric(Elem e, F&& f) {
  switch (e) {
    case Elem::kI32:
      return f(int32_t{});
    case Elem::kI64:
      return f(int64_t{});
    default:
      return DispatchFloat(e, f);
  }
}
template <typename F>
cudaError_t DispatchAll(Elem e, F&& f) {
  switch (e) {
    case Elem::kI8:
      return f(int8_t{});
    case Elem::kU8:
      return f(uint8_t{});
    case Elem::kBool:
      return f(bool{});
    default:
      return DispatchNumeric(e, f);
  }
}
template <typename F>
cudaError_t DispatchBytes(size_t size, F&& f) {
  switch (size) {
    case 1:
      return f(uint8_t{});
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    case 8:
      return f(uint64_t{});
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kiln::cuda
