// libFuzzer target: ImportOnnxBytes on arbitrary bytes must return OK or a catalog error, never
// crash, hang, leak or allocate without bound. Seed it with zoo models (scripts/fuzz.sh).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kiln/core/logging.h"
#include "kiln/onnx/onnx_import.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    kiln::SetLogLevel(kiln::LogLevel::kError);
    return true;
  }();
  (void)quiet;
  auto bytes = std::as_bytes(std::span(data, size));
  // Both modes: strict (what `kiln build` does) and lenient (what `kiln inspect` does). The
  // directory does not exist, so external data exercises the path checks and then fails.
  for (bool lenient : {false, true}) {
    kiln::ImportOptions options;
    options.allow_unsupported_ops = lenient;
    auto graph = kiln::ImportOnnxBytes(bytes, "/nonexistent-kiln-fuzz-dir", options);
    if (graph.ok()) {
      // A graph the importer accepts must verify (it ran Verify already; run it again on the
      // returned object to catch ownership mistakes).
      if (!kiln::Verify(**graph).ok()) {
        std::fprintf(stderr, "imported graph fails Verify\n");
        std::abort();
      }
    } else if (graph.status().Id().empty() || graph.status().message().empty()) {
      std::fprintf(stderr, "error without code or message\n");
      std::abort();
    }
  }
  return 0;
}
