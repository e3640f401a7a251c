// The INT8 layer attributes (int8_layer.h): reading, writing and erasing the model's scales.
#include "kiln/ops/int8_layer.h"

#include <fmt/format.h>

#include <cmath>
#include <string>

namespace kiln {

namespace {
bool UsableScale(float s) { return std::isfinite(s) && s > 0.f; }
}  // namespace

std::optional<ModelInt8Scales> ModelInt8ScalesOf(const Node& node) {
  const AttributeMap& a = node.attrs();
  if (!a.Has(kInt8InputScaleAttr) || !a.Has(kInt8InputZeroPointAttr) ||
      !a.Has(kInt8WeightScalesAttr)) {
    return std::nullopt;
  }
  ModelInt8Scales s;
  s.input_scale = a.GetFloat(kInt8InputScaleAttr, 0.f);
  const int64_t zp = a.GetInt(kInt8InputZeroPointAttr, 1000);
  s.weight_scales = a.GetFloats(kInt8WeightScalesAttr);
  if (!UsableScale(s.input_scale) || zp < -128 || zp > 127 || s.weight_scales.empty()) {
    return std::nullopt;
  }
  for (float w : s.weight_scales) {
    if (!UsableScale(w)) return std::nullopt;
  }
  s.input_zero_point = static_cast<int32_t>(zp);
  if (const Attribute* src = a.Find(kInt8ScaleSourcesAttr)) {
    if (const auto* names = std::get_if<std::vector<std::string>>(src)) s.sources = *names;
  }
  return s;
}

bool HasModelInt8Attrs(const Node& node) {
  const AttributeMap& a = node.attrs();
  return a.Has(kInt8InputScaleAttr) || a.Has(kInt8InputZeroPointAttr) ||
         a.Has(kInt8WeightScalesAttr);
}

void SetModelInt8Attrs(Node& node, const ModelInt8Scales& scales) {
  AttributeMap& a = node.mutable_attrs();
  a.Set(kInt8InputScaleAttr, scales.input_scale);
  a.Set(kInt8InputZeroPointAttr, static_cast<int64_t>(scales.input_zero_point));
  a.Set(kInt8WeightScalesAttr, scales.weight_scales);
  if (scales.sources.empty()) {
    a.Erase(kInt8ScaleSourcesAttr);
  } else {
    a.Set(kInt8ScaleSourcesAttr, scales.sources);
  }
}

void EraseModelInt8Attrs(Node& node) {
  AttributeMap& a = node.mutable_attrs();
  a.Erase(kInt8InputScaleAttr);
  a.Erase(kInt8InputZeroPointAttr);
  a.Erase(kInt8WeightScalesAttr);
  a.Erase(kInt8ScaleSourcesAttr);
}

Status CheckModelInt8Sources(const Graph& graph,
                             const std::map<std::string, Tensor>& initializers) {
  for (const Node* n : graph.nodes()) {
    std::optional<ModelInt8Scales> s = ModelInt8ScalesOf(*n);
    if (!s) continue;
    const std::vector<std::string>& sources = s->sources;
    for (size_t i = 0; i < sources.size() && i < 3; ++i) {
      auto it = initializers.find(sources[i]);
      if (sources[i].empty() || it == initializers.end()) continue;
      const Tensor& t = it->second;
      bool same = t.num_elements() >= 1;
      std::string built;
      if (i == 0) {
        same =
            same && t.num_elements() == 1 && static_cast<float>(t.GetDouble(0)) == s->input_scale;
        built = fmt::format("{}", s->input_scale);
      } else if (i == 1) {
        const int64_t shift = t.dtype() == DataType::kUInt8 ? 128 : 0;
        same = same && t.num_elements() == 1 &&
               static_cast<int64_t>(t.GetDouble(0)) - shift == s->input_zero_point;
        built = fmt::format("{} (int8 domain)", s->input_zero_point);
      } else {
        const size_t c = s->weight_scales.size();
        const int64_t e = t.num_elements();
        same = same && (e == 1 || e == static_cast<int64_t>(c));
        for (size_t k = 0; same && k < c; ++k) {
          same = static_cast<float>(t.GetDouble(e == 1 ? 0 : static_cast<int64_t>(k))) ==
                 s->weight_scales[k];
        }
        built = fmt::format("{} per-channel values", c);
      }
      if (!same) {
        static constexpr const char* kWhat[] = {"activation scale", "activation zero point",
                                                "weight scale"};
        return MakeError(ErrorCode::kRefitNotRefittable,
                         "layer '{}' computes in INT8 with the model's {} from initializer '{}' "
                         "({}), and the new weights change it: the quantization shaped the "
                         "engine; rebuild it",
                         n->name(), kWhat[i], sources[i], built);
      }
    }
  }
  return OkStatus();
}

}  // namespace kiln
