// CUDA providers of the elementwise ops (kernels in elementwise.cu): unary activations in f32,
// f16 and bf16 storage (FP32 math), Clip, the broadcasting binary ops (one per row of
// ops/binary_ops.inc: arithmetic, comparison, logic, Pow with mixed types), Where and Cast.
// Broadcast geometry is worked out in Prepare, never in Run.
#include <cstring>

#include "kiln/backends/cuda/cuda_common.h"
#include "kiln/backends/cuda/cuda_kernel.h"
#include "kiln/ops/op_table.h"

namespace kiln::cuda {
namespace {

// ---- unary ------------------------------------------------------------------------------------
CudaOpDef UnaryDef(const char* op, UnaryOp kind) {
  return {
      .op_type = op,
      .accepts =
          [kind](const KernelRequest& r) {
            DataType t = InType(r, 0);
            if (kind == UnaryOp::kNot) return t == DataType::kBool;
            return IsFloatStorage(t) && OutType(r, 0) == t;
          },
      .create =
          [kind](const KernelRequest& r) {
            // alpha, beta, gamma with the op's defaults from ops.inc (0 where it has none).
            const AttributeMap& at = r.node->attrs();
            const OpType op = OpTypeOf(*r.node);
            UnaryParams p{DeclaredFloat(op, at, "alpha"), DeclaredFloat(op, at, "beta"),
                          DeclaredFloat(op, at, "gamma"),
                          op == OpType::kGelu && attrs::Gelu::approximate(at) == "tanh"};
            Elem t = *ToElem(InType(r, 0));
            return MakeFnKernel([kind, p, t](const KernelRunArgs& a) {
              return Launched(LaunchUnary(kind, p, t, a.inputs[0].data, a.outputs[0].data,
                                          a.outputs[0].num_elements(), StreamOf(a)),
                              "unary elementwise kernel");
            });
          },
  };
}

// One provider per row of ops/unary_ops.inc ("cuda.relu", ...), then Not on bool.
#define KILN_UNARY_OP(Name, formula) \
  KILN_CUDA_OP_PROVIDER(Name##Provider, UnaryDef(#Name, UnaryOp::k##Name));
#define KILN_INT_UNARY_OP(Name, formula)
#include "kiln/ops/unary_ops.inc"
#undef KILN_INT_UNARY_OP
#undef KILN_UNARY_OP
KILN_CUDA_OP_PROVIDER(NotProvider, UnaryDef("Not", UnaryOp::kNot));

bool ClipType(DataType t) {
  return IsFloatStorage(t) || t == DataType::kInt32 || t == DataType::kInt64;
}

CudaOpDef ClipDef() {
  return {
      .op_type = "Clip",
      .accepts =
          [](const KernelRequest& r) {
            DataType t = InType(r, 0);
            for (size_t i = 1; i < r.inputs.size(); ++i) {
              if (InType(r, i) != DataType::kUndefined && InType(r, i) != t) return false;
            }
            return ClipType(t);
          },
      .create =
          [](const KernelRequest& r) {
            Elem t = *ToElem(InType(r, 0));
            return MakeFnKernel([t](const KernelRunArgs& a) {
              const void* lo = Present(a, 1) ? a.inputs[1].data : nullptr;
              const void* hi = Present(a, 2) ? a.inputs[2].data : nullptr;
              return Launched(LaunchClip(t, a.inputs[0].data, lo, hi, a.outputs[0].data,
                                         a.outputs[0].num_elements(), StreamOf(a)),
                              "Clip kernel");
            });
          },
  };
}
KILN_CUDA_OP_PROVIDER(ClipProvider, ClipDef());

// ---- binary -----------------------------------------------------------------------------------
// Broadcast geometry per shape, computed in Prepare.
class BinaryKernel final : public Kernel {
 public:
  BinaryKernel(BinaryOp op, BinaryParams p, Elem a, Elem b) : op_(op), p_(p), a_(a), b_(b) {}
  StatusOr<size_t> Prepare(std::span<const TensorView> in,
                           std::span<const TensorView> out) override {
    std::span<const int64_t> dims[2] = {in[0].dims, in[1].dims};
    KILN_ASSIGN_OR_RETURN(space_, BroadcastSpace(dims, out[0].dims));
    same_ = SameDims(in[0].dims, out[0].dims) && SameDims(in[1].dims, out[0].dims);
    return size_t{0};
  }
  Status Run(const KernelRunArgs& a) override {
    return Launched(
        LaunchBinary(op_, p_, a_, b_, a.inputs[0].data, a.inputs[1].data, a.outputs[0].data, space_,
                     a.outputs[0].num_elements(), same_, StreamOf(a)),
        "binary elementwise kernel");
  }

 private:
  BinaryOp op_;
  BinaryParams p_;
  Elem a_, b_;
  Strided space_;
  bool same_ = false;
};

bool NumericType(DataType t) {
  return IsFloatStorage(t) || t == DataType::kInt32 || t == DataType::kInt64;
}

// The operand types CUDA serves for each of binary_ops.inc's type classes (elementwise.cu
// dispatches over the same).
bool Accepts(BinaryTypes types, DataType a, DataType b) {
  switch (types) {
    case BinaryTypes::kArith:
    case BinaryTypes::kArithWide:
    case BinaryTypes::kCompare:
      return a == b && NumericType(a);
    case BinaryTypes::kEquality:
      return a == b && (NumericType(a) || a == DataType::kBool);
    case BinaryTypes::kLogic:
      return a == DataType::kBool && b == DataType::kBool;
    case BinaryTypes::kPow:
      return NumericType(a) && NumericType(b);
  }
  return false;
}

CudaOpDef BinaryDef(const char* op, BinaryOp kind, BinaryTypes types) {
  return {
      .op_type = op,
      .accepts =
          [types](const KernelRequest& r) {
            if (r.inputs.size() != 2) return false;  // Max/Min with other arities: variadic_ops.cc
            return Accepts(types, InType(r, 0), InType(r, 1));
          },
      .create = [kind](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        // The node's attributes that the formulas read, with ops.inc's defaults.
        BinaryParams p;
        p.fmod = OpTypeOf(*r.node) == OpType::kMod && attrs::Mod::fmod(*r.node) != 0;
        return std::unique_ptr<Kernel>(
            std::make_unique<BinaryKernel>(kind, p, *ToElem(InType(r, 0)), *ToElem(InType(r, 1))));
      },
  };
}

// One provider per row of ops/binary_ops.inc ("cuda.add", ...); variadic rows get their
// two-operand provider here and the others in variadic_ops.cc.
#define KILN_BINARY_OP(Name, Types, formula) \
  KILN_CUDA_OP_PROVIDER(Name##Provider, BinaryDef(#Name, BinaryOp::k##Name, BinaryTypes::k##Types));
#define KILN_VARIADIC_OP(Name, Types, formula) KILN_BINARY_OP(Name, Types, formula)
#include "kiln/ops/binary_ops.inc"
#undef KILN_VARIADIC_OP
#undef KILN_BINARY_OP

// ---- Where ------------------------------------------------------------------------------------
class WhereKernel final : public Kernel {
 public:
  explicit WhereKernel(size_t elem_size) : elem_size_(elem_size) {}
  StatusOr<size_t> Prepare(std::span<const TensorView> in,
                           std::span<const TensorView> out) override {
    std::span<const int64_t> dims[3] = {in[0].dims, in[1].dims, in[2].dims};
    KILN_ASSIGN_OR_RETURN(space_, BroadcastSpace(dims, out[0].dims));
    return size_t{0};
  }
  Status Run(const KernelRunArgs& a) override {
    return Launched(
        LaunchWhere(elem_size_, a.inputs[0].data, a.inputs[1].data, a.inputs[2].data,
                    a.outputs[0].data, space_, a.outputs[0].num_elements(), StreamOf(a)),
        "Where kernel");
  }

 private:
  size_t elem_size_;
  Strided space_;
};

CudaOpDef WhereDef() {
  return {
      .op_type = "Where",
      .name_operand = 1,
      .accepts =
          [](const KernelRequest& r) {
            return r.inputs.size() == 3 && InType(r, 0) == DataType::kBool &&
                   InType(r, 1) == InType(r, 2) && ToElem(InType(r, 1)).has_value();
          },
      .create = [](const KernelRequest& r) -> StatusOr<std::unique_ptr<Kernel>> {
        return std::unique_ptr<Kernel>(std::make_unique<WhereKernel>(SizeOf(InType(r, 1))));
      },
  };
}
KILN_CUDA_OP_PROVIDER(WhereProvider, WhereDef());

// ---- Cast -------------------------------------------------------------------------------------
CudaOpDef CastDef() {
  return {
      .op_type = "Cast",
      .accepts =
          [](const KernelRequest& r) {
            return ToElem(InType(r, 0)).has_value() && ToElem(OutType(r, 0)).has_value();
          },
      .create =
          [](const KernelRequest& r) {
            Elem from = *ToElem(InType(r, 0)), to = *ToElem(OutType(r, 0));
            return MakeFnKernel([from, to](const KernelRunArgs& a) -> Status {
              const TensorView& y = a.outputs[0];
              if (from == to) {
                if (y.size_bytes() == 0 || y.data == a.inputs[0].data) return OkStatus();
                KILN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(y.data, a.inputs[0].data, y.size_bytes(),
                                                          cudaMemcpyDeviceToDevice, StreamOf(a)));
                return OkStatus();
              }
              return Launched(
                  LaunchCast(from, to, a.inputs[0].data, y.data, y.num_elements(), StreamOf(a)),
                  "Cast kernel");
            });
          },
  };
}
KILN_CUDA_OP_PROVIDER(CastProvider, CastDef());

}  // namespace
}  // namespace kiln::cuda
