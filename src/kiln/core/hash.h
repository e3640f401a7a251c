// Content hashing (XXH3-128) for engine keys, timing-cache keys and checksums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace kiln {

struct Hash128 {
  uint64_t high = 0;
  uint64_t low = 0;
  std::string Hex() const;  // 32 lowercase hex digits
  friend bool operator==(const Hash128&, const Hash128&) = default;
};

Hash128 HashBytes(std::span<const std::byte> bytes);
Hash128 HashString(std::string_view text);
uint64_t Hash64(std::span<const std::byte> bytes);

// Streaming hasher; Update in any chunks gives the same digest as one HashBytes call.
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;

  Hasher& Update(std::span<const std::byte> bytes);
  Hasher& Update(std::string_view text);
  // Length-prefixed, so ("ab","c") and ("a","bc") differ.
  Hasher& Field(std::string_view text);
  Hasher& Field(int64_t value);
  Hash128 Digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace kiln
