// Op-version normalisation: every older form of an op is rewritten into the one canonical form
// the ops layer implements (attributes that became inputs, coerce-to-2D softmax, Upsample ->
// Resize, ...). README.md has the table. Also the unsupported-op report (KILN-E2004).
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "kiln/core/float16.h"
#include "kiln/ir/sizes.h"
#include "kiln/onnx/onnx_internal.h"
#include "kiln/ops/op_schema.h"

namespace kiln::onnx_internal {

namespace {

// Models below this opset import the ops whose interface has not changed since (see Run).
constexpr int64_t kFirstCanonicalOpset = 7;

bool IsDefaultDomain(const std::string& d) { return d.empty() || d == "ai.onnx"; }

const onnx::AttributeProto* FindAttr(const onnx::NodeProto& n, std::string_view name) {
  for (const auto& a : n.attribute()) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}

void EraseAttr(onnx::NodeProto* n, std::string_view name) {
  auto* attrs = n->mutable_attribute();
  for (int i = 0; i < attrs->size(); ++i) {
    if (attrs->Get(i).name() == name) {
      attrs->DeleteSubrange(i, 1);
      return;
    }
  }
}

onnx::AttributeProto* SetAttr(onnx::NodeProto* n, const std::string& name,
                              onnx::AttributeProto::AttributeType type) {
  EraseAttr(n, name);
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(type);
  return a;
}
void SetIntAttr(onnx::NodeProto* n, const std::string& name, int64_t v) {
  SetAttr(n, name, onnx::AttributeProto::INT)->set_i(v);
}
void SetStringAttr(onnx::NodeProto* n, const std::string& name, const std::string& v) {
  SetAttr(n, name, onnx::AttributeProto::STRING)->set_s(v);
}

std::vector<int64_t> Ints(const onnx::AttributeProto& a) {
  return {a.ints().begin(), a.ints().end()};
}

std::string InputName(const onnx::NodeProto& n, int i) {
  return i < n.input_size() ? n.input(i) : std::string();
}

void SetInputName(onnx::NodeProto* n, int i, const std::string& name) {
  while (n->input_size() <= i) n->add_input("");
  n->set_input(i, name);
}

void TrimInputs(onnx::NodeProto* n) {
  while (n->input_size() > 0 && n->input(n->input_size() - 1).empty()) {
    n->mutable_input()->RemoveLast();
  }
}

const std::unordered_set<std::string_view>& ReduceOpsAxesInput18() {
  static const std::unordered_set<std::string_view> s = {
      "ReduceMean", "ReduceMax",    "ReduceMin",       "ReduceProd",     "ReduceL1",
      "ReduceL2",   "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"};
  return s;
}

bool IsIntType(int32_t t) {
  switch (t) {
    case onnx::TensorProto::INT64:
    case onnx::TensorProto::INT32:
    case onnx::TensorProto::INT16:
    case onnx::TensorProto::INT8:
    case onnx::TensorProto::UINT32:
    case onnx::TensorProto::UINT16:
    case onnx::TensorProto::UINT8:
    case onnx::TensorProto::BOOL:
      return true;
    default:
      return false;
  }
}

// The values of a small integer or boolean tensor (at most kMaxFoldedValues), flat.
constexpr size_t kMaxFoldedValues = 64;
std::optional<std::vector<int64_t>> SmallInts(const onnx::TensorProto& t) {
  if (!IsIntType(t.data_type()) || t.data_location() == onnx::TensorProto::EXTERNAL) {
    return std::nullopt;
  }
  int64_t n = 1;
  for (int64_t d : t.dims()) {
    if (d < 0) return std::nullopt;
    n = SatMul(n, d);
  }
  if (n > static_cast<int64_t>(kMaxFoldedValues)) return std::nullopt;
  std::vector<int64_t> v;
  if (t.has_raw_data()) {
    const std::string& raw = t.raw_data();
    size_t width = 0;
    switch (t.data_type()) {
      case onnx::TensorProto::INT64:
        width = 8;
        break;
      case onnx::TensorProto::INT32:
      case onnx::TensorProto::UINT32:
        width = 4;
        break;
      case onnx::TensorProto::INT16:
      case onnx::TensorProto::UINT16:
        width = 2;
        break;
      default:
        width = 1;
        break;
    }
    if (raw.size() != width * static_cast<size_t>(n)) return std::nullopt;
    for (int64_t i = 0; i < n; ++i) {
      const char* p = raw.data() + width * static_cast<size_t>(i);
      int64_t x = 0;
      switch (t.data_type()) {
        case onnx::TensorProto::INT64: {
          int64_t y;
          std::memcpy(&y, p, 8);
          x = y;
          break;
        }
        case onnx::TensorProto::INT32: {
          int32_t y;
          std::memcpy(&y, p, 4);
          x = y;
          break;
        }
        case onnx::TensorProto::UINT32: {
          uint32_t y;
          std::memcpy(&y, p, 4);
          x = y;
          break;
        }
        case onnx::TensorProto::INT16: {
          int16_t y;
          std::memcpy(&y, p, 2);
          x = y;
          break;
        }
        case onnx::TensorProto::UINT16: {
          uint16_t y;
          std::memcpy(&y, p, 2);
          x = y;
          break;
        }
        case onnx::TensorProto::INT8:
          x = static_cast<int8_t>(*p);
          break;
        default:
          x = static_cast<uint8_t>(*p);
          break;
      }
      v.push_back(t.data_type() == onnx::TensorProto::BOOL ? (x != 0) : x);
    }
    return v;
  }
  if (t.data_type() == onnx::TensorProto::INT64) {
    v.assign(t.int64_data().begin(), t.int64_data().end());
  } else if (t.data_type() == onnx::TensorProto::UINT32) {
    v.assign(t.uint64_data().begin(), t.uint64_data().end());
  } else {
    v.assign(t.int32_data().begin(), t.int32_data().end());
  }
  if (v.size() != static_cast<size_t>(n)) return std::nullopt;
  return v;
}

class Normalizer final : public LoweringHost {
 public:
  Normalizer(onnx::GraphProto* graph, int64_t opset, std::vector<NormalizedNode>* out,
             IoSpecialization* io)
      : graph_(graph), opset_(opset), out_(out), io_(io) {}

  // ExpansionHost
  int32_t ElemType(const std::string& value) const override {
    auto it = elem_types_.find(value);
    return it == elem_types_.end() ? 0 : it->second;
  }
  std::optional<std::vector<int64_t>> Dims(const std::string& value) const override {
    if (auto it = dims_.find(value); it != dims_.end()) return it->second;
    if (auto it = ranks_.find(value); it != ranks_.end()) {
      return std::vector<int64_t>(static_cast<size_t>(it->second), -1);
    }
    return std::nullopt;
  }
  void Declare(const std::string& value, int32_t elem_type, size_t rank) override {
    if (elem_type != 0) elem_types_[value] = elem_type;
    ranks_[value] = static_cast<int>(rank);
  }
  std::string FreshValueName(const std::string& hint) override {
    std::string name = hint;
    // The suffix search resumes where it stopped for this hint (unrolled loops ask for the same
    // hint thousands of times).
    int& next = value_counter_[hint];
    for (int k = std::max(next, 1); taken_.count(name); ++k) {
      name = fmt::format("{}_{}", hint, k);
      next = k + 1;
    }
    taken_.insert(name);
    return name;
  }
  std::string FreshNodeName(const std::string& hint) override {
    std::string name = hint;
    for (int k = node_counter_[hint]; node_names_.count(name); ++k) {
      name = fmt::format("{}_{}", hint, k);
      node_counter_[hint] = k + 1;
    }
    node_names_.insert(name);
    return name;
  }
  void Emit(NormalizedNode node) override {
    if (node.node.op_type() == "Constant") {
      RecordConstant(node.node);
    } else if (facts_) {
      PropagateFacts(node.node);
      FoldAndShape(node.node);
    }
    out_->push_back(std::move(node));
  }
  int64_t opset() const override { return opset_; }

  // LoweringHost
  std::optional<std::vector<int64_t>> IntValues(const std::string& value) const override {
    auto it = ints_.find(value);
    if (it == ints_.end()) return std::nullopt;
    return it->second;
  }
  void DeclareDims(const std::string& value, int32_t elem_type,
                   const std::vector<int64_t>& dims) override {
    if (elem_type != 0) elem_types_[value] = elem_type;
    ranks_[value] = static_cast<int>(dims.size());
    dims_[value] = dims;
  }
  Status EmitRaw(onnx::NodeProto node) override {
    if (++depth_ > 64) {
      return MakeError(ErrorCode::kInvalidModel, "control flow nested more than 64 deep");
    }
    Status st = Process(std::move(node));
    --depth_;
    return st;
  }
  int64_t& inlined_nodes() override { return inlined_nodes_; }
  int64_t max_loop_trips() const override {
    return io_->options ? io_->options->max_loop_trips : ImportOptions().max_loop_trips;
  }
  size_t EmittedCount() const override { return out_->size(); }
  void DropEmittedAfter(size_t mark) override {
    if (mark < out_->size()) out_->resize(mark);
  }
  const std::vector<std::string>* SequenceElements(const std::string& value) const override {
    auto it = seqs_.find(value);
    return it == seqs_.end() ? nullptr : &it->second;
  }
  void DefineSequence(const std::string& value, std::vector<std::string> elements) override {
    taken_.insert(value);
    seqs_[value] = std::move(elements);
  }
  const std::optional<std::string>* OptionalContents(const std::string& value) const override {
    auto it = optionals_.find(value);
    return it == optionals_.end() ? nullptr : &it->second;
  }
  void DefineOptional(const std::string& value, std::optional<std::string> contents) override {
    taken_.insert(value);
    optionals_[value] = std::move(contents);
  }
  std::string UnknownComposite(const std::string& value) const override {
    auto it = unknown_.find(value);
    return it == unknown_.end() ? std::string() : it->second;
  }

  Status Run() {
    if (io_) KILN_RETURN_IF_ERROR(SpecializeInputs());
    CollectFacts();
    auto* nodes = graph_->mutable_node();
    out_->reserve(out_->size() + nodes->size());
    // Names first, so generated names never collide with a later node's own name.
    for (const auto& n : *nodes) {
      if (!n.name().empty()) node_names_.insert(n.name());
    }
    seen_.reserve(static_cast<size_t>(nodes->size()));
    // Facts are propagated through the nodes only where something needs them: an expansion
    // (Q's rank and type) or control flow (scan lengths, constant conditions).
    facts_ = std::any_of(nodes->begin(), nodes->end(), [](const onnx::NodeProto& n) {
      return (IsDefaultDomain(n.domain()) &&
              (n.op_type() == "Attention" || n.op_type() == "RotaryEmbedding" ||
               n.op_type() == "CausalConvWithState" || n.op_type() == "LinearAttention" ||
               IsControlFlowOp(n) || IsSequenceOrOptionalOp(n))) ||
             (n.domain() == "ai.onnx.preview" && n.op_type() == "FlexAttention");
    });
    facts_ = facts_ || !seqs_.empty() || !optionals_.empty();
    for (auto& proto : *nodes) KILN_RETURN_IF_ERROR(Process(std::move(proto)));
    nodes->Clear();
    if (io_) KILN_RETURN_IF_ERROR(SpecializeOutputs());
    return OkStatus();
  }

 private:
  // One node of the graph, or of a subgraph being inlined: a unique name, then its expansion,
  // lowering or canonical form, appended to the output.
  Status Process(onnx::NodeProto proto) {
    NormalizedNode nn;
    nn.node = std::move(proto);
    onnx::NodeProto& n = nn.node;
    if (n.name().empty() || !seen_.insert(n.name()).second) {
      n.set_name(FreshNodeName(n.op_type().empty() ? std::string("node") : n.op_type()));
      seen_.insert(n.name());
    }
    if (n.domain() == "ai.onnx.preview" && n.op_type() == "FlexAttention") {
      const size_t mark = out_->size();
      StatusOr<std::string> why = ExpandFlexAttention(n, *this);
      KILN_RETURN_IF_ERROR_CTX(why.status(), "while expanding node '{}' (FlexAttention)", n.name());
      if (why->empty()) return OkStatus();
      out_->resize(mark);
      nn.unsupported = std::move(why).value();
    }
    if (n.domain() == "ai.onnx.ml" && RewriteMl(&n)) {
      nn.version = FindOpSchema(n.op_type())->latest_opset;
      PropagateElemType(n);
      if (facts_) {
        PropagateFacts(n);
        FoldAndShape(n);
      }
      out_->push_back(std::move(nn));
      return OkStatus();
    }
    if (!IsDefaultDomain(n.domain())) {
      out_->push_back(std::move(nn));
      return OkStatus();
    }
    nn.version = EffectiveOpVersion(n.op_type(), opset_);
    if (n.op_type() == "Constant") RecordConstant(n);
    if (opset_ < kFirstCanonicalOpset && nn.version != 0 &&
        nn.version != EffectiveOpVersion(n.op_type(), kFirstCanonicalOpset)) {
      // A model below opset 7 imports only ops whose interface did not change before opset 7
      // (Not, Constant, Relu-6, ...): kiln reads the opset-7 forms and rewrites later ones.
      nn.unsupported = fmt::format(
          "{}-{} differs from the form of opset {} that kiln reads; re-export with opset >= {}",
          n.op_type(), nn.version, kFirstCanonicalOpset, kFirstCanonicalOpset);
      out_->push_back(std::move(nn));
      return OkStatus();
    }
    const bool composite_identity =
        n.op_type() == "Identity" && n.input_size() == 1 && IsComposite(n.input(0));
    if ((IsControlFlowOp(n) || IsSequenceOrOptionalOp(n) || composite_identity) && nn.version > 0) {
      // Lowered into this graph (sequences and optionals into the values they hold); when it
      // cannot be, whatever was emitted is dropped and the node is reported with the reason.
      const size_t mark = out_->size();
      StatusOr<std::string> why = LowerControlFlow(n, nn.version, *this);
      KILN_RETURN_IF_ERROR_CTX(why.status(), "while lowering node '{}' ({}-{})", n.name(),
                               n.op_type(), nn.version);
      if (why->empty()) return OkStatus();
      out_->resize(mark);
      nn.unsupported = std::move(why).value();
      // Sequences and optionals it would define stay unknown; their users say why.
      for (const auto& o : n.output()) {
        if (!o.empty()) {
          unknown_.emplace(o, fmt::format("it comes from node '{}' ({}), which kiln could not "
                                          "lower",
                                          n.name(), n.op_type()));
        }
      }
      out_->push_back(std::move(nn));
      return OkStatus();
    }
    const bool ops27 = (n.op_type() == "CausalConvWithState" || n.op_type() == "LinearAttention") &&
                       nn.version >= 27;
    if (((n.op_type() == "Attention" || n.op_type() == "RotaryEmbedding") && nn.version >= 23) ||
        ops27) {
      // ONNX's ops of these names, not kiln's internal fusions, or ops defined by function
      // bodies: expanded into primitives.
      StatusOr<std::string> why =
          n.op_type() == "Attention"         ? ExpandAttention(n, nn.version, *this)
          : n.op_type() == "RotaryEmbedding" ? ExpandRotaryEmbedding(n, *this)
          : n.op_type() == "LinearAttention" ? ExpandLinearAttention(n, *this)
                                             : ExpandCausalConvWithState(n, *this);
      KILN_RETURN_IF_ERROR_CTX(why.status(), "while expanding node '{}' ({}-{})", n.name(),
                               n.op_type(), nn.version);
      if (why->empty()) return OkStatus();
      nn.unsupported = std::move(why).value();
    }
    after_.clear();
    KILN_RETURN_IF_ERROR_CTX(Rewrite(&n, &nn.version), "while normalising node '{}' ({}-{})",
                             n.name(), n.op_type(), nn.version);
    std::vector<NormalizedNode> after = std::move(after_);
    after_.clear();
    if (facts_) {
      PropagateFacts(n);
      FoldAndShape(n);
    }
    PropagateElemType(n);
    out_->push_back(std::move(nn));
    for (auto& a : after) {
      if (facts_) {
        PropagateFacts(a.node);
        FoldAndShape(a.node);
      }
      PropagateElemType(a.node);
      out_->push_back(std::move(a));
    }
    return OkStatus();
  }

  // What is known before any node runs: element types and ranks (inputs, initializers,
  // value_info), and every name already used.
  void CollectFacts() {
    // Sized once up front: rehashing these string sets was most of a small model's import.
    size_t names = static_cast<size_t>(graph_->input_size() + graph_->value_info_size() +
                                       graph_->output_size() + graph_->initializer_size());
    size_t typed = names;
    for (const auto& n : graph_->node()) names += n.input_size() + n.output_size();
    taken_.reserve(names);
    node_names_.reserve(static_cast<size_t>(graph_->node_size()));
    elem_types_.reserve(typed);
    ranks_.reserve(typed);
    numel_.reserve(static_cast<size_t>(graph_->initializer_size()));
    auto note_value_info = [&](const onnx::ValueInfoProto& vi) {
      taken_.insert(vi.name());
      if (!vi.type().has_tensor_type()) return;
      const auto& tt = vi.type().tensor_type();
      if (tt.elem_type() != 0) elem_types_[vi.name()] = tt.elem_type();
      if (!tt.has_shape()) return;
      ranks_[vi.name()] = tt.shape().dim_size();
      std::vector<int64_t> dims;
      for (const auto& d : tt.shape().dim()) dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
      dims_[vi.name()] = std::move(dims);
    };
    for (const auto& vi : graph_->input()) note_value_info(vi);
    for (const auto& vi : graph_->value_info()) note_value_info(vi);
    for (const auto& vi : graph_->output()) note_value_info(vi);
    for (const auto& t : graph_->initializer()) {
      taken_.insert(t.name());
      elem_types_[t.name()] = t.data_type();
      ranks_[t.name()] = t.dims_size();
      dims_[t.name()] = {t.dims().begin(), t.dims().end()};
      numel_[t.name()] = Numel(t);
    }
    for (const auto& t : graph_->initializer()) {
      if (auto v = SmallInts(t)) ints_[t.name()] = std::move(*v);
    }
    TakeNames(*graph_);
  }

  // Every value name of `g`'s nodes, in its subgraphs too (whose values may be inlined here).
  void TakeNames(const onnx::GraphProto& g) {
    for (const auto& n : g.node()) {
      for (const auto& o : n.output()) taken_.insert(o);
      for (const auto& i : n.input()) taken_.insert(i);
      for (const auto& a : n.attribute()) {
        if (a.has_g()) TakeNames(a.g());
        for (const auto& sg : a.graphs()) TakeNames(sg);
      }
    }
  }

  // The element type and rank of a node's output that nothing declares, for ops whose result
  // follows from their inputs' alone, so that an expansion (which needs Q's rank and type) also
  // works on models without value_info. Run only for models with a node to expand.
  void PropagateFacts(const onnx::NodeProto& n) {
    static const std::unordered_set<std::string_view> kSameRank = {"Abs",
                                                                   "Clip",
                                                                   "Concat",
                                                                   "Erf",
                                                                   "Exp",
                                                                   "Gelu",
                                                                   "Identity",
                                                                   "LayerNormalization",
                                                                   "LeakyRelu",
                                                                   "LogSoftmax",
                                                                   "Neg",
                                                                   "Pad",
                                                                   "RMSNormalization",
                                                                   "Relu",
                                                                   "Sigmoid",
                                                                   "Slice",
                                                                   "Softmax",
                                                                   "Sqrt",
                                                                   "Tanh",
                                                                   "Transpose"};
    static const std::unordered_set<std::string_view> kBinary = {"Add", "Sub", "Mul", "Div", "Pow"};
    if (n.output_size() < 1 || n.output(0).empty() || ranks_.count(n.output(0))) return;
    const std::string& op = n.op_type();
    auto rank = [&](int i) -> std::optional<int> {
      auto it = ranks_.find(InputName(n, i));
      return it == ranks_.end() ? std::nullopt : std::optional<int>(it->second);
    };
    auto numel = [&](int i) -> std::optional<int> {  // of a constant (a shape, axes)
      auto it = numel_.find(InputName(n, i));
      if (it == numel_.end() || it->second > 64) return std::nullopt;
      return static_cast<int>(it->second);
    };
    int32_t type = ElemType(InputName(n, 0));
    std::optional<int> r;
    if (kSameRank.count(op)) {
      r = rank(0);
    } else if (op == "Cast") {
      const auto* to = FindAttr(n, "to");
      type = to ? static_cast<int32_t>(to->i()) : 0;
      r = rank(0);
    } else if (kBinary.count(op) || op == "Where") {
      if (op == "Where") type = ElemType(InputName(n, 1));
      for (int i = 0; i < n.input_size(); ++i) {
        if (!rank(i)) return;
        r = std::max(r.value_or(0), *rank(i));
      }
    } else if (op == "MatMul") {
      if (rank(0) && rank(1) && *rank(0) >= 2 && *rank(1) >= 2) r = std::max(*rank(0), *rank(1));
    } else if (op == "Reshape") {
      r = numel(1);
    } else if (op == "Unsqueeze" && rank(0) && numel(1)) {
      r = *rank(0) + *numel(1);
    } else if (op == "Squeeze" && rank(0) && numel(1)) {
      r = *rank(0) - *numel(1);
    }
    if (!r || *r < 0) return;
    if (type != 0) elem_types_[n.output(0)] = type;
    ranks_[n.output(0)] = *r;
  }

  // Static dims and small integer values of a node's outputs where they follow from its
  // inputs' (shapes of static dims, shape arithmetic, comparisons, Reshape/Transpose/Gather/...),
  // so that control flow can be lowered on values computed in the graph (a Scan over a
  // Transpose of a Reshape, a Loop whose condition compares the iteration number).
  void FoldAndShape(const onnx::NodeProto& n) {
    if (n.op_type() == "Constant" || n.output_size() < 1 || n.output(0).empty()) return;
    using Dims = std::vector<int64_t>;
    const std::string& op = n.op_type();
    const std::string& out = n.output(0);
    auto dims = [&](int i) -> std::optional<Dims> {
      std::string name = InputName(n, i);
      if (name.empty()) return std::nullopt;
      if (auto it = dims_.find(name); it != dims_.end()) return it->second;
      // Only the rank known: every dim unknown.
      if (auto it = ranks_.find(name); it != ranks_.end() && it->second >= 0) {
        return Dims(static_cast<size_t>(it->second), -1);
      }
      return std::nullopt;
    };
    auto vals = [&](int i) -> const std::vector<int64_t>* {
      std::string name = InputName(n, i);
      auto it = name.empty() ? ints_.end() : ints_.find(name);
      return it == ints_.end() ? nullptr : &it->second;
    };
    auto int_attr = [&](const char* name, int64_t dflt) {
      const auto* a = FindAttr(n, name);
      return a ? a->i() : dflt;
    };
    auto is_static = [](const Dims& d) {
      return std::all_of(d.begin(), d.end(), [](int64_t x) { return x >= 0; });
    };
    auto numel = [](const Dims& d) {
      int64_t k = 1;
      for (int64_t x : d) k = SatMul(k, x);
      return k;
    };
    auto broadcast = [&](int count) -> std::optional<Dims> {
      std::vector<Dims> all;
      size_t rank = 0;
      for (int i = 0; i < count; ++i) {
        auto d = dims(i);
        if (!d) return std::nullopt;
        rank = std::max(rank, d->size());
        all.push_back(std::move(*d));
      }
      Dims r(rank, 1);
      for (size_t k = 0; k < rank; ++k) {
        bool unknown = false;
        for (const Dims& d : all) {
          if (k + d.size() < rank) continue;
          int64_t x = d[k + d.size() - rank];
          if (x < 0) {
            unknown = true;
          } else if (x != 1) {
            r[k] = x;
          }
        }
        if (unknown && r[k] == 1) r[k] = -1;
      }
      return r;
    };
    // Elementwise over values of equal counts (or one value broadcast).
    auto elementwise = [&](int count, auto fn) -> std::optional<std::vector<int64_t>> {
      std::vector<const std::vector<int64_t>*> in;
      size_t size = 1;
      for (int i = 0; i < count; ++i) {
        const auto* v = vals(i);
        if (!v) return std::nullopt;
        if (v->size() != 1 && size != 1 && v->size() != size) return std::nullopt;
        if (v->size() != 1) size = v->size();
        in.push_back(v);
      }
      std::vector<int64_t> r(size);
      std::vector<int64_t> args(static_cast<size_t>(count));
      for (size_t k = 0; k < size; ++k) {
        for (size_t i = 0; i < in.size(); ++i) args[i] = (*in[i])[in[i]->size() == 1 ? 0 : k];
        auto x = fn(args);
        if (!x) return std::nullopt;
        r[k] = *x;
      }
      return r;
    };
    static const std::unordered_set<std::string_view> kUnary = {"Abs",
                                                                "Acos",
                                                                "Asin",
                                                                "Atan",
                                                                "Ceil",
                                                                "Cos",
                                                                "Elu",
                                                                "Erf",
                                                                "Exp",
                                                                "Floor",
                                                                "Gelu",
                                                                "HardSigmoid",
                                                                "HardSwish",
                                                                "Identity",
                                                                "IsInf",
                                                                "IsNaN",
                                                                "LeakyRelu",
                                                                "Log",
                                                                "LogSoftmax",
                                                                "Mish",
                                                                "Neg",
                                                                "Not",
                                                                "Reciprocal",
                                                                "Relu",
                                                                "Round",
                                                                "Selu",
                                                                "Sigmoid",
                                                                "Sign",
                                                                "Sin",
                                                                "Softmax",
                                                                "Softplus",
                                                                "Softsign",
                                                                "Sqrt",
                                                                "Tan",
                                                                "Tanh",
                                                                "Cast",
                                                                "Clip",
                                                                "LayerNormalization",
                                                                "RMSNormalization",
                                                                "Swish"};
    static const std::unordered_set<std::string_view> kBroadcast = {"Add",
                                                                    "Sub",
                                                                    "Mul",
                                                                    "Div",
                                                                    "Pow",
                                                                    "Mod",
                                                                    "Equal",
                                                                    "Less",
                                                                    "LessOrEqual",
                                                                    "Greater",
                                                                    "GreaterOrEqual",
                                                                    "And",
                                                                    "Or",
                                                                    "Xor",
                                                                    "Where",
                                                                    "Max",
                                                                    "Min",
                                                                    "Sum",
                                                                    "Mean",
                                                                    "PRelu",
                                                                    "BitShift",
                                                                    "BitwiseAnd",
                                                                    "BitwiseOr",
                                                                    "BitwiseXor"};
    // Ops whose output has the rank of input 0 (dims not followed here).
    static const std::unordered_set<std::string_view> kSameRankUnknownDims = {
        "Conv",
        "ConvTranspose",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "GlobalMaxPool",
        "BatchNormalization",
        "InstanceNormalization",
        "GroupNormalization",
        "Resize",
        "Upsample",
        "TopK",
        "LRN",
        "Dropout",
        "Pad",
        "DepthToSpace",
        "SpaceToDepth",
        "Tile",
        "CumSum",
        "ScatterND",
        "ScatterElements",
        "HardSwish",
        "Hardmax",
        "LpNormalization"};
    std::optional<Dims> od;
    std::optional<std::vector<int64_t>> ov;
    if (kUnary.count(op)) {
      od = dims(0);
      if (op == "Identity") {
        if (const auto* v = vals(0)) ov = *v;
      } else if (op == "Neg" || op == "Abs" || op == "Not") {
        ov = elementwise(1, [&](const std::vector<int64_t>& a) -> std::optional<int64_t> {
          if (op == "Not") return int64_t{a[0] == 0};
          if (a[0] == std::numeric_limits<int64_t>::min()) return std::nullopt;
          return op == "Neg" ? -a[0] : std::abs(a[0]);
        });
      } else if (op == "Cast") {
        const auto* to = FindAttr(n, "to");
        if (to && IsIntType(static_cast<int32_t>(to->i()))) {
          if (const auto* v = vals(0)) {
            ov = *v;
            if (to->i() == onnx::TensorProto::BOOL) {
              for (auto& x : *ov) x = x != 0;
            }
          }
        }
      }
    } else if (kBroadcast.count(op)) {
      od = broadcast(n.input_size());
      ov =
          elementwise(n.input_size(), [&](const std::vector<int64_t>& a) -> std::optional<int64_t> {
            if (op == "Where") return a[0] ? a[1] : a[2];
            if (a.size() != 2) return std::nullopt;
            int64_t x = a[0], y = a[1], r = 0;
            if (op == "Add")
              return __builtin_add_overflow(x, y, &r) ? std::nullopt : std::optional(r);
            if (op == "Sub")
              return __builtin_sub_overflow(x, y, &r) ? std::nullopt : std::optional(r);
            if (op == "Mul")
              return __builtin_mul_overflow(x, y, &r) ? std::nullopt : std::optional(r);
            if (op == "Div") {
              if (y == 0 || x < 0 || y < 0) return std::nullopt;
              return x / y;
            }
            if (op == "Equal") return int64_t{x == y};
            if (op == "Less") return int64_t{x < y};
            if (op == "LessOrEqual") return int64_t{x <= y};
            if (op == "Greater") return int64_t{x > y};
            if (op == "GreaterOrEqual") return int64_t{x >= y};
            if (op == "And") return int64_t{x && y};
            if (op == "Or") return int64_t{x || y};
            if (op == "Xor") return int64_t{(x != 0) != (y != 0)};
            if (op == "Max") return std::max(x, y);
            if (op == "Min") return std::min(x, y);
            return std::nullopt;
          });
    } else if (op == "Shape") {
      if (auto d = dims(0)) {
        auto r = static_cast<int64_t>(d->size());
        auto clamp = [&](int64_t x) { return std::clamp(x < 0 ? x + r : x, int64_t{0}, r); };
        int64_t start = clamp(int_attr("start", 0));
        int64_t end = clamp(int_attr("end", r));
        Dims part(d->begin() + start, d->begin() + std::max(start, end));
        od = Dims{static_cast<int64_t>(part.size())};
        if (is_static(part)) {
          ov = part;
        } else if (part.size() <= kMaxFoldedValues) {
          shape_vals_[out] = part;  // some dims known: a Gather may pick those
        }
      } else {
        od = Dims{-1};  // a shape is 1-D whatever its length
      }
    } else if (op == "Size") {
      od = Dims{};
      if (auto d = dims(0); d && is_static(*d)) ov = std::vector<int64_t>{numel(*d)};
    } else if (op == "Transpose") {
      if (auto d = dims(0)) {
        std::vector<int64_t> perm;
        if (const auto* p = FindAttr(n, "perm")) perm = Ints(*p);
        if (perm.empty()) {
          for (size_t k = d->size(); k-- > 0;) perm.push_back(static_cast<int64_t>(k));
        }
        if (perm.size() == d->size()) {
          od = Dims();
          for (int64_t k : perm) {
            if (k < 0 || k >= static_cast<int64_t>(d->size())) return;
            od->push_back((*d)[static_cast<size_t>(k)]);
          }
        }
      }
    } else if (op == "Reshape" || op == "Unsqueeze" || op == "Squeeze" || op == "Flatten") {
      auto d = dims(0);
      const auto* v1 = vals(1);
      if (op == "Reshape" && v1) {
        Dims r = *v1;
        bool allowzero = int_attr("allowzero", 0) != 0;
        int infer = -1;
        for (size_t k = 0; k < r.size(); ++k) {
          if (r[k] == 0 && !allowzero) r[k] = d && k < d->size() ? (*d)[k] : -1;
          if ((*v1)[k] == -1) infer = static_cast<int>(k);
        }
        if (infer >= 0) {
          r[static_cast<size_t>(infer)] = -1;
          Dims known = r;
          known.erase(known.begin() + infer);
          if (d && is_static(*d) && is_static(known) && numel(known) > 0) {
            r[static_cast<size_t>(infer)] = numel(*d) / numel(known);
          }
        }
        od = r;
      } else if (op == "Reshape") {
        // The shape is computed at run time: its length is the rank.
        if (auto sd = dims(1); sd && sd->size() == 1 && (*sd)[0] >= 0) od = Dims((*sd)[0], -1);
      } else if (op == "Unsqueeze" && d && v1) {
        auto rank = static_cast<int64_t>(d->size() + v1->size());
        std::vector<bool> inserted(static_cast<size_t>(rank), false);
        for (int64_t a : *v1) {
          a = a < 0 ? a + rank : a;
          if (a < 0 || a >= rank) return;
          inserted[static_cast<size_t>(a)] = true;
        }
        od = Dims();
        size_t k = 0;
        for (int64_t i = 0; i < rank; ++i) {
          if (inserted[static_cast<size_t>(i)]) {
            od->push_back(1);
          } else if (k < d->size()) {
            od->push_back((*d)[k++]);
          } else {
            return;
          }
        }
      } else if (op == "Squeeze" && d) {
        auto rank = static_cast<int64_t>(d->size());
        std::vector<bool> drop(d->size(), false);
        if (v1) {
          for (int64_t a : *v1) {
            a = a < 0 ? a + rank : a;
            if (a < 0 || a >= rank) return;
            drop[static_cast<size_t>(a)] = true;
          }
        } else if (InputName(n, 1).empty()) {
          for (size_t k = 0; k < d->size(); ++k) {
            if ((*d)[k] < 0) return;
            drop[k] = (*d)[k] == 1;
          }
        } else {
          return;
        }
        od = Dims();
        for (size_t k = 0; k < d->size(); ++k) {
          if (!drop[k]) od->push_back((*d)[k]);
        }
      } else if (op == "Flatten" && d) {
        auto rank = static_cast<int64_t>(d->size());
        int64_t axis = int_attr("axis", 1);
        axis = axis < 0 ? axis + rank : axis;
        if (axis < 0 || axis > rank) return;
        Dims a(d->begin(), d->begin() + axis), b(d->begin() + axis, d->end());
        od = Dims{is_static(a) ? numel(a) : -1, is_static(b) ? numel(b) : -1};
      }
      if (const auto* v = vals(0);
          v && od && is_static(*od) && numel(*od) == static_cast<int64_t>(v->size())) {
        ov = *v;
      }
    } else if (op == "Concat") {
      int64_t axis = int_attr("axis", 0);
      std::vector<Dims> all;
      // The inputs share one rank: one input's dims give the others' rank where unknown.
      std::optional<size_t> known_rank;
      for (int i = 0; i < n.input_size() && !known_rank; ++i) {
        if (auto d = dims(i)) known_rank = d->size();
      }
      for (int i = 0; i < n.input_size() && known_rank; ++i) {
        auto d = dims(i);
        all.push_back(d ? std::move(*d) : Dims(*known_rank, -1));
      }
      if (all.size() == static_cast<size_t>(n.input_size()) && !all.empty()) {
        auto rank = static_cast<int64_t>(all[0].size());
        int64_t a = axis < 0 ? axis + rank : axis;
        if (a >= 0 && a < rank) {
          od = all[0];
          int64_t sum = 0;
          for (const Dims& d : all) {
            if (static_cast<int64_t>(d.size()) != rank) return;
            sum = (sum < 0 || d[static_cast<size_t>(a)] < 0) ? -1 : sum + d[static_cast<size_t>(a)];
            for (int64_t k = 0; k < rank; ++k) {
              if (k != a && (*od)[static_cast<size_t>(k)] < 0)
                (*od)[static_cast<size_t>(k)] = d[static_cast<size_t>(k)];
            }
          }
          (*od)[static_cast<size_t>(a)] = sum;
          if (a == 0) {
            std::vector<int64_t> v;
            for (int i = 0; i < n.input_size(); ++i) {
              const auto* x = vals(i);
              if (!x) {
                v.clear();
                break;
              }
              v.insert(v.end(), x->begin(), x->end());
            }
            if (!v.empty() && is_static(*od) && numel(*od) == static_cast<int64_t>(v.size()))
              ov = v;
          }
        }
      }
    } else if (op == "Gather") {
      auto d = dims(0);
      auto idx = dims(1);
      if (d && idx) {
        auto rank = static_cast<int64_t>(d->size());
        int64_t axis = int_attr("axis", 0);
        axis = axis < 0 ? axis + rank : axis;
        if (axis < 0 || axis >= rank) return;
        od = Dims(d->begin(), d->begin() + axis);
        od->insert(od->end(), idx->begin(), idx->end());
        od->insert(od->end(), d->begin() + axis + 1, d->end());
        const auto* v0 = vals(0);
        const auto* v1 = vals(1);
        // A shape with some dims unknown (-1): what the indices pick may all be known.
        const std::vector<int64_t>* partial = nullptr;
        if (!v0) {
          auto it = shape_vals_.find(InputName(n, 0));
          if (it != shape_vals_.end()) partial = &it->second;
        }
        const std::vector<int64_t>* src = v0 ? v0 : partial;
        if (src && v1 && rank == 1) {
          std::vector<int64_t> v;
          auto size = static_cast<int64_t>(src->size());
          for (int64_t i : *v1) {
            i = i < 0 ? i + size : i;
            if (i < 0 || i >= size) return;
            v.push_back((*src)[static_cast<size_t>(i)]);
          }
          if (!partial || is_static(v)) {
            ov = v;
          } else if (!shape_vals_.count(out)) {
            shape_vals_[out] = v;
          }
        }
      }
    } else if (op == "MatMul") {
      auto a = dims(0);
      auto b = dims(1);
      if (a && b && a->size() >= 2 && b->size() >= 2) {
        Dims ba(a->begin(), a->end() - 2), bb(b->begin(), b->end() - 2);
        size_t rank = std::max(ba.size(), bb.size());
        od = Dims(rank, 1);
        for (size_t k = 0; k < rank; ++k) {
          int64_t x = k + ba.size() >= rank ? ba[k + ba.size() - rank] : 1;
          int64_t y = k + bb.size() >= rank ? bb[k + bb.size() - rank] : 1;
          (*od)[k] = x == 1 ? y : y == 1 ? x : (x < 0 ? y : x);
        }
        od->push_back((*a)[a->size() - 2]);
        od->push_back(b->back());
      }
    } else if (op == "Expand") {
      auto d = dims(0);
      const auto* shape = vals(1);
      if (d && shape) {
        size_t rank = std::max(d->size(), shape->size());
        od = Dims(rank, 1);
        for (size_t k = 0; k < rank; ++k) {
          int64_t x = k + d->size() >= rank ? (*d)[k + d->size() - rank] : 1;
          int64_t y = k + shape->size() >= rank ? (*shape)[k + shape->size() - rank] : 1;
          (*od)[k] = x == 1 ? y : (y == 1 ? x : (x < 0 ? y : x));
        }
      }
    } else if (op == "ConstantOfShape") {
      if (const auto* shape = vals(0)) {
        od = *shape;
        int32_t type = onnx::TensorProto::FLOAT;
        std::optional<std::vector<int64_t>> fill;
        if (const auto* a = FindAttr(n, "value"); a && a->has_t()) {
          type = a->t().data_type();
          fill = SmallInts(a->t());
        } else {
          fill = std::vector<int64_t>{0};
        }
        elem_types_[out] = type;
        if (IsIntType(type) && fill && fill->size() == 1 && is_static(*od) &&
            numel(*od) <= static_cast<int64_t>(kMaxFoldedValues)) {
          ov = std::vector<int64_t>(static_cast<size_t>(numel(*od)), (*fill)[0]);
        }
      }
    } else if (op == "Slice") {
      auto d = dims(0);
      const auto* starts = vals(1);
      const auto* ends = vals(2);
      const auto* axes_v = vals(3);
      const auto* steps_v = vals(4);
      if (d && starts && ends && starts->size() == ends->size() &&
          (InputName(n, 3).empty() || axes_v) && (InputName(n, 4).empty() || steps_v)) {
        auto rank = static_cast<int64_t>(d->size());
        od = *d;
        std::vector<int64_t> first(d->size(), 0), step(d->size(), 1);
        bool values_ok = true;
        for (size_t k = 0; k < starts->size(); ++k) {
          int64_t a = axes_v ? (*axes_v)[k] : static_cast<int64_t>(k);
          a = a < 0 ? a + rank : a;
          int64_t st = steps_v ? (*steps_v)[k] : 1;
          if (a < 0 || a >= rank || st == 0 || st == std::numeric_limits<int64_t>::min()) return;
          int64_t len = (*d)[static_cast<size_t>(a)];
          if (len < 0) {
            (*od)[static_cast<size_t>(a)] = -1;
            values_ok = false;
            continue;
          }
          int64_t s0 = (*starts)[k], e0 = (*ends)[k];
          s0 = s0 < 0 ? s0 + len : s0;
          e0 = e0 < 0 ? e0 + len : e0;
          if (st > 0) {
            s0 = std::clamp(s0, int64_t{0}, len);
            e0 = std::clamp(e0, int64_t{0}, len);
            (*od)[static_cast<size_t>(a)] = e0 > s0 ? (e0 - s0 - 1) / st + 1 : 0;
          } else {
            s0 = std::clamp(s0, int64_t{-1}, len - 1);
            e0 = std::clamp(e0, int64_t{-1}, len - 1);
            (*od)[static_cast<size_t>(a)] = s0 > e0 ? (s0 - e0 - 1) / -st + 1 : 0;
          }
          first[static_cast<size_t>(a)] = s0;
          step[static_cast<size_t>(a)] = st;
        }
        const auto* v0 = vals(0);
        if (v0 && values_ok && rank == 1) {
          std::vector<int64_t> v;
          for (int64_t i = 0; i < (*od)[0]; ++i)
            v.push_back((*v0)[static_cast<size_t>(first[0] + i * step[0])]);
          ov = v;
        }
      }
    } else if (kSameRankUnknownDims.count(op)) {
      // The rank follows the input's; the dims are left unknown (Conv's channels from W).
      if (auto d = dims(0)) {
        od = Dims(d->size(), -1);
        if (op == "Conv" && od->size() >= 2) {
          if (auto w = dims(1); w && !w->empty()) (*od)[1] = (*w)[0];
          (*od)[0] = (*d)[0];
        }
      }
    } else if (op == "Gemm") {
      od = Dims{-1, -1};
    } else if (op == "RoiAlign") {
      od = Dims{-1, -1, int_attr("output_height", 1), int_attr("output_width", 1)};
    } else if (op == "NonMaxSuppression") {
      od = Dims{-1, 3};
    } else if (op == "NonZero") {
      // [rank of X, how many are non-zero (known only at run time)].
      auto d = dims(0);
      od = Dims{d ? static_cast<int64_t>(d->size()) : -1, -1};
    } else if (op == "Split") {
      // Each output's dims (several outputs: recorded here, not through od).
      auto d = dims(0);
      if (!d) return;
      auto rank = static_cast<int64_t>(d->size());
      int64_t axis = int_attr("axis", 0);
      axis = axis < 0 ? axis + rank : axis;
      if (axis < 0 || axis >= rank) return;
      const int outs = n.output_size();
      std::vector<int64_t> sizes;
      if (const auto* v1 = vals(1)) {
        sizes = *v1;
      } else if (const auto* a = FindAttr(n, "split"); a && !InputName(n, 1).size()) {
        sizes = Ints(*a);
      }
      int64_t len = (*d)[static_cast<size_t>(axis)];
      if (sizes.empty() && InputName(n, 1).empty() && len >= 0 && outs > 0) {
        int64_t k = int_attr("num_outputs", outs);
        if (k <= 0) return;
        int64_t chunk = (len + k - 1) / k;
        for (int64_t i = 0; i < k; ++i)
          sizes.push_back(std::max<int64_t>(0, std::min(chunk, len - i * chunk)));
      }
      if (sizes.size() != static_cast<size_t>(outs)) return;
      for (int i = 0; i < outs; ++i) {
        const std::string& o = n.output(i);
        if (o.empty() || dims_.count(o)) continue;
        Dims od_i = *d;
        od_i[static_cast<size_t>(axis)] = sizes[static_cast<size_t>(i)];
        ranks_[o] = static_cast<int>(od_i.size());
        dims_[o] = std::move(od_i);
        if (int32_t t = ElemType(InputName(n, 0)); t != 0 && !elem_types_.count(o))
          elem_types_[o] = t;
      }
      return;
    } else if (op == "Range") {
      const auto* a = vals(0);
      const auto* b = vals(1);
      const auto* c = vals(2);
      // Within +-2^40, so that the count cannot overflow.
      auto small = [](const std::vector<int64_t>* x) {
        return x && x->size() == 1 && std::abs((*x)[0]) < (int64_t{1} << 40);
      };
      if (small(a) && small(b) && small(c) && (*c)[0] != 0) {
        int64_t count =
            std::max<int64_t>(0, ((*b)[0] - (*a)[0] + (*c)[0] - ((*c)[0] > 0 ? 1 : -1)) / (*c)[0]);
        od = Dims{count};
        if (count <= static_cast<int64_t>(kMaxFoldedValues)) {
          std::vector<int64_t> v;
          for (int64_t i = 0; i < count; ++i) v.push_back((*a)[0] + i * (*c)[0]);
          ov = v;
        }
      }
    }
    // Ranks where the dims did not follow: a Slice by bounds computed at run time keeps the
    // rank; ConstantOfShape of a shape of known length has that rank; Compress is 1-D without
    // an axis, else of the input's rank.
    if (!od) {
      if (op == "Slice") {
        if (auto d = dims(0)) od = Dims(d->size(), -1);
      } else if (op == "ConstantOfShape") {
        if (auto sd = dims(0); sd && sd->size() == 1 && (*sd)[0] >= 0) od = Dims((*sd)[0], -1);
      } else if (op == "Compress") {
        if (!FindAttr(n, "axis")) {
          od = Dims{-1};
        } else if (auto d = dims(0)) {
          od = *d;
          auto rank = static_cast<int64_t>(d->size());
          int64_t axis = int_attr("axis", 0);
          axis = axis < 0 ? axis + rank : axis;
          if (axis >= 0 && axis < rank) {
            (*od)[static_cast<size_t>(axis)] = -1;
          } else {
            od.reset();
          }
        }
      }
    }
    if (od && !dims_.count(out)) {
      ranks_[out] = static_cast<int>(od->size());
      dims_[out] = *od;
    }
    if (ov && ov->size() <= kMaxFoldedValues && !ints_.count(out)) ints_[out] = std::move(*ov);
    // Element types the rank propagation does not give.
    if (!elem_types_.count(out)) {
      static const std::unordered_set<std::string_view> kBool = {
          "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And",
          "Or",    "Xor",  "Not",         "IsNaN",   "IsInf"};
      int32_t t = 0;
      if (kBool.count(op)) {
        t = onnx::TensorProto::BOOL;
      } else if (op == "Shape" || op == "Size" || op == "NonZero") {
        t = onnx::TensorProto::INT64;
      } else if (op == "Cast") {
        if (const auto* to = FindAttr(n, "to")) t = static_cast<int32_t>(to->i());
      } else if (op == "Where") {
        t = ElemType(InputName(n, 1));
      } else if ((kUnary.count(op) || kBroadcast.count(op) || op == "Transpose" ||
                  op == "Reshape" || op == "Unsqueeze" || op == "Squeeze" || op == "Flatten" ||
                  op == "Concat" || op == "Gather" || op == "MatMul" || op == "Expand" ||
                  op == "Slice" || op == "Range") &&
                 op != "BitShift") {
        t = ElemType(InputName(n, 0));
      }
      if (t != 0) elem_types_[out] = t;
    }
  }

  // The element type of output 0 where nothing declares it and the op fixes it from its inputs
  // or attributes alone, so that CastLike's `like` operand may be any earlier value (the
  // function-expanded node tests cast to an intermediate's type).
  void PropagateElemType(const onnx::NodeProto& n) {
    static const std::unordered_set<std::string_view> kSameAsInput0 = {"Abs",
                                                                       "Acos",
                                                                       "Acosh",
                                                                       "Add",
                                                                       "Asin",
                                                                       "Asinh",
                                                                       "Atan",
                                                                       "Atanh",
                                                                       "AveragePool",
                                                                       "BatchNormalization",
                                                                       "Ceil",
                                                                       "Celu",
                                                                       "Clip",
                                                                       "Concat",
                                                                       "Conv",
                                                                       "ConvTranspose",
                                                                       "Cos",
                                                                       "Cosh",
                                                                       "CumSum",
                                                                       "DepthToSpace",
                                                                       "Div",
                                                                       "Einsum",
                                                                       "Elu",
                                                                       "Erf",
                                                                       "Exp",
                                                                       "Expand",
                                                                       "Flatten",
                                                                       "Floor",
                                                                       "Gather",
                                                                       "GatherElements",
                                                                       "GatherND",
                                                                       "Gelu",
                                                                       "Gemm",
                                                                       "GlobalAveragePool",
                                                                       "GlobalMaxPool",
                                                                       "HardSigmoid",
                                                                       "HardSwish",
                                                                       "Identity",
                                                                       "InstanceNormalization",
                                                                       "LayerNormalization",
                                                                       "LeakyRelu",
                                                                       "Log",
                                                                       "LogSoftmax",
                                                                       "MatMul",
                                                                       "Max",
                                                                       "MaxPool",
                                                                       "Mean",
                                                                       "Min",
                                                                       "Mish",
                                                                       "Mod",
                                                                       "Mul",
                                                                       "Neg",
                                                                       "Pad",
                                                                       "Pow",
                                                                       "PRelu",
                                                                       "Reciprocal",
                                                                       "ReduceL1",
                                                                       "ReduceL2",
                                                                       "ReduceLogSum",
                                                                       "ReduceLogSumExp",
                                                                       "ReduceMax",
                                                                       "ReduceMean",
                                                                       "ReduceMin",
                                                                       "ReduceProd",
                                                                       "ReduceSum",
                                                                       "ReduceSumSquare",
                                                                       "Relu",
                                                                       "Reshape",
                                                                       "Resize",
                                                                       "Round",
                                                                       "ScatterElements",
                                                                       "ScatterND",
                                                                       "Selu",
                                                                       "Shrink",
                                                                       "Sigmoid",
                                                                       "Sign",
                                                                       "Sin",
                                                                       "Sinh",
                                                                       "Slice",
                                                                       "Softmax",
                                                                       "Softplus",
                                                                       "Softsign",
                                                                       "SpaceToDepth",
                                                                       "Split",
                                                                       "Sqrt",
                                                                       "Squeeze",
                                                                       "Sub",
                                                                       "Sum",
                                                                       "Tan",
                                                                       "Tanh",
                                                                       "ThresholdedRelu",
                                                                       "Tile",
                                                                       "TopK",
                                                                       "Transpose",
                                                                       "Trilu",
                                                                       "Unsqueeze"};
    static const std::unordered_set<std::string_view> kBool = {
        "And", "Equal", "Greater", "GreaterOrEqual", "IsInf", "IsNaN", "Less", "LessOrEqual",
        "Not", "Or",    "Xor"};
    static const std::unordered_set<std::string_view> kInt64 = {"ArgMax", "ArgMin", "NonZero",
                                                                "Shape", "Size"};
    if (n.output_size() < 1 || n.output(0).empty() || elem_types_.count(n.output(0))) return;
    const std::string& op = n.op_type();
    int32_t type = 0;
    if (kSameAsInput0.count(op) || op == "Range") {
      type = ElemType(InputName(n, 0));
    } else if (op == "Where") {
      type = ElemType(InputName(n, 1));
    } else if (kBool.count(op)) {
      type = onnx::TensorProto::BOOL;
    } else if (kInt64.count(op)) {
      type = onnx::TensorProto::INT64;
    } else if (op == "Cast") {
      if (const auto* to = FindAttr(n, "to")) type = static_cast<int32_t>(to->i());
    } else if (op == "ConstantOfShape") {
      const auto* value = FindAttr(n, "value");
      type = value && value->has_t() ? value->t().data_type() : onnx::TensorProto::FLOAT;
    }
    if (type != 0) elem_types_[n.output(0)] = type;
  }

  static int64_t Numel(const onnx::TensorProto& t) {
    int64_t n = 1;
    for (int64_t d : t.dims()) n = d <= 0 ? 0 : SatMul(n, d);  // sizes are checked at import
    return n;
  }

  void RecordConstant(const onnx::NodeProto& n) {
    if (n.output_size() < 1) return;
    const std::string& out = n.output(0);
    if (const auto* a = FindAttr(n, "value_int")) ints_[out] = {a->i()};
    if (const auto* a = FindAttr(n, "value_ints"); a && a->ints_size() <= 64) {
      ints_[out] = {a->ints().begin(), a->ints().end()};
    }
    if (const auto* a = FindAttr(n, "value"); a && a->has_t()) {
      if (auto v = SmallInts(a->t())) ints_[out] = std::move(*v);
      elem_types_[out] = a->t().data_type();
      ranks_[out] = a->t().dims_size();
      dims_[out] = {a->t().dims().begin(), a->t().dims().end()};
      numel_[out] = Numel(a->t());
    } else if (FindAttr(n, "value_float") || FindAttr(n, "value_int")) {
      elem_types_[out] =
          FindAttr(n, "value_float") ? onnx::TensorProto::FLOAT : onnx::TensorProto::INT64;
      ranks_[out] = 0;
      numel_[out] = 1;
    } else if (const auto* f = FindAttr(n, "value_floats")) {
      elem_types_[out] = onnx::TensorProto::FLOAT;
      ranks_[out] = 1;
      numel_[out] = f->floats_size();
    } else if (const auto* i = FindAttr(n, "value_ints")) {
      elem_types_[out] = onnx::TensorProto::INT64;
      ranks_[out] = 1;
      numel_[out] = i->ints_size();
    }
  }

  // Emits a Constant node (before the node being rewritten) and returns its output's name.
  std::string EmitConstant(const onnx::NodeProto& owner, const std::string& what,
                           onnx::TensorProto t) {
    NormalizedNode c;
    c.origin = owner.name();
    c.node.set_op_type("Constant");
    c.node.set_name(FreshNodeName(owner.name() + "/" + what));
    std::string out = FreshValueName(owner.name() + "/" + what);
    c.node.add_output(out);
    elem_types_[out] = t.data_type();
    ranks_[out] = t.dims_size();
    dims_[out] = {t.dims().begin(), t.dims().end()};
    numel_[out] = Numel(t);
    if (auto v = SmallInts(t)) ints_[out] = std::move(*v);
    t.set_name(out);
    auto* a = c.node.add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    *a->mutable_t() = std::move(t);
    out_->push_back(std::move(c));
    return out;
  }
  std::string ConstInts(const onnx::NodeProto& owner, const std::string& what,
                        const std::vector<int64_t>& v) {
    onnx::TensorProto t;
    t.set_data_type(onnx::TensorProto::INT64);
    t.add_dims(static_cast<int64_t>(v.size()));
    for (int64_t x : v) t.add_int64_data(x);
    return EmitConstant(owner, what, std::move(t));
  }
  std::string ConstFloats(const onnx::NodeProto& owner, const std::string& what,
                          const std::vector<float>& v) {
    onnx::TensorProto t;
    t.set_data_type(onnx::TensorProto::FLOAT);
    t.add_dims(static_cast<int64_t>(v.size()));
    for (float x : v) t.add_float_data(x);
    return EmitConstant(owner, what, std::move(t));
  }
  // A scalar of the element type of `like` when known (float types), float32 otherwise.
  std::string ConstScalarLike(const onnx::NodeProto& owner, const std::string& what,
                              const std::string& like, float value) {
    int32_t type = onnx::TensorProto::FLOAT;
    if (auto it = elem_types_.find(like); it != elem_types_.end()) {
      if (it->second == onnx::TensorProto::FLOAT16 || it->second == onnx::TensorProto::BFLOAT16)
        type = it->second;
    }
    onnx::TensorProto t;
    t.set_data_type(type);
    if (type == onnx::TensorProto::FLOAT) {
      t.add_float_data(value);
    } else if (type == onnx::TensorProto::FLOAT16) {
      t.add_int32_data(FloatToHalfBits(value));
    } else {
      t.add_int32_data(FloatToBFloat16Bits(value));
    }
    return EmitConstant(owner, what, std::move(t));
  }

  bool IsEmptyConstant(const std::string& name) {
    auto it = numel_.find(name);
    return !name.empty() && it != numel_.end() && it->second == 0;
  }

  // Moves attribute `attr` (ints) to input `index` as an int64 constant; `required`: error when
  // the attribute is absent.
  Status IntsAttrToInput(onnx::NodeProto* n, const char* attr, int index, bool required) {
    const auto* a = FindAttr(*n, attr);
    if (!a) {
      if (required) {
        return MakeError(ErrorCode::kInvalidAttribute,
                         "node '{}' ({}) lacks the required attribute '{}'", n->name(),
                         n->op_type(), attr);
      }
      return OkStatus();
    }
    std::string c = ConstInts(*n, attr, Ints(*a));
    EraseAttr(n, attr);
    SetInputName(n, index, c);
    return OkStatus();
  }

  Status Rewrite(onnx::NodeProto* n, int* version) {
    const std::string& op = n->op_type();
    const int v = *version;
    if (op == "Slice" && v < 10) {
      KILN_RETURN_IF_ERROR(IntsAttrToInput(n, "starts", 1, true));
      KILN_RETURN_IF_ERROR(IntsAttrToInput(n, "ends", 2, true));
      KILN_RETURN_IF_ERROR(IntsAttrToInput(n, "axes", 3, false));
      *version = 10;
    } else if (op == "Pad" && v < 11) {
      if (FindAttr(*n, "paddings")) {  // Pad-1's name for pads
        auto* a = n->mutable_attribute();
        for (auto& x : *a) {
          if (x.name() == "paddings") x.set_name("pads");
        }
      }
      KILN_RETURN_IF_ERROR(IntsAttrToInput(n, "pads", 1, true));
      if (const auto* value = FindAttr(*n, "value"); value && value->f() != 0.0f) {
        SetInputName(n, 2, ConstScalarLike(*n, "constant_value", InputName(*n, 0), value->f()));
      }
      EraseAttr(n, "value");
      *version = 11;
    } else if (op == "Clip" && v < 11) {
      std::string x = InputName(*n, 0);
      if (const auto* a = FindAttr(*n, "min"))
        SetInputName(n, 1, ConstScalarLike(*n, "min", x, a->f()));
      if (const auto* a = FindAttr(*n, "max"))
        SetInputName(n, 2, ConstScalarLike(*n, "max", x, a->f()));
      EraseAttr(n, "min");
      EraseAttr(n, "max");
      *version = 11;
    } else if ((op == "Squeeze" || op == "Unsqueeze") && v < 13) {
      KILN_RETURN_IF_ERROR(IntsAttrToInput(n, "axes", 1, op == "Unsqueeze"));
      *version = 13;
    } else if ((op == "ReduceSum" && v < 13) || (ReduceOpsAxesInput18().count(op) && v < 18)) {
      KILN_RETURN_IF_ERROR(IntsAttrToInput(n, "axes", 1, false));
      *version = op == "ReduceSum" ? 13 : 18;
    } else if (op == "Split" && v < 18) {
      if (v < 13) KILN_RETURN_IF_ERROR(IntsAttrToInput(n, "split", 1, false));
      if (InputName(*n, 1).empty()) {
        SetIntAttr(n, "num_outputs", n->output_size());
        *version = 18;
      } else {
        *version = 13;
      }
    } else if (op == "TopK" && v < 10) {
      const auto* k = FindAttr(*n, "k");
      if (!k) {
        return MakeError(ErrorCode::kInvalidAttribute, "node '{}' (TopK) lacks attribute 'k'",
                         n->name());
      }
      SetInputName(n, 1, ConstInts(*n, "k", {k->i()}));
      EraseAttr(n, "k");
      *version = 10;
    } else if (op == "Scatter") {
      n->set_op_type("ScatterElements");
      *version = 11;
    } else if (op == "Upsample") {
      KILN_RETURN_IF_ERROR(RewriteUpsample(n, v));
      *version = 13;
    } else if (op == "Resize") {
      if (v == 10) {
        // Resize-10 is (X, scales) with asymmetric coordinates.
        std::string scales = InputName(*n, 1);
        SetInputName(n, 1, "");
        SetInputName(n, 2, scales);
        SetStringAttr(n, "coordinate_transformation_mode", "asymmetric");
        if (FindAttr(*n, "mode") == nullptr || FindAttr(*n, "mode")->s() == "nearest") {
          SetStringAttr(n, "nearest_mode", "floor");
        }
        *version = 13;
      }
      // Resize-11 needs roi and scales present even when unused (empty tensors); the canonical
      // form omits them.
      for (int i : {1, 2}) {
        if (IsEmptyConstant(InputName(*n, i))) SetInputName(n, i, "");
      }
      TrimInputs(n);
      if (*version < 13) *version = 13;
    } else if (op == "RoiAlign" && v < 16) {
      // RoiAlign-10 samples without the half-pixel shift (16's output_half_pixel).
      if (!FindAttr(*n, "coordinate_transformation_mode")) {
        SetStringAttr(n, "coordinate_transformation_mode", "output_half_pixel");
      }
      *version = 16;
    } else if (op == "QLinearConv" && n->input_size() >= 8 && n->output_size() == 1) {
      // (Malformed arities stay QLinearConv, which is reported unsupported.)
      RewriteQLinearConv(n);
      *version = 1;
    } else if (op == "Swish") {
      RewriteSwish(n);
      *version = EffectiveOpVersion("Mul", opset_);
    } else if (op == "DFT" && v < 20) {
      // DFT-17's axis attribute (default 1) is DFT-20's input 2 (default -2).
      const auto* axis = FindAttr(*n, "axis");
      SetInputName(n, 2, ConstInts(*n, "axis", {axis ? axis->i() : 1}));
      EraseAttr(n, "axis");
      *version = 20;
    } else if (op == "GridSample" && v < 20) {
      // GridSample-16 names the modes bilinear/bicubic (default bilinear); 20 linear/cubic.
      std::string mode = FindAttr(*n, "mode") ? FindAttr(*n, "mode")->s() : "bilinear";
      if (mode == "bilinear") mode = "linear";
      if (mode == "bicubic") mode = "cubic";
      SetStringAttr(n, "mode", mode);
      *version = 20;
    } else if ((op == "Softmax" || op == "LogSoftmax" || op == "Hardmax") && v < 13) {
      KILN_RETURN_IF_ERROR(RewriteCoerce2D(n));
      *version = 13;
    } else if (op == "BatchNormalization" && v < 9) {
      if (const auto* spatial = FindAttr(*n, "spatial"); spatial && spatial->i() == 0) {
        return MakeError(ErrorCode::kInvalidAttribute,
                         "node '{}' (BatchNormalization-{}) has spatial=0 (per-element "
                         "statistics), which kiln does not support; re-export with opset >= 9",
                         n->name(), v);
      }
      EraseAttr(n, "spatial");
      EraseAttr(n, "is_test");
      EraseAttr(n, "consumed_inputs");
      *version = 9;
    } else if (op == "Dropout") {
      RewriteDropout(n);
      *version = 1;
    } else if (op == "CastLike") {
      // CastLike(x, like) is Cast(x, to = like's element type) when that type is declared (an
      // input, initializer or value_info): the `like` operand is then no longer read. Without a
      // declared type it stays CastLike, which kiln does not implement (reported in KILN-E2004).
      auto like = elem_types_.find(InputName(*n, 1));
      if (n->input_size() == 2 && like != elem_types_.end()) {
        n->mutable_input()->RemoveLast();
        n->set_op_type("Cast");
        SetIntAttr(n, "to", like->second);
        *version = EffectiveOpVersion("Cast", opset_);
      }
    }
    return OkStatus();
  }

  // ai.onnx.ml ops that are default-domain ops in other words: Binarizer(x; threshold) is
  // Cast(Greater(x, threshold), to = x's type) (x's type must be known: float, double, int32 or
  // int64), ArrayFeatureExtractor(x, indices) is Gather(x, indices, axis = -1). False: left as
  // it is (reported unsupported).
  bool RewriteMl(onnx::NodeProto* n) {
    if (n->op_type() == "ArrayFeatureExtractor" && n->input_size() == 2) {
      n->set_domain("");
      n->set_op_type("Gather");
      SetIntAttr(n, "axis", -1);
      return true;
    }
    if (n->op_type() != "Binarizer" || n->input_size() != 1 || n->output_size() != 1) return false;
    const int32_t type = ElemType(n->input(0));
    onnx::TensorProto t;
    t.set_data_type(type);
    const auto* a = FindAttr(*n, "threshold");
    const float threshold = a ? a->f() : 0.0f;
    switch (type) {
      case onnx::TensorProto::FLOAT:
        t.add_float_data(threshold);
        break;
      case onnx::TensorProto::DOUBLE:
        t.add_double_data(threshold);
        break;
      case onnx::TensorProto::INT32:
      case onnx::TensorProto::INT64:
        // x > threshold for integers is x > floor(threshold).
        if (type == onnx::TensorProto::INT32) {
          t.add_int32_data(static_cast<int32_t>(std::floor(threshold)));
        } else {
          t.add_int64_data(static_cast<int64_t>(std::floor(threshold)));
        }
        break;
      default:
        return false;
    }
    const std::string c = EmitConstant(*n, "threshold", std::move(t));
    const std::string gt = FreshValueName(n->name() + "/greater");
    EmitBefore(*n, "Greater", "greater", {n->input(0), c}, gt);
    n->set_domain("");
    n->set_op_type("Cast");
    n->clear_attribute();
    n->clear_input();
    n->add_input(gt);
    SetIntAttr(n, "to", type);
    return true;
  }

  // A node that the rewrites add before the node being rewritten, at the canonical version of
  // its op (the form kiln implements, whatever the model's opset).
  void EmitBefore(const onnx::NodeProto& owner, const std::string& op, const std::string& what,
                  std::vector<std::string> inputs, const std::string& output) {
    NormalizedNode nn;
    nn.origin = owner.name();
    const OpSchema* schema = FindOpSchema(op);
    nn.version = schema ? schema->latest_opset : 1;
    nn.node.set_op_type(op);
    nn.node.set_name(FreshNodeName(owner.name() + "/" + what));
    for (auto& i : inputs) nn.node.add_input(std::move(i));
    nn.node.add_output(output);
    out_->push_back(std::move(nn));
  }

  // QLinearConv(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, B?) is its QDQ form:
  // QuantizeLinear(Conv(DQ(x), DQ(w, axis 0), DQ(B, x_scale * w_scale, axis 0)), y_scale, y_zp),
  // which every backend runs (and qdq_fusion turns back into an INT8 convolution).
  void RewriteQLinearConv(onnx::NodeProto* n) {
    const std::string name = n->name();
    auto in = [&](int i) { return InputName(*n, i); };
    const std::string xf = FreshValueName(name + "/x"), wf = FreshValueName(name + "/w");
    EmitBefore(*n, "DequantizeLinear", "x", {in(0), in(1), in(2)}, xf);
    EmitBefore(*n, "DequantizeLinear", "w", {in(3), in(4), in(5)}, wf);
    SetIntAttr(&out_->back().node, "axis", 0);
    std::string bf;
    if (!in(8).empty()) {
      const std::string scale = FreshValueName(name + "/bias_scale");
      EmitBefore(*n, "Mul", "bias_scale", {in(1), in(4)}, scale);
      bf = FreshValueName(name + "/b");
      EmitBefore(*n, "DequantizeLinear", "b", {in(8), scale}, bf);
      SetIntAttr(&out_->back().node, "axis", 0);
    }
    const std::string y = n->output(0), yf = FreshValueName(name + "/y");
    const std::string ys = in(6), yzp = in(7);
    n->set_op_type("Conv");
    n->clear_input();
    n->add_input(xf);
    n->add_input(wf);
    if (!bf.empty()) n->add_input(bf);
    n->set_output(0, yf);
    NormalizedNode q;
    q.origin = name;
    q.version = FindOpSchema("QuantizeLinear")->latest_opset;
    q.node.set_op_type("QuantizeLinear");
    q.node.set_name(FreshNodeName(name + "/y"));
    q.node.add_input(yf);
    q.node.add_input(ys);
    if (!yzp.empty()) q.node.add_input(yzp);
    q.node.add_output(y);
    after_.push_back(std::move(q));
  }

  // Swish(x; alpha) = x * Sigmoid(alpha * x): Mul(x, Sigmoid(Mul(x, alpha))), where alpha is a
  // scalar of x's type (float32 when that is not known).
  void RewriteSwish(onnx::NodeProto* n) {
    const auto* a = FindAttr(*n, "alpha");
    const float alpha = a ? a->f() : 1.0f;
    const std::string x = InputName(*n, 0);
    std::string scaled = x;
    if (alpha != 1.0f) {
      const std::string c = ConstScalarLike(*n, "alpha", x, alpha);
      scaled = FreshValueName(n->name() + "/scaled");
      NormalizedNode mul;
      mul.origin = n->name();
      mul.version = EffectiveOpVersion("Mul", opset_);
      mul.node.set_op_type("Mul");
      mul.node.set_name(FreshNodeName(n->name() + "/scaled"));
      mul.node.add_input(x);
      mul.node.add_input(c);
      mul.node.add_output(scaled);
      out_->push_back(std::move(mul));
    }
    const std::string gate = FreshValueName(n->name() + "/sigmoid");
    NormalizedNode sig;
    sig.origin = n->name();
    sig.version = EffectiveOpVersion("Sigmoid", opset_);
    sig.node.set_op_type("Sigmoid");
    sig.node.set_name(FreshNodeName(n->name() + "/sigmoid"));
    sig.node.add_input(scaled);
    sig.node.add_output(gate);
    out_->push_back(std::move(sig));
    n->set_op_type("Mul");
    n->clear_attribute();
    n->clear_input();
    n->add_input(x);
    n->add_input(gate);
  }

  Status RewriteUpsample(onnx::NodeProto* n, int v) {
    std::string scales;
    if (v < 9) {
      const auto* a = FindAttr(*n, "scales");
      if (!a) {
        return MakeError(ErrorCode::kInvalidAttribute,
                         "node '{}' (Upsample-{}) lacks attribute 'scales'", n->name(), v);
      }
      scales = ConstFloats(*n, "scales", {a->floats().begin(), a->floats().end()});
      EraseAttr(n, "scales");
    } else {
      scales = InputName(*n, 1);
    }
    std::string mode = FindAttr(*n, "mode") ? FindAttr(*n, "mode")->s() : "nearest";
    if (mode == "bilinear") mode = "linear";
    std::string x = InputName(*n, 0);
    n->clear_input();
    n->add_input(x);
    n->add_input("");
    n->add_input(scales);
    n->set_op_type("Resize");
    SetStringAttr(n, "mode", mode);
    SetStringAttr(n, "coordinate_transformation_mode", "asymmetric");
    if (mode == "nearest") SetStringAttr(n, "nearest_mode", "floor");
    return OkStatus();
  }

  // Softmax/LogSoftmax/Hardmax before 13 flatten the input to 2-D at `axis` (default 1) and
  // normalise each row. The same as version 13 with axis=-1 when `axis` is the last axis;
  // otherwise rewritten as Shape + Flatten(axis) + op(axis=-1) + Reshape back.
  Status RewriteCoerce2D(onnx::NodeProto* n) {
    int64_t axis = FindAttr(*n, "axis") ? FindAttr(*n, "axis")->i() : 1;
    std::string x = InputName(*n, 0);
    std::optional<int64_t> rank;
    if (auto it = ranks_.find(x); it != ranks_.end()) rank = it->second;
    bool last = axis == -1 || (rank && (axis < 0 ? axis + *rank : axis) == *rank - 1);
    SetIntAttr(n, "axis", -1);
    if (last || n->output_size() < 1 || x.empty()) return OkStatus();

    std::string y = n->output(0);
    std::string shape = FreshValueName(n->name() + "/shape");
    std::string flat = FreshValueName(n->name() + "/flatten");
    std::string rows = FreshValueName(n->name() + "/rows");

    NormalizedNode shape_node;
    shape_node.origin = n->name();
    shape_node.version = 1;
    shape_node.node.set_op_type("Shape");
    shape_node.node.set_name(FreshNodeName(n->name() + "/shape"));
    shape_node.node.add_input(x);
    shape_node.node.add_output(shape);
    out_->push_back(std::move(shape_node));

    NormalizedNode flatten;
    flatten.origin = n->name();
    flatten.version = axis < 0 ? 11 : 1;
    flatten.node.set_op_type("Flatten");
    flatten.node.set_name(FreshNodeName(n->name() + "/flatten"));
    flatten.node.add_input(x);
    flatten.node.add_output(flat);
    SetIntAttr(&flatten.node, "axis", axis);
    out_->push_back(std::move(flatten));

    n->set_input(0, flat);
    n->set_output(0, rows);

    NormalizedNode reshape;
    reshape.origin = n->name();
    reshape.version = 5;
    reshape.node.set_op_type("Reshape");
    reshape.node.set_name(FreshNodeName(n->name() + "/reshape"));
    reshape.node.add_input(rows);
    reshape.node.add_input(shape);
    reshape.node.add_output(y);
    after_.push_back(std::move(reshape));
    return OkStatus();
  }

  // Dropout is the identity at inference. Its optional mask output (all kept) becomes
  // ConstantOfShape(Shape(x), true) when the model names it.
  void RewriteDropout(onnx::NodeProto* n) {
    std::string x = InputName(*n, 0);
    std::string mask = n->output_size() > 1 ? n->output(1) : std::string();
    n->set_op_type("Identity");
    n->clear_attribute();
    n->clear_input();
    n->add_input(x);
    while (n->output_size() > 1) n->mutable_output()->RemoveLast();
    if (mask.empty()) return;
    std::string shape = FreshValueName(n->name() + "/mask_shape");
    NormalizedNode s;
    s.origin = n->name();
    s.version = 1;
    s.node.set_op_type("Shape");
    s.node.set_name(FreshNodeName(n->name() + "/mask_shape"));
    s.node.add_input(x);
    s.node.add_output(shape);
    after_.push_back(std::move(s));
    NormalizedNode c;
    c.origin = n->name();
    c.version = 9;
    c.node.set_op_type("ConstantOfShape");
    c.node.set_name(FreshNodeName(n->name() + "/mask"));
    c.node.add_input(shape);
    c.node.add_output(mask);
    auto* a = c.node.add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    onnx::TensorProto* t = a->mutable_t();
    t->add_dims(1);
    if (opset_ >= 10) {  // Dropout-10 made the mask bool (a type-only change)
      t->set_data_type(onnx::TensorProto::BOOL);
      t->add_int32_data(1);
    } else {  // Dropout-7's mask has the input's type
      t->set_data_type(onnx::TensorProto::FLOAT);
      t->add_float_data(1.0f);
    }
    after_.push_back(std::move(c));
  }

  bool IsComposite(const std::string& v) const {
    return seqs_.count(v) || optionals_.count(v) || unknown_.count(v);
  }

  // Sequence- and optional-typed graph inputs become tensor inputs (README.md, "Sequences and
  // optionals"): a sequence of length N is `<input>.0` ... `<input>.N-1`, a dim_param P of its
  // element type the symbol `<input>.<k>_P` per element (ONNX's sequences hold elements of
  // different shapes under one declared type); a present optional is its tensor under the
  // input's own name (or its sequence's tensors), an absent one no input at all.
  Status SpecializeInputs() {
    std::unordered_set<std::string> inits, names;
    for (const auto& t : graph_->initializer()) inits.insert(t.name());
    for (const auto& vi : graph_->input()) names.insert(vi.name());
    for (const auto& vi : graph_->output()) names.insert(vi.name());
    for (const auto& vi : graph_->value_info()) names.insert(vi.name());
    for (const auto& n : graph_->node()) {
      for (const auto& o : n.output()) names.insert(o);
      for (const auto& i : n.input()) names.insert(i);
    }
    names.insert(inits.begin(), inits.end());
    google::protobuf::RepeatedPtrField<onnx::ValueInfoProto> rewritten;
    for (auto& in : *graph_->mutable_input()) {
      if (inits.count(in.name())) {
        *rewritten.Add() = std::move(in);
        continue;
      }
      const std::string name = in.name();
      OnnxValueBinding b{name, KindOfType(in.type()), true, {}};
      const bool optional =
          b.kind == OnnxValueKind::kOptionalTensor || b.kind == OnnxValueKind::kOptionalSequence;
      if (optional && io_->options && io_->options->absent_inputs.count(name)) {
        b.present = false;
        DefineOptional(name, std::nullopt);
        io_->inputs.push_back(std::move(b));
        continue;
      }
      if (b.kind == OnnxValueKind::kOptionalTensor) {
        onnx::ValueInfoProto t;
        t.set_name(name);
        *t.mutable_type() = in.type().optional_type().elem_type();
        *rewritten.Add() = std::move(t);
        DefineOptional(name, name);
        b.tensors = {name};
        io_->inputs.push_back(std::move(b));
        continue;
      }
      if (b.kind != OnnxValueKind::kSequence && b.kind != OnnxValueKind::kOptionalSequence) {
        if (b.kind == OnnxValueKind::kTensor) b.tensors = {name};
        *rewritten.Add() = std::move(in);
        io_->inputs.push_back(std::move(b));
        continue;
      }
      const onnx::TypeProto& elem =
          optional ? in.type().optional_type().elem_type().sequence_type().elem_type()
                   : in.type().sequence_type().elem_type();
      SequenceInputSpec spec;
      bool given = false;
      if (io_->options) {
        auto it = io_->options->sequence_inputs.find(name);
        given = it != io_->options->sequence_inputs.end();
        if (given) spec = it->second;
      }
      if (!given && io_->probe) {
        spec.length = 1;
      } else if (!given) {
        unknown_.emplace(name, fmt::format("graph input '{}' is a sequence whose length was not "
                                           "given at build time",
                                           name));
        *rewritten.Add() = std::move(in);
        io_->inputs.push_back(std::move(b));
        continue;
      }
      if (spec.length < 0) {
        return MakeError(ErrorCode::kInvalidArgument,
                         "sequence input '{}' is given length {}; a length is >= 0", name,
                         spec.length);
      }
      std::vector<std::string> elems;
      for (int64_t k = 0; k < spec.length; ++k) {
        onnx::ValueInfoProto e;
        e.set_name(fmt::format("{}.{}", name, k));
        if (names.count(e.name())) {
          return MakeError(ErrorCode::kInvalidModel,
                           "element {} of sequence input '{}' becomes engine input '{}', a name "
                           "the model already uses; rename that value",
                           k, name, e.name());
        }
        *e.mutable_type() = elem;
        auto* tt = e.mutable_type()->mutable_tensor_type();
        if (!tt->has_shape() && spec.element_rank >= 0) {
          for (int d = 0; d < spec.element_rank; ++d) tt->mutable_shape()->add_dim();
        }
        for (auto& d : *tt->mutable_shape()->mutable_dim()) {
          if (d.has_dim_param() && !d.dim_param().empty()) {
            d.set_dim_param(fmt::format("{}_{}", e.name(), d.dim_param()));
          }
        }
        elems.push_back(e.name());
        b.tensors.push_back(e.name());
        *rewritten.Add() = std::move(e);
      }
      DefineSequence(name, std::move(elems));
      if (optional) DefineOptional(name, name);
      io_->inputs.push_back(std::move(b));
    }
    graph_->mutable_input()->Swap(&rewritten);
    return OkStatus();
  }

  // Sequence and optional graph outputs become the tensors they hold: `<output>.0` ...
  // `<output>.N-1` (Identity of each element), a present optional tensor `<output>`, an absent
  // optional or an empty sequence nothing.
  Status SpecializeOutputs() {
    google::protobuf::RepeatedPtrField<onnx::ValueInfoProto> rewritten;
    const OpSchema* identity = FindOpSchema("Identity");
    auto emit_identity = [&](const std::string& from, const std::string& to) {
      NormalizedNode nn;
      nn.version = identity->latest_opset;
      nn.node.set_op_type("Identity");
      nn.node.set_name(FreshNodeName(to + "/output"));
      nn.node.add_input(from);
      nn.node.add_output(to);
      nn.origin = nn.node.name();
      out_->push_back(std::move(nn));
    };
    for (auto& out : *graph_->mutable_output()) {
      const std::string name = out.name();
      OnnxValueBinding b{name, KindOfType(out.type()), true, {}};
      std::string value = name;
      if (auto it = optionals_.find(name); it != optionals_.end()) {
        if (b.kind != OnnxValueKind::kOptionalSequence) b.kind = OnnxValueKind::kOptionalTensor;
        if (!it->second) {
          b.present = false;
          io_->outputs.push_back(std::move(b));
          continue;
        }
        value = *it->second;
        if (seqs_.count(value)) b.kind = OnnxValueKind::kOptionalSequence;
      }
      const auto seq = seqs_.find(value);
      if (seq == seqs_.end() && !optionals_.count(name)) {
        // A tensor, or a composite kiln could not lower (reported with its producer).
        if (b.kind == OnnxValueKind::kTensor) b.tensors = {name};
        *rewritten.Add() = std::move(out);
        io_->outputs.push_back(std::move(b));
        continue;
      }
      if (seq == seqs_.end()) {  // a present optional tensor
        if (value != name) emit_identity(value, name);
        onnx::ValueInfoProto t;
        t.set_name(name);
        if (out.type().has_optional_type()) {
          *t.mutable_type() = out.type().optional_type().elem_type();
        }
        b.tensors = {name};
        *rewritten.Add() = std::move(t);
        io_->outputs.push_back(std::move(b));
        continue;
      }
      if (b.kind != OnnxValueKind::kOptionalSequence) b.kind = OnnxValueKind::kSequence;
      const std::vector<std::string> elems = seq->second;
      for (size_t k = 0; k < elems.size(); ++k) {
        std::string to = fmt::format("{}.{}", name, k);
        if (taken_.count(to)) {
          return MakeError(ErrorCode::kInvalidModel,
                           "element {} of sequence output '{}' becomes engine output '{}', a "
                           "name the model already uses; rename that value",
                           k, name, to);
        }
        taken_.insert(to);
        emit_identity(elems[k], to);
        onnx::ValueInfoProto t;
        t.set_name(to);
        if (int32_t et = ElemType(elems[k]))
          t.mutable_type()->mutable_tensor_type()->set_elem_type(et);
        b.tensors.push_back(to);
        *rewritten.Add() = std::move(t);
      }
      io_->outputs.push_back(std::move(b));
    }
    graph_->mutable_output()->Swap(&rewritten);
    return OkStatus();
  }

  onnx::GraphProto* graph_;
  int64_t opset_;
  std::vector<NormalizedNode>* out_;
  IoSpecialization* io_ = nullptr;
  // Sequences and optionals, which exist only here: a sequence's elements, an optional's value.
  std::unordered_map<std::string, std::vector<std::string>> seqs_;
  std::unordered_map<std::string, std::optional<std::string>> optionals_;
  std::unordered_map<std::string, std::string> unknown_;  // composites kiln could not resolve
  std::vector<NormalizedNode> after_;
  std::unordered_set<std::string> seen_;  // node names given out
  bool facts_ = false;                    // propagate facts through the nodes
  int depth_ = 0;                         // of inlined subgraphs
  int64_t inlined_nodes_ = 0;
  std::unordered_map<std::string, std::vector<int64_t>> ints_;  // small int/bool values known
  std::unordered_set<std::string> taken_;
  std::unordered_set<std::string> node_names_;
  std::unordered_map<std::string, int> node_counter_;
  std::unordered_map<std::string, int> value_counter_;
  std::unordered_map<std::string, int32_t> elem_types_;
  std::unordered_map<std::string, int> ranks_;
  std::unordered_map<std::string, std::vector<int64_t>> dims_;  // declared shapes (-1: no value)
  // Shapes with some dims unknown (-1), from Shape of such dims: Gather may pick known ones.
  std::unordered_map<std::string, std::vector<int64_t>> shape_vals_;
  std::unordered_map<std::string, int64_t> numel_;
};

// Versions older than the canonical form whose semantics differ and which kiln does not
// rewrite: reported as unsupported rather than imported with the wrong meaning.
struct IncompatibleVersion {
  std::string_view op;
  int first_ok;
  std::string_view why;
};
constexpr IncompatibleVersion kIncompatible[] = {
    {"GroupNormalization", 21, "scale and bias are per group before version 21"},
};

}  // namespace

Status NormalizeNodes(onnx::GraphProto* graph, int64_t opset, std::vector<NormalizedNode>* out,
                      IoSpecialization* io) {
  return Normalizer(graph, opset, out, io).Run();
}

OnnxValueKind KindOfType(const onnx::TypeProto& t) {
  if (t.has_tensor_type()) return OnnxValueKind::kTensor;
  if (t.has_sequence_type()) {
    return t.sequence_type().elem_type().has_tensor_type() ? OnnxValueKind::kSequence
                                                           : OnnxValueKind::kOther;
  }
  if (t.has_optional_type()) {
    const auto& e = t.optional_type().elem_type();
    if (e.has_tensor_type()) return OnnxValueKind::kOptionalTensor;
    if (e.has_sequence_type() && e.sequence_type().elem_type().has_tensor_type()) {
      return OnnxValueKind::kOptionalSequence;
    }
  }
  return OnnxValueKind::kOther;
}

Status CheckSequenceInputs(const onnx::GraphProto& graph, const ImportOptions& options) {
  std::unordered_set<std::string> inits;
  for (const auto& t : graph.initializer()) inits.insert(t.name());
  std::vector<std::string> missing;
  for (const auto& in : graph.input()) {
    if (inits.count(in.name())) continue;
    const OnnxValueKind kind = KindOfType(in.type());
    if (kind == OnnxValueKind::kSequence && !options.sequence_inputs.count(in.name())) {
      missing.push_back(in.name());
    }
    if (kind == OnnxValueKind::kOptionalSequence && !options.absent_inputs.count(in.name()) &&
        !options.sequence_inputs.count(in.name())) {
      missing.push_back(in.name());
    }
  }
  if (missing.empty()) return OkStatus();
  return MakeError(ErrorCode::kSequenceInputUnspecialized,
                   "graph input(s) '{}' are sequences of tensors; kiln's engines take tensors, "
                   "so a sequence input is specialised to a length fixed at build time: give "
                   "it (`kiln build --sequence-input NAME=LENGTH`, ImportOptions::"
                   "sequence_inputs), and it becomes inputs NAME.0 ... NAME.LENGTH-1",
                   fmt::join(missing, "', '"));
}

void MergeUnsupportedOps(std::vector<OnnxUnsupportedOp> more,
                         std::vector<OnnxUnsupportedOp>* into) {
  for (OnnxUnsupportedOp& op : more) {
    auto same = std::find_if(into->begin(), into->end(),
                             [&](const OnnxUnsupportedOp& u) { return u.op_type == op.op_type; });
    if (same == into->end()) {
      into->push_back(std::move(op));
      continue;
    }
    for (std::string& n : op.node_names) same->node_names.push_back(std::move(n));
  }
}

namespace {

Status SubgraphUnsupportedOps(const onnx::GraphProto& g, int64_t opset, const std::string& path,
                              int depth, std::vector<OnnxUnsupportedOp>* out);

Status NodeSubgraphUnsupportedOps(const onnx::NodeProto& n, int64_t opset, const std::string& path,
                                  int depth, std::vector<OnnxUnsupportedOp>* out) {
  {
    {
      for (const auto& a : n.attribute()) {
        std::vector<const onnx::GraphProto*> subs;
        if (a.has_g()) subs.push_back(&a.g());
        for (const auto& sg : a.graphs()) subs.push_back(&sg);
        for (const onnx::GraphProto* sub : subs) {
          const std::string where = fmt::format("{}{} '{}'.{}", path.empty() ? "" : path + " > ",
                                                n.op_type(), n.name(), a.name());
          onnx::GraphProto copy = *sub;  // normalising takes the nodes out
          std::vector<NormalizedNode> nodes;
          KILN_RETURN_IF_ERROR(NormalizeNodes(&copy, opset, &nodes));
          std::vector<OnnxUnsupportedOp> found = FindUnsupportedOps(nodes, opset);
          for (OnnxUnsupportedOp& op : found) {
            for (std::string& name : op.node_names) name += " (in " + where + ")";
          }
          MergeUnsupportedOps(std::move(found), out);
          KILN_RETURN_IF_ERROR(SubgraphUnsupportedOps(*sub, opset, where, depth + 1, out));
        }
      }
    }
  }
  return OkStatus();
}

Status SubgraphUnsupportedOps(const onnx::GraphProto& g, int64_t opset, const std::string& path,
                              int depth, std::vector<OnnxUnsupportedOp>* out) {
  if (depth > 64) return MakeError(ErrorCode::kInvalidModel, "subgraphs nested more than 64 deep");
  for (const auto& n : g.node()) {
    KILN_RETURN_IF_ERROR(NodeSubgraphUnsupportedOps(n, opset, path, depth, out));
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::vector<OnnxUnsupportedOp>> FindUnsupportedOpsInSubgraphs(
    const std::vector<NormalizedNode>& nodes, int64_t opset) {
  std::vector<OnnxUnsupportedOp> out;
  for (const NormalizedNode& nn : nodes) {
    KILN_RETURN_IF_ERROR(NodeSubgraphUnsupportedOps(nn.node, opset, "", 0, &out));
  }
  return out;
}

std::vector<OnnxUnsupportedOp> FindUnsupportedOps(const std::vector<NormalizedNode>& nodes,
                                                  int64_t opset) {
  std::vector<OnnxUnsupportedOp> result;
  std::unordered_map<std::string, size_t> index;
  auto add = [&](const std::string& key, const std::string& reason, const std::string& node) {
    auto [it, inserted] = index.emplace(key, result.size());
    if (inserted) result.push_back({key, reason, {}});
    result[it->second].node_names.push_back(node);
  };
  for (const NormalizedNode& nn : nodes) {
    const onnx::NodeProto& n = nn.node;
    const std::string& name = nn.origin.empty() ? n.name() : nn.origin;
    if (!IsDefaultDomain(n.domain())) {
      add(n.domain() + ":" + n.op_type(),
          !nn.unsupported.empty()
              ? nn.unsupported
              : fmt::format("custom domain '{}' (kiln implements only the ai.onnx domain)",
                            n.domain()),
          name);
      continue;
    }
    if (n.op_type() == "Constant") continue;  // becomes a graph constant
    if (!nn.unsupported.empty()) {
      // Control flow that could not be lowered: the reason does not depend on the version.
      add(IsControlFlowOp(n) ? n.op_type() : fmt::format("{}-{}", n.op_type(), nn.version),
          nn.unsupported, name);
      continue;
    }
    const OpSchema* schema = FindOpSchema(n.op_type());
    if (!schema || n.op_type().empty()) {
      add(n.op_type(),
          IsOnnxOp(n.op_type()) ? "not implemented by kiln" : "not an ONNX (ai.onnx) operator",
          name);
      continue;
    }
    if (nn.version == 0) {
      add(n.op_type(),
          opset == 0 ? std::string("the model imports no ai.onnx opset")
                     : fmt::format("not defined in ONNX opset {}", opset),
          name);
      continue;
    }
    if (nn.version > schema->latest_opset) {
      add(fmt::format("{}-{}", n.op_type(), nn.version),
          fmt::format("kiln implements {} up to version {}", n.op_type(), schema->latest_opset),
          name);
      continue;
    }
    for (const auto& inc : kIncompatible) {
      if (inc.op == n.op_type() && nn.version < inc.first_ok) {
        add(fmt::format("{}-{}", n.op_type(), nn.version),
            fmt::format("{}; re-export with opset >= {}", inc.why, inc.first_ok), name);
      }
    }
  }
  return result;
}

Status UnsupportedOpsError(const std::vector<OnnxUnsupportedOp>& unsupported) {
  size_t nodes = 0;
  for (const auto& u : unsupported) nodes += u.node_names.size();
  constexpr size_t kNamesShown = 4;
  std::string msg = fmt::format("{} node(s) of {} operator type(s) are not supported:", nodes,
                                unsupported.size());
  for (const auto& u : unsupported) {
    std::vector<std::string> shown;
    for (size_t i = 0; i < u.node_names.size() && i < kNamesShown; ++i) {
      shown.push_back("'" + u.node_names[i] + "'");
    }
    std::string more = u.node_names.size() > kNamesShown
                           ? fmt::format(" and {} more", u.node_names.size() - kNamesShown)
                           : "";
    msg += fmt::format("\n  {} x{} ({}): {}{}", u.op_type, u.node_names.size(), u.reason,
                       fmt::join(shown, ", "), more);
  }
  return Status(ErrorCode::kUnsupportedOps, std::move(msg));
}

StatusOr<int64_t> DefaultOpset(const onnx::ModelProto& model) {
  std::optional<int64_t> opset;
  for (const auto& o : model.opset_import()) {
    if (IsDefaultDomain(o.domain())) opset = o.version();
  }
  if (!opset) {
    // IR 1-2 models predate opset_import (opset 1). A newer model without an ai.onnx import
    // uses only other domains (ai.onnx.ml, ...): 0, and the unsupported-op report names them.
    if (model.ir_version() >= 3) return int64_t{0};
    opset = 1;
  }
  if (*opset > kMaxOnnxOpset) {
    return MakeError(ErrorCode::kOpsetTooNew,
                     "the model uses ONNX opset {}; the newest opset kiln supports is {}", *opset,
                     kMaxOnnxOpset);
  }
  if (*opset < kMinOnnxOpset) {
    return MakeError(ErrorCode::kOpsetTooOld,
                     "the model uses ONNX opset {}; kiln reads opsets {} to {}", *opset,
                     kMinOnnxOpset, kMaxOnnxOpset);
  }
  return *opset;
}

}  // namespace kiln::onnx_internal
