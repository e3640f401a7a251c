// The .kiln engine file: a fixed 64-byte preamble, a FlatBuffer (engine.fbs) with the header,
// graph, layers, profile, memory plan, build report and weight program (refit), then the weights
// section (64-byte aligned, each tensor 64-byte aligned) so a loader can mmap the file and borrow
// the weights without copying. Loading verifies everything before anything is used: a crafted file
// yields a catalog error (KILN-E4000..E4005), never an out-of-bounds read.
//
// Preamble (little-endian). Bytes 0..47 keep this layout in every format version, and from
// format 2 on the checksum rule below is fixed too, so any kiln can check magic, length and
// checksum and then say which version a newer file needs.
//   0  char[4]  magic "KILN"
//   4  u32      format version
//   8  u32      preamble bytes (64)
//  12  u32      flags: bit 0 weights stripped (StripWeights below); the other bits 0
//  16  u64      payload bytes: everything after the preamble
//  24  u64      FlatBuffer bytes (it starts right after the preamble)
//  32  u64[2]   checksum (high, low): see EngineChecksum
//  48  char[16] kiln version that wrote the file, NUL-padded
// Format 1 checksummed the payload alone (bytes 4..31 and 48..63 could change unseen); format 2
// covers every byte of the file. A format-1 file is refused with KILN-E4006 (rebuild it).
// The weights section starts at AlignUp(64 + FlatBuffer bytes, 64) and runs to the end.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/hash.h"
#include "kiln/core/status.h"
#include "kiln/engine/engine_desc.h"

namespace kiln {

// The newest engine format this kiln reads and the one it writes.
inline constexpr uint32_t kEngineFormatVersion = 2;
inline constexpr size_t kEnginePreambleBytes = 64;
inline constexpr size_t kEngineWeightsAlignment = 64;
inline constexpr std::array<char, 4> kEngineMagic = {'K', 'I', 'L', 'N'};
// Preamble flags. A kiln that does not know a bit refuses the file (KILN-E4005), so an older kiln
// never runs a stripped engine's absent weights as if they were there.
inline constexpr uint32_t kEngineFlagWeightsStripped = 1u << 0;
inline constexpr uint32_t kEngineKnownFlags = kEngineFlagWeightsStripped;

// This kiln's version ("0.1.0"), written into every engine.
std::string_view KilnVersion();

struct EnginePreamble {
  uint32_t format_version = kEngineFormatVersion;
  uint32_t preamble_bytes = kEnginePreambleBytes;
  uint32_t flags = 0;
  uint64_t payload_bytes = 0;
  uint64_t flatbuffer_bytes = 0;
  Hash128 checksum;
  std::string kiln_version;  // at most 15 characters are stored
};

// The checksum a format-2 (and later) preamble records: XXH3-128 over the preamble's raw bytes
// 0..31 and 48..63 (the checksum's own bytes left out), followed by the payload's XXH3-128 (high
// then low, little-endian), so the payload is hashed once, as it is written. `preamble` holds at
// least kEnginePreambleBytes.
Hash128 EngineChecksum(std::span<const std::byte> preamble, const Hash128& payload_hash);
// Writes EngineChecksum(preamble, payload_hash) into bytes 32..47 of an encoded preamble.
void SealEnginePreamble(std::span<std::byte> preamble, const Hash128& payload_hash);

// Decodes the preamble (magic and size only: KILN-E4000 / KILN-E4001); no other check.
StatusOr<EnginePreamble> ReadEnginePreamble(std::span<const std::byte> file);
// Encodes `p` into the first kEnginePreambleBytes of `out` (out.size() must be at least that).
void WriteEnginePreamble(const EnginePreamble& p, std::span<std::byte> out);

struct LoadOptions {
  // When set, an engine for another backend / device architecture is KILN-E4004.
  std::optional<BackendKind> expected_backend;
  std::optional<std::string> expected_arch;
  // Every layer's provider id must be registered for the engine's backend in this process.
  // `kiln inspect` turns it off to show engines built where other kernels exist.
  bool check_providers = true;
};

struct SerializeOptions {
  // Write the engine weight-stripped (as StripWeights below would make it) without changing it:
  // `kiln build --strip-weights`, Engine.save(strip_weights=True). Its errors are StripWeights'.
  bool strip_weights = false;
};

// Deterministic: the same EngineDesc gives byte-identical output (no timestamps; maps sorted).
StatusOr<std::vector<std::byte>> SerializeEngine(const EngineDesc& engine,
                                                 const SerializeOptions& options = {});
// Atomic (core/file_io.h AtomicOutput): writes a temporary file beside `path`, flushes it and
// renames it over `path`; refuses a `path` that is a link, a special file or a file this process
// read (KILN-E1011, KILN-E1012), and leaves no temporary on an error, SIGTERM or SIGINT. The same
// bytes as SerializeEngine, written as they are serialized: no second in-memory copy of the
// weights (a large model's build peaks at about 1.2x its weights, not 2x).
// `replaces_input`: `path` may be a file this process read (refit writing an engine over itself;
// readers still see the old file or the whole new one).
Status WriteEngineFile(const EngineDesc& engine, const std::string& path,
                       bool replaces_input = false, const SerializeOptions& options = {});

// Maps the file read-only (a regular file only: KILN-E1009 otherwise, without blocking); constants
// borrow the mapping (it lives as long as any of them).
StatusOr<std::shared_ptr<const EngineDesc>> LoadEngineFile(const std::string& path,
                                                           const LoadOptions& options = {});
// The same, for a caller that changes the engine before using it (refit replaces constants).
StatusOr<std::shared_ptr<EngineDesc>> LoadEngineFileForEdit(const std::string& path,
                                                            const LoadOptions& options = {});
// Copies `bytes` once into an aligned buffer that the constants then borrow.
StatusOr<std::shared_ptr<const EngineDesc>> LoadEngineBytes(std::span<const std::byte> bytes,
                                                            const LoadOptions& options = {});
// The same, for a caller that changes the engine (refit of a cached engine).
StatusOr<std::shared_ptr<EngineDesc>> LoadEngineBytesForEdit(std::span<const std::byte> bytes,
                                                             const LoadOptions& options = {});

// Weight-stripped engines (issue 20): for caches, and for moving an engine between ranks that all
// hold the model. Drops the bytes of every constant the engine's weight program makes from the
// model's initializers (its targets); literals stay. The engine then serializes without them
// (each such ConstantDesc is `absent`, the preamble and header say "stripped"), still loads and
// verifies, and is refused by the runtime (KILN-E4010) until RefitEngine (builder/refit.h) fills
// it with the model's weights, which gives the bytes a full build writes. KILN-E4007 for an engine
// without a program, KILN-E4009 for one with a non-refittable constant (refit could never fill
// it: build it without stripping). Stripping a stripped engine changes nothing.
Status StripWeights(EngineDesc& engine);
// The constants a stripped engine lacks (the program's targets); empty for a full engine.
std::vector<std::string> AbsentConstants(const EngineDesc& engine);

// KILN-E4004 naming both targets when the engine's backend or device arch is not this one.
Status CheckEngineTarget(const EngineHeader& header, BackendKind backend, std::string_view arch);

}  // namespace kiln
