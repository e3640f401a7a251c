// CacheKey digest: every component goes through one length-prefixed XXH3-128 stream.
#include "kiln/distributed/cache_key.h"

#include <fmt/format.h>

#include <algorithm>

namespace kiln::distributed {

Hash128 CacheKey::Digest() const {
  Hasher h;
  h.Field("kiln-engine-key-v1").Field(model.Hex()).Field(config.Hex()).Field(backend).Field(arch);
  // Sorted so that the order libraries were reported in does not change the key.
  std::vector<std::pair<std::string, std::string>> sorted = versions;
  std::sort(sorted.begin(), sorted.end());
  h.Field(static_cast<int64_t>(sorted.size()));
  for (const auto& [lib, version] : sorted) h.Field(lib).Field(version);
  return h.Digest();
}

std::string CacheKey::Describe() const {
  std::string libs;
  for (const auto& [lib, version] : versions) libs += fmt::format(" {}={}", lib, version);
  return fmt::format("key {} (model {}, config {}, target {}/{},{})", Hex(),
                     model.Hex().substr(0, 12), config.Hex().substr(0, 12), backend, arch, libs);
}

KeyBuilder& KeyBuilder::ModelBytes(std::span<const std::byte> bytes) {
  model_.Update(bytes);
  return *this;
}

KeyBuilder& KeyBuilder::Config(std::string_view name, std::string_view value) {
  config_.Field(name).Field(value);
  return *this;
}

KeyBuilder& KeyBuilder::Target(std::string_view backend, std::string_view arch) {
  backend_ = backend;
  arch_ = arch;
  return *this;
}

KeyBuilder& KeyBuilder::LibraryVersion(std::string_view library, std::string_view version) {
  versions_.emplace_back(library, version);
  return *this;
}

CacheKey KeyBuilder::Build() const {
  return CacheKey{model_.Digest(), config_.Digest(), backend_, arch_, versions_};
}

}  // namespace kiln::distributed
