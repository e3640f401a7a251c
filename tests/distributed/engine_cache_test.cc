// Engine cache: hits, corruption, eviction, permissions, lock takeover and every bounded wait.
#include "kiln/distributed/engine_cache.h"

#include <gtest/gtest.h>

#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <thread>

#include "kiln/core/file_io.h"
#include "kiln/core/logging.h"
#include "kiln/distributed/rank.h"

namespace kiln::distributed {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

std::vector<std::byte> Bytes(size_t n, uint8_t fill) {
  return std::vector<std::byte>(n, std::byte{fill});
}

std::string KeyOf(int i) { return fmt::format("{:032x}", 0xabc000 + i); }

class EngineCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kiln-cache-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ::chmod(dir_.c_str(), 0700);
    old_sink_ = SetLogSink([this](const LogEvent& e) {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back(e);
    });
  }
  void TearDown() override {
    SetLogSink(old_sink_);
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, ec);
    fs::remove_all(dir_, ec);
  }
  CacheOptions Options() {
    CacheOptions o;
    o.dir = dir_;
    o.wait_timeout = milliseconds(5000);
    o.heartbeat_interval = milliseconds(50);
    o.stale_after = milliseconds(2000);
    o.poll_interval = milliseconds(10);
    return o;
  }
  std::unique_ptr<EngineCache> Open(CacheOptions o) {
    StatusOr<std::unique_ptr<EngineCache>> c = EngineCache::Open(std::move(o));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  // Messages of logged events that carry catalog code `id`.
  std::vector<std::string> Logged(std::string_view id) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const LogEvent& e : events_) {
      for (const auto& [k, v] : e.fields) {
        if (k == "code" && v == id) out.push_back(e.message);
      }
    }
    return out;
  }
  bool MountTmpfs(const char* opts) {
    if (::mount("tmpfs", dir_.c_str(), "tmpfs", 0, opts) != 0) return false;
    mounted_ = true;
    ::chmod(dir_.c_str(), 0700);
    return true;
  }

  fs::path dir_;
  bool mounted_ = false;
  std::mutex mu_;
  std::vector<LogEvent> events_;
  LogSink old_sink_;
};

BuildFn CountingBuild(std::atomic<int>* count, std::vector<std::byte> bytes,
                      milliseconds cost = milliseconds(0)) {
  return [count, bytes, cost](ProgressSink& sink) -> StatusOr<std::vector<std::byte>> {
    ++*count;
    sink.Update("building");
    std::this_thread::sleep_for(cost);
    return bytes;
  };
}

TEST_F(EngineCacheTest, MissBuildsThenHits) {
  auto cache = Open(Options());
  std::atomic<int> builds = 0;
  StatusOr<CacheResult> first = cache->GetOrBuild(KeyOf(1), CountingBuild(&builds, Bytes(1000, 7)));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->outcome, CacheOutcome::kBuilt);
  EXPECT_EQ(first->bytes, Bytes(1000, 7));
  // A second process (a new cache object) finds it without building.
  auto other = Open(Options());
  StatusOr<CacheResult> second =
      other->GetOrBuild(KeyOf(1), CountingBuild(&builds, Bytes(1000, 9)));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->outcome, CacheOutcome::kHit);
  EXPECT_EQ(second->bytes, Bytes(1000, 7));
  EXPECT_EQ(builds.load(), 1);
  EXPECT_FALSE(fs::exists(cache->HeartbeatPath(KeyOf(1))));
  EXPECT_EQ(fs::file_size(cache->EntryPath(KeyOf(1))), 1000u + 72u);
}

TEST_F(EngineCacheTest, CorruptEntryIsDiscardedAndRebuilt) {
  auto cache = Open(Options());
  ASSERT_TRUE(cache->Publish(KeyOf(2), Bytes(4096, 1)).ok());
  {
    std::fstream f(cache->EntryPath(KeyOf(2)), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(72 + 100);
    f.put('\x55');  // one flipped byte in the body
  }
  std::atomic<int> builds = 0;
  StatusOr<CacheResult> r = cache->GetOrBuild(KeyOf(2), CountingBuild(&builds, Bytes(4096, 1)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->outcome, CacheOutcome::kBuilt);
  EXPECT_EQ(r->discarded_corrupt, 1);
  EXPECT_EQ(builds.load(), 1);
  ASSERT_EQ(Logged("KILN-E7008").size(), 1u);
  EXPECT_NE(Logged("KILN-E7008")[0].find("checksum mismatch"), std::string::npos);
  // The rebuilt entry is good.
  StatusOr<std::vector<std::byte>> again = cache->Lookup(KeyOf(2));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, Bytes(4096, 1));
}

TEST_F(EngineCacheTest, TruncatedEntryIsNeverUsed) {
  auto cache = Open(Options());
  ASSERT_TRUE(cache->Publish(KeyOf(3), Bytes(4096, 2)).ok());
  fs::resize_file(cache->EntryPath(KeyOf(3)), 72 + 2000);
  int discarded = 0;
  StatusOr<std::vector<std::byte>> r = cache->Lookup(KeyOf(3), &discarded);
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(discarded, 1);
  EXPECT_FALSE(fs::exists(cache->EntryPath(KeyOf(3))));
}

TEST_F(EngineCacheTest, VerifyCallbackRejectsEntries) {
  CacheOptions o = Options();
  o.verify = [](std::span<const std::byte> b) -> Status {
    if (!b.empty() && b[0] == std::byte{'X'})
      return MakeError(ErrorCode::kEngineNotKiln, "starts with X");
    return OkStatus();
  };
  auto cache = Open(o);
  ASSERT_TRUE(cache->Publish(KeyOf(4), Bytes(10, 'X')).ok());
  int discarded = 0;
  EXPECT_EQ(cache->Lookup(KeyOf(4), &discarded).status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(discarded, 1);
  // A build whose result fails verification is never published.
  std::atomic<int> builds = 0;
  StatusOr<CacheResult> r = cache->GetOrBuild(KeyOf(4), CountingBuild(&builds, Bytes(10, 'X')));
  EXPECT_EQ(r.status().code(), ErrorCode::kEngineNotKiln);
  EXPECT_FALSE(fs::exists(cache->EntryPath(KeyOf(4))));
}

TEST_F(EngineCacheTest, LeastRecentlyUsedIsEvicted) {
  CacheOptions o = Options();
  o.max_bytes = 3 * (1000 + 72);
  auto cache = Open(o);
  std::atomic<int> builds = 0;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(cache->GetOrBuild(KeyOf(10 + i), CountingBuild(&builds, Bytes(1000, i))).ok());
    fs::last_write_time(cache->EntryPath(KeyOf(10 + i)),
                        fs::file_time_type::clock::now() - std::chrono::hours(10 - i));
  }
  // Using entry 10 makes 11 the least recently used.
  ASSERT_TRUE(cache->Lookup(KeyOf(10)).ok());
  ASSERT_TRUE(cache->GetOrBuild(KeyOf(13), CountingBuild(&builds, Bytes(1000, 3))).ok());
  EXPECT_TRUE(fs::exists(cache->EntryPath(KeyOf(10))));
  EXPECT_FALSE(fs::exists(cache->EntryPath(KeyOf(11))));
  EXPECT_TRUE(fs::exists(cache->EntryPath(KeyOf(12))));
  EXPECT_TRUE(fs::exists(cache->EntryPath(KeyOf(13))));
  StatusOr<std::vector<CacheEntryInfo>> list = cache->List();
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 3u);
}

TEST_F(EngineCacheTest, DirectoryWritableByOthersIsRefusedUnlessTrusted) {
  auto quiet = Open(Options());
  EXPECT_TRUE(Logged("KILN-E7010").empty());
  for (mode_t mode : {0777, 0775}) {
    ::chmod(dir_.c_str(), mode);
    StatusOr<std::unique_ptr<EngineCache>> refused = EngineCache::Open(Options());
    ASSERT_FALSE(refused.ok()) << std::oct << mode;
    EXPECT_EQ(refused.status().code(), ErrorCode::kCacheDirInsecure);
    EXPECT_NE(refused.status().message().find(mode == 0777 ? "every user" : "by group"),
              std::string::npos)
        << refused.status().message();
    EXPECT_NE(refused.status().message().find("--trust-shared-cache"), std::string::npos);
  }
  // Accepted with the explicit option, with the warning.
  CacheOptions trusted = Options();
  trusted.trust_shared = true;
  auto warned = Open(trusted);
  ASSERT_NE(warned, nullptr);
  ASSERT_EQ(Logged("KILN-E7010").size(), 1u);
  EXPECT_NE(Logged("KILN-E7010")[0].find("writable by group"), std::string::npos);
  // Sticky (like /tmp): others cannot replace our files; entries are checked one by one.
  ::chmod(dir_.c_str(), 01777);
  EXPECT_NE(Open(Options()), nullptr);
}

TEST_F(EngineCacheTest, DirectoryOwnedByAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to give the directory away";
  ASSERT_EQ(::chown(dir_.c_str(), 65534, 65534), 0);
  StatusOr<std::unique_ptr<EngineCache>> refused = EngineCache::Open(Options());
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kCacheDirInsecure);
  EXPECT_NE(refused.status().message().find("uid 65534"), std::string::npos);
}

TEST_F(EngineCacheTest, EntriesOthersCanWriteAreNeitherUsedNorRemoved) {
  auto cache = Open(Options());
  ASSERT_TRUE(cache->Publish(KeyOf(5), Bytes(100, 5)).ok());
  const fs::path entry = cache->EntryPath(KeyOf(5));
  ::chmod(entry.c_str(), 0666);  // planted or left writable: anyone could have changed it
  std::atomic<int> builds = 0;
  StatusOr<CacheResult> r = cache->GetOrBuild(KeyOf(5), CountingBuild(&builds, Bytes(100, 6)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCacheEntryUntrusted);
  EXPECT_NE(r.status().message().find("every user"), std::string::npos) << r.status().message();
  EXPECT_EQ(builds.load(), 0);
  EXPECT_TRUE(fs::exists(entry));
  StatusOr<std::vector<std::string>> bad = cache->VerifyAll(/*remove=*/false);
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(*bad, std::vector<std::string>{KeyOf(5)});
  // Trusted on request.
  CacheOptions trusted = Options();
  trusted.trust_shared = true;
  auto lenient = Open(trusted);
  StatusOr<std::vector<std::byte>> hit = lenient->Lookup(KeyOf(5));
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  EXPECT_EQ(*hit, Bytes(100, 5));
  if (::geteuid() == 0) {  // owned by another user
    ::chmod(entry.c_str(), 0644);
    ASSERT_EQ(::chown(entry.c_str(), 65534, 65534), 0);
    EXPECT_EQ(cache->Lookup(KeyOf(5)).status().code(), ErrorCode::kCacheEntryUntrusted);
  }
}

TEST_F(EngineCacheTest, ChangedVersionFieldIsRefused) {
  auto cache = Open(Options());
  ASSERT_TRUE(cache->Publish(KeyOf(6), Bytes(100, 6)).ok());
  {
    std::fstream f(cache->EntryPath(KeyOf(6)), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);  // the u32 version after the 8-byte magic
    f.put('\x02');
  }
  int discarded = 0;
  EXPECT_EQ(cache->Lookup(KeyOf(6), &discarded).status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(discarded, 1);
  ASSERT_EQ(Logged("KILN-E7008").size(), 1u);
  EXPECT_NE(Logged("KILN-E7008")[0].find("entry format 2"), std::string::npos)
      << Logged("KILN-E7008")[0];
}

TEST_F(EngineCacheTest, RacingThreadsBuildExactlyOnce) {
  std::atomic<int> builds = 0;
  std::vector<StatusOr<CacheResult>> results(8, MakeError(ErrorCode::kInternal, "unset"));
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto cache = EngineCache::Open(Options());
      results[t] = (*cache)->GetOrBuild(KeyOf(20),
                                        CountingBuild(&builds, Bytes(50000, 5), milliseconds(300)));
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(builds.load(), 1);
  int built = 0;
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->bytes, Bytes(50000, 5));
    built += r->outcome == CacheOutcome::kBuilt;
  }
  EXPECT_EQ(built, 1);
}

// Another process holds the lock; the test plays it with its own lock and heartbeat file.
class ForeignBuilder {
 public:
  ForeignBuilder(EngineCache& cache, std::string key, Heartbeat hb, bool beating)
      : cache_(cache), key_(std::move(key)), hb_(std::move(hb)) {
    StatusOr<int> fd = TryLockFile(cache_.LockPath(key_));
    EXPECT_TRUE(fd.ok() && *fd >= 0);
    fd_ = fd.ok() ? *fd : -1;
    if (!hb_.token.empty()) {
      EXPECT_TRUE(WriteHeartbeat(cache_.HeartbeatPath(key_), hb_).ok());
    }
    if (beating) {
      thread_ = std::thread([this] {
        while (!stop_) {
          ++hb_.beat;
          WriteHeartbeat(cache_.HeartbeatPath(key_), hb_).IgnoreError();
          std::this_thread::sleep_for(milliseconds(50));
        }
      });
    }
  }
  ~ForeignBuilder() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  EngineCache& cache_;
  std::string key_;
  Heartbeat hb_;
  int fd_ = -1;
  std::atomic<bool> stop_ = false;
  std::thread thread_;
};

Heartbeat ForeignHeartbeat(std::string host, int64_t pid) {
  Heartbeat hb;
  hb.host = std::move(host);
  hb.pid = pid;
  hb.token = "foreign-token";
  hb.beat = 1;
  hb.progress = "tactics 3/10";
  return hb;
}

TEST_F(EngineCacheTest, FreshForeignBuilderIsWaitedForWithinTheBound) {
  CacheOptions o = Options();
  o.wait_timeout = milliseconds(800);
  auto cache = Open(o);
  ForeignBuilder holder(*cache, KeyOf(30), ForeignHeartbeat("other-host", 4242), /*beating=*/true);
  std::atomic<int> builds = 0;
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<CacheResult> r = cache->GetOrBuild(KeyOf(30), CountingBuild(&builds, Bytes(10, 1)));
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCacheWaitTimeout);
  EXPECT_NE(r.status().message().find("other-host:4242"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("tactics 3/10"), std::string::npos);
  EXPECT_GE(waited, 0.8);
  EXPECT_LT(waited, 1.5);
  EXPECT_EQ(builds.load(), 0);
}

TEST_F(EngineCacheTest, StaleForeignBuilderIsTakenOverWithWarning) {
  CacheOptions o = Options();
  o.stale_after = milliseconds(300);
  auto cache = Open(o);
  ForeignBuilder holder(*cache, KeyOf(31), ForeignHeartbeat("other-host", 4242), /*beating=*/false);
  std::atomic<int> builds = 0;
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<CacheResult> r = cache->GetOrBuild(KeyOf(31), CountingBuild(&builds, Bytes(10, 1)));
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->outcome, CacheOutcome::kTookOver);
  EXPECT_EQ(r->builder, "other-host:4242");
  EXPECT_GE(waited, 0.3);
  EXPECT_LT(waited, 1.5);
  ASSERT_EQ(Logged("KILN-E7009").size(), 1u);
  EXPECT_NE(Logged("KILN-E7009")[0].find("belongs to host 'other-host'"), std::string::npos)
      << Logged("KILN-E7009")[0];
  EXPECT_TRUE(cache->Lookup(KeyOf(31)).ok());
  // The takeover marker is gone once the entry is published.
  EXPECT_FALSE(fs::exists(cache->TakeoverMarker(KeyOf(31), "foreign-token")));
}

TEST_F(EngineCacheTest, DeadBuilderOnThisHostIsTakenOverAtOnce) {
  pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);  // `child` is now a pid that no process has
  CacheOptions o = Options();
  o.stale_after = milliseconds(60000);
  auto cache = Open(o);
  // The lock is still held (say, by a subprocess that inherited it) but its builder is gone.
  ForeignBuilder holder(*cache, KeyOf(32), ForeignHeartbeat(HostName(), child), /*beating=*/false);
  std::atomic<int> builds = 0;
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<CacheResult> r = cache->GetOrBuild(KeyOf(32), CountingBuild(&builds, Bytes(10, 1)));
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->outcome, CacheOutcome::kTookOver);
  EXPECT_LT(waited, 1.0);
  ASSERT_EQ(Logged("KILN-E7009").size(), 1u);
  EXPECT_NE(Logged("KILN-E7009")[0].find(fmt::format("pid {} on this host is gone", child)),
            std::string::npos);
}

TEST_F(EngineCacheTest, LockWithoutHeartbeatIsTakenOverAfterTheStaleBound) {
  CacheOptions o = Options();
  o.stale_after = milliseconds(300);
  auto cache = Open(o);
  ForeignBuilder holder(*cache, KeyOf(33), Heartbeat{}, /*beating=*/false);
  std::atomic<int> builds = 0;
  StatusOr<CacheResult> r = cache->GetOrBuild(KeyOf(33), CountingBuild(&builds, Bytes(10, 1)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->outcome, CacheOutcome::kTookOver);
  EXPECT_NE(Logged("KILN-E7009")[0].find("no heartbeat appeared"), std::string::npos);
}

TEST_F(EngineCacheTest, FailedBuildLeavesNoEntryNoHeartbeatNoLock) {
  auto cache = Open(Options());
  StatusOr<CacheResult> r =
      cache->GetOrBuild(KeyOf(34), [](ProgressSink&) -> StatusOr<std::vector<std::byte>> {
        return MakeError(ErrorCode::kNoTactic, "no tactic for layer conv1");
      });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kNoTactic);
  EXPECT_FALSE(fs::exists(cache->EntryPath(KeyOf(34))));
  EXPECT_FALSE(fs::exists(cache->HeartbeatPath(KeyOf(34))));
  StatusOr<int> fd = TryLockFile(cache->LockPath(KeyOf(34)));
  ASSERT_TRUE(fd.ok());
  EXPECT_GE(*fd, 0);
  ::close(*fd);
}

TEST_F(EngineCacheTest, HeartbeatCarriesBuilderProgress) {
  auto cache = Open(Options());
  // The build holds until the waiter has read its progress from the heartbeat file (an event, not
  // a sleep that hopes to be long enough); both sides give up after 10 s.
  std::mutex mu;
  std::condition_variable cv;
  bool seen = false;
  auto waiter = std::thread([&] {
    for (int i = 0; i < 1000; ++i) {
      std::optional<Heartbeat> hb = ReadHeartbeat(cache->HeartbeatPath(KeyOf(35)));
      if (hb && hb->progress == "layer 7 of 9" && hb->pid == getpid()) {
        std::lock_guard lock(mu);
        seen = true;
        cv.notify_all();
        return;
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
  });
  StatusOr<CacheResult> r =
      cache->GetOrBuild(KeyOf(35), [&](ProgressSink& s) -> StatusOr<std::vector<std::byte>> {
        s.Update("layer 7 of 9");
        std::unique_lock lock(mu);
        cv.wait_for(lock, std::chrono::seconds(10), [&] { return seen; });
        return Bytes(10, 3);
      });
  waiter.join();
  ASSERT_TRUE(r.ok());
  std::lock_guard lock(mu);
  EXPECT_TRUE(seen);
}

TEST_F(EngineCacheTest, ReadOnlyDirectoryServesHitsAndRefusesBuilds) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to mount a read-only tmpfs (root ignores chmod)";
  if (!MountTmpfs("size=4m")) GTEST_SKIP() << "mount not permitted here";
  {
    auto rw = Open(Options());
    ASSERT_TRUE(rw->Publish(KeyOf(40), Bytes(100, 4)).ok());
  }
  ASSERT_EQ(::mount(nullptr, dir_.c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr), 0);
  auto cache = Open(Options());
  std::atomic<int> builds = 0;
  StatusOr<CacheResult> hit = cache->GetOrBuild(KeyOf(40), CountingBuild(&builds, Bytes(100, 4)));
  ASSERT_TRUE(hit.ok()) << hit.status().ToString();
  EXPECT_EQ(hit->outcome, CacheOutcome::kHit);
  StatusOr<CacheResult> miss = cache->GetOrBuild(KeyOf(41), CountingBuild(&builds, Bytes(100, 4)));
  ASSERT_FALSE(miss.ok());
  EXPECT_EQ(miss.status().code(), ErrorCode::kCacheNotWritable);
  EXPECT_NE(miss.status().message().find("Read-only file system"), std::string::npos)
      << miss.status().message();
  EXPECT_EQ(builds.load(), 0);
}

TEST_F(EngineCacheTest, FullDiskIsACatalogErrorAndLeavesNoTempFile) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to mount a small tmpfs";
  if (!MountTmpfs("size=1m")) GTEST_SKIP() << "mount not permitted here";
  auto cache = Open(Options());
  std::atomic<int> builds = 0;
  StatusOr<CacheResult> r = cache->GetOrBuild(KeyOf(42), CountingBuild(&builds, Bytes(3 << 20, 6)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCacheDiskFull);
  EXPECT_NE(r.status().message().find("bytes free"), std::string::npos) << r.status().message();
  for (const fs::directory_entry& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
  EXPECT_FALSE(fs::exists(cache->EntryPath(KeyOf(42))));
}

TEST_F(EngineCacheTest, GarbageAndVerifyAll) {
  auto cache = Open(Options());
  ASSERT_TRUE(cache->Publish(KeyOf(50), Bytes(100, 1)).ok());
  ASSERT_TRUE(cache->Publish(KeyOf(51), Bytes(100, 2)).ok());
  fs::resize_file(cache->EntryPath(KeyOf(51)), 100);
  const fs::path orphan = dir_ / ("." + KeyOf(52) + ".engine.tmp.host.1.abc");
  std::ofstream(orphan) << "partial";
  fs::last_write_time(orphan, fs::file_time_type::clock::now() - std::chrono::hours(2));
  // Files of the user's that only look alike are not the cache's: never verified nor removed.
  for (const char* name : {".notes.tmp.old", "plan.takeover.txt", "resnet50.engine"}) {
    std::ofstream(dir_ / name) << "the user's";
    fs::last_write_time(dir_ / name, fs::file_time_type::clock::now() - std::chrono::hours(2));
  }
  StatusOr<std::vector<std::string>> bad = cache->VerifyAll(/*remove=*/false);
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(*bad, std::vector<std::string>{KeyOf(51)});
  EXPECT_TRUE(fs::exists(cache->EntryPath(KeyOf(51))));
  bad = cache->VerifyAll(/*remove=*/true);
  EXPECT_EQ(*bad, std::vector<std::string>{KeyOf(51)});
  EXPECT_FALSE(fs::exists(cache->EntryPath(KeyOf(51))));
  StatusOr<int> removed = cache->CollectGarbage(std::chrono::hours(1));
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(*removed, 1);
  EXPECT_FALSE(fs::exists(orphan));
  ASSERT_TRUE(cache->Evict(0).ok());
  for (const char* name : {".notes.tmp.old", "plan.takeover.txt", "resnet50.engine"}) {
    EXPECT_TRUE(fs::exists(dir_ / name)) << name;
  }
}

// ---- lock, heartbeat and takeover files get the entries' trust rules (issue 17) ----------------

int NeverBuild(std::atomic<int>* builds) { return builds->load(); }

TEST_F(EngineCacheTest, LinkedOrSpecialLockFileIsRefusedNeverFollowed) {
  auto cache = Open(Options());
  std::atomic<int> builds = 0;
  // A dangling link: following it with O_CREAT would create its target.
  const fs::path target = dir_ / "created-through-the-link";
  fs::create_symlink(target, cache->LockPath(KeyOf(60)));
  StatusOr<CacheResult> r = cache->GetOrBuild(KeyOf(60), CountingBuild(&builds, Bytes(10, 1)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCacheEntryUntrusted) << r.status().ToString();
  EXPECT_NE(r.status().message().find("symbolic link"), std::string::npos) << r.status().message();
  EXPECT_FALSE(fs::exists(target));
  EXPECT_EQ(NeverBuild(&builds), 0);

  // A FIFO as the lock: refused at once, even with the shared cache trusted.
  ASSERT_EQ(::mkfifo(cache->LockPath(KeyOf(61)).c_str(), 0600), 0);
  CacheOptions trusted = Options();
  trusted.trust_shared = true;
  auto trusting = Open(trusted);
  const auto t0 = std::chrono::steady_clock::now();
  r = trusting->GetOrBuild(KeyOf(61), CountingBuild(&builds, Bytes(10, 1)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCacheEntryUntrusted) << r.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_EQ(NeverBuild(&builds), 0);
}

TEST_F(EngineCacheTest, HeartbeatThatIsAFifoOrALinkNeitherBlocksNorIsRead) {
  auto cache = Open(Options());
  std::atomic<int> builds = 0;
  // A FIFO without a writer: an ordinary open for reading would wait forever.
  ASSERT_EQ(::mkfifo(cache->HeartbeatPath(KeyOf(62)).c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<CacheResult> r = cache->GetOrBuild(KeyOf(62), CountingBuild(&builds, Bytes(10, 1)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCacheEntryUntrusted) << r.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  // A link to an endless device: not followed.
  fs::create_symlink("/dev/zero", cache->HeartbeatPath(KeyOf(63)));
  r = cache->GetOrBuild(KeyOf(63), CountingBuild(&builds, Bytes(10, 1)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCacheEntryUntrusted) << r.status().ToString();
  EXPECT_NE(r.status().message().find("heartbeat"), std::string::npos) << r.status().message();
  EXPECT_FALSE(ReadHeartbeat(cache->HeartbeatPath(KeyOf(63))).has_value());
  EXPECT_EQ(NeverBuild(&builds), 0);
  // A heartbeat larger than any kiln writes is not one.
  std::ofstream(cache->HeartbeatPath(KeyOf(64))) << std::string(1 << 20, ' ');
  EXPECT_FALSE(ReadHeartbeat(cache->HeartbeatPath(KeyOf(64))).has_value());
}

TEST_F(EngineCacheTest, ControlFilesWritableByOthersAreRefusedUnlessTrusted) {
  auto cache = Open(Options());
  std::atomic<int> builds = 0;
  std::ofstream(cache->LockPath(KeyOf(65))).flush();
  ASSERT_EQ(::chmod(cache->LockPath(KeyOf(65)).c_str(), 0666), 0);
  StatusOr<CacheResult> r = cache->GetOrBuild(KeyOf(65), CountingBuild(&builds, Bytes(10, 1)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCacheEntryUntrusted) << r.status().ToString();
  EXPECT_NE(r.status().message().find("--trust-shared-cache"), std::string::npos);
  Heartbeat hb;
  hb.pid = 1;
  hb.host = "elsewhere";
  hb.token = "planted";
  ASSERT_TRUE(WriteHeartbeat(cache->HeartbeatPath(KeyOf(66)), hb).ok());
  ASSERT_EQ(::chmod(cache->HeartbeatPath(KeyOf(66)).c_str(), 0646), 0);
  r = cache->GetOrBuild(KeyOf(66), CountingBuild(&builds, Bytes(10, 1)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCacheEntryUntrusted) << r.status().ToString();
  EXPECT_EQ(NeverBuild(&builds), 0);
  if (geteuid() == 0) {  // another user's lock file, mode 0644
    ASSERT_EQ(::chmod(cache->LockPath(KeyOf(65)).c_str(), 0644), 0);
    ASSERT_EQ(::chown(cache->LockPath(KeyOf(65)).c_str(), 65534, 65534), 0);
    r = cache->GetOrBuild(KeyOf(65), CountingBuild(&builds, Bytes(10, 1)));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("another user"), std::string::npos) << r.status().message();
  }
  // Accepted when the shared cache is trusted.
  CacheOptions trusted = Options();
  trusted.trust_shared = true;
  auto trusting = Open(trusted);
  r = trusting->GetOrBuild(KeyOf(65), CountingBuild(&builds, Bytes(10, 1)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->outcome, CacheOutcome::kBuilt);
}

TEST_F(EngineCacheTest, PlantedTakeoverMarkerDoesNotHoldTheWaiterToItsBound) {
  CacheOptions o = Options();
  o.stale_after = milliseconds(200);
  auto cache = Open(o);
  // A holder of the lock that never writes a heartbeat; the waiter's takeover marker for that
  // case is planted as a link.
  ForeignBuilder holder(*cache, KeyOf(67), Heartbeat{}, /*beating=*/false);
  fs::create_symlink(dir_ / "elsewhere", cache->TakeoverMarker(KeyOf(67), "nohb"));
  std::atomic<int> builds = 0;
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<CacheResult> r = cache->GetOrBuild(KeyOf(67), CountingBuild(&builds, Bytes(10, 1)));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kCacheEntryUntrusted) << r.status().ToString();
  EXPECT_NE(r.status().message().find("takeover marker"), std::string::npos);
  // Long before the 5 s wait bound.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
  EXPECT_FALSE(fs::exists(dir_ / "elsewhere"));
  EXPECT_EQ(NeverBuild(&builds), 0);
}

TEST_F(EngineCacheTest, LinkedEntryIsNotFollowed) {
  auto cache = Open(Options());
  ASSERT_TRUE(cache->Publish(KeyOf(68), Bytes(100, 1)).ok());
  fs::rename(cache->EntryPath(KeyOf(68)), dir_ / "real-entry");
  fs::create_symlink(dir_ / "real-entry", cache->EntryPath(KeyOf(68)));
  StatusOr<std::vector<std::byte>> hit = cache->Lookup(KeyOf(68));
  ASSERT_FALSE(hit.ok());
  EXPECT_EQ(hit.status().code(), ErrorCode::kCacheEntryUntrusted) << hit.status().ToString();
  StatusOr<std::vector<std::string>> bad = cache->VerifyAll(/*remove=*/false);
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(*bad, std::vector<std::string>{KeyOf(68)});
}

// Library writers check their targets against the command's inputs (file_io's guard): the model
// kept in the cache directory under an entry's name is neither discarded as a corrupt entry nor
// replaced by a published one, nor evicted.
TEST_F(EngineCacheTest, InputsOfTheCommandAreNeverReplacedNorRemoved) {
  GuardInputsOfThisProcess(true);
  auto cache = Open(Options());
  const fs::path model = cache->EntryPath(KeyOf(69));
  std::ofstream(model) << "an ONNX model, not a cache entry";
  ASSERT_TRUE(OpenInputFile(model.string(), "model").ok());
  StatusOr<std::vector<std::byte>> hit = cache->Lookup(KeyOf(69));
  EXPECT_EQ(hit.status().code(), ErrorCode::kOutputOverwritesInput) << hit.status().ToString();
  Status pub = cache->Publish(KeyOf(69), Bytes(10, 1));
  EXPECT_EQ(pub.code(), ErrorCode::kOutputOverwritesInput) << pub.ToString();
  ASSERT_TRUE(cache->Evict(0).ok());
  // The heartbeat too: a calibration cache named like it is an input of the command.
  const fs::path calib = cache->HeartbeatPath(KeyOf(70));
  std::ofstream(calib) << "{}";
  FileRoles roles;
  roles.InOut(calib.string(), "calibration cache");
  ASSERT_TRUE(roles.Check().ok());
  std::atomic<int> builds = 0;
  StatusOr<CacheResult> r = cache->GetOrBuild(KeyOf(70), CountingBuild(&builds, Bytes(10, 1)));
  EXPECT_EQ(r.status().code(), ErrorCode::kOutputOverwritesInput) << r.status().ToString();
  GuardInputsOfThisProcess(false);
  std::ifstream in(model);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "an ONNX model, not a cache entry");
  std::ifstream in2(calib);
  std::string text2((std::istreambuf_iterator<char>(in2)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text2, "{}");
}

}  // namespace
}  // namespace kiln::distributed
