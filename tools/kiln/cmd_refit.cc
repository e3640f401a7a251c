// `kiln refit`: new weights into an existing engine (like TensorRT's refitter): the engine's
// recorded weight program replayed on the new model's initializers; layers, tactics and memory
// plan stay as built.
#include <iostream>
#include <optional>

#include "kiln/builder/builder_config.h"
#include "kiln/builder/refit.h"
#include "kiln/core/file_io.h"
#include "tools/kiln/command.h"

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
};

int Run(const RefitOptions& o, const GlobalOptions& global) {
  const std::string out = o.output.empty() ? o.engine : o.output;
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
                  "ONNX model holding the new initializers (the same names, dtypes and shapes)")
      ->required()
      ->check(CLI::ExistingFile);
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
  return [o, &global]() { return Run(*o, global); };
}

}  // namespace
KILN_REGISTER_COMMAND(refit, 15, Setup);

}  // namespace kiln::cli
