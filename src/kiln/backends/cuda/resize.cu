// Resize on CUDA, nearest, (multi-)linear and cubic, any rank up to 8: one thread per output
// element computes its source coordinate on every resampled axis (double precision, as the CPU
// reference, so nearest rounding agrees exactly) and blends the taps^k corners of the k linear
// (2 taps) or cubic (4 taps) axes. Cubic is limited to 3 resampled axes (64 corners) by the
// provider.
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

// Keys' cubic convolution weight at distance d (the CPU reference's formula).
__device__ double CubicCoeff(double a, double d) {
  d = fabs(d);
  if (d <= 1) return ((a + 2) * d - (a + 3)) * d * d + 1;
  if (d < 2) return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a;
  return 0.0;
}

template <typename T>
__global__ void ResizeKernel(const T* __restrict__ x, T* __restrict__ y, ResizeDesc d, int64_t n) {
  int64_t in_stride[kMaxRank];
  int64_t s = 1;
  for (int a = d.rank - 1; a >= 0; --a) {
    in_stride[a] = s;
    s *= d.in[a];
  }
  // Linear axes blend 2 taps, cubic axes 4; nearest and untouched axes fold into `base`.
  const int taps = d.mode == 2 ? 4 : 2;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t base = 0;
    int64_t tap_off[kMaxRank][4];
    float tap_w[kMaxRank][4];
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
      } else if (d.mode == 1) {
        src =
            src < 0 ? 0.0 : (src > static_cast<double>(in - 1) ? static_cast<double>(in - 1) : src);
        int64_t x0 = static_cast<int64_t>(floor(src));
        int64_t x1 = x0 + 1 < in ? x0 + 1 : in - 1;
        float t = static_cast<float>(src - static_cast<double>(x0));
        tap_off[k][0] = x0 * in_stride[a];
        tap_off[k][1] = x1 * in_stride[a];
        tap_w[k][0] = 1.f - t;
        tap_w[k][1] = t;
        ++k;
      } else {
        // Cubic: 4 taps around floor(src), clamped to the edge (no clamp of src itself, as the
        // CPU); exclude_outside zeroes the taps outside and renormalises.
        int64_t x0 = static_cast<int64_t>(floor(src));
        double t = src - static_cast<double>(x0);
        double w[4], sum = 0;
        for (int j = 0; j < 4; ++j) {
          int64_t at = x0 - 1 + j;
          w[j] = CubicCoeff(d.cubic_a, t + 1 - j);
          if (d.exclude_outside && (at < 0 || at >= in)) w[j] = 0;
          sum += w[j];
          at = at < 0 ? 0 : (at > in - 1 ? in - 1 : at);
          tap_off[k][j] = at * in_stride[a];
        }
        for (int j = 0; j < 4; ++j) {
          tap_w[k][j] = static_cast<float>(d.exclude_outside && sum != 0 ? w[j] / sum : w[j]);
        }
        ++k;
      }
    }
    float acc;
    if (k == 0) {
      acc = Load(x[base]);
    } else {
      int corners = 1;
      for (int j = 0; j < k; ++j) corners *= taps;
      acc = 0.f;
      for (int corner = 0; corner < corners; ++corner) {
        float w = 1.f;
        int64_t off = base;
        int c = corner;
        for (int j = 0; j < k; ++j) {
          int tap = c % taps;
          c /= taps;
          w *= tap_w[j][tap];
          off += tap_off[j][tap];
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
