// NCCL bulk transport. Every NCCL and CUDA error is converted here, with the library's own
// string and the call that failed (STYLE.md rule 3).
#include "kiln/distributed/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "kiln/distributed/poll.h"

namespace kiln::distributed {

static_assert(sizeof(ncclUniqueId) == sizeof(NcclId));

namespace {

Status NcclError(ncclResult_t rc, std::string_view call, ncclComm_t comm = nullptr) {
  const char* last = comm ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  return MakeError(ErrorCode::kCommFailed, "{} failed: {} (ncclResult_t {}){}{}", call,
                   ncclGetErrorString(rc), static_cast<int>(rc), last && *last ? ": " : "",
                   last ? last : "");
}

Status CudaError(cudaError_t rc, std::string_view call) {
  return MakeError(ErrorCode::kCommFailed, "{} failed: {} ({}, CUDA error {})", call,
                   cudaGetErrorString(rc), cudaGetErrorName(rc), static_cast<int>(rc));
}

#define KILN_CUDA(call)                                                   \
  do {                                                                    \
    if (cudaError_t kiln_cuda_rc_ = (call); kiln_cuda_rc_ != cudaSuccess) \
      return CudaError(kiln_cuda_rc_, #call);                             \
  } while (0)

// Polls a non-blocking communicator until its pending operation finishes; aborts it when the
// deadline passes (an aborted communicator is unusable; the caller must drop it).
Status WaitComm(ncclComm_t comm, Deadline deadline, std::string_view what, bool* aborted) {
  ncclResult_t state = ncclInProgress;
  PollUntil(deadline, [&] {
    ncclCommGetAsyncError(comm, &state);
    return state != ncclInProgress;
  });
  if (state == ncclSuccess) return OkStatus();
  if (state == ncclInProgress) {
    ncclCommAbort(comm);
    *aborted = true;
    return MakeError(ErrorCode::kCommInitTimeout,
                     "{} did not complete within the bound; the communicator was aborted", what);
  }
  Status s = NcclError(state, what, comm);
  ncclCommAbort(comm);
  *aborted = true;
  return s;
}

}  // namespace

struct NcclBroadcaster::State {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  std::byte* device = nullptr;
  std::byte* host = nullptr;  // pinned staging, so copies are truly asynchronous
  size_t chunk = 0;
  int rank = 0;
  bool aborted = false;
};

bool CudaDeviceAvailable() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

StatusOr<NcclId> NewNcclId() {
  ncclUniqueId id;
  if (ncclResult_t rc = ncclGetUniqueId(&id); rc != ncclSuccess)
    return NcclError(rc, "ncclGetUniqueId");
  NcclId out;
  std::memcpy(out.data(), &id, sizeof(id));
  return out;
}

StatusOr<std::unique_ptr<NcclBroadcaster>> NcclBroadcaster::Create(int rank, int nranks,
                                                                   const NcclId& id,
                                                                   Deadline deadline,
                                                                   const NcclOptions& options,
                                                                   int local_rank) {
  int devices = 0;
  if (cudaError_t rc = cudaGetDeviceCount(&devices); rc != cudaSuccess || devices == 0) {
    return MakeError(ErrorCode::kBackendUnavailable, "no CUDA device for the NCCL transport ({})",
                     rc == cudaSuccess ? "0 devices" : cudaGetErrorString(rc));
  }
  const int device = options.device >= 0 ? options.device : local_rank % devices;
  KILN_CUDA(cudaSetDevice(device));

  std::unique_ptr<NcclBroadcaster> self(new NcclBroadcaster());
  self->state_ = std::make_unique<State>();
  State& s = *self->state_;
  s.rank = rank;
  s.chunk = options.chunk_bytes;

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // returns at once; completion is polled, so a missing rank cannot hang us
  ncclUniqueId nid;
  std::memcpy(&nid, id.data(), sizeof(nid));
  const Clock::time_point t0 = Clock::now();
  ncclResult_t rc = ncclCommInitRankConfig(&s.comm, nranks, nid, rank, &config);
  if (rc != ncclSuccess && rc != ncclInProgress) return NcclError(rc, "ncclCommInitRankConfig");
  Status init = WaitComm(
      s.comm, deadline,
      fmt::format("NCCL communicator init (rank {} of {}, device {})", rank, nranks, device),
      &s.aborted);
  self->init_seconds_ = SecondsSince(t0);
  if (!init.ok()) {
    s.comm = nullptr;  // aborted
    return std::move(init).AddContext(fmt::format("after {:.2f} s", self->init_seconds_));
  }
  KILN_CUDA(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  KILN_CUDA(cudaMalloc(&s.device, s.chunk));
  KILN_CUDA(cudaMallocHost(&s.host, s.chunk));
  return self;
}

NcclBroadcaster::~NcclBroadcaster() {
  if (!state_) return;
  State& s = *state_;
  if (s.comm != nullptr && !s.aborted) {
    // Finalize flushes outstanding work; bounded like everything else, then destroyed or aborted.
    bool aborted = false;
    ncclResult_t rc = ncclCommFinalize(s.comm);
    if ((rc == ncclSuccess || rc == ncclInProgress) &&
        WaitComm(s.comm, Clock::now() + std::chrono::seconds(10), "ncclCommFinalize", &aborted)
            .ok()) {
      ncclCommDestroy(s.comm);
    } else if (!aborted) {
      ncclCommAbort(s.comm);
    }
  }
  if (s.device) cudaFree(s.device);
  if (s.host) cudaFreeHost(s.host);
  if (s.stream) cudaStreamDestroy(s.stream);
}

Status NcclBroadcaster::Broadcast(std::span<std::byte> bytes, int root, Deadline deadline) {
  State& s = *state_;
  if (s.comm == nullptr || s.aborted) {
    return MakeError(ErrorCode::kCommFailed,
                     "the NCCL communicator was aborted earlier; create a new one");
  }
  for (size_t off = 0; off < bytes.size(); off += s.chunk) {
    const size_t n = std::min(s.chunk, bytes.size() - off);
    if (s.rank == root) {
      std::memcpy(s.host, bytes.data() + off, n);
      KILN_CUDA(cudaMemcpyAsync(s.device, s.host, n, cudaMemcpyHostToDevice, s.stream));
    }
    ncclResult_t rc = ncclBroadcast(s.device, s.device, n, ncclUint8, root, s.comm, s.stream);
    if (rc != ncclSuccess && rc != ncclInProgress) return NcclError(rc, "ncclBroadcast", s.comm);
    KILN_RETURN_IF_ERROR_CTX(WaitComm(s.comm, deadline, "enqueueing ncclBroadcast", &s.aborted),
                             "chunk at byte {} of {}", off, bytes.size());
    if (s.rank != root)
      KILN_CUDA(cudaMemcpyAsync(s.host, s.device, n, cudaMemcpyDeviceToHost, s.stream));
    // The stream finishes when every rank took part; poll it together with NCCL's error state.
    cudaError_t q = cudaErrorNotReady;
    ncclResult_t async = ncclSuccess;
    PollUntil(deadline, [&] {
      q = cudaStreamQuery(s.stream);
      ncclCommGetAsyncError(s.comm, &async);
      return q != cudaErrorNotReady || (async != ncclSuccess && async != ncclInProgress);
    });
    if (async != ncclSuccess && async != ncclInProgress) {
      Status e = NcclError(async, "ncclBroadcast", s.comm);
      ncclCommAbort(s.comm);
      s.aborted = true;
      return e;
    }
    if (q == cudaErrorNotReady) {
      ncclCommAbort(s.comm);
      s.aborted = true;
      return MakeError(
          ErrorCode::kCollectiveTimeout,
          "ncclBroadcast from rank {} stopped at byte {} of {} (the bound passed); the "
          "communicator was aborted",
          root, off, bytes.size());
    }
    if (q != cudaSuccess) return CudaError(q, "cudaStreamQuery after ncclBroadcast");
    if (s.rank != root) std::memcpy(bytes.data() + off, s.host, n);
  }
  return OkStatus();
}

BulkTransportFactory NcclTransportFactory(NcclOptions options) {
  return [options](Communicator& group, const RankInfo& me,
                   Deadline deadline) -> StatusOr<std::unique_ptr<BulkTransport>> {
    NcclId id{};
    if (group.rank() == 0) {
      KILN_ASSIGN_OR_RETURN(id, NewNcclId());
    }
    KILN_RETURN_IF_ERROR_CTX(group.Broadcast(id, 0, deadline, "NCCL unique id"),
                             "exchanging the NCCL unique id");
    KILN_ASSIGN_OR_RETURN(
        std::unique_ptr<NcclBroadcaster> b,
        NcclBroadcaster::Create(group.rank(), group.size(), id, deadline, options, me.local_rank));
    return std::unique_ptr<BulkTransport>(std::move(b));
  };
}

}  // namespace kiln::distributed
