// AssignPrecision: per-layer decisions (op table -> range guard -> backend kernels -> INT8), then
// one rewrite of the graph: reduced activations between reduced layers, weights converted at
// build time, and one Cast per (value, target dtype) where precisions meet.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <unordered_map>

#include "kiln/backends/int8_quant.h"
#include "kiln/ir/weight_program.h"
#include "kiln/ops/onnx_dtype.h"
#include "kiln/ops/op_schema.h"
#include "kiln/ops/op_table.h"
#include "kiln/precision/precision.h"

namespace kiln::precision {

using kiln::ToString;

namespace {

bool Contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

double ConstantAbsMax(const Tensor& t) {
  double m = 0;
  const int64_t n = t.num_elements();
  if (t.dtype() == DataType::kFloat32) {
    // Eight running maxima the compiler can keep in one vector register; NaNs are skipped as
    // std::max skips them (a comparison with NaN is false).
    const float* x = t.data<float>();
    float lanes[8] = {};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      for (int j = 0; j < 8; ++j) {
        const float a = std::fabs(x[i + j]);
        lanes[j] = lanes[j] < a ? a : lanes[j];
      }
    }
    for (; i < n; ++i) m = std::max(m, static_cast<double>(std::fabs(x[i])));
    for (float l : lanes) m = std::max(m, static_cast<double>(l));
  } else {
    for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(t.GetDouble(i)));
  }
  return m;
}

// Operand i of `node` is an attention mask whose huge negative values only mean "masked":
// Attention's additive mask, or a Where's fill constant (a splat <= -1e4, the exporters'
// finfo.min or -1e9 written where a key is hidden). Such values may exceed FP16's range without
// keeping the layer FP32: in FP16 they saturate to the finite lowest (-65504), after which
// softmax still gives the masked keys weight 0. (A row masked everywhere is the one difference:
// uniform weights with a finite fill, NaN with -inf; kiln's conversions clamp, so it stays
// uniform wherever the mask is a constant.)
bool IsMaskOperand(const Node& node, size_t i) {
  const OpType op = OpTypeOf(node);
  if (op == OpType::kAttention) return i == 3 && attrs::Attention::mask_kind(node) == "additive";
  if (op == OpType::kWhere && (i == 1 || i == 2)) {
    const Value* v = node.input(i);
    if (!v || !v->constant() || v->constant()->num_elements() < 1) return false;
    const Tensor& t = *v->constant();
    double first = t.GetDouble(0);
    if (!(first <= -1e4)) return false;
    for (int64_t k = 1; k < t.num_elements(); ++k) {
      if (t.GetDouble(k) != first) return false;
    }
    return true;
  }
  return false;
}

// Whether FP16 elements [begin, end) hold an infinity. Almost every constant has none: one pass
// over four halves per 64-bit word says so (a lane is +-inf when its magnitude bits equal 0x7c00,
// i.e. when the XOR is zero; the lanes stay below 0x8000, so the borrow test finds a zero lane
// exactly).
bool AnyHalfInfinity(const uint16_t* bits, int64_t begin, int64_t end) {
  uint64_t found = 0;
  int64_t i = begin;
  for (; i + 4 <= end; i += 4) {
    uint64_t w;
    std::memcpy(&w, bits + i, sizeof(w));
    const uint64_t y = (w & 0x7fff7fff7fff7fffull) ^ 0x7c007c007c007c00ull;
    found |= (y - 0x0001000100010001ull) & ~y & 0x8000800080008000ull;
  }
  for (; i < end; ++i) found |= (bits[i] & 0x7fffu) == 0x7c00u;
  return found != 0;
}

// Elements [begin, end) of a constant in FP16 (`bits`, src already cast) with out-of-range values
// saturated to +-65504 rather than +-inf (only mask operands reach here with such values: the
// range guard keeps any other layer FP32). Only its infinities are looked at again.
void SaturateElements(const Tensor& src, uint16_t* bits, int64_t begin, int64_t end) {
  if (!AnyHalfInfinity(bits, begin, end)) return;
  for (int64_t i = begin; i < end; ++i) {
    if ((bits[i] & 0x7fffu) == 0x7c00u && !std::isinf(src.GetDouble(i))) {
      bits[i] = (bits[i] & 0x8000u) ? 0xfbffu : 0x7bffu;  // -+65504
    }
  }
}

// `t` (src cast to its dtype) with SaturateElements applied; it is copied only when it changes.
Tensor Saturate(const Tensor& src, Tensor t) {
  const int64_t n = t.num_elements();
  if (t.dtype() != DataType::kFloat16 || !AnyHalfInfinity(t.data<uint16_t>(), 0, n)) return t;
  SaturateElements(src, t.mutable_data<uint16_t>(), 0, n);
  return t;
}

// The weight op of a converted constant: `src` cast to `to` (attribute, a kiln DataType), FP16
// infinities that src did not hold saturated (SaturateElements). Build and refit convert through
// it; a large one is split over threads at refit (elementwise), with the same bytes.
constexpr std::string_view kCastOp = "SaturatingCast";
void SaturatingCastElements(const AttributeMap&, const Tensor& src, Tensor& out, int64_t begin,
                            int64_t end) {
  CastElements(src.view(), out.view(), begin, end);
  if (out.dtype() == DataType::kFloat16) {
    SaturateElements(src, static_cast<uint16_t*>(out.view().data), begin, end);
  }
}
StatusOr<std::vector<Tensor>> SaturatingCast(const AttributeMap& a,
                                             std::span<const Tensor* const> in) {
  if (in.size() != 1 || !in[0]) return MakeError(ErrorCode::kInternal, "{}: one input", kCastOp);
  std::vector<Tensor> out;
  out.push_back(Tensor::ForOverwrite(static_cast<DataType>(a.GetInt("to", 0)), in[0]->dims()));
  SaturatingCastElements(a, *in[0], out[0], 0, in[0]->num_elements());
  return out;
}
const bool kCastRegistered =
    RegisterWeightOp(std::string(kCastOp), SaturatingCast,
                     ElementwiseWeightOp{[](const AttributeMap& a, const Tensor&) {
                                           return static_cast<DataType>(a.GetInt("to", 0));
                                         },
                                         SaturatingCastElements});

// Records `converted` (made from `src` by SaturatingCast) as the step refit replays.
void RecordCast(const Value& src, Value* converted) {
  AttributeMap attrs;
  attrs.Set("to", static_cast<int64_t>(converted->constant()->dtype()));
  std::vector<Tensor> outs = {*converted->constant()};
  converted->set_provenance(StepOutputs(std::string(kCastOp), std::string(kWeightOpDomain),
                                        std::move(attrs), {ProvenanceOf(src)}, outs)[0]);
}

class Assigner {
 public:
  Assigner(Graph& graph, const PrecisionOptions& options) : graph_(graph), options_(options) {}

  StatusOr<PrecisionResult> Run();

 private:
  LayerPrecision Decide(Node& node);
  // The first reason `node` cannot run in `dtype` (range guard, then kernels), or "" when it can.
  std::string CannotRun(const Node& node, DataType dtype, const OpPrecisionRule& rule);
  // Whether a provider offers a kernel for `node` in `dtype`; with a `quantized` tactic prefix
  // ("i8-", "f8-"), one of that kind for the annotated node.
  bool HasKernel(const Node& node, DataType dtype, const OpPrecisionRule& rule,
                 std::string_view quantized = {});
  // INT8 and FP8 for a candidate whose float precision `lp` is decided: mark it and ask the
  // kernels; on success `lp` says so, else its reason says why not.
  void TryInt8(Node& node, const OpPrecisionRule& rule, LayerPrecision& lp);
  // The layers of a QDQ model with the model's INT8 scales, before anything else: each becomes
  // INT8 (decided here, FP32 storage) or, when it cannot, gets its Q/DQ back in front of input 0
  // and is decided as a float layer like any other.
  Status DecideModelInt8Layers();
  // Why `node` cannot compute in INT8 with the model's scales `s`, or "" when it can.
  std::string ModelInt8Refusal(const Node& node, const ModelInt8Scales& s);
  // Puts the model's QuantizeLinear -> DequantizeLinear back in front of input 0 and removes the
  // scales: the layer then computes in float on exactly the model's dequantized values.
  void RestoreInputQdq(Node& node, const ModelInt8Scales& s);
  void TryFp8(Node& node, const OpPrecisionRule& rule, LayerPrecision& lp);
  double AbsMax(const Value* v);
  Status Rewrite(const std::vector<Node*>& order);
  // The INT8 sensitivity fallback over the layers Decide made INT8.
  void FallBackSensitiveInt8(const std::vector<Node*>& order);
  // The same for the layers made FP8, over the table's FP8 figures and --fp8-tolerance.
  void FallBackSensitiveFp8(const std::vector<Node*>& order);

  Graph& graph_;
  const PrecisionOptions& options_;
  PrecisionResult result_;
  std::unordered_map<const Value*, double> weight_absmax_;
  std::unordered_map<const Node*, LayerPrecision> decided_;
  std::unordered_map<const Node*, LayerPrecision> model_int8_;     // DecideModelInt8Layers' INT8
  std::unordered_map<const Node*, std::string> fallback_reasons_;  // and why the others are not
  std::unordered_map<const Value*, DataType> original_;
  // Constants converted for the kernel queries, by source tensor and type: each weight is
  // converted once, and the rewrite takes the same tensor. The keys stay valid: values (and the
  // constants inside them) live until the graph is compacted, after AssignPrecision.
  std::map<std::pair<const Tensor*, DataType>, std::unique_ptr<Tensor>> cast_constants_;
  const Tensor& CastConstant(const Tensor& t, DataType to);
  Tensor TakeCastConstant(const Tensor& t, DataType to);
};

const Tensor& Assigner::CastConstant(const Tensor& t, DataType to) {
  auto [it, inserted] = cast_constants_.try_emplace({&t, to});
  if (inserted) it->second = std::make_unique<Tensor>(t.CastTo(to));
  return *it->second;
}

Tensor Assigner::TakeCastConstant(const Tensor& t, DataType to) {
  auto it = cast_constants_.find({&t, to});
  if (it == cast_constants_.end()) return t.CastTo(to);
  Tensor out = std::move(*it->second);
  cast_constants_.erase(it);
  return out;
}

double Assigner::AbsMax(const Value* v) {
  auto [it, inserted] = weight_absmax_.try_emplace(v, 0.0);
  if (inserted) it->second = ConstantAbsMax(*v->constant());
  return it->second;
}

}  // namespace

std::string Int8LayerReason(std::string_view input, double amax, CalibrationMethod method,
                            DataType storage) {
  return fmt::format("i8: input '{}' amax {:.6g} ({}), {} storage", input, amax, ToString(method),
                     ToString(storage));
}

std::string ModelInt8LayerReason(std::string_view input, const ModelInt8Scales& s) {
  const auto [lo, hi] = std::minmax_element(s.weight_scales.begin(), s.weight_scales.end());
  const bool per_tensor = *lo == *hi;
  return fmt::format(
      "i8: from the model's Q/DQ scales (input '{}' scale {:.6g} zero point {}; int8 weights, {}), "
      "f32 storage, not calibrated",
      input, s.input_scale, s.input_zero_point,
      per_tensor
          ? fmt::format("scale {:.6g}", *lo)
          : fmt::format("{} per-channel scales {:.4g}..{:.4g}", s.weight_scales.size(), *lo, *hi));
}

bool HasModelInt8Layers(const Graph& graph) {
  for (const Node* n : graph.nodes()) {
    if (HasModelInt8Attrs(*n)) return true;
  }
  return false;
}

namespace {

bool Assigner::HasKernel(const Node& node, DataType dtype, const OpPrecisionRule& rule,
                         std::string_view quantized) {
  if (!options_.make_request) return dtype == DataType::kFloat32;
  const auto start = std::chrono::steady_clock::now();
  struct AddElapsed {
    double& total;
    std::chrono::steady_clock::time_point start;
    ~AddElapsed() {
      total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  } add_elapsed{result_.kernel_query_seconds, start};
  KernelRequest r = options_.make_request(node);
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    OperandDesc& d = r.inputs[i];
    if (!IsFloat(d.dtype) || Contains(rule.fixed_inputs, static_cast<int>(i))) continue;
    if (d.constant && d.dtype != dtype) d.constant = &CastConstant(*d.constant, dtype);
    d.dtype = dtype;
  }
  for (OperandDesc& d : r.outputs) {
    if (IsFloat(d.dtype)) d.dtype = dtype;
  }
  for (const KernelProvider* p : KernelRegistry::Get().Providers(options_.backend, node)) {
    // FP16/BF16 from the providers' static capability (no cuDNN plan is finalised here; the
    // tactic phase lists and builds the plans once). INT8 and FP8 need the tactics' names.
    if (quantized.empty()) {
      if (p->Supports(r)) return true;
      continue;
    }
    for (const TacticConfig& t : p->Tactics(r)) {
      if (t.name.starts_with(quantized)) return true;
    }
  }
  return false;
}

std::string Assigner::CannotRun(const Node& node, DataType dtype, const OpPrecisionRule& rule) {
  if (dtype == DataType::kFloat16) {
    const double limit = kFp16Max / kFp16GuardMargin;
    auto beyond = [&](const Value* v, const char* role) -> std::string {
      double m = -1;
      std::string where;
      if (v->constant()) {
        m = AbsMax(v);
        where = "";
      } else if (options_.calibration) {
        if (const TensorRange* r = options_.calibration->Find(v->name())) m = r->absmax;
        where = " in calibration";
      }
      if (m <= limit) return "";
      return fmt::format(
          "{} '{}' reaches |x| = {:.4g}{}, beyond the FP16 range (65504 with a "
          "{}x margin)",
          role, v->name(), m, where, kFp16GuardMargin);
    };
    for (size_t i = 0; i < node.num_inputs(); ++i) {
      const Value* v = node.input(i);
      if (!v || !IsFloat(v->dtype()) || Contains(rule.fixed_inputs, static_cast<int>(i))) continue;
      if (IsMaskOperand(node, i)) continue;
      if (std::string why = beyond(v, v->constant() ? "weight" : "input"); !why.empty()) return why;
    }
    for (const Value* v : node.outputs()) {
      if (!v || !IsFloat(v->dtype())) continue;
      if (std::string why = beyond(v, "output"); !why.empty()) return why;
    }
  }
  if (!HasKernel(node, dtype, rule)) {
    return fmt::format("no {} kernel on {}", ToString(dtype), ToString(options_.backend));
  }
  return "";
}

LayerPrecision Assigner::Decide(Node& node) {
  LayerPrecision lp;
  const OpPrecisionRule rule = LookupOpPrecision(OpTypeOf(node));
  bool float_io = false;
  for (size_t i = 0; i < node.num_inputs(); ++i) {
    const Value* v = node.input(i);
    if (v && IsFloat(v->dtype()) && !Contains(rule.fixed_inputs, static_cast<int>(i)))
      float_io = true;
  }
  for (const Value* v : node.outputs()) float_io |= v && IsFloat(v->dtype());
  if (node.num_outputs() && node.output(0)) lp.dtype = node.output(0)->dtype();
  if (!float_io) {
    lp.reason = "integer/shape op: keeps the model's types";
    return lp;
  }
  if (rule.kind == OpPrecision::kUntouched) {
    lp.reason = std::string(rule.reason);
    return lp;
  }
  lp.dtype = DataType::kFloat32;
  const bool fp16 = options_.fp16 || options_.int8 || options_.fp8;
  if (!fp16 && !options_.bf16) {
    lp.reason = "fp32: reduced precision not enabled (--fp16/--bf16/--int8/--fp8)";
    return lp;
  }
  if (rule.kind == OpPrecision::kKeepFp32) {
    lp.reason = fmt::format("fp32 for accuracy: {}", rule.reason);
    return lp;
  }
  // Reduced float: FP16 first (TensorRT's usual choice), BF16 when FP16 is refused.
  std::vector<std::string> refused;
  std::vector<DataType> tries;
  if (fp16) tries.push_back(DataType::kFloat16);
  if (options_.bf16) tries.push_back(DataType::kBFloat16);
  for (DataType t : tries) {
    std::string why = CannotRun(node, t, rule);
    if (why.empty()) {
      lp.dtype = t;
      lp.reason = refused.empty() ? fmt::format("{}: allowed and a {} kernel exists", ToString(t),
                                                ToString(options_.backend))
                                  : fmt::format("{}: f16 refused ({})", ToString(t), refused[0]);
      break;
    }
    refused.push_back(why);
  }
  if (lp.dtype == DataType::kFloat32) {
    lp.reason = fmt::format("fp32: {}", fmt::join(refused, "; "));
  }

  if (!IsInt8Candidate(node)) return lp;
  if (options_.int8 && !HasModelInt8Attrs(node)) TryInt8(node, rule, lp);
  if (options_.fp8 && !lp.int8) TryFp8(node, rule, lp);
  return lp;
}

void Assigner::TryInt8(Node& node, const OpPrecisionRule& rule, LayerPrecision& lp) {
  // INT8: the kernel quantizes input 0 with the calibrated amax and the weights per channel; the
  // layer's float storage is what was decided above.
  const TensorRange* range =
      options_.calibration ? options_.calibration->Find(node.input(0)->name()) : nullptr;
  if (!range) {
    lp.reason += "; not int8: no calibration data for its input (give --calib-dir)";
    return;
  }
  if (!(range->amax > 0) || !std::isfinite(range->amax)) {
    lp.reason += fmt::format("; not int8: input '{}' has calibrated amax {} (all zero?)",
                             node.input(0)->name(), range->amax);
    return;
  }
  node.mutable_attrs().Set(std::string(kInt8InputAmaxAttr), static_cast<float>(range->amax));
  if (!HasKernel(node, lp.dtype, rule, kInt8TacticPrefix)) {
    node.mutable_attrs().Erase(std::string(kInt8InputAmaxAttr));
    lp.reason = fmt::format("{}: no int8 kernel on {}", lp.label(), ToString(options_.backend));
    return;
  }
  lp.int8 = true;
  lp.reason =
      Int8LayerReason(node.input(0)->name(), range->amax, options_.calibration->method, lp.dtype);
}

void Assigner::TryFp8(Node& node, const OpPrecisionRule& rule, LayerPrecision& lp) {
  // FP8 E4M3 keeps 3 mantissa bits over a wide exponent range: the scale maps the calibrated
  // absmax (not a clipped amax) to E4M3's largest finite value, as TensorRT's FP8 calibration.
  const TensorRange* range =
      options_.calibration ? options_.calibration->Find(node.input(0)->name()) : nullptr;
  if (!range) {
    lp.reason += "; not fp8: no calibration data for its input (give --calib-dir)";
    return;
  }
  if (!(range->absmax > 0) || !std::isfinite(range->absmax)) {
    lp.reason += fmt::format("; not fp8: input '{}' has calibrated absmax {} (all zero?)",
                             node.input(0)->name(), range->absmax);
    return;
  }
  node.mutable_attrs().Set(std::string(kFp8InputAmaxAttr), static_cast<float>(range->absmax));
  if (!HasKernel(node, lp.dtype, rule, kFp8TacticPrefix)) {
    node.mutable_attrs().Erase(std::string(kFp8InputAmaxAttr));
    if (options_.int8) {
      lp.reason += fmt::format("; no fp8 kernel on {}", ToString(options_.backend));
    } else {
      lp.reason = fmt::format("{}: no fp8 kernel on {}", lp.label(), ToString(options_.backend));
    }
    return;
  }
  lp.fp8 = true;
  lp.reason = fmt::format("f8: input '{}' absmax {:.6g}, E4M3 per tensor, {} storage",
                          node.input(0)->name(), range->absmax, ToString(lp.dtype));
}

void Assigner::FallBackSensitiveInt8(const std::vector<Node*>& order) {
  const CalibrationTable* table = options_.calibration;
  const double tolerance = options_.int8_tolerance;
  std::vector<std::string> int8;
  for (Node* node : order) {
    // A QDQ model's layers keep the model's scales: the fallback is for calibrated layers.
    if (decided_.at(node).int8 && !decided_.at(node).int8_from_model) {
      int8.push_back(node->name());
    }
  }
  if (!table || table->int8_all_rel_l2 < 0 || !std::isfinite(tolerance) || int8.empty()) return;
  const Int8FallbackPlan plan = PlanInt8Fallback(*table, int8, tolerance);
  result_.int8_estimated_rel_l2 = plan.estimate;
  for (Node* node : order) {
    LayerPrecision& lp = decided_.at(node);
    if (!lp.int8 || lp.int8_from_model) continue;
    auto s = table->int8_sensitivity.find(node->name());
    const double sensitivity = s == table->int8_sensitivity.end() ? 0.0 : s->second;
    auto f = plan.fall_back.find(node->name());
    if (f == plan.fall_back.end()) {
      lp.reason += fmt::format(
          "; int8 sensitivity rel-L2 {:.3g}, INT8 layers' estimated rel-L2 {:.3g} <= "
          "tolerance {:.3g}",
          sensitivity, plan.estimate, tolerance);
      continue;
    }
    node->mutable_attrs().Erase(std::string(kInt8InputAmaxAttr));
    lp.int8 = false;
    lp.reason = fmt::format(
        "{}: int8 sensitivity rel-L2 {:.3g} alone; INT8 layers' estimated rel-L2 with it {:.3g} > "
        "tolerance {:.3g}",
        lp.label(), f->second.sensitivity, f->second.estimate, tolerance);
    ++result_.int8_fallbacks;
  }
}

void Assigner::FallBackSensitiveFp8(const std::vector<Node*>& order) {
  const CalibrationTable* table = options_.calibration;
  const double tolerance = options_.fp8_tolerance;
  std::vector<std::string> fp8;
  // What FP8 saves grows with the product's size: the weight's K x N (the multiply-adds per row
  // of A). On an H100 BERT-base's feed-forward products gained most from FP8 and its smallest
  // (the attention output projection) nothing; ranked by sensitivity alone, the fallback sent
  // back the feed-forward ones and kept FP8 where it did not pay.
  std::map<std::string, double> benefit;
  for (Node* node : order) {
    if (!decided_.at(node).fp8) continue;
    fp8.push_back(node->name());
    const Tensor* w = node->input(1) ? node->input(1)->constant() : nullptr;
    if (w) benefit[node->name()] = static_cast<double>(w->num_elements());
  }
  if (!table || table->fp8_all_rel_l2 < 0 || !std::isfinite(tolerance) || fp8.empty()) return;
  const Int8FallbackPlan plan =
      PlanFallback(table->fp8_sensitivity, table->fp8_all_rel_l2, fp8, tolerance, benefit);
  result_.fp8_estimated_rel_l2 = plan.estimate;
  for (Node* node : order) {
    LayerPrecision& lp = decided_.at(node);
    if (!lp.fp8) continue;
    auto s = table->fp8_sensitivity.find(node->name());
    const double sensitivity = s == table->fp8_sensitivity.end() ? 0.0 : s->second;
    auto f = plan.fall_back.find(node->name());
    if (f == plan.fall_back.end()) {
      lp.reason += fmt::format(
          "; fp8 sensitivity rel-L2 {:.3g}, FP8 layers' estimated rel-L2 {:.3g} <= tolerance "
          "{:.3g}",
          sensitivity, plan.estimate, tolerance);
      continue;
    }
    node->mutable_attrs().Erase(std::string(kFp8InputAmaxAttr));
    lp.fp8 = false;
    lp.reason = fmt::format(
        "{}: fp8 sensitivity rel-L2 {:.3g} alone; FP8 layers' estimated rel-L2 with it {:.3g} > "
        "tolerance {:.3g}",
        lp.label(), f->second.sensitivity, f->second.estimate, tolerance);
    ++result_.fp8_fallbacks;
  }
}

bool IsReduced(const LayerPrecision& lp) {
  return lp.dtype == DataType::kFloat16 || lp.dtype == DataType::kBFloat16;
}

Status Assigner::Rewrite(const std::vector<Node*>& order) {
  // Storage dtype of every value after the rewrite.
  std::unordered_map<const Value*, DataType> storage;
  for (Value* v : graph_.values()) storage[v] = v->dtype();

  // Reduced producers of graph outputs write a new reduced value; a Cast writes the output.
  std::vector<Node*> layers = order;
  std::vector<std::pair<Value*, Value*>> output_casts;  // (reduced value, graph output)
  for (Node*& node : layers) {
    const LayerPrecision lp = decided_.at(node);
    if (!IsReduced(lp)) continue;
    std::vector<Value*> outs = node->outputs();
    bool changed = false;
    for (Value*& v : outs) {
      if (!v || !IsFloat(v->dtype())) continue;
      storage[v] = lp.dtype;
      if (!v->is_graph_output()) continue;
      Value* reduced = graph_.AddValue(
          graph_.UniqueName(fmt::format("{}_{}", v->name(), ToString(lp.dtype))), lp.dtype);
      storage[reduced] = lp.dtype;
      storage[v] = v->dtype();
      original_[reduced] = original_.at(v);
      output_casts.emplace_back(reduced, v);
      v = reduced;
      changed = true;
    }
    if (!changed) continue;
    // Same node, new outputs: re-created (the IR has no output setter); consumers of the old
    // values move to the reduced ones below.
    std::vector<Value*> ins = node->inputs();
    std::string name = node->name(), op = node->op_type(), domain = node->domain();
    AttributeMap attrs = node->attrs();
    decided_.erase(node);
    graph_.RemoveNode(node);
    Node* fresh = graph_.AddNode(op, name, ins, outs, attrs, domain);
    decided_[fresh] = lp;
    node = fresh;
  }
  for (auto [reduced, out] : output_casts) {
    std::vector<Node*> consumers = out->consumers();
    for (Node* c : consumers) {
      for (size_t i = 0; i < c->num_inputs(); ++i) {
        if (c->input(i) == out) graph_.SetInput(c, i, reduced);
      }
    }
  }

  std::map<std::pair<const Value*, DataType>, Value*> converted;  // one per value and dtype
  auto convert = [&](Value* v, DataType to) -> Value* {
    auto key = std::make_pair(static_cast<const Value*>(v), to);
    if (auto it = converted.find(key); it != converted.end()) return it->second;
    Value* nv;
    if (v->constant()) {
      nv = graph_.AddConstant(graph_.UniqueName(fmt::format("{}_{}", v->name(), ToString(to))),
                              Saturate(*v->constant(), TakeCastConstant(*v->constant(), to)));
      RecordCast(*v, nv);
      ++result_.weights_converted;
    } else {
      nv = graph_.AddValue(graph_.UniqueName(fmt::format("{}_{}", v->name(), ToString(to))), to);
      AttributeMap attrs;
      attrs.Set("to", OnnxDataTypeCode(to));
      std::string name = graph_.UniqueName(fmt::format("cast_{}_to_{}", v->name(), ToString(to)));
      graph_.AddNode("Cast", name, {v}, {nv}, std::move(attrs));
      LayerPrecision lp;
      lp.dtype = to;
      lp.reason =
          fmt::format("precision boundary: {} -> {}", ToString(storage.at(v)), ToString(to));
      result_.layers[name] = lp;
      ++result_.casts_inserted;
    }
    storage[nv] = to;
    converted[key] = nv;
    return nv;
  };
  for (Node* node : layers) {
    const LayerPrecision& lp = decided_.at(node);
    const OpPrecisionRule rule = LookupOpPrecision(OpTypeOf(*node));
    if (rule.any_input_storage) continue;
    for (size_t i = 0; i < node->num_inputs(); ++i) {
      Value* v = node->input(i);
      if (!v) continue;
      auto orig = original_.find(v);
      DataType model_type = orig != original_.end() ? orig->second : v->dtype();
      if (!IsFloat(model_type)) continue;
      DataType wanted = IsReduced(lp) && !Contains(rule.fixed_inputs, static_cast<int>(i))
                            ? lp.dtype
                            : model_type;
      if (storage.at(v) != wanted) graph_.SetInput(node, i, convert(v, wanted));
    }
  }
  for (auto [reduced, out] : output_casts) {
    AttributeMap attrs;
    attrs.Set("to", OnnxDataTypeCode(out->dtype()));
    std::string name =
        graph_.UniqueName(fmt::format("cast_{}_to_{}", out->name(), ToString(out->dtype())));
    graph_.AddNode("Cast", name, {reduced}, {out}, std::move(attrs));
    LayerPrecision lp;
    lp.dtype = out->dtype();
    lp.reason = fmt::format("graph output keeps its ONNX type: {} -> {}",
                            ToString(reduced->dtype()), ToString(out->dtype()));
    result_.layers[name] = lp;
    ++result_.casts_inserted;
  }
  graph_.Compact();
  KILN_RETURN_IF_ERROR_CTX(InferShapes(graph_).status(),
                           "inferring shapes after precision assignment");
  // The ops' type rules must agree with the plan: a disagreement is a table bug, not user error.
  for (Node* node : graph_.nodes()) {
    for (Value* v : node->outputs()) {
      if (v && storage.count(v) && storage.at(v) != v->dtype()) {
        return MakeError(ErrorCode::kInternal,
                         "precision: layer '{}' ({}) output '{}' is {} but {} was planned",
                         node->name(), node->op_type(), v->name(), ToString(v->dtype()),
                         ToString(storage.at(v)));
      }
    }
  }
  return OkStatus();
}

std::string Assigner::ModelInt8Refusal(const Node& node, const ModelInt8Scales& s) {
  if (!IsInt8Candidate(node)) return "its weight is not a constant";
  const Tensor& w = *node.input(1)->constant();
  if (StatusOr<Int8Weights> q = Int8WeightsFor(node, w); !q.ok()) return q.status().message();
  (void)s;
  const OpPrecisionRule rule = LookupOpPrecision(OpTypeOf(node));
  if (!HasKernel(node, DataType::kFloat32, rule, kInt8TacticPrefix)) {
    return fmt::format("no int8 kernel on {} takes it", ToString(options_.backend));
  }
  return "";
}

void Assigner::RestoreInputQdq(Node& node, const ModelInt8Scales& s) {
  Value* x = node.input(0);
  const std::string base = x->name();
  Tensor scale(DataType::kFloat32, {});
  *scale.mutable_data<float>() = s.input_scale;
  Tensor zero(DataType::kInt8, {});
  *zero.mutable_data<int8_t>() = static_cast<int8_t>(s.input_zero_point);
  Value* sv = graph_.AddConstant(graph_.UniqueName(base + "_qdq_scale"), std::move(scale));
  sv->set_provenance(LiteralExpr(*sv->constant()));
  Value* zv = graph_.AddConstant(graph_.UniqueName(base + "_qdq_zero_point"), std::move(zero));
  zv->set_provenance(LiteralExpr(*zv->constant()));
  Value* q = graph_.AddValue(graph_.UniqueName(base + "_quantized"), DataType::kInt8);
  Value* dq = graph_.AddValue(graph_.UniqueName(base + "_dequantized"), x->dtype());
  graph_.AddNode("QuantizeLinear", graph_.UniqueName(node.name() + "_input_q"), {x, sv, zv}, {q});
  graph_.AddNode("DequantizeLinear", graph_.UniqueName(node.name() + "_input_dq"), {q, sv, zv},
                 {dq});
  graph_.SetInput(&node, 0, dq);
  EraseModelInt8Attrs(node);
}

Status Assigner::DecideModelInt8Layers() {
  std::vector<Node*> layers;
  for (Node* n : graph_.nodes()) {
    if (HasModelInt8Attrs(*n)) layers.push_back(n);
  }
  if (layers.empty()) return OkStatus();
  for (Node* node : layers) {
    std::optional<ModelInt8Scales> s = ModelInt8ScalesOf(*node);
    if (!s) {
      // qdq_fusion writes only usable scales; anything else was written by hand.
      return MakeError(ErrorCode::kInvalidModel,
                       "layer '{}' carries INT8 scale attributes ({}, {}, {}) that are not usable "
                       "scales (finite and positive) with a zero point in [-128, 127]",
                       node->name(), kInt8InputScaleAttr, kInt8InputZeroPointAttr,
                       kInt8WeightScalesAttr);
    }
    const std::string why = ModelInt8Refusal(*node, *s);
    if (why.empty()) {
      LayerPrecision lp;
      lp.dtype = DataType::kFloat32;
      lp.int8 = lp.int8_from_model = true;
      lp.reason = ModelInt8LayerReason(node->input(0)->name(), *s);
      model_int8_[node] = lp;
      ++result_.int8_model_layers;
      continue;
    }
    RestoreInputQdq(*node, *s);
    fallback_reasons_[node] = why;
    ++result_.int8_model_fallbacks;
  }
  KILN_RETURN_IF_ERROR_CTX(InferShapes(graph_).status(),
                           "inferring shapes after restoring Q/DQ in front of float layers");
  return OkStatus();
}

StatusOr<PrecisionResult> Assigner::Run() {
  KILN_RETURN_IF_ERROR(DecideModelInt8Layers());
  KILN_ASSIGN_OR_RETURN(std::vector<Node*> order, graph_.TopologicalOrder());
  for (Value* v : graph_.values()) original_[v] = v->dtype();
  for (Node* node : order) {
    if (auto m = model_int8_.find(node); m != model_int8_.end()) {
      decided_[node] = m->second;
      continue;
    }
    decided_[node] = Decide(*node);
    if (auto f = fallback_reasons_.find(node); f != fallback_reasons_.end()) {
      decided_[node].reason = fmt::format(
          "{}; not int8 with the model's Q/DQ scales ({}): computes in float on the model's "
          "dequantized input and weights",
          decided_[node].reason, f->second);
    }
  }
  if (options_.int8) FallBackSensitiveInt8(order);
  if (options_.fp8) FallBackSensitiveFp8(order);
  for (const auto& [node, lp] : decided_) {
    result_.int8_layers += lp.int8;
    result_.fp8_layers += lp.fp8;
  }
  bool any_reduced = std::any_of(decided_.begin(), decided_.end(),
                                 [](const auto& kv) { return IsReduced(kv.second); });
  if (any_reduced) KILN_RETURN_IF_ERROR(Rewrite(order));
  for (const auto& [node, lp] : decided_) {
    if (!node->is_dead()) result_.layers[node->name()] = lp;
  }
  return std::move(result_);
}

}  // namespace

StatusOr<PrecisionResult> AssignPrecision(Graph& graph, const PrecisionOptions& options) {
  Assigner assigner(graph, options);
  return assigner.Run();
}

Status DemoteToFp32(Graph& graph, Node& node, const std::string& reason, PrecisionResult& result) {
  auto it = result.layers.find(node.name());
  if (it == result.layers.end() || it->second.int8 || it->second.fp8 ||
      (it->second.dtype != DataType::kFloat16 && it->second.dtype != DataType::kBFloat16)) {
    return MakeError(ErrorCode::kInternal, "layer '{}' was not given FP16 or BF16", node.name());
  }
  const DataType reduced = it->second.dtype;
  const OpPrecisionRule rule = LookupOpPrecision(node.op_type());
  auto cast = [&](Value* from, Value* to) {
    AttributeMap attrs;
    attrs.Set("to", OnnxDataTypeCode(to->dtype()));
    std::string name =
        graph.UniqueName(fmt::format("cast_{}_to_{}", from->name(), ToString(to->dtype())));
    graph.AddNode("Cast", name, {from}, {to}, std::move(attrs));
    LayerPrecision lp;
    lp.dtype = to->dtype();
    lp.reason =
        fmt::format("precision boundary: {} -> {}", ToString(from->dtype()), ToString(to->dtype()));
    result.layers[name] = lp;
    ++result.casts_inserted;
  };
  for (size_t i = 0; i < node.num_inputs(); ++i) {
    Value* v = node.input(i);
    if (!v || v->dtype() != reduced || Contains(rule.fixed_inputs, static_cast<int>(i))) continue;
    const std::string name = graph.UniqueName(fmt::format("{}_f32", v->name()));
    Value* wide;
    if (v->constant()) {
      wide = graph.AddConstant(name,
                               Saturate(*v->constant(), v->constant()->CastTo(DataType::kFloat32)));
      RecordCast(*v, wide);
    } else {
      wide = graph.AddValue(name, DataType::kFloat32);
      cast(v, wide);
    }
    graph.SetInput(&node, i, wide);
  }
  for (Value* out : node.outputs()) {
    if (!out || out->dtype() != reduced) continue;
    Value* narrow = graph.AddValue(
        graph.UniqueName(fmt::format("{}_{}", out->name(), ToString(reduced))), reduced);
    graph.ReplaceAllUses(out, narrow);  // consumers keep reading the reduced type
    out->set_dtype(DataType::kFloat32);
    cast(out, narrow);
  }
  it->second.dtype = DataType::kFloat32;
  it->second.reason = reason;
  KILN_RETURN_IF_ERROR_CTX(InferShapes(graph).status(), "after computing layer '{}' in FP32",
                           node.name());
  return OkStatus();
}

}  // namespace kiln::precision
