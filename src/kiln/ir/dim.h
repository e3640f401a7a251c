// Symbolic dimensions. A Dim is an integer polynomial over named symbols ("batch", "seq"):
// 3, batch, 2*seq, batch*seq*12. Expressions that are not polynomials (an inexact division,
// a max) become a fresh symbol whose name is the expression. Shape rules are written once over
// Dim: at build time dims may be symbolic; at run time every Dim is a plain integer.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

class Dim {
 public:
  Dim() = default;
  Dim(int64_t value);  // NOLINT: implicit, so `Dim d = 3;` reads naturally
  static Dim Symbol(std::string name);

  bool is_static() const;
  // Only for static dims.
  int64_t value() const;
  // Static value or nullopt.
  std::optional<int64_t> static_value() const;
  std::string ToString() const;

  // Substitutes symbols; a dim whose symbols are all bound becomes static.
  Dim Substitute(const std::map<std::string, int64_t>& bindings) const;
  // The symbols it mentions.
  std::vector<std::string> Symbols() const;
  // The polynomial as terms coeff * product(symbols): monomials sorted and unique, coefficients
  // non-zero (for serialisation; rebuild a Dim from terms with Symbol, * and +).
  const std::vector<std::pair<std::vector<std::string>, int64_t>>& terms() const { return terms_; }

  friend Dim operator+(const Dim& a, const Dim& b);
  friend Dim operator-(const Dim& a, const Dim& b);
  friend Dim operator*(const Dim& a, const Dim& b);
  // Floor division and remainder; exact when both are static or the division is exact.
  friend Dim FloorDiv(const Dim& a, const Dim& b);
  friend Dim CeilDiv(const Dim& a, const Dim& b);
  friend Dim Mod(const Dim& a, const Dim& b);
  friend Dim Max(const Dim& a, const Dim& b);
  friend Dim Min(const Dim& a, const Dim& b);
  friend bool operator==(const Dim& a, const Dim& b) { return a.terms_ == b.terms_; }

 private:
  // Sum of coeff * product(symbols); monomials sorted, no zero coefficients.
  using Monomial = std::vector<std::string>;
  std::vector<std::pair<Monomial, int64_t>> terms_;
  void Normalize();
  static Dim Opaque(const std::string& op, const Dim& a, const Dim& b);
};

using Shape = std::vector<Dim>;

std::string ToString(const Shape& shape);  // "[batch,3,224,224]"
bool IsStatic(const Shape& shape);
// Product of dims (a Dim, possibly symbolic).
Dim NumElements(const Shape& shape);
// Static dims of a static shape; nullopt when any dim is symbolic.
std::optional<std::vector<int64_t>> StaticDims(const Shape& shape);
Shape MakeShape(const std::vector<int64_t>& dims);

}  // namespace kiln
