// The activation epilogues that Gemm/MatMul/Conv fusions absorb, as patterns over a body and as
// the fused ops' "activation" attributes (see FusedActivation in kiln/ops/fused.h).
#pragma once

#include "kiln/passes/pattern.h"

namespace kiln::passes {

// act(body) for every activation a fused op can carry; the activation node is captured as
// "act" (for SiLU, x * Sigmoid(x), the Mul is "act"). The body must carry a capture so that SiLU's
// two uses of it bind the same value.
Pattern ActivationOver(const Pattern& body);
// Sets activation / activation_min / activation_max from the captured "act" node; false when the
// activation's parameters cannot be expressed (a non-constant Clip bound).
bool ActivationAttrs(const Match& m, AttributeMap& attrs);

}  // namespace kiln::passes
