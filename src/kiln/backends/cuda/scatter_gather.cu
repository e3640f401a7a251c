// GatherElements, ScatterND and OneHot on CUDA: index-driven moves, one thread per output (or
// per update) element. Out-of-range indices of GatherElements and ScatterND are recorded in the
// caller's IndexFault (index_fault.h) and skipped (zeros for GatherElements, no write for
// ScatterND); ScatterND's reductions combine with compare-and-swap loops, so they serve every
// 4- and 8-byte type the same way.
#include <cstdint>
#include <cstring>

#include "kiln/backends/cuda/cuda_launch_more.h"
#include "kiln/backends/cuda/device_util.cuh"
#include "kiln/backends/cuda/index_fault.cuh"

namespace kiln::cuda {
namespace {

template <typename U, typename I>
__global__ void GatherElementsKernel(const U* __restrict__ data, const I* __restrict__ idx,
                                     U* __restrict__ out, GatherElementsDesc d, int64_t n,
                                     IndexFault* fault) {
  const int64_t axis_n = d.data_dims[d.axis];
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t given = static_cast<int64_t>(idx[i]);
    int64_t k = given < 0 ? given + axis_n : given;
    if (k < 0 || k >= axis_n) {
      out[i] = U{};
      RecordIndexFault(fault, given, axis_n);
      continue;
    }
    int64_t r = i, off = 0, stride = 1;
    for (int a = d.rank - 1; a >= 0; --a) {
      int64_t c = r % d.idx_dims[a];
      r /= d.idx_dims[a];
      off += (a == d.axis ? k : c) * stride;
      stride *= d.data_dims[a];
    }
    out[i] = data[off];
  }
}

// *addr = f(*addr, v) atomically, for 4- and 8-byte T.
template <typename T, typename F>
__device__ void AtomicApply(T* addr, T v, F f) {
  using W = std::conditional_t<sizeof(T) == 4, unsigned int, unsigned long long>;
  W* a = reinterpret_cast<W*>(addr);
  W old = *a, assumed;
  do {
    assumed = old;
    T cur;
    memcpy(&cur, &assumed, sizeof(T));
    T next = f(cur, v);
    W bits;
    memcpy(&bits, &next, sizeof(T));
    old = atomicCAS(a, assumed, bits);
  } while (old != assumed);
}

template <typename T, typename I>
__global__ void ScatterNDKernel(const I* __restrict__ idx, const T* __restrict__ updates,
                                T* __restrict__ out, ScatterNDDesc d, IndexFault* fault) {
  const int64_t n = d.q * d.slice;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t t = e / d.slice, j = e % d.slice;
    int64_t off = 0;
    bool ok = true;
    for (int a = 0; a < d.k; ++a) {
      int64_t given = static_cast<int64_t>(idx[t * d.k + a]);
      int64_t size = d.data_dims[a];
      int64_t c = given < 0 ? given + size : given;
      if (c < 0 || c >= size) {
        RecordIndexFault(fault, given, size);
        ok = false;
        break;
      }
      off += c * d.data_strides[a];
    }
    if (!ok) continue;
    T* dst = out + off + j;
    T u = updates[e];
    if constexpr (sizeof(T) != 4 && sizeof(T) != 8) {
      *dst = u;  // 1- and 2-byte types only ever move (LaunchScatterND)
    } else {
      switch (d.reduction) {
        case ScatterReduction::kNone:
          *dst = u;
          break;
        case ScatterReduction::kAdd:
          AtomicApply(dst, u, [](T a, T b) { return static_cast<T>(a + b); });
          break;
        case ScatterReduction::kMul:
          AtomicApply(dst, u, [](T a, T b) { return static_cast<T>(a * b); });
          break;
        case ScatterReduction::kMax:  // std::max(a, b), as the CPU
          AtomicApply(dst, u, [](T a, T b) { return a < b ? b : a; });
          break;
        case ScatterReduction::kMin:  // std::min(a, b)
          AtomicApply(dst, u, [](T a, T b) { return b < a ? b : a; });
          break;
      }
    }
  }
}

template <typename U, typename I>
__global__ void OneHotKernel(const I* __restrict__ indices, const U* __restrict__ values,
                             U* __restrict__ y, int64_t outer, int64_t depth, int64_t inner) {
  const U off_value = values[0], on_value = values[1];
  int64_t n = outer * depth * inner;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t i = e % inner, r = e / inner;
    int64_t d = r % depth, o = r / depth;
    // Any numeric index type, truncated toward zero as the CPU's cast of the double value.
    int64_t k = static_cast<int64_t>(Load(indices[o * inner + i]));
    if (k < 0) k += depth;
    y[e] = k == d ? on_value : off_value;
  }
}

size_t ElemSize(Elem t) {
  switch (t) {
    case Elem::kF32:
    case Elem::kI32:
      return 4;
    case Elem::kF16:
    case Elem::kBF16:
      return 2;
    case Elem::kI64:
      return 8;
    default:
      return 1;
  }
}

}  // namespace

cudaError_t LaunchGatherElements(size_t elem_size, const GatherElementsDesc& d, const void* data,
                                 const void* idx, bool idx64, void* out, int64_t n,
                                 IndexFault* fault, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (d.rank < 1 || d.rank > kMaxRank || d.axis < 0 || d.axis >= d.rank) {
    return cudaErrorInvalidValue;
  }
  return DispatchBytes(elem_size, [&](auto tag) {
    using U = decltype(tag);
    if (idx64) {
      GatherElementsKernel<U, int64_t><<<GridFor(n), 256, 0, stream>>>(
          static_cast<const U*>(data), static_cast<const int64_t*>(idx), static_cast<U*>(out), d, n,
          fault);
    } else {
      GatherElementsKernel<U, int32_t><<<GridFor(n), 256, 0, stream>>>(
          static_cast<const U*>(data), static_cast<const int32_t*>(idx), static_cast<U*>(out), d, n,
          fault);
    }
    return cudaGetLastError();
  });
}

cudaError_t LaunchScatterND(Elem t, const ScatterNDDesc& d, const void* data, const void* idx,
                            bool idx64, const void* updates, void* out, int64_t data_elems,
                            IndexFault* fault, cudaStream_t stream) {
  if (d.k < 0 || d.k > kMaxRank) return cudaErrorInvalidValue;
  size_t es = ElemSize(t);
  if (out != data && data_elems > 0) {
    cudaError_t err = cudaMemcpyAsync(out, data, static_cast<size_t>(data_elems) * es,
                                      cudaMemcpyDeviceToDevice, stream);
    if (err != cudaSuccess) return err;
  }
  int64_t n = d.q * d.slice;
  if (n == 0) return cudaSuccess;
  auto go = [&](auto tag) {
    using T = decltype(tag);
    if (idx64) {
      ScatterNDKernel<T, int64_t><<<GridFor(n), 256, 0, stream>>>(static_cast<const int64_t*>(idx),
                                                                  static_cast<const T*>(updates),
                                                                  static_cast<T*>(out), d, fault);
    } else {
      ScatterNDKernel<T, int32_t><<<GridFor(n), 256, 0, stream>>>(static_cast<const int32_t*>(idx),
                                                                  static_cast<const T*>(updates),
                                                                  static_cast<T*>(out), d, fault);
    }
    return cudaGetLastError();
  };
  if (d.reduction == ScatterReduction::kNone) {
    // A plain store moves bytes: any type by its size.
    return DispatchBytes(es, go);
  }
  switch (t) {
    case Elem::kF32:
      return go(float{});
    case Elem::kI32:
      return go(int32_t{});
    case Elem::kI64:
      return go(int64_t{});
    default:
      return cudaErrorInvalidValue;  // the provider only offers reductions on these
  }
}

cudaError_t LaunchOneHot(size_t elem_size, Elem idx_t, const void* indices, const void* values,
                         void* y, int64_t outer, int64_t depth, int64_t inner,
                         cudaStream_t stream) {
  int64_t n = outer * depth * inner;
  if (n == 0) return cudaSuccess;
  return DispatchBytes(elem_size, [&](auto vtag) {
    using U = decltype(vtag);
    return DispatchAll(idx_t, [&](auto itag) {
      using I = decltype(itag);
      OneHotKernel<U, I><<<GridFor(n), 256, 0, stream>>>(static_cast<const I*>(indices),
                                                         static_cast<const U*>(values),
                                                         static_cast<U*>(y), outer, depth, inner);
      return cudaGetLastError();
    });
  });
}

}  // namespace kiln::cuda
