// kiln_build_once: the caller's process group as a distributed::Communicator, then the library's
// build-once path (app::BuildOnceShared), the same one `kiln build --distributed` takes.
#include <algorithm>
#include <chrono>

#include "kiln/api/kiln_c.h"
#include "kiln/api/kiln_c_internal.h"
#include "kiln/app/shared_build.h"
#include "kiln/engine/engine_file.h"

namespace kiln::api {
namespace {

double SecondsLeft(distributed::Deadline deadline) {
  return std::max(0.0, std::chrono::duration<double>(deadline - distributed::Clock::now()).count());
}

// Collectives through the caller's callbacks; each call's bound is what is left of its deadline.
class CallbackCommunicator : public distributed::Communicator {
 public:
  explicit CallbackCommunicator(const kiln_comm& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank; }
  int size() const override { return comm_.size; }
  std::string_view kind() const override { return "process-group"; }

  StatusOr<std::vector<std::byte>> AllGather(std::span<const std::byte> mine,
                                             distributed::Deadline deadline,
                                             std::string_view what) override {
    std::vector<std::byte> all(mine.size() * static_cast<size_t>(comm_.size));
    double bound = SecondsLeft(deadline);
    int rc = comm_.allgather(comm_.user, mine.data(), mine.size(), all.data(), bound);
    KILN_RETURN_IF_ERROR(Check(rc, what, bound));
    return all;
  }

  Status Broadcast(std::span<std::byte> bytes, int root, distributed::Deadline deadline,
                   std::string_view what) override {
    double bound = SecondsLeft(deadline);
    int rc = comm_.broadcast(comm_.user, bytes.data(), bytes.size(), root, bound);
    return Check(rc, what, bound);
  }

  StatusOr<std::unique_ptr<distributed::Communicator>> Split(int, int) override {
    return MakeError(ErrorCode::kUnimplemented,
                     "a caller's process group builds once per job (build_on rank0); per-node and "
                     "per-arch groups need MPI (`kiln build --distributed --build-on ...`)");
  }

 private:
  Status Check(int rc, std::string_view what, double bound) const {
    if (rc == 0) return OkStatus();
    if (rc == 1) {
      return MakeError(ErrorCode::kCollectiveTimeout,
                       "{} over the process group (rank {} of {}) did not complete within {:.1f} s",
                       what, comm_.rank, comm_.size, bound);
    }
    return MakeError(ErrorCode::kProcessGroupFailed,
                     "{} over the process group (rank {} of {}) failed (the caller's collective "
                     "returned {})",
                     what, comm_.rank, comm_.size, rc);
  }
  kiln_comm comm_;
};

std::chrono::milliseconds Ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

Status CheckBound(const char* name, double seconds) {
  if (seconds > 0) return OkStatus();
  return MakeError(ErrorCode::kInvalidArgument, "{} must be positive seconds, not {}", name,
                   seconds);
}

}  // namespace
}  // namespace kiln::api

extern "C" kiln_status* kiln_build_once(const kiln_build_config* c, const void* onnx, size_t size,
                                        const char* model_name, const kiln_comm* comm,
                                        double join_timeout_s, double wait_timeout_s,
                                        double transfer_timeout_s, double heartbeat_timeout_s,
                                        kiln_engine** out, kiln_buffer** report_json) {
  using namespace kiln;       // NOLINT
  using namespace kiln::api;  // NOLINT
  if (!c || !onnx || !comm || !out || !comm->allgather || !comm->broadcast) {
    return ToC(MakeError(ErrorCode::kInvalidArgument,
                         "kiln_build_once needs a config, the model bytes, a comm with both "
                         "callbacks and an output pointer"));
  }
  if (comm->size < 1 || comm->rank < 0 || comm->rank >= comm->size) {
    return ToC(MakeError(ErrorCode::kRankEnvInvalid, "process group rank {} of size {}", comm->rank,
                         comm->size));
  }
  for (auto [name, v] : {std::pair{"join_timeout", join_timeout_s},
                         {"wait_timeout", wait_timeout_s},
                         {"transfer_timeout", transfer_timeout_s}}) {
    if (Status s = CheckBound(name, v); !s.ok()) return ToC(s);
  }
  auto config = ResolveConfig(*c);
  if (!config.ok()) return ToC(config.status());
  CallbackCommunicator group(*comm);
  distributed::BuildOnceOptions options;
  options.transport = distributed::Transport::kMpi;  // control and bytes over `comm`
  options.comm = &group;
  // The process group is who this process is; the launcher's variables do not get a say.
  options.rank_overrides.rank = comm->rank;
  options.rank_overrides.world_size = comm->size;
  options.join_timeout = Ms(join_timeout_s);
  options.wait_timeout = Ms(wait_timeout_s);
  options.transfer_timeout = Ms(transfer_timeout_s);
  if (heartbeat_timeout_s > 0) {
    options.heartbeat_timeout = Ms(heartbeat_timeout_s);
    options.heartbeat_interval = std::min(Ms(1.0), Ms(heartbeat_timeout_s / 4));
    if (c->progress) {
      kiln_progress_fn fn = c->progress;
      void* user = c->progress_user;
      const distributed::Clock::time_point start = distributed::Clock::now();
      options.on_progress = [fn, user, start](const std::string& line) {
        fn(user, "builder", 0, 0, distributed::SecondsSince(start), line.c_str());
      };
    }
  }
  app::ModelSource model;
  model.bytes = {static_cast<const std::byte*>(onnx), size};
  model.name = model_name ? model_name : "model";
  auto shared = app::BuildOnceShared(model, *config, options);
  if (!shared.ok()) return ToC(shared.status());
  LoadOptions load;
  load.check_providers = false;
  auto desc = LoadEngineBytes(shared->bytes, load);
  if (!desc.ok()) return ToC(desc.status());
  auto engine = EngineFromDesc(std::move(*desc));
  if (!engine.ok()) return ToC(engine.status());
  (*engine)->report_json =
      shared->build_report ? shared->build_report->ToJson() : (*engine)->desc->build_report_json;
  if (report_json) *report_json = MakeBuffer(std::string_view(shared->dist_report.ToJson()));
  *out = engine->release();
  return nullptr;
}
