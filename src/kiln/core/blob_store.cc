#include "kiln/core/blob_store.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "kiln/core/file_io.h"
#include "kiln/core/hash.h"
#include "kiln/core/logging.h"
#include "kiln/core/params.h"

namespace kiln {
namespace {

constexpr std::string_view kTag = "kiln-blob-1";

bool TrustShared() { return param::TrustSharedCache() != 0; }

// "<tag> <key hash> <blob hash> <size>\n"
std::string Header(const Hash128& key, const Hash128& blob, uint64_t size) {
  return fmt::format("{} {} {} {}\n", kTag, key.Hex(), blob.Hex(), size);
}

}  // namespace

BlobStore::BlobStore(std::string dir, uint64_t max_blob_bytes)
    : dir_(std::move(dir)), max_blob_bytes_(max_blob_bytes) {}

std::string BlobStore::PathFor(std::string_view key) const {
  return (std::filesystem::path(dir_) / (HashString(key).Hex() + ".blob")).string();
}

std::optional<std::string> BlobStore::Load(std::string_view key) const {
  const std::string path = PathFor(key);
  auto miss = [&](std::string_view why) -> std::optional<std::string> {
    KILN_LOG(Debug, CORE, "blob store {}: {}", path, why);
    return std::nullopt;
  };
  struct stat dst;
  if (::stat(dir_.c_str(), &dst) != 0) return std::nullopt;  // nothing stored yet
  if (std::string why = DirectoryDistrust(dst); !why.empty() && !TrustShared()) {
    return miss("directory not used: " + why);
  }
  // O_NOFOLLOW: a link planted under the name is refused; O_NONBLOCK: a FIFO cannot block.
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return std::nullopt;
    return miss(std::strerror(errno));
  }
  UniqueFd owned(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return miss("not a regular file");
  if (std::string why = FileDistrust(st); !why.empty() && !TrustShared()) {
    return miss("file not used: " + why);
  }
  const Hash128 key_hash = HashString(key);
  const uint64_t header_max = Header(key_hash, key_hash, max_blob_bytes_).size();
  const uint64_t file_max =
      max_blob_bytes_ > UINT64_MAX - header_max ? UINT64_MAX : header_max + max_blob_bytes_;
  auto text = ReadBounded(fd, path, "blob", file_max);
  if (!text.ok()) return miss(text.status().ToString());
  const size_t eol = text->find('\n');
  if (eol == std::string::npos || eol + 1 > header_max) return miss("no header");
  const std::string_view header(text->data(), eol);
  // The header must be exactly the one this key and these contents get from Store.
  const std::string_view blob(text->data() + eol + 1, text->size() - eol - 1);
  const Hash128 blob_hash = HashString(blob);
  if (std::string(header) + "\n" != Header(key_hash, blob_hash, blob.size())) {
    return miss("header does not match the key, the contents or their size");
  }
  text->erase(0, eol + 1);  // the blob, without a second copy
  return std::move(*text);
}

Status BlobStore::Store(std::string_view key, std::string_view blob) const {
  if (blob.size() > max_blob_bytes_) {
    return MakeError(ErrorCode::kInvalidArgument, "blob of {} bytes exceeds the store's {} bytes",
                     blob.size(), max_blob_bytes_);
  }
  std::error_code ec;
  if (std::filesystem::create_directories(dir_, ec) && !ec) {
    std::filesystem::permissions(dir_, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::replace, ec);
  }
  if (ec) {
    return MakeError(ErrorCode::kIoError, "cannot create the directory {}: {}", dir_, ec.message());
  }
  struct stat dst;
  if (::stat(dir_.c_str(), &dst) != 0 || !S_ISDIR(dst.st_mode)) {
    return MakeError(ErrorCode::kIoError, "{} is not a directory", dir_);
  }
  if (std::string why = DirectoryDistrust(dst); !why.empty() && !TrustShared()) {
    return MakeError(ErrorCode::kIoError,
                     "not storing into {}: {} (KILN_TRUST_SHARED_CACHE=1 allows it)", dir_, why);
  }
  std::string data = Header(HashString(key), HashString(blob), blob.size());
  data.append(blob);
  AtomicOutput::Options options;
  options.replaces_input = true;
  options.mode = 0600;
  return WriteFileAtomic(PathFor(key), "blob", data, options);
}

std::string DefaultCacheDir(std::string_view name) {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    return (std::filesystem::path(xdg) / "kiln" / name).string();
  }
  if (const char* home = std::getenv("HOME"); home && *home) {
    return (std::filesystem::path(home) / ".cache" / "kiln" / name).string();
  }
  return {};
}

}  // namespace kiln
