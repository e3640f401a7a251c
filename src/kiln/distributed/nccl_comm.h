// NCCL that cannot hang: communicators created non-blocking (ncclConfig_t.blocking = 0) and
// polled with ncclCommGetAsyncError to a deadline, aborted with ncclCommAbort when it passes;
// broadcasts polled the same way. Built only where the CUDA toolkit is (target kiln_distributed_nccl).
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <span>

#include "kiln/distributed/build_once.h"
#include "kiln/distributed/communicator.h"
#include "kiln/distributed/rank.h"

namespace kiln::distributed {

using NcclId = std::array<std::byte, 128>;  // sizeof(ncclUniqueId)

struct NcclOptions {
  int device = -1;                        // -1: local rank modulo the number of devices
  size_t chunk_bytes = size_t{64} << 20;  // device staging buffer, allocated once
};

// Only rank 0 of a communicator calls this; the id then travels to the others.
StatusOr<NcclId> NewNcclId();

class NcclBroadcaster final : public BulkTransport {
 public:
  // Joins an `nranks` communicator as `rank`. Returns kCommInitTimeout (after ncclCommAbort) when
  // the others do not join before the deadline.
  static StatusOr<std::unique_ptr<NcclBroadcaster>> Create(int rank, int nranks, const NcclId& id,
                                                           Deadline deadline,
                                                           const NcclOptions& options,
                                                           int local_rank = 0);
  ~NcclBroadcaster() override;
  std::string_view kind() const override { return "nccl"; }
  Status Broadcast(std::span<std::byte> bytes, int root, Deadline deadline) override;
  double setup_seconds() const override { return init_seconds_; }

 private:
  NcclBroadcaster() = default;
  struct State;
  std::unique_ptr<State> state_;
  double init_seconds_ = 0;
};

// True when a CUDA device is usable here (tests skip otherwise).
bool CudaDeviceAvailable();

// For BuildOnce: the unique id goes from group rank 0 over `group` (MPI, or TCP through rank 0 at
// MASTER_ADDR for a torchrun launch without MPI: tcp_exchange.h), then every rank joins.
BulkTransportFactory NcclTransportFactory(NcclOptions options = {});

}  // namespace kiln::distributed
