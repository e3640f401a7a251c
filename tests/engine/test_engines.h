// Small engines built in tests (and as the engine fuzzer's seeds) the way the builder will build
// them: shapes inferred, one layer per node with the first CPU provider that accepts it, memory
// planned. Graphs use Relu, Add and Identity (test-only kernels: tests/engine/test_kernels.cc).
#pragma once

#include <memory>

#include "kiln/core/status.h"
#include "kiln/engine/engine_desc.h"

namespace kiln::testing {

// Assembles an engine from `graph` (inputs, constants, nodes and outputs set; shapes inferred
// here) for the CPU backend. Test providers ("test.*") are preferred unless
// `prefer_test_providers` is false, which picks the CPU backend's own kernels where they exist.
StatusOr<std::unique_ptr<EngineDesc>> AssembleTestEngine(std::unique_ptr<Graph> graph,
                                                         OptimizationProfile profile,
                                                         bool prefer_test_providers = true);

// x[batch,4] f32 (profile batch 1/2/8) -> a = Relu(x) -> b = Add(a, w[4]) -> y = Relu(b).
// w = {-1, 0.5, 2, -3}. The first Relu carries one attribute of every kind.
std::unique_ptr<Graph> MakeChainGraph();
OptimizationProfile ChainProfile();

// Static x[2,3]: a = Relu(x); b = Add(a, x); c = Add(a, b); d = Relu(c); outputs d and b.
std::unique_ptr<Graph> MakeDiamondGraph();

// x[n,8] (profile n 1/4/16): a = Identity(x) through a workspace; y = Relu(a).
std::unique_ptr<Graph> MakeWorkspaceGraph();
OptimizationProfile WorkspaceProfile();

}  // namespace kiln::testing
