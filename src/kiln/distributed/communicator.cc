// The world-size-1 communicator.
#include "kiln/distributed/communicator.h"

#include <algorithm>

namespace kiln::distributed {
namespace {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view kind() const override { return "local"; }
  StatusOr<std::vector<std::byte>> AllGather(std::span<const std::byte> mine, Deadline,
                                             std::string_view) override {
    return std::vector<std::byte>(mine.begin(), mine.end());
  }
  Status Broadcast(std::span<std::byte>, int root, Deadline, std::string_view what) override {
    if (root != 0)
      return MakeError(ErrorCode::kInvalidArgument, "broadcast of {} from rank {} in a world of 1",
                       what, root);
    return OkStatus();
  }
  StatusOr<std::unique_ptr<Communicator>> Split(int, int) override {
    return std::unique_ptr<Communicator>(new LocalCommunicator());
  }
};

}  // namespace

std::unique_ptr<Communicator> MakeLocalCommunicator() {
  return std::make_unique<LocalCommunicator>();
}

}  // namespace kiln::distributed
