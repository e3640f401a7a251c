// Rank discovery from launcher environments; every malformed value is an error naming the
// variable, never a silent world size of 1.
#include "kiln/distributed/rank.h"

#include <unistd.h>

#include <charconv>
#include <climits>
#include <cstdlib>

#include "kiln/core/params.h"

namespace kiln::distributed {

EnvLookup ProcessEnv() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

std::string HostName() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

namespace {

struct Launcher {
  const char* name;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

constexpr Launcher kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
};

StatusOr<std::optional<int>> ReadInt(const EnvLookup& env, const char* name) {
  if (name == nullptr) return std::optional<int>();
  std::optional<std::string> v = env(name);
  if (!v) return std::optional<int>();
  int out = 0;
  auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), out);
  if (v->empty() || ec != std::errc() || p != v->data() + v->size() || out < 0) {
    return MakeError(ErrorCode::kRankEnvInvalid, "{}='{}' is not a non-negative integer", name, *v);
  }
  return std::optional<int>(out);
}

}  // namespace

StatusOr<RankInfo> DiscoverRank(const RankOverrides& overrides, const EnvLookup& env_in) {
  const EnvLookup env = env_in ? env_in : ProcessEnv();
  RankInfo info;
  info.launcher = "single";
  info.host = HostName();
  for (const Launcher& l : kLaunchers) {
    KILN_ASSIGN_OR_RETURN(std::optional<int> rank, ReadInt(env, l.rank));
    KILN_ASSIGN_OR_RETURN(std::optional<int> size, ReadInt(env, l.size));
    if (!rank && !size) continue;
    if (!rank || !size) {
      return MakeError(ErrorCode::kRankEnvInvalid, "{} is set but {} is not: a {} launch sets both",
                       rank ? l.rank : l.size, rank ? l.size : l.rank, l.name);
    }
    KILN_ASSIGN_OR_RETURN(std::optional<int> local_rank, ReadInt(env, l.local_rank));
    KILN_ASSIGN_OR_RETURN(std::optional<int> local_size, ReadInt(env, l.local_size));
    info.launcher = l.name;
    info.rank = *rank;
    info.world_size = *size;
    info.local_rank = local_rank.value_or(0);
    info.local_world_size = local_size.value_or(1);
    if (info.launcher == "slurm") {
      KILN_ASSIGN_OR_RETURN(std::optional<int> node_id, ReadInt(env, "SLURM_NODEID"));
      info.node_id = node_id.value_or(-1);
    }
    break;
  }
  if (std::optional<std::string> addr = env("MASTER_ADDR")) info.master_addr = *addr;
  KILN_ASSIGN_OR_RETURN(std::optional<int> port, ReadInt(env, "MASTER_PORT"));
  info.master_port = port.value_or(0);

  if (overrides.rank || overrides.world_size) info.launcher = "explicit";
  if (overrides.rank) info.rank = *overrides.rank;
  if (overrides.world_size) info.world_size = *overrides.world_size;
  if (overrides.local_rank) info.local_rank = *overrides.local_rank;

  if (overrides.node) {
    info.node = *overrides.node;
  } else if (std::optional<std::string> node = env("KILN_DIST_NODE"); node && !node->empty()) {
    info.node = *node;
  } else {
    info.node = info.host;
  }

  if (info.world_size < 1 || info.rank >= info.world_size) {
    return MakeError(ErrorCode::kRankEnvInvalid,
                     "rank {} is not inside world size {} (from {}): ranks run 0..world size-1",
                     info.rank, info.world_size, info.launcher);
  }
  if (info.local_rank >= info.local_world_size && info.local_world_size > 1) {
    return MakeError(ErrorCode::kRankEnvInvalid,
                     "local rank {} is not inside local world size {} (from {})", info.local_rank,
                     info.local_world_size, info.launcher);
  }
  return info;
}

}  // namespace kiln::distributed
