// Data-movement kernels on CUDA: strided copies (Transpose, Expand, Slice), Slice with run-time
// bounds, Concat/Split in one launch, Gather, Trilu, fills (ConstantOfShape, Shape) and Range.
// Copies move the widest unit (up to 16 bytes) that the sizes, offsets and pointers allow.
#include <cstdint>
#include <cstring>

#include "kiln/backends/cuda/device_util.cuh"
#include "kiln/backends/cuda/index_fault.cuh"

namespace kiln::cuda {
namespace {

inline bool AlignedTo(const void* p, size_t w) { return reinterpret_cast<uintptr_t>(p) % w == 0; }

template <typename U>
__global__ void StridedCopyKernel(const U* __restrict__ in, U* __restrict__ out, Strided s,
                                  int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t off;
    StridedOffsets<1>(s, i, &off);
    out[i] = in[off];
  }
}

template <typename F>
cudaError_t DispatchUnit(size_t w, F&& f) {
  switch (w) {
    case 16:
      return f(uint4{});
    default:
      return DispatchBytes(w, f);
  }
}

// The slice bounds of up to kMaxRank axes, computed by one thread per block from device inputs.
template <typename I>
__device__ void DeriveSlice(const DeviceSliceArgs& a, int32_t rank, const int64_t* in_dims,
                            const int64_t* out_dims, int64_t* start, int64_t* step) {
  for (int d = 0; d < rank; ++d) {
    start[d] = 0;
    step[d] = 1;
  }
  for (int i = 0; i < a.count; ++i) {
    int64_t ax = a.axes ? static_cast<int64_t>(static_cast<const I*>(a.axes)[i]) : i;
    if (ax < 0) ax += rank;
    if (ax < 0 || ax >= rank) continue;
    int64_t n = in_dims[ax];
    int64_t st = a.steps ? static_cast<int64_t>(static_cast<const I*>(a.steps)[i]) : 1;
    int64_t s = static_cast<int64_t>(static_cast<const I*>(a.starts)[i]);
    if (s < 0) s += n;
    if (st > 0) {
      s = s < 0 ? 0 : (s > n ? n : s);
    } else {
      s = s < 0 ? 0 : (s > n - 1 ? n - 1 : s);
    }
    if (st == 0) st = 1;  // invalid (ONNX forbids it); the build-time shape rule rejects it
    start[ax] = s;
    step[ax] = st;
  }
}

template <typename U>
__global__ void DeviceSliceKernel(const U* __restrict__ in, U* __restrict__ out, int32_t rank,
                                  Int64Values in_dims, Int64Values out_dims, DeviceSliceArgs a,
                                  int64_t n) {
  __shared__ int64_t start[kMaxRank], step[kMaxRank], stride[kMaxRank];
  if (threadIdx.x == 0) {
    if (a.idx64) {
      DeriveSlice<int64_t>(a, rank, in_dims.v, out_dims.v, start, step);
    } else {
      DeriveSlice<int32_t>(a, rank, in_dims.v, out_dims.v, start, step);
    }
    int64_t s = 1;
    for (int d = rank - 1; d >= 0; --d) {
      stride[d] = s;
      s *= in_dims.v[d];
    }
  }
  __syncthreads();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t r = i, off = 0;
    bool inside = true;
    for (int d = rank - 1; d >= 0; --d) {
      int64_t c = r % out_dims.v[d];
      r /= out_dims.v[d];
      int64_t src = start[d] + c * step[d];
      // Run-time bounds that disagree with the output shape must not read outside the input
      // (the host cannot check them without a read): such elements become zeros.
      inside = inside && src >= 0 && src < in_dims.v[d];
      off += src * stride[d];
    }
    out[i] = inside ? in[off] : U{};
  }
}

// Concat (kGather) or Split: part p holds `size` units of each row starting at unit `begin`.
template <typename U, bool kConcat>
__global__ void ConcatKernel(ConcatDesc d, U* __restrict__ whole, int64_t outer, int64_t row_units,
                             FastDivisor rows) {
  int64_t n = outer * row_units;
  const bool div32 = n <= INT32_MAX;  // FastDivide's range (the host made `rows` for row_units)
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t row, col;
    if (div32) {
      const uint32_t u = static_cast<uint32_t>(i);
      const uint32_t q = (__umulhi(u, rows.mul) + u) >> rows.shift;
      row = q;
      col = static_cast<int64_t>(u - q * static_cast<uint32_t>(row_units));
    } else {
      row = i / row_units;
      col = i % row_units;
    }
    int p = 0;
    while (p + 1 < d.parts && col >= d.begin[p + 1]) ++p;
    int64_t local = row * d.stride[p] + (col - d.begin[p]);
    if constexpr (kConcat) {
      whole[i] = static_cast<const U*>(d.ptr[p])[local];
    } else {
      static_cast<U*>(const_cast<void*>(d.ptr[p]))[local] = whole[i];
    }
  }
}

template <typename U, typename I>
__global__ void GatherKernel(const U* __restrict__ data, const I* __restrict__ idx,
                             U* __restrict__ out, int64_t outer, int64_t axis_n, int64_t inner,
                             int64_t num_idx, IndexFault* fault) {
  int64_t n = outer * num_idx * inner;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t in_i = i % inner, r = i / inner;
    int64_t j = r % num_idx, o = r / num_idx;
    int64_t k = static_cast<int64_t>(idx[j]);
    if (k < 0) k += axis_n;
    if (k < 0 || k >= axis_n) {
      // Out of range: zeros, and the index is recorded for the layer's check (index_fault.h).
      out[i] = U{};
      RecordIndexFault(fault, static_cast<int64_t>(idx[j]), axis_n);
    } else {
      out[i] = data[(o * axis_n + k) * inner + in_i];
    }
  }
}

template <typename U>
__global__ void TriluKernel(const U* __restrict__ x, const void* k_ptr, bool k64, bool upper,
                            U* __restrict__ y, int64_t mats, int64_t rows, int64_t cols) {
  int64_t k = 0;
  if (k_ptr) {
    k = k64 ? *static_cast<const int64_t*>(k_ptr)
            : static_cast<int64_t>(*static_cast<const int32_t*>(k_ptr));
  }
  int64_t n = mats * rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t c = i % cols, r = (i / cols) % rows;
    bool keep = upper ? c - r >= k : c - r <= k;
    y[i] = keep ? x[i] : U{};
  }
}

template <typename U>
__global__ void FillKernel(U value, U* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] = value;
  }
}

__global__ void WriteInt64Kernel(Int64Values v, int64_t* y) {
  if (threadIdx.x < v.count) y[threadIdx.x] = v.v[threadIdx.x];
}

template <typename T>
__global__ void RangeKernel(const T* start, const T* delta, T* __restrict__ y, int64_t n) {
  // Halves compute in float (ONNX's stash_type 1), as the CPU kernel does through its float
  // wrapper; the float product and sum are rounded separately (no FMA), as on the CPU.
  using C = typename Compute<T>::type;
  const C s = Load(*start), d = Load(*delta);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<C, float>) {
      y[i] = Store<T>(__fadd_rn(s, __fmul_rn(static_cast<float>(i), d)));
    } else {
      y[i] = Store<T>(s + static_cast<C>(i) * d);
    }
  }
}

// A batched 2-D transpose through a shared-memory tile: reads along the input-contiguous axis A
// and writes along the output-contiguous axis B, so both sides are coalesced (NCHW <-> NHWC).
struct TileDesc {
  int64_t a = 1, b = 1;  // sizes of A (input stride 1) and B (output stride 1)
  int64_t in_sb = 0;     // input stride of B
  int64_t out_sa = 0;    // output stride of A
  int32_t batch_rank = 0;
  int64_t batch_dims[kMaxRank] = {}, batch_in[kMaxRank] = {}, batch_out[kMaxRank] = {};
  int64_t batches = 1, in_offset = 0;
};

constexpr int kTile = 32;

template <typename U>
__global__ void TiledTransposeKernel(const U* __restrict__ in, U* __restrict__ out, TileDesc d) {
  __shared__ U tile[kTile][kTile + 1];  // +1: no bank conflicts on the transposed read
  int64_t tiles_b = (d.b + kTile - 1) / kTile, tiles_a = (d.a + kTile - 1) / kTile;
  int64_t tiles = tiles_a * tiles_b * d.batches;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    int64_t tb = t % tiles_b, r = t / tiles_b;
    int64_t ta = r % tiles_a, batch = r / tiles_a;
    int64_t in_base = d.in_offset, out_base = 0;
    for (int k = d.batch_rank - 1; k >= 0; --k) {
      int64_t c = batch % d.batch_dims[k];
      batch /= d.batch_dims[k];
      in_base += c * d.batch_in[k];
      out_base += c * d.batch_out[k];
    }
    int64_t a0 = ta * kTile, b0 = tb * kTile;
    for (int j = threadIdx.y; j < kTile; j += blockDim.y) {
      int64_t a = a0 + threadIdx.x, b = b0 + j;
      if (a < d.a && b < d.b) tile[j][threadIdx.x] = in[in_base + a + b * d.in_sb];
    }
    __syncthreads();
    for (int j = threadIdx.y; j < kTile; j += blockDim.y) {
      int64_t b = b0 + threadIdx.x, a = a0 + j;
      if (a < d.a && b < d.b) out[out_base + a * d.out_sa + b] = tile[threadIdx.x][j];
    }
    __syncthreads();
  }
}

// The tiled plan when the copy is a (batched) transpose of two large enough axes.
bool PlanTiled(const Strided& s, TileDesc& d) {
  int last = s.rank - 1;
  if (last < 1 || s.strides[0][last] == 1) return false;
  int j0 = -1;
  for (int j = 0; j < last; ++j) {
    if (s.strides[0][j] == 1) j0 = j;
  }
  if (j0 < 0 || s.dims[j0] < 8 || s.dims[last] < 8) return false;
  int64_t out_stride[kMaxRank];
  int64_t st = 1;
  for (int j = last; j >= 0; --j) {
    out_stride[j] = st;
    st *= s.dims[j];
  }
  d.a = s.dims[j0];
  d.b = s.dims[last];
  d.in_sb = s.strides[0][last];
  d.out_sa = out_stride[j0];
  d.in_offset = s.offset[0];
  d.batch_rank = 0;
  d.batches = 1;
  for (int j = 0; j < last; ++j) {
    if (j == j0) continue;
    d.batch_dims[d.batch_rank] = s.dims[j];
    d.batch_in[d.batch_rank] = s.strides[0][j];
    d.batch_out[d.batch_rank] = out_stride[j];
    d.batches *= s.dims[j];
    ++d.batch_rank;
  }
  return true;
}

}  // namespace

cudaError_t LaunchStridedCopy(size_t elem_size, const void* in, void* out, const Strided& s0,
                              int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  Strided s = s0;
  size_t es = elem_size;
  // Widen the unit when the innermost dim is contiguous and everything lines up.
  int last = s.rank - 1;
  if (last >= 0 && s.strides[0][last] == 1) {
    for (size_t w : {size_t{16}, size_t{8}, size_t{4}}) {
      if (w <= es) break;
      size_t f = w / es;
      bool ok =
          AlignedTo(in, w) && AlignedTo(out, w) && s.dims[last] % f == 0 && s.offset[0] % f == 0;
      for (int d = 0; d < last && ok; ++d) ok = s.strides[0][d] % static_cast<int64_t>(f) == 0;
      if (!ok) continue;
      s.dims[last] /= f;
      for (int d = 0; d < last; ++d) s.strides[0][d] /= f;
      s.offset[0] /= f;
      n /= f;
      es = w;
      break;
    }
  }
  EnableFastDivision(s, n);
  TileDesc tiled;
  if (es <= 8 && PlanTiled(s, tiled)) {
    int64_t tiles =
        ((tiled.a + kTile - 1) / kTile) * ((tiled.b + kTile - 1) / kTile) * tiled.batches;
    unsigned blocks = static_cast<unsigned>(tiles < 132 * 16 ? tiles : 132 * 16);
    return DispatchBytes(es, [&](auto tag) {
      using U = decltype(tag);
      TiledTransposeKernel<U><<<blocks, dim3(kTile, 8), 0, stream>>>(static_cast<const U*>(in),
                                                                     static_cast<U*>(out), tiled);
      return cudaGetLastError();
    });
  }
  return DispatchUnit(es, [&](auto tag) {
    using U = decltype(tag);
    StridedCopyKernel<U>
        <<<GridFor(n), 256, 0, stream>>>(static_cast<const U*>(in), static_cast<U*>(out), s, n);
    return cudaGetLastError();
  });
}

cudaError_t LaunchDeviceSlice(size_t elem_size, const void* in, void* out, int32_t rank,
                              const int64_t* in_dims, const int64_t* out_dims,
                              const DeviceSliceArgs& a, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (rank > kMaxRank) return cudaErrorInvalidValue;
  Int64Values ind, outd;
  ind.count = outd.count = rank;
  for (int d = 0; d < rank; ++d) {
    ind.v[d] = in_dims[d];
    outd.v[d] = out_dims[d];
  }
  return DispatchBytes(elem_size, [&](auto tag) {
    using U = decltype(tag);
    DeviceSliceKernel<U><<<GridFor(n), 256, 0, stream>>>(
        static_cast<const U*>(in), static_cast<U*>(out), rank, ind, outd, a, n);
    return cudaGetLastError();
  });
}

namespace {
// The widest unit dividing every part's row bytes and offsets, with every pointer aligned.
size_t ConcatUnit(const ConcatDesc& d, const void* whole, int64_t row_bytes) {
  for (size_t w : {size_t{16}, size_t{8}, size_t{4}, size_t{2}}) {
    bool ok = AlignedTo(whole, w) && row_bytes % static_cast<int64_t>(w) == 0;
    for (int p = 0; p < d.parts && ok; ++p) {
      ok = AlignedTo(d.ptr[p], w) && d.begin[p] % static_cast<int64_t>(w) == 0 &&
           d.size[p] % static_cast<int64_t>(w) == 0 && d.stride[p] % static_cast<int64_t>(w) == 0;
    }
    if (ok) return w;
  }
  return 1;
}

template <bool kConcat>
cudaError_t ConcatOrSplit(const ConcatDesc& d0, void* whole, int64_t outer, int64_t row_bytes,
                          cudaStream_t stream) {
  if (outer * row_bytes == 0) return cudaSuccess;
  ConcatDesc d = d0;
  for (int p = 0; p < d.parts; ++p) {
    if (d.stride[p] == 0) d.stride[p] = d.size[p];
  }
  size_t w = ConcatUnit(d, whole, row_bytes);
  for (int p = 0; p < d.parts; ++p) {
    d.begin[p] /= static_cast<int64_t>(w);
    d.size[p] /= static_cast<int64_t>(w);
    d.stride[p] /= static_cast<int64_t>(w);
  }
  int64_t row_units = row_bytes / static_cast<int64_t>(w);
  FastDivisor rows;
  if (row_units <= INT32_MAX) rows = MakeFastDivisor(static_cast<uint32_t>(row_units));
  return DispatchUnit(w, [&](auto tag) {
    using U = decltype(tag);
    ConcatKernel<U, kConcat><<<GridFor(outer * row_units), 256, 0, stream>>>(
        d, static_cast<U*>(whole), outer, row_units, rows);
    return cudaGetLastError();
  });
}
}  // namespace

cudaError_t LaunchConcat(const ConcatDesc& d, void* out, int64_t outer, int64_t row_bytes,
                         cudaStream_t stream) {
  return ConcatOrSplit<true>(d, out, outer, row_bytes, stream);
}
cudaError_t LaunchSplit(const ConcatDesc& d, const void* in, int64_t outer, int64_t row_bytes,
                        cudaStream_t stream) {
  return ConcatOrSplit<false>(d, const_cast<void*>(in), outer, row_bytes, stream);
}

cudaError_t LaunchGather(size_t elem_size, const void* data, const void* idx, bool idx64, void* out,
                         int64_t outer, int64_t axis_n, int64_t inner, int64_t num_idx,
                         cudaStream_t stream) {
  return LaunchGatherChecked(elem_size, data, idx, idx64, out, outer, axis_n, inner, num_idx,
                             nullptr, stream);
}

cudaError_t LaunchGatherChecked(size_t elem_size, const void* data, const void* idx, bool idx64,
                                void* out, int64_t outer, int64_t axis_n, int64_t inner,
                                int64_t num_idx, IndexFault* fault, cudaStream_t stream) {
  int64_t n = outer * num_idx * inner;
  if (n == 0) return cudaSuccess;
  size_t es = elem_size;
  for (size_t w : {size_t{16}, size_t{8}, size_t{4}}) {
    if (w <= es) break;
    if ((inner * static_cast<int64_t>(es)) % static_cast<int64_t>(w) == 0 && AlignedTo(data, w) &&
        AlignedTo(out, w)) {
      inner = inner * static_cast<int64_t>(es) / static_cast<int64_t>(w);
      es = w;
      break;
    }
  }
  n = outer * num_idx * inner;
  return DispatchUnit(es, [&](auto tag) {
    using U = decltype(tag);
    if (idx64) {
      GatherKernel<U, int64_t><<<GridFor(n), 256, 0, stream>>>(
          static_cast<const U*>(data), static_cast<const int64_t*>(idx), static_cast<U*>(out),
          outer, axis_n, inner, num_idx, fault);
    } else {
      GatherKernel<U, int32_t><<<GridFor(n), 256, 0, stream>>>(
          static_cast<const U*>(data), static_cast<const int32_t*>(idx), static_cast<U*>(out),
          outer, axis_n, inner, num_idx, fault);
    }
    return cudaGetLastError();
  });
}

cudaError_t LaunchTrilu(size_t elem_size, bool upper, const void* x, const void* k, bool k64,
                        void* y, int64_t mats, int64_t rows, int64_t cols, cudaStream_t stream) {
  int64_t n = mats * rows * cols;
  if (n == 0) return cudaSuccess;
  return DispatchBytes(elem_size, [&](auto tag) {
    using U = decltype(tag);
    TriluKernel<U><<<GridFor(n), 256, 0, stream>>>(static_cast<const U*>(x), k, k64, upper,
                                                   static_cast<U*>(y), mats, rows, cols);
    return cudaGetLastError();
  });
}

cudaError_t LaunchFill(size_t elem_size, uint64_t value, void* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return DispatchBytes(elem_size, [&](auto tag) {
    using U = decltype(tag);
    U v;
    memcpy(&v, &value, sizeof(U));  // little endian: the first elem_size bytes
    FillKernel<U><<<GridFor(n), 256, 0, stream>>>(v, static_cast<U*>(y), n);
    return cudaGetLastError();
  });
}

cudaError_t LaunchWriteInt64(const Int64Values& values, int64_t* y, cudaStream_t stream) {
  if (values.count == 0) return cudaSuccess;
  WriteInt64Kernel<<<1, 32, 0, stream>>>(values, y);
  return cudaGetLastError();
}

cudaError_t LaunchRange(Elem t, const void* start, const void* delta, void* y, int64_t n,
                        cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  auto go = [&](auto tag) {
    using T = decltype(tag);
    RangeKernel<T><<<GridFor(n), 256, 0, stream>>>(
        static_cast<const T*>(start), static_cast<const T*>(delta), static_cast<T*>(y), n);
    return cudaGetLastError();
  };
  switch (t) {
    case Elem::kF32:
      return go(float{});
    case Elem::kF16:
      return go(__half{});
    case Elem::kBF16:
      return go(__nv_bfloat16{});
    case Elem::kI32:
      return go(int32_t{});
    case Elem::kI64:
      return go(int64_t{});
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kiln::cuda
