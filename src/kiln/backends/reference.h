// The reference evaluator, behind the backend interface: the CPU backend registers its node
// evaluator here (backends/cpu/cpu_eval.cc), and layers above take it from here (the builder
// hands it to passes and precision) without naming backends/cpu.
#pragma once

#include "kiln/ir/evaluator.h"

namespace kiln {

// The registered reference: an empty function when no CPU backend is linked.
const NodeEvaluator& ReferenceEvaluator();

// Called once, at static initialisation, by the backend that is the reference; returns true so
// that it can initialise a namespace-scope constant.
bool RegisterReferenceEvaluator(NodeEvaluator evaluate);

}  // namespace kiln
