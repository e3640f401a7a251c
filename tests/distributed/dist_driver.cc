// Test and benchmark driver for build-once: every rank of an mpirun job (or every racing process)
// runs it. The builder is a test double (deterministic bytes from a seed, a configurable build
// cost, optional crash or hang mid-build); the sharing logic it drives is the real one.
#include <signal.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <fcntl.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "kiln/core/hash.h"
#include "kiln/distributed/build_once.h"
#include "kiln/distributed/mpi_comm.h"
#include "kiln/distributed/nccl_factory.h"
#include "kiln/distributed/tcp_exchange.h"

namespace {

using namespace kiln;
using namespace kiln::distributed;

struct Args {
  uint64_t size = 1 << 20;
  uint64_t seed = 1;
  int build_ms = 100;
  std::string build_cost = "sleep";  // sleep | cpu
  std::string die_once_file;         // the first builder to create this file crashes mid-build
  bool stall = false;                // the builder stops itself (SIGSTOP) mid-build
  bool fail_build = false;
  std::string transport = "auto";
  std::string build_on = "rank0";
  std::string cache_dir;
  uint64_t max_bytes = 0;
  int join_ms = 10000, wait_ms = 30000, transfer_ms = 60000, stale_ms = 3000, heartbeat_ms = 200;
  int rank = -1, world_size = -1;
  std::string arch = "cpu-test";
  int absent_rank = -1;  // this rank arrives --absent-ms late
  int absent_ms = 0;
  int nccl_stuck_rank = -1;        // this rank takes the NCCL id, then never joins the communicator
  bool every_rank_builds = false;  // the baseline: no sharing at all
  std::string report_dir;
  int die_mid_transfer_ms = -1;  // the builder SIGKILLs itself this long into the engine transfer
  std::string control = "auto";  // auto | tcp (MASTER_ADDR/MASTER_PORT, as torchrun sets them)
};

// Forwards to the job's communicator; on the builder, the engine transfer is cut short by the
// builder's own death (SIGKILL from a thread, while the bytes are on their way): the receivers
// must then fail with a catalog error within the bound, never hang nor keep partial bytes.
class DyingCommunicator final : public Communicator {
 public:
  DyingCommunicator(std::unique_ptr<Communicator> inner, int die_ms)
      : inner_(std::move(inner)), die_ms_(die_ms) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string_view kind() const override { return inner_->kind(); }
  StatusOr<std::vector<std::byte>> AllGather(std::span<const std::byte> mine, Deadline deadline,
                                             std::string_view what) override {
    return inner_->AllGather(mine, deadline, what);
  }
  Status Broadcast(std::span<std::byte> bytes, int root, Deadline deadline,
                   std::string_view what) override {
    if (what == "engine bytes" && root == rank() && die_ms_ >= 0) {
      std::thread([ms = die_ms_, n = bytes.size()] {
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
        std::fprintf(stderr, "driver pid %d: killed mid-transfer of %zu bytes (test)\n", getpid(),
                     n);
        std::fflush(stderr);
        ::raise(SIGKILL);
      }).detach();
    }
    return inner_->Broadcast(bytes, root, deadline, what);
  }
  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    return inner_->Split(color, key);
  }

 private:
  std::unique_ptr<Communicator> inner_;
  int die_ms_;
};

// Deterministic bytes (splitmix64), so every process can check it got the right engine.
std::vector<std::byte> SyntheticEngine(uint64_t size, uint64_t seed) {
  std::vector<std::byte> out(size);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint64_t i = 0; i < size; i += 8) {
    x += 0x9E3779B97F4A7C15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(out.data() + i, &z, std::min<uint64_t>(8, size - i));
  }
  return out;
}

// The build's cost: wall time (sleep) or CPU time (cpu: contends for cores like a real build).
void BurnBuildTime(const Args& a, ProgressSink& sink, int from_ms, int to_ms) {
  const int steps = std::max(1, (to_ms - from_ms) / 20);
  for (int i = 0; i < steps; ++i) {
    const auto step = std::chrono::milliseconds((to_ms - from_ms) / steps);
    if (a.build_cost == "cpu") {
      timespec t0{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
      volatile uint64_t sink_value = 0;
      for (;;) {
        for (int k = 0; k < 10000; ++k) sink_value = sink_value * 31 + k;
        timespec t{};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000000000ll + (t.tv_nsec - t0.tv_nsec) >=
            std::chrono::nanoseconds(step).count()) {
          break;
        }
      }
    } else {
      std::this_thread::sleep_for(step);
    }
    sink.Update(fmt::format("synthetic build {} ms of {} ms",
                            from_ms + (i + 1) * (to_ms - from_ms) / steps, a.build_ms));
  }
}

StatusOr<std::vector<std::byte>> SyntheticBuild(const Args& a, ProgressSink& sink) {
  BurnBuildTime(a, sink, 0, a.build_ms / 2);
  if (!a.die_once_file.empty()) {
    int fd = ::open(a.die_once_file.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd >= 0) {
      std::fprintf(stderr, "driver pid %d: dying mid-build (test)\n", getpid());
      _exit(3);
    }
  }
  if (a.stall) {
    std::fprintf(stderr, "driver pid %d: stopping itself mid-build (test)\n", getpid());
    std::fflush(stderr);
    raise(SIGSTOP);
  }
  if (a.fail_build) return MakeError(ErrorCode::kNoTactic, "synthetic build failure (test)");
  BurnBuildTime(a, sink, a.build_ms / 2, a.build_ms);
  return SyntheticEngine(a.size, a.seed);
}

int Run(const Args& a) {
  auto session =
      MpiAvailable() ? MpiSession::Start() : StatusOr<std::unique_ptr<MpiSession>>(nullptr);
  if (!session.ok()) {
    std::printf("ERROR rank=? %s\n", session.status().ToString().c_str());
    return 2;
  }
  BuildOnceOptions o;
  StatusOr<Transport> transport = ParseTransport(a.transport);
  StatusOr<BuildOn> build_on = ParseBuildOn(a.build_on);
  if (!transport.ok() || !build_on.ok()) {
    std::printf("ERROR %s\n",
                (transport.ok() ? build_on.status() : transport.status()).ToString().c_str());
    return 2;
  }
  o.transport = *transport;
  o.build_on = *build_on;
  if (a.rank >= 0) o.rank_overrides.rank = a.rank;
  if (a.world_size >= 0) o.rank_overrides.world_size = a.world_size;
  o.join_timeout = std::chrono::milliseconds(a.join_ms);
  o.wait_timeout = std::chrono::milliseconds(a.wait_ms);
  o.transfer_timeout = std::chrono::milliseconds(a.transfer_ms);
  if (!a.cache_dir.empty()) {
    CacheOptions c;
    c.dir = a.cache_dir;
    c.max_bytes = a.max_bytes;
    c.wait_timeout = o.wait_timeout;
    c.stale_after = std::chrono::milliseconds(a.stale_ms);
    c.heartbeat_interval = std::chrono::milliseconds(a.heartbeat_ms);
    c.progress_log_interval = std::chrono::milliseconds(1000);
    o.cache = c;
  }
  if (o.transport == Transport::kNccl) o.bulk_factory = NcclFactoryIfBuilt();
  if (o.bulk_factory && a.nccl_stuck_rank >= 0) {
    // Fault injection: the stuck rank does the id exchange as the real factory does, then hangs
    // past every bound instead of calling ncclCommInitRank (a rank whose GPU or driver hangs).
    o.bulk_factory = [real = o.bulk_factory, stuck = a.nccl_stuck_rank, join_ms = a.join_ms](
                         Communicator& group, const RankInfo& me,
                         Deadline deadline) -> StatusOr<std::unique_ptr<BulkTransport>> {
      if (group.rank() != stuck) return real(group, me, deadline);
      std::array<std::byte, 128> id{};
      KILN_RETURN_IF_ERROR(group.Broadcast(id, 0, deadline, "NCCL unique id"));
      std::fprintf(stderr, "rank %d: took the NCCL id; never joining (test)\n", group.rank());
      std::this_thread::sleep_for(std::chrono::milliseconds(2 * join_ms + 10000));
      return MakeError(ErrorCode::kCommFailed, "stuck rank (test) gave up");
    };
  }

  StatusOr<RankInfo> me = DiscoverRank(o.rank_overrides);
  const int my_rank = me.ok() ? me->rank : -1;
  if (my_rank == a.absent_rank) {
    std::fprintf(stderr, "rank %d: arriving %d ms late (test)\n", my_rank, a.absent_ms);
    std::this_thread::sleep_for(std::chrono::milliseconds(a.absent_ms));
  }
  std::unique_ptr<Communicator> comm;
  if (a.die_mid_transfer_ms >= 0 || a.control == "tcp") {
    StatusOr<std::unique_ptr<Communicator>> inner =
        a.control == "tcp" && me.ok()
            ? TcpConnect(*me, std::chrono::steady_clock::now() + o.join_timeout)
            : MpiWorld();
    if (!inner.ok()) {
      std::printf("ERROR rank=%d after=0s %s\n", my_rank, inner.status().ToString().c_str());
      std::fflush(stdout);
      _exit(2);
    }
    comm = std::make_unique<DyingCommunicator>(std::move(inner).value(), a.die_mid_transfer_ms);
    o.comm = comm.get();
  }

  const CacheKey key = KeyBuilder()
                           .ModelBytes(std::as_bytes(std::span(&a.seed, 1)))
                           .Config("size", std::to_string(a.size))
                           .Target("synthetic", a.arch)
                           .LibraryVersion("kiln-dist-driver", "1")
                           .Build();
  const auto t0 = std::chrono::steady_clock::now();
  StatusOr<BuildOnceResult> r = [&]() -> StatusOr<BuildOnceResult> {
    if (!a.every_rank_builds)
      return BuildOnce(key, o, [&](ProgressSink& s) { return SyntheticBuild(a, s); });
    // Baseline for the benchmark: each rank builds its own copy, nothing is shared.
    ProgressSink sink;
    KILN_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, SyntheticBuild(a, sink));
    BuildOnceResult out;
    out.report.rank = my_rank;
    out.report.transport = "none";
    out.report.build_on = "every-rank";
    out.report.bytes = bytes.size();
    out.report.checksum = HashBytes(bytes).Hex();
    out.bytes = std::move(bytes);
    return out;
  }();
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!r.ok()) {
    std::printf("ERROR rank=%d after=%.2fs %s\n", my_rank, elapsed, r.status().ToString().c_str());
    std::fflush(stdout);
    // Leave at once: peers may be gone, and MPI_Finalize would wait for them.
    _exit(2);
  }
  const std::string expected = HashBytes(SyntheticEngine(a.size, a.seed)).Hex();
  const std::string got = HashBytes(r->bytes).Hex();
  std::printf("RESULT rank=%d bytes=%zu checksum=%s expected=%s elapsed=%.3f\n", r->report.rank,
              r->bytes.size(), got.c_str(), expected.c_str(), elapsed);
  if (!a.report_dir.empty()) {
    std::ofstream(a.report_dir + "/rank-" + std::to_string(r->report.rank) + "-" +
                  std::to_string(getpid()) + ".json")
        << r->report.ToJson();
  }
  return got == expected ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"kiln build-once test driver (synthetic builder)"};
  app.add_option("--size", a.size);
  app.add_option("--seed", a.seed);
  app.add_option("--build-ms", a.build_ms);
  app.add_option("--build-cost", a.build_cost)->check(CLI::IsMember({"sleep", "cpu"}));
  app.add_option("--die-once-file", a.die_once_file);
  app.add_flag("--stall", a.stall);
  app.add_flag("--fail-build", a.fail_build);
  app.add_option("--nccl-stuck-rank", a.nccl_stuck_rank,
                 "with --transport nccl: this rank takes the NCCL id and never joins (test)");
  app.add_option("--transport", a.transport);
  app.add_option("--build-on", a.build_on);
  app.add_option("--cache-dir", a.cache_dir);
  app.add_option("--max-bytes", a.max_bytes);
  app.add_option("--join-ms", a.join_ms);
  app.add_option("--wait-ms", a.wait_ms);
  app.add_option("--transfer-ms", a.transfer_ms);
  app.add_option("--stale-ms", a.stale_ms);
  app.add_option("--heartbeat-ms", a.heartbeat_ms);
  app.add_option("--rank", a.rank);
  app.add_option("--world-size", a.world_size);
  app.add_option("--arch", a.arch);
  app.add_option("--absent-rank", a.absent_rank);
  app.add_option("--absent-ms", a.absent_ms);
  app.add_flag("--every-rank-builds", a.every_rank_builds);
  app.add_option("--report-dir", a.report_dir);
  app.add_option("--die-mid-transfer-ms", a.die_mid_transfer_ms,
                 "the builder kills itself (SIGKILL) this long into sending the engine (test)");
  app.add_option("--control", a.control, "tcp: control over TCP to MASTER_ADDR (no MPI)")
      ->check(CLI::IsMember({"auto", "tcp"}));
  CLI11_PARSE(app, argc, argv);
  return Run(a);
}
