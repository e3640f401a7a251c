// BuildEngine: the build pipeline, as named phases over one BuildState: optimise (verify, profile,
// shapes, passes) -> precision -> tactics (candidates) -> budget -> timing -> plan -> assemble.
// Each phase reports progress; every phase after the first valid engine only improves it.
#include "kiln/builder/builder.h"

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <thread>
#include <unordered_map>

#include "kiln/backends/backend.h"
#include "kiln/backends/device_eval.h"
#include "kiln/backends/reference.h"
#include "kiln/builder/quant_edges.h"
#include "kiln/builder/tactic_search.h"
#include "kiln/builder/timing_cache.h"
#include "kiln/core/file_io.h"
#include "kiln/core/json_writer.h"
#include "kiln/core/logging.h"
#include "kiln/core/params.h"
#include "kiln/engine/engine_plan.h"
#include "kiln/ir/sizes.h"
#include "kiln/onnx/calibration_data.h"
#include "kiln/ops/op_schema.h"
#include "kiln/ops/quant_edge.h"
#include "kiln/passes/pass.h"
#include "kiln/plan/memory_plan.h"
#include "kiln/precision/precision.h"

namespace kiln {

namespace {
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

OperandDesc Describe(const Value* v, const ConcreteDimsMap& max_dims) {
  OperandDesc d;
  if (!v) return d;
  d.dtype = v->dtype();
  d.shape = v->shape();
  if (auto it = max_dims.find(v); it != max_dims.end()) {
    d.max_dims = it->second;
  } else {
    d.max_dims.assign(v->shape().size(), -1);  // unknown at the max shapes
  }
  // A shape input's kernels see its build values as a constant (the runtime makes them again
  // for other values).
  d.constant = v->constant() ? v->constant() : v->shape_input_values();
  return d;
}
}  // namespace

StatusOr<ConcreteDimsMap> ConcreteDims(const Graph& graph, const std::vector<Node*>& order,
                                       const OptimizationProfile& profile, int which) {
  std::unordered_map<const Value*, ValueInfo> info;
  for (const Value* in : graph.inputs()) {
    ValueInfo vi = InfoOf(*in);
    if (const InputProfile* p = profile.Find(in->name())) {
      vi.shape = MakeShape(which == 0 ? p->min : which == 1 ? p->opt : p->max);
    } else {
      vi.shape = in->shape();
    }
    info[in] = std::move(vi);
  }
  for (const Node* node : order) {
    std::vector<const ValueInfo*> ins;
    for (const Value* v : node->inputs()) {
      if (!v) {
        ins.push_back(nullptr);
        continue;
      }
      auto it = info.find(v);
      if (it == info.end()) it = info.emplace(v, InfoOf(*v)).first;
      ins.push_back(&it->second);
    }
    std::vector<ValueInfo> outs(node->num_outputs());
    KILN_RETURN_IF_ERROR(InferNode(*node, ins, outs));
    // Data-dependent dims at their bound for these shapes: what the kernels are sized for.
    KILN_RETURN_IF_ERROR(BindDataDependentDims(*node, outs, {}));
    for (size_t i = 0; i < outs.size(); ++i) {
      if (node->output(i)) info[node->output(i)] = std::move(outs[i]);
    }
  }
  ConcreteDimsMap out;
  for (const auto& [v, vi] : info) {
    if (auto dims = StaticDims(vi.shape)) out[v] = std::move(*dims);
  }
  return out;
}

KernelRequest MakeKernelRequest(const Node& node, const ConcreteDimsMap& max_dims) {
  KernelRequest r;
  r.node = &node;
  for (const Value* v : node.inputs()) r.inputs.push_back(Describe(v, max_dims));
  for (const Value* v : node.outputs()) r.outputs.push_back(Describe(v, max_dims));
  return r;
}

// Dims that the profile fixes (min == max) become constants in the graph's inputs. The engine
// can only ever see that extent, and the shape subgraphs exporters emit around every reshape
// (Shape -> Gather -> Unsqueeze -> Concat) then fold to constants instead of running as layers:
// an HF BERT-base export kept about 350 such layers out of 597 with a batch-1 profile.
void SpecializeFixedDims(Graph& graph, const OptimizationProfile& profile) {
  for (Value* in : graph.inputs()) {
    const InputProfile* p = profile.Find(in->name());
    if (!p || p->min.size() != in->shape().size()) continue;
    Shape shape = in->shape();
    bool changed = false;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (!shape[d].is_static() && p->min[d] == p->max[d]) {
        shape[d] = Dim(p->min[d]);
        changed = true;
      }
    }
    if (changed) in->set_shape(std::move(shape));
  }
}

namespace {
std::string DimsText(const std::vector<int64_t>& dims) {
  return fmt::format("{}", fmt::join(dims, "x"));
}

// A profile given for a static input must equal its shape (trtexec accepts such a profile
// silently); it is then dropped, since the engine needs none. A profile that disagrees names both.
Status CheckStaticInputProfile(const Value& in, const InputProfile& p) {
  std::vector<int64_t> shape;
  for (const Dim& d : in.shape()) shape.push_back(d.value());
  for (const auto* dims : {&p.min, &p.opt, &p.max}) {
    if (*dims != shape) {
      return MakeError(ErrorCode::kInvalidProfile,
                       "input '{}' has the static shape {}; the profile gives {},{},{}: a profile "
                       "of a static input must equal its shape (or drop --profile {})",
                       p.input, DimsText(shape), DimsText(p.min), DimsText(p.opt), DimsText(p.max),
                       p.input);
    }
  }
  return OkStatus();
}

Status ValidateDynamicInputProfile(const Value& in, const InputProfile& p) {
  size_t rank = in.shape().size();
  for (const auto* dims : {&p.min, &p.opt, &p.max}) {
    if (dims->size() != rank) {
      return MakeError(ErrorCode::kInvalidProfile,
                       "profile of '{}' has rank {}; the input {} has rank {}", p.input,
                       dims->size(), ToString(in.shape()), rank);
    }
  }
  for (size_t i = 0; i < rank; ++i) {
    const Dim& d = in.shape()[i];
    if (d.is_static() &&
        (p.min[i] != d.value() || p.opt[i] != d.value() || p.max[i] != d.value())) {
      return MakeError(ErrorCode::kInvalidProfile,
                       "input '{}' dimension {} is fixed at {}; the profile gives {}/{}/{}",
                       p.input, i, d.value(), p.min[i], p.opt[i], p.max[i]);
    }
    if (!(p.min[i] <= p.opt[i] && p.opt[i] <= p.max[i])) {
      return MakeError(ErrorCode::kInvalidProfile,
                       "input '{}' dimension {} ({}): need min <= opt <= max, got {} / {} / {}",
                       p.input, i, d.ToString(), p.min[i], p.opt[i], p.max[i]);
    }
    if (p.min[i] < 1 && !d.is_static()) {
      return MakeError(ErrorCode::kInvalidProfile,
                       "input '{}' dimension {}: min must be at least 1", p.input, i);
    }
  }
  return OkStatus();
}

}  // namespace

// The profile the engine is built for, from the one the user gave (trtexec's rules, which users
// know): a profile of a static input that equals its shape is dropped silently, one that
// disagrees is an error naming both; a dynamic input without a profile gets every dynamic
// dimension fixed at 1 (min = opt = max), with a warning naming the shape and the flag.
StatusOr<OptimizationProfile> ResolveProfile(const Graph& graph, const OptimizationProfile& given,
                                             std::vector<Status>* warnings) {
  OptimizationProfile resolved;
  for (const InputProfile& p : given.inputs) {
    const Value* in = graph.FindValue(p.input);
    if (!in || !in->is_graph_input()) {
      std::vector<std::string> names;
      for (const Value* v : graph.inputs()) names.push_back(v->name());
      return MakeError(ErrorCode::kInvalidProfile,
                       "profile for '{}', which is not a model input (inputs: {})", p.input,
                       fmt::join(names, ", "));
    }
    if (IsStatic(in->shape())) {
      KILN_RETURN_IF_ERROR(CheckStaticInputProfile(*in, p));
      continue;
    }
    KILN_RETURN_IF_ERROR(ValidateDynamicInputProfile(*in, p));
    resolved.inputs.push_back(p);
  }
  for (const Value* in : graph.inputs()) {
    if (IsStatic(in->shape()) || resolved.Find(in->name())) continue;
    InputProfile p;
    p.input = in->name();
    for (const Dim& d : in->shape()) p.min.push_back(d.is_static() ? d.value() : 1);
    p.opt = p.max = p.min;
    warnings->push_back(MakeError(
        ErrorCode::kMissingProfile,
        "input '{}' has dynamic shape {} and no profile: building for {} only (min = opt = max); "
        "add --profile {}:MIN,OPT,MAX for other shapes",
        in->name(), ToString(in->shape()), DimsText(p.min), in->name()));
    resolved.inputs.push_back(std::move(p));
  }
  resolved.shape_values = given.shape_values;
  return resolved;
}

// Shape inputs: each of the profile's shape_values names an integer or floating-point graph input
// of static shape and gives one value per element (KILN-E3000 otherwise); the input's Value
// carries them for the shape rules (Value::shape_input_values). Integers given for a
// floating-point input (`--shape-values scales:1,1,2,2`) become its float_values.
Status ApplyShapeValues(Graph& graph, OptimizationProfile& profile) {
  for (ShapeInputValues& sv : profile.shape_values) {
    Value* in = graph.FindValue(sv.input);
    if (!in || !in->is_graph_input()) {
      return MakeError(ErrorCode::kInvalidProfile,
                       "shape values for '{}', which is not a model input", sv.input);
    }
    auto dims = StaticDims(in->shape());
    if (!(IsInteger(in->dtype()) || IsFloatingPoint(in->dtype())) || !dims) {
      return MakeError(ErrorCode::kInvalidProfile,
                       "shape values for '{}', an input of type {} and shape {}: a shape input is "
                       "an integer or floating-point tensor of static shape",
                       sv.input, ToString(in->dtype()), ToString(in->shape()));
    }
    if (IsFloatingPoint(in->dtype()) && sv.float_values.empty()) {
      sv.float_values.assign(sv.values.begin(), sv.values.end());
      sv.values.clear();
    }
    if (!ShapeValuesFit(sv, in->dtype(), *dims)) {
      if (IsInteger(in->dtype()) && !sv.float_values.empty()) {
        return MakeError(ErrorCode::kInvalidProfile,
                         "shape values for '{}' ({}) are not integers; the input has type {}",
                         sv.input, ShapeValuesText(sv), ToString(in->dtype()));
      }
      return MakeError(ErrorCode::kInvalidProfile,
                       "shape values for '{}' give {} value(s); its shape {} holds {}", sv.input,
                       sv.values.size() + sv.float_values.size(), ToString(in->shape()),
                       NumElements(*dims));
    }
    in->set_shape_input_values(ShapeValuesTensor(sv, in->dtype(), *dims));
  }
  return OkStatus();
}

// Creates the chosen kernel and asks it for its workspace at the max shapes and at each of
// `other_shapes` (no data is touched, nothing is prepared to run: Kernel::QueryWorkspace); the
// most it asks for. A kernel may want more at a smaller shape than at the max (cuDNN picks its
// internal algorithm per shape), so a dynamic profile's min and opt are asked too.
StatusOr<size_t> QueryWorkspaceAt(Kernel& kernel, const KernelRequest& at);
StatusOr<size_t> PreparedWorkspace(const LayerSearch& l, const TacticCandidate& c,
                                   const std::vector<ConcreteDimsMap>& other_shapes = {}) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Kernel> kernel, c.provider->Create(l.request, c.tactic));
  KILN_ASSIGN_OR_RETURN(size_t most, QueryWorkspaceAt(*kernel, l.request));
  for (const ConcreteDimsMap& dims : other_shapes) {
    KILN_ASSIGN_OR_RETURN(size_t here, QueryWorkspaceAt(*kernel, MakeKernelRequest(*l.node, dims)));
    most = std::max(most, here);
  }
  return most;
}

// The workspace `kernel` asks for with its operands at `at`'s dims (max_dims, whichever point of
// the profile they were taken at); the tactic's own estimate where a dim is unknown.
StatusOr<size_t> QueryWorkspaceAt(Kernel& kernel, const KernelRequest& at) {
  // Present activations get a non-null placeholder address: kernels (the CPU FP16 wrapper among
  // them) tell omitted optional inputs by a null pointer, as they will see them at run time.
  // Kernels read shapes only here, never activation data.
  alignas(64) static std::byte placeholder[64];
  std::vector<TensorView> ins, outs;
  for (const OperandDesc& d : at.inputs) {
    ins.push_back(d.dtype == DataType::kUndefined
                      ? TensorView{}
                      : TensorView{d.dtype, d.max_dims,
                                   d.constant ? const_cast<void*>(d.constant->raw())
                                              : static_cast<void*>(placeholder)});
  }
  for (const OperandDesc& d : at.outputs) {
    outs.push_back({d.dtype, d.max_dims, static_cast<void*>(placeholder)});
  }
  for (const auto& views : {&ins, &outs}) {
    for (const TensorView& v : *views) {
      if (v.dtype != DataType::kUndefined &&
          std::any_of(v.dims.begin(), v.dims.end(), [](int64_t x) { return x < 0; })) {
        return size_t{0};  // shape unknown here: the caller keeps the tactic's own estimate
      }
    }
  }
  return kernel.QueryWorkspace(ins, outs);
}

namespace {
void Warn(BuildReport& rep, const Status& s) {
  rep.warnings.push_back(s.ToString());
  KILN_LOG(Warn, BUILD, "{}", s.ToString());
}

// The calibration table for this build: the cache when it is valid for this graph and method,
// else a calibration run over --calib-dir (then written to the cache). None without either.
StatusOr<std::optional<precision::CalibrationTable>> GetCalibration(const Graph& graph,
                                                                    const BuilderConfig& config,
                                                                    const Hash128& model_hash,
                                                                    BuildReport& rep) {
  using namespace precision;
  // The INT8 sensitivity is read only by the INT8 fallback (--int8 with a finite tolerance). A
  // table without it has its own cache key, so that an INT8 build never takes one for its own.
  const bool sensitivity = config.int8 && std::isfinite(config.int8_tolerance);
  // The FP8 one, by the FP8 fallback (--fp8 with a finite --fp8-tolerance); its tables have a key
  // of their own too.
  const bool fp8_sensitivity = config.fp8 && std::isfinite(config.fp8_tolerance);
  const std::string base = CalibrationCacheKey(model_hash.Hex(), graph, config.calibration_method,
                                               config.calibration_percentile);
  auto key_for = [&](bool int8_figures, bool fp8_figures) {
    return base + (int8_figures ? "" : ";no-int8-sensitivity") +
           (fp8_figures ? ";fp8-sensitivity" : "");
  };
  const std::string key = key_for(sensitivity, fp8_sensitivity);
  const std::string& cache = config.calibration_cache_path;
  if (!cache.empty() && std::filesystem::exists(cache)) {
    // This build's own key, else a table with more figures than it reads: its ranges are the
    // same (the sensitivity never changes them), and the figures it does not read are unused.
    StatusOr<CalibrationTable> cached = LoadCalibrationCache(cache, key);
    for (bool i8 : {sensitivity, true}) {
      for (bool f8 : {fp8_sensitivity, true}) {
        if (cached.ok() || IsWrongFileKind(cached.status())) break;
        if (key_for(i8, f8) == key) continue;
        auto more = LoadCalibrationCache(cache, key_for(i8, f8));
        if (more.ok()) cached = std::move(more);
      }
    }
    if (cached.ok()) {
      rep.calibration = fmt::format("from cache '{}' ({}, {} data set(s))", cache,
                                    ToString(cached->method), cached->data_sets);
      return std::optional<CalibrationTable>(std::move(*cached));
    }
    if (IsWrongFileKind(cached.status())) return cached.status();
    Warn(rep, cached.status());
  }
  if (config.calibration_dir.empty()) {
    // A QDQ model's INT8 layers carry their scales: they need no calibration data.
    if (config.int8 && !config.fp8 && HasModelInt8Layers(graph)) {
      rep.calibration = "none: the model's Q/DQ scales (INT8 candidates without them stay float)";
    } else if (config.int8 || config.fp8) {
      Warn(rep, MakeError(ErrorCode::kCalibrationInputInvalid,
                          "{} without calibration data (--calib-dir or a valid --calib-cache): "
                          "INT8/FP8 candidates fall back to FP16/FP32",
                          config.int8 ? "--int8" : "--fp8"));
    }
    return std::optional<CalibrationTable>();
  }
  KILN_ASSIGN_OR_RETURN(auto data,
                        LoadCalibrationData(graph, config.profile, config.calibration_dir));
  const int64_t before = CalibrationBatchesRun();
  // On the device the engine is for, when it is one: a CPU FP32 pass over many batches (and the
  // sensitivity's partial evaluations) is what made calibration take minutes.
  std::unique_ptr<DeviceEvaluator> device;
  if (config.calibrate_on_backend && config.backend != BackendKind::kCpu) {
    auto made = DeviceEvaluator::Create(config.backend);
    if (made.ok()) {
      device = std::move(*made);
    } else {
      Status why = made.status();
      Warn(rep, std::move(why).AddContext("calibrating on the CPU instead"));
    }
  }
  const auto started = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(
      CalibrationTable table,
      Calibrate(graph, device ? device->AsNodeEvaluator() : ReferenceEvaluator(), data,
                config.calibration_method, config.calibration_percentile, sensitivity,
                device ? device->AsGraphStatsEvaluator() : GraphStatsEvaluator(), fp8_sensitivity));
  rep.calibration_batches_run = CalibrationBatchesRun() - before;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::string where = "the CPU reference";
  if (device) {
    const DeviceEvalStats& st = device->stats();
    where = fmt::format("{}: {} node runs, {} on the host, {} MB downloaded",
                        ToString(device->kind()), st.nodes_on_device + st.nodes_on_host,
                        st.nodes_on_host, (st.download_bytes + (1 << 19)) >> 20);
  }
  rep.calibration =
      fmt::format("calibrated ({}, {} data set(s) from '{}', on {}, {:.1f} s)",
                  ToString(table.method), table.data_sets, config.calibration_dir, where, seconds);
  if (!cache.empty()) {
    if (Status s = SaveCalibrationCache(cache, key, table); !s.ok()) {
      if (IsWrongFileKind(s)) return s;
      Warn(rep, s);
    }
  }
  return std::optional<CalibrationTable>(std::move(table));
}
}  // namespace

namespace {
// The set-up pool's bound: BuilderConfig::setup_threads, KILN_BUILD_SETUP_THREADS, else one per
// hardware thread (at most 16).
int SetupThreads(const BuilderConfig& config) {
  if (config.setup_threads > 0) return std::min(config.setup_threads, 256);
  const int64_t given = param::BuildSetupThreads();
  if (given > 0) return static_cast<int>(std::min<int64_t>(given, 256));
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 16u));
}

// Everything a build carries from one phase to the next. Each phase reads what the earlier ones
// left and adds its own part; BuildEngine runs them in order.
struct BuildState {
  BuildState(BuildInput in, const BuilderConfig& requested, BuildReport& report)
      : config(requested), input(std::move(in)), rep(report), start(Clock::now()) {}
  BuildState(const BuildState&) = delete;
  BuildState& operator=(const BuildState&) = delete;

  Graph& graph() { return *input.graph; }
  bool Progress(std::string phase, int64_t done, int64_t total, std::string detail) const {
    if (!config.progress) return true;
    return config.progress({std::move(phase), done, total, Seconds(start), std::move(detail)});
  }

  BuilderConfig config;  // as requested, with the resolved profile (trtexec's defaults filled in)
  BuildInput input;
  BuildReport& rep;
  const Clock::time_point start;
  Backend* backend = nullptr;
  DeviceInfo device;
  precision::PrecisionResult assigned;        // precision
  std::vector<LayerSearch> searches;          // tactics: layers and their candidates
  Clock::time_point tactics_start;            // tactics .. timing form the tactic phase
  std::optional<TimingCache> cache;           // tactics (warm layers), timing
  bool cache_file_current = false;            // the file holds exactly what `cache` holds
  std::optional<int64_t> budget;              // budget: bytes for the whole engine
  TacticSearchOptions search;                 // budget, timing
  std::vector<LayerDesc> layers;              // timing: the chosen tactics
  std::vector<PlanLayer> plan_layers;         // timing -> plan
  MemoryPlan plan;                            // plan
  std::vector<InitializerInfo> initializers;  // optimise (as imported) -> assemble (refit record)
  const bool alias_views = param::AliasViews() != 0;
};

// Whether the passes move a few-channel stem's blocks into channels (stem_space_to_depth.cc): for
// an INT8 build on CUDA with the quantized tactics on (KILN_CUDA_QUANT_TACTICS=1, the variable
// backends/cuda/cublaslt_util.cc reads), where kiln's implicit-GEMM INT8 convolution pads a
// window's channels to 16, which a stem of 3 channels wastes. Not otherwise: a float stem does
// the zero taps' work too (PyTorch's CPU convolution of ResNet's stem ran 1.8x slower so), and
// cuDNN's FP16 stem was not timed both ways yet. KILN_STEM_SPACE_TO_DEPTH=1 asks for it in any
// build (to time a float stem so), =0 in none; `--disable-pass stem_space_to_depth` also turns it
// off. BuilderConfig::stem_space_to_depth, where set, decides before both (recalibration sets
// it from the engine, so its calibration graph is the build's whatever the environment).
bool SpaceToDepthStems(const BuilderConfig& config) {
  if (config.stem_space_to_depth) return *config.stem_space_to_depth;
  if (const char* e = std::getenv("KILN_STEM_SPACE_TO_DEPTH"); e && *e) return e[0] == '1';
  const char* quant = std::getenv("KILN_CUDA_QUANT_TACTICS");
  return config.backend == BackendKind::kCuda && config.int8 && quant &&
         std::string_view(quant) == "1";
}

// Optimise: verify, resolve the profile, infer shapes, run the graph passes.
Status OptimisePhase(BuildState& s) {
  Graph& graph = s.graph();
  BuildReport& rep = s.rep;
  s.Progress("verify", 0, 1, "");
  KILN_RETURN_IF_ERROR(Verify(graph));
  // A graph made in code (not imported) gives its constants no provenance: they are its weights,
  // refit by value name as the importer's initializers are.
  for (Value* v : graph.values()) {
    if (v->is_constant() && !v->provenance()) {
      v->set_provenance(InitializerExpr(v->name(), *v->constant()));
    }
  }
  s.initializers = CollectInitializers(graph);  // before anything folds them
  {
    std::vector<Status> profile_warnings;
    KILN_ASSIGN_OR_RETURN(s.config.profile,
                          ResolveProfile(graph, s.config.profile, &profile_warnings));
    for (const Status& w : profile_warnings) Warn(rep, w);
  }
  KILN_RETURN_IF_ERROR(CheckProfileSizes(graph, s.config.profile));
  if (s.config.optimize) SpecializeFixedDims(graph, s.config.profile);
  KILN_RETURN_IF_ERROR(ApplyShapeValues(graph, s.config.profile));
  // With optimization on, shape arithmetic folds as shapes are inferred (see InferShapes).
  auto infer = [&] {
    return s.config.optimize ? InferShapes(graph, ReferenceEvaluator()) : InferShapes(graph);
  };
  auto inferred_or = infer();
  // Values given for an input that no shape rule reads make no shape input: they are dropped
  // and shapes inferred again without them (nothing was folded because of them).
  if (inferred_or.ok() &&
      inferred_or->shape_inputs_read.size() < s.config.profile.shape_values.size()) {
    std::erase_if(s.config.profile.shape_values, [&](const ShapeInputValues& sv) {
      const Value* in = graph.FindValue(sv.input);
      if (std::find(inferred_or->shape_inputs_read.begin(), inferred_or->shape_inputs_read.end(),
                    in) != inferred_or->shape_inputs_read.end()) {
        return false;
      }
      graph.FindValue(sv.input)->set_shape_input_values(std::nullopt);
      return true;
    });
    inferred_or = infer();
  }
  if (!inferred_or.ok()) {
    return std::move(inferred_or)
        .status()
        .AddContext(fmt::format("inferring shapes of '{}'", s.input.model_name));
  }
  ShapeInferenceResult inferred = std::move(inferred_or).value();
  rep.phase_seconds_import = Seconds(s.start);
  if (!s.config.optimize) return OkStatus();

  const auto passes_start = Clock::now();
  s.Progress("passes", 0, 1, "");
  passes::PassOptions pass_options;
  pass_options.evaluator = ReferenceEvaluator();
  pass_options.disabled = s.config.disabled_passes;
  // cuDNN runs f16/bf16 convolutions on tensor cores channels-last; f32 and the CPU stay NCHW.
  if (s.config.backend == BackendKind::kCuda && (s.config.fp16 || s.config.bf16)) {
    pass_options.conv_layout = "NHWC";
  }
  if (s.config.backend == BackendKind::kCuda) {
    pass_options.attention_max_head_dim = kCudaAttentionMaxHeadDim;
  }
  pass_options.stem_space_to_depth = SpaceToDepthStems(s.config);
  KILN_ASSIGN_OR_RETURN(passes::PassReport passes,
                        passes::RunDefaultPasses(graph, pass_options, &inferred.dims_values));
  rep.passes = passes.ToString();
  for (const auto& e : passes.passes) {
    for (const std::string& note : e.stats.notes) rep.pass_notes.push_back(e.pass + ": " + note);
  }
  rep.nodes_before_passes = passes.nodes_before;
  rep.nodes_after_passes = passes.nodes_after;
  rep.phase_seconds_passes = Seconds(passes_start);
  return OkStatus();
}

// Precision: calibration (when given) then per-layer decisions and the graph rewrite.
Status PrecisionPhase(BuildState& s) {
  Graph& graph = s.graph();
  const BuilderConfig& config = s.config;
  const auto precision_start = Clock::now();
  s.Progress("precision", 0, 1, "");
  std::optional<precision::CalibrationTable> calibration;
  if (config.int8 || config.fp8 || config.fp16 || config.bf16) {
    KILN_ASSIGN_OR_RETURN(calibration, GetCalibration(graph, config, s.input.model_hash, s.rep));
  }
  precision::PrecisionOptions po;
  po.fp16 = config.fp16;
  po.bf16 = config.bf16;
  po.int8 = config.int8;
  po.fp8 = config.fp8;
  po.backend = config.backend;
  po.calibration = calibration ? &*calibration : nullptr;
  po.int8_tolerance = config.int8_tolerance;
  po.fp8_tolerance = config.fp8_tolerance;
  // Kernel requests (which ask the providers whether a reduced-precision kernel exists) need
  // the max dims: one shape-rule sweep over the graph, only worth it when something may be
  // reduced. Without a precision flag every layer stays FP32 and no request is made.
  ConcreteDimsMap max_dims;
  // A QDQ model's INT8 layers (qdq_fusion) are INT8 without any flag: the kernels are asked too.
  const bool model_int8 = precision::HasModelInt8Layers(graph);
  if (config.fp16 || config.bf16 || config.int8 || config.fp8 || model_int8) {
    KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
    KILN_ASSIGN_OR_RETURN(max_dims, ConcreteDims(graph, order, config.profile, 2));
    po.make_request = [&max_dims](const Node& node) { return MakeKernelRequest(node, max_dims); };
  }
  KILN_ASSIGN_OR_RETURN(s.assigned, precision::AssignPrecision(graph, po));
  s.rep.time_breakdown.precision_query_seconds = s.assigned.kernel_query_seconds;
  s.rep.casts_inserted = s.assigned.casts_inserted;
  s.rep.weights_converted = s.assigned.weights_converted;
  if (model_int8 && s.rep.calibration.empty()) {
    s.rep.calibration = fmt::format(
        "none: {} INT8 layer(s) from the model's Q/DQ scales, {} in float between their Q/DQ",
        s.assigned.int8_model_layers, s.assigned.int8_model_fallbacks);
  }
  s.rep.phase_seconds_precision = Seconds(precision_start);
  return OkStatus();
}

// The timing cache for this build's device and libraries, loaded from the file when one is given.
Status LoadTimingCache(BuildState& s) {
  const BuilderConfig& config = s.config;
  if (config.timing_cache_path.empty()) return OkStatus();
  s.cache.emplace(
      fmt::format("{}|{}|{}", ToString(config.backend), s.device.arch, s.device.library_versions));
  if (Status st = s.cache->Load(config.timing_cache_path); !st.ok()) {
    // A path that names no cache file at all (a FIFO, a device, a huge file) is the user's
    // mistake to fix, not a stale cache to replace.
    if (IsWrongFileKind(st)) return st;
    Warn(s.rep, st);
  } else {
    s.cache_file_current = std::filesystem::exists(config.timing_cache_path);
  }
  return OkStatus();
}

// The tactic prefix a quantized layer is limited to ("i8-", "f8-"), or "" for a float layer.
std::string_view QuantizedPrefix(const BuildState& s, const Node& node) {
  auto lp = s.assigned.layers.find(node.name());
  if (lp == s.assigned.layers.end()) return {};
  if (lp->second.int8) return precision::kInt8TacticPrefix;
  if (lp->second.fp8) return precision::kFp8TacticPrefix;
  return {};
}

// Whether a quantized layer's tactics race its float ones (BuilderConfig::quantized_if_faster): a
// calibrated INT8/FP8 layer (a QDQ model's INT8 layers keep the model's quantization) in a build
// that times its tactics.
bool QuantizedRacesFloat(const BuildState& s, const Node& node) {
  const BuilderConfig& config = s.config;
  const bool on = config.quantized_if_faster.value_or(config.backend != BackendKind::kCpu);
  if (!on || !config.search_tactics || config.opt_level == 0) return false;
  auto lp = s.assigned.layers.find(node.name());
  return lp != s.assigned.layers.end() && (lp->second.int8 || lp->second.fp8) &&
         !lp->second.int8_from_model;
}

bool IsQuantizedTactic(const TacticConfig& t) {
  return t.name.starts_with(precision::kInt8TacticPrefix) ||
         t.name.starts_with(precision::kFp8TacticPrefix);
}

// After the search: a quantized layer whose fastest tactic is a float one runs float. Its
// quantization attributes go (so the type rules, the edges and the engine file see a float
// layer) and its precision says why.
Status RunFloatWhereFaster(BuildState& s) {
  for (LayerSearch& l : s.searches) {
    const std::string_view quantized = QuantizedPrefix(s, *l.node);
    if (quantized.empty() || l.candidates.empty()) continue;
    const TacticConfig& won = l.candidates[l.chosen].tactic;
    if (won.name.starts_with(quantized)) continue;
    Node* node = s.graph().FindNode(l.node->name());
    precision::LayerPrecision& lp = s.assigned.layers.at(l.node->name());
    const std::string was = lp.label();
    if (!node || IsQuantizedTactic(won)) {
      return MakeError(ErrorCode::kInternal, "layer '{}' ({}) chose tactic {}", l.node->name(), was,
                       won.name);
    }
    node->mutable_attrs().Erase(std::string(precision::kInt8InputAmaxAttr));
    node->mutable_attrs().Erase(std::string(kFp8InputAmaxAttr));
    lp.int8 = lp.fp8 = false;
    const std::string timing = l.time_ms >= 0 ? fmt::format("ran {:.4g} ms", l.time_ms)
                                              : std::string("won in the timing cache");
    lp.reason = fmt::format(
        "{}: its {} tactics were slower here: the float tactic {} {} (--quantized-if-faster); "
        "was {}",
        lp.label(), was, won.name, timing, lp.reason);
  }
  return OkStatus();
}

// Asks the providers for the layer's tactics, the first TacticsPerProvider(opt_level) of each
// (of each kernel family of a provider; opt level 0, or search_tactics off: the heuristic's one).
// A quantized layer that races its float tactics lists its quantized ones first (the heuristic
// choice, and what a search cut short by the deadline keeps), then the float ones.
void ListCandidates(BuildState& s, LayerSearch& l) {
  const BuilderConfig& config = s.config;
  const bool search = config.search_tactics && config.opt_level > 0;
  const int per_provider = search ? TacticsPerProvider(config.opt_level) : 1;
  l.request.max_tactics = per_provider;
  l.candidates.clear();
  l.from_cache = false;
  // An INT8 (FP8) layer takes only INT8 (FP8) tactics. Other layers need no filter: providers
  // offer quantized tactics only to annotated nodes, and an "i8-" tactic of an unannotated node
  // is a plain int8-dtype kernel (an int8 Add), which must stay.
  const std::string_view quantized = QuantizedPrefix(s, *l.node);
  const bool race = !quantized.empty() && QuantizedRacesFloat(s, *l.node);
  const auto generate_start = Clock::now();
  const auto providers = KernelRegistry::Get().Providers(config.backend, *l.node);
  // The backend's own kernels first; a host fallback (another backend's kernel run on the host,
  // backends/cuda/host_fallback.cc) only for a layer none of them takes.
  std::vector<TacticCandidate> floats;
  for (bool host : {false, true}) {
    if (host && !l.candidates.empty()) break;
    for (const KernelProvider* p : providers) {
      if (p->runs_on_host() != host) continue;
      std::vector<TacticConfig> offered = p->Tactics(l.request);
      if (race && !host) {
        std::vector<TacticConfig> float_tactics;
        for (const TacticConfig& t : offered) {
          if (!IsQuantizedTactic(t)) float_tactics.push_back(t);
        }
        for (TacticConfig& t : TakeTactics(std::move(float_tactics), "", per_provider)) {
          floats.push_back({p, std::move(t)});
        }
      }
      for (TacticConfig& t : TakeTactics(std::move(offered), quantized, per_provider)) {
        l.candidates.push_back({p, std::move(t)});
      }
    }
  }
  for (TacticCandidate& c : floats) l.candidates.push_back(std::move(c));
  l.generate_seconds += Seconds(generate_start);
  if (!search && l.candidates.size() > 1) l.candidates.resize(1);
}

// A warm layer: the timing cache's winner for its signature becomes its one candidate, without
// listing the providers' tactics (for cuDNN, finalising their plans); only that kernel is made.
// False when the cache has no usable entry.
bool TakeCachedWinner(BuildState& s, LayerSearch& l) {
  const BuilderConfig& config = s.config;
  if (!s.cache || !config.search_tactics || config.opt_level == 0) return false;
  if (l.opt_in.empty() && !l.request.inputs.empty()) return false;  // never timed
  const TimingEntry* e = s.cache->Find(l.signature);
  if (!e) return false;
  const KernelProvider* provider = nullptr;
  for (const KernelProvider* p : KernelRegistry::Get().Providers(config.backend, *l.node)) {
    if (p->id() == e->provider_id) provider = p;
  }
  if (!provider) return false;
  // A quantized layer takes a cached quantized winner, or a float one where it races them.
  const std::string_view quantized = QuantizedPrefix(s, *l.node);
  if (!quantized.empty() && !e->tactic.name.starts_with(quantized) &&
      (IsQuantizedTactic(e->tactic) || !QuantizedRacesFloat(s, *l.node))) {
    return false;
  }
  l.candidates = {{provider, e->tactic}};
  l.from_cache = true;
  ++s.rep.time_breakdown.layers_from_cache;
  return true;
}

// Every layer's request, signature and candidate tactics (heuristic order: first provider's first
// tactic first); a layer the timing cache knows takes its winner alone. Layers without any
// candidate go to *unbuildable.
Status ListLayers(BuildState& s, std::vector<Node*>* unbuildable) {
  Graph& graph = s.graph();
  const BuilderConfig& config = s.config;
  KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
  KILN_ASSIGN_OR_RETURN(auto max_dims, ConcreteDims(graph, order, config.profile, 2));
  KILN_ASSIGN_OR_RETURN(auto opt_dims_of, ConcreteDims(graph, order, config.profile, 1));
  std::vector<LayerSearch> layers(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    Node* node = order[i];
    LayerSearch& l = layers[i];
    l.node = node;
    // Max dims come from the shape rules run on integers (symbolic substitution cannot see
    // through every data-dependent shape; the rules can).
    l.request = MakeKernelRequest(*node, max_dims);
    bool known = true;
    auto opt_dims = [&](const Value* v, std::vector<std::vector<int64_t>>& out) {
      std::vector<int64_t> dims;
      if (v) {
        auto it = opt_dims_of.find(v);
        if (it == opt_dims_of.end()) {
          known = false;
        } else {
          dims = it->second;
        }
      }
      out.push_back(std::move(dims));
    };
    for (const Value* v : node->inputs()) opt_dims(v, l.opt_in);
    for (const Value* v : node->outputs()) opt_dims(v, l.opt_out);
    if (!known) {
      l.opt_in.clear();
      l.opt_out.clear();
    }
    l.signature = LayerSignature(l.request, l.opt_in);
  }
  // Listing asks the providers (cuDNN: heuristics and a plan finalised per tactic kept), so the
  // layers the timing cache does not know are listed by the set-up threads.
  std::vector<size_t> to_list;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (!TakeCachedWinner(s, layers[i])) to_list.push_back(i);
  }
  s.rep.time_breakdown.layers_listed += static_cast<int64_t>(to_list.size());
  const auto listing_start = Clock::now();
  RunBounded(*s.backend, SetupThreads(config), to_list.size(),
             [&](size_t k) { ListCandidates(s, layers[to_list[k]]); });
  s.rep.time_breakdown.listing_wall_seconds += Seconds(listing_start);
  std::vector<std::string> missing;
  for (size_t i = 0; i < layers.size(); ++i) {
    Node* node = order[i];
    LayerSearch& l = layers[i];
    if (l.candidates.empty()) {
      std::vector<std::string> types;
      for (const auto& d : l.request.inputs) types.push_back(std::string(ToString(d.dtype)));
      missing.push_back(fmt::format("'{}' ({}; inputs {})", node->name(), node->op_type(),
                                    fmt::join(types, ",")));
      unbuildable->push_back(node);
      continue;
    }
    s.searches.push_back(std::move(l));
  }
  if (!missing.empty()) {
    return MakeError(ErrorCode::kNoTactic, "{} layer(s) have no {} implementation: {}",
                     missing.size(), ToString(config.backend), fmt::join(missing, ", "));
  }
  return OkStatus();
}

// Tactics: the layers and their candidates. The precision phase gave layers FP16/BF16 from the
// providers' static capability; one whose reduced kernel cannot be built after all (no cuDNN
// plan finalises for it) falls back to FP32 here, with the reason in the report, and the layers
// are listed again (the providers remember their answers, so that costs little).
Status TacticsPhase(BuildState& s) {
  s.tactics_start = Clock::now();
  KILN_RETURN_IF_ERROR(LoadTimingCache(s));
  std::vector<Node*> unbuildable;
  Status listed = ListLayers(s, &unbuildable);
  if (listed.ok()) return OkStatus();
  bool demoted = false;
  for (Node* node : unbuildable) {
    auto lp = s.assigned.layers.find(node->name());
    if (lp == s.assigned.layers.end() || lp->second.int8 || lp->second.fp8 ||
        (lp->second.dtype != DataType::kFloat16 && lp->second.dtype != DataType::kBFloat16)) {
      continue;
    }
    const std::string reason = fmt::format(
        "fp32: the {} backend offered {} for this layer but built no {} kernel for it (weights "
        "keep their {} rounding)",
        ToString(s.config.backend), ToString(lp->second.dtype), ToString(lp->second.dtype),
        ToString(lp->second.dtype));
    KILN_RETURN_IF_ERROR(precision::DemoteToFp32(s.graph(), *node, reason, s.assigned));
    Warn(s.rep, MakeError(ErrorCode::kNoTactic, "layer '{}': {}", node->name(), reason));
    demoted = true;
  }
  if (!demoted) return listed;
  s.rep.casts_inserted = s.assigned.casts_inserted;
  s.searches.clear();
  s.rep.time_breakdown.layers_listed = s.rep.time_breakdown.layers_from_cache = 0;
  unbuildable.clear();
  return ListLayers(s, &unbuildable);
}

// Budget: the memory budget bounds weights + activations (fixed by the graph) + the largest
// workspace (chosen per layer): plan the arena first, then give tactics what is left.
Status BudgetPhase(BuildState& s) {
  const BuilderConfig& config = s.config;
  if (config.memory_budget.bytes) {
    s.budget = *config.memory_budget.bytes;
  } else if (config.memory_budget.fraction) {
    s.budget = static_cast<int64_t>(static_cast<double>(s.device.free_memory) *
                                    *config.memory_budget.fraction /
                                    std::max(1, config.memory_budget.ranks_per_device));
  }
  if (!s.budget) return OkStatus();
  const int64_t budget = *s.budget;
  std::vector<PlanLayer> base_layers;
  for (const LayerSearch& l : s.searches) {
    base_layers.push_back(PlanLayerFor(*l.node, 0, s.alias_views));
  }
  KILN_ASSIGN_OR_RETURN(MemoryPlan base_plan, PlanMemory(s.graph(), base_layers, config.profile));
  if (base_plan.weights_bytes > budget) {
    return MakeError(ErrorCode::kMemoryBudgetExceeded,
                     "the weights alone need {} bytes; the memory budget ({}) allows {} bytes",
                     base_plan.weights_bytes, config.memory_budget.ToString(), budget);
  }
  if (base_plan.peak_bytes > budget) {
    return MakeError(ErrorCode::kMemoryBudgetExceeded,
                     "weights + activations at the profile's max shapes need {} bytes (weights "
                     "{}, activations {}); "
                     "the memory budget ({}) allows {} bytes",
                     base_plan.peak_bytes, base_plan.weights_bytes, base_plan.arena_bytes,
                     config.memory_budget.ToString(), budget);
  }
  s.search.max_workspace_bytes = budget - base_plan.peak_bytes;
  return OkStatus();
}

// Timing: the anytime search (timing cache, then timing until the deadline), the cache written
// back, and each chosen tactic's workspace at the max shapes.
Status TimingPhase(BuildState& s) {
  const BuilderConfig& config = s.config;
  BuildReport& rep = s.rep;
  s.search.start = s.start;
  s.search.progress = config.progress;
  s.search.max_kernel_time_ms = config.max_kernel_time_ms;
  if (config.deadline) s.search.deadline = s.start + *config.deadline;
  s.search.early_stop = config.opt_level < kMaxOptLevel;
  s.search.settle_ratio = config.opt_level < kMaxOptLevel ? kSettleRatio : 0;
  s.search.setup_threads = SetupThreads(config);
  rep.time_breakdown.opt_level = config.opt_level;
  // A cached winner whose workspace no longer fits the budget: back to the listed candidates.
  for (LayerSearch& l : s.searches) {
    if (l.from_cache && s.search.max_workspace_bytes &&
        static_cast<int64_t>(l.candidates[0].tactic.workspace_bytes) >
            *s.search.max_workspace_bytes) {
      --rep.time_breakdown.layers_from_cache;
      ++rep.time_breakdown.layers_listed;
      ListCandidates(s, l);
    }
  }
  if (s.cache) s.search.cache = &*s.cache;
  KILN_RETURN_IF_ERROR(SearchTactics(*s.backend, s.searches, s.search, &rep));
  KILN_RETURN_IF_ERROR(RunFloatWhereFaster(s));
  // A build that timed nothing new leaves a valid cache file as it is: rewriting it (lock, merge,
  // atomic rename) was most of a warm build's cache work.
  if (s.cache && (s.cache->modified() || !s.cache_file_current)) {
    if (Status st = s.cache->Save(config.timing_cache_path); !st.ok()) {
      if (IsWrongFileKind(st)) return st;
      Warn(rep, st);
    }
  }
  // A dynamic profile: the kernels are also asked at its min and opt shapes.
  std::vector<ConcreteDimsMap> other_shapes;
  if (std::any_of(config.profile.inputs.begin(), config.profile.inputs.end(),
                  [](const InputProfile& p) { return p.min != p.max || p.opt != p.max; })) {
    KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, s.graph().TopologicalOrder());
    for (int which : {0, 1}) {
      KILN_ASSIGN_OR_RETURN(ConcreteDimsMap dims,
                            ConcreteDims(s.graph(), order, config.profile, which));
      other_shapes.push_back(std::move(dims));
    }
  }
  for (LayerSearch& l : s.searches) {
    // The plan reserves what the kernel itself asks for at the profile's shapes (a tactic's
    // estimate may not know every dim); the runtime checks the same figure again.
    StatusOr<size_t> prepared = PreparedWorkspace(l, l.candidates[l.chosen], other_shapes);
    if (!prepared.ok() && l.from_cache) {
      // The cached winner cannot be made here (a stale cache, another library build): this
      // layer takes the heuristic's tactic, as a cold build would before timing.
      Warn(rep,
           MakeError(ErrorCode::kTimingCacheInvalid,
                     "the timing cache's tactic {} for layer '{}' cannot be created ({}); "
                     "using the heuristic's tactic (rebuild the cache to time it again)",
                     l.candidates[0].tactic.name, l.node->name(), prepared.status().message()));
      --rep.time_breakdown.layers_from_cache;
      ++rep.time_breakdown.layers_listed;
      ListCandidates(s, l);
      if (l.candidates.empty()) {
        return MakeError(ErrorCode::kNoTactic, "layer '{}' ({}) has no {} implementation",
                         l.node->name(), l.node->op_type(), ToString(config.backend));
      }
      l.chosen = 0;
      l.time_ms = -1;
      prepared = PreparedWorkspace(l, l.candidates[0], other_shapes);
    }
    KILN_RETURN_IF_ERROR(prepared.status());
    TacticCandidate& c = l.candidates[l.chosen];
    c.tactic.workspace_bytes = std::max(c.tactic.workspace_bytes, *prepared);
    LayerDesc layer;
    layer.node = l.node;
    layer.provider_id = std::string(c.provider->id());
    layer.tactic = c.tactic;
    layer.measured_ms = l.time_ms;
    auto lp = s.assigned.layers.find(l.node->name());
    layer.precision_reason = lp != s.assigned.layers.end() ? lp->second.reason : "fp32";
    s.plan_layers.push_back(
        PlanLayerFor(*l.node, static_cast<int64_t>(c.tactic.workspace_bytes), s.alias_views));
    s.layers.push_back(std::move(layer));
  }
  if ((config.fp8 && config.fp8_edges) || (config.int8 && config.int8_edges)) {
    // After the choice: an edge needs both layers' chosen FP8 (INT8) tactics. The joined layers'
    // kernels (E4M3 or int8 in or out) are asked again for their workspace, which the plan then
    // reserves.
    std::vector<ChosenLayer> chosen;
    for (size_t i = 0; i < s.searches.size(); ++i) {
      LayerSearch& l = s.searches[i];
      const TacticCandidate& c = l.candidates[l.chosen];
      chosen.push_back({s.graph().FindNode(l.node->name()), c.provider, &l.request, &c.tactic,
                        &s.layers[i].precision_reason});
    }
    if (config.fp8 && config.fp8_edges) {
      rep.fp8_edges = JoinFp8Edges(chosen);
      rep.fp8_edges += JoinFp8Copies(s.graph(), chosen);
    }
    if (config.int8 && config.int8_edges) {
      rep.int8_edges = JoinInt8Edges(chosen);
      rep.int8_edges += JoinInt8Copies(s.graph(), chosen);
    }
    for (size_t i = 0; i < chosen.size(); ++i) {
      if (!chosen[i].joined) continue;
      LayerSearch& l = s.searches[i];
      TacticCandidate& c = l.candidates[l.chosen];
      KILN_ASSIGN_OR_RETURN(size_t workspace, PreparedWorkspace(l, c, other_shapes));
      c.tactic.workspace_bytes = workspace;
      s.layers[i].tactic.workspace_bytes = workspace;
      s.plan_layers[i] = PlanLayerFor(*l.node, static_cast<int64_t>(workspace), s.alias_views);
    }
  }
  rep.phase_seconds_tactics = Seconds(s.tactics_start);
  return OkStatus();
}

// Plan: activation offsets after liveness reuse, workspace, peak; checked against the budget.
Status PlanPhase(BuildState& s) {
  const auto plan_start = Clock::now();
  KILN_ASSIGN_OR_RETURN(MemoryPlanDetail detail,
                        PlanMemoryDetailed(s.graph(), s.plan_layers, s.config.profile));
  s.plan = detail.plan;
  // Aliased views launch nothing (memory_plan.h): their tactic and time say so in the engine.
  for (LayerDesc& l : s.layers) {
    if (l.node->num_outputs() == 1 && detail.aliases.count(l.node->output(0)->name())) {
      l.tactic.name = ViewTacticName(*l.node);
      l.measured_ms = 0;
    }
  }
  s.rep.naive_activation_bytes = NaivePeak(detail);
  if (!s.config.profile.shape_values.empty()) {
    // Shape inputs: contexts allocate this arena and re-plan in it for other values; its end
    // holds the device copy of the values (backends that cannot read host memory).
    KILN_ASSIGN_OR_RETURN(
        int64_t arena,
        CheckedAlignUp(std::max(s.plan.arena_bytes, s.config.shape_arena_bytes), kPlanAlignment,
                       ErrorCode::kProfileTooLarge, "the shape-input arena"));
    for (const ShapeInputValues& sv : s.config.profile.shape_values) {
      const Value* in = s.graph().FindValue(sv.input);
      const int64_t bytes =
          static_cast<int64_t>((sv.values.size() + sv.float_values.size()) * SizeOf(in->dtype()));
      KILN_ASSIGN_OR_RETURN(int64_t aligned,
                            CheckedAlignUp(bytes, kPlanAlignment, ErrorCode::kProfileTooLarge,
                                           "the shape-input arena"));
      KILN_ASSIGN_OR_RETURN(arena, CheckedTotalBytes(arena, aligned, ErrorCode::kProfileTooLarge,
                                                     "the shape-input arena"));
    }
    s.plan.shape_arena_bytes = arena;
    KILN_ASSIGN_OR_RETURN(int64_t with_arena,
                          CheckedTotalBytes(s.plan.weights_bytes, s.plan.shape_arena_bytes,
                                            ErrorCode::kProfileTooLarge, "the plan's peak"));
    KILN_ASSIGN_OR_RETURN(s.plan.peak_bytes,
                          CheckedTotalBytes(with_arena, s.plan.workspace_bytes,
                                            ErrorCode::kProfileTooLarge, "the plan's peak"));
  }
  if (s.budget) KILN_RETURN_IF_ERROR(CheckBudget(s.plan, *s.budget));
  s.rep.phase_seconds_plan = Seconds(plan_start);
  return OkStatus();
}

// Assemble: the engine (header, profile, plan, layers, graph) and the report, of which the
// engine stores the part that does not depend on the clock.
std::unique_ptr<EngineDesc> AssemblePhase(BuildState& s) {
  BuildReport& rep = s.rep;
  const MemoryPlan& plan = s.plan;
  auto engine = std::make_unique<EngineDesc>();
  engine->header.kiln_version = KILN_VERSION_STRING;
  engine->header.backend = s.config.backend;
  engine->header.device_arch = s.device.arch;
  engine->header.library_versions = s.device.library_versions;
  engine->header.model_hash = s.input.model_hash.Hex();
  engine->header.config_hash = s.config.Hash().Hex();
  engine->header.model_name = s.input.model_name;
  engine->profile = s.config.profile;
  engine->plan = plan;

  rep.layers = static_cast<int64_t>(s.layers.size());
  rep.weights_bytes = plan.weights_bytes;
  rep.arena_bytes = plan.arena_bytes;
  rep.workspace_bytes = plan.workspace_bytes;
  rep.peak_bytes = plan.peak_bytes;
  std::vector<std::string> on_host;
  for (const LayerDesc& l : s.layers) {
    const KernelProvider* provider = KernelRegistry::Get().Find(s.config.backend, l.provider_id);
    if (provider && provider->runs_on_host()) on_host.push_back(l.node->name());
    LayerReport lr;
    lr.name = l.node->name();
    lr.op_type = l.node->op_type();
    auto lp = s.assigned.layers.find(l.node->name());
    lr.precision = lp != s.assigned.layers.end() ? lp->second.label()
                   : l.node->num_outputs() && l.node->output(0)
                       ? std::string(ToString(l.node->output(0)->dtype()))
                       : "";
    ++rep.precision_counts[lr.precision];
    lr.precision_reason = l.precision_reason;
    lr.tactic = l.tactic.name;
    lr.time_ms = l.measured_ms;
    lr.workspace_bytes = static_cast<int64_t>(l.tactic.workspace_bytes);
    rep.layer_reports.push_back(std::move(lr));
  }
  if (!on_host.empty()) {
    // Not a failure: the layers run, at the cost of two copies and a host round trip each.
    rep.warnings.push_back(fmt::format(
        "{} layer(s) have no {} kernel for their op or element types and run the CPU's kernel on "
        "the host inside this engine (tactics 'host-...'): {}",
        on_host.size(), ToString(s.config.backend), fmt::join(on_host, ", ")));
  }
  engine->layers = std::move(s.layers);
  engine->graph = std::move(s.input.graph);
  engine->weight_program = RecordWeightProgram(*engine->graph, s.initializers);
  s.initializers.clear();
  // The program holds what refit needs; the provenance would keep folded literals alive.
  for (Value* v : engine->graph->values()) v->set_provenance(nullptr);
  if (const auto& unfit = engine->weight_program.non_refittable; !unfit.empty()) {
    rep.warnings.push_back(fmt::format(
        "{} weight(s) cannot be refit (`kiln refit` refuses this engine); the first, '{}': {}",
        unfit.size(), unfit.front().constant, unfit.front().reason));
  }
  // The report stored in the engine leaves out wall-clock figures, so that the same model, config
  // and timing cache give a byte-identical engine.
  BuildReport stored = rep;
  stored.build_seconds = stored.phase_seconds_import = stored.phase_seconds_passes = 0;
  stored.phase_seconds_tactics = stored.phase_seconds_plan = stored.phase_seconds_precision = 0;
  stored.time_breakdown = BuildTimeBreakdown();
  // Where the calibration came from (a run or the cache) does not change the engine.
  stored.calibration.clear();
  stored.calibration_batches_run = 0;
  std::erase_if(stored.warnings,
                [](const std::string& w) { return w.find("KILN-E3006") != std::string::npos; });
  engine->build_report_json = stored.ToJson();
  return engine;
}
}  // namespace

StatusOr<std::unique_ptr<EngineDesc>> BuildEngine(BuildInput input, const BuilderConfig& requested,
                                                  BuildReport* report) {
  BuildReport local_report;
  BuildReport& rep = report ? *report : local_report;
  rep = BuildReport();
  rep.model_name = input.model_name;
  rep.backend = std::string(ToString(requested.backend));
  if (requested.opt_level < kMinOptLevel || requested.opt_level > kMaxOptLevel) {
    return MakeError(ErrorCode::kInvalidArgument, "optimisation level {} is outside {}..{}",
                     requested.opt_level, kMinOptLevel, kMaxOptLevel);
  }
  if (!requested.disabled_passes.empty()) {
    const std::vector<std::string> known = passes::DefaultPassNames();
    for (const std::string& n : requested.disabled_passes) {
      if (std::find(known.begin(), known.end(), n) == known.end()) {
        return MakeError(ErrorCode::kInvalidArgument,
                         "there is no graph pass named '{}' to disable; the passes are: {}", n,
                         fmt::join(known, ", "));
      }
    }
  }
  BuildState s(std::move(input), requested, rep);

  KILN_RETURN_IF_ERROR(OptimisePhase(s));
  KILN_ASSIGN_OR_RETURN(s.backend, GetBackend(s.config.backend));
  KILN_ASSIGN_OR_RETURN(s.device, s.backend->Info());
  rep.device = s.device.name;
  KILN_RETURN_IF_ERROR(PrecisionPhase(s));
  KILN_RETURN_IF_ERROR(TacticsPhase(s));
  KILN_RETURN_IF_ERROR(BudgetPhase(s));
  KILN_RETURN_IF_ERROR(TimingPhase(s));
  KILN_RETURN_IF_ERROR(PlanPhase(s));
  std::unique_ptr<EngineDesc> engine = AssemblePhase(s);
  rep.build_seconds = Seconds(s.start);
  s.Progress("done", 1, 1, "");
  return engine;
}

StatusOr<std::unique_ptr<Graph>> CalibrationGraph(BuildInput input, const BuilderConfig& config) {
  BuildReport rep;
  BuildState s(std::move(input), config, rep);
  KILN_RETURN_IF_ERROR(OptimisePhase(s));
  return std::move(s.input.graph);
}

StatusOr<std::vector<KernelGap>> FindKernelGaps(BuildInput input, const BuilderConfig& requested) {
  BuildReport rep;
  BuilderConfig config = requested;
  config.fp16 = config.bf16 = config.int8 = config.fp8 = false;
  config.progress = nullptr;
  BuildState s(std::move(input), config, rep);
  KILN_RETURN_IF_ERROR(OptimisePhase(s));
  KILN_ASSIGN_OR_RETURN(s.backend, GetBackend(s.config.backend));
  Graph& graph = s.graph();
  KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph.TopologicalOrder());
  KILN_ASSIGN_OR_RETURN(auto max_dims, ConcreteDims(graph, order, s.config.profile, 2));
  std::vector<KernelGap> gaps;
  for (const Node* node : order) {
    const KernelRequest request = MakeKernelRequest(*node, max_dims);
    bool native = false, host = false;
    for (const KernelProvider* p : KernelRegistry::Get().Providers(s.config.backend, *node)) {
      if (!p->Supports(request)) continue;
      (p->runs_on_host() ? host : native) = true;
    }
    if (native) continue;
    std::vector<std::string> operands;
    for (size_t i = 0; i < node->num_inputs(); ++i) {
      const Value* v = node->input(i);
      if (!v) continue;
      auto dims = max_dims.find(v);
      operands.push_back(fmt::format("{}[{}]", ToString(v->dtype()),
                                     dims == max_dims.end()
                                         ? std::string("?")
                                         : fmt::format("{}", fmt::join(dims->second, ","))));
    }
    gaps.push_back(
        {node->name(), node->op_type(), fmt::format("inputs {}", fmt::join(operands, ", ")), host});
  }
  return gaps;
}

double BuildReport::TacticsOtherSeconds() const {
  const BuildTimeBreakdown& b = time_breakdown;
  return std::max(0.0, phase_seconds_tactics - b.listing_wall_seconds - b.setup_wall_seconds -
                           b.timing_seconds);
}

std::string BuildReport::ToJson() const {
  // Every build stores this report in its engine, so it is written without a JSON document tree
  // (nlohmann's took ~0.4 ms of a 6 ms warm build of gpt_tiny). Keys in sorted order, the layout
  // of nlohmann's dump(2), which `kiln inspect` and the tests parse.
  JsonWriter w;
  w.BeginObject();
  w.Key("backend").String(backend);
  w.Key("build_seconds").Double(build_seconds);
  w.Key("deadline_hit").Bool(deadline_hit);
  w.Key("device").String(device);
  w.Key("layer_reports").BeginArray();
  for (const LayerReport& l : layer_reports) {
    w.BeginObject();
    w.Key("name").String(l.name);
    w.Key("op").String(l.op_type);
    w.Key("precision").String(l.precision);
    w.Key("precision_reason").String(l.precision_reason);
    w.Key("tactic").String(l.tactic);
    w.Key("time_ms").Double(l.time_ms);
    w.Key("workspace_bytes").Int(l.workspace_bytes);
    w.EndObject();
  }
  w.EndArray();
  w.Key("layers").Int(layers);
  w.Key("memory").BeginObject();
  w.Key("arena_bytes").Int(arena_bytes);
  w.Key("naive_activation_bytes").Int(naive_activation_bytes);
  w.Key("peak_bytes").Int(peak_bytes);
  w.Key("weights_bytes").Int(weights_bytes);
  w.Key("workspace_bytes").Int(workspace_bytes);
  w.EndObject();
  w.Key("model").String(model_name);
  w.Key("passes").BeginObject();
  w.Key("nodes_after").Int(nodes_after_passes);
  w.Key("nodes_before").Int(nodes_before_passes);
  w.Key("notes").StringArray(pass_notes);
  w.Key("summary").String(passes);
  w.EndObject();
  w.Key("phase_seconds").BeginObject();
  w.Key("import").Double(phase_seconds_import);
  w.Key("passes").Double(phase_seconds_passes);
  w.Key("plan").Double(phase_seconds_plan);
  w.Key("precision").Double(phase_seconds_precision);
  w.Key("tactics").Double(phase_seconds_tactics);
  w.EndObject();
  w.Key("precision").BeginObject();
  w.Key("calibration").String(calibration);
  w.Key("calibration_batches_run").Int(calibration_batches_run);
  w.Key("casts_inserted").Int(casts_inserted);
  w.Key("fp8_edges").Int(fp8_edges);
  w.Key("int8_edges").Int(int8_edges);
  w.Key("counts").BeginObject();
  for (const auto& [label, n] : precision_counts) w.Key(label).Int(n);  // std::map: sorted
  w.EndObject();
  w.Key("weights_converted").Int(weights_converted);
  w.EndObject();
  w.Key("tactics_reused").Int(tactics_reused);
  w.Key("tactics_timed").Int(tactics_timed);
  const BuildTimeBreakdown& b = time_breakdown;
  w.Key("time_breakdown").BeginObject();
  w.Key("early_stops").Int(b.early_stops);
  w.Key("generate_seconds").Double(b.generate_seconds);
  w.Key("inputs_seconds").Double(b.inputs_seconds);
  w.Key("layers_from_cache").Int(b.layers_from_cache);
  w.Key("layers_listed").Int(b.layers_listed);
  w.Key("listing_wall_seconds").Double(b.listing_wall_seconds);
  w.Key("opt_level").Int(b.opt_level);
  w.Key("precision_query_seconds").Double(b.precision_query_seconds);
  w.Key("setup_max_concurrency").Int(b.setup_max_concurrency);
  w.Key("setup_seconds").Double(b.setup_seconds);
  w.Key("setup_threads").Int(b.setup_threads);
  w.Key("setup_wall_seconds").Double(b.setup_wall_seconds);
  w.Key("setups").Int(b.setups);
  w.Key("signatures").BeginArray();
  for (const SignatureTime& t : b.signatures) {
    w.BeginObject();
    w.Key("candidates").Int(t.candidates);
    w.Key("early_stops").Int(t.early_stops);
    w.Key("first_layer").String(t.first_layer);
    w.Key("generate_seconds").Double(t.generate_seconds);
    w.Key("inputs_seconds").Double(t.inputs_seconds);
    w.Key("layers").Int(t.layers);
    w.Key("op").String(t.op_type);
    w.Key("setup_seconds").Double(t.setup_seconds);
    w.Key("setups").Int(t.setups);
    w.Key("signature").String(t.signature);
    w.Key("timed").Int(t.timed);
    w.Key("timing_seconds").Double(t.timing_seconds);
    w.EndObject();
  }
  w.EndArray();
  w.Key("tactics_other_seconds").Double(TacticsOtherSeconds());
  w.Key("timing_seconds").Double(b.timing_seconds);
  w.EndObject();
  w.Key("timing_cache_hits").Int(timing_cache_hits);
  w.Key("warnings").StringArray(warnings);
  w.EndObject();
  return w.Take();
}

namespace {
std::string HumanBytes(int64_t b) {
  if (b >= (1LL << 30)) return fmt::format("{:.2f} GiB", b / double(1LL << 30));
  if (b >= (1LL << 20)) return fmt::format("{:.2f} MiB", b / double(1LL << 20));
  if (b >= (1LL << 10)) return fmt::format("{:.1f} KiB", b / double(1LL << 10));
  return fmt::format("{} B", b);
}
}  // namespace

std::string BuildReport::PrecisionTable() const {
  std::string out =
      fmt::format("{:<4} {:<32} {:<18} {:<5} {}\n", "#", "layer", "op", "prec", "reason");
  for (size_t i = 0; i < layer_reports.size(); ++i) {
    const auto& l = layer_reports[i];
    std::string name = l.name.size() > 32 ? "…" + l.name.substr(l.name.size() - 31) : l.name;
    out += fmt::format("{:<4} {:<32} {:<18} {:<5} {}\n", i, name, l.op_type, l.precision,
                       l.precision_reason);
  }
  std::vector<std::string> counts;
  for (const auto& [label, n] : precision_counts) counts.push_back(fmt::format("{} {}", label, n));
  out += fmt::format("layers per precision: {}\n", fmt::join(counts, ", "));
  return out;
}

std::string BuildReport::PrecisionJson() const {
  nlohmann::json ls = nlohmann::json::array();
  for (const LayerReport& l : layer_reports) {
    ls.push_back({{"name", l.name},
                  {"op", l.op_type},
                  {"precision", l.precision},
                  {"reason", l.precision_reason}});
  }
  nlohmann::json j = {{"model", model_name},
                      {"backend", backend},
                      {"layers", ls},
                      {"counts", precision_counts},
                      {"casts_inserted", casts_inserted},
                      {"fp8_edges", fp8_edges},
                      {"int8_edges", int8_edges},
                      {"calibration", calibration}};
  return j.dump(2);
}

std::string BuildReport::TimeText(bool per_signature) const {
  const BuildTimeBreakdown& b = time_breakdown;
  std::string out = fmt::format(
      "    phases: import {:.3f} s  passes {:.3f} s  precision {:.3f} s (kernel queries {:.3f} s)  "
      "tactics {:.3f} s  plan {:.3f} s\n",
      phase_seconds_import, phase_seconds_passes, phase_seconds_precision,
      b.precision_query_seconds, phase_seconds_tactics, phase_seconds_plan);
  out += fmt::format(
      "    tactics: listing candidates {:.3f} s  set-up {:.3f} s  timing {:.3f} s  other {:.3f} "
      "s\n",
      b.listing_wall_seconds, b.setup_wall_seconds, b.timing_seconds, TacticsOtherSeconds());
  out += fmt::format(
      "    search: opt level {}  layers listed {} ({:.3f} s over the threads)  from the timing "
      "cache {}  candidates set up {} (inputs {:.3f} s, {:.3f} s on {} thread(s), at most {} at "
      "once)  stopped early {}\n",
      b.opt_level, b.layers_listed, b.generate_seconds, b.layers_from_cache, b.setups,
      b.inputs_seconds, b.setup_seconds, b.setup_threads, b.setup_max_concurrency, b.early_stops);
  if (!per_signature || b.signatures.empty()) return out;
  constexpr size_t kShown = 15;
  out += fmt::format("    tactic seconds per layer signature ({} signatures{}):\n",
                     b.signatures.size(),
                     b.signatures.size() > kShown ? fmt::format(", the {} slowest", kShown) : "");
  out += fmt::format("      {:<18} {:>6} {:>6} {:>6} {:>6} {:>9} {:>9} {:>9}  {}\n", "op", "layers",
                     "cands", "set up", "timed", "listing", "set-up", "timing", "first layer");
  for (size_t i = 0; i < b.signatures.size() && i < kShown; ++i) {
    const SignatureTime& t = b.signatures[i];
    std::string name = t.first_layer.size() > 40
                           ? "…" + t.first_layer.substr(t.first_layer.size() - 39)
                           : t.first_layer;
    out += fmt::format("      {:<18} {:>6} {:>6} {:>6} {:>6} {:>9.3f} {:>9.3f} {:>9.3f}  {}\n",
                       t.op_type, t.layers, t.candidates, t.setups, t.timed, t.generate_seconds,
                       t.setup_seconds, t.timing_seconds, name);
  }
  return out;
}

std::string BuildReport::ToText(bool per_layer) const {
  std::string out;
  out += fmt::format("build report: {} on {} ({})\n", model_name, backend, device);
  if (per_layer) {
    out += fmt::format("  {:<4} {:<32} {:<18} {:<5} {:<36} {:>9}\n", "#", "layer", "op", "prec",
                       "tactic", "time ms");
    for (size_t i = 0; i < layer_reports.size(); ++i) {
      const auto& l = layer_reports[i];
      std::string name = l.name.size() > 32 ? "…" + l.name.substr(l.name.size() - 31) : l.name;
      out += fmt::format("  {:<4} {:<32} {:<18} {:<5} {:<36} {:>9}\n", i, name, l.op_type,
                         l.precision, l.tactic,
                         l.time_ms < 0 ? std::string("-") : fmt::format("{:.4f}", l.time_ms));
    }
  }
  if (nodes_before_passes) {
    out += fmt::format("  graph passes: {} -> {} nodes\n", nodes_before_passes, nodes_after_passes);
  }
  for (const std::string& note : pass_notes) out += fmt::format("    {}\n", note);
  out += fmt::format("  layers {}   tactics timed {}   timing-cache hits {}   reused {}{}\n",
                     layers, tactics_timed, timing_cache_hits, tactics_reused,
                     deadline_hit ? "   (deadline reached: best engine so far)" : "");
  out += fmt::format("  memory: weights {}  activations {}  workspace {}  peak {}\n",
                     HumanBytes(weights_bytes), HumanBytes(arena_bytes),
                     HumanBytes(workspace_bytes), HumanBytes(peak_bytes));
  std::vector<std::string> counts;
  for (const auto& [label, n] : precision_counts) counts.push_back(fmt::format("{} {}", label, n));
  out += fmt::format("  precision: {}   casts inserted {}   weights converted {}{}{}\n",
                     fmt::join(counts, ", "), casts_inserted, weights_converted,
                     fp8_edges ? fmt::format("   FP8 edges {}", fp8_edges) : "",
                     int8_edges ? fmt::format("   INT8 edges {}", int8_edges) : "");
  if (!calibration.empty()) out += fmt::format("  calibration: {}\n", calibration);
  out += fmt::format("  build time {:.3f} s\n", build_seconds);
  out += TimeText(per_layer);
  for (const auto& w : warnings) out += fmt::format("  warning: {}\n", w);
  return out;
}

}  // namespace kiln
