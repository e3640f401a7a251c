// Helpers shared by the import-time expansions of ONNX ops into kiln's primitive ops
// (expand_attention.cc, expand_ops27.cc): attribute access and an emitter of canonical nodes.
#pragma once

#include <limits>
#include <string>
#include <vector>

#include "kiln/core/float16.h"
#include "kiln/onnx/onnx_internal.h"
#include "kiln/ops/op_schema.h"

namespace kiln::onnx_internal::expand {

inline constexpr int64_t kEnd = std::numeric_limits<int64_t>::max();  // Slice to the end of an axis

inline const onnx::AttributeProto* FindAttr(const onnx::NodeProto& n, std::string_view name) {
  for (const auto& a : n.attribute()) {
    if (a.name() == name) return &a;
  }
  return nullptr;
}
inline int64_t IntAttr(const onnx::NodeProto& n, std::string_view name, int64_t dflt) {
  const auto* a = FindAttr(n, name);
  return a ? a->i() : dflt;
}

inline onnx::AttributeProto Attr(const std::string& name, int64_t v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INT);
  a.set_i(v);
  return a;
}
inline onnx::AttributeProto Attr(const std::string& name, const std::vector<int64_t>& v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a.add_ints(x);
  return a;
}

inline bool IsFloatType(int32_t t) {
  return t == onnx::TensorProto::FLOAT || t == onnx::TensorProto::FLOAT16 ||
         t == onnx::TensorProto::BFLOAT16 || t == onnx::TensorProto::DOUBLE;
}

inline std::string InputName(const onnx::NodeProto& n, int i) {
  return i < n.input_size() ? n.input(i) : std::string();
}
inline std::string OutputName(const onnx::NodeProto& n, int i) {
  return i < n.output_size() ? n.output(i) : std::string();
}

// Emits the nodes of one expansion, named `<node>/<what>` (values too), in canonical form.
class Emitter {
 public:
  Emitter(const onnx::NodeProto& owner, ExpansionHost& host) : owner_(owner), host_(host) {}

  // op(inputs) with `attrs`; its output is `out` when given (the expanded node's own output),
  // a fresh value otherwise.
  std::string Op(const std::string& what, const std::string& op, std::vector<std::string> inputs,
                 std::vector<onnx::AttributeProto> attrs = {}, const std::string& out = "") {
    return Ops(what, op, std::move(inputs), 1, std::move(attrs), out)[0];
  }
  std::vector<std::string> Ops(const std::string& what, const std::string& op,
                               std::vector<std::string> inputs, int outputs,
                               std::vector<onnx::AttributeProto> attrs = {},
                               const std::string& out = "") {
    NormalizedNode nn;
    nn.origin = owner_.name();
    // The canonical form kiln implements, which is what is written here (Range-11 also in an
    // opset-27 model, whose Range-27 kiln does not implement).
    const OpSchema* schema = FindOpSchema(op);
    nn.version = schema ? schema->latest_opset : 0;
    nn.node.set_op_type(op);
    nn.node.set_name(host_.FreshNodeName(owner_.name() + "/" + what));
    for (auto& i : inputs) nn.node.add_input(std::move(i));
    std::vector<std::string> names;
    for (int i = 0; i < outputs; ++i) {
      names.push_back(!out.empty() && outputs == 1
                          ? out
                          : host_.FreshValueName(owner_.name() + "/" + what +
                                                 (outputs > 1 ? std::to_string(i) : "")));
      nn.node.add_output(names.back());
    }
    for (auto& a : attrs) *nn.node.add_attribute() = std::move(a);
    host_.Emit(std::move(nn));
    return names;
  }

  // A Constant node holding `t`; its output is `named` when given, a fresh value otherwise.
  std::string Constant(const std::string& what, onnx::TensorProto t,
                       const std::string& named = "") {
    NormalizedNode c;
    c.origin = owner_.name();
    c.node.set_op_type("Constant");
    c.node.set_name(host_.FreshNodeName(owner_.name() + "/" + what));
    std::string out = named.empty() ? host_.FreshValueName(owner_.name() + "/" + what) : named;
    c.node.add_output(out);
    t.set_name(out);
    auto* a = c.node.add_attribute();
    a->set_name("value");
    a->set_type(onnx::AttributeProto::TENSOR);
    *a->mutable_t() = std::move(t);
    host_.Emit(std::move(c));
    return out;
  }
  // A 1-D int64 constant.
  std::string Ints(const std::vector<int64_t>& v) {
    onnx::TensorProto t;
    t.set_data_type(onnx::TensorProto::INT64);
    t.add_dims(static_cast<int64_t>(v.size()));
    for (int64_t x : v) t.add_int64_data(x);
    return Constant("ints", std::move(t));
  }
  // A rank-0 int64 constant.
  std::string IntScalar(int64_t v) {
    onnx::TensorProto t;
    t.set_data_type(onnx::TensorProto::INT64);
    t.add_int64_data(v);
    return Constant("int", std::move(t));
  }
  // A rank-0 constant of the float element type `type`.
  std::string Scalar(double v, int32_t type) { return Constant("scalar", ScalarProto(v, type)); }
  static onnx::TensorProto ScalarProto(double v, int32_t type) {
    onnx::TensorProto t;
    t.set_data_type(type);
    const auto f = static_cast<float>(v);
    if (type == onnx::TensorProto::FLOAT16) {
      t.add_int32_data(FloatToHalfBits(f));
    } else if (type == onnx::TensorProto::BFLOAT16) {
      t.add_int32_data(FloatToBFloat16Bits(f));
    } else if (type == onnx::TensorProto::DOUBLE) {
      t.add_double_data(v);
    } else {
      t.add_float_data(f);
    }
    return t;
  }

  // x[..., start:end:step] along `axis`.
  std::string Slice(const std::string& x, int64_t start, int64_t end, int64_t axis,
                    int64_t step = 1) {
    std::vector<std::string> in = {x, Ints({start}), Ints({end}), Ints({axis})};
    if (step != 1) in.push_back(Ints({step}));
    return Op("slice", "Slice", std::move(in));
  }
  // Shape(x)[start:end] (int64, 1-D).
  std::string Dims(const std::string& x, int64_t start, int64_t end) {
    return Slice(Op("shape", "Shape", {x}), start, end, 0);
  }
  std::string Unsqueeze(const std::string& x, const std::vector<int64_t>& axes) {
    return Op("unsqueeze", "Unsqueeze", {x, Ints(axes)});
  }

  ExpansionHost& host() { return host_; }

 private:
  const onnx::NodeProto& owner_;
  ExpansionHost& host_;
};

inline std::string NotExpanded(const std::string& what) {
  return fmt::format(
      "{}, which kiln's expansion of this operator needs (declare it in value_info, e.g. "
      "with onnx.shape_inference)",
      what);
}

}  // namespace kiln::onnx_internal::expand
