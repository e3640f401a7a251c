// BuildOnceShared: content address, then distributed::BuildOnce around the ONNX build.
#include "kiln/app/shared_build.h"

#include <fstream>
#include <map>
#include <optional>

#include "kiln/backends/backend.h"
#include "kiln/builder/refit.h"
#include "kiln/distributed/cache_key.h"
#include "kiln/engine/engine_file.h"
#include "kiln/ir/weight_program.h"
#include "kiln/onnx/calibration_data.h"
#include "kiln/onnx/onnx_import.h"

namespace kiln::app {
namespace {

// The model as imported, for a weight-free key and the refit after it.
struct ImportedModel {
  std::unique_ptr<Graph> graph;
  Hash128 file_hash;  // what a build of it records as the model hash
};

StatusOr<ImportedModel> Import(const ModelSource& model) {
  ImportedModel out;
  if (!model.path.empty()) {
    ImportOptions options;
    options.hash_file = true;
    OnnxModelMeta meta;
    KILN_ASSIGN_OR_RETURN(out.graph, ImportOnnxFile(model.path, options, &meta));
    out.file_hash = meta.file_hash;
  } else {
    KILN_ASSIGN_OR_RETURN(out.graph, ImportOnnxBytes(model.bytes, ""));
    out.file_hash = HashBytes(model.bytes);
  }
  return out;
}

StatusOr<distributed::CacheKey> EngineKey(const ModelSource& model, const BuilderConfig& config,
                                          const ImportedModel* imported) {
  KILN_ASSIGN_OR_RETURN(Backend * backend, GetBackend(config.backend));
  KILN_ASSIGN_OR_RETURN(DeviceInfo device, backend->Info());
  distributed::KeyBuilder kb;
  if (imported) {
    const Hash128 arch = WeightFreeModelHash(*imported->graph);
    kb.ModelBytes(std::as_bytes(std::span(&arch, 1)));
    kb.Config("weight-free", "1");
  } else if (!model.path.empty()) {
    std::ifstream f(model.path, std::ios::binary);
    if (!f) return MakeError(ErrorCode::kIoError, "cannot read the model '{}'", model.path);
    std::vector<char> chunk(1 << 20);
    while (f) {
      f.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      kb.ModelBytes(std::as_bytes(std::span(chunk.data(), static_cast<size_t>(f.gcount()))));
    }
  } else {
    kb.ModelBytes(model.bytes);
  }
  // The calibration data by what it holds, not where it lies: Python writes each rank's tensors
  // to a directory of its own, and a directory rewritten with other data must not hit the cache.
  // A rank that cannot read the data keys by the path, as before.
  BuilderConfig keyed = config;
  if (std::optional<Hash128> data = CalibrationDataDigest(config.calibration_dir)) {
    keyed.calibration_dir = "calibration-data:" + data->Hex();
  }
  kb.Config("builder-config", keyed.Hash().Hex());
  kb.Target(ToString(config.backend), device.arch);
  kb.LibraryVersion("kiln", KilnVersion());
  kb.LibraryVersion("backend", device.library_versions);
  return kb.Build();
}

// A weight-free key's engine may hold other weights of the architecture: each rank refits it
// with its own (the ranks hold the weights; only the engine travelled). Weights that the engine's
// build read to shape it differ: KILN-E4009, and that model needs its own key.
Status RefitToThisModel(const ImportedModel& imported, SharedBuild& out) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<EngineDesc> desc, LoadEngineBytesForEdit(out.bytes));
  if (desc->header.model_hash == imported.file_hash.Hex()) return OkStatus();
  std::map<std::string, Tensor> weights;
  for (InitializerInfo& i : CollectInitializers(*imported.graph)) {
    weights.emplace(std::move(i.name), std::move(i.value));
  }
  Status refit = RefitEngine(*desc, weights, imported.file_hash);
  if (!refit.ok()) {
    return std::move(refit).AddContext(
        "refitting the engine shared under the weight-free key with this model's weights (build "
        "without the weight-free key)");
  }
  KILN_ASSIGN_OR_RETURN(out.bytes, SerializeEngine(*desc));
  out.refit = true;
  return OkStatus();
}

}  // namespace

StatusOr<SharedBuild> BuildOnceShared(const ModelSource& model, const BuilderConfig& config,
                                      distributed::BuildOnceOptions options) {
  std::optional<ImportedModel> imported;
  if (model.weight_free_key) {
    KILN_ASSIGN_OR_RETURN(imported, Import(model));
  }
  KILN_ASSIGN_OR_RETURN(distributed::CacheKey key,
                        EngineKey(model, config, imported ? &*imported : nullptr));
  // Received (or cached) bytes are a full engine load away from being trusted.
  if (!options.verify) {
    options.verify = [](std::span<const std::byte> bytes) {
      return LoadEngineBytes(bytes).status();
    };
  }
  if (options.cache && !options.cache->verify) options.cache->verify = options.verify;
  SharedBuild out;
  auto result = distributed::BuildOnce(
      key, options, [&](distributed::ProgressSink& sink) -> StatusOr<std::vector<std::byte>> {
        BuilderConfig c = config;
        auto inner = c.progress;
        c.progress = [&sink, inner](const BuildProgress& p) {
          sink.Update(fmt::format("{} {}/{} {:.1f}s", p.phase, p.done, p.total, p.elapsed_s));
          return inner ? inner(p) : true;
        };
        StatusOr<BuiltEngine> built = model.path.empty()
                                          ? BuildFromOnnxBytes(model.bytes, model.name, c)
                                          : BuildFromOnnxFile(model.path, c);
        KILN_RETURN_IF_ERROR(built.status());
        out.build_report = built->report;
        return SerializeEngine(*built->desc);
      });
  KILN_RETURN_IF_ERROR(result.status());
  out.bytes = std::move(result->bytes);
  out.dist_report = std::move(result->report);
  if (imported) KILN_RETURN_IF_ERROR(RefitToThisModel(*imported, out));
  return out;
}

}  // namespace kiln::app
