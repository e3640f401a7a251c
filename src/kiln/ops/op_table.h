// What ops.inc declares about each op beyond its shape rule: traits, precision class, opset
// range, optional attributes with their defaults (and typed readers for them), and backends that
// have no kernel for an op on purpose. Code that decides by op keys on OpType through here.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/ir/attribute.h"
#include "kiln/ir/graph.h"
#include "kiln/ops/op_schema.h"

namespace kiln {

// Trait flags of KILN_OP_TRAITS rows (ops.inc says what each means).
namespace op_traits {
enum : uint32_t {
  kElementwise = 1u << 0,
  kView = 1u << 1,
  kLayoutAgnostic = 1u << 2,
  kChannelsLast = 1u << 3,
  kEpilogue = 1u << 4,
  kAnyInputStorage = 1u << 5,
};
}  // namespace op_traits

// How precision assignment may treat an op (precision/op_support.cc maps it to its rules).
enum class PrecisionClass : uint8_t { kReducible, kKeepFp32, kUntouched };

struct OpTraits {
  bool declared = false;  // false: ops.inc has no KILN_OP_TRAITS row for the op
  int first_opset = 1;
  PrecisionClass precision = PrecisionClass::kReducible;
  std::string_view precision_reason;
  uint32_t flags = 0;
  uint32_t fixed_inputs = 0;  // bit i: input i keeps the model's dtype (KILN_OP_FIXED_INPUTS)
};

// The op named `op_type` (ai.onnx), nullopt when kiln does not declare it.
std::optional<OpType> LookupOpType(std::string_view op_type);
// The node's op; OpType::kNumOps when kiln does not declare it (a foreign or misspelled op).
OpType OpTypeOf(const Node& node);
inline bool IsOp(const Node& node, OpType op) { return OpTypeOf(node) == op; }

const OpTraits& GetOpTraits(OpType op);  // kNumOps: an undeclared, default OpTraits
inline bool HasTrait(OpType op, uint32_t trait) { return (GetOpTraits(op).flags & trait) != 0; }
inline bool HasTrait(const Node& node, uint32_t trait) { return HasTrait(OpTypeOf(node), trait); }

// One KILN_OP_ATTR row.
struct AttrSpec {
  OpType op;
  std::string_view name;
  AttributeKind kind;
  Attribute default_value;
};
std::span<const AttrSpec> AllAttrSpecs();
// nullptr when `op` declares no optional attribute `name`.
const AttrSpec* FindAttrSpec(OpType op, std::string_view name);

// The float attribute `name` of a node of type `op`: its value, else the table's default, else
// `fallback` when the op declares no such attribute. For tables of ops that share one reader
// (the backends' unary activations read alpha, beta and gamma this way).
float DeclaredFloat(OpType op, const AttributeMap& attrs, std::string_view name,
                    float fallback = 0.f);

// The reason ops.inc gives for `backend` ("cpu", "cuda") having no kernel for `op`; empty when
// the backend is expected to have one.
std::string_view NoKernelReason(OpType op, std::string_view backend);

// Typed attribute readers, one per KILN_OP_ATTR row: `attrs::LeakyRelu::alpha(node)` is the
// node's "alpha" or, when absent (or of the wrong kind: the shape rule reports that), the
// table's default. `attrs::LeakyRelu::alpha_default()` is the default alone.
namespace attrs {
namespace internal {
template <typename T>
struct Reader;
template <>
struct Reader<int64_t> {
  static int64_t Get(const AttributeMap& a, const char* n, int64_t d) { return a.GetInt(n, d); }
};
template <>
struct Reader<float> {
  static float Get(const AttributeMap& a, const char* n, float d) { return a.GetFloat(n, d); }
};
template <>
struct Reader<std::string> {
  static std::string Get(const AttributeMap& a, const char* n, const std::string& d) {
    return a.GetString(n, d);
  }
};
template <>
struct Reader<std::vector<int64_t>> {
  static std::vector<int64_t> Get(const AttributeMap& a, const char* n, std::vector<int64_t> d) {
    return a.GetInts(n, std::move(d));
  }
};
template <>
struct Reader<std::vector<float>> {
  static std::vector<float> Get(const AttributeMap& a, const char* n, std::vector<float> d) {
    return a.GetFloats(n, std::move(d));
  }
};
}  // namespace internal

#define KILN_ATTR_TYPE_Int int64_t
#define KILN_ATTR_TYPE_Float float
#define KILN_ATTR_TYPE_String std::string
#define KILN_ATTR_TYPE_Ints std::vector<int64_t>
#define KILN_ATTR_TYPE_Floats std::vector<float>
#define KILN_OP_ATTR(op, attr, kind, ...)                                            \
  namespace op {                                                                     \
  inline KILN_ATTR_TYPE_##kind attr##_default() { return __VA_ARGS__; }              \
  inline KILN_ATTR_TYPE_##kind attr(const AttributeMap& a) {                         \
    return internal::Reader<KILN_ATTR_TYPE_##kind>::Get(a, #attr, attr##_default()); \
  }                                                                                  \
  inline KILN_ATTR_TYPE_##kind attr(const Node& n) { return attr(n.attrs()); }       \
  }
#include "kiln/ops/ops.inc"
#undef KILN_OP_ATTR
#undef KILN_ATTR_TYPE_Int
#undef KILN_ATTR_TYPE_Float
#undef KILN_ATTR_TYPE_String
#undef KILN_ATTR_TYPE_Ints
#undef KILN_ATTR_TYPE_Floats
}  // namespace attrs

}  // namespace kiln
