// The content-addressed engine cache: a directory (local or on a shared file system) where the
// first process to take a key's lock builds and publishes atomically, and the others wait with a
// bound while showing the builder's heartbeat. See docs/distributed.md for the protocol.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/distributed/progress.h"

namespace kiln::distributed {

using Millis = std::chrono::milliseconds;

struct CacheOptions {
  std::filesystem::path dir;
  uint64_t max_bytes = 0;                          // 0: no size limit
  Millis wait_timeout = std::chrono::minutes(20);  // longest wait for another process's build
  Millis heartbeat_interval = Millis(1000);
  Millis stale_after = Millis(30000);  // a heartbeat unchanged this long means the builder is hung
  Millis poll_interval = Millis(50);
  Millis progress_log_interval = Millis(5000);
  VerifyFn verify;  // optional check beyond the cache's own checksum
  // Accept a directory or entries other users can write (KILN-E7010 / KILN-E7017 otherwise):
  // anyone who can write there can plant an engine that this process will run. Also set by
  // KILN_TRUST_SHARED_CACHE=1.
  bool trust_shared = false;
};

enum class CacheOutcome { kHit, kBuilt, kTookOver };
std::string_view ToString(CacheOutcome outcome);

struct CacheResult {
  std::vector<std::byte> bytes;
  CacheOutcome outcome = CacheOutcome::kHit;
  double wait_s = 0;    // time spent waiting for another builder (or the lock)
  double build_s = 0;   // time inside the build callback (0 on a hit)
  std::string builder;  // "host:pid" of the builder this process waited for, if it saw one
  int discarded_corrupt = 0;
};

// The builder's heartbeat file (<key>.hb), rewritten atomically every heartbeat interval.
struct Heartbeat {
  int64_t pid = 0;
  std::string host;
  std::string token;  // one per build attempt
  uint64_t beat = 0;  // incremented on every write; waiters judge staleness by its changes
  int64_t started_unix = 0;
  std::string progress;
};

struct CacheEntryInfo {
  std::string key;
  uint64_t bytes = 0;  // file size, header included
  std::filesystem::file_time_type last_used;
};

class EngineCache {
 public:
  // Creates the directory when missing. Refuses (KILN-E7010) a directory owned by another user
  // (root aside) or writable by group or others without the sticky bit, unless trust_shared.
  static StatusOr<std::unique_ptr<EngineCache>> Open(CacheOptions options);
  EngineCache(const EngineCache&) = delete;
  EngineCache& operator=(const EngineCache&) = delete;

  // A verified entry (NotFound when absent). A corrupt entry is removed, counted and NotFound.
  StatusOr<std::vector<std::byte>> Lookup(std::string_view key, int* discarded = nullptr);
  // The entry for `key`: from the cache, built here under the key's lock, or waited for.
  StatusOr<CacheResult> GetOrBuild(std::string_view key, const BuildFn& build);
  // Writes an entry atomically (temp file, fsync, rename, fsync of the directory).
  Status Publish(std::string_view key, std::span<const std::byte> bytes);

  StatusOr<std::vector<CacheEntryInfo>> List() const;
  // Removes least-recently-used entries until the total is at most max_bytes; never `keep`.
  StatusOr<int> Evict(uint64_t max_bytes, std::string_view keep = {});
  // Removes temp files and takeover markers older than `older_than` (left by dead writers).
  StatusOr<int> CollectGarbage(std::chrono::seconds older_than);
  // Checks every entry; returns the keys that failed (removed when `remove`).
  StatusOr<std::vector<std::string>> VerifyAll(bool remove);

  const std::filesystem::path& dir() const { return options_.dir; }
  const CacheOptions& options() const { return options_; }

  std::filesystem::path EntryPath(std::string_view key) const;
  std::filesystem::path LockPath(std::string_view key) const;
  std::filesystem::path HeartbeatPath(std::string_view key) const;
  // Created (exclusively) by the one process that replaces the build attempt `token`.
  std::filesystem::path TakeoverMarker(std::string_view key, std::string_view token) const;

 private:
  explicit EngineCache(CacheOptions options) : options_(std::move(options)) {}
  StatusOr<CacheResult> BuildAndPublish(std::string_view key, const BuildFn& build, int lock_fd,
                                        const std::filesystem::path& takeover_marker,
                                        CacheResult result);
  CacheOptions options_;
};

// Heartbeat files, public for `kiln cache ls` and tests. ReadHeartbeatChecked never follows a link
// nor waits on a FIFO and reads at most 64 KiB; a link, a special file, or (unless trust_shared)
// a file of another user or writable by others is KILN-E7017. An absent or unparsable heartbeat
// is nullopt. ReadHeartbeat is nullopt for all of those.
StatusOr<std::optional<Heartbeat>> ReadHeartbeatChecked(const std::filesystem::path& path,
                                                        bool trust_shared);
std::optional<Heartbeat> ReadHeartbeat(const std::filesystem::path& path);
Status WriteHeartbeat(const std::filesystem::path& path, const Heartbeat& hb);

// Takes the key's lock without waiting: an fd holding an open-file-description lock, -1 when
// another holder has it. Errors: read-only directory, file system without locks; a lock file that
// is a link or a special file, or (unless trust_shared) another user's or writable by others, is
// KILN-E7017 (never followed, never waited on).
StatusOr<int> TryLockFile(const std::filesystem::path& path, bool trust_shared = false);

// Whether `name` (no directory) is one the cache manages in its directory: an entry, a lock, a
// heartbeat, a takeover marker, or a temporary of one.
bool IsCacheFileName(std::string_view name);
// KILN-E1012 when `path` lies in the cache directory `dir` under a name the cache manages: the
// cache would replace, lock or remove it. A command checks each of its files with it (a model or a
// timing cache kept in the cache directory under an entry's name). OK when `dir` is not there yet.
Status CheckNotACacheFile(const std::filesystem::path& dir, const std::string& path,
                          std::string_view what);

}  // namespace kiln::distributed
