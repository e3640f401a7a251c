// Control channel for torchrun-style launches without MPI: a star-shaped Communicator over TCP
// through rank 0, which listens on MASTER_ADDR:(MASTER_PORT + offset). It carries build-once's
// small control messages and the NCCL unique id; NCCL then moves the engine bytes.
// Every accept, connect, read and write is bounded; errors name the rank and the address.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "kiln/core/status.h"
#include "kiln/distributed/communicator.h"
#include "kiln/distributed/rank.h"

namespace kiln::distributed {

// torchrun's own TCPStore owns MASTER_PORT; kiln listens beside it, on MASTER_PORT + 17 (chosen
// to stay clear of the few ports after MASTER_PORT that jobs commonly take for their own stores).
// KILN_TCP_PORT_OFFSET is not read: every rank must agree, so the offset is a constant.
constexpr int kTcpExchangePortOffset = 17;

// Rendezvous: rank 0 listens (bound to every interface, so MASTER_ADDR may be any name or address
// of its host); the other ranks connect, retrying until the deadline since rank 0 may start after
// them, and say {rank, world size}. Rank 0 checks every claim and answers each rank with one
// verdict, so every rank fails alike and names the same cause:
//   a rank missing at the deadline     -> kRankMissing, naming the missing ranks (and, on a rank
//                                          that cannot reach rank 0, the address it tried)
//   a different world size             -> kWorldSizeMismatch, naming the rank and both sizes
//   a rank claimed twice / out of range -> kDuplicateRank / kWorldSizeMismatch
// A connected rank waits up to 1 s past the deadline for rank 0's verdict (so that it learns the
// cause rather than only its own timeout). World size 1 needs no address and opens no socket.
StatusOr<std::unique_ptr<Communicator>> TcpConnect(const RankInfo& me, Deadline deadline,
                                                   int port_offset = kTcpExchangePortOffset);

// One value (e.g. the 128-byte NCCL unique id) from rank 0 to every rank: TcpConnect, then a
// broadcast. Rank 0 passes the value; the others pass an empty span and receive `size` bytes.
StatusOr<std::vector<std::byte>> TcpExchange(const RankInfo& me, std::span<const std::byte> value,
                                             size_t size, Deadline deadline,
                                             int port_offset = kTcpExchangePortOffset);

}  // namespace kiln::distributed
