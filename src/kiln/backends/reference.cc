// Holds the reference evaluator the CPU backend registers.
#include "kiln/backends/reference.h"

#include <utility>

namespace kiln {

namespace {
NodeEvaluator& Slot() {
  static NodeEvaluator slot;
  return slot;
}
}  // namespace

const NodeEvaluator& ReferenceEvaluator() { return Slot(); }

bool RegisterReferenceEvaluator(NodeEvaluator evaluate) {
  Slot() = std::move(evaluate);
  return true;
}

}  // namespace kiln
