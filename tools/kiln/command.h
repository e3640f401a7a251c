// How a `kiln` subcommand plugs into the CLI: each subcommand lives in its own file and registers
// itself with KILN_REGISTER_COMMAND, so adding one never edits main.cc.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "kiln/core/status.h"

namespace kiln::cli {

// Options every subcommand sees (set on the top-level app).
struct GlobalOptions {
  std::string log_level;   // --log-level
  std::string log_format;  // --log-format text|json
  bool quiet = false;      // --quiet
};

// Setup adds the subcommand to `app` and returns the function to run when it is chosen.
// The run function returns the process exit code.
using CommandSetup =
    std::function<std::function<int()>(CLI::App& app, const GlobalOptions& global)>;

struct CommandRegistration {
  std::string name;
  int order;  // position in --help
  CommandSetup setup;
};

std::vector<CommandRegistration>& CommandRegistry();

struct CommandRegistrar {
  CommandRegistrar(std::string name, int order, CommandSetup setup) {
    CommandRegistry().push_back({std::move(name), order, std::move(setup)});
  }
};

// --metrics-port / --metrics-file, for commands that export Prometheus metrics.
struct MetricsFlags {
  int port = -1;  // -1: no server; 0: a free port
  std::string file;
  void Add(CLI::App* sub);
};

// Prints an error for people (stderr) and returns the exit code for it (1).
int ReportError(const Status& status);

}  // namespace kiln::cli

#define KILN_REGISTER_COMMAND(name, order, setup) \
  static ::kiln::cli::CommandRegistrar kiln_command_registrar_##name(#name, order, setup)
