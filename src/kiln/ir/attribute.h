// Node attributes: the ONNX attribute kinds kiln uses (graph-valued attributes are not supported).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "kiln/ir/tensor.h"

namespace kiln {

using Attribute = std::variant<int64_t, float, std::string, std::vector<int64_t>,
                               std::vector<float>, std::vector<std::string>, Tensor>;

enum class AttributeKind : uint8_t { kInt, kFloat, kString, kInts, kFloats, kStrings, kTensor };
inline AttributeKind KindOf(const Attribute& a) { return static_cast<AttributeKind>(a.index()); }
std::string_view ToString(AttributeKind kind);

// Attributes by name, ordered (so hashing and serialisation are deterministic).
class AttributeMap {
 public:
  bool Has(const std::string& name) const { return values_.count(name) != 0; }
  const Attribute* Find(const std::string& name) const;
  void Set(const std::string& name, Attribute value) { values_[name] = std::move(value); }
  void Erase(const std::string& name) { values_.erase(name); }
  const std::map<std::string, Attribute>& all() const { return values_; }
  size_t size() const { return values_.size(); }

  // Typed getters with defaults; a wrong-kind attribute yields the default (the op's shape
  // rule validates kinds and reports KILN-E2009).
  int64_t GetInt(const std::string& name, int64_t def) const;
  float GetFloat(const std::string& name, float def) const;
  std::string GetString(const std::string& name, const std::string& def) const;
  std::vector<int64_t> GetInts(const std::string& name, std::vector<int64_t> def = {}) const;
  std::vector<float> GetFloats(const std::string& name, std::vector<float> def = {}) const;
  const Tensor* GetTensor(const std::string& name) const;

 private:
  std::map<std::string, Attribute> values_;
};

}  // namespace kiln
