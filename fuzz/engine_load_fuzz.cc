// libFuzzer target for the engine loader: no input may make LoadEngineBytes read out of bounds,
// crash or accept an engine that does not survive a second round trip; an accepted engine must
// also run (at its profile's min shapes) without crashing: the loader's checks are what the
// runtime relies on. Each input is tried
// twice: as given (preamble checks) and resealed with a valid preamble and checksum, so the
// mutations reach the FlatBuffer verifier and kiln's own bounds checks.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kiln/engine/engine_file.h"
#include "kiln/runtime/runtime.h"

namespace kiln::testing {
int TestKernelsAnchor();  // the test-only providers the seed engines use
}

namespace {

// Reads every byte a loaded engine exposes, so a bad pointer faults under the sanitizer.
uint64_t Touch(const kiln::EngineDesc& e) {
  uint64_t sum = 0;
  for (const kiln::Value* v : e.graph->values()) {
    sum += v->name().size() + v->shape().size();
    if (const kiln::Tensor* t = v->constant()) {
      // A stripped engine's absent constant has dtype and dims only (the runtime refuses it).
      if (!t->raw()) {
        sum += t->dims().size();
        continue;
      }
      for (std::byte b : t->bytes()) sum += static_cast<uint8_t>(b);
    }
  }
  for (const kiln::LayerDesc& l : e.layers) sum += l.node->inputs().size() + l.provider_id.size();
  return sum;
}

// Runs an accepted engine once on zeros at the profile's min shapes (small ones only).
void TryRun(std::shared_ptr<const kiln::EngineDesc> desc) {
  auto backend = kiln::GetBackend(kiln::BackendKind::kCpu);
  if (!backend.ok() || desc->header.backend != kiln::BackendKind::kCpu) return;
  // Plans above 64 MiB are legal but would only exercise the allocator (and libFuzzer's malloc
  // limit); the device-memory check in CreateExecutionContext is unit-tested instead.
  if (desc->plan.peak_bytes > (int64_t{64} << 20)) return;
  auto engine = kiln::Engine::Create(std::move(desc), *backend);
  if (!engine.ok()) return;
  auto ctx = (*engine)->CreateExecutionContext();
  if (!ctx.ok()) return;
  for (const kiln::TensorDesc& in : (*engine)->inputs()) {
    if (!in.profile) continue;
    if (!(*ctx)->SetInputShape(in.name, in.profile->min).ok()) return;
  }
  if (!(*ctx)->all_input_shapes_set()) return;
  std::vector<std::vector<std::byte>> buffers;
  auto bind = [&](const kiln::TensorDesc& t) {
    auto dims = (*ctx)->GetTensorShape(t.name);
    if (!dims.ok()) return false;
    uint64_t bytes = kiln::SizeOf(t.dtype);
    for (int64_t d : *dims) {
      if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) return false;
    }
    if (bytes > (1u << 20)) return false;
    buffers.emplace_back(std::max<uint64_t>(bytes, 1));
    return (*ctx)->SetTensorAddress(t.name, buffers.back().data()).ok();
  };
  for (const kiln::TensorDesc& t : (*engine)->inputs()) {
    if (!bind(t)) return;
  }
  for (const kiln::TensorDesc& t : (*engine)->outputs()) {
    if (!bind(t)) return;
  }
  (*ctx)->Execute().IgnoreError();
}

void TryLoad(std::span<const std::byte> bytes) {
  auto loaded = kiln::LoadEngineBytes(bytes);
  if (!loaded.ok()) return;
  volatile uint64_t sink = Touch(**loaded);
  (void)sink;
  // What loads must serialize and load again.
  auto again = kiln::SerializeEngine(**loaded);
  if (!again.ok() || !kiln::LoadEngineBytes(*again).ok()) {
    std::fprintf(stderr, "accepted engine failed its round trip: %s\n",
                 again.ok() ? kiln::LoadEngineBytes(*again).status().ToString().c_str()
                            : again.status().ToString().c_str());
    std::abort();
  }
  TryRun(*loaded);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static int anchor = kiln::testing::TestKernelsAnchor();
  (void)anchor;
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  TryLoad(bytes);
  if (size < kiln::kEnginePreambleBytes || std::memcmp(data, "KILN", 4) != 0) return 0;
  std::vector<std::byte> sealed(bytes.begin(), bytes.end());
  auto p = kiln::ReadEnginePreamble(sealed);
  if (!p.ok()) return 0;
  p->format_version = kiln::kEngineFormatVersion;
  p->preamble_bytes = kiln::kEnginePreambleBytes;
  p->flags = 0;
  p->payload_bytes = size - kiln::kEnginePreambleBytes;
  kiln::WriteEnginePreamble(*p, sealed);
  kiln::SealEnginePreamble(sealed,
                           kiln::HashBytes(std::span(sealed).subspan(kiln::kEnginePreambleBytes)));
  TryLoad(sealed);
  return 0;
}
