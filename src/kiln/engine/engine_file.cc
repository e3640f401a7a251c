// Engine serialization and verified loading (layout in engine_file.h, schema in engine.fbs).
#include "kiln/engine/engine_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "kiln/core/file_io.h"
#include "kiln/engine/engine_generated.h"
#include "kiln/ir/sizes.h"
#include "kiln/ops/op_schema.h"

#ifndef KILN_VERSION_STRING
#define KILN_VERSION_STRING "0.0.0"
#endif

namespace kiln {

std::string_view KilnVersion() { return KILN_VERSION_STRING; }

namespace {

// Bounds for structures whose size the file itself chooses; far above any real model and low
// enough that no arithmetic on them can overflow.
constexpr int64_t kMaxCoeff = int64_t{1} << 32;
constexpr size_t kMaxDegree = 4;
constexpr size_t kMaxRank = 64;

uint64_t Align(uint64_t n, uint64_t a = kEngineWeightsAlignment) { return (n + a - 1) / a * a; }

template <typename T>
void PutLe(std::byte* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}
template <typename T>
T GetLe(const std::byte* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

template <typename... Args>
Status Malformed(fmt::format_string<Args...> format, Args&&... args) {
  return Status(ErrorCode::kEngineMalformed, fmt::format(format, std::forward<Args>(args)...));
}

bool ValidDataType(uint8_t t) {
  return t > static_cast<uint8_t>(DataType::kUndefined) && t <= static_cast<uint8_t>(kLastDataType);
}

// Bytes of a dense tensor; nullopt past the size limits (ir/sizes.h) or a negative dim.
std::optional<uint64_t> DenseBytes(DataType dtype, std::span<const int64_t> dims) {
  if (dims.size() > kMaxRank) return std::nullopt;
  auto size = CheckedTensorSize(dims, dtype, ErrorCode::kEngineMalformed, "");
  if (!size.ok()) return std::nullopt;
  return static_cast<uint64_t>(size->bytes);
}

// ---------------------------------------------------------------------------------------------
// Serialization

using FbBuilder = flatbuffers::FlatBufferBuilder;

flatbuffers::Offset<fb::Dim> WriteDim(FbBuilder& b, const Dim& d) {
  std::vector<flatbuffers::Offset<fb::DimTerm>> terms;
  for (const auto& [symbols, coeff] : d.terms()) {
    auto syms = b.CreateVectorOfStrings(symbols);
    terms.push_back(fb::CreateDimTerm(b, syms, coeff));
  }
  return fb::CreateDim(b, b.CreateVector(terms));
}

flatbuffers::Offset<fb::InlineTensor> WriteInlineTensor(FbBuilder& b, const Tensor& t) {
  auto dims = b.CreateVector(t.dims());
  auto data = b.CreateVector(reinterpret_cast<const uint8_t*>(t.raw()), t.size_bytes());
  return fb::CreateInlineTensor(b, static_cast<uint8_t>(t.dtype()), dims, data);
}

flatbuffers::Offset<fb::Attribute> WriteAttribute(FbBuilder& b, const std::string& name,
                                                  const Attribute& a) {
  auto n = b.CreateString(name);
  int64_t i = 0;
  float f = 0;
  flatbuffers::Offset<flatbuffers::String> s;
  flatbuffers::Offset<flatbuffers::Vector<int64_t>> ints;
  flatbuffers::Offset<flatbuffers::Vector<float>> floats;
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>>> strings;
  flatbuffers::Offset<fb::InlineTensor> t;
  switch (KindOf(a)) {
    case AttributeKind::kInt:
      i = std::get<int64_t>(a);
      break;
    case AttributeKind::kFloat:
      f = std::get<float>(a);
      break;
    case AttributeKind::kString:
      s = b.CreateString(std::get<std::string>(a));
      break;
    case AttributeKind::kInts:
      ints = b.CreateVector(std::get<std::vector<int64_t>>(a));
      break;
    case AttributeKind::kFloats:
      floats = b.CreateVector(std::get<std::vector<float>>(a));
      break;
    case AttributeKind::kStrings:
      strings = b.CreateVectorOfStrings(std::get<std::vector<std::string>>(a));
      break;
    case AttributeKind::kTensor:
      t = WriteInlineTensor(b, std::get<Tensor>(a));
      break;
  }
  return fb::CreateAttribute(b, n, static_cast<uint8_t>(KindOf(a)), i, f, s, ints, floats, strings,
                             t);
}

}  // namespace

namespace {

// The weight program's table; constants are named by their value index.
StatusOr<flatbuffers::Offset<fb::WeightProgram>> WriteWeightProgram(
    FbBuilder& b, const WeightProgram& p, const Graph& graph,
    const std::function<int32_t(const Value*)>& index_of) {
  auto constant_index = [&](const std::string& name) -> StatusOr<int32_t> {
    const Value* v = graph.FindValue(name);
    if (!v || !v->is_constant()) {
      return MakeError(ErrorCode::kInternal, "the weight program names '{}', not a constant", name);
    }
    return index_of(v);
  };
  std::vector<flatbuffers::Offset<fb::WeightSource>> sources;
  for (const WeightProgram::Source& src : p.sources) {
    auto name = b.CreateString(src.name);
    auto dims = b.CreateVector(src.dims);
    sources.push_back(fb::CreateWeightSource(b, name, static_cast<uint8_t>(src.dtype), dims));
  }
  std::vector<flatbuffers::Offset<fb::InlineTensor>> literals;
  for (const Tensor& t : p.literals) literals.push_back(WriteInlineTensor(b, t));
  std::vector<flatbuffers::Offset<fb::WeightStep>> steps;
  for (const WeightProgram::Step& step : p.steps) {
    std::vector<flatbuffers::Offset<fb::Attribute>> attrs;
    for (const auto& [name, a] : step.attrs.all()) attrs.push_back(WriteAttribute(b, name, a));
    auto op = b.CreateString(step.op_type);
    auto domain = b.CreateString(step.domain);
    auto ins = b.CreateVector(step.inputs);
    auto attr_vec = b.CreateVector(attrs);
    steps.push_back(fb::CreateWeightStep(b, op, domain, ins, step.num_outputs, attr_vec));
  }
  std::vector<flatbuffers::Offset<fb::WeightTarget>> targets;
  for (const WeightProgram::Target& t : p.targets) {
    KILN_ASSIGN_OR_RETURN(int32_t value, constant_index(t.constant));
    targets.push_back(fb::CreateWeightTarget(b, value, t.slot));
  }
  std::vector<flatbuffers::Offset<fb::FixedInitializer>> fixed;
  for (const WeightProgram::Fixed& f : p.fixed) {
    auto name = b.CreateString(f.name);
    auto dims = b.CreateVector(f.dims);
    auto hash = b.CreateString(f.hash);
    fixed.push_back(fb::CreateFixedInitializer(b, name, static_cast<uint8_t>(f.dtype), dims, hash));
  }
  std::vector<flatbuffers::Offset<fb::NonRefittable>> unfit;
  for (const WeightProgram::NonRefittable& n : p.non_refittable) {
    KILN_ASSIGN_OR_RETURN(int32_t value, constant_index(n.constant));
    unfit.push_back(fb::CreateNonRefittable(b, value, b.CreateString(n.reason)));
  }
  auto src_vec = b.CreateVector(sources);
  auto lit_vec = b.CreateVector(literals);
  auto step_vec = b.CreateVector(steps);
  auto target_vec = b.CreateVector(targets);
  auto fixed_vec = b.CreateVector(fixed);
  auto unfit_vec = b.CreateVector(unfit);
  return fb::CreateWeightProgram(b, src_vec, lit_vec, step_vec, target_vec, fixed_vec, unfit_vec);
}

// StripWeights' conditions: refit must be able to fill the engine again.
Status CheckStrippable(const WeightProgram& p) {
  if (!p.recorded) {
    return MakeError(ErrorCode::kRefitNotRecorded,
                     "the engine holds no weight program, so a copy without weights could never "
                     "be filled again");
  }
  if (!p.non_refittable.empty()) {
    return MakeError(ErrorCode::kRefitNotRefittable,
                     "constant '{}' cannot be remade by refit ({}; {} such constant(s)), so the "
                     "engine cannot be written without its weights: build it without "
                     "--strip-weights",
                     p.non_refittable.front().constant, p.non_refittable.front().reason,
                     p.non_refittable.size());
  }
  return OkStatus();
}

// The payload (everything after the preamble) in order, piece by piece, to `sink`; returns the
// preamble that describes it. SerializeEngine collects the pieces in memory; WriteEngineFile
// writes them to the file as they come, so a build never holds a second copy of the weights.
// `total` is told the file's size (preamble included) before the first piece.
using PayloadSink = std::function<Status(std::span<const std::byte>)>;
StatusOr<EnginePreamble> EmitEnginePayload(const EngineDesc& engine,
                                           const SerializeOptions& options,
                                           const std::function<void(uint64_t)>& total_bytes,
                                           const PayloadSink& sink) {
  if (!engine.graph) return MakeError(ErrorCode::kInternal, "the engine has no graph");
  const bool stripped = engine.header.weights_stripped || options.strip_weights;
  if (stripped) KILN_RETURN_IF_ERROR(CheckStrippable(engine.weight_program));
  const Graph& graph = *engine.graph;
  FbBuilder b(1 << 16);
  // Every scalar is stored even when it equals its default: the layout then does not depend on
  // values, and tests (and tools) can patch any field in place.
  b.ForceDefaults(true);

  // Values: graph inputs first (in input order), then the rest in graph order, so a loaded graph
  // (which adds inputs first) serializes to the same bytes again.
  std::vector<const Value*> values(graph.inputs().begin(), graph.inputs().end());
  for (const Value* v : graph.values()) {
    if (!v->is_graph_input()) values.push_back(v);
  }
  std::unordered_map<const Value*, int32_t> value_index;
  for (size_t i = 0; i < values.size(); ++i) value_index[values[i]] = static_cast<int32_t>(i);
  auto index_of = [&](const Value* v) -> int32_t {
    if (!v) return -1;
    auto it = value_index.find(v);
    return it == value_index.end() ? -2 : it->second;
  };

  std::vector<flatbuffers::Offset<fb::ValueDesc>> value_descs;
  for (const Value* v : values) {
    auto name = b.CreateString(v->name());
    std::vector<flatbuffers::Offset<fb::Dim>> dims;
    for (const Dim& d : v->shape()) dims.push_back(WriteDim(b, d));
    auto shape = b.CreateVector(dims);
    value_descs.push_back(
        fb::CreateValueDesc(b, name, static_cast<uint8_t>(v->dtype()), v->has_shape(), shape));
  }

  std::vector<const Node*> nodes;
  for (const Node* n : graph.nodes()) nodes.push_back(n);
  std::unordered_map<const Node*, int32_t> node_index;
  for (size_t i = 0; i < nodes.size(); ++i) node_index[nodes[i]] = static_cast<int32_t>(i);
  std::vector<flatbuffers::Offset<fb::NodeDesc>> node_descs;
  for (const Node* n : nodes) {
    std::vector<int32_t> ins, outs;
    for (const Value* v : n->inputs()) ins.push_back(index_of(v));
    for (const Value* v : n->outputs()) outs.push_back(index_of(v));
    if (std::count(ins.begin(), ins.end(), -2) || std::count(outs.begin(), outs.end(), -2)) {
      return MakeError(ErrorCode::kInternal, "node '{}' uses a value that is not in the graph",
                       n->name());
    }
    std::vector<flatbuffers::Offset<fb::Attribute>> attrs;
    for (const auto& [name, a] : n->attrs().all()) attrs.push_back(WriteAttribute(b, name, a));
    auto name = b.CreateString(n->name());
    auto op = b.CreateString(n->op_type());
    auto domain = b.CreateString(n->domain());
    auto in_vec = b.CreateVector(ins);
    auto out_vec = b.CreateVector(outs);
    auto attr_vec = b.CreateVector(attrs);
    node_descs.push_back(fb::CreateNodeDesc(b, name, op, domain, in_vec, out_vec, attr_vec));
  }

  // Constants: laid out in value order, each at a 64-byte aligned offset of the weights section;
  // a stripped engine's absent ones take no bytes there.
  std::set<std::string> absent;
  if (stripped) {
    for (const WeightProgram::Target& t : engine.weight_program.targets) absent.insert(t.constant);
  }
  std::vector<flatbuffers::Offset<fb::ConstantDesc>> constant_descs;
  std::vector<const Tensor*> weights;
  uint64_t weights_bytes = 0;
  for (const Value* v : values) {
    const Tensor* t = v->constant();
    if (!t) continue;
    auto dims = b.CreateVector(t->dims());
    const bool is_absent = absent.count(v->name()) > 0;
    if (!is_absent && !t->raw() && t->size_bytes() > 0) {
      return MakeError(ErrorCode::kInternal, "constant '{}' has no bytes in a full engine",
                       v->name());
    }
    constant_descs.push_back(
        fb::CreateConstantDesc(b, index_of(v), static_cast<uint8_t>(t->dtype()), dims,
                               is_absent ? 0 : weights_bytes, t->size_bytes(), is_absent));
    if (is_absent) continue;
    weights.push_back(t);
    weights_bytes += Align(t->size_bytes());
  }

  std::vector<int32_t> inputs, outputs;
  for (const Value* v : graph.inputs()) inputs.push_back(index_of(v));
  for (const Value* v : graph.outputs()) outputs.push_back(index_of(v));
  if (std::count(outputs.begin(), outputs.end(), -2)) {
    return MakeError(ErrorCode::kInternal, "a graph output is not a value of the graph");
  }
  auto graph_name = b.CreateString(graph.name());
  auto vals = b.CreateVector(value_descs);
  auto nds = b.CreateVector(node_descs);
  auto ins = b.CreateVector(inputs);
  auto outs = b.CreateVector(outputs);
  auto consts = b.CreateVector(constant_descs);
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::DataDependentDim>>> dd;
  if (!graph.data_dependent_bounds().empty()) {
    std::vector<flatbuffers::Offset<fb::DataDependentDim>> items;
    for (const auto& [symbol, bound] : graph.data_dependent_bounds()) {
      auto sym = b.CreateString(symbol);
      items.push_back(fb::CreateDataDependentDim(b, sym, WriteDim(b, bound)));
    }
    dd = b.CreateVector(items);
  }
  auto graph_desc =
      fb::CreateGraphDesc(b, graph_name, graph.opset(), vals, nds, ins, outs, consts, dd);

  std::vector<flatbuffers::Offset<fb::Layer>> layers;
  for (size_t i = 0; i < engine.layers.size(); ++i) {
    const LayerDesc& l = engine.layers[i];
    auto it = node_index.find(l.node);
    if (it == node_index.end()) {
      return MakeError(ErrorCode::kInternal, "layer {} runs a node that is not in the graph", i);
    }
    auto provider = b.CreateString(l.provider_id);
    auto tname = b.CreateString(l.tactic.name);
    auto params = b.CreateVector(l.tactic.params);
    auto tactic = fb::CreateTactic(b, tname, params, l.tactic.workspace_bytes);
    auto reason = b.CreateString(l.precision_reason);
    layers.push_back(fb::CreateLayer(b, it->second, provider, tactic, l.measured_ms, reason));
  }
  auto layer_vec = b.CreateVector(layers);

  std::vector<flatbuffers::Offset<fb::InputProfile>> profiles;
  for (const InputProfile& p : engine.profile.inputs) {
    auto name = b.CreateString(p.input);
    auto mn = b.CreateVector(p.min);
    auto op = b.CreateVector(p.opt);
    auto mx = b.CreateVector(p.max);
    profiles.push_back(fb::CreateInputProfile(b, name, mn, op, mx));
  }
  auto profile_vec = b.CreateVector(profiles);
  std::vector<flatbuffers::Offset<fb::ShapeInputValues>> shape_values;
  for (const ShapeInputValues& v : engine.profile.shape_values) {
    auto name = b.CreateString(v.input);
    auto values = b.CreateVector(v.values);
    auto float_values = v.float_values.empty() ? 0 : b.CreateVector(v.float_values);
    shape_values.push_back(fb::CreateShapeInputValues(b, name, values, float_values));
  }
  auto shape_values_vec = shape_values.empty() ? 0 : b.CreateVector(shape_values);

  std::vector<flatbuffers::Offset<fb::PlanOffset>> offsets;
  for (const auto& [name, offset] : engine.plan.offsets) {  // std::map: sorted
    offsets.push_back(fb::CreatePlanOffset(b, b.CreateString(name), offset));
  }
  auto offset_vec = b.CreateVector(offsets);
  auto plan = fb::CreateMemoryPlan(b, offset_vec, engine.plan.arena_bytes,
                                   engine.plan.workspace_bytes, engine.plan.weights_bytes,
                                   engine.plan.peak_bytes, engine.plan.shape_arena_bytes);

  const EngineHeader& h = engine.header;
  auto header =
      fb::CreateHeader(b, kEngineFormatVersion, b.CreateString(KilnVersion()),
                       static_cast<uint8_t>(h.backend), b.CreateString(h.device_arch),
                       b.CreateString(h.library_versions), b.CreateString(h.model_hash),
                       b.CreateString(h.config_hash), b.CreateString(h.model_name), stripped);
  auto report = b.CreateString(engine.build_report_json);
  flatbuffers::Offset<fb::WeightProgram> program;
  if (engine.weight_program.recorded) {
    KILN_ASSIGN_OR_RETURN(program, WriteWeightProgram(b, engine.weight_program, graph, index_of));
  }
  auto root = fb::CreateEngine(b, header, graph_desc, layer_vec, profile_vec, plan, report, program,
                               shape_values_vec);
  fb::FinishEngineBuffer(b, root);

  const uint64_t fb_bytes = b.GetSize();
  const uint64_t weights_start = Align(kEnginePreambleBytes + fb_bytes);
  const uint64_t total = weights_start + weights_bytes;
  total_bytes(total);
  Hasher hasher;
  uint64_t written = kEnginePreambleBytes;
  auto emit = [&](std::span<const std::byte> bytes) -> Status {
    if (bytes.empty()) return OkStatus();
    hasher.Update(bytes);
    written += bytes.size();
    return sink(bytes);
  };
  static constexpr std::array<std::byte, kEngineWeightsAlignment> kZeros{};
  auto pad_to = [&](uint64_t offset) -> Status {
    return emit(std::span(kZeros).first(static_cast<size_t>(offset - written)));
  };
  KILN_RETURN_IF_ERROR(emit(std::span(reinterpret_cast<const std::byte*>(b.GetBufferPointer()),
                                      static_cast<size_t>(fb_bytes))));
  KILN_RETURN_IF_ERROR(pad_to(weights_start));
  for (const Tensor* t : weights) {
    const uint64_t end = written + Align(t->size_bytes());
    KILN_RETURN_IF_ERROR(emit(std::span(static_cast<const std::byte*>(t->raw()), t->size_bytes())));
    KILN_RETURN_IF_ERROR(pad_to(end));
  }
  if (written != total) {
    return MakeError(ErrorCode::kInternal, "engine serialization wrote {} bytes; expected {}",
                     written, total);
  }
  EnginePreamble p;
  p.payload_bytes = total - kEnginePreambleBytes;
  p.flatbuffer_bytes = fb_bytes;
  p.flags = stripped ? kEngineFlagWeightsStripped : 0;
  p.kiln_version = std::string(KilnVersion());
  p.checksum = hasher.Digest();  // the payload's hash; SealEnginePreamble makes it the file's
  return p;
}

}  // namespace

std::vector<std::string> AbsentConstants(const EngineDesc& engine) {
  std::vector<std::string> names;
  if (!engine.header.weights_stripped) return names;
  for (const WeightProgram::Target& t : engine.weight_program.targets) names.push_back(t.constant);
  return names;
}

Status StripWeights(EngineDesc& engine) {
  if (!engine.graph) return MakeError(ErrorCode::kInvalidArgument, "no engine to strip");
  const WeightProgram& p = engine.weight_program;
  KILN_RETURN_IF_ERROR(CheckStrippable(p));
  std::vector<Value*> targets;
  for (const WeightProgram::Target& t : p.targets) {
    Value* v = engine.graph->FindValue(t.constant);
    if (!v || !v->is_constant()) {
      return MakeError(ErrorCode::kInternal, "the weight program makes '{}', not a constant",
                       t.constant);
    }
    targets.push_back(v);
  }
  for (Value* v : targets) {
    // dtype and dims only: the bytes are gone (set_constant would also drop the provenance,
    // which a loaded engine does not have anyway; the program is what refit replays).
    WeightExprPtr provenance = v->provenance();
    const Tensor& t = *v->constant();
    v->set_constant(Tensor::Borrow(t.dtype(), t.dims(), nullptr, nullptr));
    v->set_provenance(std::move(provenance));
  }
  engine.header.weights_stripped = true;
  return OkStatus();
}

StatusOr<std::vector<std::byte>> SerializeEngine(const EngineDesc& engine,
                                                 const SerializeOptions& options) {
  std::vector<std::byte> out(kEnginePreambleBytes, std::byte{0});
  KILN_ASSIGN_OR_RETURN(EnginePreamble p,
                        EmitEnginePayload(
                            engine, options, [&out](uint64_t total) { out.reserve(total); },
                            [&out](std::span<const std::byte> piece) {
                              out.insert(out.end(), piece.begin(), piece.end());
                              return OkStatus();
                            }));
  WriteEnginePreamble(p, out);
  SealEnginePreamble(out, p.checksum);
  return out;
}

Status WriteEngineFile(const EngineDesc& engine, const std::string& path, bool replaces_input,
                       const SerializeOptions& serialize) {
  AtomicOutput::Options options;
  options.replaces_input = replaces_input;
  KILN_ASSIGN_OR_RETURN(AtomicOutput out, AtomicOutput::Create(path, "engine", options));
  // Everything is written where it belongs: the payload as it is serialized (no in-memory copy of
  // the weights), then the preamble, which holds the checksum, at offset 0.
  uint64_t offset = kEnginePreambleBytes;
  KILN_ASSIGN_OR_RETURN(EnginePreamble pre, EmitEnginePayload(
                                                engine, serialize, [](uint64_t) {},
                                                [&](std::span<const std::byte> piece) {
                                                  KILN_RETURN_IF_ERROR(out.WriteAt(piece, offset));
                                                  offset += piece.size();
                                                  return OkStatus();
                                                }));
  std::array<std::byte, kEnginePreambleBytes> head{};
  WriteEnginePreamble(pre, head);
  SealEnginePreamble(head, pre.checksum);
  KILN_RETURN_IF_ERROR(out.WriteAt(head, 0));
  return out.Commit();  // the destructor removes the temporary on every error above
}

// ---------------------------------------------------------------------------------------------
// Preamble

StatusOr<EnginePreamble> ReadEnginePreamble(std::span<const std::byte> file) {
  const size_t magic_have = std::min(file.size(), kEngineMagic.size());
  if (std::memcmp(file.data(), kEngineMagic.data(), magic_have) != 0 || file.empty()) {
    return MakeError(ErrorCode::kEngineNotKiln,
                     "the data does not start with the engine magic \"KILN\" ({} bytes given)",
                     file.size());
  }
  if (file.size() < kEnginePreambleBytes) {
    return MakeError(ErrorCode::kEngineTruncated,
                     "the file has {} bytes; an engine's preamble alone has {}", file.size(),
                     kEnginePreambleBytes);
  }
  const std::byte* d = file.data();
  EnginePreamble p;
  p.format_version = GetLe<uint32_t>(d + 4);
  p.preamble_bytes = GetLe<uint32_t>(d + 8);
  p.flags = GetLe<uint32_t>(d + 12);
  p.payload_bytes = GetLe<uint64_t>(d + 16);
  p.flatbuffer_bytes = GetLe<uint64_t>(d + 24);
  p.checksum.high = GetLe<uint64_t>(d + 32);
  p.checksum.low = GetLe<uint64_t>(d + 40);
  const char* v = reinterpret_cast<const char*>(d + 48);
  p.kiln_version.assign(v, strnlen(v, 16));
  return p;
}

void WriteEnginePreamble(const EnginePreamble& p, std::span<std::byte> out) {
  std::byte* d = out.data();
  std::memset(d, 0, kEnginePreambleBytes);
  std::memcpy(d, kEngineMagic.data(), kEngineMagic.size());
  PutLe<uint32_t>(d + 4, p.format_version);
  PutLe<uint32_t>(d + 8, p.preamble_bytes);
  PutLe<uint32_t>(d + 12, p.flags);
  PutLe<uint64_t>(d + 16, p.payload_bytes);
  PutLe<uint64_t>(d + 24, p.flatbuffer_bytes);
  PutLe<uint64_t>(d + 32, p.checksum.high);
  PutLe<uint64_t>(d + 40, p.checksum.low);
  std::memcpy(d + 48, p.kiln_version.data(), std::min<size_t>(p.kiln_version.size(), 15));
}

Hash128 EngineChecksum(std::span<const std::byte> preamble, const Hash128& payload_hash) {
  const auto head = preamble.first(kEnginePreambleBytes);
  std::array<std::byte, 16> payload{};
  PutLe<uint64_t>(payload.data(), payload_hash.high);
  PutLe<uint64_t>(payload.data() + 8, payload_hash.low);
  Hasher h;
  h.Update(head.first(32));
  h.Update(head.subspan(48));
  h.Update(payload);
  return h.Digest();
}

void SealEnginePreamble(std::span<std::byte> preamble, const Hash128& payload_hash) {
  const Hash128 c = EngineChecksum(preamble, payload_hash);
  PutLe<uint64_t>(preamble.data() + 32, c.high);
  PutLe<uint64_t>(preamble.data() + 40, c.low);
}

Status CheckEngineTarget(const EngineHeader& header, BackendKind backend, std::string_view arch) {
  if (header.backend != backend || header.device_arch != arch) {
    return MakeError(ErrorCode::kEngineTargetMismatch,
                     "the engine was built for backend '{}' on arch '{}'; this process runs "
                     "backend '{}' on arch '{}'",
                     ToString(header.backend), header.device_arch, ToString(backend), arch);
  }
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Verified loading

namespace {

std::string Str(const flatbuffers::String* s) { return s ? s->str() : std::string(); }

// Copies a verified scalar vector. The FlatBuffers verifier checks only 4-byte alignment of a
// vector, so a crafted file can misalign 8-byte elements: copy bytes instead of loading T.
// (Little-endian host, as FlatBuffers' own format is.)
template <typename T>
std::vector<T> Vec(const flatbuffers::Vector<T>* v) {
  if (!v || v->size() == 0) return {};
  std::vector<T> out(v->size());
  std::memcpy(out.data(), v->Data(), v->size() * sizeof(T));
  return out;
}

// A Dim from its terms, accepted only in the canonical form Dim itself produces (sorted
// monomials, unique, non-zero coefficients), so rebuilding it never adds two coefficients.
StatusOr<Dim> ReadDim(const fb::Dim* d, const std::string& where) {
  if (!d) return Malformed("{}: a dim is missing", where);
  Dim out;
  std::vector<std::string> prev;
  bool first = true;
  if (!d->terms()) return out;  // the dim 0
  for (const fb::DimTerm* t : *d->terms()) {
    if (!t) return Malformed("{}: a dim term is missing", where);
    if (t->coeff() == 0 || t->coeff() > kMaxCoeff || t->coeff() < -kMaxCoeff) {
      return Malformed("{}: dim coefficient {} is outside [-2^32, 2^32] or zero", where,
                       t->coeff());
    }
    std::vector<std::string> mono;
    if (t->symbols()) {
      for (const flatbuffers::String* s : *t->symbols()) {
        if (!s || s->size() == 0) return Malformed("{}: a dim symbol is empty", where);
        mono.push_back(s->str());
      }
    }
    if (mono.size() > kMaxDegree) {
      return Malformed("{}: a dim term has degree {} (at most {})", where, mono.size(), kMaxDegree);
    }
    if (!std::is_sorted(mono.begin(), mono.end()) || (!first && !(prev < mono))) {
      return Malformed("{}: dim terms are not in canonical order", where);
    }
    Dim term(t->coeff());
    for (const std::string& s : mono) term = term * Dim::Symbol(s);
    out = out + term;
    prev = std::move(mono);
    first = false;
  }
  if (auto v = out.static_value(); v && *v < 0) {
    return Malformed("{}: dimension {} is negative", where, *v);
  }
  return out;
}

StatusOr<Shape> ReadShape(const flatbuffers::Vector<flatbuffers::Offset<fb::Dim>>* dims,
                          const std::string& where) {
  Shape shape;
  if (!dims) return shape;
  if (dims->size() > kMaxRank)
    return Malformed("{}: rank {} exceeds {}", where, dims->size(), kMaxRank);
  for (const fb::Dim* d : *dims) {
    KILN_ASSIGN_OR_RETURN(Dim dim, ReadDim(d, where));
    shape.push_back(std::move(dim));
  }
  return shape;
}

// A tensor stored inside the FlatBuffer: a kiln dtype and exactly the bytes its dims need.
StatusOr<Tensor> ReadInlineTensor(const fb::InlineTensor* t, const std::string& where) {
  if (!t) return Malformed("{} has no tensor", where);
  if (!ValidDataType(t->dtype())) {
    return Malformed("{}: dtype {} is not a kiln dtype", where, t->dtype());
  }
  std::vector<int64_t> dims = Vec(t->dims());
  auto dtype = static_cast<DataType>(t->dtype());
  auto bytes = DenseBytes(dtype, dims);
  const size_t have = t->data() ? t->data()->size() : 0;
  if (!bytes || *bytes != have) {
    return Malformed("{}: {} data bytes for dims of {} bytes", where, have,
                     bytes ? fmt::format("{}", *bytes) : std::string("invalid"));
  }
  return Tensor::FromBytes(dtype, std::move(dims),
                           std::as_bytes(std::span(t->data() ? t->data()->data() : nullptr, have)));
}

StatusOr<Attribute> ReadAttribute(const fb::Attribute* a, const std::string& where) {
  switch (static_cast<AttributeKind>(a->kind())) {
    case AttributeKind::kInt:
      return Attribute(a->i());
    case AttributeKind::kFloat:
      return Attribute(a->f());
    case AttributeKind::kString:
      return Attribute(Str(a->s()));
    case AttributeKind::kInts:
      return Attribute(Vec(a->ints()));
    case AttributeKind::kFloats:
      return Attribute(Vec(a->floats()));
    case AttributeKind::kStrings: {
      std::vector<std::string> out;
      if (a->strings()) {
        for (const flatbuffers::String* s : *a->strings()) out.push_back(Str(s));
      }
      return Attribute(std::move(out));
    }
    case AttributeKind::kTensor: {
      KILN_ASSIGN_OR_RETURN(Tensor t, ReadInlineTensor(a->t(), where + ": tensor attribute"));
      return Attribute(std::move(t));
    }
  }
  return Malformed("{}: attribute kind {} is unknown", where, a->kind());
}

// The verifier, one function per section of the file, in file order: preamble (length, checksum,
// format), the FlatBuffer's structure, the header, the graph (values, inputs, constants, nodes,
// then the Graph built from them, then its outputs), layers, profile, memory plan and weight
// program. Each checks every field of its section before anything is built from it; the first
// error stops the load.

// 1. Length: the payload must be exactly what the preamble announces.
Status VerifyLength(const EnginePreamble& pre, size_t size) {
  if (pre.preamble_bytes < kEnginePreambleBytes || pre.preamble_bytes > size ||
      size - pre.preamble_bytes < pre.payload_bytes) {
    return MakeError(ErrorCode::kEngineTruncated,
                     "the file has {} bytes; its preamble announces {} + {} bytes", size,
                     pre.preamble_bytes, pre.payload_bytes);
  }
  if (size - pre.preamble_bytes > pre.payload_bytes) {
    return Malformed("the file has {} bytes after the announced {} + {}",
                     size - pre.preamble_bytes - pre.payload_bytes, pre.preamble_bytes,
                     pre.payload_bytes);
  }
  return OkStatus();
}

// 2. Checksum: from format 2 on, of every byte but its own; format 1 covered the payload only
// (and is refused as too old once its checksum holds).
Status VerifyChecksum(std::span<const std::byte> file, const EnginePreamble& pre) {
  const Hash128 payload_hash = HashBytes(file.subspan(pre.preamble_bytes, pre.payload_bytes));
  if (pre.format_version == 1) {
    if (!(payload_hash == pre.checksum)) {
      return MakeError(ErrorCode::kEngineChecksum,
                       "the file says format version 1, but its payload checksum is {} and the "
                       "preamble records {}",
                       payload_hash.Hex(), pre.checksum.Hex());
    }
    return MakeError(ErrorCode::kEngineVersionTooOld,
                     "the engine has format version 1 (written by kiln {}), whose checksum left "
                     "the preamble unprotected; this kiln {} reads format version {}: rebuild "
                     "the engine",
                     pre.kiln_version, KilnVersion(), kEngineFormatVersion);
  }
  if (const Hash128 actual = EngineChecksum(file, payload_hash); !(actual == pre.checksum)) {
    return MakeError(ErrorCode::kEngineChecksum,
                     "checksum of the preamble and payload is {} but the preamble records {}",
                     actual.Hex(), pre.checksum.Hex());
  }
  return OkStatus();
}

// 3. Version and the preamble's layout fields; returns where the weights section starts.
StatusOr<uint64_t> VerifyFormat(const EnginePreamble& pre, size_t size) {
  if (pre.format_version > kEngineFormatVersion) {
    return MakeError(ErrorCode::kEngineVersionTooNew,
                     "the engine has format version {} (written by kiln {}); this kiln {} reads "
                     "format versions up to {}: use kiln {} or newer",
                     pre.format_version, pre.kiln_version, KilnVersion(), kEngineFormatVersion,
                     pre.kiln_version);
  }
  if (pre.format_version == 0) return Malformed("format version 0 does not exist");
  if (pre.preamble_bytes != kEnginePreambleBytes || (pre.flags & ~kEngineKnownFlags) != 0) {
    return Malformed(
        "preamble of {} bytes with flags {:#x}; format {} has {} bytes and flags within {:#x}",
        pre.preamble_bytes, pre.flags, pre.format_version, kEnginePreambleBytes, kEngineKnownFlags);
  }
  if (pre.flatbuffer_bytes > pre.payload_bytes) {
    return Malformed("FlatBuffer of {} bytes is larger than the payload ({} bytes)",
                     pre.flatbuffer_bytes, pre.payload_bytes);
  }
  const uint64_t weights_start = Align(kEnginePreambleBytes + pre.flatbuffer_bytes);
  if (weights_start > size) {
    return Malformed("weights section would start at {} past the end ({})", weights_start, size);
  }
  return weights_start;
}

// 4. The FlatBuffer's own structure.
StatusOr<const fb::Engine*> VerifyFlatBuffer(const std::byte* data, const EnginePreamble& pre) {
  const auto* fb_data = reinterpret_cast<const uint8_t*>(data + kEnginePreambleBytes);
  flatbuffers::Verifier verifier(fb_data, pre.flatbuffer_bytes, /*max_depth=*/64,
                                 /*max_tables=*/1 << 24);
  if (pre.flatbuffer_bytes > FLATBUFFERS_MAX_BUFFER_SIZE || !fb::VerifyEngineBuffer(verifier)) {
    return Malformed("the FlatBuffer ({} bytes) fails verification", pre.flatbuffer_bytes);
  }
  return fb::GetEngine(fb_data);
}

// 5. The header table, and the target the caller expects (LoadOptions).
StatusOr<EngineHeader> ReadHeader(const fb::Engine& e, const EnginePreamble& pre,
                                  const LoadOptions& options) {
  const fb::Header* h = e.header();
  if (!h) return Malformed("the header table is missing");
  if (h->format_version() != pre.format_version) {
    return Malformed("header format version {} differs from the preamble's {}", h->format_version(),
                     pre.format_version);
  }
  if (h->backend() > static_cast<uint8_t>(BackendKind::kCuda)) {
    return Malformed("header.backend {} is not a kiln backend", h->backend());
  }
  EngineHeader header;
  header.format_version = h->format_version();
  header.kiln_version = Str(h->kiln_version());
  header.backend = static_cast<BackendKind>(h->backend());
  header.device_arch = Str(h->device_arch());
  header.library_versions = Str(h->library_versions());
  header.model_hash = Str(h->model_hash());
  header.config_hash = Str(h->config_hash());
  header.model_name = Str(h->model_name());
  header.weights_stripped = h->weights_stripped();
  if (header.weights_stripped != ((pre.flags & kEngineFlagWeightsStripped) != 0)) {
    return Malformed("header.weights_stripped is {} but the preamble's flags are {:#x}",
                     header.weights_stripped, pre.flags);
  }
  if (options.expected_backend || options.expected_arch) {
    KILN_RETURN_IF_ERROR(
        CheckEngineTarget(header, options.expected_backend.value_or(header.backend),
                          options.expected_arch ? std::string_view(*options.expected_arch)
                                                : std::string_view(header.device_arch)));
  }
  return header;
}

// A constant's place in the weights section, checked against it.
struct ConstRef {
  DataType dtype;
  std::vector<int64_t> dims;
  uint64_t offset, length;
  bool absent = false;  // a stripped engine's: no bytes in the file
};

// What the graph section's checks learn about its values, for building the Graph from them.
enum class ValueRole : int8_t { kNone, kInput, kConstant, kNodeOutput };
struct GraphSection {
  const fb::GraphDesc* g = nullptr;
  const flatbuffers::Vector<flatbuffers::Offset<fb::ValueDesc>>* values = nullptr;
  int32_t num_values = 0;
  std::vector<ValueRole> role;
  std::vector<int32_t> inputs;
  std::unordered_map<int32_t, ConstRef> constants;

  const fb::ValueDesc* value(int32_t i) const { return values->Get(i); }
  std::string name(int32_t i) const { return value(i)->name()->str(); }
  // A value index the file gives: in range, or -1 where an optional input/output is omitted.
  bool index_ok(int32_t i, bool allow_omitted) const {
    return (allow_omitted && i == -1) || (i >= 0 && i < num_values);
  }
};

// 6a. Values: each named, once, with a kiln dtype (0: not inferred).
Status VerifyValues(GraphSection& gs) {
  if (!gs.g || !gs.g->values()) return Malformed("the graph table or its values are missing");
  gs.values = gs.g->values();
  gs.num_values = static_cast<int32_t>(gs.values->size());
  std::unordered_set<std::string> names;
  for (int32_t i = 0; i < gs.num_values; ++i) {
    const fb::ValueDesc* v = gs.value(i);
    if (!v || !v->name() || v->name()->size() == 0)
      return Malformed("graph.values[{}] has no name", i);
    if (!names.insert(v->name()->str()).second) {
      return Malformed("graph.values[{}]: name '{}' is used twice", i, v->name()->str());
    }
    if (v->dtype() != 0 && !ValidDataType(v->dtype())) {
      return Malformed("graph.values[{}] ('{}'): dtype {} is not a kiln dtype", i, v->name()->str(),
                       v->dtype());
    }
  }
  gs.role.assign(gs.num_values, ValueRole::kNone);
  return OkStatus();
}

// 6b. Graph inputs: in range, once each, typed.
Status VerifyInputs(GraphSection& gs) {
  gs.inputs = Vec(gs.g->inputs());
  for (int32_t i : gs.inputs) {
    if (!gs.index_ok(i, false)) return Malformed("graph.inputs: value index {} is out of range", i);
    if (gs.role[i] != ValueRole::kNone) {
      return Malformed("graph.inputs: value index {} is listed twice", i);
    }
    if (gs.value(i)->dtype() == 0) return Malformed("graph input '{}' has no dtype", gs.name(i));
    gs.role[i] = ValueRole::kInput;
  }
  return OkStatus();
}

// 6c. Constants: each a value not yet defined, dense bytes matching its dims, at an aligned range
// inside the weights section; or, in a stripped engine only, absent (offset 0: no range).
Status VerifyConstants(GraphSection& gs, uint64_t weights_size, bool stripped) {
  if (!gs.g->constants()) return OkStatus();
  for (size_t k = 0; k < gs.g->constants()->size(); ++k) {
    const fb::ConstantDesc* c = gs.g->constants()->Get(k);
    if (!gs.index_ok(c->value(), false)) {
      return Malformed("graph.constants[{}]: value index {} is out of range", k, c->value());
    }
    if (gs.role[c->value()] != ValueRole::kNone) {
      return Malformed("graph.constants[{}]: value '{}' is already an input or constant", k,
                       gs.name(c->value()));
    }
    gs.role[c->value()] = ValueRole::kConstant;
    if (!ValidDataType(c->dtype()) || c->dtype() != gs.value(c->value())->dtype()) {
      return Malformed(
          "graph.constants[{}] ('{}'): dtype {} is invalid or differs from the value's", k,
          gs.name(c->value()), c->dtype());
    }
    ConstRef ref{static_cast<DataType>(c->dtype()), Vec(c->dims()), c->offset(), c->length(),
                 c->absent()};
    auto bytes = DenseBytes(ref.dtype, ref.dims);
    if (!bytes || *bytes != ref.length) {
      return Malformed("graph.constants[{}] ('{}'): length {} does not match its dims ({})", k,
                       gs.name(c->value()), ref.length,
                       bytes ? fmt::format("{} bytes", *bytes) : std::string("invalid"));
    }
    if (ref.absent) {
      if (!stripped || ref.offset != 0) {
        return Malformed(
            "graph.constants[{}] ('{}') is absent (offset {}) in an engine that {} stripped", k,
            gs.name(c->value()), ref.offset, stripped ? "is" : "is not");
      }
      gs.constants.emplace(c->value(), std::move(ref));
      continue;
    }
    if (ref.offset % kEngineWeightsAlignment != 0 || ref.offset > weights_size ||
        ref.length > weights_size - ref.offset) {
      return Malformed(
          "graph.constants[{}] ('{}'): bytes [{}, +{}) are not an aligned range of "
          "the {}-byte weights section",
          k, gs.name(c->value()), ref.offset, ref.length, weights_size);
    }
    gs.constants.emplace(c->value(), std::move(ref));
  }
  return OkStatus();
}

// 6d. Nodes: a known op with an arity that fits it, value indices in range, each output defined
// once, attributes named once with a known kind.
Status VerifyNodes(GraphSection& gs) {
  if (!gs.g->nodes()) return Malformed("graph.nodes is missing");
  const auto& fnodes = *gs.g->nodes();
  for (size_t n = 0; n < fnodes.size(); ++n) {
    const fb::NodeDesc* node = fnodes[n];
    const std::string where = fmt::format("graph.nodes[{}] ('{}')", n, Str(node->name()));
    const OpSchema* schema = FindOpSchema(Str(node->op_type()));
    if (!schema) {
      return Malformed("{}: op type '{}' is unknown to this kiln", where, Str(node->op_type()));
    }
    std::vector<int32_t> ins = Vec(node->inputs()), outs = Vec(node->outputs());
    if (static_cast<int>(ins.size()) > schema->max_inputs ||
        static_cast<int>(outs.size()) < schema->min_outputs ||
        static_cast<int>(outs.size()) > schema->max_outputs) {
      return Malformed("{}: {} inputs and {} outputs do not fit {}", where, ins.size(), outs.size(),
                       schema->name);
    }
    for (int32_t i : ins) {
      if (!gs.index_ok(i, true))
        return Malformed("{}: input value index {} is out of range", where, i);
    }
    for (int32_t i : outs) {
      if (!gs.index_ok(i, true))
        return Malformed("{}: output value index {} is out of range", where, i);
      if (i >= 0 && gs.role[i] != ValueRole::kNone) {
        return Malformed("{}: output '{}' is already defined (input, constant or another node)",
                         where, gs.name(i));
      }
      if (i >= 0) gs.role[i] = ValueRole::kNodeOutput;
    }
    if (node->attributes()) {
      std::set<std::string> seen;
      for (const fb::Attribute* a : *node->attributes()) {
        if (!a->name() || a->name()->size() == 0 || !seen.insert(a->name()->str()).second) {
          return Malformed("{}: an attribute name is empty or repeated", where);
        }
        if (a->kind() > static_cast<uint8_t>(AttributeKind::kTensor)) {
          return Malformed("{}: attribute '{}' has unknown kind {}", where, a->name()->str(),
                           a->kind());
        }
      }
    }
  }
  return OkStatus();
}

// The Graph built from a checked graph section.
struct BuiltGraph {
  std::unique_ptr<Graph> graph;
  std::vector<Value*> values;  // by file index
  std::vector<Node*> nodes;    // by file index
};

// 6e. Builds the graph (inputs first, in order; then the other values in file order; then the
// nodes), with constants borrowing the weights section; then marks and checks its outputs and
// verifies the whole graph.
StatusOr<BuiltGraph> BuildGraph(const GraphSection& gs, const std::byte* weights,
                                const std::shared_ptr<const void>& keepalive) {
  BuiltGraph out;
  out.graph = std::make_unique<Graph>();
  Graph& graph = *out.graph;
  graph.set_name(Str(gs.g->name()));
  graph.set_opset(gs.g->opset());
  if (gs.g->data_dependent()) {
    for (const fb::DataDependentDim* d : *gs.g->data_dependent()) {
      if (!d || !d->symbol() || !IsDataDependentSymbol(d->symbol()->str())) {
        return Malformed("graph.data_dependent: an entry has no data-dependent symbol");
      }
      KILN_ASSIGN_OR_RETURN(Dim bound,
                            ReadDim(d->bound(), "data-dependent dim '" + d->symbol()->str() + "'"));
      graph.SetDataDependentBound(d->symbol()->str(), std::move(bound));
    }
  }
  std::vector<Value*>& vptr = out.values;
  vptr.assign(gs.num_values, nullptr);
  for (int32_t i : gs.inputs) {
    const fb::ValueDesc* v = gs.value(i);
    KILN_ASSIGN_OR_RETURN(Shape shape, ReadShape(v->shape(), "input '" + v->name()->str() + "'"));
    vptr[i] = graph.AddInput(v->name()->str(), static_cast<DataType>(v->dtype()), std::move(shape));
  }
  for (int32_t i = 0; i < gs.num_values; ++i) {
    if (vptr[i]) continue;
    const fb::ValueDesc* v = gs.value(i);
    if (auto c = gs.constants.find(i); c != gs.constants.end()) {
      const ConstRef& ref = c->second;
      // An absent constant has dtype and dims only (no bytes: the runtime refuses the engine).
      vptr[i] = graph.AddConstant(
          v->name()->str(),
          ref.absent ? Tensor::Borrow(ref.dtype, ref.dims, nullptr, nullptr)
                     : Tensor::Borrow(ref.dtype, ref.dims, weights + ref.offset, keepalive));
      continue;
    }
    vptr[i] = graph.AddValue(v->name()->str(), static_cast<DataType>(v->dtype()));
    if (v->has_shape()) {
      KILN_ASSIGN_OR_RETURN(Shape shape, ReadShape(v->shape(), "value '" + v->name()->str() + "'"));
      vptr[i]->set_shape(std::move(shape));
    }
  }
  const auto& fnodes = *gs.g->nodes();
  for (size_t n = 0; n < fnodes.size(); ++n) {
    const fb::NodeDesc* node = fnodes[n];
    std::vector<Value*> ins, outs;
    for (int32_t i : Vec(node->inputs())) ins.push_back(i < 0 ? nullptr : vptr[i]);
    for (int32_t i : Vec(node->outputs())) outs.push_back(i < 0 ? nullptr : vptr[i]);
    AttributeMap attrs;
    if (node->attributes()) {
      for (const fb::Attribute* a : *node->attributes()) {
        KILN_ASSIGN_OR_RETURN(
            Attribute attr,
            ReadAttribute(a, fmt::format("graph.nodes[{}] attribute '{}'", n, a->name()->str())));
        attrs.Set(a->name()->str(), std::move(attr));
      }
    }
    out.nodes.push_back(graph.AddNode(Str(node->op_type()), Str(node->name()), std::move(ins),
                                      std::move(outs), std::move(attrs), Str(node->domain())));
  }
  std::vector<bool> is_output(gs.num_values, false);
  for (int32_t i : Vec(gs.g->outputs())) {
    if (!gs.index_ok(i, false)) {
      return Malformed("graph.outputs: value index {} is out of range", i);
    }
    if (is_output[i]) return Malformed("graph.outputs: value index {} is listed twice", i);
    if (gs.role[i] == ValueRole::kNone) {
      return Malformed("graph output '{}' is defined by nothing", gs.name(i));
    }
    is_output[i] = true;
    graph.MarkOutput(vptr[i]);
  }
  if (Status s = Verify(graph); !s.ok()) return Malformed("the graph is invalid: {}", s.message());
  return out;
}

// 7. Layers: each node exactly once, in an order where every input exists before it is read,
// with a provider this kiln has (when the caller asks).
StatusOr<std::vector<LayerDesc>> ReadLayers(const fb::Engine& e, const GraphSection& gs,
                                            const BuiltGraph& built, BackendKind backend,
                                            const LoadOptions& options) {
  const size_t num_nodes = built.nodes.size();
  std::vector<bool> ready(gs.num_values, false), covered(num_nodes, false);
  for (int32_t i = 0; i < gs.num_values; ++i) {
    ready[i] = gs.role[i] == ValueRole::kInput || gs.role[i] == ValueRole::kConstant;
  }
  std::unordered_map<const Value*, int32_t> vindex;
  for (int32_t i = 0; i < gs.num_values; ++i) vindex[built.values[i]] = i;
  std::vector<LayerDesc> layers;
  const size_t nl = e.layers() ? e.layers()->size() : 0;
  for (size_t l = 0; l < nl; ++l) {
    const fb::Layer* layer = e.layers()->Get(l);
    if (layer->node() < 0 || static_cast<size_t>(layer->node()) >= num_nodes) {
      return Malformed("layers[{}]: node index {} is out of range", l, layer->node());
    }
    if (covered[layer->node()]) {
      return Malformed("layers[{}]: node {} already has a layer", l, layer->node());
    }
    covered[layer->node()] = true;
    Node* node = built.nodes[layer->node()];
    for (Value* in : node->inputs()) {
      if (in && !ready[vindex[in]]) {
        return Malformed("layers[{}] ('{}') reads '{}' before any earlier layer produces it", l,
                         node->name(), in->name());
      }
    }
    for (Value* out : node->outputs()) {
      if (out) ready[vindex[out]] = true;
    }
    LayerDesc desc;
    desc.node = node;
    desc.provider_id = Str(layer->provider_id());
    if (const fb::Tactic* t = layer->tactic()) {
      desc.tactic.name = Str(t->name());
      desc.tactic.params = Vec(t->params());
      desc.tactic.workspace_bytes = t->workspace_bytes();
    }
    desc.measured_ms = layer->measured_ms();
    desc.precision_reason = Str(layer->precision_reason());
    if (options.check_providers) {
      const KernelProvider* p = KernelRegistry::Get().Find(backend, desc.provider_id);
      if (!p || p->op_type() != node->op_type()) {
        return Malformed(
            "layers[{}] ('{}', {}): provider '{}' is not registered for backend '{}' "
            "and op {} in this kiln",
            l, node->name(), node->op_type(), desc.provider_id, ToString(backend), node->op_type());
      }
    }
    layers.push_back(std::move(desc));
  }
  for (size_t n = 0; n < num_nodes; ++n) {
    if (!covered[n])
      return Malformed("graph.nodes[{}] ('{}') has no layer", n, built.nodes[n]->name());
  }
  return layers;
}

// 8. Profile: graph inputs, once each, ranks matching, min <= opt <= max; every dynamic input
// has one.
StatusOr<OptimizationProfile> ReadProfile(const fb::Engine& e, const Graph& graph) {
  OptimizationProfile profile;
  if (e.profile()) {
    for (size_t k = 0; k < e.profile()->size(); ++k) {
      const fb::InputProfile* p = e.profile()->Get(k);
      InputProfile ip{Str(p->input()), Vec(p->min()), Vec(p->opt()), Vec(p->max())};
      const Value* in = graph.FindValue(ip.input);
      if (!in || !in->is_graph_input() || profile.Find(ip.input)) {
        return Malformed("profile[{}]: '{}' is not a graph input or is listed twice", k, ip.input);
      }
      const size_t rank = in->shape().size();
      if (ip.min.size() != rank || ip.opt.size() != rank || ip.max.size() != rank) {
        return Malformed("profile[{}] ('{}'): ranks differ from the input's rank {}", k, ip.input,
                         rank);
      }
      for (size_t d = 0; d < rank; ++d) {
        if (ip.min[d] < 0 || ip.min[d] > ip.opt[d] || ip.opt[d] > ip.max[d]) {
          return Malformed("profile[{}] ('{}'): dimension {} has min/opt/max {}/{}/{}", k, ip.input,
                           d, ip.min[d], ip.opt[d], ip.max[d]);
        }
      }
      profile.inputs.push_back(std::move(ip));
    }
  }
  if (e.shape_values()) {
    for (size_t k = 0; k < e.shape_values()->size(); ++k) {
      const fb::ShapeInputValues* p = e.shape_values()->Get(k);
      ShapeInputValues sv{Str(p->input()), Vec(p->values()), Vec(p->float_values())};
      const Value* in = graph.FindValue(sv.input);
      if (!in || !in->is_graph_input() || profile.FindShapeValues(sv.input)) {
        return Malformed("shape_values[{}]: '{}' is not a graph input or is listed twice", k,
                         sv.input);
      }
      auto dims = StaticDims(in->shape());
      if (!dims || !ShapeValuesFit(sv, in->dtype(), *dims)) {
        return Malformed(
            "shape_values[{}] ('{}'): {} integer and {} float values for an input of type {} and "
            "shape {}",
            k, sv.input, sv.values.size(), sv.float_values.size(), ToString(in->dtype()),
            ToString(in->shape()));
      }
      profile.shape_values.push_back(std::move(sv));
    }
  }
  for (const Value* in : graph.inputs()) {
    if (!IsStatic(in->shape()) && !profile.Find(in->name())) {
      return Malformed("graph input '{}' has dynamic shape {} but no profile", in->name(),
                       ToString(in->shape()));
    }
  }
  return profile;
}

// 9. Memory plan: offsets only for intermediate values, aligned, inside the arena; every
// intermediate has one.
StatusOr<MemoryPlan> ReadMemoryPlan(const fb::Engine& e, const Graph& graph) {
  MemoryPlan plan;
  if (const fb::MemoryPlan* p = e.plan()) {
    plan.arena_bytes = p->arena_bytes();
    plan.workspace_bytes = p->workspace_bytes();
    plan.weights_bytes = p->weights_bytes();
    plan.peak_bytes = p->peak_bytes();
    plan.shape_arena_bytes = p->shape_arena_bytes();
    if (plan.arena_bytes < 0 || plan.workspace_bytes < 0 || plan.weights_bytes < 0 ||
        plan.peak_bytes < 0 || plan.shape_arena_bytes < 0) {
      return Malformed("plan: a byte count is negative");
    }
    if (p->offsets()) {
      for (const fb::PlanOffset* o : *p->offsets()) {
        std::string name = Str(o->value());
        const Value* v = graph.FindValue(name);
        if (!v || v->is_graph_input() || v->is_graph_output() || v->is_constant() ||
            plan.offsets.count(name)) {
          return Malformed("plan: '{}' is not an intermediate value or is listed twice", name);
        }
        if (o->offset() % static_cast<int64_t>(kEngineWeightsAlignment) != 0) {
          return Malformed("plan: offset {} of '{}' is not {}-byte aligned", o->offset(), name,
                           kEngineWeightsAlignment);
        }
        if (o->offset() < 0 || o->offset() > plan.arena_bytes) {
          return Malformed("plan: offset {} of '{}' lies outside the {}-byte arena", o->offset(),
                           name, plan.arena_bytes);
        }
        plan.offsets[name] = o->offset();
      }
    }
  }
  for (const Value* v : graph.values()) {
    if (v->producer() && !v->is_graph_output() && !plan.offsets.count(v->name())) {
      return Malformed("plan: intermediate value '{}' has no arena offset", v->name());
    }
  }
  return plan;
}

// 10. Weight program (absent: not refittable): sources named once with a kiln dtype and valid
// dims; literals dense; each step an op (an ONNX op this kiln knows, or a weight op) reading only
// earlier slots; targets and non-refittable entries constants of the graph, each once; fixed
// initializers named once with a hash.
StatusOr<WeightProgram> ReadWeightProgram(const fb::Engine& e, const GraphSection& gs) {
  WeightProgram p;
  const fb::WeightProgram* w = e.weight_program();
  if (!w) return p;
  p.recorded = true;
  std::set<std::string> initializers;
  auto read_dims = [](const flatbuffers::Vector<int64_t>* v, const std::string& where,
                      DataType dtype) -> StatusOr<std::vector<int64_t>> {
    std::vector<int64_t> dims = Vec(v);
    if (!DenseBytes(dtype, dims)) return Malformed("{}: dims are invalid", where);
    return dims;
  };
  if (w->sources()) {
    for (size_t i = 0; i < w->sources()->size(); ++i) {
      const fb::WeightSource* src = w->sources()->Get(i);
      const std::string where = fmt::format("weight_program.sources[{}]", i);
      if (!src->name() || src->name()->size() == 0 ||
          !initializers.insert(Str(src->name())).second) {
        return Malformed("{}: the name is empty or repeated", where);
      }
      if (!ValidDataType(src->dtype()))
        return Malformed("{}: dtype {} is invalid", where, src->dtype());
      auto dtype = static_cast<DataType>(src->dtype());
      KILN_ASSIGN_OR_RETURN(auto dims, read_dims(src->dims(), where, dtype));
      p.sources.push_back({Str(src->name()), dtype, std::move(dims)});
    }
  }
  if (w->literals()) {
    for (size_t i = 0; i < w->literals()->size(); ++i) {
      KILN_ASSIGN_OR_RETURN(
          Tensor t,
          ReadInlineTensor(w->literals()->Get(i), fmt::format("weight_program.literals[{}]", i)));
      p.literals.push_back(std::move(t));
    }
  }
  int64_t slots = static_cast<int64_t>(p.sources.size() + p.literals.size());
  constexpr int32_t kMaxStepOutputs = 64;
  if (w->steps()) {
    for (size_t i = 0; i < w->steps()->size(); ++i) {
      const fb::WeightStep* step = w->steps()->Get(i);
      const std::string where = fmt::format("weight_program.steps[{}]", i);
      WeightProgram::Step out;
      out.op_type = Str(step->op_type());
      out.domain = Str(step->domain());
      if (out.domain != kWeightOpDomain && (!out.domain.empty() || !FindOpSchema(out.op_type))) {
        return Malformed("{}: op '{}' (domain '{}') is unknown to this kiln", where, out.op_type,
                         out.domain);
      }
      if (out.domain == kWeightOpDomain && out.op_type.empty()) {
        return Malformed("{}: the weight op has no name", where);
      }
      out.num_outputs = step->num_outputs();
      if (out.num_outputs < 1 || out.num_outputs > kMaxStepOutputs) {
        return Malformed("{}: {} outputs", where, out.num_outputs);
      }
      out.inputs = Vec(step->inputs());
      for (int32_t in : out.inputs) {
        if (in < -1 || in >= slots)
          return Malformed("{}: input slot {} is not an earlier slot", where, in);
      }
      if (step->attributes()) {
        for (const fb::Attribute* a : *step->attributes()) {
          if (!a->name() || a->name()->size() == 0 || out.attrs.Has(a->name()->str())) {
            return Malformed("{}: an attribute name is empty or repeated", where);
          }
          KILN_ASSIGN_OR_RETURN(Attribute attr,
                                ReadAttribute(a, where + " attribute '" + a->name()->str() + "'"));
          out.attrs.Set(a->name()->str(), std::move(attr));
        }
      }
      slots += out.num_outputs;
      p.steps.push_back(std::move(out));
    }
  }
  std::set<int32_t> constants;
  auto constant = [&](int32_t value, const std::string& where) -> StatusOr<std::string> {
    if (!gs.index_ok(value, false) || gs.role[value] != ValueRole::kConstant ||
        !constants.insert(value).second) {
      return Malformed("{}: value {} is not a constant of the graph, or is named twice", where,
                       value);
    }
    return gs.name(value);
  };
  if (w->targets()) {
    for (size_t i = 0; i < w->targets()->size(); ++i) {
      const fb::WeightTarget* t = w->targets()->Get(i);
      const std::string where = fmt::format("weight_program.targets[{}]", i);
      KILN_ASSIGN_OR_RETURN(std::string name, constant(t->value(), where));
      if (t->slot() < 0 || t->slot() >= slots)
        return Malformed("{}: slot {} is out of range", where, t->slot());
      p.targets.push_back({std::move(name), t->slot()});
    }
  }
  if (w->non_refittable()) {
    for (size_t i = 0; i < w->non_refittable()->size(); ++i) {
      const fb::NonRefittable* n = w->non_refittable()->Get(i);
      KILN_ASSIGN_OR_RETURN(
          std::string name,
          constant(n->value(), fmt::format("weight_program.non_refittable[{}]", i)));
      p.non_refittable.push_back({std::move(name), Str(n->reason())});
    }
  }
  if (w->fixed()) {
    std::set<std::string> fixed_names;
    for (size_t i = 0; i < w->fixed()->size(); ++i) {
      const fb::FixedInitializer* f = w->fixed()->Get(i);
      const std::string where = fmt::format("weight_program.fixed[{}]", i);
      // A fixed initializer may also be a source (an index type the steps read), once.
      std::string name = Str(f->name());
      if (name.empty() || !fixed_names.insert(name).second) {
        return Malformed("{}: the name '{}' is empty or repeated", where, name);
      }
      if (!ValidDataType(f->dtype()))
        return Malformed("{}: dtype {} is invalid", where, f->dtype());
      auto dtype = static_cast<DataType>(f->dtype());
      KILN_ASSIGN_OR_RETURN(auto dims, read_dims(f->dims(), where, dtype));
      if (Str(f->hash()).size() != 32) return Malformed("{}: the hash is not 32 hex digits", where);
      p.fixed.push_back({std::move(name), dtype, std::move(dims), Str(f->hash())});
    }
  }
  return p;
}

// 11. A stripped engine lacks exactly the constants its program makes, and refit can fill it: it
// has a program without non-refittable constants (StripWeights' conditions). A full engine lacks
// nothing (VerifyConstants).
Status VerifyAbsentConstants(const GraphSection& gs, const EngineDesc& engine) {
  if (!engine.header.weights_stripped) return OkStatus();
  const WeightProgram& p = engine.weight_program;
  if (!p.recorded || !p.non_refittable.empty()) {
    return Malformed("the engine is stripped but {}",
                     p.recorded ? "has a non-refittable constant" : "has no weight program");
  }
  std::set<std::string> targets;
  for (const WeightProgram::Target& t : p.targets) targets.insert(t.constant);
  for (int32_t index = 0; index < gs.num_values; ++index) {  // file order: the first is named
    auto c = gs.constants.find(index);
    if (c == gs.constants.end()) continue;
    const ConstRef& ref = c->second;
    if (ref.absent != (targets.count(gs.name(index)) > 0)) {
      return Malformed(
          "constant '{}' is {} but the weight program {} it (a stripped engine lacks "
          "exactly the constants the program makes)",
          gs.name(index), ref.absent ? "absent" : "present",
          ref.absent ? "does not make" : "makes");
    }
  }
  return OkStatus();
}

// The sections above in file order; nothing is built from a field before it is checked.
StatusOr<std::shared_ptr<EngineDesc>> LoadVerified(const std::byte* data, size_t size,
                                                   std::shared_ptr<const void> keepalive,
                                                   const LoadOptions& options) {
  std::span<const std::byte> file(data, size);
  KILN_ASSIGN_OR_RETURN(EnginePreamble pre, ReadEnginePreamble(file));
  KILN_RETURN_IF_ERROR(VerifyLength(pre, size));
  KILN_RETURN_IF_ERROR(VerifyChecksum(file, pre));
  KILN_ASSIGN_OR_RETURN(const uint64_t weights_start, VerifyFormat(pre, size));
  KILN_ASSIGN_OR_RETURN(const fb::Engine* e, VerifyFlatBuffer(data, pre));

  auto engine = std::make_shared<EngineDesc>();
  KILN_ASSIGN_OR_RETURN(engine->header, ReadHeader(*e, pre, options));

  GraphSection gs;
  gs.g = e->graph();
  KILN_RETURN_IF_ERROR(VerifyValues(gs));
  KILN_RETURN_IF_ERROR(VerifyInputs(gs));
  KILN_RETURN_IF_ERROR(VerifyConstants(gs, size - weights_start, engine->header.weights_stripped));
  KILN_RETURN_IF_ERROR(VerifyNodes(gs));
  KILN_ASSIGN_OR_RETURN(BuiltGraph built, BuildGraph(gs, data + weights_start, keepalive));

  KILN_ASSIGN_OR_RETURN(engine->layers, ReadLayers(*e, gs, built, engine->header.backend, options));
  KILN_ASSIGN_OR_RETURN(engine->profile, ReadProfile(*e, *built.graph));
  KILN_ASSIGN_OR_RETURN(engine->plan, ReadMemoryPlan(*e, *built.graph));
  engine->build_report_json = Str(e->build_report_json());
  KILN_ASSIGN_OR_RETURN(engine->weight_program, ReadWeightProgram(*e, gs));
  KILN_RETURN_IF_ERROR(VerifyAbsentConstants(gs, *engine));
  engine->graph = std::move(built.graph);
  return engine;
}

}  // namespace

StatusOr<std::shared_ptr<const EngineDesc>> LoadEngineBytes(std::span<const std::byte> bytes,
                                                            const LoadOptions& options) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<EngineDesc> desc, LoadEngineBytesForEdit(bytes, options));
  return std::shared_ptr<const EngineDesc>(std::move(desc));
}

StatusOr<std::shared_ptr<EngineDesc>> LoadEngineBytesForEdit(std::span<const std::byte> bytes,
                                                             const LoadOptions& options) {
  // One aligned copy: the FlatBuffer wants 8-byte alignment and the weights 64-byte alignment.
  // Exactly `bytes.size()` long, so an address sanitizer sees any read past the end.
  const std::align_val_t align{kEngineWeightsAlignment};
  void* p = ::operator new(std::max<size_t>(bytes.size(), 1), align, std::nothrow);
  if (!p) {
    return MakeError(ErrorCode::kIoError, "cannot allocate {} bytes for the engine", bytes.size());
  }
  std::shared_ptr<void> storage(
      p, [](void* q) { ::operator delete (q, std::align_val_t{kEngineWeightsAlignment}); });
  if (!bytes.empty()) std::memcpy(p, bytes.data(), bytes.size());
  return LoadVerified(static_cast<const std::byte*>(p), bytes.size(), storage, options);
}

StatusOr<std::shared_ptr<const EngineDesc>> LoadEngineFile(const std::string& path,
                                                           const LoadOptions& options) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<EngineDesc> desc, LoadEngineFileForEdit(path, options));
  return std::shared_ptr<const EngineDesc>(std::move(desc));
}

StatusOr<std::shared_ptr<EngineDesc>> LoadEngineFileForEdit(const std::string& path,
                                                            const LoadOptions& options) {
  KILN_ASSIGN_OR_RETURN(InputFile in, OpenInputFile(path, "engine"));
  const int fd = in.fd.get();
  const size_t size = static_cast<size_t>(in.size);
  if (size == 0) {
    return MakeError(ErrorCode::kEngineTruncated, "engine file '{}' is empty", path);
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  in.fd = UniqueFd();  // the mapping stays valid without the descriptor
  if (map == MAP_FAILED) {
    return MakeError(ErrorCode::kIoError, "cannot map engine '{}' ({} bytes): {}", path, size,
                     std::strerror(err));
  }
  std::shared_ptr<const void> mapping(
      map, [size](const void* q) { ::munmap(const_cast<void*>(q), size); });
  auto loaded = LoadVerified(static_cast<const std::byte*>(map), size, mapping, options);
  if (!loaded.ok())
    return std::move(loaded).status().AddContext(fmt::format("while loading '{}'", path));
  return loaded;
}

}  // namespace kiln
