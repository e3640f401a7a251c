// Build once, share everywhere: every rank of a job calls BuildOnce with the same key; one
// process per group builds (or takes the engine from the cache) and the others receive the
// bytes, with every wait bounded and a report of who built and who waited how long.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/distributed/cache_key.h"
#include "kiln/distributed/communicator.h"
#include "kiln/distributed/engine_cache.h"
#include "kiln/distributed/progress.h"
#include "kiln/distributed/rank.h"

namespace kiln::distributed {

enum class Transport {
  kAuto,   // MPI when the job has more than one rank, local otherwise
  kLocal,  // world size 1
  kMpi,    // control and bytes over MPI
  kNccl,   // bytes by ncclBroadcast (needs kiln_distributed_nccl's factory); control over MPI, or,
           // launched without MPI (torchrun), over TCP through rank 0 (tcp_exchange.h)
  kCache,  // no communication: every process goes through the shared cache directory
};
enum class BuildOn {
  kRank0,    // one builder for the job
  kPerNode,  // one per node (no shared file system)
  kPerArch,  // one per distinct GPU architecture (keys differ per arch)
};
StatusOr<Transport> ParseTransport(std::string_view text);
StatusOr<BuildOn> ParseBuildOn(std::string_view text);
std::string_view ToString(Transport t);
std::string_view ToString(BuildOn b);

// Creates the bulk transport for one group (a collective over `group`), e.g. an NCCL
// communicator whose unique id travels over `group`.
using BulkTransportFactory = std::function<StatusOr<std::unique_ptr<BulkTransport>>(
    Communicator& group, const RankInfo& me, Deadline deadline)>;

struct BuildOnceOptions {
  Transport transport = Transport::kAuto;
  BuildOn build_on = BuildOn::kRank0;
  RankOverrides rank_overrides;  // explicit --rank/--world-size
  std::optional<CacheOptions> cache;
  Millis join_timeout = std::chrono::seconds(60);     // every rank must arrive within this
  Millis wait_timeout = std::chrono::minutes(30);     // for the builder (build + cache wait)
  Millis transfer_timeout = std::chrono::minutes(5);  // for the bytes themselves
  Communicator* comm = nullptr;  // an existing communicator to use instead of MPI's world
  BulkTransportFactory bulk_factory;
  VerifyFn verify;  // checks received bytes (and built ones before they are shared)
  // > 0: the leader builds on a thread of its own and, until it is done, sends its group the
  // build's latest progress line this often; the others pass each line to `on_progress` and give
  // up (KILN-E7003) on a leader silent for `heartbeat_timeout`, long before `wait_timeout`. 0 (the
  // CLI's default): one wait for the result, bounded by `wait_timeout`.
  Millis heartbeat_interval{0};
  Millis heartbeat_timeout = std::chrono::seconds(60);
  std::function<void(const std::string&)> on_progress;
};

struct RankReport {
  int rank = 0;
  std::string host;
  std::string role;  // "built", "cache-hit", "took-over", "received"
  double wait_s = 0;
  double transfer_s = 0;
  double build_s = 0;
  double bulk_setup_s = 0;  // this rank's NCCL communicator init, when used
};

struct BuildOnceReport {
  std::string key;
  std::string transport;
  std::string build_on;
  int world_size = 1;
  int rank = 0;               // the rank that wrote this report
  std::vector<int> builders;  // ranks that ran the build or read the cache for their group
  std::string cache;          // "none", "hit", "built", "took-over" (this rank's group)
  double handshake_s = 0;     // rank exchange and consistency checks (includes waiting for
                              // the slowest rank to arrive)
  double bulk_setup_s = 0;    // NCCL communicator init, when used
  double build_s = 0;
  double total_s = 0;
  uint64_t bytes = 0;
  std::string checksum;  // XXH3-128 of the engine bytes
  std::vector<RankReport> ranks;
  std::string ToJson() const;
};

struct BuildOnceResult {
  std::vector<std::byte> bytes;
  BuildOnceReport report;
};

StatusOr<BuildOnceResult> BuildOnce(const CacheKey& key, const BuildOnceOptions& options,
                                    const BuildFn& build);

// What a rank that waited for its builder's result reports when the wait failed. A builder that
// died (its pid gone, when it runs on this host) or stopped answering (another host: it cannot be
// checked from here) is KILN-E7020, not the communicator error the wait ended with (a dead peer
// looks like a communicator that never set up, KILN-E7013); a builder still alive here past the
// bound is KILN-E7005. Other errors keep their code.
Status ExplainBuilderWait(Status wait_error, std::string_view builder,
                          std::string_view builder_host, int64_t builder_pid,
                          std::string_view my_host);

}  // namespace kiln::distributed
