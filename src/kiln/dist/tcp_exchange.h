// A tiny bounded rendezvous for torchrun-style launches (no MPI): rank 0 listens on
// MASTER_ADDR:(MASTER_PORT + offset) and hands one value (an NCCL unique id) to every other rank.
// Every accept, connect and read is bounded; rank 0 names the ranks that never connected.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/dist/communicator.h"
#include "kiln/dist/rank.h"

namespace kiln::dist {

// The offset keeps kiln's listener off torchrun's own store at MASTER_PORT.
constexpr int kTcpExchangePortOffset = 17;

// Rank 0 passes the value and gets it back; others pass an empty span and receive `size` bytes.
StatusOr<std::vector<std::byte>> TcpExchange(const RankInfo& me, std::span<const std::byte> value,
                                             size_t size, Deadline deadline,
                                             int port_offset = kTcpExchangePortOffset);

}  // namespace kiln::dist
