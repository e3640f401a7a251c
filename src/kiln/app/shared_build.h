// Build once per job, as `kiln build --distributed` and the Python package's kiln.distributed do
// it: the engine's content address from the model bytes, the build config, the device and the
// library versions, then distributed::BuildOnce with the real build as its callback. The CLI and
// the C API call this one function.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/app/pipeline.h"
#include "kiln/distributed/build_once.h"

namespace kiln::app {

// The model, as a file or as bytes the caller keeps alive for the call.
struct ModelSource {
  std::string path;                  // read when not empty
  std::span<const std::byte> bytes;  // otherwise
  std::string name = "model";        // for bytes: the report's model name
  // Key the engine by the model without its weights (builder/refit.h WeightFreeModelHash): an
  // engine built (or cached) for other weights of the same architecture is refit with this
  // model's on every rank instead of rebuilt (docs/refit.md).
  bool weight_free_key = false;
};

struct SharedBuild {
  std::vector<std::byte> bytes;  // the verified engine, identical on every rank
  bool refit = false;  // weight_free_key: the shared engine was refit with this model's weights
  distributed::BuildOnceReport dist_report;
  std::optional<BuildReport> build_report;  // on the rank that built it
};

// `options.verify` defaults to a full engine load of the bytes. Each rank's key must match the
// others' in its group (KILN-E7004 otherwise).
StatusOr<SharedBuild> BuildOnceShared(const ModelSource& model, const BuilderConfig& config,
                                      distributed::BuildOnceOptions options);

}  // namespace kiln::app
