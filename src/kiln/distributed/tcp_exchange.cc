// TcpConnect / TcpExchange. Wire format: a client's 16-byte hello, rank 0's verdict frame, then
// frames of {length, status code} + payload; a frame with a non-zero code carries rank 0's error
// message instead of data, so that a failure seen by rank 0 reaches every rank that waits on it.
// Sockets are non-blocking and every step polls against the caller's deadline.
#include "kiln/distributed/tcp_exchange.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <utility>

namespace kiln::distributed {
namespace {

constexpr uint32_t kMagic = 0x314e4c4b;  // "KLN1": drops stray connections (a port scanner)
constexpr auto kHelloBound = std::chrono::seconds(2);
// A rank connected to rank 0 waits this long past its own deadline for rank 0's verdict: the
// ranks' deadlines start at slightly different times, and the verdict names the missing ranks.
constexpr auto kVerdictGrace = std::chrono::seconds(1);

struct Hello {
  uint32_t magic = kMagic;
  int32_t rank = -1;
  int32_t world = 0;
  int32_t pid = 0;
};

struct FrameHeader {
  uint64_t length = 0;
  int32_t code = 0;  // 0: payload is data; otherwise an ErrorCode and the payload its message
  int32_t reserved = 0;
};

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

int MillisLeft(Deadline deadline) {
  auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1000));
}

void SetNonBlocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL, 0) | O_NONBLOCK); }

// Reads or writes exactly n bytes, bounded by the deadline. `peer` names the other end.
Status Transfer(int fd, void* buf, size_t n, bool write, Deadline deadline, std::string_view peer) {
  if (fd < 0) {
    return MakeError(ErrorCode::kCommFailed,
                     "the connection to {} was dropped after an earlier failure", peer);
  }
  size_t done = 0;
  while (done < n) {
    pollfd p{fd, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    const int ready = ::poll(&p, 1, MillisLeft(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      if (Clock::now() < deadline) continue;
      return MakeError(ErrorCode::kCollectiveTimeout,
                       "{} {} did not finish within the bound ({} of {} bytes)",
                       write ? "sending to" : "receiving from", peer, done, n);
    }
    const ssize_t k = write ? ::send(fd, static_cast<char*>(buf) + done, n - done, MSG_NOSIGNAL)
                            : ::recv(fd, static_cast<char*>(buf) + done, n - done, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (k <= 0) {
      return MakeError(ErrorCode::kCommFailed, "{} {}: {} (after {} of {} bytes)",
                       write ? "sending to" : "receiving from", peer,
                       k == 0 ? "the peer closed the connection" : std::strerror(errno), done, n);
    }
    done += static_cast<size_t>(k);
  }
  return OkStatus();
}

Status SendFrame(int fd, std::span<const std::byte> payload, int32_t code, Deadline deadline,
                 std::string_view peer) {
  FrameHeader h{payload.size(), code, 0};
  KILN_RETURN_IF_ERROR(Transfer(fd, &h, sizeof(h), true, deadline, peer));
  return Transfer(fd, const_cast<std::byte*>(payload.data()), payload.size(), true, deadline, peer);
}

Status SendError(int fd, const Status& error, Deadline deadline, std::string_view peer) {
  const std::string text(error.message());
  return SendFrame(fd, std::as_bytes(std::span(text)), static_cast<int32_t>(error.code()), deadline,
                   peer);
}

// Codes rank 0 may send; anything else from the wire is reported as a communication failure.
ErrorCode PeerCode(int32_t code) {
  for (ErrorCode c :
       {ErrorCode::kRankMissing, ErrorCode::kWorldSizeMismatch, ErrorCode::kDuplicateRank,
        ErrorCode::kRankEnvInvalid, ErrorCode::kCollectiveTimeout, ErrorCode::kCommFailed}) {
    if (static_cast<int32_t>(c) == code) return c;
  }
  return ErrorCode::kCommFailed;
}

// Receives one frame of exactly `expected` bytes into `out`; a frame with an error code becomes
// that error (rank 0 telling this rank why the collective failed).
Status RecvFrame(int fd, std::span<std::byte> out, Deadline deadline, std::string_view peer,
                 std::string_view what) {
  FrameHeader h;
  KILN_RETURN_IF_ERROR(Transfer(fd, &h, sizeof(h), false, deadline, peer));
  if (h.code != 0) {
    std::string text(std::min<uint64_t>(h.length, 4096), '\0');
    KILN_RETURN_IF_ERROR(Transfer(fd, text.data(), text.size(), false, deadline, peer));
    return MakeError(PeerCode(h.code), "{} (reported by rank 0 during {})", text, what);
  }
  if (h.length != out.size()) {
    return MakeError(ErrorCode::kCommFailed,
                     "{}: {} sent {} bytes, this rank expected {} (ranks running different kiln "
                     "versions?)",
                     what, peer, h.length, out.size());
  }
  return Transfer(fd, out.data(), out.size(), false, deadline, peer);
}

struct Address {
  sockaddr_storage addr{};
  socklen_t len = 0;
};

StatusOr<Address> Resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port_text = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res); rc != 0) {
    return MakeError(ErrorCode::kRankEnvInvalid, "MASTER_ADDR '{}' does not resolve: {}", host,
                     gai_strerror(rc));
  }
  Address a;
  std::memcpy(&a.addr, res->ai_addr, res->ai_addrlen);
  a.len = res->ai_addrlen;
  ::freeaddrinfo(res);
  return a;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i == 16) return out + fmt::format(" and {} more", ranks.size() - 16);
    out += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  return out;
}

class TcpCommunicator final : public Communicator {
 public:
  TcpCommunicator(int rank, int size, std::string where)
      : rank_(rank), size_(size), where_(std::move(where)), peers_(rank == 0 ? size : 0) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view kind() const override { return "tcp"; }

  StatusOr<std::vector<std::byte>> AllGather(std::span<const std::byte> mine, Deadline deadline,
                                             std::string_view what) override {
    std::vector<std::byte> all(mine.size() * size_);
    if (rank_ != 0) {
      KILN_RETURN_IF_ERROR(SendFrame(root_.get(), mine, 0, deadline, RootName()));
      // The grace lets rank 0's verdict (which rank did not contribute) arrive first.
      KILN_RETURN_IF_ERROR(RecvFrame(root_.get(), all, deadline + kVerdictGrace, RootName(), what));
      return all;
    }
    std::copy(mine.begin(), mine.end(), all.begin());
    for (int r = 1; r < size_; ++r) {
      Status s = RecvFrame(peers_[r].get(), std::span(all).subspan(r * mine.size(), mine.size()),
                           deadline, fmt::format("rank {}", r), what);
      if (!s.ok()) {
        if (s.code() == ErrorCode::kCollectiveTimeout) {
          s = MakeError(ErrorCode::kRankMissing,
                        "{}: rank(s) {} did not contribute within the bound (rank 0 at {})", what,
                        RankList(Silent(r)), where_);
        }
        return Fail(std::move(s));
      }
    }
    for (int r = 1; r < size_; ++r) {
      if (Status s = SendFrame(peers_[r].get(), all, 0, deadline, fmt::format("rank {}", r));
          !s.ok()) {
        return Fail(std::move(s));
      }
    }
    return all;
  }

  Status Broadcast(std::span<std::byte> bytes, int root, Deadline deadline,
                   std::string_view what) override {
    if (root < 0 || root >= size_) {
      return MakeError(ErrorCode::kInternal, "{}: broadcast root {} outside the {} ranks", what,
                       root, size_);
    }
    if (rank_ != 0) {
      if (rank_ == root) return SendFrame(root_.get(), bytes, 0, deadline, RootName());
      return RecvFrame(root_.get(), bytes, deadline, RootName(), what);
    }
    // Rank 0 relays a broadcast from another root.
    if (root != 0) {
      Status s = RecvFrame(peers_[root].get(), bytes, deadline, fmt::format("rank {}", root), what);
      if (!s.ok()) return Fail(std::move(s), root);
    }
    for (int r = 1; r < size_; ++r) {
      if (r == root) continue;
      if (Status s = SendFrame(peers_[r].get(), bytes, 0, deadline, fmt::format("rank {}", r));
          !s.ok()) {
        return Fail(std::move(s));
      }
    }
    return OkStatus();
  }

  StatusOr<std::unique_ptr<Communicator>> Split(int, int) override {
    return MakeError(ErrorCode::kTransportUnavailable,
                     "--build-on per-node/per-arch needs MPI: the TCP control channel of a "
                     "launch without MPI (torchrun) has a single group; use --build-on rank0 or "
                     "launch with mpirun/srun --mpi");
  }

  // Rank 0 side of the rendezvous. After a bad claim rank 0 keeps answering, for a short grace,
  // the ranks still connecting, so that they fail with the same cause instead of a timeout.
  Status Serve(Fd listener, Deadline deadline) {
    const Clock::time_point start = Clock::now();
    std::vector<int> pids(size_, 0);
    int answered = 0;  // ranks connected, or told the fatal error
    Status fatal;
    Deadline until = deadline;
    while (answered < size_ - 1) {
      pollfd p{listener.get(), POLLIN, 0};
      const int ready = ::poll(&p, 1, MillisLeft(until));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) {
        if (Clock::now() < until) continue;
        if (!fatal.ok()) return fatal;
        std::vector<int> missing;
        for (int r = 1; r < size_; ++r) {
          if (!peers_[r].valid()) missing.push_back(r);
        }
        return Fail(MakeError(ErrorCode::kRankMissing,
                              "{} of {} ranks did not connect to rank 0 at {} within {:.1f} s "
                              "(the bound): missing rank(s) {}",
                              missing.size(), size_, where_, SecondsSince(start),
                              RankList(missing)));
      }
      Fd client(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (!client.valid()) continue;
      Hello hello;
      const Deadline hello_deadline = std::min(until, Clock::now() + kHelloBound);
      if (!Transfer(client.get(), &hello, sizeof(hello), false, hello_deadline, "a new connection")
               .ok() ||
          hello.magic != kMagic) {
        continue;  // not a kiln rank (or one that died at once): drop it
      }
      Status bad;
      if (!fatal.ok()) {
        bad = fatal;
      } else if (hello.world != size_) {
        bad = MakeError(ErrorCode::kWorldSizeMismatch,
                        "rank {} (pid {}) claims world size {}, rank 0 at {} has world size {}",
                        hello.rank, hello.pid, hello.world, where_, size_);
      } else if (hello.rank <= 0 || hello.rank >= size_) {
        bad = MakeError(hello.rank == 0 ? ErrorCode::kDuplicateRank : ErrorCode::kWorldSizeMismatch,
                        "a process (pid {}) connected to rank 0 at {} claiming rank {} of a world "
                        "of {}",
                        hello.pid, where_, hello.rank, size_);
      } else if (peers_[hello.rank].valid()) {
        bad = MakeError(ErrorCode::kDuplicateRank,
                        "two processes claim rank {} (pids {} and {}), seen by rank 0 at {}",
                        hello.rank, pids[hello.rank], hello.pid, where_);
      }
      if (!bad.ok()) {
        (void)SendError(client.get(), bad, hello_deadline, "the rejected process");
        if (fatal.ok()) {
          fatal = Fail(std::move(bad));  // tells the ranks already connected
          until = std::min(deadline, Clock::now() + kHelloBound);
          answered = 0;
          for (int r = 1; r < size_; ++r) answered += pids[r] != 0;
        }
        ++answered;
        continue;
      }
      pids[hello.rank] = hello.pid;
      peers_[hello.rank] = std::move(client);
      ++answered;
    }
    if (!fatal.ok()) return fatal;
    for (int r = 1; r < size_; ++r) {
      if (Status s = SendFrame(peers_[r].get(), {}, 0, deadline, fmt::format("rank {}", r));
          !s.ok()) {
        return Fail(std::move(s));
      }
    }
    return OkStatus();
  }

  // Other ranks' side: connect (retrying), hello, wait for rank 0's verdict.
  Status Join(const Address& addr, int pid, Deadline deadline) {
    const Clock::time_point start = Clock::now();
    std::string last_error = "no attempt";
    for (;;) {
      Fd sock(::socket(addr.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      if (!sock.valid()) {
        return MakeError(ErrorCode::kCommFailed, "socket() for rank 0 at {}: {}", where_,
                         std::strerror(errno));
      }
      int rc = ::connect(sock.get(), reinterpret_cast<const sockaddr*>(&addr.addr), addr.len);
      if (rc != 0 && errno == EINPROGRESS) {
        pollfd p{sock.get(), POLLOUT, 0};
        int err = ETIMEDOUT;
        if (::poll(&p, 1, MillisLeft(deadline)) > 0) {
          socklen_t len = sizeof(err);
          ::getsockopt(sock.get(), SOL_SOCKET, SO_ERROR, &err, &len);
        }
        rc = err == 0 ? 0 : -1;
        errno = err;
      }
      if (rc == 0) {
        root_ = std::move(sock);
        break;
      }
      last_error = std::strerror(errno);
      if (Clock::now() >= deadline) {
        return MakeError(ErrorCode::kRankMissing,
                         "rank {} could not reach rank 0 at {} within {:.1f} s (the bound; last "
                         "error: {}): rank 0 has not started or is gone, or MASTER_ADDR/"
                         "MASTER_PORT differ between ranks",
                         rank_, where_, SecondsSince(start), last_error);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    Hello hello;
    hello.rank = rank_;
    hello.world = size_;
    hello.pid = pid;
    KILN_RETURN_IF_ERROR(Transfer(root_.get(), &hello, sizeof(hello), true, deadline, RootName()));
    Status verdict =
        RecvFrame(root_.get(), {}, deadline + kVerdictGrace, RootName(), "the rendezvous");
    if (verdict.code() == ErrorCode::kCollectiveTimeout) {
      return MakeError(ErrorCode::kRankMissing,
                       "rank {} connected to rank 0 at {}, but rank 0 gave no verdict within "
                       "{:.1f} s (the bound + {} s grace); rank 0's log names the missing ranks",
                       rank_, where_, SecondsSince(start), kVerdictGrace.count());
    }
    return verdict;
  }

 private:
  std::string RootName() const { return fmt::format("rank 0 at {}", where_); }

  // Ranks from `first` on that have sent nothing yet (a timed-out gather names them all).
  std::vector<int> Silent(int first) const {
    std::vector<int> out;
    for (int r = first; r < size_; ++r) {
      pollfd p{peers_[r].get(), POLLIN, 0};
      if (r == first || ::poll(&p, 1, 0) <= 0) out.push_back(r);
    }
    return out;
  }

  // Rank 0 tells every connected rank except `skip` why the collective failed, then returns it;
  // the connections are then dropped, since the ranks' positions in the protocol now differ.
  Status Fail(Status error, int skip = -1) {
    const Deadline bound = Clock::now() + kHelloBound;
    for (int r = 1; r < static_cast<int>(peers_.size()); ++r) {
      if (r != skip && peers_[r].valid()) (void)SendError(peers_[r].get(), error, bound, "");
      peers_[r].Reset();
    }
    return error;
  }

  int rank_;
  int size_;
  std::string where_;      // "host:port (MASTER_PORT n + offset k)"
  Fd root_;                // ranks other than 0: the connection to rank 0
  std::vector<Fd> peers_;  // rank 0: the connection to each rank
};

}  // namespace

StatusOr<std::unique_ptr<Communicator>> TcpConnect(const RankInfo& me, Deadline deadline,
                                                   int port_offset) {
  if (me.world_size == 1) return std::unique_ptr<Communicator>(new TcpCommunicator(0, 1, ""));
  if (me.master_addr.empty() || me.master_port <= 0) {
    return MakeError(ErrorCode::kRankEnvInvalid,
                     "MASTER_ADDR/MASTER_PORT are not set: rank {} of {} was launched without MPI "
                     "and needs them to find rank 0 (torchrun sets both)",
                     me.rank, me.world_size);
  }
  const int port = me.master_port + port_offset;
  const std::string where = fmt::format("{}:{} (MASTER_PORT {} + offset {})", me.master_addr, port,
                                        me.master_port, port_offset);
  KILN_ASSIGN_OR_RETURN(Address addr, Resolve(me.master_addr, port));
  auto comm = std::make_unique<TcpCommunicator>(me.rank, me.world_size, where);
  if (me.rank != 0) {
    KILN_RETURN_IF_ERROR(comm->Join(addr, static_cast<int>(::getpid()), deadline));
    return std::unique_ptr<Communicator>(std::move(comm));
  }
  // Rank 0 binds the wildcard address of MASTER_ADDR's family: MASTER_ADDR is how the others
  // reach this host, which need not be an address of one of its own interfaces (NAT, aliases).
  Address any;
  any.addr.ss_family = addr.addr.ss_family;
  if (addr.addr.ss_family == AF_INET6) {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&any.addr);
    a6->sin6_addr = in6addr_any;
    a6->sin6_port = htons(static_cast<uint16_t>(port));
    any.len = sizeof(sockaddr_in6);
  } else {
    auto* a4 = reinterpret_cast<sockaddr_in*>(&any.addr);
    a4->sin_addr.s_addr = htonl(INADDR_ANY);
    a4->sin_port = htons(static_cast<uint16_t>(port));
    any.len = sizeof(sockaddr_in);
  }
  Fd listener(::socket(any.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  const int one = 1;
  if (listener.valid()) ::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (!listener.valid() ||
      ::bind(listener.get(), reinterpret_cast<const sockaddr*>(&any.addr), any.len) != 0 ||
      ::listen(listener.get(), 1024) != 0) {
    return MakeError(ErrorCode::kCommFailed,
                     "rank 0 cannot listen on port {} for {}: {} (another job on this host with "
                     "the same MASTER_PORT?)",
                     port, where, std::strerror(errno));
  }
  KILN_RETURN_IF_ERROR(comm->Serve(std::move(listener), deadline));
  return std::unique_ptr<Communicator>(std::move(comm));
}

StatusOr<std::vector<std::byte>> TcpExchange(const RankInfo& me, std::span<const std::byte> value,
                                             size_t size, Deadline deadline, int port_offset) {
  if (me.rank == 0 && value.size() != size) {
    return MakeError(ErrorCode::kInternal, "rank 0 must pass the {}-byte value ({} given)", size,
                     value.size());
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, TcpConnect(me, deadline, port_offset));
  std::vector<std::byte> out(size);
  if (me.rank == 0) std::copy(value.begin(), value.end(), out.begin());
  KILN_RETURN_IF_ERROR(comm->Broadcast(out, 0, deadline, "the value exchange"));
  return out;
}

}  // namespace kiln::distributed
