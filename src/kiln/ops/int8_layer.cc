// The INT8 layer attributes (int8_layer.h): reading, writing and erasing the model's scales.
#include "kiln/ops/int8_layer.h"

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
}

void EraseModelInt8Attrs(Node& node) {
  AttributeMap& a = node.mutable_attrs();
  a.Erase(kInt8InputScaleAttr);
  a.Erase(kInt8InputZeroPointAttr);
  a.Erase(kInt8WeightScalesAttr);
}

}  // namespace kiln
