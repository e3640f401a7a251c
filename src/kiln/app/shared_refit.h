// Refit of the engine build-once gave every rank of a group (docs/refit.md, "Distributed"): when
// every rank holds the new weights, each refits locally and nothing is sent; otherwise the lowest
// rank that holds them computes the refit and broadcasts only the engine constants that changed,
// which the others publish as they are. The C API's kiln_engine_refit_group and Python's
// kiln.distributed.refit call this one function.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/app/live_refit.h"
#include "kiln/distributed/communicator.h"

namespace kiln::app {

// One rank's new weights: the model's initializers by name and the new model's hash (an ONNX
// file's or bytes' hash, or InitializersHash of named tensors).
struct SharedRefitWeights {
  std::map<std::string, Tensor> initializers;
  Hash128 model_hash;
};

struct SharedRefitReport {
  // "local": every rank refit with its own weights (nothing sent); "relay": `source` computed the
  // refit and broadcast the constants that changed.
  std::string mode;
  int rank = 0;
  int world_size = 1;
  int source = -1;
  std::vector<int> holders;         // the ranks that passed weights
  int64_t constants_sent = 0;       // relay: constants broadcast (those that changed)
  int64_t constants_unchanged = 0;  // relay: constants the refit made with the running bytes
  int64_t bytes_sent = 0;           // relay: the broadcast payload
  uint64_t generation = 0;          // this rank's engine's weights generation after the refit
  double seconds = 0;
  RefitReport refit;  // on ranks that computed the refit (every rank in "local", else `source`)
  std::string ToJson() const;
};

// Collective over `comm`: every rank calls it with its engine (the same engine on every rank, with
// the same refits so far: KILN-E7028 otherwise, naming the ranks) and its new weights, or nullptr
// when it holds none. Ranks that pass weights must pass the same ones (KILN-E7028). The refit's
// own errors (KILN-E4007..E4009) reach every rank and leave every engine unchanged. `timeout_s`
// bounds each exchange (KILN-E7016 or the process group's error when it passes).
StatusOr<SharedRefitReport> RefitShared(LiveEngine& engine, const SharedRefitWeights* weights,
                                        distributed::Communicator& comm, double timeout_s);

}  // namespace kiln::app
