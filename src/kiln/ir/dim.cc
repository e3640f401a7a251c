// Dim arithmetic: a tiny polynomial algebra, enough for shape rules over named dims.
#include "kiln/ir/dim.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "kiln/ir/sizes.h"

namespace kiln {

namespace {
// Exact division helpers that never trap (INT64_MIN / -1 saturates).
bool Divides(int64_t c, int64_t d) { return d == -1 || c % d == 0; }
int64_t DivInt(int64_t c, int64_t d) { return d == -1 ? SatSub(0, c) : c / d; }

int64_t FloorDivInt(int64_t a, int64_t b) {
  if (b == -1) return SatSub(0, a);  // INT64_MIN / -1 would trap
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
}  // namespace

Dim::Terms Dim::terms() const {
  if (terms_) return *terms_;
  if (value_ == 0) return {};
  return {{{}, value_}};
}

Dim Dim::Symbol(std::string name) {
  Dim d;
  d.terms_ = std::make_shared<const Terms>(Terms{{{std::move(name)}, 1}});
  return d;
}

Dim Dim::FromTerms(Terms terms) {
  std::sort(terms.begin(), terms.end());
  Terms out;
  out.reserve(terms.size());
  for (auto& t : terms) {
    if (!out.empty() && out.back().first == t.first) {
      out.back().second = SatAdd(out.back().second, t.second);
    } else {
      out.push_back(std::move(t));
    }
  }
  std::erase_if(out, [](const auto& t) { return t.second == 0; });
  if (out.empty()) return Dim(0);
  if (out.size() == 1 && out[0].first.empty()) return Dim(out[0].second);
  Dim d;
  d.terms_ = std::make_shared<const Terms>(std::move(out));
  return d;
}

std::string Dim::ToString() const {
  if (!terms_) return fmt::format("{}", value_);
  std::string out;
  // Constant term last reads better: "2*seq+1".
  std::vector<const std::pair<Monomial, int64_t>*> order;
  for (const auto& t : *terms_) {
    if (!t.first.empty()) order.push_back(&t);
  }
  for (const auto& t : *terms_) {
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
  if (!terms_) return *this;
  Dim out;
  for (const auto& [mono, coeff] : *terms_) {
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
  if (!terms_) return out;
  for (const auto& t : *terms_) out.insert(out.end(), t.first.begin(), t.first.end());
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Dim operator+(const Dim& a, const Dim& b) {
  if (a.is_static() && b.is_static()) return SatAdd(a.value_, b.value_);
  if (b.is_static() && b.value_ == 0) return a;
  if (a.is_static() && a.value_ == 0) return b;
  Dim::Terms t = a.terms();
  Dim::Terms tb = b.terms();
  t.insert(t.end(), std::make_move_iterator(tb.begin()), std::make_move_iterator(tb.end()));
  return Dim::FromTerms(std::move(t));
}

Dim operator-(const Dim& a, const Dim& b) {
  if (a.is_static() && b.is_static()) return SatSub(a.value_, b.value_);
  Dim::Terms neg = b.terms();
  for (auto& t : neg) t.second = SatSub(0, t.second);
  Dim::Terms t = a.terms();
  t.insert(t.end(), std::make_move_iterator(neg.begin()), std::make_move_iterator(neg.end()));
  return Dim::FromTerms(std::move(t));
}

Dim operator*(const Dim& a, const Dim& b) {
  if (a.is_static() && b.is_static()) return SatMul(a.value_, b.value_);
  if ((a.is_static() && a.value_ == 0) || (b.is_static() && b.value_ == 0)) return 0;
  if (b.is_static() && b.value_ == 1) return a;
  if (a.is_static() && a.value_ == 1) return b;
  Dim::Terms out;
  for (const auto& [ma, ca] : a.terms()) {
    for (const auto& [mb, cb] : b.terms()) {
      Dim::Monomial m = ma;
      m.insert(m.end(), mb.begin(), mb.end());
      std::sort(m.begin(), m.end());
      out.push_back({std::move(m), SatMul(ca, cb)});
    }
  }
  return Dim::FromTerms(std::move(out));
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
    Dim::Terms out;
    bool exact = true;
    for (const auto& [m, c] : a.terms()) {
      if (!Divides(c, b.value())) exact = false;
      out.push_back({m, exact ? DivInt(c, b.value()) : c});
    }
    if (exact) return Dim::FromTerms(std::move(out));
  }
  if (a == b) return 1;
  // a = k * b for a symbolic b: divide monomial-wise when b is a single monomial.
  Dim::Terms tb = b.terms();
  if (tb.size() == 1 && tb[0].second != 0) {
    const auto& [bm, bc] = tb[0];
    Dim::Terms out;
    bool exact = true;
    for (const auto& [m, c] : a.terms()) {
      Dim::Monomial rest = m;
      for (const std::string& s : bm) {
        auto it = std::find(rest.begin(), rest.end(), s);
        if (it == rest.end()) {
          exact = false;
          break;
        }
        rest.erase(it);
      }
      if (!exact || !Divides(c, bc)) {
        exact = false;
        break;
      }
      out.push_back({rest, DivInt(c, bc)});
    }
    if (exact) return Dim::FromTerms(std::move(out));
  }
  return Dim::Opaque("floordiv", a, b);
}

Dim CeilDiv(const Dim& a, const Dim& b) { return FloorDiv(a + b - 1, b); }

Dim Mod(const Dim& a, const Dim& b) {
  if (a.is_static() && b.is_static() && b.value() != 0) {
    if (b.value() == -1) return 0;  // the general form would saturate on INT64_MIN
    return SatSub(a.value(), SatMul(FloorDivInt(a.value(), b.value()), b.value()));
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

std::string DataDependentSymbol(const std::string& node, size_t output, size_t index) {
  return "?" + node + ":" + std::to_string(output) + (index ? "." + std::to_string(index) : "");
}

bool IsDataDependentSymbol(const std::string& symbol) {
  return !symbol.empty() && symbol[0] == '?';
}

}  // namespace kiln
