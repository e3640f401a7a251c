// TcpExchange: rank 0 accepts world_size-1 connections (poll() with the deadline), reads each
// client's 4-byte rank, and writes the value back. Clients retry connecting until the deadline,
// since rank 0 may start listening after they start.
#include "kiln/dist/tcp_exchange.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <thread>

namespace kiln::dist {
namespace {

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int MillisLeft(Deadline deadline) {
  auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1000));
}

// Reads or writes exactly n bytes, each step bounded by the deadline.
Status Transfer(int fd, void* buf, size_t n, bool write, Deadline deadline, std::string_view what) {
  size_t done = 0;
  while (done < n) {
    pollfd p{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    int ready = ::poll(&p, 1, MillisLeft(deadline));
    if (ready == 0) {
      if (Clock::now() >= deadline) {
        return MakeError(ErrorCode::kCollectiveTimeout,
                         "{} did not finish within the bound ({} of {} bytes)", what, done, n);
      }
      continue;
    }
    if (ready < 0 && errno == EINTR) continue;
    ssize_t k = write ? ::send(fd, static_cast<char*>(buf) + done, n - done, MSG_NOSIGNAL)
                      : ::recv(fd, static_cast<char*>(buf) + done, n - done, 0);
    if (k <= 0) {
      if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      return MakeError(ErrorCode::kCommFailed, "{}: {}", what,
                       k == 0 ? "peer closed the connection" : std::strerror(errno));
    }
    done += static_cast<size_t>(k);
  }
  return OkStatus();
}

StatusOr<sockaddr_storage> Resolve(const std::string& host, int port, socklen_t* len) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port_text = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res); rc != 0) {
    return MakeError(ErrorCode::kRankEnvInvalid, "MASTER_ADDR '{}' does not resolve: {}", host,
                     gai_strerror(rc));
  }
  sockaddr_storage out{};
  std::memcpy(&out, res->ai_addr, res->ai_addrlen);
  *len = res->ai_addrlen;
  ::freeaddrinfo(res);
  return out;
}

}  // namespace

StatusOr<std::vector<std::byte>> TcpExchange(const RankInfo& me, std::span<const std::byte> value,
                                             size_t size, Deadline deadline, int port_offset) {
  if (me.world_size == 1) return std::vector<std::byte>(value.begin(), value.end());
  if (me.master_addr.empty() || me.master_port == 0) {
    return MakeError(ErrorCode::kRankEnvInvalid,
                     "MASTER_ADDR/MASTER_PORT are not set: a launch without MPI needs them "
                     "(torchrun sets both)");
  }
  const int port = me.master_port + port_offset;
  socklen_t addr_len = 0;
  KILN_ASSIGN_OR_RETURN(sockaddr_storage addr, Resolve(me.master_addr, port, &addr_len));
  const Clock::time_point start = Clock::now();

  if (me.rank == 0) {
    if (value.size() != size)
      return MakeError(ErrorCode::kInternal, "rank 0 must pass the {}-byte value", size);
    Fd listener(::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    int one = 1;
    ::setsockopt(listener.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (listener.fd < 0 || ::bind(listener.fd, reinterpret_cast<sockaddr*>(&addr), addr_len) != 0 ||
        ::listen(listener.fd, 128) != 0) {
      return MakeError(ErrorCode::kCommFailed,
                       "rank 0 cannot listen on {}:{} (MASTER_PORT {} + offset {}): {}",
                       me.master_addr, port, me.master_port, port_offset, std::strerror(errno));
    }
    std::set<int> arrived;
    while (static_cast<int>(arrived.size()) < me.world_size - 1) {
      pollfd p{listener.fd, POLLIN, 0};
      int ready = ::poll(&p, 1, MillisLeft(deadline));
      if (ready <= 0) {
        if (Clock::now() < deadline) continue;
        std::string missing;
        for (int r = 1; r < me.world_size; ++r) {
          if (!arrived.count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
        return MakeError(
            ErrorCode::kRankMissing,
            "{} of {} ranks did not connect to rank 0 at {}:{} within {:.1f} s (the bound): "
            "missing rank(s) {}",
            me.world_size - 1 - arrived.size(), me.world_size, me.master_addr, port,
            SecondsSince(start), missing);
      }
      Fd client(::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC));
      if (client.fd < 0) continue;
      int32_t rank = -1;
      if (!Transfer(client.fd, &rank, sizeof(rank), false, deadline, "reading a rank's hello").ok())
        continue;
      if (rank <= 0 || rank >= me.world_size || arrived.count(rank)) {
        return MakeError(rank > 0 && rank < me.world_size ? ErrorCode::kDuplicateRank
                                                          : ErrorCode::kWorldSizeMismatch,
                         "a process connected to rank 0 claiming rank {} ({})", rank,
                         arrived.count(rank) ? "already connected" : "outside the world");
      }
      KILN_RETURN_IF_ERROR(Transfer(client.fd, const_cast<std::byte*>(value.data()), size, true,
                                    deadline, fmt::format("sending to rank {}", rank)));
      arrived.insert(rank);
    }
    return std::vector<std::byte>(value.begin(), value.end());
  }

  // Rank 0 may not listen yet: retry until the deadline.
  for (;;) {
    Fd sock(::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (::connect(sock.fd, reinterpret_cast<sockaddr*>(&addr), addr_len) == 0) {
      int32_t rank = me.rank;
      KILN_RETURN_IF_ERROR(
          Transfer(sock.fd, &rank, sizeof(rank), true, deadline, "saying hello to rank 0"));
      std::vector<std::byte> out(size);
      KILN_RETURN_IF_ERROR_CTX(
          Transfer(sock.fd, out.data(), size, false, deadline, "receiving from rank 0"),
          "waiting for rank 0 at {}:{}", me.master_addr, port);
      return out;
    }
    if (Clock::now() >= deadline) {
      return MakeError(
          ErrorCode::kRankMissing,
          "rank 0 did not accept a connection at {}:{} (MASTER_PORT {} + offset {}) within "
          "{:.1f} s (the bound): rank 0 is missing or MASTER_ADDR is wrong ({})",
          me.master_addr, port, me.master_port, port_offset, SecondsSince(start),
          std::strerror(errno));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace kiln::dist
