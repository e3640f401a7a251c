// ONNX opset-27 ops defined by function bodies, expanded at import into kiln's primitive ops as
// their spec's function writes them:
//   CausalConvWithState  past state (or zeros) + input on the length axis, depthwise Conv
//                        (group = channels), optional SiLU, the last k - 1 positions as the
//                        present state;
//   LinearAttention      the recurrence over the sequence unrolled step by step (the sequence
//                        length must be static), in float32 like the spec's function, with the
//                        linear, gated, delta and gated_delta update rules and grouped-query
//                        heads.
#include <algorithm>
#include <cmath>

#include "kiln/onnx/expand_util.h"
#include "kiln/onnx/onnx_internal.h"

namespace kiln::onnx_internal {

using namespace expand;  // NOLINT: the expansions' shared helpers

namespace {

std::string StringAttr(const onnx::NodeProto& n, std::string_view name, const std::string& dflt) {
  const auto* a = FindAttr(n, name);
  return a ? a->s() : dflt;
}
float FloatAttr(const onnx::NodeProto& n, std::string_view name, float dflt) {
  const auto* a = FindAttr(n, name);
  return a ? a->f() : dflt;
}

// x cast to float32 when its type is another float type.
std::string ToFloat(Emitter& e, const std::string& x, int32_t type) {
  if (x.empty() || type == onnx::TensorProto::FLOAT) return x;
  return e.Op("to_float", "Cast", {x}, {Attr("to", int64_t{onnx::TensorProto::FLOAT})});
}
// x (float32) back to `type`, written to `out` when given.
std::string FromFloat(Emitter& e, const std::string& x, int32_t type, const std::string& out) {
  if (type == onnx::TensorProto::FLOAT) {
    return out.empty() ? x : e.Op("output", "Identity", {x}, {}, out);
  }
  return e.Op("from_float", "Cast", {x}, {Attr("to", int64_t{type})}, out);
}

}  // namespace

// CausalConvWithState(input [B, C, L], weight [C, 1, k], bias? [C], past_state? [B, C, k - 1])
//   -> (output [B, C, L], present_state [B, C, k - 1])
StatusOr<std::string> ExpandCausalConvWithState(const onnx::NodeProto& n, ExpansionHost& host) {
  const std::string x = InputName(n, 0), w = InputName(n, 1), bias = InputName(n, 2),
                    past = InputName(n, 3);
  const std::string y_out = OutputName(n, 0), state_out = OutputName(n, 1);
  if (x.empty() || w.empty() || y_out.empty()) {
    return MakeError(ErrorCode::kInvalidModel,
                     "CausalConvWithState needs inputs input and weight and output output; node "
                     "'{}' lacks one",
                     n.name());
  }
  std::string act = StringAttr(n, "activation", "none");
  if (act != "none" && act != "silu" && act != "swish") {
    return MakeError(ErrorCode::kInvalidAttribute,
                     "node '{}' (CausalConvWithState) has activation '{}'; the spec defines none, "
                     "silu and swish",
                     n.name(), act);
  }
  // Conv's group is the channel count, an attribute: it must be known here.
  int64_t channels = -1;
  if (auto wd = host.Dims(w); wd && wd->size() == 3) channels = (*wd)[0];
  if (auto xd = host.Dims(x); channels < 0 && xd && xd->size() == 3) channels = (*xd)[1];
  if (channels <= 0) return NotExpanded("the channel count (weight's dim 0) is not known");
  const int32_t type = host.ElemType(x);
  if (!IsFloatType(type)) return NotExpanded("the input's float element type is not known");

  Emitter e(n, host);
  const std::string k_minus_1 = e.Op("k_minus_1", "Sub", {e.Dims(w, 2, 3), e.Ints({1})});
  std::string padded;
  if (!past.empty()) {
    padded = e.Op("padded", "Concat", {past, x}, {Attr("axis", int64_t{2})});
  } else {
    // Zeros before the input: Pad by k - 1 at the start of the length axis.
    std::string pads = e.Op("pads", "Concat", {e.Ints({0, 0}), k_minus_1, e.Ints({0, 0, 0})},
                            {Attr("axis", int64_t{0})});
    padded = e.Op("padded", "Pad", {x, pads});
  }
  std::vector<std::string> conv_in = {padded, w};
  if (!bias.empty()) conv_in.push_back(bias);
  std::string conv = e.Op("conv", "Conv", conv_in, {Attr("group", channels)});
  if (act == "none") {
    e.Op("output", "Identity", {conv}, {}, y_out);
  } else {
    std::string f = ToFloat(e, conv, type);
    std::string silu = e.Op("silu", "Mul", {f, e.Op("sigmoid", "Sigmoid", {f})});
    FromFloat(e, silu, type, y_out);
  }
  if (!state_out.empty()) {
    std::string len = e.Dims(padded, 2, 3);
    std::string start = e.Op("state_start", "Sub", {len, k_minus_1});
    e.Op("present_state", "Slice", {padded, start, len, e.Ints({2})}, {}, state_out);
  }
  host.Declare(y_out, type, 3);
  if (!state_out.empty()) host.Declare(state_out, type, 3);
  return std::string();
}

// LinearAttention(query [B, T, Hq*dk], key [B, T, Hkv*dk], value [B, T, Hkv*dv],
//                 past_state? [B, Hkv, dk, dv], decay? [B, T, Hkv*dk or Hkv],
//                 beta? [B, T, Hkv or 1]) -> (output [B, T, Hq*dv], present_state)
//   S_t = a_t * S_{t-1} + k_t (x) w_t;  o_t = scale * q_t^T S_t
// with a_t = exp(decay_t) for the gated rules (1 otherwise), w_t = v_t for linear/gated and
// beta_t * (v_t - (a_t S_{t-1})^T k_t) for the delta rules; each group of Hq / Hkv query heads
// reads its K/V head's state.
StatusOr<std::string> ExpandLinearAttention(const onnx::NodeProto& n, ExpansionHost& host) {
  const std::string q = InputName(n, 0), k = InputName(n, 1), v = InputName(n, 2),
                    past = InputName(n, 3), decay = InputName(n, 4), beta = InputName(n, 5);
  const std::string y_out = OutputName(n, 0), state_out = OutputName(n, 1);
  if (q.empty() || k.empty() || v.empty() || y_out.empty()) {
    return MakeError(ErrorCode::kInvalidModel,
                     "LinearAttention needs inputs query, key, value and output output; node "
                     "'{}' lacks one",
                     n.name());
  }
  const int64_t hq = IntAttr(n, "q_num_heads", 0), hkv = IntAttr(n, "kv_num_heads", 0);
  if (hq <= 0 || hkv <= 0 || hq % hkv != 0) {
    return MakeError(ErrorCode::kInvalidAttribute,
                     "node '{}' (LinearAttention) has q_num_heads {} and kv_num_heads {}; both "
                     "are required, positive, and q_num_heads a multiple of kv_num_heads",
                     n.name(), hq, hkv);
  }
  const std::string rule = StringAttr(n, "update_rule", "gated_delta");
  const bool gated = rule == "gated" || rule == "gated_delta";
  const bool delta = rule == "delta" || rule == "gated_delta";
  if (!gated && !delta && rule != "linear") {
    return MakeError(ErrorCode::kInvalidAttribute,
                     "node '{}' (LinearAttention) has update_rule '{}'; the spec defines linear, "
                     "gated, delta and gated_delta",
                     n.name(), rule);
  }
  if ((gated && decay.empty()) || (delta && beta.empty())) {
    return MakeError(ErrorCode::kInvalidModel,
                     "node '{}' (LinearAttention) with update_rule '{}' needs input {}", n.name(),
                     rule, gated && decay.empty() ? "decay" : "beta");
  }
  const auto qd = host.Dims(q);
  if (!qd || qd->size() != 3) return NotExpanded("the rank of query (3) is not known");
  const int64_t steps = (*qd)[1];
  if (steps < 0) {
    return NotExpanded(
        "the sequence length (query's dim 1) is not static; kiln unrolls the recurrence over "
        "it, so it");
  }
  if (steps == 0) return std::string("the sequence length is 0");
  // About 25 nodes a step: the same budget as unrolled control flow.
  if (steps > kMaxInlinedNodes / 25) {
    return fmt::format(
        "the sequence length {} is more than kiln unrolls ({} steps; about 25 nodes each)", steps,
        kMaxInlinedNodes / 25);
  }
  const int32_t type = host.ElemType(q);
  if (!IsFloatType(type)) return NotExpanded("query's float element type is not known");

  Emitter e(n, host);
  const auto i64 = [](int64_t x) { return x; };
  // [B, T, H, d] views, in float32.
  const std::string q4 = e.Op("q4", "Reshape", {ToFloat(e, q, type), e.Ints({0, 0, hq, -1})});
  const std::string k4 = e.Op("k4", "Reshape", {ToFloat(e, k, type), e.Ints({0, 0, hkv, -1})});
  const std::string v4 = e.Op("v4", "Reshape", {ToFloat(e, v, type), e.Ints({0, 0, hkv, -1})});
  const std::string g4 =
      gated ? e.Op("decay4", "Reshape", {ToFloat(e, decay, type), e.Ints({0, 0, hkv, -1})}) : "";
  const std::string b4 =
      delta ? e.Op("beta4", "Reshape", {ToFloat(e, beta, type), e.Ints({0, 0, -1, 1})}) : "";
  const std::string dk = e.Op("dk", "Div", {e.Dims(q, 2, 3), e.Ints({hq})});
  const std::string dv = e.Op("dv", "Div", {e.Dims(v, 2, 3), e.Ints({hkv})});
  std::string state;
  if (!past.empty()) {
    state = ToFloat(e, past, type);
  } else {
    std::string shape = e.Op("state_shape", "Concat", {e.Dims(q, 0, 1), e.Ints({hkv}), dk, dv},
                             {Attr("axis", i64(0))});
    state = e.Op("state0", "ConstantOfShape", {shape});  // float32 zeros
  }
  std::string scale;
  if (const float s = FloatAttr(n, "scale", 0.0f); s != 0.0f) {
    scale = e.Scalar(s, onnx::TensorProto::FLOAT);
  } else {
    std::string dk_f = e.Op("dk_float", "Cast", {dk}, {Attr("to", i64(onnx::TensorProto::FLOAT))});
    scale = e.Op("scale", "Reciprocal", {e.Op("sqrt_dk", "Sqrt", {dk_f})});
  }
  const int64_t group = hq / hkv;
  std::string read_shape;
  if (group > 1) {
    read_shape = e.Op("read_shape", "Concat", {e.Dims(q, 0, 1), e.Ints({hq}), dk, dv},
                      {Attr("axis", i64(0))});
  }
  const std::string last = e.Ints({-1}), second_last = e.Ints({-2});
  std::vector<std::string> outs;
  for (int64_t t = 0; t < steps; ++t) {
    const std::string idx = e.IntScalar(t);
    auto step = [&](const std::string& x4) {
      return e.Op("step", "Gather", {x4, idx}, {Attr("axis", i64(1))});
    };
    std::string s = state;
    if (gated) {
      std::string a = e.Op("decay_exp", "Exp", {step(g4)});
      s = e.Op("decayed", "Mul", {s, e.Op("decay_col", "Unsqueeze", {a, last})});
    }
    const std::string k_col = e.Op("k_col", "Unsqueeze", {step(k4), last});  // [B, Hkv, dk, 1]
    std::string write = step(v4);                                            // [B, Hkv, dv]
    if (delta) {
      std::string st = e.Op("state_t", "Transpose", {s}, {Attr("perm", {0, 1, 3, 2})});
      std::string got = e.Op("retrieved", "Squeeze", {e.Op("read_k", "MatMul", {st, k_col}), last});
      write = e.Op("delta", "Mul", {step(b4), e.Op("diff", "Sub", {write, got})});
    }
    const std::string row = e.Op("write_row", "Unsqueeze", {write, second_last});
    state = e.Op("state", "Add", {s, e.Op("outer", "MatMul", {k_col, row})});
    std::string read = state;
    if (group > 1) {
      std::string five = e.Op("state_group", "Unsqueeze", {state, e.Ints({2})});
      std::string rep = e.Op("state_rep", "Expand", {five, e.Ints({1, 1, group, 1, 1})});
      read = e.Op("state_read", "Reshape", {rep, read_shape});
    }
    std::string q_row = e.Op("q_row", "Unsqueeze", {step(q4), second_last});
    std::string o = e.Op("read_q", "Squeeze", {e.Op("read", "MatMul", {q_row, read}), second_last});
    o = e.Op("scaled", "Mul", {scale, o});  // [B, Hq, dv]
    outs.push_back(e.Op("out_step", "Unsqueeze", {o, e.Ints({1})}));
  }
  while (outs.size() > kMaxConcatInputs) {  // Concat's input limit: in groups
    std::vector<std::string> groups;
    for (size_t i = 0; i < outs.size(); i += kMaxConcatInputs) {
      std::vector<std::string> part(
          outs.begin() + static_cast<std::ptrdiff_t>(i),
          outs.begin() + static_cast<std::ptrdiff_t>(std::min(outs.size(), i + kMaxConcatInputs)));
      groups.push_back(e.Op("out_steps", "Concat", part, {Attr("axis", i64(1))}));
    }
    outs = std::move(groups);
  }
  std::string y =
      outs.size() == 1 ? outs[0] : e.Op("out_steps", "Concat", outs, {Attr("axis", i64(1))});
  y = e.Op("out3", "Reshape", {y, e.Ints({0, 0, -1})});
  FromFloat(e, y, type, y_out);
  if (!state_out.empty()) FromFloat(e, state, type, state_out);
  host.Declare(y_out, type, 3);
  if (!state_out.empty()) host.Declare(state_out, type, 4);
  return std::string();
}

}  // namespace kiln::onnx_internal
