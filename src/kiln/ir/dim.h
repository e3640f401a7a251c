// Symbolic dimensions. A Dim is an integer polynomial over named symbols ("batch", "seq"):
// 3, batch, 2*seq, batch*seq*12. Expressions that are not polynomials (an inexact division,
// a max) become a fresh symbol whose name is the expression. Shape rules are written once over
// Dim: at build time dims may be symbolic; at run time every Dim is a plain integer.
// Arithmetic saturates instead of wrapping (ir/sizes.h): an overflowing static result becomes
// INT64_MAX or INT64_MIN, which the size checks every inferred shape passes through reject.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kiln {

// A static Dim is an inline integer (copying it allocates nothing: shape inference copies shapes
// all the time); a symbolic one shares its immutable polynomial.
class Dim {
 public:
  using Monomial = std::vector<std::string>;
  using Terms = std::vector<std::pair<Monomial, int64_t>>;

  Dim() = default;
  Dim(int64_t value) : value_(value) {}  // NOLINT: implicit, so `Dim d = 3;` reads naturally
  static Dim Symbol(std::string name);

  bool is_static() const { return terms_ == nullptr; }
  // Only for static dims (-1 for a symbolic one).
  int64_t value() const { return terms_ ? -1 : value_; }
  // Static value or nullopt.
  std::optional<int64_t> static_value() const {
    return terms_ ? std::nullopt : std::optional<int64_t>(value_);
  }
  std::string ToString() const;

  // Substitutes symbols; a dim whose symbols are all bound becomes static.
  Dim Substitute(const std::map<std::string, int64_t>& bindings) const;
  // The symbols it mentions.
  std::vector<std::string> Symbols() const;
  // The polynomial as terms coeff * product(symbols): monomials sorted and unique, coefficients
  // non-zero (for serialisation; rebuild a Dim from terms with Symbol, * and +).
  Terms terms() const;

  friend Dim operator+(const Dim& a, const Dim& b);
  friend Dim operator-(const Dim& a, const Dim& b);
  friend Dim operator*(const Dim& a, const Dim& b);
  // Floor division and remainder; exact when both are static or the division is exact.
  friend Dim FloorDiv(const Dim& a, const Dim& b);
  friend Dim CeilDiv(const Dim& a, const Dim& b);
  friend Dim Mod(const Dim& a, const Dim& b);
  friend Dim Max(const Dim& a, const Dim& b);
  friend Dim Min(const Dim& a, const Dim& b);
  friend bool operator==(const Dim& a, const Dim& b) {
    if (!a.terms_ || !b.terms_) return !a.terms_ && !b.terms_ && a.value_ == b.value_;
    return a.terms_ == b.terms_ || *a.terms_ == *b.terms_;
  }

 private:
  int64_t value_ = 0;  // when static
  // When symbolic: sum of coeff * product(symbols); monomials sorted and unique, no zero
  // coefficients, at least one monomial with a symbol. Null when static.
  std::shared_ptr<const Terms> terms_;
  // Normalizes `terms` (sorts, merges, drops zeros) into a Dim, static when it has no symbol.
  static Dim FromTerms(Terms terms);
  static Dim Opaque(const std::string& op, const Dim& a, const Dim& b);
};

using Shape = std::vector<Dim>;

// Data-dependent dims: the symbol for dim `index` of output `output` of node `node` (an op whose
// output dims follow from its input VALUES: NonZero, Unique...). The name starts with '?', which
// no model's dim_param does in practice, so a reader can tell the kernel reports it at run time.
std::string DataDependentSymbol(const std::string& node, size_t output, size_t index);
bool IsDataDependentSymbol(const std::string& symbol);

std::string ToString(const Shape& shape);  // "[batch,3,224,224]"
bool IsStatic(const Shape& shape);
// Product of dims (a Dim, possibly symbolic).
Dim NumElements(const Shape& shape);
// Static dims of a static shape; nullopt when any dim is symbolic.
std::optional<std::vector<int64_t>> StaticDims(const Shape& shape);
Shape MakeShape(const std::vector<int64_t>& dims);

}  // namespace kiln
