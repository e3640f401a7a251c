// RefitLoadedEngine and LiveEngine (live_refit.h): compute on the host, then one publish.
#include "kiln/app/live_refit.h"

#include <cstring>

#include "kiln/engine/engine_file.h"

namespace kiln::app {

StatusOr<uint64_t> RefitLoadedEngine(const Engine& engine,
                                     const std::map<std::string, Tensor>& initializers,
                                     RefitReport* report) {
  KILN_ASSIGN_OR_RETURN(auto constants, ComputeRefit(engine.desc(), initializers, report));
  return engine.RefitWeights(constants);
}

LiveEngine::LiveEngine(std::shared_ptr<const EngineDesc> desc, std::shared_ptr<const Engine> engine)
    : loaded_(std::move(desc)), engine_(std::move(engine)) {}

StatusOr<uint64_t> LiveEngine::Refit(const std::map<std::string, Tensor>& initializers,
                                     const Hash128& model_hash, RefitReport* report) {
  KILN_ASSIGN_OR_RETURN(auto constants, Compute(initializers, report));
  return Publish(constants, model_hash.Hex());
}

StatusOr<std::map<std::string, Tensor>> LiveEngine::Compute(
    const std::map<std::string, Tensor>& initializers, RefitReport* report) const {
  return ComputeRefit(engine_ ? engine_->desc() : *loaded_, initializers, report);
}

std::map<std::string, Tensor> LiveEngine::Changed(const std::map<std::string, Tensor>& constants) {
  std::lock_guard lock(mutex_);
  std::map<std::string, Tensor> changed;
  for (const auto& [name, t] : constants) {
    auto it = constants_.find(name);
    const Value* v = loaded_->graph->FindValue(name);
    const Tensor* now = it != constants_.end()  ? &it->second
                        : v && v->is_constant() ? v->constant()
                                                : nullptr;
    const bool same = now && now->dtype() == t.dtype() && now->dims() == t.dims() &&
                      std::memcmp(now->raw(), t.raw(), t.size_bytes()) == 0;
    if (!same) changed.emplace(name, t);
  }
  return changed;
}

StatusOr<uint64_t> LiveEngine::Publish(const std::map<std::string, Tensor>& constants,
                                       const std::string& model_hash) {
  // Held through the publish: the constants recorded are those of the generation published last.
  std::lock_guard lock(mutex_);
  uint64_t generation = generation_ + 1;
  if (engine_) {
    KILN_ASSIGN_OR_RETURN(generation, engine_->RefitWeights(constants));
  }
  generation_ = generation;
  for (const auto& [name, t] : constants) constants_.insert_or_assign(name, t);
  model_hash_ = model_hash;
  refit_ = true;
  current_.reset();
  return generation;
}

std::string LiveEngine::model_hash() {
  std::lock_guard lock(mutex_);
  return refit_ ? model_hash_ : loaded_->header.model_hash;
}

StatusOr<std::shared_ptr<const EngineDesc>> LiveEngine::Current() {
  std::lock_guard lock(mutex_);
  if (!refit_) return loaded_;
  if (current_) return current_;
  // The running engine shares its desc with its contexts, so the refit engine is a copy: the
  // loaded one through its own bytes, with the new constants set.
  KILN_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, SerializeEngine(*loaded_));
  LoadOptions options;
  options.check_providers = false;
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<EngineDesc> copy, LoadEngineBytesForEdit(bytes, options));
  for (const auto& [name, t] : constants_) copy->graph->FindValue(name)->set_constant(t);
  copy->header.model_hash = model_hash_;
  current_ = std::move(copy);
  return current_;
}

}  // namespace kiln::app
