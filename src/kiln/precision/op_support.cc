// What each op allows before kernels are asked, from the op table (ops.inc: the precision class
// and reason of each op's KILN_OP_TRAITS row, KILN_OP_FIXED_INPUTS), and the INT8 candidates.
#include "kiln/ops/op_table.h"
#include "kiln/precision/precision.h"

namespace kiln::precision {

using kiln::ToString;

OpPrecisionRule LookupOpPrecision(OpType op) {
  // The class and its reason are the op's KILN_OP_TRAITS row in ops.inc; an op kiln does not
  // declare is reducible (its kernels decide).
  const OpTraits& traits = GetOpTraits(op);
  OpPrecisionRule rule;
  switch (traits.precision) {
    case PrecisionClass::kReducible:
      rule.kind = OpPrecision::kReducible;
      break;
    case PrecisionClass::kKeepFp32:
      rule.kind = OpPrecision::kKeepFp32;
      break;
    case PrecisionClass::kUntouched:
      rule.kind = OpPrecision::kUntouched;
      break;
  }
  rule.reason = traits.precision_reason;
  rule.any_input_storage = (traits.flags & op_traits::kAnyInputStorage) != 0;
  for (int i = 0; i < 32; ++i) {
    if (traits.fixed_inputs & (1u << i)) rule.fixed_inputs.push_back(i);
  }
  return rule;
}

OpPrecisionRule LookupOpPrecision(std::string_view op_type) {
  return LookupOpPrecision(LookupOpType(op_type).value_or(OpType::kNumOps));
}

bool IsInt8Candidate(const Node& node) {
  bool product = false;
  switch (OpTypeOf(node)) {
    case OpType::kConv:
    case OpType::kFusedConv:
    case OpType::kGemm:
    case OpType::kFusedGemm:
    case OpType::kMatMul:
    case OpType::kFusedMatMul:
      product = true;
      break;
    default:
      break;
  }
  return product && node.input(0) && node.input(1) && node.input(1)->is_constant() &&
         IsFloat(node.input(0)->dtype());
}

bool IsFp8Candidate(const Node& node) {
  const OpType t = OpTypeOf(node);
  return IsInt8Candidate(node) && t != OpType::kConv && t != OpType::kFusedConv;
}

std::string LayerPrecision::label() const {
  if (int8) return "i8";
  if (fp8) return "f8";
  return std::string(ToString(dtype));
}

}  // namespace kiln::precision
