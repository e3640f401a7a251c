// A directory of verified blobs under string keys: compiled-kernel caches (cuDNN's
// runtime-compiled plans) that outlive a process, so a warm build or an engine load does not
// compile again what an earlier process compiled on the same machine.
//
// One file per key, `<dir>/<XXH3-128 of the key>.blob`: a header line with a format tag, the key's
// hash, the blob's hash and its size, then the blob. Load returns the blob only when all of them
// check out, so a torn, truncated, foreign or tampered file is a miss, never a wrong blob. Store
// writes through AtomicOutput (a reader sees the old file or the whole new one; concurrent writers
// of one key leave one of their identical blobs) with mode 0600, into a directory it creates with
// mode 0700. A directory or file that others could write (core/file_io.h DirectoryDistrust,
// FileDistrust) is not used unless KILN_TRUST_SHARED_CACHE=1: a planted blob would run as code.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/core/status.h"

namespace kiln {

class BlobStore {
 public:
  BlobStore(std::string dir, uint64_t max_blob_bytes);

  // The blob stored under `key`, or nullopt: no file, or one that fails a check (logged at DEBUG
  // with the reason).
  std::optional<std::string> Load(std::string_view key) const;
  // Stores `blob` under `key`, replacing what was there. Errors (an unwritable or untrusted
  // directory, a blob above the bound) are returned; callers treat them as a cache that is off.
  Status Store(std::string_view key, std::string_view blob) const;

  const std::string& dir() const { return dir_; }
  std::string PathFor(std::string_view key) const;

 private:
  std::string dir_;
  uint64_t max_blob_bytes_;
};

// Where kiln keeps such caches by default: $XDG_CACHE_HOME/kiln/<name>, else
// $HOME/.cache/kiln/<name>; empty when neither variable is set.
std::string DefaultCacheDir(std::string_view name);

}  // namespace kiln
