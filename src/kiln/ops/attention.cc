// Attention: kiln-internal scaled dot-product attention, created by the attention fusion pass
// (src/kiln/passes/attention_fusion.cc), never imported.
//
// Attention(Q, K, V, mask?) -> Y
//   Q [..., Sq, D], K [..., Sk, D], V [..., Sk, Dv] (same rank, batch dims broadcast as MatMul's)
//   Y [..., Sq, Dv] = softmax(masked(scale * Q K^T), last axis) V
// Attributes:
//   scale      float (default 1/sqrt(D))
//   mask_kind  "none" (default): no mask input
//              "additive": mask (Q's dtype) broadcast to [..., Sq, Sk] is added to the scores
//              "boolean":  mask (bool) broadcast to [..., Sq, Sk]; false entries become mask_fill
//              "causal":   no mask input; key j is visible to query i iff j <= i + (Sk - Sq)
//   mask_fill  float, for "boolean" (default -inf)
//   layout     how the operands hold the heads (the attention layout pass sets it, removing the
//              head split/merge transposes that exporters write around attention):
//              "bhsd" (default) the above: [..., S, D], each head's rows contiguous;
//              "bshd" rank 4 [B, S, H, D] for Q, K, V and Y (the scores are [B, H, Sq, Sk]),
//                     or rank 5 [B, S, G, R, D] with the heads as G groups of R (grouped-query
//                     attention: K and V [B, S, G, 1, D], each read by the R query heads of
//                     its group; the scores are [B, G, R, Sq, Sk]);
//              "bsd"  rank 3 [B, S, H*D] for Q, K, V and Y, with num_heads = H;
//              "sbd"  rank 3 [S, B, H*D], sequence first (nn.MultiheadAttention's own order),
//                     with num_heads = H.
//   num_heads  int, for "bsd" and "sbd"
//   qkv_packed int, for "bsd" and "sbd" (default 0): 1 when each operand is [B, S, 3*H*D]
//              ([S, B, 3*H*D] for sbd) with Q, K and V
//              side by side in each row, and Q is read from the first third of input 0's rows,
//              K from the second third of input 1's, V from the last third of input 2's (the
//              pass gives one value three times: GPT-2's c_attn output, so no Split copies).
//   The mask always broadcasts to the logical scores [batch..., Sq, Sk] ([B, H, Sq, Sk] for
//   bshd and bsd).
//   kiln_fp8_output_amax float, set by the builder (ops/quant_edge.h): Y is written as FP8 E4M3
//              for an FP8 product that reads it, quantized with 448 / this amax.
// Softmax runs in FP32 with max subtraction in every backend.
#include "kiln/ir/sizes.h"
#include "kiln/ops/op_schema.h"
#include "kiln/ops/op_table.h"
#include "kiln/ops/quant_edge.h"

namespace kiln {

namespace {

// Layouts bshd ([B, S, H, D] or [B, S, G, R, D]), bsd ([B, S, H*D], num_heads = H) and sbd
// ([S, B, H*D]): the heads sit inside each row. B broadcasts (1 against B); D must agree, and the
// heads too, except that K's and V's head axes may be 1 where Q's are not (grouped-query
// attention in rank 5: [B, S, G, 1, D] against Q's [B, S, G, R, D]).
Status InferAttentionHeadsInterleaved(InferenceContext& ctx, const std::string& layout) {
  const bool seq_first = layout == "sbd";
  const bool packed = layout == "bsd" || seq_first;             // rank 3, num_heads
  const size_t bi = seq_first ? 1 : 0, si = seq_first ? 0 : 1;  // batch and sequence axes
  const Shape& q = ctx.input_shape(0);
  const Shape& k = ctx.input_shape(1);
  const Shape& v = ctx.input_shape(2);
  const size_t rank = packed ? 3 : q.size() == 5 ? 5 : 4;
  if (q.size() != rank || k.size() != rank || v.size() != rank) {
    return ctx.Error(ErrorCode::kShapeMismatch, "layout {} needs rank-{} Q {}, K {}, V {}", layout,
                     packed ? "3" : "4 or 5", ToString(q), ToString(k), ToString(v));
  }
  int64_t heads = attrs::Attention::num_heads(ctx.attrs());
  if (packed && heads <= 0) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "layout {} needs num_heads > 0", layout);
  }
  if (heads > kMaxDim) {  // 3 * heads below must not overflow
    return ctx.Error(ErrorCode::kInvalidAttribute, "num_heads is {}; at most {}", heads, kMaxDim);
  }
  const bool qkv = attrs::Attention::qkv_packed(ctx.attrs()) != 0;
  if (qkv && !packed) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "qkv_packed needs layout bsd or sbd");
  }
  if (qkv) {
    // One [B, S, 3*E] value three times: Y is [B, S, E].
    const Dim& e3 = v[2];
    if (!(q[2] == e3) || !(k[2] == e3) || !e3.is_static() || e3.value() % (3 * heads) != 0) {
      return ctx.Error(
          ErrorCode::kShapeMismatch,
          "qkv_packed needs [B, S, 3*H*D] operands (one static last dim, a multiple of "
          "3 x num_heads {}); got Q {}",
          heads, ToString(q));
    }
    Shape out{q[0], q[1], Dim(e3.value() / 3)};  // [B, S, E] or [S, B, E]
    ctx.set_output(0, ProductOutputType(ctx.node(), ctx.input_type(0)), std::move(out));
    return OkStatus();
  }
  auto differ = [](const Dim& a, const Dim& b) {
    return a.is_static() && b.is_static() && !(a == b);
  };
  // Q and K share the head size; K and V the key count; all three the heads (K's and V's a head
  // axis of 1 where Q's is not, in rank 5: each K/V head serves a group of query heads).
  bool bad = differ(q[rank - 1], k[rank - 1]) || differ(k[si], v[si]);
  for (size_t a = 2; !packed && a + 1 < rank; ++a) {
    for (const Shape* s : {&k, &v}) {
      const bool grouped = rank == 5 && (*s)[a].is_static() && (*s)[a].value() == 1;
      bad = bad || (!grouped && differ(q[a], (*s)[a]));
    }
  }
  if (packed) {
    for (const Shape* s : {&q, &k, &v}) {
      const Dim& e = (*s)[2];
      bad = bad || (e.is_static() && e.value() % heads != 0);
    }
  }
  if (bad) {
    return ctx.Error(ErrorCode::kShapeMismatch, "layout {}: Q {}, K {}, V {} disagree{}", layout,
                     ToString(q), ToString(k), ToString(v),
                     packed ? fmt::format(" (num_heads {})", heads) : "");
  }
  auto batch = BroadcastShapes(Shape{q[bi]}, Shape{k[bi]});
  if (batch.ok()) batch = BroadcastShapes(*batch, Shape{v[bi]});
  if (!batch.ok()) return ctx.Error(ErrorCode::kShapeMismatch, "{}", batch.status().message());
  // The logical scores: [B, H, Sq, Sk], or [B, G, R, Sq, Sk] in rank 5.
  Shape scores = {(*batch)[0]};
  if (packed) {
    scores.push_back(Dim(heads));
  } else {
    scores.insert(scores.end(), q.begin() + 2, q.end() - 1);
  }
  scores.push_back(q[si]);
  scores.push_back(k[si]);
  if (ctx.has_input(3)) {
    std::string kind = attrs::Attention::mask_kind(ctx.attrs());
    DataType mt = ctx.input_type(3);
    DataType t = ctx.input_type(0);
    if ((kind == "additive" && mt != t) || (kind == "boolean" && mt != DataType::kBool)) {
      return ctx.Error(ErrorCode::kTypeMismatch, "a {} mask must be {}, got {}", kind,
                       kind == "boolean" ? "bool" : ToString(t), ToString(mt));
    }
    auto joined = BroadcastShapes(scores, ctx.input_shape(3));
    if (!joined.ok() || joined->size() != scores.size()) {
      return ctx.Error(ErrorCode::kShapeMismatch, "mask {} does not broadcast to the scores {}",
                       ToString(ctx.input_shape(3)), ToString(scores));
    }
  }
  Shape out = seq_first ? Shape{q[0], (*batch)[0], v[2]}
              : packed  ? Shape{(*batch)[0], q[1], v[2]}
                        : q;  // [B, S, heads..., Dv]
  if (!packed) {
    out[0] = (*batch)[0];
    out[rank - 1] = v[rank - 1];
  }
  ctx.set_output(0, ProductOutputType(ctx.node(), ctx.input_type(0)), std::move(out));
  return OkStatus();
}

}  // namespace

Status InferAttention(InferenceContext& ctx) {
  std::string kind = attrs::Attention::mask_kind(ctx.attrs());
  bool has_mask = ctx.has_input(3);
  if (kind == "none" || kind == "causal") {
    if (has_mask) {
      return ctx.Error(ErrorCode::kInvalidModel, "mask_kind '{}' takes no mask input", kind);
    }
  } else if (kind == "additive" || kind == "boolean") {
    if (!has_mask) {
      return ctx.Error(ErrorCode::kInvalidModel, "mask_kind '{}' needs a mask input", kind);
    }
  } else {
    return ctx.Error(ErrorCode::kInvalidAttribute,
                     "mask_kind '{}' is not one of none, additive, boolean, causal", kind);
  }
  DataType t = ctx.input_type(0);
  if (!IsFloat(t) || ctx.input_type(1) != t || ctx.input_type(2) != t) {
    return ctx.Error(ErrorCode::kTypeMismatch, "Q, K, V must share one float type; got {}, {}, {}",
                     ToString(t), ToString(ctx.input_type(1)), ToString(ctx.input_type(2)));
  }
  std::string layout = attrs::Attention::layout(ctx.attrs());
  if (layout == "bshd" || layout == "bsd" || layout == "sbd") {
    return InferAttentionHeadsInterleaved(ctx, layout);
  }
  if (layout != "bhsd") {
    return ctx.Error(ErrorCode::kInvalidAttribute, "layout '{}' is not one of bhsd, bshd, bsd, sbd",
                     layout);
  }
  const Shape& q = ctx.input_shape(0);
  const Shape& k = ctx.input_shape(1);
  const Shape& v = ctx.input_shape(2);
  size_t rank = q.size();
  if (rank < 2 || k.size() != rank || v.size() != rank) {
    return ctx.Error(ErrorCode::kShapeMismatch, "Q {}, K {}, V {} must have one rank >= 2",
                     ToString(q), ToString(k), ToString(v));
  }
  auto differ = [](const Dim& a, const Dim& b) {
    return a.is_static() && b.is_static() && !(a == b);
  };
  if (differ(q[rank - 1], k[rank - 1]) || differ(k[rank - 2], v[rank - 2])) {
    return ctx.Error(ErrorCode::kShapeMismatch,
                     "Q {} and K {} need the same last dim, K and V the same Sk (V {})",
                     ToString(q), ToString(k), ToString(v));
  }
  Shape qb(q.begin(), q.end() - 2), kb(k.begin(), k.end() - 2), vb(v.begin(), v.end() - 2);
  auto batch = BroadcastShapes(qb, kb);
  if (batch.ok()) batch = BroadcastShapes(*batch, vb);
  if (!batch.ok()) return ctx.Error(ErrorCode::kShapeMismatch, "{}", batch.status().message());
  if (has_mask) {
    DataType mt = ctx.input_type(3);
    if ((kind == "additive" && mt != t) || (kind == "boolean" && mt != DataType::kBool)) {
      return ctx.Error(ErrorCode::kTypeMismatch, "a {} mask must be {}, got {}", kind,
                       kind == "boolean" ? "bool" : ToString(t), ToString(mt));
    }
    Shape scores = *batch;
    scores.push_back(q[rank - 2]);
    scores.push_back(k[rank - 2]);
    auto joined = BroadcastShapes(scores, ctx.input_shape(3));
    if (!joined.ok() || joined->size() != scores.size()) {
      return ctx.Error(ErrorCode::kShapeMismatch, "mask {} does not broadcast to the scores {}",
                       ToString(ctx.input_shape(3)), ToString(scores));
    }
  }
  Shape out = *batch;
  out.push_back(q[rank - 2]);
  out.push_back(v[rank - 1]);
  ctx.set_output(0, ProductOutputType(ctx.node(), t), std::move(out));
  return OkStatus();
}

}  // namespace kiln
