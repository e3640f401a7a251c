// The Builder: ONNX graph -> optimized, precision-assigned, memory-planned engine with one tactic
// per layer. The build is bounded: a valid engine exists after the heuristic pass, and later
// phases only improve it until the deadline.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/builder/builder_config.h"
#include "kiln/engine/engine_desc.h"

namespace kiln {

struct LayerReport {
  std::string name;
  std::string op_type;
  std::string precision;  // "f32", "f16", ...
  std::string precision_reason;
  std::string tactic;
  double time_ms = -1;  // measured (-1: heuristic, not timed)
  int64_t workspace_bytes = 0;
  int64_t output_bytes = 0;  // at the max profile shape
};

// Where the tactic phase's seconds went for one layer signature (op, operand types and shapes at
// the profile): the layers that share a signature share one search.
struct SignatureTime {
  std::string signature;
  std::string op_type;
  std::string first_layer;
  int64_t layers = 0;
  int64_t candidates = 0;   // tactics listed for one of its layers
  int64_t timed = 0;        // candidates timed, over its layers
  int64_t setups = 0;       // candidates set up (created, prepared) for timing
  int64_t early_stops = 0;  // timed candidates stopped as clearly slower than the best
  // Listing the candidates (the backend's queries: cuDNN/cuBLASLt heuristics, plan finalisation).
  double generate_seconds = 0;
  // Setting up: the random inputs at the opt shapes (once per signature, inputs_seconds) and
  // creating and preparing each candidate (cuDNN plans, weight packing). Thread seconds: with
  // several set-up threads their sum exceeds the wall time
  // (BuildTimeBreakdown::setup_wall_seconds).
  double setup_seconds = 0;
  double inputs_seconds = 0;  // part of setup_seconds
  double timing_seconds = 0;  // running the timed candidates
  double total_seconds() const { return generate_seconds + setup_seconds + timing_seconds; }
};

// A build's seconds inside its precision and tactic phases; "other" is the phase's remainder.
struct BuildTimeBreakdown {
  double precision_query_seconds = 0;  // precision asking the providers which kernels exist
  double generate_seconds = 0, setup_seconds = 0, timing_seconds = 0;  // sums over signatures
  double inputs_seconds = 0;      // part of setup_seconds: random inputs, once per signature
  double setup_wall_seconds = 0;  // wall time of the set-up stages (threads overlap)
  // Wall time of listing the candidates, which the set-up threads share (generate_seconds is
  // their sum over layers, in thread seconds).
  double listing_wall_seconds = 0;
  int opt_level = 0;              // BuilderConfig::opt_level of the build
  int setup_threads = 0;          // the set-up pool's bound
  int setup_max_concurrency = 0;  // most set-ups seen running at once (<= setup_threads)
  int64_t layers_listed = 0;      // layers whose providers listed their tactics
  int64_t layers_from_cache = 0;  // layers that took the timing cache's winner without listing
  int64_t setups = 0;             // candidates set up for timing (sum over signatures)
  int64_t early_stops = 0;        // timed candidates stopped early (sum over signatures)
  std::vector<SignatureTime> signatures;  // most seconds first
};

struct BuildReport {
  std::string model_name;
  std::string backend;
  std::string device;
  double build_seconds = 0;
  double phase_seconds_import = 0, phase_seconds_passes = 0, phase_seconds_tactics = 0,
         phase_seconds_plan = 0, phase_seconds_precision = 0;
  int64_t layers = 0;
  int64_t nodes_before_passes = 0, nodes_after_passes = 0;
  std::string passes;  // per-pass rewrite counts
  // Notes the passes leave for readers: where the layout pass put transposes, and so on.
  std::vector<std::string> pass_notes;
  int64_t tactics_timed = 0;
  int64_t timing_cache_hits = 0;
  // Layers that took the choice timed for an earlier layer with the same signature in this build
  // (the repeated blocks of a transformer), as the timing cache would give it to the next build.
  int64_t tactics_reused = 0;
  bool deadline_hit = false;
  int64_t weights_bytes = 0, arena_bytes = 0, workspace_bytes = 0, peak_bytes = 0;
  int64_t naive_activation_bytes = 0;  // without liveness reuse, for comparison
  std::vector<LayerReport> layer_reports;
  std::vector<std::string> warnings;
  // Precision: layers per precision label ("f32", "f16", "bf16", "i8", "i64"...), the Casts the
  // precision pass inserted, the weights it converted, and where the calibration came from.
  std::map<std::string, int64_t> precision_counts;
  int64_t casts_inserted = 0;
  int64_t weights_converted = 0;
  // FP8 products joined so that the producer writes E4M3 for its consumer (quant_edges.h; FP8
  // copies counted too).
  int64_t fp8_edges = 0;
  int64_t int8_edges = 0;   // the same for INT8 layers writing int8 (INT8 copies counted too)
  std::string calibration;  // "" when none
  int64_t calibration_batches_run = 0;  // 0 when the cache was used
  BuildTimeBreakdown time_breakdown;

  std::string ToJson() const;
  // `--precision-report`: every layer's precision and reason, as a table or as JSON.
  std::string PrecisionTable() const;
  std::string PrecisionJson() const;
  // The table people read after `kiln build`.
  std::string ToText(bool per_layer) const;
  // Where the build's seconds went: the phases, the tactic phase's listing / set-up / timing /
  // other, and (per_signature) the slowest layer signatures.
  std::string TimeText(bool per_signature) const;
  // The tactic phase's seconds outside listing, set-up (wall) and timing.
  double TacticsOtherSeconds() const;
};

struct BuildInput {
  std::unique_ptr<Graph> graph;
  std::string model_name;
  Hash128 model_hash;  // hash of the model's bytes (content address)
};

// Builds an engine. The graph is consumed.
StatusOr<std::unique_ptr<EngineDesc>> BuildEngine(BuildInput input, const BuilderConfig& config,
                                                  BuildReport* report);

// The graph a build with `config` calibrates INT8 on: `input`'s graph after the build's first
// phase (verify, profile, shape inference, the graph passes), before precision. Refit's
// recalibration (refit.h) calibrates it again with new weights.
StatusOr<std::unique_ptr<Graph>> CalibrationGraph(BuildInput input, const BuilderConfig& config);

// The profile an engine is built for, from the one the user gave, by trtexec's rules: every
// dynamic input's min <= opt <= max of the right rank with its static dims matching; a profile of
// a static input that equals its shape is dropped silently and one that disagrees is
// KILN-E3000 naming both; a dynamic input without a profile gets each dynamic dimension fixed at
// 1 (min = opt = max) and a KILN-E3001 warning (in *warnings) naming that shape and the flag.
StatusOr<OptimizationProfile> ResolveProfile(const Graph& graph, const OptimizationProfile& given,
                                             std::vector<Status>* warnings);
// Every value's concrete dims when the graph inputs take one of the profile's shapes (0 min,
// 1 opt, 2 max), from the ops' shape rules run on integers exactly as the runtime runs them.
using ConcreteDimsMap = std::unordered_map<const Value*, std::vector<int64_t>>;
StatusOr<ConcreteDimsMap> ConcreteDims(const Graph& graph, const std::vector<Node*>& order,
                                       const OptimizationProfile& profile, int which);

// The kernel request for a node: operand dtypes, symbolic shapes, and dims at the max shapes
// (-1 where unknown).
KernelRequest MakeKernelRequest(const Node& node, const ConcreteDimsMap& max_dims);

// A layer that no kernel of the backend implements, as `kiln inspect` lists it before a build.
struct KernelGap {
  std::string layer;     // the layer's name after the build's passes
  std::string op_type;   // "Conv", "FusedConv", ...
  std::string operands;  // "inputs float32[1,3,8,32,32], float32[4,3,3,3,3]" at the max shapes
  // The backend has no kernel of its own for the layer but runs the CPU's on the host inside its
  // engine (the CUDA backend's host fallback): the build succeeds, the layer costs two copies.
  bool on_host = false;
};

// What a build of `input` with `config` would find missing, without building: the build's own
// optimise phase (verify, profile, shape inference, passes), then for every layer whether any
// kernel provider of config.backend supports it in FP32 at the profile's max shapes (a layer only
// the host fallback serves is listed with on_host set). Reduced
// precisions are not asked: a layer without an FP16 kernel falls back to FP32 in a build. Nothing
// is timed. Errors are the build's (a shape that cannot be inferred, an unavailable backend).
StatusOr<std::vector<KernelGap>> FindKernelGaps(BuildInput input, const BuilderConfig& config);

}  // namespace kiln
