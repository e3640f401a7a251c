// Op-version normalisation: every older form of an op is rewritten into the one canonical form
// the ops layer implements (attributes that became inputs, coerce-to-2D softmax, Upsample ->
// Resize, ...). README.md has the table. Also the unsupported-op report (KILN-E2004).
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
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

class Normalizer final : public ExpansionHost {
 public:
  Normalizer(onnx::GraphProto* graph, int64_t opset, std::vector<NormalizedNode>* out)
      : graph_(graph), opset_(opset), out_(out) {}

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
    for (int k = 1; taken_.count(name); ++k) name = fmt::format("{}_{}", hint, k);
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
    if (node.node.op_type() == "Constant") RecordConstant(node.node);
    out_->push_back(std::move(node));
  }
  int64_t opset() const override { return opset_; }

  Status Run() {
    CollectFacts();
    auto* nodes = graph_->mutable_node();
    out_->reserve(out_->size() + nodes->size());
    // Names first, so generated names never collide with a later node's own name.
    for (const auto& n : *nodes) {
      if (!n.name().empty()) node_names_.insert(n.name());
    }
    std::unordered_set<std::string> seen;
    seen.reserve(static_cast<size_t>(nodes->size()));
    const bool expands = std::any_of(nodes->begin(), nodes->end(), [](const onnx::NodeProto& n) {
      return IsDefaultDomain(n.domain()) &&
             (n.op_type() == "Attention" || n.op_type() == "RotaryEmbedding");
    });
    for (auto& proto : *nodes) {
      NormalizedNode nn;
      nn.node = std::move(proto);
      onnx::NodeProto& n = nn.node;
      if (n.name().empty() || !seen.insert(n.name()).second) {
        n.set_name(FreshNodeName(n.op_type().empty() ? std::string("node") : n.op_type()));
        seen.insert(n.name());
      }
      if (n.domain() == "ai.onnx.ml" && RewriteMl(&n)) {
        nn.version = FindOpSchema(n.op_type())->latest_opset;
        PropagateElemType(n);
        out_->push_back(std::move(nn));
        for (auto& a : after_) out_->push_back(std::move(a));
        after_.clear();
        continue;
      }
      if (!IsDefaultDomain(n.domain())) {
        out_->push_back(std::move(nn));
        continue;
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
        continue;
      }
      after_.clear();
      if ((n.op_type() == "Attention" || n.op_type() == "RotaryEmbedding") && nn.version >= 23) {
        // ONNX's ops of these names, not kiln's internal fusions: expanded into primitives.
        StatusOr<std::string> why = n.op_type() == "Attention"
                                        ? ExpandAttention(n, nn.version, *this)
                                        : ExpandRotaryEmbedding(n, *this);
        KILN_RETURN_IF_ERROR_CTX(why.status(), "while expanding node '{}' ({}-{})", n.name(),
                                 n.op_type(), nn.version);
        if (why->empty()) continue;
        nn.unsupported = std::move(why).value();
      }
      KILN_RETURN_IF_ERROR_CTX(Rewrite(&n, &nn.version), "while normalising node '{}' ({}-{})",
                               n.name(), n.op_type(), nn.version);
      if (expands) PropagateFacts(n);
      PropagateElemType(n);
      out_->push_back(std::move(nn));
      for (auto& a : after_) out_->push_back(std::move(a));
    }
    nodes->Clear();
    return OkStatus();
  }

 private:
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
    for (const auto& n : graph_->node()) {
      for (const auto& o : n.output()) taken_.insert(o);
      for (const auto& i : n.input()) taken_.insert(i);
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
    if (const auto* a = FindAttr(n, "value"); a && a->has_t()) {
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
    numel_[out] = Numel(t);
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

  onnx::GraphProto* graph_;
  int64_t opset_;
  std::vector<NormalizedNode>* out_;
  std::vector<NormalizedNode> after_;
  std::unordered_set<std::string> taken_;
  std::unordered_set<std::string> node_names_;
  std::unordered_map<std::string, int> node_counter_;
  std::unordered_map<std::string, int32_t> elem_types_;
  std::unordered_map<std::string, int> ranks_;
  std::unordered_map<std::string, std::vector<int64_t>> dims_;  // declared shapes (-1: no value)
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

Status NormalizeNodes(onnx::GraphProto* graph, int64_t opset, std::vector<NormalizedNode>* out) {
  return Normalizer(graph, opset, out).Run();
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
                              int depth, std::vector<OnnxUnsupportedOp>* out) {
  if (depth > 64) return MakeError(ErrorCode::kInvalidModel, "subgraphs nested more than 64 deep");
  for (const auto& n : g.node()) {
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
  return OkStatus();
}

}  // namespace

StatusOr<std::vector<OnnxUnsupportedOp>> FindUnsupportedOpsInSubgraphs(
    const onnx::GraphProto& graph, int64_t opset) {
  std::vector<OnnxUnsupportedOp> out;
  KILN_RETURN_IF_ERROR(SubgraphUnsupportedOps(graph, opset, "", 0, &out));
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
          fmt::format("custom domain '{}' (kiln implements only the ai.onnx domain)", n.domain()),
          name);
      continue;
    }
    if (n.op_type() == "Constant") continue;  // becomes a graph constant
    if (!nn.unsupported.empty()) {
      add(fmt::format("{}-{}", n.op_type(), nn.version), nn.unsupported, name);
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
