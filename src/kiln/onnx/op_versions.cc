// The ai.onnx operator version history (op_versions.inc, generated from the ONNX spec): which
// version of an op's interface is in effect at a model's opset.
#include <algorithm>
#include <initializer_list>
#include <unordered_map>

#include "kiln/onnx/onnx_internal.h"

namespace kiln::onnx_internal {

namespace {

struct OpHistory {
  std::vector<int> versions;  // ascending since_versions at which the interface changed
};

const std::unordered_map<std::string_view, OpHistory>& History() {
  static const auto* table = [] {
    auto* t = new std::unordered_map<std::string_view, OpHistory>();
#define KILN_ONNX_OP(name, ...) (*t)[#name] = OpHistory{std::vector<int>{__VA_ARGS__}};
#include "kiln/onnx/op_versions.inc"
#undef KILN_ONNX_OP
    return t;
  }();
  return *table;
}

}  // namespace

int EffectiveOpVersion(std::string_view op_type, int64_t opset) {
  auto it = History().find(op_type);
  if (it == History().end()) return 0;
  int best = 0;
  for (int v : it->second.versions) {
    if (v <= opset) best = v;
  }
  return best;
}

bool IsOnnxOp(std::string_view op_type) { return History().count(op_type) != 0; }

}  // namespace kiln::onnx_internal
