// Content address of an engine: model bytes + build config + target + library versions. Two
// processes that compute the same key may share one engine; anything that changes the engine
// must be fed to the KeyBuilder.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/core/hash.h"

namespace kiln::distributed {

struct CacheKey {
  Hash128 model;        // hash of the model bytes (and external data)
  Hash128 config;       // hash of the build configuration
  std::string backend;  // "cpu", "cuda"
  std::string arch;     // "sm_90", "x86_64-avx512"
  std::vector<std::pair<std::string, std::string>> versions;  // library -> version

  Hash128 Digest() const;
  std::string Hex() const { return Digest().Hex(); }  // 32 hex digits: the cache file name
  std::string Describe() const;                       // one line for people
};

// Fed by the caller in a fixed order; streaming, so a large model need not be in memory at once.
class KeyBuilder {
 public:
  KeyBuilder& ModelBytes(std::span<const std::byte> bytes);
  // One build setting; fields are length-prefixed, so ("ab","c") differs from ("a","bc").
  KeyBuilder& Config(std::string_view name, std::string_view value);
  KeyBuilder& Target(std::string_view backend, std::string_view arch);
  KeyBuilder& LibraryVersion(std::string_view library, std::string_view version);
  CacheKey Build() const;

 private:
  Hasher model_;
  Hasher config_;
  std::string backend_;
  std::string arch_;
  std::vector<std::pair<std::string, std::string>> versions_;
};

}  // namespace kiln::distributed
