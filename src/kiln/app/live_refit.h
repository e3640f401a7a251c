// Refit of a loaded engine between executions: the engine's weight program (builder/refit.h)
// replayed on new initializers, and the results handed to the running Engine (runtime.h
// Engine::RefitWeights), which every context takes at its next Execute.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
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

// A loaded engine that is refit while it runs (what the C API's kiln_engine holds, so Python's
// engine.refit): Refit publishes the new weights to the running Engine, and Current gives the
// engine as it runs now, for save and serialize. Thread-safe; refits are serialised.
// Without a running engine (`engine` nullptr: an engine file refit on the host, as `kiln refit
// --distributed` does) Publish only records the constants, and the generation counts the refits.
class LiveEngine {
 public:
  LiveEngine(std::shared_ptr<const EngineDesc> desc, std::shared_ptr<const Engine> engine);
  LiveEngine(const LiveEngine&) = delete;
  LiveEngine& operator=(const LiveEngine&) = delete;

  // RefitLoadedEngine, then records the new constants and `model_hash` (the new model's content
  // address) for Current. On an error nothing changes, in memory or in what Current gives.
  StatusOr<uint64_t> Refit(const std::map<std::string, Tensor>& initializers,
                           const Hash128& model_hash, RefitReport* report = nullptr);

  // The two halves of Refit, for a refit shared by ranks (shared_refit.h). Compute checks and
  // replays (changes nothing); Changed keeps the constants whose bytes differ from the running
  // ones; Publish makes `constants` (all the program makes, or some) the running weights, as
  // Refit does, and records them with `model_hash` (hex).
  StatusOr<std::map<std::string, Tensor>> Compute(const std::map<std::string, Tensor>& initializers,
                                                  RefitReport* report = nullptr) const;
  std::map<std::string, Tensor> Changed(const std::map<std::string, Tensor>& constants);
  StatusOr<uint64_t> Publish(const std::map<std::string, Tensor>& constants,
                             const std::string& model_hash);
  // The model hash of the weights running now (the loaded engine's, or the last refit's).
  std::string model_hash();

  // The engine as loaded until the first refit; after one, the same engine with the refit
  // constants and model hash (the engine `kiln refit` would write), made on the first call after
  // each refit and kept until the next.
  StatusOr<std::shared_ptr<const EngineDesc>> Current();

  const std::shared_ptr<const EngineDesc>& loaded() const { return loaded_; }
  const std::shared_ptr<const Engine>& engine() const { return engine_; }

 private:
  const std::shared_ptr<const EngineDesc> loaded_;
  const std::shared_ptr<const Engine> engine_;
  std::mutex mutex_;
  bool refit_ = false;
  std::map<std::string, Tensor> constants_;  // every constant the last refit made
  std::string model_hash_;                   // hex, the last refit's
  std::shared_ptr<const EngineDesc> current_;
  uint64_t generation_ = 0;  // without a running engine: the refits published
};

}  // namespace kiln::app
