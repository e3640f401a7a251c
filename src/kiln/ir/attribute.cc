// AttributeMap accessors.
#include "kiln/ir/attribute.h"

namespace kiln {

std::string_view ToString(AttributeKind kind) {
  switch (kind) {
    case AttributeKind::kInt:
      return "int";
    case AttributeKind::kFloat:
      return "float";
    case AttributeKind::kString:
      return "string";
    case AttributeKind::kInts:
      return "ints";
    case AttributeKind::kFloats:
      return "floats";
    case AttributeKind::kStrings:
      return "strings";
    case AttributeKind::kTensor:
      return "tensor";
  }
  return "?";
}

const Attribute* AttributeMap::Find(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? nullptr : &it->second;
}

int64_t AttributeMap::GetInt(const std::string& name, int64_t def) const {
  const Attribute* a = Find(name);
  if (a && std::holds_alternative<int64_t>(*a)) return std::get<int64_t>(*a);
  return def;
}

float AttributeMap::GetFloat(const std::string& name, float def) const {
  const Attribute* a = Find(name);
  if (a && std::holds_alternative<float>(*a)) return std::get<float>(*a);
  if (a && std::holds_alternative<int64_t>(*a)) return static_cast<float>(std::get<int64_t>(*a));
  return def;
}

std::string AttributeMap::GetString(const std::string& name, const std::string& def) const {
  const Attribute* a = Find(name);
  if (a && std::holds_alternative<std::string>(*a)) return std::get<std::string>(*a);
  return def;
}

std::vector<int64_t> AttributeMap::GetInts(const std::string& name,
                                           std::vector<int64_t> def) const {
  const Attribute* a = Find(name);
  if (a && std::holds_alternative<std::vector<int64_t>>(*a))
    return std::get<std::vector<int64_t>>(*a);
  return def;
}

std::vector<float> AttributeMap::GetFloats(const std::string& name, std::vector<float> def) const {
  const Attribute* a = Find(name);
  if (a && std::holds_alternative<std::vector<float>>(*a)) return std::get<std::vector<float>>(*a);
  return def;
}

const Tensor* AttributeMap::GetTensor(const std::string& name) const {
  const Attribute* a = Find(name);
  if (a && std::holds_alternative<Tensor>(*a)) return &std::get<Tensor>(*a);
  return nullptr;
}

}  // namespace kiln
