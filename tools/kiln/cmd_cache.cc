// `kiln cache ls|gc|verify`: look after the engine cache directory (docs/distributed.md).
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <iostream>

#include "kiln/core/params.h"
#include "kiln/distributed/engine_cache.h"
#include "tools/kiln/command.h"
#include "tools/kiln/options.h"

namespace kiln::cli {
namespace {

struct CacheCmdOptions {
  std::string dir;
  bool json = false;
  uint64_t max_bytes = 0;
  int older_than_s = 3600;
  bool remove = false;
  bool trust_shared = false;
};

StatusOr<std::unique_ptr<distributed::EngineCache>> OpenCache(const CacheCmdOptions& o) {
  distributed::CacheOptions c;
  c.dir = o.dir.empty() ? param::CacheDir() : o.dir;
  c.trust_shared = o.trust_shared;
  if (c.dir.empty()) {
    return MakeError(ErrorCode::kInvalidArgument,
                     "no cache directory: pass --dir or set KILN_CACHE_DIR");
  }
  // Looking after a cache that is not there is a mistake (a typo in --dir), not an empty cache:
  // "0 corrupt entries" would be a false all-clear.
  std::error_code ec;
  if (!std::filesystem::is_directory(c.dir, ec)) {
    return MakeError(ErrorCode::kNotFound,
                     "cache directory '{}' does not exist or is not a directory{}", c.dir.string(),
                     ec ? fmt::format(" ({})", ec.message()) : std::string());
  }
  return distributed::EngineCache::Open(c);
}

int Ls(const CacheCmdOptions& o) {
  auto cache = OpenCache(o);
  if (!cache.ok()) return ReportError(cache.status());
  auto entries = (*cache)->List();
  if (!entries.ok()) return ReportError(entries.status());
  nlohmann::json out = nlohmann::json::array();
  uint64_t total = 0;
  const auto now = std::filesystem::file_time_type::clock::now();
  for (const distributed::CacheEntryInfo& e : *entries) {
    total += e.bytes;
    const double age_h = std::chrono::duration<double>(now - e.last_used).count() / 3600;
    std::optional<distributed::Heartbeat> hb = distributed::ReadHeartbeat((*cache)->HeartbeatPath(e.key));
    if (o.json) {
      out.push_back({{"key", e.key}, {"bytes", e.bytes}, {"last_used_hours_ago", age_h}});
    } else {
      std::cout << fmt::format("{}  {:>12} bytes  used {:.1f} h ago{}\n", e.key, e.bytes, age_h,
                               hb ? fmt::format("  (rebuilding on {}:{})", hb->host, hb->pid) : "");
    }
  }
  if (o.json) {
    std::cout << nlohmann::json{{"dir", (*cache)->dir().string()},
                                {"total_bytes", total},
                                {"entries", out}}
                     .dump(2)
              << "\n";
  } else {
    std::cout << fmt::format("{} entries, {} bytes in {}\n", entries->size(), total,
                             (*cache)->dir().string());
  }
  return 0;
}

int Gc(const CacheCmdOptions& o) {
  auto cache = OpenCache(o);
  if (!cache.ok()) return ReportError(cache.status());
  auto garbage = (*cache)->CollectGarbage(std::chrono::seconds(o.older_than_s));
  if (!garbage.ok()) return ReportError(garbage.status());
  int evicted = 0;
  if (o.max_bytes > 0) {
    auto e = (*cache)->Evict(o.max_bytes);
    if (!e.ok()) return ReportError(e.status());
    evicted = *e;
  }
  std::cout << fmt::format("removed {} leftover temp/takeover files, evicted {} entries\n",
                           *garbage, evicted);
  return 0;
}

int Verify(const CacheCmdOptions& o) {
  auto cache = OpenCache(o);
  if (!cache.ok()) return ReportError(cache.status());
  auto bad = (*cache)->VerifyAll(o.remove);
  if (!bad.ok()) return ReportError(bad.status());
  for (const std::string& key : *bad) {
    std::cout << fmt::format("{}  CORRUPT{}\n", key, o.remove ? " (removed)" : "");
  }
  std::cout << fmt::format("{} corrupt entries\n", bad->size());
  return bad->empty() ? 0 : 1;
}

std::function<int()> Setup(CLI::App& app, const GlobalOptions&) {
  auto o = std::make_shared<CacheCmdOptions>();
  CLI::App* sub = app.add_subcommand("cache", "Inspect and maintain the engine cache directory");
  sub->require_subcommand(1);
  auto add_dir = [&](CLI::App* c) {
    c->add_option("--dir", o->dir, "cache directory (default: KILN_CACHE_DIR)");
    c->add_flag("--trust-shared-cache", o->trust_shared,
                "open a directory other users can write (refused by default)");
  };
  CLI::App* ls = sub->add_subcommand("ls", "List entries, least recently used first");
  add_dir(ls);
  ls->add_flag("--json", o->json, "print JSON");
  CLI::App* gc =
      sub->add_subcommand("gc", "Remove files left by dead builders; evict down to --max-bytes");
  add_dir(gc);
  gc->add_option("--max-bytes", o->max_bytes, "evict least recently used entries above this total")
      ->check(Count(0, kMaxUint64));
  gc->add_option("--older-than", o->older_than_s,
                 "seconds a leftover file must be old to be removed")
      ->check(Count(0, 10 * 365 * 24 * 3600.0));
  CLI::App* verify = sub->add_subcommand(
      "verify", "Check every entry's checksum, version and owner (exit 1 if any fails)");
  add_dir(verify);
  verify->add_flag("--remove", o->remove, "remove corrupt entries");
  return [o, ls, gc, verify]() -> int {
    if (ls->parsed()) return Ls(*o);
    if (gc->parsed()) return Gc(*o);
    if (verify->parsed()) return Verify(*o);
    return 1;
  };
}

}  // namespace
KILN_REGISTER_COMMAND(cache, 60, Setup);
}  // namespace kiln::cli
