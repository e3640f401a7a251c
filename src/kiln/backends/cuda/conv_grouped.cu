// The grouped convolution kernel (conv_depthwise.h, GroupedConvArgs): one block per group and
// tile of output pixels; the group's filter sits in shared memory in FP32 as [tap][ci][co], and
// each thread computes kPix output pixels (kThreads apart, so a warp covers 32 neighbouring
// pixels) times all kKpg output channels of the group. The 32 lanes of a warp read the same
// filter row (a shared-memory broadcast, four output channels per 16-byte load) and their own
// input pixel (8 input channels per 16-byte load, converted to FP32 once and used kKpg times).
// FP32 accumulation; taps outside the input add zero products; the epilogue (bias, residual,
// activation) before the single store. cuDNN's engines run RegNet's groups of 24 channels at a
// few TFLOP/s; this is the tactic beside them.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kiln/backends/cuda/activation.cuh"
#include "kiln/backends/cuda/conv_depthwise.h"
#include "kiln/backends/cuda/device_util.cuh"
#include "kiln/backends/cuda/smem_opt_in.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 128;

// Eight consecutive elements of storage type T (16-byte aligned) to FP32 and back.
template <typename T>
__device__ __forceinline__ void Load8(const T* p, float* out) {
  if constexpr (std::is_same_v<T, float>) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  } else {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = Load(e[i]);
  }
}

template <typename T>
__device__ __forceinline__ void Store8(T* p, const float* v) {
  if constexpr (std::is_same_v<T, float>) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    uint4 out;
    T* e = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = Store<T>(v[i]);
    *reinterpret_cast<uint4*>(p) = out;
  }
}

template <typename T, int kKpg, int kPix>
__global__ void __launch_bounds__(kThreads) GroupedConvKernel(GroupedConvArgs a) {
  extern __shared__ __align__(16) float w_s[];
  const int g = blockIdx.y;
  const int taps = a.r * a.s;
  const int filter = taps * a.cpg * kKpg;  // a multiple of 8
  {
    const float4* src = reinterpret_cast<const float4*>(a.w + static_cast<int64_t>(g) * filter);
    for (int i = threadIdx.x; i < filter / 4; i += kThreads) {
      reinterpret_cast<float4*>(w_s)[i] = src[i];
    }
  }
  __syncthreads();

  const T* x = static_cast<const T*>(a.x);
  const int64_t cin = static_cast<int64_t>(a.group) * a.cpg;
  const int64_t cout = static_cast<int64_t>(a.group) * kKpg;
  const int64_t pixels = a.n * a.oh * a.ow;
  int64_t pix[kPix], img[kPix], iy0[kPix], ix0[kPix];
  bool live[kPix];
#pragma unroll
  for (int k = 0; k < kPix; ++k) {
    const int64_t p =
        static_cast<int64_t>(blockIdx.x) * kThreads * kPix + k * kThreads + threadIdx.x;
    live[k] = p < pixels;
    pix[k] = live[k] ? p : 0;
    int64_t q = pix[k];
    const int64_t ox = q % a.ow;
    q /= a.ow;
    const int64_t oy = q % a.oh;
    img[k] = q / a.oh;
    iy0[k] = oy * a.stride_h - a.pad_h;
    ix0[k] = ox * a.stride_w - a.pad_w;
  }

  float acc[kPix][kKpg];
#pragma unroll
  for (int k = 0; k < kPix; ++k) {
#pragma unroll
    for (int co = 0; co < kKpg; ++co) acc[k][co] = 0.f;
  }

  for (int ky = 0; ky < a.r; ++ky) {
    for (int kx = 0; kx < a.s; ++kx) {
      const T* xp[kPix];
      bool inside[kPix];
#pragma unroll
      for (int k = 0; k < kPix; ++k) {
        const int64_t iy = iy0[k] + static_cast<int64_t>(ky) * a.dil_h;
        const int64_t ix = ix0[k] + static_cast<int64_t>(kx) * a.dil_w;
        inside[k] = live[k] && iy >= 0 && iy < a.h && ix >= 0 && ix < a.w_in;
        xp[k] = x + ((img[k] * a.h + (inside[k] ? iy : 0)) * a.w_in + (inside[k] ? ix : 0)) * cin +
                static_cast<int64_t>(g) * a.cpg;
      }
      const float* wt = w_s + (ky * a.s + kx) * a.cpg * kKpg;
      for (int ci0 = 0; ci0 < a.cpg; ci0 += 8) {
        float xf[kPix][8];
#pragma unroll
        for (int k = 0; k < kPix; ++k) {
          if (inside[k]) {
            Load8(xp[k] + ci0, xf[k]);
          } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) xf[k][e] = 0.f;
          }
        }
#pragma unroll
        for (int cc = 0; cc < 8; ++cc) {
          const float* wr = wt + (ci0 + cc) * kKpg;
#pragma unroll
          for (int co = 0; co < kKpg; co += 4) {
            const float4 wv = *reinterpret_cast<const float4*>(wr + co);
#pragma unroll
            for (int k = 0; k < kPix; ++k) {
              acc[k][co] += xf[k][cc] * wv.x;
              acc[k][co + 1] += xf[k][cc] * wv.y;
              acc[k][co + 2] += xf[k][cc] * wv.z;
              acc[k][co + 3] += xf[k][cc] * wv.w;
            }
          }
        }
      }
    }
  }

  const T* bias = static_cast<const T*>(a.bias);
  const T* z = static_cast<const T*>(a.z);
  T* y = static_cast<T*>(a.y);
#pragma unroll
  for (int k = 0; k < kPix; ++k) {
    if (!live[k]) continue;
    const int64_t out = pix[k] * cout + static_cast<int64_t>(g) * kKpg;
#pragma unroll
    for (int co0 = 0; co0 < kKpg; co0 += 8) {
      float v[8], add[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = acc[k][co0 + e];
      if (bias) {
        Load8(bias + static_cast<int64_t>(g) * kKpg + co0, add);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] += add[e];
      }
      if (z) {
        Load8(z + out + co0, add);
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] += add[e];
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        v[e] = ActivateFor<T>(static_cast<BlasAct>(a.act), v[e], a.act_min, a.act_max);
      }
      Store8(y + out + co0, v);
    }
  }
}

template <typename T, int kKpg>
cudaError_t LaunchK(const GroupedConvArgs& a, cudaStream_t stream) {
  constexpr int kPix = kKpg <= 16 ? 4 : kKpg <= 32 ? 2 : 1;
  auto* kernel = GroupedConvKernel<T, kKpg, kPix>;
  // Above 48 KiB of dynamic shared memory a kernel must opt in; once per instantiation and
  // device (host-side, capture-safe).
  static SharedMemoryOptIn opt_in;
  const cudaError_t opted = opt_in.For(kernel, static_cast<int>(kGroupedConvMaxFilterBytes));
  const size_t smem = static_cast<size_t>(a.r) * a.s * a.cpg * kKpg * sizeof(float);
  if (smem > 48 * 1024 && opted != cudaSuccess) return opted;
  const int64_t pixels = a.n * a.oh * a.ow;
  const int64_t tiles = (pixels + kThreads * kPix - 1) / (kThreads * kPix);
  if (tiles > 0x7fffffff || a.group > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(a.group));
  kernel<<<grid, kThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchT(const GroupedConvArgs& a, cudaStream_t stream) {
  switch (a.kpg) {
    case 8:
      return LaunchK<T, 8>(a, stream);
    case 16:
      return LaunchK<T, 16>(a, stream);
    case 24:
      return LaunchK<T, 24>(a, stream);
    case 32:
      return LaunchK<T, 32>(a, stream);
    case 48:
      return LaunchK<T, 48>(a, stream);
    case 64:
      return LaunchK<T, 64>(a, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

bool Aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool GroupedConvSupports(int64_t cpg, int64_t kpg, int64_t taps) {
  const bool width = kpg == 8 || kpg == 16 || kpg == 24 || kpg == 32 || kpg == 48 || kpg == 64;
  return width && cpg > 0 && cpg % 8 == 0 && taps > 0 &&
         taps * cpg * kpg * static_cast<int64_t>(sizeof(float)) <= kGroupedConvMaxFilterBytes;
}

cudaError_t LaunchGroupedConv(const GroupedConvArgs& a, cudaStream_t stream) {
  if (!GroupedConvSupports(a.cpg, a.kpg, static_cast<int64_t>(a.r) * a.s) || a.group < 1) {
    return cudaErrorInvalidValue;
  }
  if (!Aligned16(a.x) || !Aligned16(a.w) || !Aligned16(a.bias) || !Aligned16(a.z) ||
      !Aligned16(a.y)) {
    return cudaErrorMisalignedAddress;
  }
  if (a.n * a.oh * a.ow == 0) return cudaSuccess;
  return DispatchFloat(a.dtype, [&](auto tag) { return LaunchT<decltype(tag)>(a, stream); });
}

}  // namespace kiln::cuda
