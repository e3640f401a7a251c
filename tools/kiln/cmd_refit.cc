// `kiln refit`: new weights into an existing engine (like TensorRT's refitter): the engine's
// recorded weight program replayed on the new model's initializers; layers, tactics and memory
// plan stay as built.
#include <iostream>

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
};

int Run(const RefitOptions& o, const GlobalOptions& global) {
  const std::string out = o.output.empty() ? o.engine : o.output;
  FileRoles files;
  files.Input(o.weights, "weights");
  if (out == o.engine) {
    files.InOut(o.engine, "engine");  // replaced whole, atomically, only on success
  } else {
    files.Input(o.engine, "engine");
    files.Output(out, "output engine");
  }
  if (Status s = files.Check(); !s.ok()) return ReportError(s);
  RefitReport report;
  if (Status s = RefitEngineFile(o.engine, o.weights, out, &report); !s.ok()) {
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
  return [o, &global]() { return Run(*o, global); };
}

}  // namespace
KILN_REGISTER_COMMAND(refit, 15, Setup);

}  // namespace kiln::cli
