// Refit of a loaded engine between executions: the engine's weight program (builder/refit.h)
// replayed on new initializers, and the results handed to the running Engine (runtime.h
// Engine::RefitWeights), which every context takes at its next Execute.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "kiln/builder/refit.h"
#include "kiln/runtime/runtime.h"

namespace kiln::app {

// Checks `initializers` against the engine's program and replays it (KILN-E4007/E4008/E4009 as
// ComputeRefit gives them; nothing changes on an error), then publishes the new weights. Returns
// the engine's new weights generation.
StatusOr<uint64_t> RefitLoadedEngine(const Engine& engine,
                                     const std::map<std::string, Tensor>& initializers,
                                     RefitReport* report = nullptr);

}  // namespace kiln::app
