// The launch interface between kiln's own CUDA kernels (*.cu) and their providers (*_ops.cc).
// Deliberately free of kiln headers (but the plain op lists, ops/*_ops.inc and binary_ops.h): nvcc
// cannot compile fmt's compile-time format checks, so
// the .cu files see only plain structs passed by value and return cudaError_t; the providers turn
// that into Status. Every launcher enqueues on `stream` only (no allocation, no synchronisation,
// no host reads of device data), so layers can be captured into CUDA graphs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kiln/ops/binary_ops.h"  // plain C++: the binary formulas' types and helpers

namespace kiln::cuda {

// Storage element types (kiln's DataType without the undefined value).
enum class Elem : int32_t { kF32, kF16, kBF16, kI8, kU8, kI32, kI64, kBool };

constexpr int kMaxRank = 8;

// A coalesced iteration space: `rank` output dims (row-major) and, per operand, the element
// stride of each dim in that operand (0 where it is broadcast). Built on the host by
// CoalesceBroadcast so kernels do as few divisions as possible.
struct Strided {
  int32_t rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t strides[3][kMaxRank] = {};
  int64_t offset[3] = {};  // element offset of each operand's first element
  // Set by EnableFastDivision when every index of the space fits in 31 bits: the kernels then
  // split an index into coordinates with 32-bit multiply-high and shift (div_mul, div_shift per
  // dim) instead of 64-bit division, which the GPU emulates in software and which made broadcast
  // and strided copies several times slower than memory bandwidth.
  bool div32 = false;
  uint32_t div_mul[kMaxRank] = {};
  uint32_t div_shift[kMaxRank] = {};
};

// The magic numbers of 32-bit division by d >= 1, for dividends below 2^31: with
// shift = ceil(log2 d) and mul = floor(2^32 (2^shift - d) / d) + 1,
// n / d == (mulhi(n, mul) + n) >> shift (Granlund and Montgomery's round-up method; the sum
// cannot overflow because n < 2^31 and mulhi(n, mul) <= n).
struct FastDivisor {
  uint32_t mul = 1, shift = 0;
};
inline FastDivisor MakeFastDivisor(uint32_t d) {
  FastDivisor f;
  uint32_t s = 0;
  while ((uint64_t{1} << s) < d) ++s;
  f.shift = s;
  f.mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << s) - d)) / d + 1);
  return f;
}
// The host's form of the device division, for tests.
inline uint32_t FastDivide(uint32_t n, FastDivisor f) {
  uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * f.mul) >> 32);
  return (hi + n) >> f.shift;
}
// Fills s's 32-bit division fields when the space has at most 2^31 - 1 indices (`count`) and
// every dim does too; otherwise leaves s.div32 false and the kernels divide in 64 bits.
inline void EnableFastDivision(Strided& s, int64_t count) {
  s.div32 = false;
  if (count <= 0 || count > INT32_MAX) return;
  for (int d = 0; d < s.rank; ++d) {
    if (s.dims[d] <= 0 || s.dims[d] > INT32_MAX) return;
    FastDivisor f = MakeFastDivisor(static_cast<uint32_t>(s.dims[d]));
    s.div_mul[d] = f.mul;
    s.div_shift[d] = f.shift;
  }
  s.div32 = true;
}

// ---- elementwise.cu ---------------------------------------------------------------------------
// One per row of ops/unary_ops.inc, then Not (bool).
enum class UnaryOp : int32_t {
#define KILN_UNARY_OP(Name, formula) k##Name,
#define KILN_INT_UNARY_OP(Name, formula)
#include "kiln/ops/unary_ops.inc"
#undef KILN_INT_UNARY_OP
#undef KILN_UNARY_OP
  kNot
};
struct UnaryParams {
  float alpha = 0, beta = 0, gamma = 0;
  bool tanh_gelu = false;  // Gelu with approximate = "tanh"
};
// y[i] = op(x[i]) for float storage (f32/f16/bf16; kNot on bool). n elements, dense.
cudaError_t LaunchUnary(UnaryOp op, UnaryParams p, Elem t, const void* x, void* y, int64_t n,
                        cudaStream_t stream);
// Clip with optional device scalars lo/hi (nullptr: unbounded); floats and i32/i64.
cudaError_t LaunchClip(Elem t, const void* x, const void* lo, const void* hi, void* y, int64_t n,
                       cudaStream_t stream);

// One per row of ops/binary_ops.inc (variadic rows too: their two-operand form).
enum class BinaryOp : int32_t {
#define KILN_BINARY_OP(Name, Types, formula) k##Name,
#define KILN_VARIADIC_OP(Name, Types, formula) k##Name,
#include "kiln/ops/binary_ops.inc"
#undef KILN_VARIADIC_OP
#undef KILN_BINARY_OP
};
// y = op(a, b) with numpy broadcasting described by `s` (operands 0 = a, 1 = b; the output is
// dense over s.dims). Comparisons write bool. `b_type` is b's type (Pow's may differ); `p` the
// node's attributes. `same_shape` selects the vectorised dense path (a, b and y all dense and of
// n elements).
cudaError_t LaunchBinary(BinaryOp op, BinaryParams p, Elem t, Elem b_type, const void* a,
                         const void* b, void* y, const Strided& s, int64_t n, bool same_shape,
                         cudaStream_t stream);
// out = cond ? x : y (cond bool = operand 0, x = 1, y = 2), any element size.
cudaError_t LaunchWhere(size_t elem_size, const void* cond, const void* x, const void* y, void* out,
                        const Strided& s, int64_t n, cudaStream_t stream);
// Any dtype pair (f16/bf16 round to nearest even; float -> int truncates, NaN/out of range -> 0).
cudaError_t LaunchCast(Elem from, Elem to, const void* x, void* y, int64_t n, cudaStream_t stream);

// ---- norm.cu ----------------------------------------------------------------------------------
// LayerNormalization over rows of length n; scale/bias have n elements (or are null); mean and
// inv_std (f32, rows elements) are optional outputs.
cudaError_t LaunchLayerNorm(Elem t, Elem param_t, const void* x, const void* scale,
                            const void* bias, void* y, float* mean, float* inv_std, int64_t rows,
                            int64_t n, float epsilon, cudaStream_t stream);
// LayerNormalization of s = x + skip (skip null: s = x) over rows of length n, every operand of
// type t; scale/bias have n elements (or are null); sum (null: not written) receives s. A row is
// kept in registers and moved with 16-byte loads when n is a multiple of 16 bytes' elements, the
// pointers are 16-byte aligned and the row fits (four 16-byte vectors per thread, up to 1024
// threads per row: 32768 halves or 16384 floats); otherwise a warp or block per row re-reads it.
// FP32 statistics, two-pass variance. yq (null: not written) receives y quantized, one byte per
// element, from y rounded to t, for an INT8 or FP8 edge or copy (ops/quant_edge.h): as int8 by
// the INT8 contract (times yq_inv_scale, saturated to [-127, 127], rounded half to even) or, with
// yq_e4m3, as E4M3 by the FP8 contract (times yq_inv_scale, saturated to +-448); y may then be
// null (not written).
cudaError_t LaunchSkipLayerNorm(Elem t, const void* x, const void* skip, const void* scale,
                                const void* bias, void* y, void* sum, int64_t rows, int64_t n,
                                float epsilon, cudaStream_t stream, void* yq = nullptr,
                                float yq_inv_scale = 1.f, bool yq_e4m3 = false);
// RMSNormalization over rows of length n: y = s * rsqrt(mean(s^2) + epsilon) * scale with
// s = x + skip (skip null: s = x), scale of n elements, every operand of type t; sum (null: not
// written, and always null without skip) receives s. FP32 statistics over the FP32 sum; 16-byte
// loads when n and the pointers allow.
cudaError_t LaunchRmsNorm(Elem t, const void* x, const void* skip, const void* scale, void* y,
                          void* sum, int64_t rows, int64_t n, float epsilon, cudaStream_t stream);
// RotaryEmbedding (rotary.cu): x and y are [rows, d] (d even); row r of x splits over the leading
// dims `dims` (rank of them, innermost last), and cos's (sin's) row starts at the sum of those
// coordinates times cos_strides (sin_strides), its elements `cos_step` apart (1, or 0 when cos
// broadcasts along the row). Strides are in elements.
struct RotaryGeometry {
  int64_t rows = 0, d = 0;
  int64_t ld = 0;  // elements between rows of x and y (d, or more for partial rotary); 0: d
  int32_t rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t cos_strides[kMaxRank] = {};
  int64_t sin_strides[kMaxRank] = {};
  int64_t cos_step = 1, sin_step = 1;
};
// y = x * cos + rotate(x) * sin over the first d elements of each row (rows ld apart): rotate-half
// (interleaved false) or pairs (2i, 2i + 1). Elements d..ld of a row are not touched.
cudaError_t LaunchRotary(Elem t, bool interleaved, const void* x, const void* cos_t,
                         const void* sin_t, void* y, const RotaryGeometry& g, cudaStream_t stream);
// Softmax / LogSoftmax over the middle axis of [outer, n, inner].
cudaError_t LaunchSoftmax(Elem t, bool log, const void* x, void* y, int64_t outer, int64_t n,
                          int64_t inner, cudaStream_t stream);
// Inference BatchNormalization; channel of element i is (i / inner) % channels (NCHW: inner =
// H*W; NHWC: inner = 1).
cudaError_t LaunchBatchNorm(Elem t, Elem param_t, const void* x, const void* scale,
                            const void* bias, const void* mean, const void* var, void* y, int64_t n,
                            int64_t channels, int64_t inner, float epsilon, cudaStream_t stream);

// ---- pool.cu ----------------------------------------------------------------------------------
struct PoolDesc {
  int64_t n = 1, c = 1, ih = 1, iw = 1, oh = 1, ow = 1;
  int32_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1, ph = 0, pw = 0, peh = 0, pew = 0;
  bool is_max = true, count_include_pad = false, nhwc = false;
};
cudaError_t LaunchPool(Elem t, const PoolDesc& d, const void* x, void* y, cudaStream_t stream);
// Global pooling: NCHW reduces `size` contiguous elements per plane (planes = N*C); NHWC reduces
// `size` = H*W rows of C for each of n images (planes = N*C too, channels = C), splitting the rows
// over blocks with FP32 partials in the workspace (GlobalPoolNhwcWorkspace bytes; with less, fewer
// splits). Results do not depend on the split.
cudaError_t LaunchGlobalPool(Elem t, bool is_max, bool nhwc, const void* x, void* y, int64_t planes,
                             int64_t channels, int64_t size, void* workspace,
                             size_t workspace_bytes, cudaStream_t stream);
size_t GlobalPoolNhwcWorkspace(int64_t n, int64_t channels, int64_t rows);

// ---- reduce.cu --------------------------------------------------------------------------------
enum class ReduceOp : int32_t { kSum, kMean, kMax, kMin, kProd, kSumSquare, kL2, kLogSumExp };
// Reduces x viewed as [outer, n, inner] over n (the builder's usual case: adjacent axes).
cudaError_t LaunchReduce(ReduceOp op, Elem t, const void* x, void* y, int64_t outer, int64_t n,
                         int64_t inner, cudaStream_t stream);
// General case: each output element (kept dims/strides in `kept`, operand 0) reduces over the
// `red` dims/strides (operand 0).
cudaError_t LaunchReduceStrided(ReduceOp op, Elem t, const void* x, void* y, const Strided& kept,
                                int64_t outputs, const Strided& red, int64_t count,
                                cudaStream_t stream);

// ---- resize.cu --------------------------------------------------------------------------------
struct ResizeDesc {
  int32_t rank = 0;
  int64_t in[kMaxRank] = {}, out[kMaxRank] = {};
  double scale[kMaxRank] = {};
  int32_t mode = 0;             // 0 nearest, 1 linear, 2 cubic
  int32_t coord = 0;            // kiln's Coord enum order (resize_ops.cc)
  int32_t nearest = 0;          // kiln's Nearest enum order
  float cubic_a = -0.75f;       // cubic_coeff_a
  int32_t exclude_outside = 0;  // cubic: taps outside the input get weight 0, the rest renormalised
};
cudaError_t LaunchResize(Elem t, const ResizeDesc& d, const void* x, void* y, int64_t n,
                         cudaStream_t stream);

// ---- copy.cu ----------------------------------------------------------------------------------
// out (dense over s.dims) = in[offset + sum coord * stride] (operand 0). Transpose, Expand,
// constant Slice. Elements of elem_size bytes (1, 2, 4, 8).
cudaError_t LaunchStridedCopy(size_t elem_size, const void* in, void* out, const Strided& s,
                              int64_t n, cudaStream_t stream);
// Slice whose starts/ends/axes/steps live on the device (computed at run time): each block
// derives the per-axis start and step from them, with ONNX clamping.
struct DeviceSliceArgs {
  const void* starts = nullptr;
  const void* axes = nullptr;   // null: 0..count-1
  const void* steps = nullptr;  // null: all 1
  bool idx64 = true;            // the index inputs' type (int64 or int32), all the same
  int32_t count = 0;
};
cudaError_t LaunchDeviceSlice(size_t elem_size, const void* in, void* out, int32_t rank,
                              const int64_t* in_dims, const int64_t* out_dims,
                              const DeviceSliceArgs& a, int64_t n, cudaStream_t stream);

constexpr int kMaxConcatParts = 32;
// Concat (gather) or Split (scatter) of up to kMaxConcatParts parts along one axis; the tensor is
// [outer, total] bytes and part p covers bytes [begin[p], begin[p] + size[p]) of each row.
struct ConcatDesc {
  int32_t parts = 0;
  const void* ptr[kMaxConcatParts] = {};
  int64_t begin[kMaxConcatParts] = {};  // byte offset within a row of the concatenated tensor
  int64_t size[kMaxConcatParts] = {};   // bytes per row of part p
  // Bytes from one row of part p to the next in its buffer: 0 is size[p] (a dense part). A part
  // that is a range of a larger tensor along the axis (ConcatSlices) has ptr at the range's start
  // and the whole tensor's row here.
  int64_t stride[kMaxConcatParts] = {};
};
cudaError_t LaunchConcat(const ConcatDesc& d, void* out, int64_t outer, int64_t row_bytes,
                         cudaStream_t stream);
cudaError_t LaunchSplit(const ConcatDesc& d, const void* in, int64_t outer, int64_t row_bytes,
                        cudaStream_t stream);

// Gather along an axis: data [outer, axis_n, inner] (elements of elem_size), indices (i32/i64,
// negative from the end; out of range gives zeros), out [outer, num_idx, inner].
cudaError_t LaunchGather(size_t elem_size, const void* data, const void* idx, bool idx64, void* out,
                         int64_t outer, int64_t axis_n, int64_t inner, int64_t num_idx,
                         cudaStream_t stream);

// Trilu over the last two axes: k from a device scalar (null: 0).
cudaError_t LaunchTrilu(size_t elem_size, bool upper, const void* x, const void* k, bool k64,
                        void* y, int64_t mats, int64_t rows, int64_t cols, cudaStream_t stream);

// Fills n elements of elem_size bytes with `value` (the first elem_size bytes are used).
cudaError_t LaunchFill(size_t elem_size, uint64_t value, void* y, int64_t n, cudaStream_t stream);
// Writes up to kMaxRank int64 values (Shape's dims) held by value.
struct Int64Values {
  int32_t count = 0;
  int64_t v[kMaxRank] = {};
};
cudaError_t LaunchWriteInt64(const Int64Values& values, int64_t* y, cudaStream_t stream);
// Range: y[i] = start + i * delta with start/delta device scalars (f32, i32, i64).
cudaError_t LaunchRange(Elem t, const void* start, const void* delta, void* y, int64_t n,
                        cudaStream_t stream);

}  // namespace kiln::cuda
