// Status and StatusOr: how every fallible kiln call reports failure (STYLE.md rule 1).
// An OK Status is a null pointer; an error carries a catalog code, what happened, and the
// context it gained on its way up.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln {

enum class ErrorCode : uint16_t {
  kOk = 0,
#define KILN_ERROR(name, number, subsystem, summary, remedy) k##name = number,
#include "kiln/core/errors.inc"
#undef KILN_ERROR
};

// One row of the error catalog (errors.inc).
struct ErrorInfo {
  ErrorCode code;
  int number;
  std::string_view name;       // "UnsupportedOps"
  std::string_view subsystem;  // "onnx"
  std::string_view summary;    // what it means
  std::string_view remedy;     // what to do
  std::string Id() const { return fmt::format("KILN-E{}", number); }
};

std::span<const ErrorInfo> ErrorCatalog();
const ErrorInfo& LookupError(ErrorCode code);
// Accepts "KILN-E2004", "E2004" or "2004"; nullptr when no such code.
const ErrorInfo* FindError(std::string_view id);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message);
  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept;
  Status& operator=(Status&&) noexcept;
  ~Status();

  bool ok() const { return state_ == nullptr; }
  ErrorCode code() const;
  std::string Id() const;  // "KILN-E2004", empty when OK
  const std::string& message() const;
  // Context lines, innermost first: "while importing node 'conv1'".
  const std::vector<std::string>& context() const;
  std::string_view remedy() const;

  Status& AddContext(std::string line) &;
  Status&& AddContext(std::string line) &&;

  // One line: "KILN-E2004 [onnx] message (while a; while b)".
  std::string ToString() const;
  // Several lines for people: code and summary, message, context, remedy.
  std::string Explain() const;

  void IgnoreError() const {}

 private:
  struct State {
    ErrorCode code;
    std::string message;
    std::vector<std::string> context;
  };
  std::unique_ptr<State> state_;
};

inline Status OkStatus() { return Status(); }

template <typename... Args>
Status MakeError(ErrorCode code, fmt::format_string<Args...> format, Args&&... args) {
  return Status(code, fmt::format(format, std::forward<Args>(args)...));
}

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.ok()) status_ = Status(ErrorCode::kInternal, "StatusOr built from an OK Status");
  }
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  template <typename U>
  requires(std::is_constructible_v<T, U&&> && !std::is_same_v<std::decay_t<U>, T> &&
           !std::is_same_v<std::decay_t<U>, Status>) StatusOr(U&& value)
      : value_(std::forward<U>(value)) {}  // NOLINT

  bool ok() const { return status_.ok(); }
  const Status& status() const& { return status_; }
  Status status() && { return std::move(status_); }

  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T&& operator*() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace kiln

#define KILN_CONCAT_INNER_(a, b) a##b
#define KILN_CONCAT_(a, b) KILN_CONCAT_INNER_(a, b)

// Returns the error of `expr` (a Status or StatusOr) from the enclosing function.
#define KILN_RETURN_IF_ERROR(expr)                                                \
  do {                                                                            \
    if (auto kiln_status_ = ::kiln::internal::ToStatus(expr); !kiln_status_.ok()) \
      return kiln_status_;                                                        \
  } while (0)

// Same, adding a context line built with fmt: KILN_RETURN_IF_ERROR_CTX(s, "node '{}'", n).
#define KILN_RETURN_IF_ERROR_CTX(expr, ...)                                       \
  do {                                                                            \
    if (auto kiln_status_ = ::kiln::internal::ToStatus(expr); !kiln_status_.ok()) \
      return std::move(kiln_status_).AddContext(fmt::format(__VA_ARGS__));        \
  } while (0)

// KILN_ASSIGN_OR_RETURN(auto x, MakeX()); declares/assigns x or returns the error.
#define KILN_ASSIGN_OR_RETURN(lhs, expr) \
  KILN_ASSIGN_OR_RETURN_IMPL_(KILN_CONCAT_(kiln_statusor_, __LINE__), lhs, expr)
#define KILN_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return std::move(tmp).status();    \
  lhs = std::move(tmp).value()

namespace kiln::internal {
inline Status ToStatus(Status s) { return s; }
template <typename T>
Status ToStatus(const StatusOr<T>& s) {
  return s.status();
}
}  // namespace kiln::internal
