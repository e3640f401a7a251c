// `kiln errors [CODE]`: the error catalog, as a table, one entry, or JSON.
#include <nlohmann/json.hpp>

#include <iostream>

#include "kiln/core/status.h"
#include "tools/kiln/command.h"

namespace kiln::cli {
namespace {

std::function<int()> Setup(CLI::App& app, const GlobalOptions&) {
  struct Options {
    std::string code;
    bool json = false;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand("errors", "List kiln's error catalog, or explain one code");
  sub->add_option("code", opts->code, "a code such as KILN-E3002 (omit for the whole catalog)");
  sub->add_flag("--json", opts->json, "print JSON");
  return [opts]() -> int {
    std::vector<const ErrorInfo*> rows;
    if (opts->code.empty()) {
      for (const ErrorInfo& e : ErrorCatalog()) rows.push_back(&e);
    } else if (const ErrorInfo* e = FindError(opts->code)) {
      rows.push_back(e);
    } else {
      return ReportError(MakeError(
          ErrorCode::kNotFound,
          "no error code '{}' in kiln's catalog (run `kiln errors` for the list)", opts->code));
    }
    if (opts->json) {
      nlohmann::json out = nlohmann::json::array();
      for (const ErrorInfo* e : rows) {
        out.push_back({{"code", e->Id()},
                       {"name", e->name},
                       {"subsystem", e->subsystem},
                       {"summary", e->summary},
                       {"remedy", e->remedy}});
      }
      std::cout << out.dump(2) << "\n";
      return 0;
    }
    for (const ErrorInfo* e : rows) {
      std::cout << fmt::format("{:<11} {:<9} {}\n{:21}remedy: {}\n", e->Id(), e->subsystem,
                               e->summary, "", e->remedy);
    }
    return 0;
  };
}

}  // namespace
KILN_REGISTER_COMMAND(errors, 90, Setup);
}  // namespace kiln::cli
