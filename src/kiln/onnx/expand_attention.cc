// ONNX's Attention (opsets 23, 24) and RotaryEmbedding (23), expanded at import into the primitive
// ops kiln runs on every backend. kiln's own ops of those names are internal fusions with other
// semantics; the graph passes fuse the expansion back into them where the pattern is the plain
// one (attention_fusion: scaled Q and K^T, additive or boolean mask, softmax, repeat_kv for
// grouped-query attention; rotary_fusion: x * cos + rotate(x) * sin with full-width tables).
#include <cmath>
#include <limits>

#include "kiln/core/float16.h"
#include "kiln/onnx/expand_util.h"
#include "kiln/onnx/onnx_internal.h"
#include "kiln/ops/op_schema.h"

namespace kiln::onnx_internal {

using namespace expand;  // NOLINT: the expansions' shared helpers

// Attention(Q, K, V, attn_mask?, past_key?, past_value?, nonpad_kv_seqlen? (24))
//   -> (Y, present_key?, present_value?, qk_matmul_output?)
// as the ONNX spec writes it: heads split from 3-D inputs, the cache concatenated on the sequence
// axis, K and V repeated per query head (grouped-query), Q and K^T each scaled by sqrt(scale),
// softcap, one additive bias (the mask, padded with -inf to the total length; the causal mask
// offset by the past length; the padding mask from nonpad_kv_seqlen), softmax in
// softmax_precision, then the product with V.
StatusOr<std::string> ExpandAttention(const onnx::NodeProto& n, int version, ExpansionHost& host) {
  const std::string q = InputName(n, 0), k = InputName(n, 1), v = InputName(n, 2);
  const std::string mask = InputName(n, 3), past_k = InputName(n, 4), past_v = InputName(n, 5);
  const std::string nonpad = version >= 24 ? InputName(n, 6) : std::string();
  const std::string y_out = OutputName(n, 0), present_k_out = OutputName(n, 1),
                    present_v_out = OutputName(n, 2), qk_out = OutputName(n, 3);
  if (q.empty() || k.empty() || v.empty() || y_out.empty()) {
    return MakeError(ErrorCode::kInvalidModel,
                     "Attention needs inputs Q, K, V and output Y; node '{}' lacks one", n.name());
  }
  if (past_k.empty() != past_v.empty()) {
    return MakeError(ErrorCode::kInvalidModel,
                     "node '{}' (Attention) has only one of past_key and past_value; the spec "
                     "uses them together",
                     n.name());
  }
  const int64_t is_causal = IntAttr(n, "is_causal", 0);
  const int64_t q_heads_attr = IntAttr(n, "q_num_heads", 0);
  const int64_t kv_heads_attr = IntAttr(n, "kv_num_heads", 0);
  const int64_t mode = IntAttr(n, "qk_matmul_output_mode", 0);
  const int64_t softmax_precision = IntAttr(n, "softmax_precision", 0);
  const auto* scale_attr = FindAttr(n, "scale");
  const double softcap = FindAttr(n, "softcap") ? FindAttr(n, "softcap")->f() : 0.0;
  if (mode < 0 || mode > 3) {
    return MakeError(ErrorCode::kInvalidAttribute,
                     "node '{}' (Attention) has qk_matmul_output_mode {}; the spec defines 0 to 3",
                     n.name(), mode);
  }
  if (softmax_precision != 0 && !IsFloatType(static_cast<int32_t>(softmax_precision))) {
    return MakeError(ErrorCode::kInvalidAttribute,
                     "node '{}' (Attention) has softmax_precision {} ({}); it must be a float type",
                     n.name(), softmax_precision,
                     OnnxDataTypeName(static_cast<int32_t>(softmax_precision)));
  }

  // Facts the expansion depends on: the rank of Q (3-D or 4-D), its element type (the type of
  // the constants), and whether the mask is boolean.
  const int32_t t = host.ElemType(q);
  if (t == 0) return NotExpanded("the element type of Q is not declared");
  if (!IsFloatType(t)) {
    return MakeError(ErrorCode::kTypeMismatch, "node '{}' (Attention): Q is {}; it must be float",
                     n.name(), OnnxDataTypeName(t));
  }
  const std::optional<std::vector<int64_t>> qd = host.Dims(q);
  if (!qd) return NotExpanded("the rank of Q is not declared");
  const size_t rank = qd->size();
  if (rank != 3 && rank != 4) {
    return MakeError(ErrorCode::kShapeMismatch,
                     "node '{}' (Attention): Q has rank {}; the spec takes 3-D or 4-D inputs",
                     n.name(), rank);
  }
  const int32_t mask_type = mask.empty() ? 0 : host.ElemType(mask);
  if (!mask.empty() && mask_type == 0) {
    return NotExpanded("the element type of attn_mask (boolean or additive) is not declared");
  }
  const bool bool_mask = mask_type == onnx::TensorProto::BOOL;
  if (rank == 3 && (q_heads_attr <= 0 || kv_heads_attr <= 0)) {
    return MakeError(ErrorCode::kInvalidAttribute,
                     "node '{}' (Attention) has 3-D inputs but no q_num_heads and kv_num_heads "
                     "(the spec requires both for 3-D inputs)",
                     n.name());
  }

  Emitter e(n, host);
  const std::optional<std::vector<int64_t>> kd = host.Dims(k);
  auto dim = [](const std::optional<std::vector<int64_t>>& d, size_t i) -> int64_t {
    return d && i < d->size() ? (*d)[i] : -1;
  };

  // [B, S, H * D] -> [B, H, S, D].
  auto heads = [&](const std::string& x, int64_t h) {
    if (rank == 4) return x;
    return e.Op("transpose", "Transpose", {e.Op("reshape", "Reshape", {x, e.Ints({0, 0, h, -1})})},
                {Attr("perm", std::vector<int64_t>{0, 2, 1, 3})});
  };
  const std::string qh = heads(q, q_heads_attr);
  const std::string kh = heads(k, kv_heads_attr);
  const std::string vh = heads(v, kv_heads_attr);

  // The cache: present = Concat(past, new) on the sequence axis.
  auto cache = [&](const std::string& past, const std::string& x, const std::string& present) {
    if (!past.empty()) {
      return e.Op("present", "Concat", {past, x}, {Attr("axis", int64_t{2})}, present);
    }
    if (!present.empty()) e.Op("present", "Identity", {x}, {}, present);
    return x;
  };
  const std::string kc = cache(past_k, kh, present_k_out);
  const std::string vc = cache(past_v, vh, present_v_out);
  for (const std::string& p : {present_k_out, present_v_out}) {
    if (!p.empty()) host.Declare(p, host.ElemType(k) ? host.ElemType(k) : t, 4);
  }

  // Grouped-query attention: each K/V head serves q_heads / kv_heads query heads in a row
  // ([h0, h0, h1, h1, ...]), written as repeat_kv: Unsqueeze -> Expand -> Reshape.
  const int64_t q_heads = q_heads_attr > 0 ? q_heads_attr : dim(qd, 1);
  const int64_t kv_heads = kv_heads_attr > 0 ? kv_heads_attr : (rank == 4 ? dim(kd, 1) : -1);
  std::string kr = kc, vr = vc;
  const bool known = q_heads > 0 && kv_heads > 0;
  if (known && q_heads % kv_heads != 0) {
    return MakeError(ErrorCode::kShapeMismatch,
                     "node '{}' (Attention): {} query heads are not a multiple of {} key/value "
                     "heads",
                     n.name(), q_heads, kv_heads);
  }
  if (!known || q_heads != kv_heads) {
    auto repeat = [&](const std::string& x) {
      const std::string lead = e.Dims(x, 0, 2), rest = e.Dims(x, 2, 4);
      const std::string qh_count = known ? e.Ints({q_heads}) : e.Dims(qh, 1, 2);
      const std::string n_rep =
          known ? e.Ints({q_heads / kv_heads}) : e.Op("n_rep", "Div", {qh_count, e.Dims(x, 1, 2)});
      const std::string expanded =
          e.Op("repeat_kv", "Expand",
               {e.Unsqueeze(x, {2}),
                e.Op("repeat_shape", "Concat", {lead, n_rep, rest}, {Attr("axis", int64_t{0})})});
      const std::string shape = e.Op("repeat_shape", "Concat", {e.Dims(x, 0, 1), qh_count, rest},
                                     {Attr("axis", int64_t{0})});
      return e.Op("repeat_kv", "Reshape", {expanded, shape});
    };
    kr = repeat(kc);
    vr = repeat(vc);
  }

  // sqrt(scale) on Q and on K^T; scale defaults to 1 / sqrt(head size).
  int64_t head_size = rank == 4 ? dim(qd, 3) : -1;
  if (rank == 3 && dim(qd, 2) >= 0) head_size = dim(qd, 2) / q_heads_attr;
  std::string root_scale;
  if (scale_attr) {
    root_scale = e.Scalar(std::sqrt(static_cast<double>(scale_attr->f())), t);
  } else if (head_size > 0) {
    root_scale = e.Scalar(1.0 / std::sqrt(std::sqrt(static_cast<double>(head_size))), t);
  } else {
    const std::string hs = e.Op("head_size", "Cast", {e.Dims(qh, 3, 4)}, {Attr("to", int64_t{t})});
    root_scale =
        e.Op("scale", "Reciprocal", {e.Op("scale", "Sqrt", {e.Op("scale", "Sqrt", {hs})})});
  }
  const std::string kt =
      e.Op("k_transpose", "Transpose", {kr}, {Attr("perm", std::vector<int64_t>{0, 1, 3, 2})});
  const std::string qk =
      e.Op("qk", "MatMul",
           {e.Op("q_scaled", "Mul", {qh, root_scale}), e.Op("k_scaled", "Mul", {kt, root_scale})});
  std::string capped = qk;
  if (softcap > 0.0) {
    const std::string c = e.Scalar(softcap, t);
    capped =
        e.Op("softcap", "Mul", {e.Op("softcap", "Tanh", {e.Op("softcap", "Div", {qk, c})}), c});
  }

  // The bias: attn_mask (boolean -> 0 / -inf; padded with -inf to the total length), causal,
  // padding.
  const double inf = std::numeric_limits<double>::infinity();
  const int64_t kv_len = dim(kd, rank == 4 ? 2 : 1);
  const int64_t past_len = past_k.empty() ? 0 : dim(host.Dims(past_k), 2);
  const int64_t total = kv_len >= 0 && past_len >= 0 ? kv_len + past_len : -1;
  std::string total_len;  // Shape(K with the cache)[2], 1-D
  auto total_scalar = [&]() {
    if (total_len.empty()) total_len = e.Dims(kc, 2, 3);
    return e.Op("total_len", "Squeeze", {total_len, e.Ints({0})});
  };
  auto zero_or_neg_inf = [&](const std::string& keep) {
    return e.Op("bias", "Where", {keep, e.Scalar(0.0, t), e.Scalar(-inf, t)});
  };
  std::string key_index;  // Range(total), [T]
  auto keys = [&]() {
    if (key_index.empty()) {
      key_index = e.Op("key_index", "Range", {e.IntScalar(0), total_scalar(), e.IntScalar(1)});
    }
    return key_index;
  };
  std::vector<std::string> bias;
  std::string masked = capped;
  if (!mask.empty()) {
    // The mask's last dim may be shorter than the total length; padded unless it is known equal.
    const std::optional<std::vector<int64_t>> md = host.Dims(mask);
    const bool padded = total < 0 || !md || md->empty() || md->back() != total;
    if (bool_mask && !padded && !is_causal && nonpad.empty()) {
      // The form attention_fusion reads as a boolean mask.
      masked = e.Op("masked", "Where", {mask, capped, e.Scalar(-inf, t)});
    } else {
      std::string m = bool_mask ? zero_or_neg_inf(mask) : mask;
      if (padded) {
        // Column j of the extended mask is mask[..., min(j, M - 1)] where j < M, -inf past it: a
        // Gather over Range(T), not a Pad or a Concat, whose width T - M would be a difference
        // of dims (the memory plan sizes each value at the profile's largest dims).
        const std::string mask_len = e.Dims(m, -1, kEnd);
        const std::string last = e.Op("mask_last", "Sub", {mask_len, e.Ints({1})});
        const std::string cols = e.Op("mask_cols", "Min", {keys(), last});
        m = e.Op("mask_pad", "Where",
                 {e.Op("mask_in", "Less", {keys(), mask_len}),
                  e.Op("mask_pad", "Gather", {m, cols}, {Attr("axis", int64_t{-1})}),
                  e.Scalar(-inf, t)});
      }
      bias.push_back(m);
    }
  }
  if (is_causal) {
    // Query i (at absolute position past + i) sees keys j <= past + i.
    std::string rows =
        e.Unsqueeze(e.Op("query_index", "Range",
                         {e.IntScalar(0), e.Op("q_len", "Squeeze", {e.Dims(qh, 2, 3), e.Ints({0})}),
                          e.IntScalar(1)}),
                    {1});
    if (!past_k.empty()) rows = e.Op("query_index", "Add", {rows, e.Dims(past_k, 2, 3)});
    bias.push_back(zero_or_neg_inf(e.Op("causal", "LessOrEqual", {keys(), rows})));
  }
  if (!nonpad.empty()) {
    // Keys at or past nonpad_kv_seqlen[b] are padding: [B, 1, 1, T].
    const std::string lens = e.Unsqueeze(nonpad, {1});
    bias.push_back(e.Unsqueeze(zero_or_neg_inf(e.Op("nonpad", "Less", {keys(), lens})), {1, 2}));
  }
  if (!bias.empty()) {
    std::string b = bias[0];
    for (size_t i = 1; i < bias.size(); ++i) b = e.Op("bias", "Add", {b, bias[i]});
    masked = e.Op("masked", "Add", {capped, b});
  }

  // Softmax over the keys, in softmax_precision when it differs from Q's type.
  const bool recast = softmax_precision != 0 && softmax_precision != t;
  std::string probs = e.Op(
      "softmax", "Softmax",
      {recast ? e.Op("softmax_in", "Cast", {masked}, {Attr("to", softmax_precision)}) : masked},
      {Attr("axis", int64_t{-1})});
  if (recast) probs = e.Op("softmax_out", "Cast", {probs}, {Attr("to", int64_t{t})});
  if (!qk_out.empty()) {
    // mode 0: Q K^T (scaled); 1: after softcap; 2: after the bias; 3: after softmax.
    const std::string& which = mode == 0 ? qk : mode == 1 ? capped : mode == 2 ? masked : probs;
    e.Op("qk_matmul_output", "Identity", {which}, {}, qk_out);
    host.Declare(qk_out, t, 4);
  }

  if (rank == 4) {
    e.Op("y", "MatMul", {probs, vr}, {}, y_out);
  } else {
    const std::string y4 = e.Op("y", "MatMul", {probs, vr});
    e.Op("y", "Reshape",
         {e.Op("y", "Transpose", {y4}, {Attr("perm", std::vector<int64_t>{0, 2, 1, 3})}),
          e.Ints({0, 0, -1})},
         {}, y_out);
  }
  host.Declare(y_out, t, rank);
  return std::string();
}

// RotaryEmbedding(X, cos_cache, sin_cache, position_ids?) -> Y, written in the form the rotary
// fusion reads: y = x * cos + rotate(x) * sin over the first rotary_embedding_dim features of
// each head, with the half-width tables widened (repeated, or interleaved) to that width, and the
// remaining features passed through.
StatusOr<std::string> ExpandRotaryEmbedding(const onnx::NodeProto& n, ExpansionHost& host) {
  const std::string x = InputName(n, 0), cos = InputName(n, 1), sin = InputName(n, 2);
  const std::string pos = InputName(n, 3), y_out = OutputName(n, 0);
  if (x.empty() || cos.empty() || sin.empty() || y_out.empty()) {
    return MakeError(ErrorCode::kInvalidModel,
                     "RotaryEmbedding needs inputs X, cos_cache, sin_cache and output Y; node "
                     "'{}' lacks one",
                     n.name());
  }
  const int64_t interleaved = IntAttr(n, "interleaved", 0);
  const int64_t rotary_dim = IntAttr(n, "rotary_embedding_dim", 0);
  const int64_t num_heads = IntAttr(n, "num_heads", 0);
  const std::optional<std::vector<int64_t>> xd = host.Dims(x);
  if (!xd) return NotExpanded("the rank of X is not declared");
  const size_t rank = xd->size();
  if (rank != 3 && rank != 4) {
    return MakeError(ErrorCode::kShapeMismatch,
                     "node '{}' (RotaryEmbedding): X has rank {}; the spec takes 3-D or 4-D input",
                     n.name(), rank);
  }
  if (rank == 3 && num_heads <= 0) {
    return MakeError(ErrorCode::kInvalidAttribute,
                     "node '{}' (RotaryEmbedding) has 3-D input but no num_heads (required for "
                     "3-D input)",
                     n.name());
  }
  if (rotary_dim < 0 || rotary_dim % 2 != 0) {
    return MakeError(ErrorCode::kInvalidAttribute,
                     "node '{}' (RotaryEmbedding) has rotary_embedding_dim {}; it must be even "
                     "and not negative",
                     n.name(), rotary_dim);
  }

  Emitter e(n, host);
  // X as [B, S, H, D] (3-D input) or [B, H, S, D] (4-D); the tables [B, S, D/2] get a head axis.
  const std::string x4 =
      rank == 3 ? e.Op("split_heads", "Reshape", {x, e.Ints({0, 0, num_heads, -1})}) : x;
  const int64_t head_axis = rank == 3 ? 2 : 1;
  int64_t head_size = rank == 4 ? (*xd)[3] : -1;
  if (rank == 3 && (*xd)[2] >= 0) head_size = (*xd)[2] / num_heads;
  const bool partial = rotary_dim > 0 && head_size != rotary_dim;
  const std::string xr = partial ? e.Slice(x4, 0, rotary_dim, -1) : x4;

  auto table = [&](const std::string& cache, const char* what) {
    std::string c =
        pos.empty() ? cache : e.Op(what, "Gather", {cache, pos}, {Attr("axis", int64_t{0})});
    if (interleaved) {
      // [c0, c0, c1, c1, ...]
      const std::string u = e.Unsqueeze(c, {-1});
      c = e.Op(what, "Reshape",
               {e.Op(what, "Concat", {u, u}, {Attr("axis", int64_t{-1})}), e.Ints({0, 0, -1})});
    } else {
      c = e.Op(what, "Concat", {c, c}, {Attr("axis", int64_t{-1})});  // [c, c]
    }
    return e.Unsqueeze(c, {head_axis});
  };
  const std::string cos_full = table(cos, "cos");
  const std::string sin_full = table(sin, "sin");

  std::string rotated;
  if (interleaved) {
    // rotate(x)[2i] = -x[2i + 1], rotate(x)[2i + 1] = x[2i]
    const std::string even = e.Slice(xr, 0, kEnd, -1, 2);
    const std::string odd = e.Slice(xr, 1, kEnd, -1, 2);
    const std::string pairs =
        e.Op("rotate", "Concat",
             {e.Unsqueeze(e.Op("rotate", "Neg", {odd}), {-1}), e.Unsqueeze(even, {-1})},
             {Attr("axis", int64_t{-1})});
    rotated = e.Op("rotate", "Reshape", {pairs, e.Op("rotate_shape", "Shape", {xr})});
  } else {
    // rotate(x) = [-x2, x1] for the halves x1, x2
    const std::vector<std::string> halves = e.Ops(
        "halves", "Split", {xr}, 2, {Attr("axis", int64_t{-1}), Attr("num_outputs", int64_t{2})});
    rotated = e.Op("rotate", "Concat", {e.Op("rotate", "Neg", {halves[1]}), halves[0]},
                   {Attr("axis", int64_t{-1})});
  }
  const bool last = !partial && rank == 4;
  const std::string yr =
      e.Op("rotary", "Add",
           {e.Op("rotary", "Mul", {xr, cos_full}), e.Op("rotary", "Mul", {rotated, sin_full})}, {},
           last ? y_out : "");
  std::string y4 = yr;
  if (partial) {
    y4 = e.Op("rotary", "Concat", {yr, e.Slice(x4, rotary_dim, kEnd, -1)},
              {Attr("axis", int64_t{-1})}, rank == 4 ? y_out : "");
  }
  if (rank == 3) e.Op("merge_heads", "Reshape", {y4, e.Ints({0, 0, -1})}, {}, y_out);
  host.Declare(y_out, host.ElemType(x), rank);
  return std::string();
}

}  // namespace kiln::onnx_internal
