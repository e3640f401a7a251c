// Resize on CUDA, nearest and (multi-)linear, any rank up to 8: one thread per output element
// computes its source coordinate on every resampled axis (double precision, as the CPU reference,
// so nearest rounding agrees exactly) and blends the 2^k corners of the k linear axes.
#include <cstdint>

#include "kiln/backends/cuda/device_util.cuh"

namespace kiln::cuda {
namespace {

__device__ double SourceCoord(int coord, double x, double scale, int64_t in, int64_t out) {
  switch (coord) {
    case 0:  // half_pixel
      return (x + 0.5) / scale - 0.5;
    case 1: {  // half_pixel_symmetric
      double adjustment = static_cast<double>(out) / (scale * static_cast<double>(in));
      double center = static_cast<double>(in) / 2;
      return center * (1 - adjustment) + (x + 0.5) / scale - 0.5;
    }
    case 2:  // pytorch_half_pixel
      return out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
    case 3: {  // align_corners (the unrounded resized length, as ONNX)
      double len = scale * static_cast<double>(in);
      return len <= 1 ? 0.0 : x * static_cast<double>(in - 1) / (len - 1);
    }
    case 4:  // asymmetric
      return x / scale;
    default:  // tf_half_pixel_for_nn
      return (x + 0.5) / scale;
  }
}

__device__ int64_t NearestIndex(int mode, double x) {
  double f = floor(x);
  switch (mode) {
    case 0:  // round_prefer_floor
      return x == f + 0.5 ? static_cast<int64_t>(f) : static_cast<int64_t>(round(x));
    case 1:  // round_prefer_ceil
      return x == f + 0.5 ? static_cast<int64_t>(ceil(x)) : static_cast<int64_t>(round(x));
    case 2:
      return static_cast<int64_t>(f);
    default:
      return static_cast<int64_t>(ceil(x));
  }
}

template <typename T>
__global__ void ResizeKernel(const T* __restrict__ x, T* __restrict__ y, ResizeDesc d, int64_t n) {
  int64_t in_stride[kMaxRank];
  int64_t s = 1;
  for (int a = d.rank - 1; a >= 0; --a) {
    in_stride[a] = s;
    s *= d.in[a];
  }
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t base = 0;
    int64_t lin_lo[kMaxRank], lin_hi[kMaxRank];
    float lin_t[kMaxRank];
    int k = 0;
    int64_t r = i;
    for (int a = d.rank - 1; a >= 0; --a) {
      int64_t o = r % d.out[a];
      r /= d.out[a];
      int64_t in = d.in[a];
      if (in == d.out[a] && d.scale[a] == 1.0) {
        base += o * in_stride[a];
        continue;
      }
      double src = SourceCoord(d.coord, static_cast<double>(o), d.scale[a], in, d.out[a]);
      if (d.mode == 0) {
        int64_t idx = NearestIndex(d.nearest, src);
        idx = idx < 0 ? 0 : (idx > in - 1 ? in - 1 : idx);
        base += idx * in_stride[a];
      } else {
        src =
            src < 0 ? 0.0 : (src > static_cast<double>(in - 1) ? static_cast<double>(in - 1) : src);
        int64_t x0 = static_cast<int64_t>(floor(src));
        int64_t x1 = x0 + 1 < in ? x0 + 1 : in - 1;
        lin_lo[k] = x0 * in_stride[a];
        lin_hi[k] = x1 * in_stride[a];
        lin_t[k] = static_cast<float>(src - static_cast<double>(x0));
        ++k;
      }
    }
    float acc;
    if (k == 0) {
      acc = Load(x[base]);
    } else {
      acc = 0.f;
      for (int corner = 0; corner < (1 << k); ++corner) {
        float w = 1.f;
        int64_t off = base;
        for (int j = 0; j < k; ++j) {
          bool hi = (corner >> j) & 1;
          w *= hi ? lin_t[j] : 1.f - lin_t[j];
          off += hi ? lin_hi[j] : lin_lo[j];
        }
        acc += w * Load(x[off]);
      }
    }
    y[i] = Store<T>(acc);
  }
}

}  // namespace

cudaError_t LaunchResize(Elem t, const ResizeDesc& d, const void* x, void* y, int64_t n,
                         cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchFloat(t, [&](auto tag) {
    using T = decltype(tag);
    ResizeKernel<T>
        <<<GridFor(n), 256, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), d, n);
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda
