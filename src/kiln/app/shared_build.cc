// BuildOnceShared: content address, then distributed::BuildOnce around the ONNX build.
#include "kiln/app/shared_build.h"

#include <fstream>

#include "kiln/backends/backend.h"
#include "kiln/distributed/cache_key.h"
#include "kiln/engine/engine_file.h"

namespace kiln::app {
namespace {

StatusOr<distributed::CacheKey> EngineKey(const ModelSource& model, const BuilderConfig& config) {
  KILN_ASSIGN_OR_RETURN(Backend * backend, GetBackend(config.backend));
  KILN_ASSIGN_OR_RETURN(DeviceInfo device, backend->Info());
  distributed::KeyBuilder kb;
  if (!model.path.empty()) {
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
  kb.Config("builder-config", config.Hash().Hex());
  kb.Target(ToString(config.backend), device.arch);
  kb.LibraryVersion("kiln", KilnVersion());
  kb.LibraryVersion("backend", device.library_versions);
  return kb.Build();
}

}  // namespace

StatusOr<SharedBuild> BuildOnceShared(const ModelSource& model, const BuilderConfig& config,
                                      distributed::BuildOnceOptions options) {
  KILN_ASSIGN_OR_RETURN(distributed::CacheKey key, EngineKey(model, config));
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
  return out;
}

}  // namespace kiln::app
