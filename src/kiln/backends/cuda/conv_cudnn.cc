// Conv, FusedConv and ConvTranspose on CUDA through cuDNN 9's backend (graph) API.
//
// A layer is an operation graph: CONVOLUTION_FORWARD (ConvTranspose: CONVOLUTION_BACKWARD_DATA)
// followed, for FusedConv, by POINTWISE ops for the bias add, the residual add and the
// activation, all in FP32 (compute type FLOAT: f16/bf16 accumulate in FP32; f32 engines that
// would use TF32 tensor cores are skipped so results match the CPU). The heuristic's engine
// configurations (mode A, then B, then the fallback list) become tactics, best first; a tactic
// stores the engine's global index and knob choices in TacticConfig.params, so an engine file
// rebuilds exactly that plan. When no engine runs the fused graph, the tactic runs the
// convolution alone and kiln's epilogue kernel (conv_cudnn_epilogue.cu) applies the rest.
//
// Layouts: ONNX's NCHW, and NHWC for nodes the layout pass tagged kiln_layout = "NHWC" (where
// tensor cores want it); NHWC weights are transposed to KRSC once, at Create, into memory the
// kernel owns. Plans are finalized in Create/Prepare (cached per shape), never in Run; Run is one
// cudnnBackendExecute with a prebuilt variant pack on the caller's stream (capturable).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>

#include "kiln/backends/cuda/conv_cudnn.h"
#include "kiln/backends/cuda/cuda_common.h"
#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/backends/cuda/cuda_launch.h"
#include "kiln/backends/kernel.h"
#include "kiln/core/blob_store.h"
#include "kiln/core/logging.h"
#include "kiln/core/params.h"
#include "kiln/ops/fused.h"
#include "kiln/ops/nn.h"
#include "kiln/ops/op_table.h"

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace kiln::cuda {
namespace {

// ---- descriptors

// An owned cuDNN backend descriptor.
class Desc {
 public:
  Desc() = default;
  explicit Desc(cudnnBackendDescriptor_t d) : d_(d) {}
  Desc(Desc&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  Desc& operator=(Desc&& o) noexcept {
    if (this != &o) {
      Reset();
      d_ = std::exchange(o.d_, nullptr);
    }
    return *this;
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  ~Desc() { Reset(); }
  void Reset() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
    d_ = nullptr;
  }
  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnBackendDescriptor_t* addr() { return &d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

StatusOr<Desc> Create(cudnnBackendDescriptorType_t type) {
  Desc d;
  KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendCreateDescriptor(type, d.addr()));
  return d;
}

#define KILN_CUDNN_SET(desc, attr, type, count, ptr) \
  KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendSetAttribute((desc).get(), attr, type, count, ptr))

// ---- what a layer is

enum class ConvOp : int64_t { kForward = 0, kTranspose = 1 };

// The node, read once: op, element type, layout, which inputs exist and the epilogue.
struct ConvSpec {
  ConvOp op = ConvOp::kForward;
  DataType dtype = DataType::kFloat32;
  bool nhwc = false;
  bool has_bias = false, has_z = false;
  FusedActivationSpec act;
  nn::WindowAttrs attrs;
  size_t spatial_rank = 2;
  std::vector<int64_t> w_dims;  // as in ONNX
  std::string op_name;          // for tactic names: conv, fused-conv, conv-transpose
  bool NeedsEpilogue() const { return has_bias || has_z || act.kind != FusedActivation::kNone; }
};

// Concrete sizes in cuDNN's terms: the forward convolution X[n,c,h,w] * W[k,c/g,r,s] ->
// Y[n,k,oh,ow]. For ConvTranspose (backward data) X is dy and Y is dx of that forward view.
struct Geometry {
  int64_t n = 0, c = 0, h = 1, w = 1;  // the forward input (for ConvTranspose: the node's output)
  int64_t k = 0, r = 1, s = 1;         // filter: k outputs, c/g inputs per group, r x s window
  int64_t oh = 1, ow = 1;              // the forward output
  int64_t cg = 0;                      // filter dim 1
  int64_t pre[2] = {0, 0}, post[2] = {0, 0}, stride[2] = {1, 1}, dil[2] = {1, 1};
  bool operator==(const Geometry& o) const { return std::memcmp(this, &o, sizeof(Geometry)) == 0; }
  std::string Key() const {
    return fmt::format("{}x{}x{}x{}/{}x{}x{}x{}/{}x{}/p{},{},{},{}/s{},{}/d{},{}", n, c, h, w, k,
                       cg, r, s, oh, ow, pre[0], pre[1], post[0], post[1], stride[0], stride[1],
                       dil[0], dil[1]);
  }
};

StatusOr<cudnnDataType_t> CudnnType(DataType t) {
  switch (t) {
    case DataType::kFloat32:
      return CUDNN_DATA_FLOAT;
    case DataType::kFloat16:
      return CUDNN_DATA_HALF;
    case DataType::kBFloat16:
      return CUDNN_DATA_BFLOAT16;
    default:
      return MakeError(ErrorCode::kUnimplemented,
                       "cuDNN convolutions run f32, f16 and bf16; not {}", ToString(t));
  }
}

std::string_view DtypePrefix(DataType t) {
  return t == DataType::kFloat16 ? "f16" : t == DataType::kBFloat16 ? "bf16" : "f32";
}

StatusOr<ConvSpec> ReadSpec(const KernelRequest& request) {
  const Node& node = *request.node;
  ConvSpec spec;
  const OpType op = OpTypeOf(node);
  spec.op = op == OpType::kConvTranspose ? ConvOp::kTranspose : ConvOp::kForward;
  spec.op_name = op == OpType::kConvTranspose ? "conv-transpose"
                 : op == OpType::kFusedConv   ? "fused-conv"
                                              : "conv";
  std::string layout = NodeLayout(node);
  if (!layout.empty() && layout != "NHWC") {
    return MakeError(ErrorCode::kUnimplemented, "kiln_layout '{}'", layout);
  }
  spec.nhwc = layout == "NHWC";
  if (request.inputs.size() < 2 || request.outputs.size() != 1) {
    return MakeError(ErrorCode::kInvalidModel, "node '{}': needs X, W and one output", node.name());
  }
  spec.dtype = request.inputs[0].dtype;
  KILN_RETURN_IF_ERROR(CudnnType(spec.dtype).status());
  for (const OperandDesc& d : request.inputs) {
    if (d.dtype != DataType::kUndefined && d.dtype != spec.dtype) {
      return MakeError(ErrorCode::kTypeMismatch, "mixed operand types");
    }
  }
  if (request.outputs[0].dtype != spec.dtype) {
    return MakeError(ErrorCode::kTypeMismatch, "output type differs from the input's");
  }
  size_t rank = request.inputs[0].shape.size();
  if (rank != 4 && !(rank == 3 && !spec.nhwc)) {
    return MakeError(ErrorCode::kUnimplemented, "cuDNN convolutions here are 1-D and 2-D");
  }
  auto w = StaticDims(request.inputs[1].shape);
  if (!w || w->size() != rank) {
    return MakeError(ErrorCode::kShapeMismatch, "weight shape must be static, rank {}", rank);
  }
  spec.w_dims = *w;
  spec.spatial_rank = rank - 2;
  KILN_ASSIGN_OR_RETURN(spec.attrs,
                        nn::ReadWindowAttrs(node.attrs(), spec.spatial_rank,
                                            std::vector<int64_t>(w->begin() + 2, w->end())));
  spec.has_bias = request.inputs.size() > 2 && request.inputs[2].dtype != DataType::kUndefined;
  spec.has_z = request.inputs.size() > 3 && request.inputs[3].dtype != DataType::kUndefined;
  if (IsOp(node, OpType::kFusedConv)) {
    KILN_ASSIGN_OR_RETURN(spec.act, ParseFusedActivation(node.attrs()));
  }
  return spec;
}

// X and Y dims (node layout) -> logical N, C, H, W.
std::array<int64_t, 4> Logical(std::span<const int64_t> d, bool nhwc) {
  if (d.size() == 3) return {d[0], d[1], 1, d[2]};
  if (nhwc) return {d[0], d[3], d[1], d[2]};
  return {d[0], d[1], d[2], d[3]};
}

StatusOr<Geometry> Resolve(const ConvSpec& spec, std::span<const int64_t> x_dims,
                           std::span<const int64_t> y_dims) {
  const nn::WindowAttrs& a = spec.attrs;
  size_t rank = spec.spatial_rank + 2;
  if (x_dims.size() != rank || y_dims.size() != rank) {
    return MakeError(ErrorCode::kShapeMismatch, "conv operands must have rank {}", rank);
  }
  auto x = Logical(x_dims, spec.nhwc);
  auto y = Logical(y_dims, spec.nhwc);
  Geometry g;
  int64_t group = a.group;
  // In the forward view, `in` is the convolution's input and `out` its output.
  std::array<int64_t, 4> in = spec.op == ConvOp::kForward ? x : y;
  std::array<int64_t, 4> out = spec.op == ConvOp::kForward ? y : x;
  g.n = in[0];
  g.c = in[1];
  g.h = in[2];
  g.w = in[3];
  g.k = out[1];
  g.oh = out[2];
  g.ow = out[3];
  g.cg = spec.w_dims[1];
  g.r = spec.spatial_rank == 2 ? spec.w_dims[2] : 1;
  g.s = spec.w_dims.back();
  if (spec.op == ConvOp::kForward) {
    if (g.k != spec.w_dims[0] || g.c != g.cg * group || out[0] != g.n) {
      return MakeError(ErrorCode::kShapeMismatch, "conv operand dims do not agree with the weight");
    }
  } else {
    // ONNX ConvTranspose weight [C_in, M/g, r, s] is the forward filter [k, c/g, r, s].
    if (g.k != spec.w_dims[0] || g.c != g.cg * group || out[0] != g.n) {
      return MakeError(ErrorCode::kShapeMismatch,
                       "conv-transpose operand dims do not agree with the weight");
    }
  }
  for (size_t i = 0; i < spec.spatial_rank; ++i) {
    size_t axis = spec.spatial_rank == 2 ? i : 1;  // 1-D convs use the W axis
    int64_t in_size = axis == 0 ? g.h : g.w;
    int64_t out_size = axis == 0 ? g.oh : g.ow;
    int64_t k_eff = a.dilations[i] * (a.kernel[i] - 1) + 1;
    int64_t pb = 0;
    if (spec.op == ConvOp::kForward) {
      if (nn::WindowOutDim<int64_t>(in_size, a, i) != out_size) {
        return MakeError(ErrorCode::kShapeMismatch, "conv output dims do not match attributes");
      }
      pb = nn::WindowPadBegin(in_size, out_size, a, i);
    } else {
      // The node's input is the forward output: in_size is the node's output extent here.
      pb = nn::TransposePadBegin(out_size, in_size, a, i);
    }
    // End padding that reproduces the output extent; the floor in cuDNN's output formula
    // absorbs a stride's leftover, so a negative value becomes 0.
    int64_t pe = std::max<int64_t>(0, (out_size - 1) * a.strides[i] + k_eff - in_size - pb);
    if (pb < 0) {
      return MakeError(ErrorCode::kUnimplemented, "negative begin padding");
    }
    g.pre[axis] = pb;
    g.post[axis] = pe;
    g.stride[axis] = a.strides[i];
    g.dil[axis] = a.dilations[i];
    int64_t cudnn_out = (in_size + pb + pe - k_eff) / a.strides[i] + 1;
    if (cudnn_out != out_size) {
      return MakeError(ErrorCode::kShapeMismatch, "conv extents {} -> {} are not expressible",
                       in_size, out_size);
    }
  }
  return g;
}

std::array<int64_t, 4> Strides(const std::array<int64_t, 4>& d, bool nhwc) {
  if (nhwc) return {d[1] * d[2] * d[3], 1, d[3] * d[1], d[1]};
  return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1};
}

// ---- operation graphs and plans

constexpr int64_t kUidX = 1, kUidW = 2, kUidB = 3, kUidZ = 4, kUidY = 5;

// Whether cuDNN's pointwise modes express the activation.
bool CudnnActivation(const FusedActivationSpec& act) {
  switch (act.kind) {
    case FusedActivation::kNone:
    case FusedActivation::kRelu:
    case FusedActivation::kSigmoid:
    case FusedActivation::kSilu:
    case FusedActivation::kGelu:
    case FusedActivation::kGeluTanh:
      return true;
    case FusedActivation::kClip:
      return act.min == 0.f;  // ReLU with an upper clip (relu6)
    default:
      return false;
  }
}

struct OpGraph {
  std::vector<Desc> keep;  // tensors, ops and sub-descriptors the graph refers to
  Desc graph;
  std::vector<int64_t> uids;  // real (non-virtual) tensors, in variant-pack order
};

class GraphBuilder {
 public:
  GraphBuilder(const ConvSpec& spec, const Geometry& g, bool fused)
      : spec_(spec), g_(g), fused_(fused) {}

  StatusOr<OpGraph> Build(cudnnHandle_t handle) {
    OpGraph og;
    KILN_ASSIGN_OR_RETURN(cudnnDataType_t io, CudnnType(spec_.dtype));
    std::array<int64_t, 4> xd = {g_.n, g_.c, g_.h, g_.w};
    std::array<int64_t, 4> yd = {g_.n, g_.k, g_.oh, g_.ow};
    std::array<int64_t, 4> wd = {g_.k, g_.cg, g_.r, g_.s};
    bool fwd = spec_.op == ConvOp::kForward;
    // Node X is the forward input for Conv and the forward output for ConvTranspose.
    KILN_ASSIGN_OR_RETURN(Desc x, MakeTensor(kUidX, fwd ? xd : yd, io, false));
    KILN_ASSIGN_OR_RETURN(Desc w, MakeTensor(kUidW, wd, io, false));
    bool epilogue = fused_ && fwd && spec_.NeedsEpilogue();
    // The convolution writes Y directly unless pointwise ops follow (then an FP32 virtual).
    int64_t next_uid = 100;
    KILN_ASSIGN_OR_RETURN(Desc conv_out, epilogue
                                             ? MakeTensor(next_uid++, yd, CUDNN_DATA_FLOAT, true)
                                             : MakeTensor(kUidY, fwd ? yd : xd, io, false));
    og.uids = {kUidX, kUidW};

    KILN_ASSIGN_OR_RETURN(Desc conv, Create(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR));
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    int64_t dims = 2;
    KILN_CUDNN_SET(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    KILN_CUDNN_SET(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
    KILN_CUDNN_SET(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims);
    KILN_CUDNN_SET(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, g_.pre);
    KILN_CUDNN_SET(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, g_.post);
    KILN_CUDNN_SET(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, g_.stride);
    KILN_CUDNN_SET(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, g_.dil);
    KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendFinalize(conv.get()));

    float alpha = 1.f, beta = 0.f;
    std::vector<Desc> ops;
    if (fwd) {
      KILN_ASSIGN_OR_RETURN(Desc op,
                            Create(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR));
      SetDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, x);
      SetDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, w);
      SetDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, conv_out);
      SetDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, conv);
      KILN_CUDNN_SET(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_TYPE_FLOAT, 1,
                     &alpha);
      KILN_CUDNN_SET(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA, CUDNN_TYPE_FLOAT, 1, &beta);
      KILN_RETURN_IF_ERROR(status_);
      KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendFinalize(op.get()));
      ops.push_back(std::move(op));
    } else {
      KILN_ASSIGN_OR_RETURN(Desc op,
                            Create(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR));
      SetDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, x);
      SetDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, w);
      SetDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, conv_out);
      SetDesc(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, conv);
      KILN_CUDNN_SET(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_TYPE_FLOAT, 1,
                     &alpha);
      KILN_CUDNN_SET(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA, CUDNN_TYPE_FLOAT, 1,
                     &beta);
      KILN_RETURN_IF_ERROR(status_);
      KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendFinalize(op.get()));
      ops.push_back(std::move(op));
    }

    if (epilogue) {
      // conv_out -> (+B) -> (+Z) -> (act) -> Y; the last op writes the real Y.
      int remaining =
          int{spec_.has_bias} + int{spec_.has_z} + int{spec_.act.kind != FusedActivation::kNone};
      Desc* cur = &conv_out;
      std::vector<Desc> tensors;
      tensors.reserve(8);
      auto next_out = [&]() -> StatusOr<Desc*> {
        --remaining;
        if (remaining == 0) {
          KILN_ASSIGN_OR_RETURN(Desc y, MakeTensor(kUidY, yd, io, false));
          tensors.push_back(std::move(y));
        } else {
          KILN_ASSIGN_OR_RETURN(Desc t, MakeTensor(next_uid++, yd, CUDNN_DATA_FLOAT, true));
          tensors.push_back(std::move(t));
        }
        return &tensors.back();
      };
      if (spec_.has_bias) {
        std::array<int64_t, 4> bd = {1, g_.k, 1, 1};
        KILN_ASSIGN_OR_RETURN(Desc b, MakeTensor(kUidB, bd, io, false));
        tensors.push_back(std::move(b));
        Desc* bias = &tensors.back();
        KILN_ASSIGN_OR_RETURN(Desc * out, next_out());
        KILN_ASSIGN_OR_RETURN(Desc op, Pointwise(CUDNN_POINTWISE_ADD, *cur, bias, *out, og));
        ops.push_back(std::move(op));
        og.uids.push_back(kUidB);
        cur = out;
      }
      if (spec_.has_z) {
        KILN_ASSIGN_OR_RETURN(Desc z, MakeTensor(kUidZ, yd, io, false));
        tensors.push_back(std::move(z));
        Desc* zt = &tensors.back();
        KILN_ASSIGN_OR_RETURN(Desc * out, next_out());
        KILN_ASSIGN_OR_RETURN(Desc op, Pointwise(CUDNN_POINTWISE_ADD, *cur, zt, *out, og));
        ops.push_back(std::move(op));
        og.uids.push_back(kUidZ);
        cur = out;
      }
      if (spec_.act.kind != FusedActivation::kNone) {
        KILN_ASSIGN_OR_RETURN(Desc * out, next_out());
        cudnnPointwiseMode_t m = CUDNN_POINTWISE_RELU_FWD;
        switch (spec_.act.kind) {
          case FusedActivation::kSigmoid:
            m = CUDNN_POINTWISE_SIGMOID_FWD;
            break;
          case FusedActivation::kSilu:
            m = CUDNN_POINTWISE_SWISH_FWD;
            break;
          case FusedActivation::kGelu:
            m = CUDNN_POINTWISE_GELU_FWD;
            break;
          case FusedActivation::kGeluTanh:
            m = CUDNN_POINTWISE_GELU_APPROX_TANH_FWD;
            break;
          default:
            break;
        }
        KILN_ASSIGN_OR_RETURN(Desc op, Pointwise(m, *cur, nullptr, *out, og));
        ops.push_back(std::move(op));
      }
      for (Desc& t : tensors) og.keep.push_back(std::move(t));
    }
    og.uids.push_back(kUidY);

    KILN_ASSIGN_OR_RETURN(og.graph, Create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR));
    std::vector<cudnnBackendDescriptor_t> raw;
    for (Desc& op : ops) raw.push_back(op.get());
    KILN_CUDNN_SET(og.graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                   static_cast<int64_t>(raw.size()), raw.data());
    // The handle attributes are deprecated in cuDNN 9.x (where cuDNN may ignore or refuse them);
    // set them where accepted, for older 9.x releases that still need them.
    (void)cudnnBackendSetAttribute(og.graph.get(), CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
                                   CUDNN_TYPE_HANDLE, 1, &handle);
    KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendFinalize(og.graph.get()));
    og.keep.push_back(std::move(x));
    og.keep.push_back(std::move(w));
    og.keep.push_back(std::move(conv_out));
    og.keep.push_back(std::move(conv));
    for (Desc& op : ops) og.keep.push_back(std::move(op));
    return og;
  }

 private:
  StatusOr<Desc> MakeTensor(int64_t uid, const std::array<int64_t, 4>& dims, cudnnDataType_t type,
                            bool is_virtual) {
    KILN_ASSIGN_OR_RETURN(Desc t, Create(CUDNN_BACKEND_TENSOR_DESCRIPTOR));
    std::array<int64_t, 4> strides = Strides(dims, spec_.nhwc);
    int64_t align = 16;
    bool virt = is_virtual;
    KILN_CUDNN_SET(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    KILN_CUDNN_SET(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    KILN_CUDNN_SET(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    KILN_CUDNN_SET(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    KILN_CUDNN_SET(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    KILN_CUDNN_SET(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendFinalize(t.get()));
    return t;
  }

  void SetDesc(Desc& op, cudnnBackendAttributeName_t attr, Desc& value) {
    if (!status_.ok()) return;
    cudnnBackendDescriptor_t d = value.get();
    cudnnStatus_t st =
        cudnnBackendSetAttribute(op.get(), attr, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
    if (st != CUDNN_STATUS_SUCCESS) status_ = CudnnStatus(st, "cudnnBackendSetAttribute");
  }

  StatusOr<Desc> Pointwise(cudnnPointwiseMode_t mode, Desc& x, Desc* b, Desc& y, OpGraph& og) {
    KILN_ASSIGN_OR_RETURN(Desc pw, Create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR));
    cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    KILN_CUDNN_SET(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    KILN_CUDNN_SET(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (mode == CUDNN_POINTWISE_RELU_FWD && spec_.act.kind == FusedActivation::kClip) {
      // The activation's scalars are doubles in the backend API whatever the math precision.
      double lo = 0.0, hi = spec_.act.max;
      KILN_CUDNN_SET(pw, CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP, CUDNN_TYPE_DOUBLE, 1, &lo);
      KILN_CUDNN_SET(pw, CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP, CUDNN_TYPE_DOUBLE, 1, &hi);
    }
    if (mode == CUDNN_POINTWISE_SWISH_FWD) {
      double beta = 1.0;
      KILN_CUDNN_SET(pw, CUDNN_ATTR_POINTWISE_SWISH_BETA, CUDNN_TYPE_DOUBLE, 1, &beta);
    }
    KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendFinalize(pw.get()));
    KILN_ASSIGN_OR_RETURN(Desc op, Create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR));
    SetDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    SetDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) SetDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    SetDesc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    KILN_RETURN_IF_ERROR(status_);
    KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendFinalize(op.get()));
    og.keep.push_back(std::move(pw));
    return op;
  }

  const ConvSpec& spec_;
  const Geometry& g_;
  bool fused_;
  Status status_;
};

// What identifies an engine configuration across processes: the engine's global index and the
// knob choices (type, value).
struct EngineChoice {
  int64_t engine = -1;
  std::vector<std::pair<int64_t, int64_t>> knobs;
  // The engine compiles its kernel when its plan is finalised (cuDNN's runtime fusion engines):
  // seconds per plan, where a precompiled engine takes milliseconds. Read from the engine, so not
  // part of the key.
  bool runtime_compiled = false;
  bool operator==(const EngineChoice&) const = default;
  std::string Key() const {
    std::string s = fmt::format("engine{}", engine);
    for (auto [t, v] : knobs) s += fmt::format("-k{}={}", t, v);
    return s;
  }
};

// An engine's behaviour notes (none when cuDNN does not say).
std::vector<cudnnBackendBehaviorNote_t> BehaviorNotes(cudnnBackendDescriptor_t engine) {
  cudnnBackendBehaviorNote_t notes[CUDNN_BEHAVIOR_NOTE_TYPE_COUNT];
  int64_t n = 0;
  if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE, CUDNN_TYPE_BEHAVIOR_NOTE,
                               CUDNN_BEHAVIOR_NOTE_TYPE_COUNT, &n, notes) != CUDNN_STATUS_SUCCESS) {
    return {};
  }
  return std::vector<cudnnBackendBehaviorNote_t>(notes, notes + std::max<int64_t>(0, n));
}

// Reads the engine behind one heuristic result; false when its numerics are not acceptable
// (TF32 or down-converted inputs for f32, reduced-precision accumulation for f16/bf16) or it
// needs int8 reordering.
StatusOr<bool> ReadChoice(cudnnBackendDescriptor_t cfg, DataType dtype, EngineChoice* out) {
  KILN_ASSIGN_OR_RETURN(Desc engine, Create(CUDNN_BACKEND_ENGINE_DESCRIPTOR));
  int64_t count = 0;
  cudnnBackendDescriptor_t e = engine.get();
  KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendGetAttribute(
      cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count, &e));
  KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX,
                                                      CUDNN_TYPE_INT64, 1, &count, &out->engine));
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t n_notes = 0;
  if (cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n_notes,
                               notes) == CUDNN_STATUS_SUCCESS) {
    for (int64_t i = 0; i < n_notes; ++i) {
      if (notes[i] == CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION) return false;
      if (dtype == DataType::kFloat32 && (notes[i] == CUDNN_NUMERICAL_NOTE_TENSOR_CORE ||
                                          notes[i] == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS)) {
        return false;
      }
    }
  }
  for (cudnnBackendBehaviorNote_t note : BehaviorNotes(e)) {
    if (note == CUDNN_BEHAVIOR_NOTE_REQUIRES_FILTER_INT8x32_REORDER ||
        note == CUDNN_BEHAVIOR_NOTE_REQUIRES_BIAS_INT8x32_REORDER) {
      return false;
    }
    if (note == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) out->runtime_compiled = true;
  }
  constexpr int kMaxKnobs = CUDNN_KNOB_TYPE_COUNTS;
  std::vector<Desc> knobs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int i = 0; i < kMaxKnobs; ++i) {
    KILN_ASSIGN_OR_RETURN(Desc k, Create(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR));
    raw.push_back(k.get());
    knobs.push_back(std::move(k));
  }
  int64_t n_knobs = 0;
  KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES,
                                                      CUDNN_TYPE_BACKEND_DESCRIPTOR, kMaxKnobs,
                                                      &n_knobs, raw.data()));
  out->knobs.clear();
  for (int64_t i = 0; i < n_knobs && i < kMaxKnobs; ++i) {
    cudnnBackendKnobType_t type;
    int64_t value = 0, c = 0;
    KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendGetAttribute(raw[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE,
                                                        CUDNN_TYPE_KNOB_TYPE, 1, &c, &type));
    KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendGetAttribute(raw[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE,
                                                        CUDNN_TYPE_INT64, 1, &c, &value));
    out->knobs.push_back({static_cast<int64_t>(type), value});
  }
  return true;
}

// The heuristic's engine configurations for a graph, best first: mode A (mode B if A gives
// nothing), then the fallback list; duplicates and unacceptable numerics dropped.
std::vector<EngineChoice> Heuristics(const OpGraph& og, DataType dtype) {
  std::vector<EngineChoice> out;
  auto query = [&](cudnnBackendHeurMode_t mode) -> Status {
    KILN_ASSIGN_OR_RETURN(Desc heur, Create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR));
    cudnnBackendDescriptor_t g = og.graph.get();
    KILN_CUDNN_SET(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                   &g);
    KILN_CUDNN_SET(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendFinalize(heur.get()));
    int64_t count = 0;
    KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                                        nullptr));
    if (count <= 0) return OkStatus();
    std::vector<Desc> cfgs;
    std::vector<cudnnBackendDescriptor_t> raw;
    for (int64_t i = 0; i < count; ++i) {
      KILN_ASSIGN_OR_RETURN(Desc c, Create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      raw.push_back(c.get());
      cfgs.push_back(std::move(c));
    }
    int64_t got = 0;
    KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                                        raw.data()));
    for (int64_t i = 0; i < got && i < count; ++i) {
      EngineChoice choice;
      auto ok = ReadChoice(raw[i], dtype, &choice);
      if (!ok.ok() || !*ok) continue;
      if (std::find(out.begin(), out.end(), choice) == out.end()) out.push_back(choice);
    }
    return OkStatus();
  };
  Status a = query(CUDNN_HEUR_MODE_A);
  if (!a.ok()) KILN_LOG(Debug, BACKEND, "cuDNN heuristic mode A: {}", a.ToString());
  if (!a.ok() || out.empty()) {
    Status b = query(CUDNN_HEUR_MODE_B);
    if (!b.ok()) KILN_LOG(Debug, BACKEND, "cuDNN heuristic mode B: {}", b.ToString());
  }
  Status f = query(CUDNN_HEUR_MODE_FALLBACK);
  if (!f.ok()) KILN_LOG(Debug, BACKEND, "cuDNN fallback list: {}", f.ToString());
  return out;
}

// A finalized execution plan and everything it refers to.
struct Plan {
  OpGraph graph;
  Desc engine, config, plan;
  std::vector<Desc> knobs;
  int64_t workspace = 0;
  bool runtime_compiled = false;  // the engine compiled its kernel at finalisation
};

StatusOr<int64_t> PlanWorkspace(const Desc& plan) {
  int64_t count = 0, bytes = 0;
  KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendGetAttribute(
      plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &count, &bytes));
  return bytes;
}

StatusOr<std::shared_ptr<Plan>> BuildPlan(cudnnHandle_t handle, OpGraph og,
                                          const EngineChoice& choice) {
  auto p = std::make_shared<Plan>();
  p->graph = std::move(og);
  KILN_ASSIGN_OR_RETURN(p->engine, Create(CUDNN_BACKEND_ENGINE_DESCRIPTOR));
  cudnnBackendDescriptor_t g = p->graph.graph.get();
  KILN_CUDNN_SET(p->engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                 &g);
  KILN_CUDNN_SET(p->engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &choice.engine);
  KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendFinalize(p->engine.get()));
  std::vector<cudnnBackendDescriptor_t> raw;
  for (auto [type, value] : choice.knobs) {
    KILN_ASSIGN_OR_RETURN(Desc k, Create(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR));
    auto t = static_cast<cudnnBackendKnobType_t>(type);
    KILN_CUDNN_SET(k, CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &t);
    KILN_CUDNN_SET(k, CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &value);
    KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendFinalize(k.get()));
    raw.push_back(k.get());
    p->knobs.push_back(std::move(k));
  }
  KILN_ASSIGN_OR_RETURN(p->config, Create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
  cudnnBackendDescriptor_t e = p->engine.get();
  KILN_CUDNN_SET(p->config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &e);
  if (!raw.empty()) {
    KILN_CUDNN_SET(p->config, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                   static_cast<int64_t>(raw.size()), raw.data());
  }
  KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendFinalize(p->config.get()));
  KILN_ASSIGN_OR_RETURN(p->plan, Create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR));
  cudnnBackendDescriptor_t c = p->config.get();
  (void)cudnnBackendSetAttribute(p->plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE,
                                 1, &handle);  // deprecated in 9.x: best effort, as above
  KILN_CUDNN_SET(p->plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                 &c);
  KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendFinalize(p->plan.get()));
  KILN_ASSIGN_OR_RETURN(p->workspace, PlanWorkspace(p->plan));
  for (cudnnBackendBehaviorNote_t note : BehaviorNotes(p->engine.get())) {
    if (note == CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION) p->runtime_compiled = true;
  }
  return p;
}

// ---- runtime-compiled plans on disk
//
// A runtime-compiled engine compiles its kernel (NVRTC) when its plan is finalised: seconds per
// plan, paid again by every process that finalises it (a warm build, every engine load). cuDNN
// serialises such plans, compiled kernel included, as JSON (CUDNN_ATTR_EXECUTION_PLAN_JSON_
// REPRESENTATION; runtime-compiled engines only), and a plan deserialised on an identical GPU
// runs without compiling. kiln keeps them in a BlobStore (KILN_CUDNN_PLAN_CACHE) under the
// in-process key plus cuDNN's version and the GPU's identity; a blob that fails to deserialise is
// a miss and the plan is built as before.

constexpr uint64_t kMaxPlanBlobBytes = 64ull << 20;

std::mutex g_store_mu;
bool g_store_set = false;
std::shared_ptr<const BlobStore> g_store;

std::shared_ptr<const BlobStore> StoreFromEnv() {
  std::string dir = param::CudnnPlanCache();
  if (dir == "off" || dir == "0") return nullptr;
  if (dir.empty()) dir = DefaultCacheDir("cudnn-plans");
  if (dir.empty()) return nullptr;
  return std::make_shared<const BlobStore>(dir, kMaxPlanBlobBytes);
}

std::shared_ptr<const BlobStore> PlanStore() {
  std::lock_guard lock(g_store_mu);
  if (!g_store_set) {
    g_store = StoreFromEnv();
    g_store_set = true;
  }
  return g_store;
}

// cuDNN's version and the current GPU (model, compute capability, SMs, driver): a serialised
// plan is only valid on an identical GPU with the same cuDNN.
std::string DeviceIdentity() {
  static std::mutex mu;
  static std::map<int, std::string> ids;
  int d = 0;
  cudaGetDevice(&d);
  std::lock_guard lock(mu);
  if (auto it = ids.find(d); it != ids.end()) return it->second;
  cudaDeviceProp prop{};
  int driver = 0;
  cudaGetDeviceProperties(&prop, d);
  cudaDriverGetVersion(&driver);
  return ids[d] = fmt::format("cudnn{}|{}|sm{}{}|{}sms|driver{}", cudnnGetVersion(), prop.name,
                              prop.major, prop.minor, prop.multiProcessorCount, driver);
}

std::optional<std::string> SerializePlan(const Desc& plan) {
  int64_t n = 0;
  if (cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION,
                               CUDNN_TYPE_CHAR, 0, &n, nullptr) != CUDNN_STATUS_SUCCESS ||
      n <= 0 || n > static_cast<int64_t>(kMaxPlanBlobBytes)) {
    return std::nullopt;
  }
  std::string json(static_cast<size_t>(n), '\0');
  if (cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION,
                               CUDNN_TYPE_CHAR, n, &n, json.data()) != CUDNN_STATUS_SUCCESS) {
    return std::nullopt;
  }
  json.resize(static_cast<size_t>(std::max<int64_t>(0, n)));
  return json;
}

// A plan from its JSON; takes `og` (whose tensor ids the variant pack uses) only on success.
StatusOr<std::shared_ptr<Plan>> DeserializePlan(cudnnHandle_t handle, OpGraph& og,
                                                const std::string& json) {
  auto p = std::make_shared<Plan>();
  p->runtime_compiled = true;
  KILN_ASSIGN_OR_RETURN(p->plan, Create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR));
  KILN_CUDNN_SET(p->plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  KILN_CUDNN_SET(p->plan, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                 static_cast<int64_t>(json.size()), json.data());
  KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendFinalize(p->plan.get()));
  KILN_ASSIGN_OR_RETURN(p->workspace, PlanWorkspace(p->plan));
  p->graph = std::move(og);
  return p;
}

std::atomic<int64_t> g_plans_built{0}, g_plans_loaded{0}, g_plans_stored{0};

// Finalized plans, shared by every layer and tactic with the same graph and engine
// configuration (ResNet repeats its blocks; the builder creates each tactic several times).
// Runtime-compiled engines take a noticeable time to finalize, so this matters for build time.
class PlanCache {
 public:
  static PlanCache& Get() {
    static PlanCache* cache = new PlanCache();
    return *cache;
  }
  StatusOr<std::shared_ptr<Plan>> Find(const ConvSpec& spec, const Geometry& g, bool fused,
                                       const EngineChoice& choice) {
    // What the plan is (also its key on disk, where the GPU's identity replaces its index: the
    // GPUs of one node share their plans).
    const std::string what =
        fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", static_cast<int>(spec.op),
                    ToString(spec.dtype), spec.nhwc, spec.has_bias, spec.has_z,
                    static_cast<int>(spec.act.kind), spec.act.max, fused, g.Key(), choice.Key());
    std::string key = fmt::format("{}|{}", what, CurrentDevice());
    {
      // The builder's set-up threads finalise plans concurrently (each with its own cuDNN
      // handle): the lock guards the maps only, and a key being built by one thread is waited
      // for by the others rather than built twice.
      std::unique_lock lock(mu_);
      building_cv_.wait(lock, [&] { return !building_.count(key); });
      if (auto it = plans_.find(key); it != plans_.end()) return it->second;
      // Failures are remembered too: every layer of the same shape would otherwise retry them.
      if (auto it = failed_.find(key); it != failed_.end()) return it->second;
      building_.insert(key);
    }
    auto plan = [&]() -> StatusOr<std::shared_ptr<Plan>> {
      KILN_ASSIGN_OR_RETURN(cudnnHandle_t handle, CudnnHandle());
      const std::shared_ptr<const BlobStore> store = PlanStore();
      const std::string disk_key =
          store ? "kiln-cudnn-plan-1|" + what + "|" + DeviceIdentity() : "";
      KILN_ASSIGN_OR_RETURN(OpGraph og, GraphBuilder(spec, g, fused).Build(handle));
      if (std::optional<std::string> json = store ? store->Load(disk_key) : std::nullopt) {
        auto loaded = DeserializePlan(handle, og, *json);
        if (loaded.ok()) {
          ++g_plans_loaded;
          return loaded;
        }
        KILN_LOG(Debug, BACKEND, "cuDNN plan from {} not used: {}", store->PathFor(disk_key),
                 loaded.status().ToString());
      }
      auto built = BuildPlan(handle, std::move(og), choice);
      if (!built.ok()) return built;
      ++g_plans_built;
      if (store && (*built)->runtime_compiled) {
        if (std::optional<std::string> json = SerializePlan((*built)->plan)) {
          if (Status st = store->Store(disk_key, *json); st.ok()) {
            ++g_plans_stored;
          } else {
            // Once per process as a warning: every later build and engine load on this machine
            // compiles these plans again (seconds each) until the store can be written.
            static std::once_flag warned;
            std::call_once(warned, [&] {
              KILN_LOG(Warn, BACKEND,
                       "compiled cuDNN plans are not kept, so later builds and engine loads "
                       "compile them again: {} (set KILN_CUDNN_PLAN_CACHE to a private writable "
                       "directory, or to off)",
                       st.message());
            });
          }
        }
      }
      return built;
    }();
    {
      std::lock_guard lock(mu_);
      building_.erase(key);
      if (plan.ok()) {
        plans_[key] = *plan;
      } else {
        failed_.emplace(key, plan.status());
      }
    }
    building_cv_.notify_all();
    return plan;
  }

  // As in a new process: nothing finalised yet (the on-disk store stays).
  void ClearForTesting() {
    std::lock_guard lock(mu_);
    plans_.clear();
    failed_.clear();
  }

 private:
  static int CurrentDevice() {
    int d = 0;
    cudaGetDevice(&d);
    return d;
  }
  std::mutex mu_;
  std::condition_variable building_cv_;
  std::set<std::string> building_;  // keys some thread is finalising now
  std::map<std::string, std::shared_ptr<Plan>> plans_;
  std::map<std::string, Status> failed_;
};

// ---- tactics

// params: [version, fused (0/1), engine global index, knob count, (knob type, value)...]
constexpr int64_t kParamsVersion = 1;

std::vector<int64_t> EncodeParams(bool fused, const EngineChoice& c) {
  std::vector<int64_t> p = {kParamsVersion, fused ? 1 : 0, c.engine,
                            static_cast<int64_t>(c.knobs.size())};
  for (auto [t, v] : c.knobs) {
    p.push_back(t);
    p.push_back(v);
  }
  return p;
}

StatusOr<std::pair<bool, EngineChoice>> DecodeParams(const std::vector<int64_t>& p) {
  auto bad = [&] {
    return MakeError(ErrorCode::kInvalidArgument,
                     "cuDNN conv tactic params are malformed (engine file from another kiln?)");
  };
  if (p.size() < 4 || p[0] != kParamsVersion || p[3] < 0 ||
      p.size() != 4 + 2 * static_cast<size_t>(p[3])) {
    return bad();
  }
  EngineChoice c;
  c.engine = p[2];
  for (int64_t i = 0; i < p[3]; ++i) c.knobs.push_back({p[4 + 2 * i], p[5 + 2 * i]});
  return std::make_pair(p[1] != 0, c);
}

struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};

class CudnnConvKernel final : public Kernel {
 public:
  CudnnConvKernel(ConvSpec spec, bool fused, EngineChoice choice,
                  std::unique_ptr<void, DeviceFree> krsc_weights)
      : spec_(std::move(spec)),
        fused_(fused),
        choice_(std::move(choice)),
        krsc_(std::move(krsc_weights)) {}

  // Builds (or finds) the plan for these dims; Prepare and Create only.
  Status PlanFor(std::span<const int64_t> x, std::span<const int64_t> y) {
    KILN_ASSIGN_OR_RETURN(Geometry g, Resolve(spec_, x, y));
    if (plan_ && g == geo_) return OkStatus();
    auto plan = PlanCache::Get().Find(spec_, g, fused_, choice_);
    if (!plan.ok()) {
      return MakeError(ErrorCode::kCudnnPlanUnsupported, "cuDNN {} for {} ({}): {}", choice_.Key(),
                       spec_.op_name, g.Key(), plan.status().message());
    }
    plan_ = *plan;
    geo_ = g;
    varpack_.Reset();
    return OkStatus();
  }

  StatusOr<size_t> Prepare(std::span<const TensorView> inputs,
                           std::span<const TensorView> outputs) override {
    KILN_RETURN_IF_ERROR(PlanFor(inputs[0].dims, outputs[0].dims));
    return static_cast<size_t>(plan_->workspace);
  }

  // Refit: the weights come from the new bytes at run time; a channels-last kernel's own KRSC
  // copy is re-packed from them on the GPU (on the host, at creation, that was most of a
  // ResNet-50's first run after a refit).
  bool renews_weights() const override { return true; }
  Status RenewWeights(std::span<const TensorView> inputs, void* stream) override {
    if (!krsc_) return OkStatus();
    const TensorView& w = inputs[1];
    const int rank = static_cast<int>(w.dims.size());
    if (!w.data || rank < 3) {
      return MakeError(ErrorCode::kInternal, "cuDNN conv refit: no device weights to re-pack");
    }
    std::vector<int64_t> perm = {0}, krsc = {w.dims[0]};
    for (int i = 2; i < rank; ++i) {
      perm.push_back(i);
      krsc.push_back(w.dims[i]);
    }
    perm.push_back(1);
    krsc.push_back(w.dims[1]);
    KILN_ASSIGN_OR_RETURN(Strided space, TransposeSpace(w.dims, perm, krsc));
    KILN_CUDA_RETURN_IF_ERROR(LaunchStridedCopy(SizeOf(w.dtype), w.data, krsc_.get(), space,
                                                w.num_elements(),
                                                static_cast<cudaStream_t>(stream)));
    return OkStatus();
  }

  Status Run(const KernelRunArgs& args) override {
    if (!plan_) {
      return MakeError(ErrorCode::kInternal, "cuDNN conv run before Prepare");
    }
    if (args.workspace_bytes < static_cast<size_t>(plan_->workspace)) {
      return MakeError(ErrorCode::kInternal, "cuDNN conv workspace {} < {}", args.workspace_bytes,
                       plan_->workspace);
    }
    void* y = args.outputs[0].data;
    const void* w = krsc_ ? krsc_.get() : args.inputs[1].data;
    const void* b = spec_.has_bias ? args.inputs[2].data : nullptr;
    const void* z = spec_.has_z ? args.inputs[3].data : nullptr;
    std::array<const void*, 6> ptrs = {args.inputs[0].data, w, b, z, y, args.workspace};
    for (int i = 0; i < 5; ++i) {
      if (ptrs[i] && reinterpret_cast<uintptr_t>(ptrs[i]) % 16 != 0) {
        return MakeError(ErrorCode::kKernelFailed,
                         "cuDNN conv operand {} is not 16-byte aligned (the memory plan must align "
                         "device buffers)",
                         i);
      }
    }
    if (!varpack_.get() || ptrs != varpack_ptrs_) {
      // Host-side only (a descriptor and a few pointers); the same arena gives the same
      // pointers every run, so this happens once per context.
      KILN_RETURN_IF_ERROR(BuildVariantPack(ptrs));
    }
    KILN_ASSIGN_OR_RETURN(cudnnHandle_t handle, CudnnHandle());
    auto stream = static_cast<cudaStream_t>(args.stream);
    KILN_CUDNN_RETURN_IF_ERROR(cudnnSetStream(handle, stream));
    KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendExecute(handle, plan_->plan.get(), varpack_.get()));
    bool in_graph = fused_ && spec_.op == ConvOp::kForward;
    if (!in_graph && spec_.NeedsEpilogue()) {
      ConvEpilogueArgs e;
      e.dtype = spec_.dtype;
      e.y = y;
      e.bias = b;
      e.z = z;
      bool fwd = spec_.op == ConvOp::kForward;
      e.n = geo_.n;
      e.c = fwd ? geo_.k : geo_.c;
      e.hw = fwd ? geo_.oh * geo_.ow : geo_.h * geo_.w;
      e.channels_last = spec_.nhwc;
      e.act = static_cast<int>(spec_.act.kind);
      e.act_min = spec_.act.min;
      e.act_max = spec_.act.max;
      KILN_CUDA_RETURN_IF_ERROR(LaunchConvEpilogue(e, stream));
    }
    return OkStatus();
  }

 private:
  Status BuildVariantPack(const std::array<const void*, 6>& ptrs) {
    std::vector<int64_t> uids;
    std::vector<void*> data;
    for (int64_t uid : plan_->graph.uids) {
      uids.push_back(uid);
      data.push_back(const_cast<void*>(ptrs[uid - 1]));
    }
    KILN_ASSIGN_OR_RETURN(Desc vp, Create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR));
    void* ws = const_cast<void*>(ptrs[5]);
    KILN_CUDNN_SET(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                   static_cast<int64_t>(uids.size()), uids.data());
    KILN_CUDNN_SET(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                   static_cast<int64_t>(data.size()), data.data());
    KILN_CUDNN_SET(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    KILN_CUDNN_RETURN_IF_ERROR(cudnnBackendFinalize(vp.get()));
    varpack_ = std::move(vp);
    varpack_ptrs_ = ptrs;
    return OkStatus();
  }

  ConvSpec spec_;
  bool fused_;
  EngineChoice choice_;
  std::unique_ptr<void, DeviceFree> krsc_;
  std::shared_ptr<Plan> plan_;
  Geometry geo_;
  Desc varpack_;
  std::array<const void*, 6> varpack_ptrs_{};
};

// KCRS (ONNX) -> KRSC on the host, then to device memory the kernel owns.
StatusOr<std::unique_ptr<void, DeviceFree>> UploadKrsc(const Tensor& w) {
  const auto& d = w.dims();
  int64_t k = d[0], c = d[1], r = d.size() == 4 ? d[2] : 1, s = d.back();
  size_t es = SizeOf(w.dtype());
  std::vector<std::byte> host(w.size_bytes());
  const auto* src = static_cast<const std::byte*>(w.raw());
  for (int64_t ik = 0; ik < k; ++ik)
    for (int64_t ic = 0; ic < c; ++ic)
      for (int64_t ir = 0; ir < r; ++ir)
        for (int64_t is = 0; is < s; ++is) {
          int64_t from = ((ik * c + ic) * r + ir) * s + is;
          int64_t to = ((ik * r + ir) * s + is) * c + ic;
          std::memcpy(host.data() + to * es, src + from * es, es);
        }
  void* dev = nullptr;
  KILN_CUDA_RETURN_IF_ERROR(cudaMalloc(&dev, host.size()));
  std::unique_ptr<void, DeviceFree> owned(dev);
  KILN_CUDA_RETURN_IF_ERROR(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice));
  return owned;
}

class CudnnConvProvider : public KernelProvider {
 public:
  BackendKind backend() const final { return BackendKind::kCuda; }
  bool SupportsLayout(std::string_view layout) const final {
    return layout.empty() || layout == "NHWC";
  }

  std::vector<TacticConfig> Tactics(const KernelRequest& request) const final {
    auto spec = ReadSpec(request);
    if (!spec.ok()) return {};
    // NHWC filters are transposed at Create: they must be constants.
    if (spec->nhwc && !request.inputs[1].constant) return {};
    std::vector<int64_t> x = LargestDims(request.inputs[0]), y = LargestDims(request.outputs[0]);
    if (x.empty() || y.empty()) return {};
    auto g = Resolve(*spec, x, y);
    if (!g.ok()) return {};
    auto handle = CudnnHandle();
    if (!handle.ok()) return {};
    // At most KILN_CUDNN_MAX_TACTICS, and no more than the builder will look at (its optimisation
    // level): each one listed costs a plan finalisation.
    int64_t max_tactics = std::max<int64_t>(1, param::CudnnMaxTactics());
    if (request.max_tactics > 0) max_tactics = std::min<int64_t>(max_tactics, request.max_tactics);
    // Runtime-compiled engines: KILN_CUDNN_RUNTIME_COMPILED says how many per graph (0, 1, all).
    const int64_t rtc_param = param::CudnnRuntimeCompiled();
    const int64_t max_runtime_compiled =
        rtc_param >= 2 ? max_tactics : std::max<int64_t>(0, rtc_param);
    // The same request comes back often: the precision pass asks before the builder does, and
    // ResNet repeats its blocks. Building the operation graph and running cuDNN's heuristics
    // again for it costs milliseconds each time, so the answer is kept per process.
    int device = 0;
    cudaGetDevice(&device);
    const std::string memo_key =
        fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|rtc{}", spec->op_name,
                    static_cast<int>(spec->op), ToString(spec->dtype), spec->nhwc, spec->has_bias,
                    spec->has_z, static_cast<int>(spec->act.kind), spec->act.min, spec->act.max,
                    g->Key(), device, max_tactics, max_runtime_compiled);
    static std::mutex memo_mu;
    static auto* memo = new std::map<std::string, std::vector<TacticConfig>>();
    {
      std::lock_guard lock(memo_mu);
      if (auto it = memo->find(memo_key); it != memo->end()) return it->second;
    }
    std::vector<TacticConfig> out;
    auto collect = [&](bool fused) {
      auto og = GraphBuilder(*spec, *g, fused).Build(*handle);
      if (!og.ok()) {
        KILN_LOG(Debug, BACKEND, "cuDNN {} graph for '{}' ({}): {}", fused ? "fused" : "conv",
                 request.node->name(), g->Key(), og.status().ToString());
        return;
      }
      std::vector<EngineChoice> choices = Heuristics(*og, spec->dtype);
      KILN_LOG(Debug, BACKEND, "cuDNN {} graph for '{}' ({}): {} engine config(s)",
               fused ? "fused" : "conv", request.node->name(), g->Key(), choices.size());
      int64_t compiled_left = max_runtime_compiled;
      for (const EngineChoice& c : choices) {
        if (static_cast<int64_t>(out.size()) >= max_tactics) break;
        // A runtime-compiled engine of a fused NCHW graph gave wrong values (H100, cuDNN 9:
        // engine 53 on a 1x1 FusedConv + sigmoid over a 1x1 map, f16 and bf16; its NHWC twin
        // was right): NCHW fused graphs take precompiled engines only. kiln's GPU convolutions
        // are NHWC unless the layout pass is off.
        if (c.runtime_compiled && fused && !spec->nhwc) continue;
        if (c.runtime_compiled && compiled_left-- <= 0) continue;
        // Only configurations that finalize at the largest shape become tactics.
        auto plan = PlanCache::Get().Find(*spec, *g, fused, c);
        if (!plan.ok()) {
          KILN_LOG(Debug, BACKEND, "cuDNN {} for '{}': {}", c.Key(), request.node->name(),
                   plan.status().ToString());
          continue;
        }
        bool unfused_epilogue = !(fused && spec->op == ConvOp::kForward) && spec->NeedsEpilogue();
        out.push_back(
            {fmt::format("{}-{}-{}-cudnn-{}{}{}", DtypePrefix(spec->dtype), spec->op_name,
                         spec->nhwc ? "nhwc" : "nchw", c.Key(), c.runtime_compiled ? "-rtc" : "",
                         unfused_epilogue ? "-epilogue" : ""),
             EncodeParams(fused, c), static_cast<size_t>((*plan)->workspace)});
      }
    };
    bool fusable =
        spec->op == ConvOp::kForward && spec->NeedsEpilogue() && CudnnActivation(spec->act);
    if (fusable) collect(true);
    // No engine for the fused graph: the convolution alone plus kiln's epilogue kernel.
    if (out.empty()) collect(false);
    std::lock_guard lock(memo_mu);
    memo->emplace(memo_key, out);
    return out;
  }

  // Static capability: the node reads as a convolution cuDNN's graph API expresses (dtype, rank,
  // layout, attributes, extents), on a device where cuDNN runs it in that dtype. cuDNN has
  // engines for every f16/bf16 convolution kiln sends it on sm_80 and later; elsewhere reduced
  // precision is checked by listing the tactics (finalising their plans) as before.
  bool Supports(const KernelRequest& request) const final {
    auto spec = ReadSpec(request);
    if (!spec.ok()) return false;
    if (spec->nhwc && !request.inputs[1].constant) return false;
    std::vector<int64_t> x = LargestDims(request.inputs[0]), y = LargestDims(request.outputs[0]);
    if (x.empty() || y.empty() || !Resolve(*spec, x, y).ok()) return false;
    if (!CudnnHandle().ok()) return false;
    if (spec->dtype == DataType::kFloat32) return true;
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
      return false;
    }
    if (major >= 8) return true;
    return !Tactics(request).empty();
  }

  StatusOr<std::unique_ptr<Kernel>> Create(const KernelRequest& request,
                                           const TacticConfig& tactic) const final {
    KILN_ASSIGN_OR_RETURN(ConvSpec spec, ReadSpec(request));
    KILN_ASSIGN_OR_RETURN(auto decoded, DecodeParams(tactic.params));
    std::unique_ptr<void, DeviceFree> krsc;
    if (spec.nhwc) {
      const Tensor* w = request.inputs[1].constant;
      if (!w) {
        return MakeError(ErrorCode::kInvalidArgument,
                         "node '{}': an NHWC cuDNN convolution needs constant weights",
                         request.node->name());
      }
      KILN_ASSIGN_OR_RETURN(krsc, UploadKrsc(*w));
    }
    auto kernel =
        std::make_unique<CudnnConvKernel>(spec, decoded.first, decoded.second, std::move(krsc));
    // Finalize at the largest shape now, so a tactic that cannot run fails here, not in Run.
    std::vector<int64_t> x = LargestDims(request.inputs[0]), y = LargestDims(request.outputs[0]);
    if (!x.empty() && !y.empty()) KILN_RETURN_IF_ERROR(kernel->PlanFor(x, y));
    return std::unique_ptr<Kernel>(std::move(kernel));
  }
};

class CudnnConv final : public CudnnConvProvider {
 public:
  std::string_view id() const override { return "cuda.conv.cudnn"; }
  std::string_view op_type() const override { return "Conv"; }
};
KILN_REGISTER_KERNEL_PROVIDER(CudnnConv);

class CudnnFusedConv final : public CudnnConvProvider {
 public:
  std::string_view id() const override { return "cuda.fused_conv.cudnn"; }
  std::string_view op_type() const override { return "FusedConv"; }
};
KILN_REGISTER_KERNEL_PROVIDER(CudnnFusedConv);

class CudnnConvTranspose final : public CudnnConvProvider {
 public:
  std::string_view id() const override { return "cuda.conv_transpose.cudnn"; }
  std::string_view op_type() const override { return "ConvTranspose"; }
};
KILN_REGISTER_KERNEL_PROVIDER(CudnnConvTranspose);

}  // namespace

CudnnPlanStats GetCudnnPlanStats() {
  return {g_plans_built.load(), g_plans_loaded.load(), g_plans_stored.load()};
}

void SetCudnnPlanStoreForTesting(std::optional<std::string> dir) {
  std::lock_guard lock(g_store_mu);
  g_store_set = dir.has_value();
  g_store =
      dir && !dir->empty() ? std::make_shared<const BlobStore>(*dir, kMaxPlanBlobBytes) : nullptr;
}

void ClearCudnnPlanCacheForTesting() { PlanCache::Get().ClearForTesting(); }
}  // namespace kiln::cuda
