// kiln_build_once: the caller's process group as a distributed::Communicator (split into per-node
// or per-arch groups through its callback), then the library's build-once path
// (app::BuildOnceShared), the same one `kiln build --distributed` takes; and
// kiln_engine_refit_group over the same adapter (app::RefitShared).
#include <algorithm>
#include <chrono>
#include <optional>

#include "kiln/api/kiln_c.h"
#include "kiln/api/kiln_c_internal.h"
#include "kiln/app/shared_build.h"
#include "kiln/app/shared_refit.h"
#include "kiln/builder/refit.h"
#include "kiln/engine/engine_file.h"

namespace kiln::api {
namespace {

double SecondsLeft(distributed::Deadline deadline) {
  return std::max(0.0, std::chrono::duration<double>(deadline - distributed::Clock::now()).count());
}

// Collectives through the caller's callbacks; each call's bound is what is left of its deadline.
class CallbackCommunicator : public distributed::Communicator {
 public:
  // `split_timeout`: the bound on forming sub-groups (the join bound: every rank is there).
  CallbackCommunicator(const kiln_comm& comm, double split_timeout)
      : comm_(comm), split_timeout_(split_timeout) {}
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

  StatusOr<std::unique_ptr<distributed::Communicator>> Split(int color, int key) override {
    if (!comm_.split) {
      return MakeError(ErrorCode::kProcessGroupCannotSplit,
                       "the ranks form more than one build-once group, and the process group "
                       "(rank {} of {}) has no split callback",
                       comm_.rank, comm_.size);
    }
    kiln_comm sub{};
    int rc = comm_.split(comm_.user, color, key, &sub, split_timeout_);
    KILN_RETURN_IF_ERROR(
        Check(rc, fmt::format("forming the group of color {}", color), split_timeout_));
    if (!sub.allgather || !sub.broadcast || sub.size < 1 || sub.rank < 0 || sub.rank >= sub.size ||
        sub.size > comm_.size) {
      return MakeError(ErrorCode::kProcessGroupFailed,
                       "the process group's split callback gave rank {} of {} (of a parent of "
                       "{}) or no collectives",
                       sub.rank, sub.size, comm_.size);
    }
    return std::unique_ptr<distributed::Communicator>(
        std::make_unique<CallbackCommunicator>(sub, split_timeout_));
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
  double split_timeout_;
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
                                        const kiln_build_once_options* opts, kiln_engine** out,
                                        kiln_buffer** report_json) {
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
  kiln_build_once_options o{};
  if (opts) o = *opts;
  if (o.join_timeout_s == 0) o.join_timeout_s = 60;
  if (o.wait_timeout_s == 0) o.wait_timeout_s = 1800;
  if (o.transfer_timeout_s == 0) o.transfer_timeout_s = 300;
  for (auto [name, v] : {std::pair{"join_timeout", o.join_timeout_s},
                         {"wait_timeout", o.wait_timeout_s},
                         {"transfer_timeout", o.transfer_timeout_s}}) {
    if (Status s = CheckBound(name, v); !s.ok()) return ToC(s);
  }
  distributed::BuildOnceOptions options;
  if (o.build_on) {
    auto build_on = distributed::ParseBuildOn(o.build_on);
    if (!build_on.ok()) return ToC(build_on.status());
    options.build_on = *build_on;
  }
  if (o.cache_dir) {
    if (!*o.cache_dir) {
      return ToC(MakeError(ErrorCode::kInvalidArgument, "cache_dir is empty: give a directory"));
    }
    distributed::CacheOptions cache;
    cache.dir = o.cache_dir;
    cache.wait_timeout = Ms(o.wait_timeout_s);
    cache.trust_shared = o.trust_shared_cache != 0;
    options.cache = cache;
  }
  auto config = ResolveConfig(*c);
  if (!config.ok()) return ToC(config.status());
  CallbackCommunicator group(*comm, o.join_timeout_s);
  options.transport = distributed::Transport::kMpi;  // control and bytes over `comm`
  options.comm = &group;
  // The process group is who this process is; the launcher's variables do not get a say.
  options.rank_overrides.rank = comm->rank;
  options.rank_overrides.world_size = comm->size;
  options.join_timeout = Ms(o.join_timeout_s);
  options.wait_timeout = Ms(o.wait_timeout_s);
  options.transfer_timeout = Ms(o.transfer_timeout_s);
  if (o.heartbeat_timeout_s > 0) {
    options.heartbeat_timeout = Ms(o.heartbeat_timeout_s);
    options.heartbeat_interval = std::min(Ms(1.0), Ms(o.heartbeat_timeout_s / 4));
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

// kiln_engine_refit_group: the same process group as a Communicator, then app::RefitShared.
extern "C" kiln_status* kiln_engine_refit_group(kiln_engine* e, const kiln_refit_weights* weights,
                                                const kiln_comm* comm, double timeout_s,
                                                kiln_buffer** report_json) {
  using namespace kiln;       // NOLINT
  using namespace kiln::api;  // NOLINT
  if (!e || !comm || !comm->allgather || !comm->broadcast) {
    return ToC(MakeError(ErrorCode::kInvalidArgument,
                         "kiln_engine_refit_group needs an engine and a comm with both callbacks"));
  }
  if (comm->size < 1 || comm->rank < 0 || comm->rank >= comm->size) {
    return ToC(MakeError(ErrorCode::kRankEnvInvalid, "process group rank {} of size {}", comm->rank,
                         comm->size));
  }
  if (timeout_s == 0) timeout_s = 300;
  if (Status s = CheckBound("timeout", timeout_s); !s.ok()) return ToC(s);
  std::optional<app::SharedRefitWeights> mine;
  if (weights) {
    if (weights->onnx && weights->tensors) {
      return ToC(MakeError(ErrorCode::kInvalidArgument,
                           "kiln_refit_weights has both ONNX bytes and named tensors: give one"));
    }
    mine.emplace();
    if (weights->onnx) {
      auto read = ReadOnnxWeightsFromBytes(
          {static_cast<const std::byte*>(weights->onnx), weights->onnx_size});
      if (!read.ok()) return ToC(read.status());
      mine->initializers = std::move(read->initializers);
      mine->model_hash = read->file_hash;
    } else {
      auto named = WeightsFromC(weights->tensors, weights->count);
      if (!named.ok()) return ToC(named.status());
      mine->initializers = std::move(*named);
      mine->model_hash = InitializersHash(mine->initializers);
    }
  }
  CallbackCommunicator group(*comm, timeout_s);
  auto report = app::RefitShared(*e->live, mine ? &*mine : nullptr, group, timeout_s);
  if (!report.ok()) return ToC(report.status());
  if (report_json) *report_json = MakeBuffer(std::string_view(report->ToJson()));
  return nullptr;
}
