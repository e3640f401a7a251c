// How the ranks of one job talk during build-once. Every call takes a deadline and, when it
// passes, returns a catalog error naming the ranks it waited on, instead of hanging.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/status.h"

namespace kiln::distributed {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view kind() const = 0;  // "local", "mpi"

  // Every rank contributes `mine` (the same length everywhere); every rank gets all of them in
  // rank order. Ranks that do not contribute before the deadline are named in a kRankMissing
  // error that every rank which did arrive receives.
  virtual StatusOr<std::vector<std::byte>> AllGather(std::span<const std::byte> mine,
                                                     Deadline deadline, std::string_view what) = 0;
  // Root's `bytes` land in every rank's `bytes` (same length on every rank).
  virtual Status Broadcast(std::span<std::byte> bytes, int root, Deadline deadline,
                           std::string_view what) = 0;
  // Ranks with the same color form a new communicator, ordered by key. Collective over this
  // communicator; call it only after an AllGather has shown every rank alive.
  virtual StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) = 0;
};

// World size 1: every collective is a copy.
std::unique_ptr<Communicator> MakeLocalCommunicator();

// Moves bulk bytes (the engine) from one rank of a group to the others; the NCCL path plugs in
// here. Control messages stay on the Communicator.
class BulkTransport {
 public:
  virtual ~BulkTransport() = default;
  virtual std::string_view kind() const = 0;
  virtual Status Broadcast(std::span<std::byte> bytes, int root, Deadline deadline) = 0;
  virtual double setup_seconds() const = 0;
};

}  // namespace kiln::distributed
