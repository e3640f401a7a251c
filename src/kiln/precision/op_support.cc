// The per-op precision table: what each op allows before kernels are asked. Ops not listed run
// reduced (FP32 accumulation in the kernel); the exceptions below say why.
#include <array>

#include "kiln/precision/precision.h"

namespace kiln::precision {

using kiln::ToString;

namespace {
struct Entry {
  std::string_view op;
  OpPrecision kind;
  std::string_view reason;
};

constexpr std::string_view kShapeOp = "integer/shape op: keeps the model's types";
constexpr std::string_view kCompare = "comparison: compares the model's values exactly";
constexpr std::string_view kSums =
    "sum over many elements can leave the FP16 range; kept FP32 for accuracy";

constexpr std::array kTable = {
    // Types are the model's: integer, bool and shape computations, explicit casts, index outputs.
    Entry{"Cast", OpPrecision::kUntouched, "explicit Cast: keeps the model's target type"},
    Entry{"Shape", OpPrecision::kUntouched, kShapeOp},
    Entry{"Size", OpPrecision::kUntouched, kShapeOp},
    Entry{"ConstantOfShape", OpPrecision::kUntouched, kShapeOp},
    Entry{"Range", OpPrecision::kUntouched, kShapeOp},
    Entry{"OneHot", OpPrecision::kUntouched, kShapeOp},
    Entry{"Mod", OpPrecision::kUntouched, kShapeOp},
    Entry{"And", OpPrecision::kUntouched, kShapeOp},
    Entry{"Or", OpPrecision::kUntouched, kShapeOp},
    Entry{"Xor", OpPrecision::kUntouched, kShapeOp},
    Entry{"Not", OpPrecision::kUntouched, kShapeOp},
    Entry{"ArgMax", OpPrecision::kUntouched,
          "index output: ties must resolve on the model's values"},
    Entry{"ArgMin", OpPrecision::kUntouched,
          "index output: ties must resolve on the model's values"},
    Entry{"TopK", OpPrecision::kUntouched, "index output: ties must resolve on the model's values"},
    Entry{"IsInf", OpPrecision::kUntouched, "FP16 would turn finite values above 65504 into inf"},
    Entry{"IsNaN", OpPrecision::kUntouched, kCompare},
    Entry{"Equal", OpPrecision::kUntouched, kCompare},
    Entry{"Greater", OpPrecision::kUntouched, kCompare},
    Entry{"GreaterOrEqual", OpPrecision::kUntouched, kCompare},
    Entry{"Less", OpPrecision::kUntouched, kCompare},
    Entry{"LessOrEqual", OpPrecision::kUntouched, kCompare},
    // Kept FP32 for accuracy: outputs or intermediate values that leave FP16's range or lose
    // most of its 11-bit mantissa.
    Entry{"Exp", OpPrecision::kKeepFp32, "exp overflows FP16 for inputs above 11.1"},
    Entry{"Pow", OpPrecision::kKeepFp32, "x^y leaves the FP16 range for moderate x and y"},
    Entry{"Reciprocal", OpPrecision::kKeepFp32, "1/x overflows FP16 for |x| below 1.5e-5"},
    Entry{"Log", OpPrecision::kKeepFp32,
          "log of FP16 inputs loses small values (below 6e-8 they become -inf)"},
    Entry{"LogSoftmax", OpPrecision::kKeepFp32,
          "log-probabilities of unlikely classes fall below FP16's resolution"},
    Entry{"CumSum", OpPrecision::kKeepFp32, kSums},
    Entry{"ReduceSum", OpPrecision::kKeepFp32, kSums},
    Entry{"ReduceSumSquare", OpPrecision::kKeepFp32, kSums},
    Entry{"ReduceL2", OpPrecision::kKeepFp32, kSums},
    Entry{"ReduceProd", OpPrecision::kKeepFp32, "products overflow or underflow FP16 quickly"},
    Entry{"ReduceLogSumExp", OpPrecision::kKeepFp32, kSums},
};
}  // namespace

OpPrecisionRule LookupOpPrecision(std::string_view op_type) {
  OpPrecisionRule rule;
  for (const Entry& e : kTable) {
    if (e.op == op_type) {
      rule.kind = e.kind;
      rule.reason = e.reason;
      rule.any_input_storage = op_type == "Shape" || op_type == "Size" || op_type == "Cast";
      return rule;
    }
  }
  rule.kind = OpPrecision::kReducible;
  // Inputs that are not of the op's data type T keep the model's dtype.
  if (op_type == "Resize") rule.fixed_inputs = {1, 2};  // roi, scales
  return rule;
}

bool IsInt8Candidate(const Node& node) {
  const std::string& op = node.op_type();
  bool product = op == "Conv" || op == "FusedConv" || op == "Gemm" || op == "FusedGemm" ||
                 op == "MatMul" || op == "FusedMatMul";
  return product && node.input(0) && node.input(1) && node.input(1)->is_constant() &&
         IsFloat(node.input(0)->dtype());
}

std::string LayerPrecision::label() const {
  if (int8) return "i8";
  return std::string(ToString(dtype));
}

}  // namespace kiln::precision
