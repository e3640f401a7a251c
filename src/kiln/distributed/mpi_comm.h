// MPI communicator with bounded collectives: non-blocking MPI calls polled with MPI_Test until a
// deadline, so that a rank that never arrives is named instead of waited for forever.
#pragma once

#include <memory>

#include "kiln/distributed/communicator.h"

namespace kiln::distributed {

// Initializes MPI if nobody has (and finalizes it on destruction then). The CLI and drivers hold
// one for the life of the process; MPI_Init itself is bounded only by the launcher.
class MpiSession {
 public:
  static StatusOr<std::unique_ptr<MpiSession>> Start();
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  double init_seconds() const { return init_seconds_; }

 private:
  MpiSession() = default;
  bool owns_ = false;
  double init_seconds_ = 0;
};

// A communicator over MPI_COMM_WORLD (duplicated, so kiln's messages never meet the
// application's). MPI must be initialized (MpiSession).
StatusOr<std::unique_ptr<Communicator>> MpiWorld();

// True when this process runs under an MPI launcher that MpiSession can join.
bool MpiAvailable();

}  // namespace kiln::distributed
