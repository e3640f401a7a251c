// The verified on-disk blob store (core/blob_store.h): round trips, and every damaged, foreign or
// untrusted file is a miss, never a wrong blob.
#include "kiln/core/blob_store.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace kiln {
namespace {

namespace fs = std::filesystem;

class BlobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("kiln-blob-store-{}-{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Read(const std::string& path) const {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  }
  void Write(const std::string& path, const std::string& text) const {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  }
  fs::path dir_;
};

TEST_F(BlobStoreTest, StoresAndLoadsUnderItsKey) {
  BlobStore store((dir_ / "plans").string(), 1 << 20);
  EXPECT_FALSE(store.Load("a").has_value());  // no directory yet
  std::string blob = "{\"plan\": 1}\n\0binary\xff";
  blob.push_back('\0');
  ASSERT_TRUE(store.Store("a", blob).ok());
  ASSERT_TRUE(store.Store("b", "other").ok());
  EXPECT_EQ(store.Load("a"), blob);
  EXPECT_EQ(store.Load("b"), "other");
  EXPECT_FALSE(store.Load("c").has_value());
  ASSERT_TRUE(store.Store("a", "replaced").ok());
  EXPECT_EQ(store.Load("a"), "replaced");
  // Private: the directory 0700, the files 0600.
  struct stat st;
  ASSERT_EQ(::stat(store.PathFor("a").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat(store.dir().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0077, 0u);
}

TEST_F(BlobStoreTest, DamagedOrForeignFilesAreMisses) {
  BlobStore store(dir_.string(), 1 << 20);
  ASSERT_TRUE(store.Store("key", "0123456789abcdef").ok());
  const std::string path = store.PathFor("key");
  const std::string good = Read(path);

  std::string flipped = good;
  flipped.back() ^= 0x20;  // one bit of the blob
  Write(path, flipped);
  EXPECT_FALSE(store.Load("key").has_value());

  Write(path, good.substr(0, good.size() - 3));  // truncated
  EXPECT_FALSE(store.Load("key").has_value());

  Write(path, good + "extra");  // appended to
  EXPECT_FALSE(store.Load("key").has_value());

  Write(path, "");  // empty
  EXPECT_FALSE(store.Load("key").has_value());

  // Another key's file under this key's name.
  ASSERT_TRUE(store.Store("other", "0123456789abcdef").ok());
  fs::copy_file(store.PathFor("other"), path, fs::copy_options::overwrite_existing);
  EXPECT_FALSE(store.Load("key").has_value());

  Write(path, good);
  EXPECT_EQ(store.Load("key"), "0123456789abcdef");
}

TEST_F(BlobStoreTest, BoundsAndLinks) {
  BlobStore store(dir_.string(), 16);
  EXPECT_FALSE(store.Store("big", std::string(17, 'x')).ok());
  ASSERT_TRUE(store.Store("small", std::string(16, 'x')).ok());
  // A store with a larger bound wrote it; a smaller bound refuses to read it.
  BlobStore large(dir_.string(), 1024);
  ASSERT_TRUE(large.Store("big", std::string(100, 'y')).ok());
  EXPECT_FALSE(store.Load("big").has_value());
  EXPECT_EQ(large.Load("big"), std::string(100, 'y'));
  // A symbolic link under a key's name is not followed.
  fs::remove(store.PathFor("small"));
  fs::create_symlink(store.PathFor("big"), store.PathFor("small"));
  EXPECT_FALSE(store.Load("small").has_value());
  // A directory under a key's name is not a blob.
  fs::remove(store.PathFor("small"));
  fs::create_directory(store.PathFor("small"));
  EXPECT_FALSE(store.Load("small").has_value());
}

TEST_F(BlobStoreTest, DirectoriesOthersCanWriteAreNotUsed) {
  BlobStore store(dir_.string(), 1024);
  ASSERT_TRUE(store.Store("k", "v").ok());
  ASSERT_EQ(::chmod(dir_.c_str(), 0770), 0);  // group-writable, not sticky
  EXPECT_FALSE(store.Load("k").has_value());
  EXPECT_FALSE(store.Store("k", "w").ok());
  ASSERT_EQ(::chmod(dir_.c_str(), 0700), 0);
  EXPECT_EQ(store.Load("k"), "v");
  ASSERT_EQ(::chmod(store.PathFor("k").c_str(), 0666), 0);  // a file others can write
  EXPECT_FALSE(store.Load("k").has_value());
}

TEST_F(BlobStoreTest, ConcurrentWritersOfOneKeyLeaveAWholeBlob) {
  BlobStore store(dir_.string(), 1 << 20);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      for (int j = 0; j < 20; ++j) {
        ASSERT_TRUE(store.Store("k", std::string(4096, 'z')).ok());
        auto b = store.Load("k");
        ASSERT_TRUE(b.has_value());
        EXPECT_EQ(*b, std::string(4096, 'z'));
      }
    });
  }
  for (auto& t : threads) t.join();
}

TEST_F(BlobStoreTest, DefaultDirectoryFollowsXdgThenHome) {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::string saved_xdg = xdg ? xdg : "", saved_home = home ? home : "";
  ::setenv("XDG_CACHE_HOME", "/x/cache", 1);
  ::setenv("HOME", "/h", 1);
  EXPECT_EQ(DefaultCacheDir("plans"), "/x/cache/kiln/plans");
  ::unsetenv("XDG_CACHE_HOME");
  EXPECT_EQ(DefaultCacheDir("plans"), "/h/.cache/kiln/plans");
  ::unsetenv("HOME");
  EXPECT_EQ(DefaultCacheDir("plans"), "");
  if (xdg) ::setenv("XDG_CACHE_HOME", saved_xdg.c_str(), 1);
  if (home) ::setenv("HOME", saved_home.c_str(), 1);
}

}  // namespace
}  // namespace kiln
