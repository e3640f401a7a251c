// GPU check for the NCCL transport, run as separate processes by scripts/gpu_dist_check.sh:
// the unique id travels over TcpExchange (torchrun-style), then the process joins a non-blocking
// communicator with a bound and broadcasts --bytes. --skip-init: receive the id but never join
// (the "rank that never arrives" for the init-timeout check). Prints one JSON line.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <thread>

#include "kiln/core/hash.h"
#include "kiln/distributed/nccl_comm.h"
#include "kiln/distributed/tcp_exchange.h"

using namespace kiln;
using namespace kiln::distributed;

int main(int argc, char** argv) {
  int rank = 0, world = 1, port = 29500, timeout_ms = 5000, hold_ms = 0;
  uint64_t bytes = 1 << 20;
  bool skip_init = false;
  std::string addr = "127.0.0.1";
  CLI::App app{"kiln NCCL transport check (GPU machine)"};
  app.add_option("--rank", rank);
  app.add_option("--world", world);
  app.add_option("--addr", addr);
  app.add_option("--port", port);
  app.add_option("--timeout-ms", timeout_ms);
  app.add_option("--bytes", bytes);
  app.add_flag("--skip-init", skip_init);
  app.add_option("--hold-ms", hold_ms, "with --skip-init: stay alive this long without joining");
  CLI11_PARSE(app, argc, argv);

  auto fail = [&](const Status& s, double seconds) {
    std::printf("{\"rank\":%d,\"ok\":false,\"code\":\"%s\",\"seconds\":%.3f,\"error\":\"%s\"}\n",
                rank, s.Id().c_str(), seconds, s.message().c_str());
    return 2;
  };
  if (!CudaDeviceAvailable())
    return fail(MakeError(ErrorCode::kBackendUnavailable, "no CUDA device"), 0);
  RankInfo me;
  me.rank = rank;
  me.world_size = world;
  me.master_addr = addr;
  me.master_port = port;
  const Deadline deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  NcclId id{};
  if (rank == 0) {
    StatusOr<NcclId> fresh = NewNcclId();
    if (!fresh.ok()) return fail(fresh.status(), 0);
    id = *fresh;
  }
  StatusOr<std::vector<std::byte>> got =
      TcpExchange(me, rank == 0 ? std::span<const std::byte>(id) : std::span<const std::byte>(),
                  id.size(), deadline);
  if (!got.ok()) return fail(got.status(), 0);
  std::memcpy(id.data(), got->data(), id.size());
  if (skip_init) {
    std::this_thread::sleep_for(std::chrono::milliseconds(hold_ms));
    std::printf("{\"rank\":%d,\"ok\":true,\"skipped_init\":true}\n", rank);
    return 0;
  }
  const auto t0 = Clock::now();
  auto b = NcclBroadcaster::Create(rank, world, id, deadline, NcclOptions{});
  if (!b.ok()) return fail(b.status(), SecondsSince(t0));
  std::vector<std::byte> data(bytes);
  if (rank == 0) {
    for (size_t i = 0; i < data.size(); i += 4096) data[i] = std::byte(i / 4096 % 251);
  }
  const auto t1 = Clock::now();
  Status s = (*b)->Broadcast(data, 0, Clock::now() + std::chrono::seconds(120));
  const double bcast_s = SecondsSince(t1);
  if (!s.ok()) return fail(s, bcast_s);
  std::printf(
      "{\"rank\":%d,\"ok\":true,\"world\":%d,\"init_s\":%.4f,\"bytes\":%llu,\"bcast_s\":%.4f,"
      "\"gb_per_s\":%.3f,\"checksum\":\"%s\"}\n",
      rank, world, (*b)->setup_seconds(), static_cast<unsigned long long>(bytes), bcast_s,
      bytes / bcast_s / 1e9, HashBytes(data).Hex().c_str());
  return 0;
}
