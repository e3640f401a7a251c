// What the C API's handles hold, shared by its files (kiln_c.cc, kiln_c_dist.cc, kiln_c_refit.cc);
// not installed.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/api/kiln_c.h"
#include "kiln/app/live_refit.h"
#include "kiln/builder/builder_config.h"
#include "kiln/core/status.h"
#include "kiln/runtime/runtime.h"

struct kiln_engine {
  std::shared_ptr<const kiln::EngineDesc> desc;
  std::shared_ptr<const kiln::Engine> engine;
  std::string backend;      // "cpu", "cuda"
  std::string report_json;  // the build report ("{}" when the engine carries none)
  // Refit while it runs; serialize and save write live->Current() (the refit engine).
  std::unique_ptr<kiln::app::LiveEngine> live;
};

struct kiln_build_config {
  kiln::BuilderConfig config;
  std::string backend = "auto";
  kiln_progress_fn progress = nullptr;
  void* progress_user = nullptr;
};

namespace kiln::api {

// NULL for OK; otherwise a status the caller frees.
kiln_status* ToC(const Status& s);
kiln_buffer* MakeBuffer(std::vector<std::byte> bytes);
kiln_buffer* MakeBuffer(std::string_view text);
// The engine loaded for the backend it targets (E5006 when that backend cannot run here, E4004
// for another architecture).
StatusOr<std::unique_ptr<kiln_engine>> EngineFromDesc(std::shared_ptr<const EngineDesc> desc);
// enum kiln_dtype -> DataType (nullopt for a code kiln does not know).
std::optional<DataType> FromCDtype(int32_t dtype);
// Named host tensors (kiln_engine_refit's weights) as initializers, copied; names checked.
StatusOr<std::map<std::string, Tensor>> WeightsFromC(const kiln_named_tensor* weights,
                                                     size_t count);
// The BuilderConfig a kiln_build_config stands for (backend resolved, progress wired).
StatusOr<BuilderConfig> ResolveConfig(const kiln_build_config& c);

}  // namespace kiln::api
