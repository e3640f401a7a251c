// `kiln refit`: new weights into an existing engine (like TensorRT's refitter): the engine's
// recorded weight program replayed on the new model's initializers; layers, tactics and memory
// plan stay as built.
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include "kiln/app/shared_refit.h"
#include "kiln/builder/builder_config.h"
#include "kiln/builder/refit.h"
#include "kiln/core/file_io.h"
#include "kiln/distributed/mpi_comm.h"
#include "kiln/distributed/rank.h"
#include "kiln/distributed/tcp_exchange.h"
#include "kiln/engine/engine_file.h"
#include "tools/kiln/command.h"
#include "tools/kiln/options.h"

namespace kiln::cli {
namespace {

struct RefitOptions {
  std::string engine;
  std::string weights;
  std::string output;  // empty: replace the engine file
  bool json = false;
  // --recalibrate: INT8 scales calibrated again with the new weights (else the stored ones).
  bool recalibrate = false;
  std::string calib_dir, calib_method = "minmax";
  double calib_percentile = 99.99;
  // --distributed: every rank of the job runs the same command (app::RefitShared).
  bool distributed = false;
  std::string transport = "auto";
  int rank = -1, world_size = 0;
  double join_timeout_s = 60, timeout_s = 300;
  std::string dist_report;
};

// The job's communicator for a shared refit: MPI's world under an MPI launcher, TCP through rank
// 0 (MASTER_ADDR:MASTER_PORT + 17) under torchrun, none for a job of one.
StatusOr<std::unique_ptr<distributed::Communicator>> OpenRefitWorld(
    const RefitOptions& o, const distributed::RankInfo& me,
    std::unique_ptr<distributed::MpiSession>* mpi) {
  std::string t = o.transport;
  if (t == "auto") {
    t = distributed::MpiAvailable() ? "mpi"
        : me.world_size == 1        ? "local"
        : !me.master_addr.empty()   ? "tcp"
                                    : "";
    if (t.empty()) {
      return MakeError(ErrorCode::kTransportUnavailable,
                       "world size {} (from {}) but neither MPI nor a torchrun rendezvous "
                       "(MASTER_ADDR) is there: launch with mpirun, srun --mpi or torchrun",
                       me.world_size, me.launcher);
    }
  }
  if (t == "local") {
    if (me.world_size != 1) {
      return MakeError(ErrorCode::kTransportUnavailable,
                       "--transport local with world size {} (from {}): use mpi or tcp",
                       me.world_size, me.launcher);
    }
    return distributed::MakeLocalCommunicator();
  }
  if (t == "mpi") {
    if (!distributed::MpiAvailable()) {
      return MakeError(ErrorCode::kTransportUnavailable,
                       "--transport mpi, but this process was not started by an MPI launcher "
                       "(mpirun, srun --mpi)");
    }
    auto session = distributed::MpiSession::Start();
    if (!session.ok()) return session.status();
    *mpi = std::move(*session);
    return distributed::MpiWorld();
  }
  if (t == "tcp") {
    if (me.world_size > 1 && me.master_addr.empty()) {
      return MakeError(ErrorCode::kRankEnvInvalid,
                       "--transport tcp needs MASTER_ADDR and MASTER_PORT (torchrun sets them)");
    }
    return distributed::TcpConnect(
        me, distributed::Clock::now() +
                std::chrono::milliseconds(static_cast<int64_t>(o.join_timeout_s * 1000)));
  }
  return MakeError(ErrorCode::kInvalidArgument, "--transport '{}': use auto, mpi, tcp or local",
                   o.transport);
}

// `kiln refit --distributed`: every rank loads the engine; ranks whose file system has the
// weights pass them. When all do, each refits locally; otherwise the lowest that does computes the
// refit and broadcasts only the constants that changed. Every rank writes the refit engine, or,
// on any error, nothing (every rank gets the error).
int RunDistributed(const RefitOptions& o, const GlobalOptions& global, const std::string& out) {
  if (o.recalibrate || !o.calib_dir.empty()) {
    return ReportError(MakeError(ErrorCode::kInvalidArgument,
                                 "--recalibrate is for a refit on one process: recalibrate there, "
                                 "then share that engine (kiln build --distributed, or copy it)"));
  }
  distributed::RankOverrides overrides;
  if (o.rank >= 0) overrides.rank = o.rank;
  if (o.world_size > 0) overrides.world_size = o.world_size;
  auto me = distributed::DiscoverRank(overrides);
  if (!me.ok()) return ReportError(me.status());
  // Weights on this rank's file system: given and present. A path that exists on other ranks'
  // nodes only is how a job whose weights sit on one node runs one command everywhere.
  std::error_code ec;
  const bool holds = !o.weights.empty() && std::filesystem::exists(o.weights, ec);
  FileRoles files;
  if (holds) files.Input(o.weights, "weights");
  if (out == o.engine) {
    files.InOut(o.engine, "engine");
  } else {
    files.Input(o.engine, "engine");
    files.Output(out, "output engine");
  }
  files.Output(o.dist_report, "distributed report");
  if (Status s = files.Check(); !s.ok()) return ReportError(s);
  if (!holds && !o.weights.empty() && !global.quiet) {
    std::cerr << fmt::format(
        "rank {}: '{}' is not on this rank's file system; it takes the "
        "weights from a rank that has them\n",
        me->rank, o.weights);
  }
  LoadOptions load;
  load.check_providers = false;  // the refit runs on the host: a CUDA engine is refit here too
  auto desc = LoadEngineFileForEdit(o.engine, load);
  if (!desc.ok()) return ReportError(desc.status());
  std::optional<app::SharedRefitWeights> weights;
  if (holds) {
    auto read = ReadOnnxWeights(o.weights);
    if (!read.ok()) return ReportError(read.status());
    weights.emplace();
    weights->initializers = std::move(read->initializers);
    weights->model_hash = read->file_hash;
  }
  std::unique_ptr<distributed::MpiSession> mpi;  // held until the refit is done
  auto comm = OpenRefitWorld(o, *me, &mpi);
  if (!comm.ok()) return ReportError(comm.status());
  app::LiveEngine engine(*desc, nullptr);
  auto report = app::RefitShared(engine, weights ? &*weights : nullptr, **comm, o.timeout_s);
  if (!report.ok()) {
    return ReportError(std::move(report).status().AddContext(
        fmt::format("refitting '{}' on rank {} of {}", o.engine, me->rank, me->world_size)));
  }
  auto current = engine.Current();
  if (!current.ok()) return ReportError(current.status());
  if (Status s = WriteEngineFile(**current, out, /*replaces_input=*/true); !s.ok()) {
    return ReportError(s);
  }
  const std::string json = report->ToJson();
  if (!o.dist_report.empty()) {
    if (Status s = WriteFileAtomic(o.dist_report, "distributed report", json + "\n"); !s.ok())
      return ReportError(s);
  }
  if (o.json) {
    std::cout << json << "\n";
  } else if (!global.quiet) {
    if (report->mode == "local" || report->rank == report->source) {
      std::cout << report->refit.ToText();
    }
    std::cout << fmt::format(
        "rank {} of {}: {} ({}), {} constant(s) received, {} bytes sent by rank {}\nwrote {}\n",
        report->rank, report->world_size, report->mode,
        report->mode == "local" ? "every rank holds the weights and refit them itself"
                                : "one rank computed the refit for the others",
        report->mode == "local" ? 0 : report->constants_sent, report->bytes_sent, report->source,
        out);
  }
  return 0;
}

int Run(const RefitOptions& o, const GlobalOptions& global) {
  const std::string out = o.output.empty() ? o.engine : o.output;
  if (o.distributed) return RunDistributed(o, global, out);
  if (o.weights.empty()) {
    return ReportError(MakeError(ErrorCode::kInvalidArgument,
                                 "--weights NEW.onnx is required (only a --distributed refit may "
                                 "leave it out on the ranks that receive the weights)"));
  }
  FileRoles files;
  files.Input(o.weights, "weights");
  std::optional<RecalibrateOptions> recalibrate;
  if (o.recalibrate) {
    if (o.calib_dir.empty()) {
      return ReportError(MakeError(ErrorCode::kInvalidArgument,
                                   "--recalibrate needs the calibration data: --calib-dir DIR"));
    }
    BuilderConfig parsed;
    if (Status s = ParseCalibrationMethodSpec(o.calib_method, o.calib_percentile, &parsed);
        !s.ok()) {
      return ReportError(s);
    }
    recalibrate =
        RecalibrateOptions{o.calib_dir, parsed.calibration_method, parsed.calibration_percentile};
  } else if (!o.calib_dir.empty()) {
    return ReportError(MakeError(ErrorCode::kInvalidArgument,
                                 "--calib-dir is for --recalibrate (without it, INT8 layers keep "
                                 "the engine's stored activation scales)"));
  }
  if (out == o.engine) {
    files.InOut(o.engine, "engine");  // replaced whole, atomically, only on success
  } else {
    files.Input(o.engine, "engine");
    files.Output(out, "output engine");
  }
  if (Status s = files.Check(); !s.ok()) return ReportError(s);
  RefitReport report;
  if (Status s =
          RefitEngineFile(o.engine, o.weights, out, &report, recalibrate ? &*recalibrate : nullptr);
      !s.ok()) {
    return ReportError(s);
  }
  if (o.json) {
    std::cout << report.ToJson() << "\n";
  } else if (!global.quiet) {
    std::cout << report.ToText() << "wrote " << out << "\n";
  }
  return 0;
}

std::function<int()> Setup(CLI::App& app, const GlobalOptions& global) {
  auto o = std::make_shared<RefitOptions>();
  CLI::App* sub = app.add_subcommand(
      "refit",
      "Put new weights into an engine without rebuilding it (same layers, tactics and memory "
      "plan); the weights must be the same architecture's");
  sub->add_option("engine", o->engine, ".kiln engine file (any backend)")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("--weights", o->weights,
                  "ONNX model holding the new initializers (the same names, dtypes and shapes); "
                  "with --distributed, ranks where this path does not exist receive the refit "
                  "from a rank where it does");
  sub->add_option("-o,--output", o->output,
                  "write the refit engine here (default: replace ENGINE; on an error it is left "
                  "as it was)");
  sub->add_flag("--json", o->json, "print the refit report as JSON");
  sub->add_flag("--recalibrate", o->recalibrate,
                "INT8 engines: calibrate the activation scales again with the new weights (as a "
                "fresh build with --calib-dir does); without it the stored scales are kept and "
                "the new weights re-quantised with them");
  sub->add_option("--calib-dir", o->calib_dir,
                  "with --recalibrate: calibration inputs, DIR/test_data_set_N/input_I.pb (as "
                  "`kiln build --calib-dir`)")
      ->check(CLI::ExistingDirectory);
  sub->add_option("--calib-method", o->calib_method,
                  "with --recalibrate: minmax, entropy or percentile[=P] (use the build's)")
      ->capture_default_str();
  sub->add_option("--calib-percentile", o->calib_percentile,
                  "with --recalibrate: share of |x| kept by the percentile calibrator, in (0, 100]")
      ->capture_default_str();
  auto* dist = sub->add_option_group(
      "Distributed", "every rank of a job runs the same command; weights cross once at most");
  dist->add_flag("--distributed", o->distributed,
                 "refit the same engine on every rank of the job (ranks from torchrun, OpenMPI or "
                 "Slurm): if every rank has the weights each refits locally and nothing is sent; "
                 "otherwise the lowest rank that has them refits and broadcasts only the "
                 "constants that changed");
  dist->add_option("--transport", o->transport, "auto, mpi, tcp (torchrun's MASTER_ADDR) or local")
      ->capture_default_str();
  dist->add_option("--rank", o->rank, "this process's rank (overrides the launcher's environment)")
      ->check(Count(0, kMaxRanks - 1));
  dist->add_option("--world-size", o->world_size,
                   "the job's world size (overrides the environment)")
      ->check(Count(1, kMaxRanks));
  dist->add_option("--join-timeout", o->join_timeout_s, "seconds for every rank to connect (tcp)")
      ->capture_default_str()
      ->check(Seconds());
  dist->add_option("--timeout", o->timeout_s,
                   "seconds each exchange of the refit may take (the ranks' hello, the weights)")
      ->capture_default_str()
      ->check(Seconds());
  dist->add_option("--dist-report", o->dist_report,
                   "write this rank's shared-refit report (JSON: mode, source, bytes sent)");
  return [o, &global]() { return Run(*o, global); };
}

}  // namespace
KILN_REGISTER_COMMAND(refit, 15, Setup);

}  // namespace kiln::cli
