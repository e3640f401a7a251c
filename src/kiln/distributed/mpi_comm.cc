// MPI communicator. Collectives are built from non-blocking calls polled to a deadline. The
// all-gather is a gather of hellos at rank 0 followed by a verdict from rank 0, so that rank 0
// knows exactly which ranks never arrived and can tell every rank that did.
#include "kiln/distributed/mpi_comm.h"

// C API only: OpenMPI's mpi.h otherwise drags in the removed C++ bindings.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kiln/distributed/poll.h"

namespace kiln::distributed {
namespace {

constexpr int kTagHello = 7101;
constexpr int kTagVerdict = 7102;
constexpr auto kVerdictGrace = std::chrono::seconds(2);
constexpr size_t kChunk = size_t{64} << 20;  // MPI counts are int; 64 MiB keeps them small

Status MpiError(int rc, std::string_view call) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return MakeError(ErrorCode::kCommFailed, "{} failed: {} (MPI error {})", call,
                   std::string_view(text, len), rc);
}

#define KILN_MPI(call)                                          \
  do {                                                          \
    if (int kiln_mpi_rc_ = (call); kiln_mpi_rc_ != MPI_SUCCESS) \
      return MpiError(kiln_mpi_rc_, #call);                     \
  } while (0)

// Abandons requests that will not complete (their peers are gone or late).
void Abandon(std::vector<MPI_Request>& requests) {
  for (MPI_Request& r : requests) {
    if (r != MPI_REQUEST_NULL) {
      MPI_Cancel(&r);
      MPI_Request_free(&r);
    }
  }
}

std::string RankList(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i == 8) return out + fmt::format(" and {} more", ranks.size() - 8);
    out += (i ? ", " : "") + std::to_string(ranks[i]);
  }
  return out;
}

class MpiCommunicator final : public Communicator {
 public:
  // `owned`: a communicator kiln created (split); otherwise MPI_COMM_WORLD, used only for
  // point-to-point messages on kiln's own tags until a private duplicate exists.
  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    if (owned) coll_ = comm_;
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (coll_ != MPI_COMM_NULL) MPI_Comm_free(&coll_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view kind() const override { return "mpi"; }

  StatusOr<std::vector<std::byte>> AllGather(std::span<const std::byte> mine, Deadline deadline,
                                             std::string_view what) override {
    const size_t rec = mine.size();
    // Verdict: int32 missing count, int32 missing ranks[size], then the table.
    const size_t head = sizeof(int32_t) * (1 + size_);
    std::vector<std::byte> verdict(head + rec * size_);
    const Clock::time_point start = Clock::now();
    if (rank_ != 0) {
      std::vector<MPI_Request> reqs(2, MPI_REQUEST_NULL);
      KILN_MPI(
          MPI_Isend(mine.data(), static_cast<int>(rec), MPI_BYTE, 0, kTagHello, comm_, &reqs[0]));
      KILN_MPI(MPI_Irecv(verdict.data(), static_cast<int>(verdict.size()), MPI_BYTE, 0, kTagVerdict,
                         comm_, &reqs[1]));
      // Rank 0 answers when everyone arrived or at the deadline, so allow its answer a grace
      // period to travel before concluding that rank 0 itself is gone.
      const bool done = PollUntil(deadline + kVerdictGrace, [&] {
        int flag = 0;
        MPI_Test(&reqs[1], &flag, MPI_STATUS_IGNORE);
        return flag != 0;
      });
      if (!done) {
        Abandon(reqs);
        return MakeError(ErrorCode::kRankMissing,
                         "rank 0 did not answer the {} within {:.1f} s (the bound): rank 0 is "
                         "missing, stuck, or gave up on this rank",
                         what, SecondsSince(start));
      }
      if (reqs[0] != MPI_REQUEST_NULL) MPI_Request_free(&reqs[0]);
    } else {
      std::memcpy(verdict.data() + head, mine.data(), rec);
      std::vector<MPI_Request> reqs(size_, MPI_REQUEST_NULL);
      for (int r = 1; r < size_; ++r) {
        KILN_MPI(MPI_Irecv(verdict.data() + head + rec * r, static_cast<int>(rec), MPI_BYTE, r,
                           kTagHello, comm_, &reqs[r]));
      }
      // MPI_Test one by one: MPI_Testall leaves every request untouched unless all completed,
      // and the completed ones are how rank 0 tells who arrived.
      PollUntil(deadline, [&] {
        bool all = true;
        for (MPI_Request& r : reqs) {
          int flag = 1;
          if (r != MPI_REQUEST_NULL) MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
          all = all && flag != 0;
        }
        return all;
      });
      std::vector<int32_t> missing;
      for (int r = 1; r < size_; ++r) {
        if (reqs[r] != MPI_REQUEST_NULL) missing.push_back(r);
      }
      Abandon(reqs);
      int32_t n = static_cast<int32_t>(missing.size());
      std::memcpy(verdict.data(), &n, sizeof(n));
      std::memcpy(verdict.data() + sizeof(n), missing.data(), missing.size() * sizeof(int32_t));
      // Tell every rank, late ones included, so that they all fail with the same message.
      std::vector<MPI_Request> sends(size_, MPI_REQUEST_NULL);
      for (int r = 1; r < size_; ++r) {
        KILN_MPI(MPI_Isend(verdict.data(), static_cast<int>(verdict.size()), MPI_BYTE, r,
                           kTagVerdict, comm_, &sends[r]));
      }
      std::vector<MPI_Request> arrived;
      for (int r = 1; r < size_; ++r) {
        if (std::find(missing.begin(), missing.end(), r) == missing.end()) {
          arrived.push_back(sends[r]);
        } else if (sends[r] != MPI_REQUEST_NULL) {
          MPI_Request_free(&sends[r]);
        }
      }
      PollUntil(std::max(deadline, Clock::now()) + std::chrono::seconds(2), [&] {
        int flag = 0;
        MPI_Testall(static_cast<int>(arrived.size()), arrived.data(), &flag, MPI_STATUSES_IGNORE);
        return flag != 0;
      });
      for (MPI_Request& r : arrived) {
        if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
      }
    }
    int32_t n_missing = 0;
    std::memcpy(&n_missing, verdict.data(), sizeof(n_missing));
    if (n_missing > 0) {
      std::vector<int> missing(n_missing);
      for (int i = 0; i < n_missing; ++i) {
        int32_t r = 0;
        std::memcpy(&r, verdict.data() + sizeof(int32_t) * (1 + i), sizeof(r));
        missing[i] = r;
      }
      const bool me = std::find(missing.begin(), missing.end(), rank_) != missing.end();
      return MakeError(
          ErrorCode::kRankMissing,
          "{} of {} ranks did not arrive at the {} within the bound: missing rank{} {}{}",
          missing.size(), size_, what, missing.size() == 1 ? "" : "s", RankList(missing),
          me ? " (this process arrived too late)" : "");
    }
    return std::vector<std::byte>(verdict.begin() + static_cast<std::ptrdiff_t>(head),
                                  verdict.end());
  }

  Status Broadcast(std::span<std::byte> bytes, int root, Deadline deadline,
                   std::string_view what) override {
    const Clock::time_point start = Clock::now();
    KILN_RETURN_IF_ERROR(EnsureCollectiveComm(deadline));
    // Small messages are waits for someone (the header waits for the build); large ones are
    // transfers that progress only while MPI is called.
    const PollMode mode = bytes.size() >= (size_t{1} << 20) ? PollMode::kBusy : PollMode::kPatient;
    for (size_t off = 0; off < bytes.size() || (off == 0 && bytes.empty()); off += kChunk) {
      const size_t n = std::min(kChunk, bytes.size() - off);
      MPI_Request req = MPI_REQUEST_NULL;
      KILN_MPI(MPI_Ibcast(bytes.data() + off, static_cast<int>(n), MPI_BYTE, root, coll_, &req));
      const bool done = PollUntil(
          deadline,
          [&] {
            int flag = 0;
            MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
            return flag != 0;
          },
          mode);
      if (!done) {
        // A collective cannot be cancelled; the request is left to MPI's teardown.
        return MakeError(
            ErrorCode::kCollectiveTimeout,
            "broadcast of {} from rank {} stopped at {} of {} bytes after {:.1f} s (the "
            "bound){}",
            what, root, off, bytes.size(), SecondsSince(start),
            rank_ == root ? ": some receiving ranks did not take part"
                          : fmt::format(": waited on rank {}", root));
      }
      if (bytes.empty()) break;
    }
    return OkStatus();
  }

  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    MPI_Comm out = MPI_COMM_NULL;
    KILN_MPI(MPI_Comm_split(comm_, color, key, &out));
    MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN);
    return std::unique_ptr<Communicator>(new MpiCommunicator(out, /*owned=*/true));
  }

 private:
  // Collectives run on a private duplicate, made with the non-blocking MPI_Comm_idup so that a
  // rank that stopped coming cannot hang the duplication either.
  Status EnsureCollectiveComm(Deadline deadline) {
    if (coll_ != MPI_COMM_NULL) return OkStatus();
    MPI_Comm dup = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    KILN_MPI(MPI_Comm_idup(comm_, &dup, &req));
    if (!PollUntil(deadline, [&] {
          int flag = 0;
          MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
          return flag != 0;
        })) {
      return MakeError(ErrorCode::kCommInitTimeout,
                       "duplicating the MPI communicator did not complete within the bound: some "
                       "rank stopped taking part");
    }
    MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
    coll_ = dup;
    return OkStatus();
  }

  MPI_Comm comm_;
  MPI_Comm coll_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

bool MpiAvailable() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

StatusOr<std::unique_ptr<MpiSession>> MpiSession::Start() {
  std::unique_ptr<MpiSession> session(new MpiSession());
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    const Clock::time_point t0 = Clock::now();
    int provided = 0;
    KILN_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided));
    session->owns_ = true;
    session->init_seconds_ = SecondsSince(t0);
    // kiln owns MPI here, so errors may come back as codes (converted to Status) instead of
    // MPI's default abort.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  return session;
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

StatusOr<std::unique_ptr<Communicator>> MpiWorld() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    return MakeError(ErrorCode::kTransportUnavailable,
                     "MPI is not initialized (start an MpiSession first)");
  }
  // Nothing collective here: a rank that never arrives must not hang this call.
  return std::unique_ptr<Communicator>(new MpiCommunicator(MPI_COMM_WORLD, /*owned=*/false));
}

}  // namespace kiln::distributed
