// Timing cache storage: JSON with a format tag and the device key; flock for cross-process saves.
#include "kiln/builder/timing_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "kiln/core/file_io.h"
#include "kiln/core/hash.h"
#include "kiln/core/logging.h"

namespace kiln {

namespace {
constexpr const char* kFormat = "kiln-timing-cache-v1";
constexpr auto kLockBound = std::chrono::seconds(30);
// Far above any real cache (a few hundred bytes per timed layer); a bound on what a wrong path
// (a huge file, /dev/zero behind a link) can make kiln read.
constexpr uint64_t kMaxTimingCacheBytes = uint64_t{256} << 20;

std::string AttrText(const Attribute& a) {
  return std::visit(
      [](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int64_t>) return std::to_string(v);
        if constexpr (std::is_same_v<T, float>) return fmt::format("{:a}", v);
        if constexpr (std::is_same_v<T, std::string>) return v;
        if constexpr (std::is_same_v<T, std::vector<int64_t>>)
          return fmt::format("{}", fmt::join(v, ","));
        if constexpr (std::is_same_v<T, std::vector<float>>) {
          std::string s;
          for (float f : v) s += fmt::format("{:a},", f);
          return s;
        }
        if constexpr (std::is_same_v<T, std::vector<std::string>>)
          return fmt::format("{}", fmt::join(v, ","));
        if constexpr (std::is_same_v<T, Tensor>) return HashBytes(v.bytes()).Hex();
        return "";
      },
      a);
}
}  // namespace

std::string LayerSignature(const KernelRequest& r,
                           const std::vector<std::vector<int64_t>>& opt_dims) {
  Hasher h;
  h.Field(r.node->op_type());
  for (const auto& [name, a] : r.node->attrs().all()) h.Field(name).Field(AttrText(a));
  auto operand = [&](const OperandDesc& d) {
    h.Field(ToString(d.dtype));
    h.Field(static_cast<int64_t>(d.max_dims.size()));
    for (int64_t x : d.max_dims) h.Field(x);
    // Whether an operand is a constant changes the kernels (prepacked weights); its contents
    // do not change the timing, so they stay out of the key.
    h.Field(d.constant ? 1 : 0);
  };
  for (const auto& d : r.inputs) operand(d);
  for (const auto& d : r.outputs) operand(d);
  for (const auto& dims : opt_dims) {
    h.Field(static_cast<int64_t>(dims.size()));
    for (int64_t x : dims) h.Field(x);
  }
  return fmt::format("{}:{}", r.node->op_type(), h.Digest().Hex());
}

const TimingEntry* TimingCache::Find(const std::string& signature) const {
  std::lock_guard lock(mu_);
  auto it = entries_.find(signature);
  return it == entries_.end() ? nullptr : &it->second;
}

void TimingCache::Insert(const std::string& signature, TimingEntry entry) {
  std::lock_guard lock(mu_);
  entries_[signature] = std::move(entry);
  modified_ = true;
}

bool TimingCache::modified() const {
  std::lock_guard lock(mu_);
  return modified_;
}

size_t TimingCache::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

std::string TimingCache::Serialize() const {
  std::lock_guard lock(mu_);
  nlohmann::json j;
  j["format"] = kFormat;
  j["device"] = device_key_;
  nlohmann::json entries = nlohmann::json::object();
  for (const auto& [sig, e] : entries_) {
    entries[sig] = {{"provider", e.provider_id},
                    {"tactic", e.tactic.name},
                    {"params", e.tactic.params},
                    {"workspace", e.tactic.workspace_bytes},
                    {"ms", e.time_ms}};
  }
  j["entries"] = entries;
  return j.dump(1);
}

Status TimingCache::Parse(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || j.value("format", "") != kFormat ||
      !j.contains("entries") || !j["entries"].is_object()) {
    return MakeError(ErrorCode::kTimingCacheInvalid,
                     "the timing cache is not a kiln timing cache (or is corrupt)");
  }
  if (j.value("device", "") != device_key_) {
    return MakeError(ErrorCode::kTimingCacheInvalid,
                     "the timing cache was made for '{}', not this device '{}'",
                     j.value("device", ""), device_key_);
  }
  std::map<std::string, TimingEntry> parsed;
  for (const auto& [sig, e] : j["entries"].items()) {
    if (!e.is_object() || !e.contains("provider") || !e["provider"].is_string() ||
        !e.contains("tactic") || !e["tactic"].is_string() || !e.contains("ms") ||
        !e["ms"].is_number() || !e.contains("params") || !e["params"].is_array()) {
      return MakeError(ErrorCode::kTimingCacheInvalid, "timing cache entry '{}' is malformed", sig);
    }
    TimingEntry t;
    t.provider_id = e["provider"].get<std::string>();
    t.tactic.name = e["tactic"].get<std::string>();
    for (const auto& p : e["params"]) {
      if (!p.is_number_integer()) {
        return MakeError(ErrorCode::kTimingCacheInvalid,
                         "timing cache entry '{}' has a bad parameter", sig);
      }
      t.tactic.params.push_back(p.get<int64_t>());
    }
    t.tactic.workspace_bytes = e.value("workspace", size_t{0});
    t.time_ms = e["ms"].get<double>();
    parsed[sig] = std::move(t);
  }
  std::lock_guard lock(mu_);
  for (auto& [sig, e] : parsed) entries_.emplace(sig, std::move(e));  // in-memory entries win
  return OkStatus();
}

Status TimingCache::Load(const std::string& path) {
  StatusOr<InputFile> f = OpenInputFile(path, "timing cache");
  if (!f.ok() && f.status().code() == ErrorCode::kNotFound) return OkStatus();  // no cache yet
  KILN_RETURN_IF_ERROR(f);
  StatusOr<std::string> text = ReadBounded(f->fd.get(), path, "timing cache", kMaxTimingCacheBytes);
  KILN_RETURN_IF_ERROR(text);
  Status s = Parse(*text);
  if (!s.ok()) s.AddContext(fmt::format("reading '{}'", path));
  return s;
}

Status TimingCache::Save(const std::string& path) const {
  std::string lock_path = path + ".lock";
  // The cache itself must be a writable regular file before anything is locked or merged.
  KILN_RETURN_IF_ERROR(CheckOutputPath(path, "timing cache"));
  int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    return MakeError(ErrorCode::kIoError, "cannot create the timing cache lock '{}': {}", lock_path,
                     strerror(errno));
  }
  auto deadline = std::chrono::steady_clock::now() + kLockBound;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::close(fd);
      return MakeError(ErrorCode::kTimeout,
                       "the timing cache '{}' stayed locked by another process for {} s", path,
                       kLockBound.count());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Merge with the file as it is now (another build may have added entries).
  TimingCache merged(device_key_);
  {
    std::lock_guard lock(mu_);
    merged.entries_ = entries_;
  }
  if (Status s = merged.Load(path); !s.ok()) {
    KILN_LOG(Warn, BUILD, "{} (it will be replaced)", s.ToString());
  }
  // Read above and rewritten by design: the one output allowed to replace an input.
  AtomicOutput::Options rewrite;
  rewrite.replaces_input = true;
  Status result = WriteFileAtomic(path, "timing cache", merged.Serialize(), rewrite);
  ::flock(fd, LOCK_UN);
  ::close(fd);
  return result;
}

}  // namespace kiln
