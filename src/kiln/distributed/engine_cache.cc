// Engine cache implementation: open-file-description locks for mutual exclusion, a heartbeat file
// for liveness (judged by the waiter's own clock, so host clock skew does not matter), takeover
// markers so that only one waiter replaces a dead builder, and write-then-rename publishing.
#include "kiln/distributed/engine_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>

#include "kiln/core/file_io.h"
#include "kiln/core/hash.h"
#include "kiln/core/logging.h"
#include "kiln/core/params.h"
#include "kiln/distributed/log_util.h"
#include "kiln/distributed/rank.h"

namespace kiln::distributed {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Entry file layout: this header, then the engine bytes. The checksum covers the bytes.
struct EntryHeader {
  char magic[8];  // "KILNCE01"
  uint32_t version;
  uint32_t header_size;
  uint64_t size;
  uint64_t hash_high;
  uint64_t hash_low;
  char key[32];
};
static_assert(sizeof(EntryHeader) == 72);
constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'C', 'E', '0', '1'};
constexpr uint32_t kEntryVersion = 1;
constexpr std::string_view kEntrySuffix = ".engine";

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string RandomToken() {
  std::random_device rd;
  std::mt19937_64 gen((static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid()));
  return fmt::format("{:016x}", gen());
}

// Converts a failed system call on the cache into the catalog error that says what to change.
Status FileError(int err, std::string_view what, const fs::path& path) {
  if (err == ENOSPC || err == EDQUOT) {
    struct statvfs vfs {};
    uint64_t free_bytes = 0;
    if (statvfs(path.parent_path().c_str(), &vfs) == 0) {
      free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    }
    return MakeError(ErrorCode::kCacheDiskFull, "{} '{}': {} ({} bytes free)", what, path.string(),
                     std::strerror(err), free_bytes);
  }
  if (err == EROFS || err == EACCES || err == EPERM) {
    return MakeError(ErrorCode::kCacheNotWritable, "{} '{}': {}", what, path.string(),
                     std::strerror(err));
  }
  return MakeError(ErrorCode::kIoError, "{} '{}': {}", what, path.string(), std::strerror(err));
}

Status WriteAll(int fd, std::span<const std::byte> bytes, const fs::path& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, std::min<size_t>(bytes.size() - done, 1 << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return FileError(errno, "writing", path);
    }
    done += static_cast<size_t>(n);
  }
  return OkStatus();
}

// Removes `.<name>.tmp.<this host>.<pid>.*` temporaries of `path` whose writer is gone (a
// SIGKILL during a publish leaves one, up to an engine's size): the next write to the same path
// cleans up, as file_io's AtomicOutput does for the CLI's outputs.
void RemoveStaleTemps(const fs::path& path) {
  const std::string prefix = fmt::format(".{}.tmp.{}.", path.filename().string(), HostName());
  DIR* d = ::opendir(path.parent_path().c_str());
  if (d == nullptr) return;
  while (const dirent* e = ::readdir(d)) {
    std::string_view name(e->d_name);
    if (!name.starts_with(prefix)) continue;
    std::string_view rest = name.substr(prefix.size());
    int64_t pid = 0;
    auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), pid);
    if (ec != std::errc() || pid <= 0 || end == rest.data() || *end != '.') continue;
    if (pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    const fs::path stale = path.parent_path() / std::string(name);
    struct stat st {};
    if (::lstat(stale.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid()) {
      ::unlink(stale.c_str());
    }
  }
  ::closedir(d);
}

// Writes `bytes` to `path` atomically: a unique temp file in the same directory, fsync, rename,
// fsync of the directory. Readers see the old file or the whole new one, never a partial write.
Status AtomicWrite(const fs::path& path, std::span<const std::byte> head,
                   std::span<const std::byte> body) {
  // Never over a file this command read (the model or a calibration file kept in the cache
  // directory, a timing cache named like an entry).
  KILN_RETURN_IF_ERROR(CheckNotAnInput(path.string(), "engine cache file"));
  const fs::path tmp =
      path.parent_path() / fmt::format(".{}.tmp.{}.{}.{}", path.filename().string(), HostName(),
                                       getpid(), RandomToken());
  RemoveStaleTemps(path);
  // Registered before it exists: SIGTERM/SIGINT remove it, as they do the CLI's temporaries.
  TempRegistration registration(tmp.string());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return FileError(errno, "creating", tmp);
  Status s = WriteAll(fd, head, tmp);
  if (s.ok()) s = WriteAll(fd, body, tmp);
  if (s.ok() && ::fsync(fd) != 0) s = FileError(errno, "syncing", tmp);
  if (::close(fd) != 0 && s.ok()) s = FileError(errno, "closing", tmp);
  if (s.ok()) s = CheckNotAnInput(path.string(), "engine cache file");  // again, just before
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = FileError(errno, "renaming", tmp);
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  registration.Release();
  int dfd = ::open(path.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);  // Best effort: some file systems refuse fsync on directories.
    ::close(dfd);
  }
  return OkStatus();
}

bool TrustShared(const CacheOptions& options);
Status CheckControlFile(const struct stat& st, const fs::path& path, std::string_view what,
                        bool trust_shared);

// Creates `path` if nobody has: true for the one caller that did, false when it exists. O_EXCL
// never follows a link; an existing marker that is not one a kiln of this user made (a link, a
// special file, another user's file) is KILN-E7017, not a claim that would make this waiter wait.
StatusOr<bool> CreateExclusive(const fs::path& path, bool trust_shared) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ::close(fd);
    return true;
  }
  if (errno != EEXIST) return FileError(errno, "creating", path);
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return false;  // removed meanwhile: its owner finished
  KILN_RETURN_IF_ERROR(CheckControlFile(st, path, "takeover marker", trust_shared));
  return false;
}

bool PidAlive(int64_t pid) {
  if (pid <= 0) return true;  // unknown: cannot conclude it is dead
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH;
}

bool IsKeyName(std::string_view key) {
  return key.size() == 32 &&
         std::all_of(key.begin(), key.end(), [](char c) { return std::isxdigit(c) != 0; });
}

// Tracks one lock holder's heartbeat as seen from this waiter.
class StalenessTracker {
 public:
  // Returns why the holder is stale, or an empty string while it looks alive.
  std::string Observe(const std::optional<Heartbeat>& hb, Clock::time_point now,
                      Clock::duration stale_after, Clock::duration dead_grace,
                      const std::string& my_host) {
    if (!hb) {
      if (!no_hb_since_) no_hb_since_ = now;
      if (now - *no_hb_since_ > stale_after) {
        return fmt::format("the lock is held but no heartbeat appeared for {:.1f} s",
                           Seconds(now - *no_hb_since_));
      }
      return {};
    }
    no_hb_since_.reset();
    if (hb->token != token_ || hb->beat != beat_) {
      if (hb->token != token_) dead_since_.reset();
      token_ = hb->token;
      beat_ = hb->beat;
      changed_at_ = now;
    }
    if (hb->host == my_host && !PidAlive(hb->pid)) {
      // A new lock holder may not have replaced the dead builder's heartbeat yet: give it a
      // moment (it claims the dead token's takeover marker first thing).
      if (!dead_since_) dead_since_ = now;
      if (now - *dead_since_ >= dead_grace) {
        return fmt::format("builder pid {} on this host is gone", hb->pid);
      }
      return {};
    }
    dead_since_.reset();
    if (now - changed_at_ > stale_after) {
      return fmt::format("builder {}:{} has not updated its heartbeat for {:.1f} s (last: '{}')",
                         hb->host, hb->pid, Seconds(now - changed_at_), hb->progress);
    }
    return {};
  }

 private:
  std::optional<Clock::time_point> no_hb_since_;
  std::optional<Clock::time_point> dead_since_;
  std::string token_;
  uint64_t beat_ = 0;
  Clock::time_point changed_at_{};
};

// Rewrites the heartbeat file every interval until stopped.
class HeartbeatWriter {
 public:
  HeartbeatWriter(fs::path path, Heartbeat hb, Millis interval, const ProgressSink& sink)
      : path_(std::move(path)), hb_(std::move(hb)), interval_(interval), sink_(sink) {
    thread_ = std::thread([this] { Run(); });
  }
  ~HeartbeatWriter() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, interval_, [this] { return stop_; })) {
      ++hb_.beat;
      hb_.progress = sink_.Latest();
      if (Status s = WriteHeartbeat(path_, hb_); !s.ok() && !warned_) {
        KILN_LOG(Warn, DIST, "cannot update the heartbeat {}: {}", path_.string(), s.ToString());
        warned_ = true;
      }
    }
  }
  fs::path path_;
  Heartbeat hb_;
  Millis interval_;
  const ProgressSink& sink_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool warned_ = false;
  std::thread thread_;
};

// Reads and checks one entry file; returns what is wrong with it, or an empty string.
std::string ReadEntry(int fd, std::string_view key, const VerifyFn& verify,
                      std::vector<std::byte>* bytes) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return std::strerror(errno);
  EntryHeader header{};
  if (st.st_size < static_cast<off_t>(sizeof(header)) ||
      ::pread(fd, &header, sizeof(header), 0) != static_cast<ssize_t>(sizeof(header))) {
    return "shorter than its header";
  }
  if (std::memcmp(header.magic, kMagic, 8) != 0 || header.header_size != sizeof(header)) {
    return "not a kiln cache entry";
  }
  if (header.version != kEntryVersion) {
    return fmt::format("its header says entry format {}; this kiln writes and reads format {}",
                       header.version, kEntryVersion);
  }
  if (std::string_view(header.key, 32) != key) {
    return fmt::format("its header names key {}", std::string_view(header.key, 32));
  }
  if (header.size != static_cast<uint64_t>(st.st_size) - sizeof(header)) {
    return fmt::format("it holds {} bytes, its header says {}", st.st_size - sizeof(header),
                       header.size);
  }
  bytes->resize(header.size);
  size_t done = 0;
  while (done < bytes->size()) {
    ssize_t n = ::pread(fd, bytes->data() + done, bytes->size() - done, sizeof(header) + done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  if (done != bytes->size()) return "read short";
  if (HashBytes(*bytes) != Hash128{header.hash_high, header.hash_low}) return "checksum mismatch";
  if (verify) {
    if (Status v = verify(*bytes); !v.ok()) return "verification failed: " + v.ToString();
  }
  return {};
}

bool TrustShared(const CacheOptions& options) {
  return options.trust_shared || param::TrustSharedCache() != 0;
}

// The rules for the cache's lock, heartbeat and takeover files (KILN-E7017): never a symbolic
// link nor a special file (whatever the trust: a link would be followed, a FIFO could block), and
// not another user's nor writable by others unless the shared cache is trusted (who can write it
// can make every job wait on a build that never comes, or take a build over).
Status CheckControlFile(const struct stat& st, const fs::path& path, std::string_view what,
                        bool trust_shared) {
  if (S_ISLNK(st.st_mode) || !S_ISREG(st.st_mode)) {
    return MakeError(ErrorCode::kCacheEntryUntrusted,
                     "engine cache {} {} is a {}; kiln neither follows nor reads it", what,
                     path.string(), S_ISLNK(st.st_mode) ? "symbolic link" : "special file");
  }
  if (std::string why = FileDistrust(st); !why.empty()) {
    if (!trust_shared) {
      return MakeError(ErrorCode::kCacheEntryUntrusted,
                       "engine cache {} {} is not trusted: {} (accept the risk with "
                       "--trust-shared-cache)",
                       what, path.string(), why);
    }
  }
  return OkStatus();
}

}  // namespace

std::string_view ToString(CacheOutcome outcome) {
  switch (outcome) {
    case CacheOutcome::kHit:
      return "hit";
    case CacheOutcome::kBuilt:
      return "built";
    case CacheOutcome::kTookOver:
      return "took-over";
  }
  return "?";
}

StatusOr<std::optional<Heartbeat>> ReadHeartbeatChecked(const fs::path& path, bool trust_shared) {
  // O_NOFOLLOW: a link is not followed; O_NONBLOCK: a FIFO has no writer to wait for.
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return std::optional<Heartbeat>();
    struct stat lst {};
    if (::lstat(path.c_str(), &lst) == 0) {
      KILN_RETURN_IF_ERROR(CheckControlFile(lst, path, "heartbeat", trust_shared));
    }
    return FileError(err, "opening the heartbeat", path);
  }
  UniqueFd owned(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return FileError(errno, "checking the heartbeat", path);
  KILN_RETURN_IF_ERROR(CheckControlFile(st, path, "heartbeat", trust_shared));
  // A heartbeat is a line of JSON; more than this is not one kiln wrote.
  constexpr uint64_t kMaxHeartbeatBytes = 64 << 10;
  StatusOr<std::string> text = ReadBounded(fd, path.string(), "heartbeat", kMaxHeartbeatBytes);
  if (!text.ok()) return std::optional<Heartbeat>();  // unreadable: no heartbeat seen
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::optional<Heartbeat>();
  Heartbeat hb;
  hb.pid = j.value("pid", int64_t{0});
  hb.host = j.value("host", std::string());
  hb.token = j.value("token", std::string());
  hb.beat = j.value("beat", uint64_t{0});
  hb.started_unix = j.value("started_unix", int64_t{0});
  hb.progress = j.value("progress", std::string());
  return std::optional<Heartbeat>(std::move(hb));
}

std::optional<Heartbeat> ReadHeartbeat(const fs::path& path) {
  StatusOr<std::optional<Heartbeat>> hb = ReadHeartbeatChecked(path, /*trust_shared=*/false);
  return hb.ok() ? *hb : std::nullopt;
}

Status WriteHeartbeat(const fs::path& path, const Heartbeat& hb) {
  nlohmann::json j = {{"pid", hb.pid},
                      {"host", hb.host},
                      {"token", hb.token},
                      {"beat", hb.beat},
                      {"started_unix", hb.started_unix},
                      {"progress", hb.progress}};
  const std::string text = j.dump();
  return AtomicWrite(path, {}, std::as_bytes(std::span(text.data(), text.size())));
}

StatusOr<int> TryLockFile(const fs::path& path, bool trust_shared) {
  // O_NOFOLLOW: a link planted as the lock is not followed (O_CREAT through a dangling link would
  // create its target); O_NONBLOCK: opening a FIFO does not wait.
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    struct stat lst {};
    if (::lstat(path.c_str(), &lst) == 0) {
      KILN_RETURN_IF_ERROR(CheckControlFile(lst, path, "lock file", trust_shared));
    }
    return FileError(err, "opening the lock file", path);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return FileError(err, "checking the lock file", path);
  }
  if (Status s = CheckControlFile(st, path, "lock file", trust_shared); !s.ok()) {
    ::close(fd);
    return s;
  }
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  // Open-file-description locks: per open file (so threads and forks behave), released by the
  // kernel when the holder dies, and carried over NFS as POSIX locks.
  if (::fcntl(fd, F_OFD_SETLK, &fl) == 0) return fd;
  const int err = errno;
  ::close(fd);
  if (err == EAGAIN || err == EACCES) return -1;
  return MakeError(ErrorCode::kIoError,
                   "cannot lock '{}': {} (the file system may not support locks; use a local "
                   "directory or mount the shared one with lock support)",
                   path.string(), std::strerror(err));
}

StatusOr<std::unique_ptr<EngineCache>> EngineCache::Open(CacheOptions options) {
  if (options.dir.empty()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "the engine cache needs a directory (--cache-dir or KILN_CACHE_DIR)");
  }
  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec && !fs::is_directory(options.dir)) {
    return FileError(ec.value(), "creating the cache directory", options.dir / ".");
  }
  if (!fs::is_directory(options.dir)) {
    return MakeError(ErrorCode::kInvalidArgument, "cache path '{}' is not a directory",
                     options.dir.string());
  }
  struct stat st {};
  if (::stat(options.dir.c_str(), &st) != 0) return FileError(errno, "checking", options.dir / ".");
  if (std::string why = DirectoryDistrust(st); !why.empty()) {
    const std::string what = fmt::format(
        "engine cache directory {} is not private: {}; anyone who can write there can "
        "plant an engine that this job will run",
        options.dir.string(), why);
    if (!TrustShared(options)) {
      return MakeError(ErrorCode::kCacheDirInsecure,
                       "{} (accept the risk with --trust-shared-cache or "
                       "KILN_TRUST_SHARED_CACHE=1)",
                       what);
    }
    LogWithCode(LogLevel::kWarn, ErrorCode::kCacheDirInsecure,
                what + " (used anyway: the shared cache is trusted)");
  }
  return std::unique_ptr<EngineCache>(new EngineCache(std::move(options)));
}

fs::path EngineCache::EntryPath(std::string_view key) const {
  return options_.dir / (std::string(key) + std::string(kEntrySuffix));
}
fs::path EngineCache::LockPath(std::string_view key) const {
  return options_.dir / (std::string(key) + ".lock");
}
fs::path EngineCache::HeartbeatPath(std::string_view key) const {
  return options_.dir / (std::string(key) + ".hb");
}
fs::path EngineCache::TakeoverMarker(std::string_view key, std::string_view token) const {
  return options_.dir / fmt::format("{}.takeover.{}", key, token);
}

StatusOr<std::vector<std::byte>> EngineCache::Lookup(std::string_view key, int* discarded) {
  if (!IsKeyName(key)) {
    return MakeError(ErrorCode::kInvalidArgument, "'{}' is not a cache key (32 hex digits)", key);
  }
  const fs::path path = EntryPath(key);
  // O_NONBLOCK: a FIFO planted under an entry's name must not hang the lookup; O_NOFOLLOW: a
  // link there is not followed (to a file of the user's, or one of another user's).
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return MakeError(ErrorCode::kNotFound, "no cache entry {}", key);
    if (errno == ELOOP) {
      return MakeError(ErrorCode::kCacheEntryUntrusted,
                       "cache entry {} is a symbolic link; kiln does not follow links in its cache "
                       "(remove it)",
                       path.string());
    }
    return FileError(errno, "opening", path);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return MakeError(ErrorCode::kCacheEntryCorrupt, "cache entry {} is not a regular file",
                     path.string());
  }
  if (std::string why = FileDistrust(st); !why.empty()) {
    if (!TrustShared(options_)) {
      ::close(fd);
      // Neither used nor removed: the file is not ours to judge.
      return MakeError(ErrorCode::kCacheEntryUntrusted,
                       "cache entry {} is not trusted: {}; anyone who can write it can plant an "
                       "engine (accept the risk with --trust-shared-cache)",
                       path.string(), why);
    }
    LogWithCode(LogLevel::kWarn, ErrorCode::kCacheEntryUntrusted,
                fmt::format("cache entry {} is used although {}", path.string(), why));
  }
  std::vector<std::byte> bytes;
  std::string problem = ReadEntry(fd, key, options_.verify, &bytes);
  if (problem.empty()) {
    ::futimens(fd, nullptr);  // mtime is the last use, for LRU eviction; read-only caches skip it
    ::close(fd);
    return bytes;
  }
  ::close(fd);
  // Not a cache entry but a file this command reads (the model kept in the cache directory under
  // an entry's name): it is not ours to remove.
  KILN_RETURN_IF_ERROR_CTX(CheckNotAnInput(path.string(), "corrupt cache entry"),
                           "cache entry {} is not a valid entry ({})", key, problem);
  // Remove only the file we judged: a good entry may have been renamed over it meanwhile.
  struct stat now {};
  if (::lstat(path.c_str(), &now) == 0 && now.st_ino == st.st_ino) ::unlink(path.c_str());
  if (discarded) ++*discarded;
  LogWithCode(
      LogLevel::kWarn, ErrorCode::kCacheEntryCorrupt,
      fmt::format("cache entry {} discarded ({}); it will be rebuilt", path.string(), problem));
  return MakeError(ErrorCode::kNotFound, "cache entry {} was corrupt and was discarded", key);
}

Status EngineCache::Publish(std::string_view key, std::span<const std::byte> bytes) {
  EntryHeader header{};
  std::memcpy(header.magic, kMagic, 8);
  header.version = kEntryVersion;
  header.header_size = sizeof(header);
  header.size = bytes.size();
  const Hash128 h = HashBytes(bytes);
  header.hash_high = h.high;
  header.hash_low = h.low;
  std::memcpy(header.key, key.data(), std::min<size_t>(key.size(), 32));
  return AtomicWrite(EntryPath(key), std::as_bytes(std::span(&header, 1)), bytes);
}

StatusOr<CacheResult> EngineCache::GetOrBuild(std::string_view key, const BuildFn& build) {
  const Clock::time_point start = Clock::now();
  const Clock::time_point deadline = start + options_.wait_timeout;
  const std::string my_host = HostName();
  CacheResult result;
  StalenessTracker tracker;
  Clock::time_point last_log = start;
  std::optional<Heartbeat> hb;
  for (;;) {
    StatusOr<std::vector<std::byte>> hit = Lookup(key, &result.discarded_corrupt);
    if (hit.ok()) {
      result.bytes = std::move(hit).value();
      result.outcome = CacheOutcome::kHit;
      result.wait_s = Seconds(Clock::now() - start);
      if (hb) result.builder = fmt::format("{}:{}", hb->host, hb->pid);
      return result;
    }
    if (hit.status().code() != ErrorCode::kNotFound) return hit.status();

    KILN_ASSIGN_OR_RETURN(int lock_fd, TryLockFile(LockPath(key), TrustShared(options_)));
    if (lock_fd >= 0) {
      // Someone may have published between our lookup and our lock.
      hit = Lookup(key, &result.discarded_corrupt);
      if (hit.ok()) {
        ::close(lock_fd);
        continue;
      }
      result.wait_s = Seconds(Clock::now() - start);
      result.outcome = CacheOutcome::kBuilt;
      // A heartbeat left by a dead builder: claim its replacement, so that no waiter that still
      // reads that heartbeat takes over too.
      // (If a waiter already claimed it, that waiter publishes the same bytes too.)
      fs::path marker;
      StatusOr<std::optional<Heartbeat>> old =
          ReadHeartbeatChecked(HeartbeatPath(key), TrustShared(options_));
      if (!old.ok()) {
        ::close(lock_fd);
        return old.status();
      }
      if (*old) {
        marker = TakeoverMarker(key, (*old)->token);
        StatusOr<bool> claimed = CreateExclusive(marker, TrustShared(options_));
        if (!claimed.ok()) {
          ::close(lock_fd);
          return claimed.status();
        }
        if (!*claimed) marker.clear();
      }
      return BuildAndPublish(key, build, lock_fd, marker, std::move(result));
    }

    const Clock::time_point now = Clock::now();
    KILN_ASSIGN_OR_RETURN(hb, ReadHeartbeatChecked(HeartbeatPath(key), TrustShared(options_)));
    const Clock::duration dead_grace = std::min<Clock::duration>(
        options_.stale_after, std::max<Clock::duration>(4 * options_.poll_interval, Millis(200)));
    const std::string stale = tracker.Observe(hb, now, options_.stale_after, dead_grace, my_host);
    if (!stale.empty()) {
      // One waiter per stale build attempt wins the marker and rebuilds without the lock (a hung
      // holder may keep it forever); the rest keep waiting for the new builder's heartbeat.
      const fs::path marker = TakeoverMarker(key, hb ? hb->token : "nohb");
      KILN_ASSIGN_OR_RETURN(bool claimed, CreateExclusive(marker, TrustShared(options_)));
      if (claimed) {
        const bool other_host = hb && hb->host != my_host;
        LogWithCode(LogLevel::kWarn, ErrorCode::kStaleBuilderLock,
                    fmt::format("taking over the build of {}: {}{}", key, stale,
                                other_host ? fmt::format("; the lock belongs to host '{}', check "
                                                         "that host for a hung kiln process",
                                                         hb->host)
                                           : ""));
        result.wait_s = Seconds(now - start);
        result.outcome = CacheOutcome::kTookOver;
        if (hb) result.builder = fmt::format("{}:{}", hb->host, hb->pid);
        return BuildAndPublish(key, build, -1, marker, std::move(result));
      }
    }
    if (now >= deadline) {
      return MakeError(ErrorCode::kCacheWaitTimeout,
                       "waited {:.1f} s (the bound) for {} to build {}; last progress: '{}'",
                       Seconds(now - start),
                       hb ? fmt::format("builder {}:{}", hb->host, hb->pid)
                          : std::string("the holder of ") + LockPath(key).string(),
                       key, hb ? hb->progress : std::string("none"));
    }
    if (now - last_log >= options_.progress_log_interval) {
      last_log = now;
      KILN_LOG(Info, DIST, "waiting {:.0f} s of {:.0f} s for {} to build {}: {}",
               Seconds(now - start), Seconds(options_.wait_timeout),
               hb ? fmt::format("{}:{}", hb->host, hb->pid) : std::string("the lock holder"), key,
               hb ? hb->progress : std::string("(no heartbeat yet)"));
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(options_.poll_interval, deadline - now));
  }
}

StatusOr<CacheResult> EngineCache::BuildAndPublish(std::string_view key, const BuildFn& build,
                                                   int lock_fd, const fs::path& takeover_marker,
                                                   CacheResult result) {
  struct Cleanup {
    int fd;
    fs::path marker;
    ~Cleanup() {
      if (!marker.empty()) ::unlink(marker.c_str());
      if (fd >= 0) ::close(fd);
    }
  } cleanup{lock_fd, takeover_marker};

  Heartbeat hb;
  hb.pid = getpid();
  hb.host = HostName();
  hb.token = RandomToken();
  hb.started_unix = std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  hb.progress = "starting";
  const fs::path hb_path = HeartbeatPath(key);
  KILN_RETURN_IF_ERROR_CTX(WriteHeartbeat(hb_path, hb), "announcing the build of {}", key);

  ProgressSink sink;
  sink.Update("building");
  auto drop_heartbeat = [&] {
    // Leave a newer builder's heartbeat alone (after a takeover both may run).
    if (std::optional<Heartbeat> now = ReadHeartbeat(hb_path); now && now->token == hb.token) {
      ::unlink(hb_path.c_str());
    }
  };
  StatusOr<std::vector<std::byte>> bytes = MakeError(ErrorCode::kInternal, "not built");
  Status published;
  {
    // The heartbeat keeps beating through verification and publishing: writing and syncing a
    // large engine to a shared file system can take longer than the stale bound.
    HeartbeatWriter writer(hb_path, hb, options_.heartbeat_interval, sink);
    const Clock::time_point t0 = Clock::now();
    bytes = build(sink);
    result.build_s = Seconds(Clock::now() - t0);
    if (bytes.ok() && options_.verify) {
      sink.Update("verifying");
      if (Status v = options_.verify(*bytes); !v.ok()) {
        bytes = std::move(v).AddContext(fmt::format("verifying the freshly built entry {}", key));
      }
    }
    if (bytes.ok()) {
      sink.Update(fmt::format("publishing {} bytes", bytes->size()));
      published = Publish(key, *bytes);
    }
  }
  drop_heartbeat();
  if (!bytes.ok()) {
    return std::move(bytes).status().AddContext(fmt::format("building cache entry {}", key));
  }
  KILN_RETURN_IF_ERROR_CTX(published, "publishing cache entry {}", key);
  if (options_.max_bytes > 0) {
    if (StatusOr<int> evicted = Evict(options_.max_bytes, key); !evicted.ok()) {
      KILN_LOG(Warn, DIST, "cache eviction failed: {}", evicted.status().ToString());
    }
  }
  result.bytes = std::move(bytes).value();
  return result;
}

StatusOr<std::vector<CacheEntryInfo>> EngineCache::List() const {
  std::vector<CacheEntryInfo> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(options_.dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!name.ends_with(kEntrySuffix) || name.starts_with(".")) continue;
    CacheEntryInfo info;
    info.key = name.substr(0, name.size() - kEntrySuffix.size());
    // Only the cache's own entries: a user's "resnet.engine" (TensorRT's usual name) in the same
    // directory is not an entry to verify, remove or evict.
    if (!IsKeyName(info.key)) continue;
    // lstat: a link or a special file planted as an entry is listed (VerifyAll reports it), with
    // its own size, never its target's.
    struct stat st {};
    if (::lstat(e.path().c_str(), &st) != 0) continue;  // removed meanwhile
    info.bytes = S_ISREG(st.st_mode) ? static_cast<uint64_t>(st.st_size) : 0;
    std::error_code ec2;
    info.last_used =
        S_ISREG(st.st_mode) ? e.last_write_time(ec2) : fs::file_time_type::clock::now();
    if (!ec2) out.push_back(std::move(info));
  }
  if (ec) return FileError(ec.value(), "listing", options_.dir / ".");
  std::sort(out.begin(), out.end(), [](const CacheEntryInfo& a, const CacheEntryInfo& b) {
    return a.last_used < b.last_used;
  });
  return out;
}

StatusOr<int> EngineCache::Evict(uint64_t max_bytes, std::string_view keep) {
  KILN_ASSIGN_OR_RETURN(std::vector<CacheEntryInfo> entries, List());
  uint64_t total = 0;
  for (const CacheEntryInfo& e : entries) total += e.bytes;
  int removed = 0;
  for (const CacheEntryInfo& e : entries) {  // oldest use first
    if (total <= max_bytes) break;
    if (e.key == keep) continue;
    const fs::path path = EntryPath(e.key);
    if (!CheckNotAnInput(path.string(), "cache entry").ok()) continue;  // this command's input
    if (::unlink(path.c_str()) == 0) {
      total -= e.bytes;
      ++removed;
      KILN_LOG(Info, DIST, "evicted cache entry {} ({} bytes, least recently used)", e.key,
               e.bytes);
    } else if (errno != ENOENT) {
      return FileError(errno, "evicting", path);
    }
  }
  return removed;
}

StatusOr<int> EngineCache::CollectGarbage(std::chrono::seconds older_than) {
  int removed = 0;
  std::error_code ec;
  const time_t cutoff_unix = ::time(nullptr) - static_cast<time_t>(older_than.count());
  for (const fs::directory_entry& e : fs::directory_iterator(options_.dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool temp = name.starts_with(".") && name.find(".tmp.") != std::string::npos;
    const bool marker = name.find(".takeover.") != std::string::npos;
    // Only names the cache makes (.<key>.engine.tmp.*, <key>.takeover.*): never a user's file
    // that happens to contain ".tmp." or ".takeover.".
    if ((!temp && !marker) || !IsCacheFileName(name)) continue;
    if (!CheckNotAnInput(e.path().string(), "cache file").ok()) continue;
    // The link itself is judged and removed, never what it points to.
    struct stat st {};
    if (::lstat(e.path().c_str(), &st) != 0) continue;
    if (st.st_mtime < cutoff_unix && ::unlink(e.path().c_str()) == 0) ++removed;
  }
  if (ec) return FileError(ec.value(), "listing", options_.dir / ".");
  return removed;
}

StatusOr<std::vector<std::string>> EngineCache::VerifyAll(bool remove) {
  KILN_ASSIGN_OR_RETURN(std::vector<CacheEntryInfo> entries, List());
  std::vector<std::string> bad;
  for (const CacheEntryInfo& e : entries) {
    if (remove) {
      int discarded = 0;
      StatusOr<std::vector<std::byte>> r = Lookup(e.key, &discarded);
      if (discarded > 0) bad.push_back(e.key);
      continue;
    }
    int fd = ::open(EntryPath(e.key).c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ELOOP) {
      bad.push_back(e.key);
      LogWithCode(LogLevel::kWarn, ErrorCode::kCacheEntryUntrusted,
                  fmt::format("cache entry {} is a symbolic link", EntryPath(e.key).string()));
      continue;
    }
    if (fd < 0) continue;  // evicted meanwhile
    std::vector<std::byte> bytes;
    struct stat st {};
    std::string problem = ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)
                              ? std::string("not a regular file")
                              : ReadEntry(fd, e.key, options_.verify, &bytes);
    ::close(fd);
    if (!problem.empty()) {
      bad.push_back(e.key);
      LogWithCode(LogLevel::kWarn, ErrorCode::kCacheEntryCorrupt,
                  fmt::format("cache entry {} is corrupt: {}", EntryPath(e.key).string(), problem));
    } else if (std::string why = FileDistrust(st); !why.empty()) {
      bad.push_back(e.key);
      LogWithCode(LogLevel::kWarn, ErrorCode::kCacheEntryUntrusted,
                  fmt::format("cache entry {} is not trusted: {}", EntryPath(e.key).string(), why));
    }
  }
  return bad;
}

bool IsCacheFileName(std::string_view name) {
  if (name.starts_with(".")) name.remove_prefix(1);  // a temporary: .<key>.<kind>.tmp.*
  if (name.size() < 33 || !IsKeyName(name.substr(0, 32))) return false;
  const std::string_view rest = name.substr(32);
  return rest.starts_with(kEntrySuffix) || rest.starts_with(".lock") || rest.starts_with(".hb") ||
         rest.starts_with(".takeover.");
}

Status CheckNotACacheFile(const fs::path& dir, const std::string& path, std::string_view what) {
  if (path.empty()) return OkStatus();
  const fs::path p(path);
  if (!IsCacheFileName(p.filename().string())) return OkStatus();
  struct stat cache_dir {};
  struct stat parent {};
  const fs::path parent_path = p.has_parent_path() ? p.parent_path() : fs::path(".");
  if (::stat(dir.c_str(), &cache_dir) != 0 || ::stat(parent_path.c_str(), &parent) != 0 ||
      cache_dir.st_dev != parent.st_dev || cache_dir.st_ino != parent.st_ino) {
    return OkStatus();
  }
  return MakeError(ErrorCode::kOutputOverwritesInput,
                   "the {} '{}' lies in the engine cache directory {} under a name the cache "
                   "manages; the cache would replace, lock or remove it: keep the command's own "
                   "files outside the cache directory",
                   what, path, dir.string());
}

}  // namespace kiln::distributed
