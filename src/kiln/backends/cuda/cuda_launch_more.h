// The launch interface of the CUDA kernels for the ops that first ran only on the CPU (variadic
// Sum/Mean/Max/Min, integer Neg/Abs/Sign and Reduce*, IsInf/IsNaN, ArgMax/ArgMin, CumSum, TopK,
// Pad/Tile, GatherElements, ScatterND, OneHot, QuantizeLinear/DequantizeLinear, Einsum). Same
// contract as cuda_launch.h: plain structs by value, no kiln headers, cudaError_t back, enqueue on
// `stream` only.
#pragma once

#include "kiln/backends/cuda/cuda_launch.h"

namespace kiln::cuda {

// Where an index kernel records an out-of-range index (mapped, pinned host memory: the host reads
// it after the stream is done without a copy). Kernels write it with plain stores; when several
// threads hit bad indices, one of them wins, which is enough to name one in the error.
struct IndexFault {
  int64_t index = 0;  // the offending index as given (before adding the axis size)
  int64_t size = 0;   // the size of the axis it indexes
  int32_t hit = 0;    // set last, after a fence
  int32_t pad = 0;
};

// ---- variadic.cu ------------------------------------------------------------------------------
constexpr int kMaxVariadicInputs = 16;
// Sum and Mean, then one per KILN_VARIADIC_OP row of ops/binary_ops.inc (Max, Min).
enum class VariadicOp : int32_t {
  kSum,
  kMean,
#define KILN_BINARY_OP(Name, Types, formula)
#define KILN_VARIADIC_OP(Name, Types, formula) k##Name,
#include "kiln/ops/binary_ops.inc"
#undef KILN_VARIADIC_OP
#undef KILN_BINARY_OP
};
// y (dense over dims) = fold of the inputs with numpy broadcasting; FP32 accumulation for f16/bf16
// (f32 and integers compute in their own type, as the CPU reference). `strides[k][d]` is input k's
// element stride along output dim d (0 where broadcast).
struct VariadicDesc {
  int32_t count = 0;
  int32_t rank = 0;
  bool dense = false;  // every input has the output's dims: element i of each input is i
  int64_t dims[kMaxRank] = {};
  const void* ptr[kMaxVariadicInputs] = {};
  int64_t strides[kMaxVariadicInputs][kMaxRank] = {};
};
cudaError_t LaunchVariadic(VariadicOp op, Elem t, const VariadicDesc& d, void* y, int64_t n,
                           cudaStream_t stream);

// ---- int_unary.cu -----------------------------------------------------------------------------
// One per KILN_INT_UNARY_OP row of ops/unary_ops.inc.
enum class IntUnaryOp : int32_t {
#define KILN_UNARY_OP(Name, formula)
#define KILN_INT_UNARY_OP(Name, formula) k##Name,
#include "kiln/ops/unary_ops.inc"
#undef KILN_INT_UNARY_OP
#undef KILN_UNARY_OP
};
// y = op(x) for i8/i32/i64, n elements, dense.
cudaError_t LaunchIntUnary(IntUnaryOp op, Elem t, const void* x, void* y, int64_t n,
                           cudaStream_t stream);

// ---- reduce_int.cu ----------------------------------------------------------------------------
enum class IntReduceOp : int32_t { kSum, kMean, kMax, kMin, kProd, kSumSquare };
// Each of `outputs` elements (offsets from `kept`, operand 0) reduces the `count` elements at
// offsets `red` (operand 0) from it, in double, truncated to the type (i32/i64; bool as bytes).
cudaError_t LaunchIntReduce(IntReduceOp op, Elem t, const void* x, void* y, const Strided& kept,
                            int64_t outputs, const Strided& red, int64_t count,
                            cudaStream_t stream);

// ---- classify.cu ------------------------------------------------------------------------------
// y (bool) = isnan(x), or isinf(x) restricted to the signs asked for; float storage.
cudaError_t LaunchIsNanInf(Elem t, bool nan, bool detect_positive, bool detect_negative,
                           const void* x, bool* y, int64_t n, cudaStream_t stream);

// ---- arg_reduce.cu ----------------------------------------------------------------------------
// ArgMax/ArgMin of x viewed as [outer, n, inner] over n; ties keep the first index, or the last
// with select_last. Floats and i32/i64.
cudaError_t LaunchArgReduce(Elem t, bool is_max, bool select_last, const void* x, int64_t* y,
                            int64_t outer, int64_t n, int64_t inner, cudaStream_t stream);

// ---- calib_stats.cu ---------------------------------------------------------------------------
// Calibration statistics of n float elements (f32/f16/bf16), accumulated on the device: absmax
// (null: skipped) is one uint32 holding a non-negative float's bits, raised to max |x| (NaN
// skipped, infinities counted); hist (null: skipped) is `bins` counters, each finite |x| adding 1
// to bin floor(|x| * (bins / range)) in double arithmetic, bins - 1 at and past it (range > 0,
// bins <= 12288).
cudaError_t LaunchAbsStats(Elem t, const void* x, int64_t n, uint32_t* absmax,
                           unsigned long long* hist, int bins, double range, cudaStream_t stream);
// y = quantize-dequantize of x as ir/evaluator.h's FakeQuantizeInt8 (in float: x * (1 / scale),
// saturated to [-127, 127] with NaN to 127, rounded half to even, times scale = amax / 127), or
// with e4m3 its FakeQuantizeE4M3 (E4M3(x * (1 / scale)), saturating, NaN kept, times scale =
// amax / 448).
cudaError_t LaunchFakeQuantize(bool e4m3, Elem t, const void* x, void* y, int64_t n, float amax,
                               cudaStream_t stream);

// ---- cumsum.cu --------------------------------------------------------------------------------
// Inclusive or exclusive prefix sums of [outer, n, inner] along n, optionally from the end.
// FP32 accumulation for floats; integers in their own type.
cudaError_t LaunchCumSum(Elem t, bool exclusive, bool reverse, const void* x, void* y,
                         int64_t outer, int64_t n, int64_t inner, cudaStream_t stream);

// ---- topk.cu ----------------------------------------------------------------------------------
// The k largest (or smallest) of [outer, n, inner] along n: values [outer, k, inner] and their
// int64 indices. Order: by value, equal values by lower index (ONNX); sorted = false gives the
// same k elements in index order (as the CPU reference). Floats and i32/i64.
cudaError_t LaunchTopK(Elem t, bool largest, bool sorted, const void* x, void* values,
                       int64_t* indices, int64_t outer, int64_t n, int64_t inner, int64_t k,
                       cudaStream_t stream);

// ---- pad.cu -----------------------------------------------------------------------------------
// Pad (constant, edge, wrap, reflect) and Tile (wrap with no leading pad) as one per-axis index
// map: output coordinate o on axis a reads input coordinate o - begin[a], mapped back into
// [0, in[a]) by the mode, or the fill value (constant mode) where it falls outside.
enum class PadMode : int32_t { kConstant, kEdge, kWrap, kReflect };
struct PadDesc {
  int32_t rank = 0;
  PadMode mode = PadMode::kConstant;
  int64_t in[kMaxRank] = {}, out[kMaxRank] = {};
  // Leading pads per axis, known on the host...
  int64_t begin[kMaxRank] = {};
  // ...or read by the kernel from the device: `pads` (count leading values used) with optional
  // `axes` (null: axes 0..count-1); both of the index type (idx64: int64, else int32).
  const void* pads = nullptr;
  const void* axes = nullptr;
  bool idx64 = true;
  int32_t count = 0;
  const void* fill = nullptr;  // a device scalar of the element type; null: zeros
  // Set by LaunchPad when the output has fewer than 2^31 elements: 32-bit multiply-high division
  // by each out dim (cuda_launch.h's FastDivisor) instead of 64-bit division.
  bool div32 = false;
  uint32_t div_mul[kMaxRank] = {}, div_shift[kMaxRank] = {};
};
cudaError_t LaunchPad(size_t elem_size, const PadDesc& d, const void* x, void* y, int64_t n,
                      cudaStream_t stream);

// ---- scatter_gather.cu ------------------------------------------------------------------------
// GatherElements: out[c] = data[c with c[axis] = indices[c]] over the indices' dims. Out-of-range
// indices give zeros and are recorded in `fault` (null: not recorded).
struct GatherElementsDesc {
  int32_t rank = 0, axis = 0;
  int64_t data_dims[kMaxRank] = {};
  int64_t idx_dims[kMaxRank] = {};
};
cudaError_t LaunchGatherElements(size_t elem_size, const GatherElementsDesc& d, const void* data,
                                 const void* idx, bool idx64, void* out, int64_t n,
                                 IndexFault* fault, cudaStream_t stream);

// ScatterND: out = data, then for each of the q index tuples (depth k) the slice of `slice`
// elements at that tuple is replaced by (or combined with) the update. Reductions use atomics
// (f32/i32/i64); duplicate tuples without reduction race, as ONNX leaves them undefined.
enum class ScatterReduction : int32_t { kNone, kAdd, kMul, kMax, kMin };
struct ScatterNDDesc {
  int32_t k = 0;  // index depth (last dim of indices)
  int64_t q = 0;  // number of index tuples
  int64_t slice = 1;
  int64_t data_dims[kMaxRank] = {};
  int64_t data_strides[kMaxRank] = {};  // element strides of the first k axes
  ScatterReduction reduction = ScatterReduction::kNone;
};
cudaError_t LaunchScatterND(Elem t, const ScatterNDDesc& d, const void* data, const void* idx,
                            bool idx64, const void* updates, void* out, int64_t data_elems,
                            IndexFault* fault, cudaStream_t stream);

// OneHot: y [outer, depth, inner] = values[1] where indices[outer, inner] (any numeric type,
// negative from the end) equals the depth coordinate, else values[0]. Out-of-range indices give
// a row of values[0] (ONNX).
cudaError_t LaunchOneHot(size_t elem_size, Elem idx_t, const void* indices, const void* values,
                         void* y, int64_t outer, int64_t depth, int64_t inner, cudaStream_t stream);

// ---- copy.cu (Gather with its index check) ----------------------------------------------------
// LaunchGather that also records an out-of-range index in `fault` (null: zeros, unrecorded).
cudaError_t LaunchGatherChecked(size_t elem_size, const void* data, const void* idx, bool idx64,
                                void* out, int64_t outer, int64_t axis_n, int64_t inner,
                                int64_t num_idx, IndexFault* fault, cudaStream_t stream);

// ---- quantize.cu ------------------------------------------------------------------------------
// QuantizeLinear / DequantizeLinear parameters: element i uses channel (i / inner) % channels
// (per tensor: channels = 1). A scale or zero point known on the host (a constant, per tensor)
// comes by value; otherwise the kernel reads `channels` elements from the device (scale: float
// storage of scale_t; zero: the quantized type; null zero and zero_value 0 when omitted).
struct QuantDesc {
  int64_t channels = 1, inner = 1;
  const void* scale = nullptr;  // null: scale_value
  Elem scale_t = Elem::kF32;
  float scale_value = 1.f;
  const void* zero = nullptr;  // null: zero_value
  int32_t zero_value = 0;
};
// y = saturate(round_half_even(x / scale) + zero) into i8/u8 (q_t); x in float storage or i32,
// x / scale in FP32, NaN to the zero point. n elements, dense; 4 per thread where aligned.
cudaError_t LaunchQuantize(Elem x_t, Elem q_t, const QuantDesc& d, const void* x, void* y,
                           int64_t n, cudaStream_t stream);
// y = float(q - zero) * scale, q in i8/u8/i32 (q_t; the zero point has the same type), y in
// float storage (y_t), computed in FP32.
cudaError_t LaunchDequantize(Elem q_t, Elem y_t, const QuantDesc& d, const void* q, void* y,
                             int64_t n, cudaStream_t stream);

// ---- einsum.cu --------------------------------------------------------------------------------
// Einsum over a host-made plan (ops/einsum.h): each output element (dense over out_dims, the last
// fastest) sums over red_dims the product of the operands' elements, read through each operand's
// element strides along the output and the summed dims (size-1 dims dropped, runs merged).
// Float storage, every operand and the output of one type; FP32 products and accumulation.
constexpr int kEinsumMaxOperands = 8;
constexpr int kEinsumMaxRank = 12;  // per side: output dims, summed dims
struct EinsumDesc {
  int32_t operands = 0;
  int32_t out_rank = 0, red_rank = 0;
  const void* ptr[kEinsumMaxOperands] = {};
  int64_t out_dims[kEinsumMaxRank] = {};
  int64_t red_dims[kEinsumMaxRank] = {};
  int64_t out_strides[kEinsumMaxOperands][kEinsumMaxRank] = {};
  int64_t red_strides[kEinsumMaxOperands][kEinsumMaxRank] = {};
  int64_t red_size = 1;
};
cudaError_t LaunchEinsum(Elem t, const EinsumDesc& d, void* y, int64_t n, cudaStream_t stream);

}  // namespace kiln::cuda
