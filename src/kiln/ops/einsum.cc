// Einsum: the equation parser (einsum.h) and the shape rule.
#include "kiln/ops/einsum.h"

#include <algorithm>
#include <map>
#include <optional>

#include "kiln/ir/sizes.h"

#include "kiln/ops/op_schema.h"
#include "kiln/ops/op_table.h"
#include "kiln/ops/rule_util.h"

namespace kiln {

using namespace ops_internal;  // NOLINT: the shape-rule helpers of this folder

namespace {

struct Term {
  std::string letters;    // in order, the ellipsis removed
  int64_t ellipsis = -1;  // position of "..." among the letters (before letters[ellipsis]), -1
};

StatusOr<Term> ParseTerm(const std::string& text) {
  Term t;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '.') {
      if (t.ellipsis >= 0 || text.compare(i, 3, "...") != 0) {
        return MakeError(ErrorCode::kInvalidAttribute, "equation term '{}': '.' only as one '...'",
                         text);
      }
      t.ellipsis = static_cast<int64_t>(t.letters.size());
      i += 2;
    } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      t.letters.push_back(c);
    } else {
      return MakeError(ErrorCode::kInvalidAttribute, "equation term '{}': unexpected '{}'", text,
                       std::string(1, c));
    }
  }
  return t;
}

}  // namespace

StatusOr<EinsumEquation> ParseEinsum(const std::string& equation,
                                     const std::vector<int64_t>& operand_ranks) {
  std::string eq;
  for (char c : equation) {
    if (c != ' ') eq.push_back(c);
  }
  const size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::vector<Term> terms;
  for (size_t start = 0;;) {
    const size_t comma = lhs.find(',', start);
    KILN_ASSIGN_OR_RETURN(Term t, ParseTerm(lhs.substr(start, comma - start)));
    terms.push_back(std::move(t));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (terms.size() != operand_ranks.size()) {
    return MakeError(ErrorCode::kInvalidAttribute, "equation '{}' has {} operand(s); {} given",
                     equation, terms.size(), operand_ranks.size());
  }
  EinsumEquation e;
  std::map<char, int64_t> count;
  std::vector<int64_t> ellipsis_dims(terms.size(), 0);
  for (size_t i = 0; i < terms.size(); ++i) {
    const int64_t labelled = static_cast<int64_t>(terms[i].letters.size());
    const int64_t rank = operand_ranks[i];
    if (terms[i].ellipsis < 0 ? rank != labelled : rank < labelled) {
      return MakeError(ErrorCode::kInvalidAttribute,
                       "equation '{}': operand {} has rank {} for {} label(s){}", equation, i, rank,
                       labelled, terms[i].ellipsis < 0 ? "" : " and '...'");
    }
    ellipsis_dims[i] = terms[i].ellipsis < 0 ? 0 : rank - labelled;
    e.ellipsis_rank = std::max(e.ellipsis_rank, ellipsis_dims[i]);
    for (char c : terms[i].letters) {
      if (count[c]++ == 0) e.letters.push_back(c);
    }
  }
  auto axis_of = [&](char c) {
    return e.ellipsis_rank + (std::find(e.letters.begin(), e.letters.end(), c) - e.letters.begin());
  };
  for (size_t i = 0; i < terms.size(); ++i) {
    std::vector<int64_t> axes;
    for (int64_t k = 0; k <= static_cast<int64_t>(terms[i].letters.size()); ++k) {
      if (k == terms[i].ellipsis) {
        for (int64_t d = e.ellipsis_rank - ellipsis_dims[i]; d < e.ellipsis_rank; ++d) {
          axes.push_back(d);
        }
      }
      if (k < static_cast<int64_t>(terms[i].letters.size())) {
        axes.push_back(axis_of(terms[i].letters[k]));
      }
    }
    e.operand_axes.push_back(std::move(axes));
  }
  const bool any_ellipsis =
      std::any_of(terms.begin(), terms.end(), [](const Term& t) { return t.ellipsis >= 0; });
  if (arrow == std::string::npos) {
    for (int64_t d = 0; d < e.ellipsis_rank; ++d) e.output_axes.push_back(d);
    std::string once;
    for (const auto& [c, n] : count) {
      if (n == 1) once.push_back(c);  // std::map: sorted, upper case before lower as ASCII
    }
    for (char c : once) e.output_axes.push_back(axis_of(c));
    return e;
  }
  KILN_ASSIGN_OR_RETURN(Term out, ParseTerm(eq.substr(arrow + 2)));
  if (out.ellipsis >= 0 && !any_ellipsis && e.ellipsis_rank > 0) {
    return MakeError(ErrorCode::kInvalidAttribute, "equation '{}': '...' in the output only",
                     equation);
  }
  std::string seen;
  for (int64_t k = 0; k <= static_cast<int64_t>(out.letters.size()); ++k) {
    if (k == out.ellipsis) {
      for (int64_t d = 0; d < e.ellipsis_rank; ++d) e.output_axes.push_back(d);
    }
    if (k == static_cast<int64_t>(out.letters.size())) break;
    const char c = out.letters[k];
    if (!count.count(c) || seen.find(c) != std::string::npos) {
      return MakeError(ErrorCode::kInvalidAttribute, "equation '{}': output label '{}' is {} ",
                       equation, std::string(1, c), count.count(c) ? "repeated" : "in no operand");
    }
    seen.push_back(c);
    e.output_axes.push_back(axis_of(c));
  }
  if (out.ellipsis < 0 && any_ellipsis && e.ellipsis_rank > 0) {
    return MakeError(ErrorCode::kInvalidAttribute,
                     "equation '{}': the operands' '...' must appear in the output", equation);
  }
  return e;
}

StatusOr<EinsumPlan> PlanEinsum(const EinsumEquation& e, std::span<const TensorView> in) {
  EinsumPlan p;
  const size_t n = static_cast<size_t>(e.num_axes());
  p.extent.assign(n, 1);
  for (size_t i = 0; i < in.size(); ++i) {
    for (size_t k = 0; k < in[i].dims.size(); ++k) {
      int64_t& x = p.extent[static_cast<size_t>(e.operand_axes[i][k])];
      x = std::max(x, in[i].dims[k]);
    }
  }
  p.stride.assign(in.size(), std::vector<int64_t>(n, 0));
  for (size_t i = 0; i < in.size(); ++i) {
    int64_t s = 1;
    for (size_t k = in[i].dims.size(); k-- > 0;) {
      const size_t axis = static_cast<size_t>(e.operand_axes[i][k]);
      if (!(in[i].dims[k] == 1 && p.extent[axis] > 1)) p.stride[i][axis] += s;
      s *= in[i].dims[k];
    }
  }
  std::vector<bool> in_out(n, false);
  std::optional<int64_t> out_size = 1, red_size = 1;
  for (int64_t a : e.output_axes) {
    p.out_axes.push_back(a);
    in_out[static_cast<size_t>(a)] = true;
    out_size = CheckedMul(out_size.value_or(0), p.extent[static_cast<size_t>(a)]);
    if (!out_size) break;
  }
  for (size_t a = 0; a < n && red_size; ++a) {
    if (in_out[a]) continue;
    p.red_axes.push_back(static_cast<int64_t>(a));
    red_size = CheckedMul(*red_size, p.extent[a]);
  }
  if (!out_size || !red_size || !CheckedMul(*out_size, *red_size)) {
    return MakeError(ErrorCode::kTensorTooLarge,
                     "Einsum's iteration space (output elements x summed combinations) exceeds "
                     "int64");
  }
  p.out_size = *out_size;
  p.red_size = *red_size;
  return p;
}

Status InferEinsum(InferenceContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::string equation, StringAttr(ctx, "equation", ""));
  if (equation.empty()) {
    return ctx.Error(ErrorCode::kInvalidAttribute, "attribute 'equation' is required");
  }
  std::vector<int64_t> ranks;
  const DataType t = ctx.input_type(0);
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    if (!ctx.has_input(i)) return ctx.Error(ErrorCode::kInvalidModel, "operand {} is omitted", i);
    if (ctx.input_type(i) != t) {
      return ctx.Error(ErrorCode::kTypeMismatch, "operands have types {} and {}", ToString(t),
                       ToString(ctx.input_type(i)));
    }
    ranks.push_back(static_cast<int64_t>(ctx.input_shape(i).size()));
  }
  auto parsed = ParseEinsum(equation, ranks);
  if (!parsed.ok()) return ctx.Error(parsed.status().code(), "{}", parsed.status().message());
  const EinsumEquation& e = *parsed;
  // Every axis's extent: equal wherever a letter appears; the ellipsis broadcasts (1 stretches).
  std::vector<std::optional<Dim>> extent(static_cast<size_t>(e.num_axes()));
  for (size_t i = 0; i < ctx.num_inputs(); ++i) {
    const Shape& s = ctx.input_shape(i);
    for (size_t k = 0; k < s.size(); ++k) {
      const int64_t axis = e.operand_axes[i][k];
      std::optional<Dim>& x = extent[static_cast<size_t>(axis)];
      const bool broadcast = axis < e.ellipsis_rank;
      if (!x || (broadcast && x->is_static() && x->value() == 1)) {
        x = s[k];
      } else if (broadcast && s[k].is_static() && s[k].value() == 1) {
        continue;
      } else if (DimsEqual(*x, s[k]) == false) {
        return ctx.Error(ErrorCode::kShapeMismatch, "equation '{}': label extents {} and {} differ",
                         equation, x->ToString(), s[k].ToString());
      }
    }
  }
  Shape out;
  for (int64_t axis : e.output_axes) out.push_back(*extent[static_cast<size_t>(axis)]);
  ctx.set_output(0, t, std::move(out));
  return OkStatus();
}

}  // namespace kiln
