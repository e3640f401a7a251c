// XXH3-128 from libxxhash, wrapped so that no other file includes xxhash.h.
#include "kiln/core/hash.h"

#include <xxhash.h>

#include <fmt/format.h>

namespace kiln {

std::string Hash128::Hex() const { return fmt::format("{:016x}{:016x}", high, low); }

Hash128 HashBytes(std::span<const std::byte> bytes) {
  XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return {h.high64, h.low64};
}

Hash128 HashString(std::string_view text) {
  return HashBytes(std::as_bytes(std::span(text.data(), text.size())));
}

uint64_t Hash64(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

struct Hasher::State {
  XXH3_state_t* xxh = XXH3_createState();
  ~State() { XXH3_freeState(xxh); }
};

Hasher::Hasher() : state_(std::make_unique<State>()) { XXH3_128bits_reset(state_->xxh); }
Hasher::~Hasher() = default;

Hasher& Hasher::Update(std::span<const std::byte> bytes) {
  XXH3_128bits_update(state_->xxh, bytes.data(), bytes.size());
  return *this;
}

Hasher& Hasher::Update(std::string_view text) {
  return Update(std::as_bytes(std::span(text.data(), text.size())));
}

Hasher& Hasher::Field(std::string_view text) {
  Field(static_cast<int64_t>(text.size()));
  return Update(text);
}

Hasher& Hasher::Field(int64_t value) { return Update(std::as_bytes(std::span(&value, 1))); }

Hash128 Hasher::Digest() const {
  XXH128_hash_t h = XXH3_128bits_digest(state_->xxh);
  return {h.high64, h.low64};
}

}  // namespace kiln
