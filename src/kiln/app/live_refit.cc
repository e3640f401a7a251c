// RefitLoadedEngine (live_refit.h): compute on the host, then one publish.
#include "kiln/app/live_refit.h"

namespace kiln::app {

StatusOr<uint64_t> RefitLoadedEngine(const Engine& engine,
                                     const std::map<std::string, Tensor>& initializers,
                                     RefitReport* report) {
  KILN_ASSIGN_OR_RETURN(auto constants, ComputeRefit(engine.desc(), initializers, report));
  return engine.RefitWeights(constants);
}

}  // namespace kiln::app
