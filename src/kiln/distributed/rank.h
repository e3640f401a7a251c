// Rank discovery: who this process is in its job, read from the launcher's environment
// (torchrun, OpenMPI, Slurm) with explicit flags taking precedence.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/core/status.h"

namespace kiln::distributed {

struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_id = -1;         // SLURM_NODEID when known
  std::string master_addr;  // torchrun's rendezvous host (empty otherwise)
  int master_port = 0;
  std::string launcher;  // "explicit", "torchrun", "openmpi", "slurm" or "single"
  std::string host;      // this machine's host name
  std::string node;      // node identity for --build-on per-node: KILN_DIST_NODE or host
};

// Explicit values (command-line flags) override whatever the environment says.
struct RankOverrides {
  std::optional<int> rank;
  std::optional<int> world_size;
  std::optional<int> local_rank;
  std::optional<std::string> node;
};

// Returns the value of an environment variable, or nullopt. Tests pass a fake environment.
using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;
EnvLookup ProcessEnv();

// The innermost launcher wins when several are present (torchrun inside Slurm, mpirun inside a
// Slurm allocation): torchrun, then OpenMPI, then Slurm. No launcher at all: world size 1.
StatusOr<RankInfo> DiscoverRank(const RankOverrides& overrides = {}, const EnvLookup& env = {});

std::string HostName();

}  // namespace kiln::distributed
