// Dim arithmetic: a tiny polynomial algebra, enough for shape rules over named dims.
#include "kiln/ir/dim.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace kiln {

namespace {
int64_t FloorDivInt(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
}  // namespace

Dim::Dim(int64_t value) {
  if (value != 0) terms_.push_back({{}, value});
}

Dim Dim::Symbol(std::string name) {
  Dim d;
  d.terms_.push_back({{std::move(name)}, 1});
  return d;
}

bool Dim::is_static() const {
  return terms_.empty() || (terms_.size() == 1 && terms_[0].first.empty());
}

int64_t Dim::value() const {
  if (terms_.empty()) return 0;
  return terms_[0].first.empty() && terms_.size() == 1 ? terms_[0].second : -1;
}

std::optional<int64_t> Dim::static_value() const {
  if (!is_static()) return std::nullopt;
  return value();
}

void Dim::Normalize() {
  std::sort(terms_.begin(), terms_.end());
  std::vector<std::pair<Monomial, int64_t>> out;
  for (auto& t : terms_) {
    if (!out.empty() && out.back().first == t.first) {
      out.back().second += t.second;
    } else {
      out.push_back(std::move(t));
    }
  }
  std::erase_if(out, [](const auto& t) { return t.second == 0; });
  terms_ = std::move(out);
}

std::string Dim::ToString() const {
  if (terms_.empty()) return "0";
  std::string out;
  // Constant term last reads better: "2*seq+1".
  std::vector<const std::pair<Monomial, int64_t>*> order;
  for (const auto& t : terms_) {
    if (!t.first.empty()) order.push_back(&t);
  }
  for (const auto& t : terms_) {
    if (t.first.empty()) order.push_back(&t);
  }
  for (size_t i = 0; i < order.size(); ++i) {
    const auto& [mono, coeff] = *order[i];
    int64_t c = coeff;
    if (i > 0) {
      out += c < 0 ? "-" : "+";
      c = c < 0 ? -c : c;
    } else if (c < 0 && !mono.empty()) {
      out += "-";
      c = -c;
    }
    if (mono.empty()) {
      out += fmt::format("{}", c);
      continue;
    }
    if (c != 1) out += fmt::format("{}*", c);
    for (size_t j = 0; j < mono.size(); ++j) {
      if (j) out += "*";
      out += mono[j];
    }
  }
  return out;
}

Dim Dim::Substitute(const std::map<std::string, int64_t>& bindings) const {
  Dim out;
  for (const auto& [mono, coeff] : terms_) {
    Dim term(coeff);
    for (const std::string& s : mono) {
      auto it = bindings.find(s);
      term = term * (it == bindings.end() ? Symbol(s) : Dim(it->second));
    }
    out = out + term;
  }
  return out;
}

std::vector<std::string> Dim::Symbols() const {
  std::vector<std::string> out;
  for (const auto& t : terms_) out.insert(out.end(), t.first.begin(), t.first.end());
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Dim operator+(const Dim& a, const Dim& b) {
  Dim out = a;
  out.terms_.insert(out.terms_.end(), b.terms_.begin(), b.terms_.end());
  out.Normalize();
  return out;
}

Dim operator-(const Dim& a, const Dim& b) {
  Dim neg = b;
  for (auto& t : neg.terms_) t.second = -t.second;
  return a + neg;
}

Dim operator*(const Dim& a, const Dim& b) {
  Dim out;
  for (const auto& [ma, ca] : a.terms_) {
    for (const auto& [mb, cb] : b.terms_) {
      Dim::Monomial m = ma;
      m.insert(m.end(), mb.begin(), mb.end());
      std::sort(m.begin(), m.end());
      out.terms_.push_back({std::move(m), ca * cb});
    }
  }
  out.Normalize();
  return out;
}

Dim Dim::Opaque(const std::string& op, const Dim& a, const Dim& b) {
  return Symbol(fmt::format("{}({},{})", op, a.ToString(), b.ToString()));
}

Dim FloorDiv(const Dim& a, const Dim& b) {
  if (a.is_static() && b.is_static()) {
    if (b.value() == 0) return Dim::Opaque("floordiv", a, b);
    return FloorDivInt(a.value(), b.value());
  }
  if (b.is_static() && b.value() != 0) {
    // Exact when every coefficient divides.
    Dim out;
    bool exact = true;
    for (const auto& [m, c] : a.terms_) {
      if (c % b.value() != 0) exact = false;
      out.terms_.push_back({m, c / (exact ? b.value() : 1)});
    }
    if (exact) {
      out.Normalize();
      return out;
    }
  }
  if (a == b) return 1;
  // a = k * b for a symbolic b: divide monomial-wise when b is a single monomial.
  if (b.terms_.size() == 1 && b.terms_[0].second != 0) {
    const auto& [bm, bc] = b.terms_[0];
    Dim out;
    bool exact = true;
    for (const auto& [m, c] : a.terms_) {
      Dim::Monomial rest = m;
      for (const std::string& s : bm) {
        auto it = std::find(rest.begin(), rest.end(), s);
        if (it == rest.end()) {
          exact = false;
          break;
        }
        rest.erase(it);
      }
      if (!exact || c % bc != 0) {
        exact = false;
        break;
      }
      out.terms_.push_back({rest, c / bc});
    }
    if (exact) {
      out.Normalize();
      return out;
    }
  }
  return Dim::Opaque("floordiv", a, b);
}

Dim CeilDiv(const Dim& a, const Dim& b) { return FloorDiv(a + b - 1, b); }

Dim Mod(const Dim& a, const Dim& b) {
  if (a.is_static() && b.is_static() && b.value() != 0) {
    return a.value() - FloorDivInt(a.value(), b.value()) * b.value();
  }
  if (FloorDiv(a, b) * b == a) return 0;
  return Dim::Opaque("mod", a, b);
}

Dim Max(const Dim& a, const Dim& b) {
  if (a.is_static() && b.is_static()) return std::max(a.value(), b.value());
  if (a == b) return a;
  return Dim::Opaque("max", a, b);
}

Dim Min(const Dim& a, const Dim& b) {
  if (a.is_static() && b.is_static()) return std::min(a.value(), b.value());
  if (a == b) return a;
  return Dim::Opaque("min", a, b);
}

std::string ToString(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ",";
    out += shape[i].ToString();
  }
  return out + "]";
}

bool IsStatic(const Shape& shape) {
  return std::all_of(shape.begin(), shape.end(), [](const Dim& d) { return d.is_static(); });
}

Dim NumElements(const Shape& shape) {
  Dim n = 1;
  for (const Dim& d : shape) n = n * d;
  return n;
}

std::optional<std::vector<int64_t>> StaticDims(const Shape& shape) {
  std::vector<int64_t> out;
  out.reserve(shape.size());
  for (const Dim& d : shape) {
    if (!d.is_static()) return std::nullopt;
    out.push_back(d.value());
  }
  return out;
}

Shape MakeShape(const std::vector<int64_t>& dims) { return Shape(dims.begin(), dims.end()); }

}  // namespace kiln
