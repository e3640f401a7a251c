// Polling with a deadline: the one way kiln waits on non-blocking MPI and NCCL work. Spins
// (yielding) briefly so that transfers progress at full speed, then backs off so that a long wait
// for a builder does not burn a core.
#pragma once

#include <thread>

#include "kiln/distributed/communicator.h"

namespace kiln::distributed {

enum class PollMode {
  kPatient,  // waiting for someone else (a builder, a late rank): back off
  kBusy,     // moving bytes: MPI progresses only inside MPI calls, so never sleep
};

// Calls `done()` until it returns true (-> true) or the deadline passes (-> false).
template <typename Done>
bool PollUntil(Deadline deadline, Done&& done, PollMode mode = PollMode::kPatient) {
  const Clock::time_point start = Clock::now();
  while (!done()) {
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return false;
    const auto waited = now - start;
    if (mode == PollMode::kBusy || waited < std::chrono::milliseconds(50)) {
      std::this_thread::yield();
    } else if (waited < std::chrono::seconds(2)) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  return true;
}

}  // namespace kiln::distributed
