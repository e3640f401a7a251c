// The traits, attribute and no-kernel tables built from ops.inc, and the op-type lookup.
#include "kiln/ops/op_table.h"

#include <algorithm>
#include <array>
#include <unordered_map>

namespace kiln {

namespace {

constexpr size_t kNumOps = static_cast<size_t>(OpType::kNumOps);
constexpr size_t Index(OpType op) { return static_cast<size_t>(op); }

// Reasons shared by several rows of ops.inc.
constexpr std::string_view kReasonCast = "explicit Cast: keeps the model's target type";
constexpr std::string_view kReasonShapeOp = "integer/shape op: keeps the model's types";
constexpr std::string_view kReasonCompare = "comparison: compares the model's values exactly";
constexpr std::string_view kReasonIndexOutput =
    "index output: ties must resolve on the model's values";
constexpr std::string_view kReasonQuantize =
    "quantize/dequantize: keeps the model's scales and integer types";
constexpr std::string_view kReasonSums =
    "sum over many elements can leave the FP16 range; kept FP32 for accuracy";

constexpr uint32_t InputMask(std::initializer_list<int> inputs) {
  uint32_t mask = 0;
  for (int i : inputs) mask |= 1u << i;
  return mask;
}

constexpr std::array<OpTraits, kNumOps + 1> kTraits = [] {
  using namespace op_traits;
  std::array<OpTraits, kNumOps + 1> t{};
#define KILN_OP_TRAITS(name, first, prec, reason, flag_bits) \
  t[Index(OpType::k##name)] =                                \
      OpTraits{true, first, PrecisionClass::k##prec, reason, static_cast<uint32_t>(flag_bits), 0};
#define KILN_OP_FIXED_INPUTS(name, ...) \
  t[Index(OpType::k##name)].fixed_inputs = InputMask({__VA_ARGS__});
#include "kiln/ops/ops.inc"
#undef KILN_OP_TRAITS
#undef KILN_OP_FIXED_INPUTS
  return t;
}();

struct NoKernel {
  OpType op;
  std::string_view backend;
  std::string_view reason;
};
constexpr NoKernel kNoKernels[] = {
#define KILN_OP_NO_KERNEL(name, backend, reason) {OpType::k##name, #backend, reason},
#include "kiln/ops/ops.inc"
#undef KILN_OP_NO_KERNEL
    {OpType::kNumOps, "", ""},  // keeps the array non-empty
};

}  // namespace

std::optional<OpType> LookupOpType(std::string_view op_type) {
  const OpSchema* schema = FindOpSchema(op_type);
  if (!schema) return std::nullopt;
  return schema->type;
}

OpType OpTypeOf(const Node& node) {
  const OpSchema* schema = FindOpSchema(node.op_type());
  return schema ? schema->type : OpType::kNumOps;
}

const OpTraits& GetOpTraits(OpType op) { return kTraits[std::min(Index(op), kNumOps)]; }

std::span<const AttrSpec> AllAttrSpecs() {
  static const std::vector<AttrSpec>* specs = [] {
    auto* v = new std::vector<AttrSpec>();
#define KILN_OP_ATTR(op, attr, kind, ...) \
  v->push_back(                           \
      {OpType::k##op, #attr, AttributeKind::k##kind, Attribute(attrs::op::attr##_default())});
#include "kiln/ops/ops.inc"
#undef KILN_OP_ATTR
    return v;
  }();
  return *specs;
}

const AttrSpec* FindAttrSpec(OpType op, std::string_view name) {
  for (const AttrSpec& s : AllAttrSpecs()) {
    if (s.op == op && s.name == name) return &s;
  }
  return nullptr;
}

float DeclaredFloat(OpType op, const AttributeMap& attrs, std::string_view name, float fallback) {
  const AttrSpec* spec = FindAttrSpec(op, name);
  if (!spec || spec->kind != AttributeKind::kFloat) return fallback;
  return attrs.GetFloat(std::string(name), std::get<float>(spec->default_value));
}

std::string_view NoKernelReason(OpType op, std::string_view backend) {
  for (const NoKernel& n : kNoKernels) {
    if (n.op == op && n.backend == backend) return n.reason;
  }
  return {};
}

}  // namespace kiln
